"""``safetensors.torch``'s API over rocm-safe: switch with one import line::

    # from safetensors.torch import load_file, save_file
    from rocm_safe.torch import load_file, save_file

and, on a GPU build (``--features cuda`` / ``--features hip``)::

    sd = load_file("model.safetensors", device="cuda:0", dtype=torch.float32)
    print(last_load_report())          # which rung served each tensor, GB/s

plus the conv3d chain (vendor -> tiled -> naive -> CPU, each result
checked) on torch tensors: :func:`conv3d` and :func:`conv_transpose3d`
(both differentiable: their gradients go through the chain's backward
ops, checked the same way), and :func:`install_conv3d_fallback` to serve
``torch.nn.functional.conv3d`` and ``conv_transpose3d`` calls that fail
(or return NaN/Inf from finite inputs, or wrong values) through it.

Imported only when used: ``import rocm_safe`` never imports torch.
"""

from __future__ import annotations

import functools
import warnings
import os
import threading
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch

from . import _dtypes, _native, _save
from ._open import _Tensors, safe_open

__all__ = [
    "load",
    "load_file",
    "save",
    "save_file",
    "last_load_report",
    "release_memory",
    "conv3d",
    "conv_transpose3d",
    "last_conv3d_report",
    "install_conv3d_fallback",
    "uninstall_conv3d_fallback",
    "conv3d_stats",
    "reset_conv3d_stats",
]


def load_file(
    filename: Union[str, os.PathLike],
    device: Union[str, int, Any] = "cpu",
    *,
    dtype: Any = None,
    verify: Any = None,
    backend: str = "mmap",
) -> Dict[str, torch.Tensor]:
    """Loads every tensor of a safetensors file, or of a sharded checkpoint
    (``*.safetensors.index.json``), as torch tensors, each read once into
    memory Python owns.

    ``device``: ``"cpu"``, or a GPU: ``"cuda"``, ``"cuda:N"``, ``N`` or a
    ``torch.device`` (ROCm builds of torch call AMD GPUs ``cuda`` too; a
    ``hip`` wheel maps ``cuda:N`` to HIP device N, a ``cuda`` wheel to CUDA
    device N). On a GPU, rocm-safe's staged, verified loader fills device
    memory (pinned ring, every piece fingerprinted, a fallback ladder) and
    the tensors are handed to torch through DLPack without a copy; they
    outlive the file, and their memory goes back to rocm-safe when the last
    tensor using it is freed (released at rocm-safe's next device sync:
    :func:`release_memory`). The loader waits for its own streams before
    returning, so the tensors are ready on every torch stream.
    :func:`last_load_report` says how the load went.
    ``dtype``: convert float tensors (F64, F32, F16, BF16) exactly to
    ``torch.float32``, ``torch.float16`` or ``torch.bfloat16`` while
    reading (on a GPU: bf16 crosses the bus as bf16 and is widened there);
    other tensors as stored.
    ``verify``: the GPU verification policy (``"off"``, ``"fingerprint"``
    (default), ``"fused_fingerprint"``, ``"readback"``); validated, no effect
    on the CPU.
    """
    with safe_open(filename, framework="pt", device=device, dtype=dtype, verify=verify, backend=backend) as f:
        return f.get_tensors()


def load(data: bytes, *, dtype: Any = None) -> Dict[str, torch.Tensor]:
    """Loads a safetensors file held in memory (``bytes``), with the same
    checks as a file, as CPU tensors."""
    target = _dtypes.conversion_target(dtype)
    tensors, _meta = _native.load_bytes(bytes(data), target)
    wrap = _Tensors("pt")
    return {name: wrap.from_buffer(buf, dt, shape) for name, buf, dt, shape in sorted(tensors, key=lambda t: t[0])}


def _storage_span(t: torch.Tensor):
    """(device, storage address, first byte, end byte) of a tensor's data."""
    storage = t.untyped_storage()
    start = t.data_ptr()
    end = start + t.nelement() * t.element_size()
    return (t.device, storage.data_ptr()), start, end


def _shared(tensors: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """Groups of names whose tensors overlap in memory (safetensors refuses
    to save them: they would load back as separate copies)."""
    groups: Dict[Any, List] = {}
    for name, t in tensors.items():
        if t.device.type == "meta" or t.nelement() == 0:
            continue
        key, start, end = _storage_span(t)
        if key[1] == 0:
            continue
        groups.setdefault(key, []).append((start, end, name))
    failing = []
    for spans in groups.values():
        spans.sort()
        current: Set[str] = set()
        current_end = -1
        for start, end, name in spans:
            if current and start < current_end:
                current.add(name)
                current_end = max(current_end, end)
            else:
                if len(current) > 1:
                    failing.append(current)
                current, current_end = {name}, end
        if len(current) > 1:
            failing.append(current)
    return failing


def _items(tensors: Dict[str, torch.Tensor]):
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    sparse = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(t)}")
        if t.layout != torch.strided:
            sparse.append(name)
    if sparse:
        raise ValueError(
            f"You are trying to save a sparse tensors: `{sparse}` which this library does not support."
            " You can make it a dense tensor before saving with `.to_dense()` but be aware this might"
            " make a much larger file than needed."
        )
    failing = _shared(tensors)
    if failing:
        raise RuntimeError(
            "Some tensors share memory, this will lead to duplicate memory on disk and potential differences"
            f" when loading them again: {failing}. Save each shared storage once (or clone the tensors)."
        )
    items = []
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means you"
                " are trying to save tensors which are reference of each other in which case it's recommended to save"
                " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
                " pack it before saving."
            )
        try:
            dtype = _dtypes.safetensors_name(t.dtype)
        except ValueError:
            raise ValueError(f"Key `{name}`: dtype {t.dtype} cannot be saved in safetensors") from None
        flat = t.detach()
        if flat.device.type != "cpu":
            flat = flat.to("cpu")
        flat = flat.reshape(-1)
        if flat.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        raw = flat.view(torch.uint8).numpy()
        items.append((name, dtype, list(t.shape), raw))
    return items


def save_file(
    tensors: Dict[str, torch.Tensor],
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
) -> None:
    """Saves tensors to ``filename`` atomically (temporary file, fsync,
    rename), laid out as ``safetensors.torch.save_file`` lays them out.
    Never replaces a file this process is reading (``SafetensorError``)."""
    _save.write_file(_items(tensors), filename, metadata)


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes ``save_file`` would write."""
    return _save.write_bytes(_items(tensors), metadata)


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
    the chain's backward ops (input, weight and bias gradients through the
    naive GPU kernels, then the CPU; the vendor and tiled tiers have no
    backward ops), each result checked as the forward one is.

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
    if _needs_grad(input, weight, bias):
        result = _Conv3dFunction.apply(input, weight, bias, params)
    else:
        result = _chain_conv3d(input, weight, bias, params, out_shape)
    return result.squeeze(0) if unbatched else result


def _device_and_stream(device: torch.device) -> Tuple[str, int]:
    """The native device name and torch's current stream handle (0 on
    the CPU)."""
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
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
        params = ctx.params
        dy = grad_output.to(input.dtype)
        gi = gw = gb = None
        if ctx.needs_input_grad[0]:
            gi = _chain_backward("data", dy, weight, input.shape, weight.shape, params, input.shape)
            gi = gi.to(input.dtype)
        if ctx.needs_input_grad[1]:
            gw = _chain_backward("weight", dy, input, input.shape, weight.shape, params, weight.shape)
            gw = gw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = _chain_backward("bias", dy, None, input.shape, weight.shape, params, [weight.shape[0]])
            gb = gb.to(ctx.bias_dtype)
        return gi, gw, gb, None


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
    rocm-safe's chain: the naive GPU kernel (the gather form of the input
    gradient, which a transposed convolution is), then the CPU, each result
    checked (NaN/Inf scan, sampled points against an f64 reference) before
    it is returned; the vendor tier is skipped (its bindings have no
    backward-data call) and the tiled tier too (no tiled kernel for it).

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
    if _needs_grad(input, weight, bias):
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
        stride_t, padding_t, _op, dilation_t, groups = ctx.params
        conv = (stride_t, padding_t, dilation_t, groups)
        dy = grad_output.to(input.dtype).contiguous()
        spatial = list(input.shape[2:])
        full = _conv_out_shape(dy.shape, weight.shape, stride_t, padding_t, dilation_t)[2:]
        gi = gw = gb = None
        if ctx.needs_input_grad[0]:
            gi = _chain_conv3d(dy, weight, None, conv)
            if full != spatial:
                gi = gi[:, :, : spatial[0], : spatial[1], : spatial[2]].contiguous()
        if ctx.needs_input_grad[1]:
            x = input.detach()
            if full != spatial:
                pad = []
                for f, s in zip(reversed(full), reversed(spatial)):
                    pad += [0, f - s]
                x = torch.nn.functional.pad(x, pad)
            gw = _chain_backward("weight", x, dy, dy.shape, weight.shape, conv, weight.shape)
            gw = gw.to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = _chain_backward("bias", dy, None, dy.shape, weight.shape, conv, [dy.shape[1]])
            gb = gb.to(ctx.bias_dtype)
        return gi, gw, gb, None


def last_conv3d_report() -> Optional[str]:
    """The report of the last :func:`conv3d` call: each
    tier tried, skipped (why), failed (why) or served (time)."""
    return _last_conv3d[0]


# --------------------------------------------------------------------------
# torch.nn.functional.conv3d with the chain behind it

_lock = threading.Lock()
# The mode, and per wrapped function ("conv3d", "conv_transpose3d") the
# function that was there and our wrapper.
_installed: Dict[str, Any] = {"mode": None, "conv3d": None, "conv_transpose3d": None}
_counts: Dict[str, int] = {}
_baseline: Dict[str, Tuple] = {}
# Call signatures whose torch call failed (raised, non-finite, mismatched):
# sent straight to the chain from then on.
_failed_signatures: Set[Tuple] = set()
_last_mismatch: List[Optional[str]] = [None]
# "verify" checks the first _VERIFY_FIRST calls of a signature, then one in
# _VERIFY_EVERY; calls seen per signature.
_VERIFY_FIRST = 2
_VERIFY_EVERY = 16
_verify_seen: Dict[Tuple, int] = {}

_MODES = ("fallback", "verify", "replace")
_WRAPPED = ("conv3d", "conv_transpose3d")


def _zero_counts() -> None:
    _counts.update(
        calls=0,
        fell_back=0,
        fell_back_on_error=0,
        fell_back_on_non_finite=0,
        fell_back_on_mismatch=0,
        verified=0,
        verify_skipped=0,
        mismatches=0,
        direct=0,
        chain_failed=0,
        transpose_calls=0,
    )
    _last_mismatch[0] = None


_zero_counts()


def _chain_takes(input, weight, bias) -> bool:
    """Whether a call could be served by the chain at all (tensors of its
    dtypes on cpu/cuda; inputs that need gradients included: the chain's
    calls are differentiable)."""
    ts = [t for t in (input, weight, bias) if t is not None]
    if not all(isinstance(t, torch.Tensor) for t in ts):
        return False
    if not all(t.dtype in _CHAIN_DTYPES and t.device.type in ("cpu", "cuda") for t in ts):
        return False
    return True


def _finite(*ts) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in ts if t is not None)


def _signature(kind, input, weight, bias, *params) -> Tuple:
    """What identifies a call for the memory of failed torch calls: the
    function, shapes, dtype, device and parameters (never the values)."""
    return (
        kind,
        tuple(input.shape),
        tuple(weight.shape),
        None if bias is None else tuple(bias.shape),
        str(input.dtype),
        str(input.device),
    ) + tuple(repr(p) for p in params)


# Relative tolerance for a float32 conv torch computed with TF32 (10-bit
# mantissa operands: each product within 2**-10 of exact, so the sum within
# about 1e-3 of sum |x * w|; doubled for margin).
_TF32_REL_TOL = 2e-3


def _tf32_tolerance(x) -> Optional[float]:
    """The tolerance for torch's float32 conv output on a GPU where torch
    allows TF32 for it (cuDNN's ``allow_tf32``, on by default; cuBLAS's
    for the path without cuDNN), else ``None`` (the chain's own)."""
    if x.dtype != torch.float32 or x.device.type != "cuda":
        return None
    cudnn = torch.backends.cudnn
    tf32 = cudnn.allow_tf32 if cudnn.enabled else torch.backends.cuda.matmul.allow_tf32
    return _TF32_REL_TOL if tf32 else None


def _verify_output(out, input, weight, bias, stride, padding, dilation, groups) -> Optional[str]:
    """torch's conv3d output checked on the device at the chain's sampled
    points (f64 recomputation): ``None`` when they agree, else the
    mismatch. Calls the check cannot take (shapes it refuses,
    ``padding="same"`` that needs asymmetric padding) are not checked
    (``None``)."""
    if out.dtype not in _CHAIN_DTYPES or out.device != input.device:
        return None
    try:
        stride_t = _triple(stride, "stride")
        dilation_t = _triple(dilation, "dilation")
        padding_t = _padding(padding, weight, stride_t, dilation_t)
    except (TypeError, ValueError):
        return None
    x, w = input, weight
    y = out
    if x.dim() == 4:
        x, y = x.unsqueeze(0), y.unsqueeze(0)
    x = x.detach().contiguous()
    w = w.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    y = y.detach().contiguous()
    dev, stream = _device_and_stream(x.device)
    pack = torch.utils.dlpack.to_dlpack
    try:
        return _native.conv3d_verify(
            dev,
            stream,
            pack(x),
            pack(w),
            None if b is None else pack(b),
            pack(y),
            list(stride_t),
            list(padding_t),
            list(dilation_t),
            groups,
            _backend(),
            _tf32_tolerance(x),
        )
    except (TypeError, ValueError):
        return None


def _verify_transpose_output(
    out, input, weight, bias, stride, padding, output_padding, groups, dilation
) -> Optional[str]:
    """torch's conv_transpose3d output checked as :func:`_verify_output`
    does (a bf16 output is widened to f32 for the check)."""
    if out.dtype not in _CHAIN_DTYPES or out.device != input.device:
        return None
    if isinstance(padding, str):
        return None
    try:
        params = [
            _triple(stride, "stride"),
            _triple(padding, "padding"),
            _triple(output_padding, "output_padding"),
            _triple(dilation, "dilation"),
        ]
    except (TypeError, ValueError):
        return None
    x, y = input, out
    if x.dim() == 4:
        x, y = x.unsqueeze(0), y.unsqueeze(0)
    x = x.detach().contiguous()
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    y = y.detach().to(torch.float32).contiguous()
    dev, stream = _device_and_stream(x.device)
    pack = torch.utils.dlpack.to_dlpack
    try:
        return _native.conv_transpose3d_verify(
            dev,
            stream,
            pack(x),
            pack(w),
            None if b is None else pack(b),
            pack(y),
            *[list(p) for p in params],
            groups,
            _backend(),
        )
    except (TypeError, ValueError):
        return None


def _dispatch(kind: str, orig, chain_fn, verify_fn, args: Tuple):
    """One call of a wrapped function (``args`` in its positional order:
    input, weight, bias, then its parameters) under the installed mode."""
    _counts["calls"] += 1
    if kind == "conv_transpose3d":
        _counts["transpose_calls"] += 1
    input, weight, bias = args[0], args[1], args[2]
    takes = _chain_takes(input, weight, bias)
    current = _installed["mode"]
    sig = _signature(kind, *args) if takes else None

    def to_chain(error, reason):
        try:
            result = chain_fn(*args)
        except Exception as chain_error:
            _counts["chain_failed"] += 1
            if error is not None:
                raise error from chain_error
            raise
        if reason is not None:
            _counts["fell_back"] += 1
            _counts[reason] += 1
        return result

    if takes and (current == "replace" or sig in _failed_signatures):
        try:
            result = chain_fn(*args)
        except (TypeError, ValueError):
            pass  # parameters the chain refuses: torch's path below
        except Exception:
            _counts["chain_failed"] += 1
            raise
        else:
            _counts["direct"] += 1
            return result
    try:
        out = orig(*args)
    except Exception as e:  # noqa: BLE001 - any failure of torch's path
        if not takes:
            raise
        _failed_signatures.add(sig)
        return to_chain(e, "fell_back_on_error")
    if not takes or not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return out
    if not bool(torch.isfinite(out).all()):
        if not _finite(input, weight, bias):
            return out  # NaN/Inf in, NaN/Inf out: no failure
        _failed_signatures.add(sig)
        return to_chain(None, "fell_back_on_non_finite")
    if current == "verify":
        # Spot checks: the first calls of each signature, then one in
        # _VERIFY_EVERY (each check waits for the output; checking every
        # call would cost far more than the conv).
        seen = _verify_seen.get(sig, 0)
        _verify_seen[sig] = seen + 1
        if seen >= _VERIFY_FIRST and seen % _VERIFY_EVERY != 0:
            _counts["verify_skipped"] += 1
            return out
        _counts["verified"] += 1
        mismatch = verify_fn(out, *args)
        if mismatch is not None:
            _counts["mismatches"] += 1
            _last_mismatch[0] = mismatch
            _failed_signatures.add(sig)
            warnings.warn(
                f"rocm_safe: torch's {kind} returned wrong values ({mismatch});"
                " this call and later calls of its signature go to the chain",
                RuntimeWarning,
                stacklevel=3,
            )
            return to_chain(None, "fell_back_on_mismatch")
    return out


def install_conv3d_fallback(mode: str = "fallback") -> None:
    """Puts rocm-safe's conv3d chain (:func:`conv3d` and
    :func:`conv_transpose3d`: every result checked on the device, their
    gradients too) behind ``torch.nn.functional.conv3d`` and
    ``torch.nn.functional.conv_transpose3d`` (and so ``nn.Conv3d`` and
    ``nn.ConvTranspose3d``). ``mode``:

    - ``"fallback"`` (the default): torch's own function runs first; when
      it raises, or returns NaN/Inf from finite inputs, the call is served
      by the chain (the FramePack ``miopen_fallback`` pattern). Costs one
      ``isfinite`` pass over each output. Use it where torch's path works
      and you want a safety net against crashes and NaNs. A call that
      torch serves keeps torch's gradients; one the chain serves gets the
      chain's (its backward ops, checked).
    - ``"verify"``: as ``"fallback"``, and torch's finite output is also
      spot-checked on the device at the chain's sampled points against an
      f64 recomputation (one small read-back per check): the first two
      calls of each call signature (shapes, dtype, parameters, device),
      then one in sixteen, so the checks cost a few percent of the conv
      once a model's signatures are known. A float32 output on a GPU where
      torch allows TF32 is held to TF32's precision (``2e-3`` of each
      point's ``sum |x * w|``), the precision torch was asked for; a mismatch (a
      silently wrong finite result, as vendor libraries have given in bf16)
      sends the call to the chain, is counted (``mismatches``) and reported
      (``last_mismatch`` in :func:`conv3d_stats`, and a ``RuntimeWarning``).
      Use it where you cannot trust torch's results on this GPU stack.
    - ``"replace"``: every call the chain can take goes to the chain,
      without calling torch's function (calls it cannot take still go to
      torch), forward and backward: the gradients are the chain's. Use it
      where torch's path is broken or slow (a MIOpen search that hangs or
      takes minutes, a generic ConvTranspose3d path that takes hours, a
      backward pass that fails).

    In every mode a call signature (function, shapes, dtype, device,
    parameters) whose torch call failed (raised, non-finite, or mismatched)
    is remembered and sent straight to the chain afterwards, so a failing
    search or kernel is not paid for on every call. Calls the chain cannot
    take (other dtypes, devices) keep torch's behaviour, its error
    included. Inputs that need gradients are taken: the chain's calls are
    differentiable.

    Idempotent; installing again with another mode switches the mode (the
    remembered signatures stay). :func:`uninstall_conv3d_fallback` puts
    back exactly the functions that were there (installing again after
    someone replaced ours wraps theirs). :func:`conv3d_stats`
    reports the mode and counts calls, fallbacks, mismatches and tiers.

    Errors: ``ValueError`` for an unknown mode.
    """
    if mode not in _MODES:
        raise ValueError(f"install_conv3d_fallback: mode must be one of {_MODES}, not {mode!r}")
    F = torch.nn.functional
    with _lock:
        if _installed["conv3d"] is not None:
            if all(getattr(F, n) is _installed[n][1] for n in _WRAPPED):
                _installed["mode"] = mode
                return
            # Someone replaced one of our functions since (another library,
            # a test's monkeypatch): wrap what is there now, which
            # uninstall_conv3d_fallback() will put back; a function still
            # ours keeps the original it wraps (never a wrapper of ours).

        def original(name):
            current, record = getattr(F, name), _installed[name]
            return record[0] if record is not None and current is record[1] else current

        orig = original("conv3d")
        orig_t = original("conv_transpose3d")

        @functools.wraps(orig)
        def conv3d_with_fallback(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
            args = (input, weight, bias, stride, padding, dilation, groups)
            return _dispatch("conv3d", orig, conv3d, _verify_output, args)

        @functools.wraps(orig_t)
        def conv_transpose3d_with_fallback(
            input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1
        ):
            args = (input, weight, bias, stride, padding, output_padding, groups, dilation)
            return _dispatch("conv_transpose3d", orig_t, conv_transpose3d, _verify_transpose_output, args)

        for f in (conv3d_with_fallback, conv_transpose3d_with_fallback):
            f.__rocm_safe_fallback__ = True  # type: ignore[attr-defined]
        _installed["conv3d"] = (orig, conv3d_with_fallback)
        _installed["conv_transpose3d"] = (orig_t, conv_transpose3d_with_fallback)
        _installed["mode"] = mode
        F.conv3d = conv3d_with_fallback
        F.conv_transpose3d = conv_transpose3d_with_fallback


def uninstall_conv3d_fallback() -> None:
    """Puts back the ``torch.nn.functional.conv3d`` and
    ``conv_transpose3d`` that :func:`install_conv3d_fallback` replaced
    (no-op when not installed) and forgets the remembered failing call
    signatures. Raises ``RuntimeError`` when someone replaced one of them
    again since: nothing is restored then, their functions are left in
    place."""
    F = torch.nn.functional
    with _lock:
        if _installed["conv3d"] is None:
            return
        for name in _WRAPPED:
            _orig, wrapper = _installed[name]
            if getattr(F, name) is not wrapper:
                raise RuntimeError(
                    f"torch.nn.functional.{name} was replaced after install_conv3d_fallback(); not restoring over it"
                )
        for name in _WRAPPED:
            setattr(F, name, _installed[name][0])
            _installed[name] = None
        _installed["mode"] = None
        _failed_signatures.clear()
        _verify_seen.clear()


def conv3d_stats() -> Dict[str, Any]:
    """Statistics since the start (or :func:`reset_conv3d_stats`):

    - ``"tiers"``: per tier name (``cudnn``/``miopen``/``vendor``, ``tiled``,
      ``naive``, ``cpu``): ``served``, ``failed`` (``errors`` +
      ``non_finite`` + ``mismatches``), ``skipped``, ``attempts``,
      ``errors``, ``non_finite``, ``mismatches``, ``seconds``; over every
      call through the chain (:func:`conv3d`, :func:`conv_transpose3d`,
      their backward ops), the fallback's included.
    - the installed fallback's: ``mode`` (``"fallback"``, ``"verify"``,
      ``"replace"``, or ``None`` when not installed), ``calls`` (every
      ``torch.nn.functional.conv3d`` and ``conv_transpose3d`` call it
      saw), ``transpose_calls`` (the ``conv_transpose3d`` ones), ``fell_back`` (torch
      was called and the chain served instead), ``fell_back_on_error``,
      ``fell_back_on_non_finite``, ``fell_back_on_mismatch``,
      ``verified`` (torch outputs spot-checked, ``"verify"``),
      ``verify_skipped`` (calls of an already checked signature between
      two spot checks),
      ``mismatches`` (of those, wrong) and ``last_mismatch`` (its text),
      ``direct`` (calls sent to the chain without calling torch: every
      call in ``"replace"``, remembered signatures in the others),
      ``remembered`` (signatures whose torch call failed),
      ``chain_failed`` (the chain failed too: its or torch's error was
      raised).
    """
    tiers = {}
    for row in _native.conv3d_stats():
        name, nums = row[0], list(row[1:])
        base = _baseline.get(name)
        if base is not None:
            nums = [a - b for a, b in zip(nums, base)]
        attempts, successes, skips, errors, non_finite, mismatches, seconds = nums
        tiers[name] = {
            "served": successes,
            "failed": errors + non_finite + mismatches,
            "skipped": skips,
            "attempts": attempts,
            "errors": errors,
            "non_finite": non_finite,
            "mismatches": mismatches,
            "seconds": seconds,
        }
    out: Dict[str, Any] = {"tiers": tiers, "mode": _installed["mode"]}
    out.update(_counts)
    out["last_mismatch"] = _last_mismatch[0]
    out["remembered"] = len(_failed_signatures)
    return out


def reset_conv3d_stats() -> None:
    """Starts :func:`conv3d_stats` from zero."""
    _baseline.clear()
    for row in _native.conv3d_stats():
        _baseline[row[0]] = tuple(row[1:])
    _zero_counts()


def _inject_conv3d_failures(kinds: Sequence[str]) -> List[str]:
    """Test-only: from now on, runs of these tier kinds (``"vendor"``,
    ``"tiled"``, ``"naive"``, ``"cpu"``) fail with an injected error, so
    the next tier serves (``[]`` stops it); returns the previous list. The
    environment variable ``ROCM_SAFE_CONV3D_FAIL=vendor,tiled`` sets it at
    start-up."""
    return list(_native.inject_conv3d_failures(list(kinds)))


from ._panic import guard as _guard  # noqa: E402
from ._panic import guard_names as _guard_names  # noqa: E402

_guard_names(globals(), __all__)
# The backward passes run inside torch's autograd engine, not through a
# function above.
for _f in (_Conv3dFunction, _ConvTranspose3dFunction):
    _f.backward = staticmethod(_guard(_f.backward))
