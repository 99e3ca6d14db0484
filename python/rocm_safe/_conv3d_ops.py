"""The guarded convolution as torch operators: ``rocm_safe::conv3d_guarded``
(forward, plain and transposed, in ``aten::convolution``'s argument order
plus the mode) and ``rocm_safe::conv3d_guarded_backward`` (its gradients),
registered with ``torch.library``.

Why operators and not Python around ``F.conv3d``: torch's conv call and its
checks must sit in one place that every path reaches. An operator is what
``torch.compile`` keeps whole (one opaque node, from the fake kernels here:
no graph break), what ``torch.jit.trace`` and ``torch.export`` record, what
autocast casts before (the autocast kernels here), what the autograd engine
and checkpointing see (``register_autograd``: the same saved tensors
whichever path served), and what ``torch.func`` transforms (the vmap rules
here; :class:`_GuardedConv` under ``grad``). The eager kernels call the
serving logic in ``_conv3d_fallback.py`` (torch's call, the checks, the
chain, the counts) at run time, also inside compiled graphs.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import Tensor

_OP = "rocm_safe::conv3d_guarded"
_BACKWARD_OP = "rocm_safe::conv3d_guarded_backward"
# The op's modes: the installed fallback's three, and "chain" (the chain
# only, not counted as a fallback call: rocm_safe.torch.conv3d traced or
# compiled).
MODES = ("fallback", "verify", "replace", "chain")


_serving: list = []


def _serve():
    """The serving logic's module (``_conv3d_fallback``, which imports this
    one: looked up at the first call, then kept)."""
    if not _serving:
        from . import _conv3d_fallback

        _serving.append(_conv3d_fallback)
    return _serving[0]


def memory_format(t: Tensor, other: Optional[Tensor] = None) -> torch.memory_format:
    """The layout of an op output: channels_last_3d when ``t`` (or
    ``other``) is in it, as torch's conv picks, else contiguous. The eager
    kernels return exactly this layout and the fake kernels say so, so a
    compiled graph reads the outputs with the strides they have."""
    for u in (t, other):
        if u is not None and u.dim() == 5 and not u.is_contiguous() and u.is_contiguous(
            memory_format=torch.channels_last_3d
        ):
            return torch.channels_last_3d
    return torch.contiguous_format


# cudagraph_unsafe: the kernels make host-side decisions (and, on a GPU,
# queue the guard's verdict read-back), so inductor's CUDA graphs
# ("reduce-overhead") are split around the operators rather than capture them.
_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()
if not hasattr(torch.library, "custom_op"):  # torch < 2.4
    raise ImportError(f"rocm_safe's conv3d fallback needs torch >= 2.4 (torch.library.custom_op), not {torch.__version__}")


@torch.library.custom_op(_OP, mutates_args=(), tags=_TAGS)
def conv3d_guarded(
    input: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    transposed: bool,
    output_padding: List[int],
    groups: int,
    mode: str,
) -> Tensor:
    """torch's conv (``conv3d`` or ``conv_transpose3d``) checked and served
    by the chain where it fails, per ``mode``; 5-d operands."""
    params = (list(stride), list(padding), list(dilation), bool(transposed), list(output_padding), int(groups))
    return _serve().serve_forward(mode, input, weight, bias, params)


@conv3d_guarded.register_fake
def _conv3d_guarded_fake(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, mode):
    out = torch.ops.aten.convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    return out.contiguous(memory_format=memory_format(input, weight))


@torch.library.custom_op(_BACKWARD_OP, mutates_args=(), tags=_TAGS)
def conv3d_guarded_backward(
    grad_output: Tensor,
    input: Tensor,
    weight: Tensor,
    bias_size: int,
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    transposed: bool,
    output_padding: List[int],
    groups: int,
    mode: str,
    output_mask: List[bool],
) -> Tuple[Tensor, Tensor, Tensor]:
    """The gradients of :func:`conv3d_guarded` (input, weight, bias; an
    empty tensor where ``output_mask`` is false; ``bias_size`` -1 without a
    bias), torch's checked, the chain's where torch fails."""
    params = (list(stride), list(padding), list(dilation), bool(transposed), list(output_padding), int(groups))
    return _serve().serve_backward(mode, grad_output, input, weight, int(bias_size), params, list(output_mask))


def backward_layouts(grad_output, input, weight, bias_size, output_mask):
    """Empty tensors in the backward op's output layouts (what the eager
    kernel returns, and its fake kernel says)."""
    dtype = input.dtype
    gi = (
        torch.empty(input.shape, dtype=dtype, device=input.device).contiguous(memory_format=memory_format(input))
        if output_mask[0]
        else input.new_empty(0)
    )
    gw = (
        torch.empty(weight.shape, dtype=weight.dtype, device=weight.device).contiguous(
            memory_format=memory_format(weight)
        )
        if output_mask[1]
        else weight.new_empty(0)
    )
    gb = (
        torch.empty([bias_size], dtype=weight.dtype, device=weight.device)
        if output_mask[2] and bias_size >= 0
        else weight.new_empty(0)
    )
    return gi, gw, gb


@conv3d_guarded_backward.register_fake
def _conv3d_guarded_backward_fake(
    grad_output, input, weight, bias_size, stride, padding, dilation, transposed, output_padding, groups, mode, mask
):
    return backward_layouts(grad_output, input, weight, bias_size, mask)


# --------------------------------------------------------------------------
# Autograd: the same tensors saved whichever path serves (torch's, the
# chain's), so non-reentrant checkpointing finds them equal on recompute.


def _setup_context(ctx, inputs, output):
    input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, mode = inputs
    ctx.save_for_backward(input, weight)
    ctx.bias_size = -1 if bias is None else int(bias.shape[0])
    ctx.params = (stride, padding, dilation, transposed, output_padding, groups, mode)


def _backward(ctx, grad_output):
    input, weight = ctx.saved_tensors
    stride, padding, dilation, transposed, output_padding, groups, mode = ctx.params
    mask = [bool(ctx.needs_input_grad[0]), bool(ctx.needs_input_grad[1]), bool(ctx.needs_input_grad[2])]
    mask[2] = mask[2] and ctx.bias_size >= 0
    if not any(mask):
        return (None,) * 10
    args = (
        grad_output.contiguous(), input, weight, ctx.bias_size, stride, padding, dilation, transposed,
        output_padding, groups, mode, mask,
    )
    if not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active():
        gi, gw, gb = _GuardedConvBackward.apply(*args)
    else:
        gi, gw, gb = conv3d_guarded_backward(*args)
    return (
        gi if mask[0] else None,
        gw if mask[1] else None,
        gb if mask[2] else None,
    ) + (None,) * 7


conv3d_guarded.register_autograd(_backward, setup_context=_setup_context)


# --------------------------------------------------------------------------
# Autocast: the op runs in the dtype autocast chose for a conv (its
# lower-precision list: floating tensors other than float64 cast to the
# autocast dtype of their device type), with autocast off inside, so the
# checks see the dtype that is served and hold it to that dtype's tolerance.

_AUTOCAST_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU) | torch._C.DispatchKeySet(
    torch._C.DispatchKey.AutocastCUDA
)


def _autocast_kernel(device_type: str):
    def kernel(_keyset, input, weight, bias, *rest):
        dtype = torch.get_autocast_dtype(device_type)

        def cast(t):
            if (
                t is not None
                and t.is_floating_point()
                and t.dtype != torch.float64
                and t.device.type == device_type
                and t.dtype != dtype
            ):
                return t.to(dtype)
            return t

        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_KEYS):
            return conv3d_guarded._opoverload(cast(input), cast(weight), cast(bias), *rest)

    return kernel


for _device_type, _key in (("cpu", "AutocastCPU"), ("cuda", "AutocastCUDA")):
    conv3d_guarded._lib.impl(conv3d_guarded._name, _autocast_kernel(_device_type), _key, with_keyset=True)


# --------------------------------------------------------------------------
# vmap: an operand batched only in the input folds the vmapped dimension
# into the conv's batch (one call); any other batching is a loop of calls,
# each guarded.


def _at(t, d, i):
    return t if t is None or d is None else t.select(d, i)


def _conv3d_guarded_vmap(info, in_dims, input, weight, bias, *rest):
    xd, wd, bd = in_dims[:3]
    if xd is not None and wd is None and bd is None:
        x = input.movedim(xd, 0)
        y = conv3d_guarded(x.flatten(0, 1), weight, bias, *rest)
        return y.unflatten(0, tuple(x.shape[:2])), 0
    outs = [conv3d_guarded(_at(input, xd, i), _at(weight, wd, i), _at(bias, bd, i), *rest) for i in range(info.batch_size)]
    return torch.stack(outs), 0


def _conv3d_guarded_backward_vmap(info, in_dims, grad_output, input, weight, *rest):
    gd, xd, wd = in_dims[:3]
    outs = [
        conv3d_guarded_backward(_at(grad_output, gd, i), _at(input, xd, i), _at(weight, wd, i), *rest)
        for i in range(info.batch_size)
    ]
    return tuple(torch.stack([o[k] for o in outs]) for k in range(3)), (0, 0, 0)


if hasattr(conv3d_guarded, "register_vmap"):  # torch >= 2.5 (else vmap refuses the op)
    conv3d_guarded.register_vmap(_conv3d_guarded_vmap)
    conv3d_guarded_backward.register_vmap(_conv3d_guarded_backward_vmap)


# --------------------------------------------------------------------------
# torch.func (grad, vjp, jacrev, vmap of them): the operator's autograd
# registration does not reach functorch's grad transform, so under a
# transform the call is this autograd.Function around the same two
# operators (vmap through the operators' rules).


class _GuardedConv(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, mode):
        return conv3d_guarded(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, mode)

    @staticmethod
    def setup_context(ctx, inputs, output):
        _setup_context(ctx, inputs, output)

    @staticmethod
    def backward(ctx, grad_output):
        return _backward(ctx, grad_output)


class _GuardedConvBackward(torch.autograd.Function):
    """The backward operator under a ``torch.func`` transform (once
    differentiable: a gradient of the gradients is refused)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(*args):
        return conv3d_guarded_backward(*args)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(
            "rocm_safe's guarded conv3d is differentiable once: a gradient of its gradients"
            " (double backward, torch.func.hessian) is not supported"
        )


def guarded_conv(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, mode):
    """The guarded op, through :class:`_GuardedConv` under a ``torch.func``
    transform; 5-d operands, parameters as lists of 3 ints."""
    args = (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, mode)
    if torch.compiler.is_compiling():
        return conv3d_guarded(*args)
    if torch._C._are_functorch_transforms_active():
        return _GuardedConv.apply(*args)
    return conv3d_guarded(*args)
