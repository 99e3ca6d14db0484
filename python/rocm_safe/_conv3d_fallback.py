"""The conv3d fallback: :func:`install_conv3d_fallback` puts rocm-safe's
conv3d chain (``_conv3d.py``) behind ``torch.nn.functional.conv3d`` and
``conv_transpose3d``; :func:`conv3d_stats` counts what it did.

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
    _CHAIN_DTYPES,
    _backend,
    _device_and_stream,
    _needs_grad,
    _padding,
    _triple,
    conv3d,
    conv_transpose3d,
)

__all__ = [
    "install_conv3d_fallback",
    "uninstall_conv3d_fallback",
    "conv3d_stats",
    "reset_conv3d_stats",
]

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
# Guarded calls (torch's output checked on the GPU with no wait, repaired
# there behind a device-side gate): (device, ticket) -> (signature, kind),
# until their records come back; the devices that have a guard.
_pending: Dict[Tuple[str, int], Tuple[Tuple, str]] = {}
_guard_devices: Set[str] = set()
# Why conv3d calls were not guarded (checked synchronously instead).
_unguarded: Dict[str, int] = {}

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
        guarded=0,
        repaired=0,
        repair_failed=0,
    )
    _last_mismatch[0] = None
    _unguarded.clear()


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


def _signature(kind, input, weight, bias, *params) -> Tuple:
    """What identifies a call for the memory of failed torch calls: the
    function, shapes, dtype, device and parameters (never the values)."""
    # (torch.Size is a tuple; dtypes and devices compare and hash by value:
    # the same partition of calls as their strings, made faster.)
    return (
        kind,
        tuple(input.shape),
        tuple(weight.shape),
        None if bias is None else tuple(bias.shape),
        input.dtype,
        input.device,
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


def _unguardable(out, input, weight, bias) -> Optional[str]:
    """Why torch's conv3d output cannot be guarded on the device (checked
    and repaired there with no wait), or ``None``: it must be a GPU output
    of the input's dtype, with no gradients to keep (a repaired output
    would keep torch's backward), and a compact output (the repair writes
    it in place; operands that are not compact are copied for the guard)."""
    if out.device.type != "cuda" or out.device != input.device:
        return "not on a GPU"
    if out.dtype != input.dtype or weight.dtype != input.dtype:
        return "mixed dtypes"
    if _needs_grad(input, weight, bias):
        return "needs gradients"
    if not out.is_contiguous():
        return "output not contiguous"
    return None


# The guarded path runs on every conv3d call: what it can compute once is
# kept here. The parameters as the native call takes them, by (stride,
# padding, dilation, kernel size) when those are hashable (bounded: cleared
# when full); the runtime's name; torch's DLPack export.
_guard_params: Dict[Tuple, Tuple] = {}
_GUARD_PARAMS_MAX = 1024
_guard_backend: List[Optional[str]] = [None]
_to_dlpack = torch.utils.dlpack.to_dlpack


def _plain(v) -> bool:
    """Whether a parameter is an int, a string or a tuple of ints (a key
    that hashes and compares by value)."""
    t = type(v)
    return t is int or t is str or (t is tuple and all(type(e) is int for e in v))


def _guard_params_of(weight, stride, padding, dilation) -> Tuple:
    """``(stride, padding, dilation)`` as triples (``TypeError`` /
    ``ValueError`` as ``_triple`` and ``_padding`` raise them)."""
    key = None
    if all(_plain(v) for v in (stride, padding, dilation)):
        key = (stride, padding, dilation, tuple(weight.shape[2:]))
        hit = _guard_params.get(key)
        if hit is not None:
            return hit
    stride_t = _triple(stride, "stride")
    dilation_t = _triple(dilation, "dilation")
    padding_t = _padding(padding, weight, stride_t, dilation_t)
    triples = (stride_t, padding_t, dilation_t)
    if key is not None:
        if len(_guard_params) >= _GUARD_PARAMS_MAX:
            _guard_params.clear()
        _guard_params[key] = triples
    return triples


def _pack(t: torch.Tensor):
    """``t``'s DLPack capsule (``to_dlpack`` refuses tensors that require
    gradients: their detached alias then, the same memory)."""
    return _to_dlpack(t.detach() if t.requires_grad else t)


def _guard(out, args, sig, verify: bool) -> Optional[str]:
    """Queues the guard of torch's conv3d output ``out`` on torch's stream
    (the NaN/Inf count, with ``verify`` the sampled f64 points, and the
    tiled kernel's repair behind the device's verdict): ``None``, or why it
    could not be queued (the caller checks synchronously then)."""
    input, weight, bias, stride, padding, dilation, groups = args
    try:
        stride_t, padding_t, dilation_t = _guard_params_of(weight, stride, padding, dilation)
    except (TypeError, ValueError):
        return "parameters"
    # Operands that are not compact (a permuted view, say: diffusers' Wan
    # VAE feeds its 1x1x1 shortcut one) are copied for the guard rather than
    # checked with a host wait. The copies come from torch's allocator on
    # this stream: when they are freed here, a later user of their memory
    # on the stream runs after the guard's kernels.
    if not input.is_contiguous():
        input = input.contiguous()
    if not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    x, y = input, out
    if x.dim() == 4:
        x, y = x.unsqueeze(0), y.unsqueeze(0)
    dev, stream = _device_and_stream(x.device)
    backend = _guard_backend[0]
    if backend is None:
        backend = _guard_backend[0] = _backend()
    try:
        ticket, records = _native.conv3d_guard(
            dev,
            stream,
            _pack(x),
            _pack(weight),
            None if bias is None else _pack(bias),
            _pack(y),
            stride_t,
            padding_t,
            dilation_t,
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
    _counts["guarded"] += 1
    if verify:
        _counts["verified"] += 1
    return None


def _take_records(dev: str, records) -> None:
    """Counts and reports the verdicts of guarded calls that came back."""
    for ticket, failed, non_finite, operands_finite, problem, repaired, repair_failed, repair_problem in records:
        info = _pending.pop((dev, ticket), None)
        if info is None:
            continue
        sig, kind = info
        if repaired:
            _counts["repaired"] += 1
        if failed:
            _failed_signatures.add(sig)
            _counts["fell_back"] += 1
            if non_finite and operands_finite:
                _counts["fell_back_on_non_finite"] += 1
            else:
                _counts["fell_back_on_mismatch"] += 1
                _counts["mismatches"] += 1
                _last_mismatch[0] = problem
                warnings.warn(
                    f"rocm_safe: torch's {kind} returned wrong values ({problem}); the"
                    " output was rewritten by rocm-safe's tiled kernel on the GPU, and"
                    " later calls of its signature go to the chain",
                    RuntimeWarning,
                    stacklevel=3,
                )
        if repair_failed:
            _counts["repair_failed"] += 1
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
    if kind == "conv3d":
        # "verify" checks every guarded call: a verdict comes back later, so
        # a signature found wrong is remembered only then, and a spot-check
        # schedule would let the calls in between through unchecked.
        why = _unguardable(out, input, weight, bias) or _guard(out, args, sig, current == "verify")
        if why is None:
            return out
        _unguarded[why] = _unguarded.get(why, 0) + 1
    # "verify", synchronously: spot checks of torch's output, the first
    # calls of each signature, then one in _VERIFY_EVERY.
    check_now = None
    if current == "verify":
        seen = _verify_seen.get(sig, 0)
        _verify_seen[sig] = seen + 1
        check_now = seen < _VERIFY_FIRST or seen % _VERIFY_EVERY == 0
    if not _all_finite(out):
        if not _finite(input, weight, bias):
            return out  # NaN/Inf in, NaN/Inf out: no failure
        _failed_signatures.add(sig)
        return to_chain(None, "fell_back_on_non_finite")
    if current == "verify":
        # (Each synchronous check waits for the output; checking every call
        # would cost far more than the conv.)
        if not check_now:
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
      read of each output (``aminmax``) and a wait for it. Use it where torch's path works
      and you want a safety net against crashes and NaNs. A call that
      torch serves keeps torch's gradients; one the chain serves gets the
      chain's (its backward ops, checked).
    - ``"verify"``: as ``"fallback"``, and torch's finite output is also
      spot-checked on the device at the chain's sampled points against an
      f64 recomputation: on a GPU every guarded call, queued behind
      torch's kernel with no wait (below); elsewhere, where each check
      waits for one small read-back, the first two calls of each call
      signature (shapes, dtype, parameters, device), then one in sixteen,
      so the checks cost a few percent of the conv once a model's
      signatures are known. A float32 output on a GPU where
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

    On a GPU, ``"fallback"`` and ``"verify"`` guard torch's conv3d
    output without waiting for it: the NaN/Inf count (and in ``"verify"``
    the sampled points, every call) run on the device after torch's
    kernel, the device decides, and rocm-safe's tiled kernel rewrites a
    wrong output in place behind that decision (a kernel that reads a flag
    and returns at once when it is clear). The host learns the verdicts
    later, at the latest 64 guarded calls on, or at :func:`conv3d_stats`
    (which waits for them): the counts, the ``RuntimeWarning`` and the
    memory of failed signatures come then. This is how the checks cost a
    few percent of the conv instead of a stall per call. Calls it cannot
    guard take the synchronous path described above: CPU tensors, inputs
    that need gradients (torch's backward must stay consistent with the
    output, so a failure there is served by the chain, gradients
    included), non-contiguous tensors, mixed dtypes (autocast), calls the
    tiled kernel cannot take (more than 1024 kernel taps), and
    ``conv_transpose3d``. A repair that fails its own check is counted
    (``repair_failed``) and warned about: that output is wrong, and the
    signature goes to the whole chain from then on.

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
        _harvest()
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
    """Statistics since the start (or :func:`reset_conv3d_stats`), after
    collecting the verdicts of guarded calls still in flight (a wait for
    the GPU work queued before them):

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
      ``guarded`` (GPU calls checked on the device with no wait; in
      ``"verify"`` each is in ``verified`` too), ``repaired`` (of those,
      rewritten by the tiled kernel), ``repair_failed`` (a repair that
      failed its own check: that output was wrong), ``unguarded`` (why
      conv3d calls were checked synchronously instead: reason -> count),
      ``chain_failed`` (the chain failed too: its or torch's error was
      raised).
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
