"""rocm-safe's conv3d chain on torch tensors (:func:`conv3d`,
:func:`conv_transpose3d` and their autograd functions), and the GPU load
report and memory release. The fallback behind ``torch.nn.functional``
and its statistics are in ``_conv3d_fallback.py``.

Re-exported by :mod:`rocm_safe.torch`, where users find them; kept apart
so that the conv3d code can change without touching the load/save API.
"""

from __future__ import annotations

from typing import Any, List, Optional, Tuple, Union

import torch

from . import _native

__all__ = [
    "last_load_report",
    "release_memory",
    "conv3d",
    "conv_transpose3d",
    "last_conv3d_report",
]

# --------------------------------------------------------------------------
# GPU loading: the report and the memory


def _backend() -> str:
    """Which GPU runtime torch's ``cuda`` is: ``"hip"`` on ROCm builds."""
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


def _device_name(device: Union[str, int, torch.device, None]) -> str:
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    d = torch.device(device)
    if d.type == "cpu":
        return "cpu"
    if d.type != "cuda":
        raise ValueError(f"device {device!r}: rocm_safe handles \"cpu\" and \"cuda[:N]\" devices")
    return f"cuda:{torch.cuda.current_device() if d.index is None else d.index}"


def last_load_report():
    """The report of this process's last GPU load (``None`` before one):
    ``str(report)`` is the library's ``LoadReport`` (tensors and bytes per
    rung, time, GB/s, and a line per tensor that did not take the pinned
    ring or failed there first); ``report.to_dict()`` (or ``report["key"]``)
    gives ``device``, ``file_bytes``, ``out_bytes``, ``ms``, ``gb_per_s``,
    ``all_fast``, ``by_rung`` and ``tensors`` (per tensor: ``name``,
    ``dtype``, ``out_dtype``, ``shape``, ``rung``, ``attempts``, ...)."""
    return _native.last_load_report()


def release_memory(device: Union[str, int, torch.device, None] = None) -> None:
    """Waits for ``device`` and frees the memory of loaded tensors torch has
    released since rocm-safe's last sync point, and the loader's cached
    staging (pinned ring, device buffers; made again by the next load).
    Tensors still alive are untouched."""
    _native.device_synchronize(_device_name(device), _backend(), True)


# --------------------------------------------------------------------------
# conv3d through the chain

_last_conv3d: List[Optional[str]] = [None]


def _triple(v: Any, name: str) -> Tuple[int, int, int]:
    if isinstance(v, bool):
        raise TypeError(f"conv3d: {name} must be an int or 3 ints, not {v!r}")
    if isinstance(v, int):
        return (v, v, v)
    t = tuple(int(x) for x in v)
    if len(t) == 1:
        t = t * 3
    if len(t) != 3 or any(x < 0 for x in t):
        raise ValueError(f"conv3d: {name} must be a non-negative int or 3 of them, not {v!r}")
    return t  # type: ignore[return-value]


def _padding(padding: Any, weight: torch.Tensor, stride, dilation) -> Tuple[int, int, int]:
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0)
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError("conv3d: padding='same' is not supported for strided convolutions")
            out = []
            for k, d in zip(weight.shape[2:], dilation):
                total = d * (k - 1)
                if total % 2:
                    raise ValueError(
                        "conv3d: padding='same' needs asymmetric padding for this kernel and dilation,"
                        " which the rocm-safe chain does not take"
                    )
                out.append(total // 2)
            return tuple(out)  # type: ignore[return-value]
        raise ValueError(f"conv3d: invalid padding string {padding!r}, expected 'valid' or 'same'")
    return _triple(padding, "padding")


_CHAIN_DTYPES = (torch.float32, torch.bfloat16)


def conv3d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    stride: Any = 1,
    padding: Any = 0,
    dilation: Any = 1,
    groups: int = 1,
) -> torch.Tensor:
    """``torch.nn.functional.conv3d`` through rocm-safe's conv3d chain:
    the vendor library (cuDNN / MIOpen), the tiled kernel, the naive kernel,
    then the CPU, each result checked (NaN/Inf scan, sampled points against
    an f64 reference) before it is returned; a tier that fails hands the
    call to the next (:func:`conv3d_stats` counts them).

    Same arguments and result as torch's for what the chain takes: input
    ``[N, C, D, H, W]`` (or unbatched ``[C, D, H, W]``), weight
    ``[K, C/groups, KD, KH, KW]``, optional bias ``[K]``, all ``float32`` or
    all ``bfloat16`` (every tier accumulates in f32; a bf16 call returns the
    f32 result rounded to bf16, as torch does), ``padding`` an int, 3 ints,
    ``"valid"`` or a symmetric ``"same"``. On a GPU the tensors are
    borrowed through DLPack and the chain runs on torch's current stream
    of their device; on the CPU it runs on rocm-safe's host backend. The
    output is allocated by torch. Differentiable: when an input needs
    gradients the call is a ``torch.autograd.Function`` whose backward runs
    the chain's backward ops (input and weight gradients through the vendor
    library's backward calls where it has them, in f32; the input gradient
    then through the tiled GPU kernels, as a forward convolution with the
    flipped weight, where the strides' product is at most 8 and there are
    at least 8 input channels per group, and the weight gradient through the
    tiled split-K kernel where there are at least 8 output channels per
    group (float atomics: its last bits vary run to run); every op then
    through the naive GPU kernels, then the CPU; the bias gradient through
    the naive kernel,
    then the CPU), each result checked as the forward one is.

    Errors: ``TypeError`` for other dtypes or non-tensors, ``ValueError``
    for shapes, devices and parameters the chain does not take,
    ``RuntimeError`` when no tier served (the message has the report).
    """
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"conv3d: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dtype not in _CHAIN_DTYPES:
            raise TypeError(f"conv3d: {name} dtype {t.dtype} is not supported by the chain (float32, bfloat16)")
        if t.layout != torch.strided:
            raise TypeError(f"conv3d: {name} must be a dense (strided) tensor")
    if weight.dtype != input.dtype or (bias is not None and bias.dtype != input.dtype):
        raise TypeError(
            f"conv3d: input, weight and bias must have one dtype, got {input.dtype}, {weight.dtype}"
            + ("" if bias is None else f", {bias.dtype}")
        )
    devices = {t.device for t in (input, weight, bias) if t is not None}
    if len(devices) != 1:
        raise ValueError(f"conv3d: tensors on different devices: {sorted(map(str, devices))}")
    device = input.device
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"conv3d: device {device} is not supported (cpu, cuda)")
    unbatched = input.dim() == 4
    if unbatched:
        input = input.unsqueeze(0)
    if input.dim() != 5 or weight.dim() != 5:
        raise ValueError(
            f"conv3d: expected a 5-d input [N, C, D, H, W] (or 4-d unbatched) and a 5-d weight,"
            f" got {list(input.shape)} and {list(weight.shape)}"
        )
    if bias is not None and bias.dim() != 1:
        raise ValueError(f"conv3d: bias must be 1-d, got {list(bias.shape)}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"conv3d: groups must be a positive int, not {groups!r}")
    stride_t = _triple(stride, "stride")
    dilation_t = _triple(dilation, "dilation")
    padding_t = _padding(padding, weight, stride_t, dilation_t)
    n, k = input.shape[0], weight.shape[0]
    out_shape = [n, k]
    for x, kk, s, p, d in zip(input.shape[2:], weight.shape[2:], stride_t, padding_t, dilation_t):
        span = d * (kk - 1) + 1
        if s <= 0 or x + 2 * p < span:
            out_shape.append(0)  # the library names what is wrong
        else:
            out_shape.append((x + 2 * p - span) // s + 1)
    params = (stride_t, padding_t, dilation_t, groups)
    if _recorded():
        result = _as_op(input, weight, bias, stride_t, padding_t, dilation_t, False, (0, 0, 0), groups)
    elif _needs_grad(input, weight, bias):
        result = _Conv3dFunction.apply(input, weight, bias, params)
    else:
        result = _chain_conv3d(input, weight, bias, params, out_shape)
    return result.squeeze(0) if unbatched else result


def _recorded() -> bool:
    """Whether this call is being recorded rather than run (``torch.jit.trace``,
    ``torch.compile``) or transformed (``torch.func``): the chain's native
    call is then made through the ``rocm_safe::conv3d_guarded`` operator
    (mode ``"chain"``), which the trace or graph records and runs, instead
    of a DLPack hand-off the recorder cannot see."""
    return (
        torch.jit.is_tracing()
        or torch.compiler.is_compiling()
        or torch._C._are_functorch_transforms_active()
    )


def _as_op(input, weight, bias, stride_t, padding_t, dilation_t, transposed, output_padding_t, groups):
    from ._conv3d_ops import guarded_conv

    return guarded_conv(
        input, weight, bias, list(stride_t), list(padding_t), list(dilation_t), transposed,
        list(output_padding_t), groups, "chain",
    )


try:  # the raw handle without a Stream object (what Triton reads too)
    from torch._C import _cuda_getCurrentRawStream as _raw_stream
except ImportError:  # pragma: no cover - older or CPU-only builds
    _raw_stream = None


def _device_and_stream(device: torch.device) -> Tuple[str, int]:
    """The native device name and torch's current stream handle (0 on
    the CPU)."""
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        if _raw_stream is not None:
            return f"cuda:{index}", int(_raw_stream(index))
        return f"cuda:{index}", int(torch.cuda.current_stream(device).cuda_stream)
    return "cpu", 0


def _needs_grad(*ts) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


def _conv_out_shape(x_shape, w_shape, stride_t, padding_t, dilation_t) -> List[int]:
    """conv3d's output shape (0 where the kernel does not fit: the library
    names what is wrong)."""
    out_shape = [x_shape[0], w_shape[0]]
    for x, kk, s, p, d in zip(x_shape[2:], w_shape[2:], stride_t, padding_t, dilation_t):
        span = d * (kk - 1) + 1
        if s <= 0 or x + 2 * p < span:
            out_shape.append(0)
        else:
            out_shape.append((x + 2 * p - span) // s + 1)
    return out_shape


def _chain_conv3d(input, weight, bias, params, out_shape=None) -> torch.Tensor:
    """The chain's conv3d of 5-d tensors (no autograd): an f32 result,
    returned in the inputs' dtype."""
    stride_t, padding_t, dilation_t, groups = params
    if out_shape is None:
        out_shape = _conv_out_shape(input.shape, weight.shape, stride_t, padding_t, dilation_t)
    x = input.detach().contiguous()
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    out = torch.empty(out_shape, dtype=torch.float32, device=input.device)
    dev, stream = _device_and_stream(input.device)
    pack = torch.utils.dlpack.to_dlpack
    served, report = _native.conv3d(
        dev,
        stream,
        pack(x),
        pack(w),
        None if b is None else pack(b),
        pack(out),
        list(stride_t),
        list(padding_t),
        list(dilation_t),
        groups,
        _backend(),
    )
    _last_conv3d[0] = report
    return out if input.dtype == torch.float32 else out.to(input.dtype)


def _chain_backward(op, grad_output, other, input_shape, weight_shape, params, out_shape) -> torch.Tensor:
    """One backward op of the chain (``"data"``, ``"weight"``, ``"bias"``)
    of the forward conv3d ``(input_shape, weight_shape, params)``: an f32
    result of ``out_shape``."""
    stride_t, padding_t, dilation_t, groups = params
    dy = grad_output.detach().contiguous()
    o = None if other is None else other.detach().to(dy.dtype).contiguous()
    out = torch.empty(list(out_shape), dtype=torch.float32, device=dy.device)
    dev, stream = _device_and_stream(dy.device)
    pack = torch.utils.dlpack.to_dlpack
    served, report = _native.conv3d_backward(
        dev,
        stream,
        op,
        pack(dy),
        None if o is None else pack(o),
        pack(out),
        [int(v) for v in input_shape],
        [int(v) for v in weight_shape],
        list(stride_t),
        list(padding_t),
        list(dilation_t),
        groups,
        _backend(),
    )
    _last_conv3d[0] = report
    return out


class _Conv3dFunction(torch.autograd.Function):
    """The chain's conv3d with its gradients through the chain's backward
    ops (grad of input: the transposed convolution of ``dy`` with the
    weight; of the weight: the correlation of the input with ``dy``; of the
    bias: the sum of ``dy``), each checked as the forward call is."""

    @staticmethod
    def forward(ctx, input, weight, bias, params):
        ctx.save_for_backward(input, weight)
        ctx.params = params
        ctx.has_bias = bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _chain_conv3d(input, weight, bias, params)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        gi, gw, gb = conv3d_chain_grads(grad_output, input, weight, ctx.bias_dtype, ctx.params, mask)
        return gi, gw, gb, None


def conv3d_chain_grads(grad_output, input, weight, bias_dtype, params, mask):
    """The gradients (input, weight, bias; ``None`` where ``mask`` is false)
    of the chain's conv3d of 5-d ``input`` and ``weight`` with ``params``
    (stride, padding, dilation triples, groups), through the chain's
    backward ops, in the operands' dtypes (``bias_dtype`` for the bias)."""
    dy = grad_output.to(input.dtype)
    gi = gw = gb = None
    if mask[0]:
        gi = _chain_backward("data", dy, weight, input.shape, weight.shape, params, input.shape)
        gi = gi.to(input.dtype)
    if mask[1]:
        gw = _chain_backward("weight", dy, input, input.shape, weight.shape, params, weight.shape)
        gw = gw.to(weight.dtype)
    if mask[2]:
        gb = _chain_backward("bias", dy, None, input.shape, weight.shape, params, [weight.shape[0]])
        gb = gb.to(bias_dtype)
    return gi, gw, gb


def _check_operands(what, input, weight, bias) -> None:
    """The chain's dtype, layout and device rules (TypeError / ValueError)."""
    for name, t in (("input", input), ("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}: {name} must be a torch.Tensor, not {type(t).__name__}")
        if t.dtype not in _CHAIN_DTYPES:
            raise TypeError(f"{what}: {name} dtype {t.dtype} is not supported by the chain (float32, bfloat16)")
        if t.layout != torch.strided:
            raise TypeError(f"{what}: {name} must be a dense (strided) tensor")
    if weight.dtype != input.dtype or (bias is not None and bias.dtype != input.dtype):
        raise TypeError(
            f"{what}: input, weight and bias must have one dtype, got {input.dtype}, {weight.dtype}"
            + ("" if bias is None else f", {bias.dtype}")
        )
    devices = {t.device for t in (input, weight, bias) if t is not None}
    if len(devices) != 1:
        raise ValueError(f"{what}: tensors on different devices: {sorted(map(str, devices))}")
    if input.device.type not in ("cpu", "cuda"):
        raise ValueError(f"{what}: device {input.device} is not supported (cpu, cuda)")


def conv_transpose3d(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    stride: Any = 1,
    padding: Any = 0,
    output_padding: Any = 0,
    groups: int = 1,
    dilation: Any = 1,
) -> torch.Tensor:
    """``torch.nn.functional.conv_transpose3d`` (same signature) through
    rocm-safe's chain: the vendor library's backward-data call (cuDNN /
    MIOpen, in f32; bf16 operands widened first; the bias added after;
    skipped where ``output_padding`` reaches the stride, which the libraries
    refuse), then, where the strides' product is at most 8 and there are at
    least 8 output channels per group, the tiled GPU kernel (a forward
    convolution of the input spread by the stride with the flipped weight),
    then the naive GPU kernel (the gather form of the input gradient, which
    a transposed convolution is), then the CPU, each result checked (NaN/Inf
    scan, sampled points against an f64 reference) before it is returned.

    Input ``[N, C_in, D, H, W]`` (or unbatched ``[C_in, D, H, W]``), weight
    ``[C_in, C_out/groups, KD, KH, KW]``, optional bias ``[C_out]``, all
    ``float32`` or all ``bfloat16`` (f32 accumulation; bf16 results are
    rounded to bf16); ``output_padding`` below the stride or the dilation
    of its axis. Differentiable: the gradients go through the chain (grad
    of input: a conv3d of ``dy``; of the weight: the weight gradient of that
    conv3d; of the bias: a sum), each checked. On a GPU the chain runs on
    torch's current stream; on the CPU on rocm-safe's host backend.

    Errors: ``TypeError`` for other dtypes or non-tensors, ``ValueError``
    for shapes, devices and parameters the chain does not take,
    ``RuntimeError`` when no tier served (the message has the report).
    """
    what = "conv_transpose3d"
    _check_operands(what, input, weight, bias)
    unbatched = input.dim() == 4
    if unbatched:
        input = input.unsqueeze(0)
    if input.dim() != 5 or weight.dim() != 5:
        raise ValueError(
            f"{what}: expected a 5-d input [N, C, D, H, W] (or 4-d unbatched) and a 5-d weight,"
            f" got {list(input.shape)} and {list(weight.shape)}"
        )
    if bias is not None and bias.dim() != 1:
        raise ValueError(f"{what}: bias must be 1-d, got {list(bias.shape)}")
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{what}: groups must be a positive int, not {groups!r}")
    if isinstance(padding, str):
        raise ValueError(f"{what}: padding must be an int or 3 ints, not {padding!r}")
    params = (
        _triple(stride, "stride"),
        _triple(padding, "padding"),
        _triple(output_padding, "output_padding"),
        _triple(dilation, "dilation"),
        groups,
    )
    if _recorded():
        stride_t, padding_t, output_padding_t, dilation_t, _g = params
        result = _as_op(input, weight, bias, stride_t, padding_t, dilation_t, True, output_padding_t, groups)
    elif _needs_grad(input, weight, bias):
        result = _ConvTranspose3dFunction.apply(input, weight, bias, params)
    else:
        result = _chain_conv_transpose3d(input, weight, bias, params)
    return result.squeeze(0) if unbatched else result


def _transpose_out_shape(x_shape, w_shape, params) -> List[int]:
    stride_t, padding_t, output_padding_t, dilation_t, groups = params
    shape = [x_shape[0], w_shape[1] * groups]
    for x, k, s, p, op, d in zip(x_shape[2:], w_shape[2:], stride_t, padding_t, output_padding_t, dilation_t):
        shape.append(max((x - 1) * s - 2 * p + d * (k - 1) + op + 1, 0))
    return shape


def _chain_conv_transpose3d(input, weight, bias, params) -> torch.Tensor:
    """The chain's conv_transpose3d of 5-d tensors (no autograd)."""
    stride_t, padding_t, output_padding_t, dilation_t, groups = params
    out_shape = _transpose_out_shape(input.shape, weight.shape, params)
    x = input.detach().contiguous()
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    out = torch.empty(out_shape, dtype=torch.float32, device=input.device)
    dev, stream = _device_and_stream(input.device)
    pack = torch.utils.dlpack.to_dlpack
    served, report = _native.conv_transpose3d(
        dev,
        stream,
        pack(x),
        pack(w),
        None if b is None else pack(b),
        pack(out),
        list(stride_t),
        list(padding_t),
        list(output_padding_t),
        list(dilation_t),
        groups,
        _backend(),
    )
    _last_conv3d[0] = report
    return out if input.dtype == torch.float32 else out.to(input.dtype)


class _ConvTranspose3dFunction(torch.autograd.Function):
    """The chain's conv_transpose3d with its gradients through the chain.

    ``y = conv_transpose3d(x, w)`` is the input gradient of the conv3d
    ``c(u) = conv3d(u, w)`` with ``u`` of ``y``'s shape, so: ``dx =
    conv3d(dy, w)`` (cropped to ``x``'s shape when ``output_padding >=
    stride`` makes that conv3d's output larger), ``dw`` = the weight
    gradient of ``c`` at input ``dy`` with output gradient ``x`` (zero
    padded to ``c``'s output), ``db`` = the sum of ``dy`` per channel."""

    @staticmethod
    def forward(ctx, input, weight, bias, params):
        ctx.save_for_backward(input, weight)
        ctx.params = params
        ctx.has_bias = bias is not None
        ctx.bias_dtype = None if bias is None else bias.dtype
        return _chain_conv_transpose3d(input, weight, bias, params)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        input, weight = ctx.saved_tensors
        mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
        gi, gw, gb = conv_transpose3d_chain_grads(grad_output, input, weight, ctx.bias_dtype, ctx.params, mask)
        return gi, gw, gb, None


def conv_transpose3d_chain_grads(grad_output, input, weight, bias_dtype, params, mask):
    """The gradients (input, weight, bias; ``None`` where ``mask`` is false)
    of the chain's conv_transpose3d of 5-d ``input`` and ``weight`` with
    ``params`` (stride, padding, output_padding, dilation triples, groups),
    through the chain, in the operands' dtypes."""
    stride_t, padding_t, _op, dilation_t, groups = params
    conv = (stride_t, padding_t, dilation_t, groups)
    dy = grad_output.to(input.dtype).contiguous()
    spatial = list(input.shape[2:])
    full = _conv_out_shape(dy.shape, weight.shape, stride_t, padding_t, dilation_t)[2:]
    gi = gw = gb = None
    if mask[0]:
        gi = _chain_conv3d(dy, weight, None, conv)
        if full != spatial:
            gi = gi[:, :, : spatial[0], : spatial[1], : spatial[2]].contiguous()
    if mask[1]:
        x = input.detach()
        if full != spatial:
            pad = []
            for f, s in zip(reversed(full), reversed(spatial)):
                pad += [0, f - s]
            x = torch.nn.functional.pad(x, pad)
        gw = _chain_backward("weight", x, dy, dy.shape, weight.shape, conv, weight.shape)
        gw = gw.to(weight.dtype)
    if mask[2]:
        gb = _chain_backward("bias", dy, None, dy.shape, weight.shape, conv, [dy.shape[1]])
        gb = gb.to(bias_dtype)
    return gi, gw, gb


def last_conv3d_report() -> Optional[str]:
    """The report of the last :func:`conv3d` call: each
    tier tried, skipped (why), failed (why) or served (time)."""
    return _last_conv3d[0]


from ._panic import guard as _guard  # noqa: E402
from ._panic import guard_names as _guard_names  # noqa: E402

_guard_names(globals(), __all__)
# The backward passes run inside torch's autograd engine, not through a
# function above.
for _f in (_Conv3dFunction, _ConvTranspose3dFunction):
    _f.backward = staticmethod(_guard(_f.backward))
