"""The conv3d fallback: :func:`install_conv3d_fallback` puts rocm-safe's
conv3d chain (``_conv3d.py``) behind ``torch.nn.functional.conv3d`` and
``conv_transpose3d``; :func:`conv3d_stats` counts what it did.

Two layers. ``F.conv3d`` / ``F.conv_transpose3d`` are replaced by thin
wrappers that only normalize the arguments and call the
``rocm_safe::conv3d_guarded`` operator (``_conv3d_ops.py``) with the
installed mode. Everything else happens inside that operator's eager
kernel, :func:`serve_forward` (and :func:`serve_backward` for its
gradients): torch's call, the checks, the chain where torch fails, and
the counts. So a compiled graph, a trace, an autocast region, a
checkpoint's recompute and a ``torch.func`` transform all reach the same
guard, at run time.

Re-exported by :mod:`rocm_safe.torch`, where users find them.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

from . import _native
from ._conv3d import (
    _backend,
    _conv_out_shape,
    _device_and_stream,
    conv3d,
    conv3d_chain_grads,
    conv_transpose3d,
    conv_transpose3d_chain_grads,
)
try:
    from ._conv3d_ops import guarded_conv, memory_format

    _OPS_ERROR: Optional[str] = None
except ImportError as _e:  # an older torch: the rest of rocm_safe.torch still works
    _OPS_ERROR = str(_e)

__all__ = [
    "install_conv3d_fallback",
    "uninstall_conv3d_fallback",
    "conv3d_stats",
    "reset_conv3d_stats",
]

# --------------------------------------------------------------------------
# State and counts

_lock = threading.Lock()
# The mode, and per wrapped function ("conv3d", "conv_transpose3d") the
# function that was there and our wrapper.
_installed: Dict[str, Any] = {"mode": None, "conv3d": None, "conv_transpose3d": None}
_counts: Dict[str, int] = {}
_baseline: Dict[str, Tuple] = {}
# Call signatures whose torch call failed (raised, non-finite, mismatched):
# sent straight to the chain from then on (backward ones too, apart).
_failed_signatures: Set[Tuple] = set()
_last_mismatch: List[Optional[str]] = [None]
# "verify" checks the first _VERIFY_FIRST calls of a signature, then one in
# _VERIFY_EVERY, where each check waits for the device; calls seen per
# signature.
_VERIFY_FIRST = 2
_VERIFY_EVERY = 16
_verify_seen: Dict[Tuple, int] = {}
# Guarded calls (torch's output checked on the GPU with no wait, repaired
# there behind a device-side gate): (device, ticket) -> (signature, kind),
# until their records come back; the devices that have a guard.
_pending: Dict[Tuple[str, int], Tuple[Tuple, str]] = {}
_guard_devices: Set[str] = set()
# Why conv3d calls were not guarded (checked synchronously instead).
_unguarded: Dict[str, int] = {}
# Why torch's output was served without a check (reason -> calls), and why
# a check that was tried could not run.
_unchecked: Dict[str, int] = {}
_could_not_check: Dict[str, int] = {}
_backward_unchecked: Dict[str, int] = {}
_backward_could_not_check: Dict[str, int] = {}

_MODES = ("fallback", "verify", "replace")
_WRAPPED = ("conv3d", "conv_transpose3d")
# The dtypes the chain serves: float32 and bfloat16 natively, float16
# widened to float32 (exact) and the result rounded back.
_SERVED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _zero_counts() -> None:
    _counts.update(
        calls=0,
        transpose_calls=0,
        # The outcomes of a call (each call has one): the chain served it
        # without calling torch; torch failed and rocm-safe served it;
        # torch's output passed the mode's check; torch's output was served
        # unchecked or its check could not run (why: below); an error
        # reached the caller.
        direct=0,
        fell_back=0,
        checked=0,
        raised=0,
        # Details.
        fell_back_on_error=0,
        fell_back_on_non_finite=0,
        fell_back_on_mismatch=0,
        verified=0,
        verify_skipped=0,
        mismatches=0,
        chain_failed=0,
        guarded=0,
        repaired=0,
        repair_failed=0,
        # The backward op (one call per conv whose gradients were asked).
        backward_calls=0,
        backward_direct=0,
        backward_fell_back=0,
        backward_checked=0,
        backward_raised=0,
        backward_verified=0,
        backward_mismatches=0,
    )
    _last_mismatch[0] = None
    for d in (_unguarded, _unchecked, _could_not_check, _backward_unchecked, _backward_could_not_check):
        d.clear()


_zero_counts()


# The counts are updated from any thread that runs a conv (a read-modify-
# write each): under their own lock, so that none is lost.
_count_lock = threading.Lock()


def _inc(key: str) -> None:
    with _count_lock:
        _counts[key] += 1


def _bump(d: Dict[str, int], key: str) -> None:
    with _count_lock:
        d[key] = d.get(key, 0) + 1


class _CannotCheck(Exception):
    """A value check that cannot run on this call (its reason)."""


def _chain_takes(input, weight, bias) -> Optional[str]:
    """``None`` when the chain can serve a call (one dtype of
    :data:`_SERVED_DTYPES` for all operands, on cpu/cuda), else why not."""
    ts = [t for t in (input, weight, bias) if t is not None]
    if not all(isinstance(t, torch.Tensor) for t in ts):
        return "not tensors"
    if input.dtype not in _SERVED_DTYPES:
        return f"dtype {input.dtype}"
    if any(t.dtype != input.dtype for t in ts):
        return "mixed dtypes"
    if any(t.device != input.device for t in ts) or input.device.type not in ("cpu", "cuda"):
        return f"device {input.device}"
    if any(t.layout != torch.strided for t in ts):
        return "layout"
    return None


def _all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite, with one read of ``t`` and a
    two-value read-back: ``aminmax`` propagates NaN and keeps +-inf as its
    extremes, so the pair is finite exactly when ``t`` is. (``isfinite(t)
    .all()`` writes and reads a mask as large as ``t`` first.)"""
    if t.numel() == 0:
        return True
    if not t.is_floating_point():
        return True
    lo, hi = torch.aminmax(t)
    return bool(torch.isfinite(torch.stack((lo, hi))).all())


def _finite(*ts) -> bool:
    return all(_all_finite(t) for t in ts if t is not None)


def _signature(kind, input, weight, bias, params) -> Tuple:
    """What identifies a call for the memory of failed torch calls: the
    function, shapes, dtype, device and parameters (never the values)."""
    return (
        kind,
        tuple(input.shape),
        tuple(weight.shape),
        None if bias is None else tuple(bias.shape),
        input.dtype,
        input.device,
        repr(params),
    )


# Relative tolerance for a float32 conv torch computed with TF32 (10-bit
# mantissa operands: each product within 2**-10 of exact, so the sum within
# about 1e-3 of sum |x * w|; doubled for margin).
_TF32_REL_TOL = 2e-3
# For a float16 output (autocast's fp16): the operands are exact in f32,
# the output rounded to f16 (2**-11 of |y| <= 2**-11 of sum |x * w|), and
# libraries may accumulate in f16 for part of the sum: 4e-3 of sum |x * w|.
_F16_REL_TOL = 4e-3


def _tf32_tolerance(x) -> Optional[float]:
    """The tolerance for torch's float32 conv output on a GPU where torch
    allows TF32 for it (cuDNN's ``allow_tf32``, on by default; cuBLAS's
    for the path without cuDNN), else ``None`` (the chain's own)."""
    if x.dtype != torch.float32 or x.device.type != "cuda":
        return None
    cudnn = torch.backends.cudnn
    tf32 = cudnn.allow_tf32 if cudnn.enabled else torch.backends.cuda.matmul.allow_tf32
    return _TF32_REL_TOL if tf32 else None


def _verify_output(out, input, weight, bias, stride_t, padding_t, dilation_t, groups) -> Optional[str]:
    """torch's conv3d output checked on the device at the chain's sampled
    points (f64 recomputation): ``None`` when they agree, else the
    mismatch; :class:`_CannotCheck` where the check cannot take the call.
    A float16 output (autocast) is checked in f32 (the operands widened
    exactly) at float16's tolerance."""
    x, w, b, y = input, weight, bias, out
    tol = _tf32_tolerance(x)
    if x.dtype == torch.float16:
        x, w, y = x.float(), w.float(), y.float()
        b = None if b is None else b.float()
        tol = _F16_REL_TOL
    x = x.detach().contiguous()
    w = w.detach().contiguous()
    b = None if b is None else b.detach().contiguous()
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
            tol,
        )
    except (TypeError, ValueError) as e:
        raise _CannotCheck(f"the check refuses it ({type(e).__name__})") from e


def _verify_transpose_output(out, input, weight, bias, stride_t, padding_t, output_padding_t, dilation_t, groups):
    """torch's conv_transpose3d output checked as :func:`_verify_output`
    does (a bf16 output is widened to f32 for the check; a float16 one
    cannot be: the transposed check has no float16 tolerance)."""
    if input.dtype == torch.float16:
        return _verify_f16_transpose(out, input, weight, bias, stride_t, padding_t, output_padding_t, dilation_t, groups)
    x = input.detach().contiguous()
    w = weight.detach().contiguous()
    b = None if bias is None else bias.detach().contiguous()
    y = out.detach().to(torch.float32).contiguous()
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
            list(stride_t),
            list(padding_t),
            list(output_padding_t),
            list(dilation_t),
            groups,
            _backend(),
        )
    except (TypeError, ValueError) as e:
        raise _CannotCheck(f"the check refuses it ({type(e).__name__})") from e


def _verify_f16_transpose(out, x, w, b, stride_t, padding_t, output_padding_t, dilation_t, groups) -> Optional[str]:
    """A float16 conv_transpose3d output (the native transposed check has
    no float16 tolerance) against the chain's f32 result of the exactly
    widened operands (itself checked), at float16's tolerance of each
    point's ``sum |x * w|`` (the chain's result on ``|x|``, ``|w|``)."""
    args = (stride_t, padding_t, output_padding_t, groups, dilation_t)
    with torch.no_grad():
        try:
            ref = conv_transpose3d(x.float(), w.float(), None if b is None else b.float(), *args)
            mag = conv_transpose3d(x.float().abs(), w.float().abs(), None, *args)
        except (TypeError, ValueError) as e:
            raise _CannotCheck(f"the chain refuses it ({type(e).__name__})") from e
        if b is not None:
            mag = mag + b.float().abs().view(1, -1, 1, 1, 1)
        err = (out.float() - ref).abs()
        bad = err > _F16_REL_TOL * mag + 1e-6
        if bool(bad.any()):
            i = tuple(int(v) for v in bad.nonzero()[0])
            return f"output {out[i].item()} at {list(i)} differs from the chain's f32 result {ref[i].item()}"
    return None


def _unguardable(out, input) -> Optional[str]:
    """Why torch's conv3d output cannot be guarded on the device (checked
    and repaired there with no wait), or ``None``: a GPU output of the
    input's dtype (float32 or bfloat16), compact (the repair writes it in
    place; operands that are not compact are copied for the guard). The
    gradients are the operator's own, from the saved operands, so a
    repaired output needs nothing else."""
    if out.device.type != "cuda" or out.device != input.device:
        return "not on a GPU"
    if out.dtype not in (torch.float32, torch.bfloat16):
        return f"dtype {out.dtype}"
    if not out.is_contiguous():
        return "output not contiguous"
    return None


_guard_backend: List[Optional[str]] = [None]
_to_dlpack = torch.utils.dlpack.to_dlpack


def _guard(out, x, w, b, stride_t, padding_t, dilation_t, groups, sig, verify: bool) -> Optional[str]:
    """Queues the guard of torch's conv3d output ``out`` on torch's stream
    (the NaN/Inf count, with ``verify`` the sampled f64 points, and the
    tiled kernel's repair behind the device's verdict): ``None``, or why it
    could not be queued (the caller checks synchronously then)."""
    # Operands that are not compact (a permuted view, say: diffusers' Wan
    # VAE feeds its 1x1x1 shortcut one) are copied for the guard rather than
    # checked with a host wait. The copies come from torch's allocator on
    # this stream: when they are freed here, a later user of their memory
    # on the stream runs after the guard's kernels.
    x = x.detach().contiguous()
    w = w.detach().contiguous()
    b = None if b is None else b.detach().contiguous()
    dev, stream = _device_and_stream(x.device)
    backend = _guard_backend[0]
    if backend is None:
        backend = _guard_backend[0] = _backend()
    try:
        ticket, records = _native.conv3d_guard(
            dev,
            stream,
            _to_dlpack(x),
            _to_dlpack(w),
            None if b is None else _to_dlpack(b),
            _to_dlpack(out),
            list(stride_t),
            list(padding_t),
            list(dilation_t),
            groups,
            backend,
            verify,
            _tf32_tolerance(x),
        )
    except (TypeError, ValueError, RuntimeError) as e:
        # Not taken, or not queued whole: the synchronous checks decide.
        return f"{type(e).__name__}: {e}"
    _guard_devices.add(dev)
    if records:
        _take_records(dev, records)
    if ticket is None:
        return "the tiled kernel does not take it"
    _pending[(dev, ticket)] = (sig, "conv3d")
    _inc("guarded")
    if verify:
        _inc("verified")
    return None


def _take_records(dev: str, records) -> None:
    """Counts and reports the verdicts of guarded calls that came back: a
    call that passed is ``checked``, one that failed ``fell_back``."""
    for ticket, failed, non_finite, operands_finite, problem, repaired, repair_failed, repair_problem in records:
        info = _pending.pop((dev, ticket), None)
        if info is None:
            continue
        sig, kind = info
        if repaired:
            _inc("repaired")
        if failed:
            _failed_signatures.add(sig)
            _inc("fell_back")
            if non_finite and operands_finite:
                _inc("fell_back_on_non_finite")
            else:
                _inc("fell_back_on_mismatch")
                _inc("mismatches")
                _last_mismatch[0] = problem
                warnings.warn(
                    f"rocm_safe: torch's {kind} returned wrong values ({problem}); the"
                    " output was rewritten by rocm-safe's tiled kernel on the GPU, and"
                    " later calls of its signature go to the chain",
                    RuntimeWarning,
                    stacklevel=3,
                )
        else:
            _inc("checked")
        if repair_failed:
            _inc("repair_failed")
            _failed_signatures.add(sig)
            warnings.warn(
                f"rocm_safe: the GPU repair of a wrong {kind} output failed its own check"
                f" ({repair_problem}): that output is wrong; later calls of its signature"
                " go through the whole chain",
                RuntimeWarning,
                stacklevel=3,
            )


def _harvest() -> None:
    """Collects every guarded call's verdict (waits for the GPU work queued
    before them)."""
    for dev in sorted(_guard_devices):
        _take_records(dev, _native.conv3d_guard_harvest(dev, _backend()))


# --------------------------------------------------------------------------
# Serving one call (the operator's eager kernels)


def _torch_fn(kind: str):
    """torch's function the installed fallback wraps (the one that was
    there at install: torch's own, or another library's), else torch's."""
    record = _installed[kind]
    if record is not None:
        return record[0]
    return torch.conv3d if kind == "conv3d" else torch.conv_transpose3d


def _call_torch(kind, x, w, b, params):
    stride, padding, dilation, transposed, output_padding, groups = params
    if transposed:
        return _torch_fn(kind)(x, w, b, stride, padding, output_padding, groups, dilation)
    return _torch_fn(kind)(x, w, b, stride, padding, dilation, groups)


def _chain_forward(x, w, b, params):
    """The chain's conv (float16 widened to float32 exactly, the result
    rounded back); ``TypeError`` / ``ValueError`` for what it refuses."""
    stride, padding, dilation, transposed, output_padding, groups = params
    dtype = x.dtype
    if dtype == torch.float16:
        x, w = x.float(), w.float()
        b = None if b is None else b.float()
    with torch.no_grad():
        if transposed:
            out = conv_transpose3d(x, w, b, stride, padding, output_padding, groups, dilation)
        else:
            out = conv3d(x, w, b, stride, padding, dilation, groups)
    return out.to(dtype)


def _layout(out: torch.Tensor, x, w) -> torch.Tensor:
    """``out`` in the layout the operator's fake kernel promises."""
    return out.contiguous(memory_format=memory_format(x, w))


def _warn_mismatch(kind: str, mismatch: str, what: str = "") -> None:
    if not what:
        _inc("mismatches")  # (the backward's: backward_mismatches)
    _last_mismatch[0] = mismatch
    warnings.warn(
        f"rocm_safe: torch's {kind}{what} returned wrong values ({mismatch});"
        " this call and later calls of its signature go to the chain",
        RuntimeWarning,
        stacklevel=4,
    )


def serve_forward(mode, x, w, b, params):
    """One call of the ``rocm_safe::conv3d_guarded`` operator: 5-d operands
    that need no gradients here (the operator's autograd is apart),
    ``params`` = (stride, padding, dilation, transposed, output_padding,
    groups) as lists of ints."""
    stride, padding, dilation, transposed, output_padding, groups = params
    kind = "conv_transpose3d" if transposed else "conv3d"
    if mode == "chain":  # rocm_safe.torch.conv3d recorded: not a fallback call
        return _layout(_chain_forward(x, w, b, params), x, w)
    if mode not in _MODES:
        raise ValueError(f"rocm_safe::conv3d_guarded: unknown mode {mode!r}")
    _inc("calls")
    if transposed:
        _inc("transpose_calls")
    refused = _chain_takes(x, w, b)
    sig = _signature(kind, x, w, b, params) if refused is None else None

    def to_chain(error, reason):
        try:
            result = _chain_forward(x, w, b, params)
        except Exception as chain_error:
            _inc("chain_failed")
            _inc("raised")
            if error is not None:
                raise error from chain_error
            raise
        _inc("fell_back")
        _inc(reason)
        return _layout(result, x, w)

    if refused is None and (mode == "replace" or sig in _failed_signatures):
        try:
            result = _chain_forward(x, w, b, params)
        except (TypeError, ValueError) as e:
            refused = f"the chain refuses it ({e})"  # torch's path below
        except Exception:
            _inc("chain_failed")
            _inc("raised")
            raise
        else:
            _inc("direct")
            return _layout(result, x, w)
    try:
        out = _call_torch(kind, x, w, b, params)
    except Exception as e:  # noqa: BLE001 - any failure of torch's path
        if refused is not None:
            _inc("raised")
            raise
        _failed_signatures.add(sig)
        return to_chain(e, "fell_back_on_error")
    if refused is not None:
        # Nothing to serve it with: torch's output, unchecked, and why.
        _bump(_unchecked, refused)
        return out
    out = _layout(out, x, w)
    verify = mode == "verify"
    if not transposed:
        # On a GPU: guarded on the device with no wait ("verify": every
        # guarded call; a verdict comes back later, so a signature found
        # wrong is remembered only then, and a spot-check schedule would
        # let the calls in between through unchecked).
        why = _unguardable(out, x) or _guard(out, x, w, b, stride, padding, dilation, groups, sig, verify)
        if why is None:
            return out
        _bump(_unguarded, why)
    # Synchronously: the NaN/Inf scan; in "verify" the sampled points of
    # the first calls of each signature, then one in _VERIFY_EVERY.
    check_now = False
    if verify:
        seen = _verify_seen.get(sig, 0)
        _verify_seen[sig] = seen + 1
        check_now = seen < _VERIFY_FIRST or seen % _VERIFY_EVERY == 0
    if not _all_finite(out):
        if not _finite(x, w, b):
            _bump(_unchecked, "non-finite inputs")
            return out  # NaN/Inf in, NaN/Inf out: no failure
        _failed_signatures.add(sig)
        return to_chain(None, "fell_back_on_non_finite")
    if not verify:
        _inc("checked")
        return out
    if not check_now:
        # (Each synchronous check waits for the output; checking every call
        # would cost far more than the conv.)
        _inc("verify_skipped")
        _bump(_unchecked, "verify: between spot checks (NaN/Inf scanned)")
        return out
    try:
        if transposed:
            mismatch = _verify_transpose_output(out, x, w, b, stride, padding, output_padding, dilation, groups)
        else:
            mismatch = _verify_output(out, x, w, b, stride, padding, dilation, groups)
    except _CannotCheck as e:
        _bump(_could_not_check, str(e))
        return out
    _inc("verified")
    if mismatch is not None:
        _failed_signatures.add(sig)
        _warn_mismatch(kind, mismatch)
        return to_chain(None, "fell_back_on_mismatch")
    _inc("checked")
    return out


def _chain_backward(dy, x, w, bias_size, params, mask):
    """The chain's gradients (float16 through float32)."""
    stride, padding, dilation, transposed, output_padding, groups = params
    dtype = x.dtype
    if dtype == torch.float16:
        dy, x, w = dy.float(), x.float(), w.float()
    dy = dy.to(x.dtype)
    if transposed:
        p = (tuple(stride), tuple(padding), tuple(output_padding), tuple(dilation), groups)
        grads = conv_transpose3d_chain_grads(dy, x, w, x.dtype, p, mask)
    else:
        p = (tuple(stride), tuple(padding), tuple(dilation), groups)
        grads = conv3d_chain_grads(dy, x, w, x.dtype, p, mask)
    return [None if g is None else g.to(dtype) for g in grads]


def _torch_backward(dy, x, w, bias_size, params, mask):
    stride, padding, dilation, transposed, output_padding, groups = params
    return list(
        torch.ops.aten.convolution_backward(
            dy,
            x,
            w,
            [bias_size] if bias_size >= 0 else None,
            stride,
            padding,
            dilation,
            transposed,
            output_padding,
            groups,
            mask,
        )
    )


def serve_backward(mode, dy, x, w, bias_size, params, mask):
    """One call of ``rocm_safe::conv3d_guarded_backward``: the gradients
    (input, weight, bias) where ``mask`` asks, an empty tensor elsewhere,
    in the operator's layouts."""
    from ._conv3d_ops import backward_layouts

    transposed = params[3]
    kind = "conv_transpose3d" if transposed else "conv3d"
    shells = backward_layouts(dy, x, w, bias_size, mask)

    def finish(grads):
        outs = []
        for g, shell, m in zip(grads, shells, mask):
            if not m or g is None:
                outs.append(shell)
            elif g.shape == shell.shape and g.stride() == shell.stride() and g.dtype == shell.dtype:
                outs.append(g)
            else:
                outs.append(shell.copy_(g))
        return tuple(outs)

    if mode == "chain":
        return finish(_chain_backward(dy, x, w, bias_size, params, mask))
    _inc("backward_calls")
    refused = _chain_takes(dy, x, w)
    sig = ("backward",) + _signature(kind, x, w, None, params) if refused is None else None

    def to_chain(error):
        try:
            grads = _chain_backward(dy, x, w, bias_size, params, mask)
        except Exception as chain_error:
            _inc("chain_failed")
            _inc("backward_raised")
            if error is not None:
                raise error from chain_error
            raise
        return finish(grads)

    if refused is None and (mode == "replace" or sig in _failed_signatures):
        try:
            grads = _chain_backward(dy, x, w, bias_size, params, mask)
        except (TypeError, ValueError) as e:
            refused = f"the chain refuses it ({e})"  # torch's path below
        except Exception:
            _inc("chain_failed")
            _inc("backward_raised")
            raise
        else:
            _inc("backward_direct")
            return finish(grads)
    try:
        grads = _torch_backward(dy, x, w, bias_size, params, mask)
    except Exception as e:  # noqa: BLE001 - any failure of torch's backward
        if refused is not None:
            _inc("backward_raised")
            raise
        _failed_signatures.add(sig)
        out = to_chain(e)
        _inc("backward_fell_back")
        return out
    if refused is not None:
        _bump(_backward_unchecked, refused)
        return finish(grads)
    if not _finite(*[g for g, m in zip(grads, mask) if m]):
        if not _finite(dy, x, w):
            _bump(_backward_unchecked, "non-finite inputs")
            return finish(grads)
        _failed_signatures.add(sig)
        out = to_chain(None)
        _inc("backward_fell_back")
        return out
    if mode == "verify":
        seen = _verify_seen.get(sig, 0)
        _verify_seen[sig] = seen + 1
        if not (seen < _VERIFY_FIRST or seen % _VERIFY_EVERY == 0):
            _bump(_backward_unchecked, "verify: between spot checks (NaN/Inf scanned)")
            return finish(grads)
        try:
            problem = _verify_gradients(dy, x, w, grads, params, mask)
        except _CannotCheck as e:
            _bump(_backward_could_not_check, str(e))
            return finish(grads)
        _inc("backward_verified")
        if problem is not None:
            _inc("backward_mismatches")
            _failed_signatures.add(sig)
            _warn_mismatch(kind, problem, " backward")
            out = to_chain(None)
            _inc("backward_fell_back")
            return out
    _inc("backward_checked")
    return finish(grads)


# Tolerances of the gradient checks, relative to each sampled value's
# sum |a * b| (what its rounding errors scale with).
_GRAD_REL_TOL = {torch.float32: 1e-3, torch.bfloat16: 2e-2, torch.float16: 1e-2}
_GRAD_SAMPLES = 8


def _verify_gradients(dy, x, w, grads, params, mask) -> Optional[str]:
    """torch's conv gradients checked: the input gradient at the chain's
    sampled points (it is a convolution of ``dy``: the native check), the
    weight gradient at sampled entries and the bias gradient whole against
    float64 sums on the device. ``None`` when all agree, else the first
    mismatch; :class:`_CannotCheck` where one asked for cannot be checked."""
    stride, padding, dilation, transposed, output_padding, groups = params
    gi, gw, gb = grads
    tf32 = _tf32_tolerance(x)
    tol = _GRAD_REL_TOL[x.dtype] * (4 if tf32 is not None else 1)
    if mask[0]:
        if transposed:
            # dx = conv3d(dy, w), cropped where output_padding reaches the stride.
            full = _conv_out_shape(dy.shape, w.shape, stride, padding, dilation)
            if list(full) != list(x.shape):
                raise _CannotCheck("input gradient: cropped (output_padding >= stride)")
            problem = _verify_output(gi, dy, w, None, stride, padding, dilation, groups)
        else:
            if tf32 is not None:
                raise _CannotCheck("input gradient: TF32 (the transposed check has no TF32 tolerance)")
            # dx = conv_transpose3d(dy, w) with the output_padding that gives x's shape.
            op = []
            for X, O, k, s, p, d in zip(x.shape[2:], dy.shape[2:], w.shape[2:], stride, padding, dilation):
                op.append(X - ((O - 1) * s - 2 * p + d * (k - 1) + 1))
            problem = _verify_transpose_output(gi, dy, w, None, stride, padding, op, dilation, groups)
        if problem is not None:
            return f"input gradient: {problem}"
    if mask[1]:
        a, b = (x, dy) if transposed else (dy, x)
        problem = _check_weight_gradient(a, b, gw, stride, padding, dilation, groups, tol)
        if problem is not None:
            return problem
    if mask[2]:
        ref = dy.double().sum(dim=(0, 2, 3, 4))
        mag = dy.double().abs().sum(dim=(0, 2, 3, 4))
        err = (gb.double() - ref).abs()
        bad = err > tol * mag + 1e-30
        if bool(bad.any()):
            i = int(bad.nonzero()[0, 0])
            return f"bias gradient [{i}]: {gb[i].item()} against {ref[i].item()} (f64)"
    return None


def _check_weight_gradient(a, b, gw, stride, padding, dilation, groups, tol) -> Optional[str]:
    """Sampled entries of a conv's weight gradient ``gw[k, c, tap] = sum_n
    sum_o a[n, k, o] * b_padded[n, group(k) * C + c, o * stride + tap *
    dilation]`` (``a``: the output-side tensor, ``b``: the input side)
    against float64 sums."""
    K, C = gw.shape[0], gw.shape[1]
    per_group = K // groups
    taps = gw.shape[2:]
    out = a.shape[2:]
    pd, ph, pw = padding
    bp = torch.nn.functional.pad(b, (pw, pw, ph, ph, pd, pd))
    for i in range(_GRAD_SAMPLES):
        k = (i * 7919 + K // 2) % K
        c = (i * 104729) % C
        tap = [(i * m) % t for m, t in zip((1, 3, 5), taps)]
        ch = (k // per_group) * C + c
        idx = [slice(None), ch]
        for t, s, d, o in zip(tap, stride, dilation, out):
            start = t * d
            idx.append(slice(start, start + s * (o - 1) + 1, s))
        part = bp[tuple(idx)]
        if tuple(part.shape[1:]) != tuple(out):
            raise _CannotCheck("weight gradient: shapes")
        prod = a[:, k].double() * part.double()
        ref = prod.sum()
        mag = prod.abs().sum()
        got = gw[(k, c) + tuple(tap)].double()
        if bool((got - ref).abs() > tol * mag + 1e-30):
            return f"weight gradient [{k}, {c}, {tap}]: {got.item()} against {ref.item()} (f64)"
    return None


# --------------------------------------------------------------------------
# torch.nn.functional.conv3d / conv_transpose3d: the wrappers. They only
# shape the arguments for the operator (no counts, no checks: under
# torch.compile this code is traced, and the operator it calls is what
# runs); calls they cannot shape go to the wrapped function as they are
# (torch raises its own error for them).


def _triple_or_none(v) -> Optional[List[int]]:
    """``v`` (an int or 1 or 3 ints) as 3 ints, else ``None``."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return [v, v, v]
    if isinstance(v, (tuple, list)) and len(v) in (1, 3) and all(
        isinstance(e, int) and not isinstance(e, bool) for e in v
    ):
        return [v[0]] * 3 if len(v) == 1 else [v[0], v[1], v[2]]
    return None


def _operands_ok(input, weight, bias, groups) -> bool:
    return (
        isinstance(input, torch.Tensor)
        and isinstance(weight, torch.Tensor)
        and (bias is None or isinstance(bias, torch.Tensor))
        and input.dim() in (4, 5)
        and weight.dim() == 5
        and isinstance(groups, int)
        and not isinstance(groups, bool)
    )


class _Wrapper:
    """What one install put in place (a wrapper pair shares it): ``live``
    until uninstalled or installed over (a wrapper that is not live calls
    what it wraps, so a chain of patches never runs the guard twice)."""

    def __init__(self) -> None:
        self.live = True


def _make_wrappers(orig, orig_t, record: _Wrapper):
    @functools.wraps(orig)
    def conv3d_with_fallback(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        mode = _installed["mode"]
        if not record.live or mode is None or not _operands_ok(input, weight, bias, groups):
            return orig(input, weight, bias, stride, padding, dilation, groups)
        s, d = _triple_or_none(stride), _triple_or_none(dilation)
        if isinstance(padding, str):
            p = None
            if padding == "valid":
                p = [0, 0, 0]
            elif padding == "same" and s == [1, 1, 1] and d is not None:
                # torch's own "same": the symmetric part as padding, the
                # odd remainder as an explicit pad on the high side.
                p, pad = [], []
                for k, dd in zip(weight.shape[2:], d):
                    total = dd * (k - 1)
                    p.append(total // 2)
                    pad.append(total - 2 * (total // 2))
                if any(pad):
                    input = torch.nn.functional.pad(input, [0, pad[2], 0, pad[1], 0, pad[0]])
        else:
            p = _triple_or_none(padding)
        if s is None or p is None or d is None:
            return orig(input, weight, bias, stride, padding, dilation, groups)
        unbatched = input.dim() == 4
        x = input.unsqueeze(0) if unbatched else input
        out = guarded_conv(x, weight, bias, s, p, d, False, [0, 0, 0], groups, mode)
        return out.squeeze(0) if unbatched else out

    @functools.wraps(orig_t)
    def conv_transpose3d_with_fallback(
        input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1
    ):
        mode = _installed["mode"]
        if not record.live or mode is None or not _operands_ok(input, weight, bias, groups):
            return orig_t(input, weight, bias, stride, padding, output_padding, groups, dilation)
        s, p, op, d = (_triple_or_none(v) for v in (stride, padding, output_padding, dilation))
        if s is None or p is None or op is None or d is None:
            return orig_t(input, weight, bias, stride, padding, output_padding, groups, dilation)
        unbatched = input.dim() == 4
        x = input.unsqueeze(0) if unbatched else input
        out = guarded_conv(x, weight, bias, s, p, d, True, op, groups, mode)
        return out.squeeze(0) if unbatched else out

    for f, name in ((conv3d_with_fallback, "conv3d"), (conv_transpose3d_with_fallback, "conv_transpose3d")):
        f.__rocm_safe_fallback__ = True  # type: ignore[attr-defined]
        # Pickled by reference as torch.nn.functional's (functools.partial of
        # F.conv3d pickles; it loads as whatever is there then).
        f.__module__ = "torch.nn.functional"
        f.__qualname__ = name
        f.__name__ = name
    return conv3d_with_fallback, conv_transpose3d_with_fallback


def _script_builtin(fn, aten_name: Optional[str]) -> None:
    """TorchScript compiles a call of ``fn`` as ``aten_name`` (``None``:
    forgets ``fn``). The table is filled before, so torch's own functions
    keep their entries whatever is installed when it is first built."""
    from torch.jit import _builtins

    table = _builtins._get_builtin_table()
    if aten_name is None:
        table.pop(id(fn), None)
    else:
        _builtins._register_builtin(fn, aten_name)


def install_conv3d_fallback(mode: str = "fallback") -> None:
    """Puts rocm-safe's conv3d chain (:func:`conv3d` and
    :func:`conv_transpose3d`: every result checked on the device, their
    gradients too) behind ``torch.nn.functional.conv3d`` and
    ``torch.nn.functional.conv_transpose3d`` (and so ``nn.Conv3d`` and
    ``nn.ConvTranspose3d``), forward and backward. ``mode``:

    - ``"fallback"`` (the default): torch's conv runs first; when it
      raises, or returns NaN/Inf from finite inputs, the call is served by
      the chain. The same for its backward (``aten::convolution_backward``):
      a raise or NaN/Inf gradients from finite operands are served by the
      chain's backward ops. Use it where torch's path works and you want a
      safety net against crashes and NaNs.
    - ``"verify"``: as ``"fallback"``, and torch's finite output is also
      checked on the device at the chain's sampled points against an f64
      recomputation: on a GPU every guarded conv3d call, queued behind
      torch's kernel with no wait (below); elsewhere, where each check
      waits for one small read-back, the first two calls of each call
      signature (shapes, dtype, parameters, device), then one in sixteen.
      Gradients on the same schedule: the input gradient at sampled
      points, the weight gradient at sampled entries and the bias gradient
      against f64 sums. A float32 output on a GPU where torch allows TF32
      is held to TF32's precision (``2e-3`` of each point's ``sum |x *
      w|``); float16 (autocast) to ``4e-3``; bfloat16 to the chain's bf16
      tolerance. A mismatch (a silently wrong finite result, as vendor
      libraries have given in bf16) sends the call to the chain, is
      counted (``mismatches``) and reported (``last_mismatch``, and a
      ``RuntimeWarning``). Only calls whose values were compared count as
      ``verified``; the others say why in ``unchecked`` /
      ``could_not_check``.
    - ``"replace"``: every call the chain can take goes to the chain,
      without calling torch, forward and backward. Use it where torch's
      path is broken or slow (a MIOpen search that hangs, a generic
      ConvTranspose3d path that takes hours, a backward pass that fails).

    Where it runs: the wrappers call the ``rocm_safe::conv3d_guarded``
    operator, whose eager kernel makes torch's call and the checks, so the
    same guard runs in eager mode, inside ``torch.compile``'d graphs (one
    opaque node: no graph break), under ``torch.autocast`` (the operator
    is called in the dtype autocast chose: bf16, fp16), in both kinds of
    gradient checkpointing (the same tensors are saved whichever path
    served), in ``torch.jit.trace`` (the trace records the operator) and
    under ``torch.func`` (``grad``, ``vmap``). ``torch.jit.script`` compiles
    ``F.conv3d`` as torch's own ``aten::conv3d``: scripted code is not
    guarded. Compiled graphs and traces keep the mode they were made
    with; ``torch.compile`` recompiles when the mode changes.

    float16 calls (autocast's fp16) are served by the chain in float32
    (exact widening) and rounded back; float64 and other dtypes are served
    by torch, counted as unchecked (``unchecked["dtype ..."]``).

    On a GPU, ``"fallback"`` and ``"verify"`` guard torch's conv3d
    output without waiting for it: the NaN/Inf count (and in ``"verify"``
    the sampled points, every call) run on the device after torch's
    kernel, the device decides, and rocm-safe's tiled kernel rewrites a
    wrong output in place behind that decision. The host learns the
    verdicts later, at the latest 64 guarded calls on, or at
    :func:`conv3d_stats` (which waits for them). Calls it cannot guard
    take the synchronous path: CPU tensors, non-contiguous outputs,
    float16, calls the tiled kernel cannot take (more than 1024 kernel
    taps), and ``conv_transpose3d``. A repair that fails its own check is
    counted (``repair_failed``) and warned about.

    In every mode a call signature (function, shapes, dtype, device,
    parameters) whose torch call failed is remembered and sent straight to
    the chain afterwards (its backward apart).

    Idempotent; installing again with another mode switches the mode.
    Installing after someone replaced ours wraps theirs, and the wrapper
    theirs may call passes through, so the guard runs once per call.
    :func:`uninstall_conv3d_fallback` puts back exactly the functions that
    were there.

    Errors: ``ValueError`` for an unknown mode; ``RuntimeError`` on a torch
    older than 2.4 (no ``torch.library.custom_op``).
    """
    if mode not in _MODES:
        raise ValueError(f"install_conv3d_fallback: mode must be one of {_MODES}, not {mode!r}")
    if _OPS_ERROR is not None:
        raise RuntimeError(f"install_conv3d_fallback: {_OPS_ERROR}")
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

        orig, orig_t = original("conv3d"), original("conv_transpose3d")
        _retire()
        record = _Wrapper()
        wrapper, wrapper_t = _make_wrappers(orig, orig_t, record)
        _script_builtin(wrapper, "aten::conv3d")
        _script_builtin(wrapper_t, "aten::conv_transpose3d")
        _installed.update(conv3d=(orig, wrapper), conv_transpose3d=(orig_t, wrapper_t), mode=mode, record=record)
        F.conv3d = wrapper
        F.conv_transpose3d = wrapper_t


def _retire() -> None:
    """The current wrappers stop guarding (a patch above them that still
    calls one gets what it wraps) and leave TorchScript's table."""
    record = _installed.get("record")
    if record is not None:
        record.live = False
        for name in _WRAPPED:
            if _installed[name] is not None:
                _script_builtin(_installed[name][1], None)


def uninstall_conv3d_fallback() -> None:
    """Puts back the ``torch.nn.functional.conv3d`` and
    ``conv_transpose3d`` that :func:`install_conv3d_fallback` replaced
    (no-op when not installed) and forgets the remembered failing call
    signatures. Raises ``RuntimeError`` when someone replaced one of them
    again since: nothing is restored then, their functions are left in
    place. Compiled graphs and traces made while installed still call the
    guarded operator (with the mode they were made with)."""
    F = torch.nn.functional
    with _lock:
        if _installed["conv3d"] is None:
            return
        _harvest()
        for name in _WRAPPED:
            _orig, wrapper = _installed[name]
            if getattr(F, name) is not wrapper:
                raise RuntimeError(
                    f"torch.nn.functional.{name} was replaced after install_conv3d_fallback(); not restoring over it"
                )
        _retire()
        for name in _WRAPPED:
            setattr(F, name, _installed[name][0])
            _installed[name] = None
        _installed["mode"] = None
        _installed["record"] = None
        _failed_signatures.clear()
        _verify_seen.clear()


def conv3d_stats() -> Dict[str, Any]:
    """Statistics since the start (or :func:`reset_conv3d_stats`), after
    collecting the verdicts of guarded calls still in flight (a wait for
    the GPU work queued before them):

    - ``"tiers"``: per tier name (``cudnn``/``miopen``/``vendor``, ``tiled``,
      ``naive``, ``cpu``): ``served``, ``failed`` (``errors`` +
      ``non_finite`` + ``mismatches``), ``skipped``, ``attempts``,
      ``errors``, ``non_finite``, ``mismatches``, ``seconds``; over every
      call through the chain, the fallback's included.
    - the installed fallback's ``mode`` (or ``None``), and its calls of
      the guarded operator (forward): ``calls`` (``transpose_calls`` of
      them ``conv_transpose3d``), each with one outcome, so that ``calls
      == direct + fell_back + checked + raised + sum(unchecked.values()) +
      sum(could_not_check.values())``:

      - ``direct``: served by the chain without calling torch (every call
        in ``"replace"``, remembered signatures in the others);
      - ``fell_back``: torch failed and the chain (or the GPU repair)
        served: ``fell_back_on_error``, ``fell_back_on_non_finite``,
        ``fell_back_on_mismatch``;
      - ``checked``: torch's output passed the mode's check (``"fallback"``:
        the NaN/Inf scan; ``"verify"``: the scan and the sampled values);
      - ``unchecked``: torch's output served without the mode's check,
        reason -> calls (a dtype the chain cannot serve, NaN/Inf inputs,
        ``"verify"`` between spot checks, parameters the chain refuses);
      - ``could_not_check``: ``"verify"`` tried and the check could not
        run, reason -> calls;
      - ``raised``: an error reached the caller (``chain_failed``: the
        chain failed too).

      Also ``verified`` (calls whose values were compared: a mismatch
      included), ``verify_skipped``, ``mismatches``, ``last_mismatch``,
      ``remembered`` (signatures whose torch call failed), ``guarded``
      (GPU calls checked on the device with no wait; their verdicts land
      in ``checked`` or ``fell_back``), ``repaired``, ``repair_failed``,
      ``unguarded`` (why conv3d calls were checked synchronously).
    - the backward operator's (one call per conv whose gradients were
      computed): ``backward_calls == backward_direct + backward_fell_back
      + backward_checked + backward_raised +
      sum(backward_unchecked.values()) +
      sum(backward_could_not_check.values())``, with ``backward_verified``
      and ``backward_mismatches``; ``backward_served``: those the chain
      served (``backward_direct + backward_fell_back``).
    """
    _harvest()
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
    out["unguarded"] = dict(_unguarded)
    out["unchecked"] = dict(_unchecked)
    out["could_not_check"] = dict(_could_not_check)
    out["backward_unchecked"] = dict(_backward_unchecked)
    out["backward_could_not_check"] = dict(_backward_could_not_check)
    out["backward_served"] = _counts["backward_direct"] + _counts["backward_fell_back"]
    out["remembered"] = len(_failed_signatures)
    return out


def reset_conv3d_stats() -> None:
    """Starts :func:`conv3d_stats` from zero (after collecting the verdicts
    of guarded calls still in flight, which count before it)."""
    _harvest()
    _baseline.clear()
    for row in _native.conv3d_stats():
        _baseline[row[0]] = tuple(row[1:])
    _zero_counts()


def _inject_conv3d_failures(kinds: Sequence[str]) -> List[str]:
    """Test-only: from now on, runs of these tier kinds (``"vendor"``,
    ``"tiled"``, ``"naive"``, ``"cpu"``) fail with an injected error, so
    the next tier serves (``[]`` stops it); returns the previous list. The
    environment variable ``ROCM_SAFE_CONV3D_FAIL=vendor,tiled`` sets it at
    start-up. Only in a build with the ``testing`` feature (the package's
    test runs: ``maturin build --features testing``); a release wheel
    raises ``RuntimeError``."""
    hook = getattr(_native, "inject_conv3d_failures", None)
    if hook is None:
        raise RuntimeError(
            "this build of rocm_safe has no test hooks: build it with "
            "`--features testing` to inject conv3d failures"
        )
    return list(hook(list(kinds)))


from ._panic import guard_names as _guard_names  # noqa: E402

_guard_names(globals(), __all__)
