"""Verified moves of the tensors a trainer already holds: batches to the
GPU (:func:`to_device`), latents back to the CPU (:func:`to_cpu`), casts
on the GPU (:func:`cast`), models to the GPU (:func:`module_to`), and the
DataLoaders that deliver batches (:class:`VerifiedLoader`,
:func:`verify_dataloader`).

Each move is checked by a path independent of the copy (the crate's
``rocm_safe::moves``): an upload by the host's fingerprint of the staged
bytes against the device's fingerprint of what landed; a download by the
device's fingerprint taken before the copy against the host's of what
arrived; a widening cast (bf16/f16/fp8 -> f32) element by element on the
device; a narrowing cast at sampled elements against the CPU. A failure
goes down a ladder (smaller pieces, the pageable path, and for uploads
keeping the tensor on the host), so wrong data is never returned;
:func:`last_move_report` says what served and what was caught.

Re-exported by :mod:`rocm_safe.torch`, where users find them.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from collections.abc import Mapping
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from . import _native
from ._conv3d import _backend, _device_and_stream
from ._dtypes import safetensors_name
from ._panic import guard

__all__ = [
    "to_device",
    "to_cpu",
    "cast",
    "module_to",
    "last_move_report",
    "VerifiedLoader",
    "verify_dataloader",
]

# Tensors of at most this many bytes travel packed: one staging copy, one
# copy to the device and one check for all of them (a batch: its latents
# and embeddings too; a model's parameters: only the small ones, so that
# each large one keeps an allocation of its own).
_PACK_BYTES = 16 << 20
_MODULE_PACK_BYTES = 1 << 20
# At most this many bytes in one packed span.
_GROUP_BYTES = 64 << 20
# Each packed tensor starts at a multiple of this (any dtype's alignment).
_ALIGN = 256

_state = threading.local()
# Tests: "cpu" targets run the whole verified path over the host backend
# (whose "device memory" is host memory), as a GPU would.
_host_as_device = [False]


@contextlib.contextmanager
def _verified_cpu_moves():
    """Test hook: inside, moves to and from ``"cpu"`` run the verified
    path over rocm-safe's host backend (a real copy, checked, with the
    ladder and the injected faults) instead of returning CPU tensors as
    they are."""
    _host_as_device[0] = True
    try:
        yield
    finally:
        _host_as_device[0] = False


class MoveReport:
    """What one call of :func:`to_device`, :func:`to_cpu`, :func:`cast` or
    :func:`module_to` did. ``str(report)`` is a summary; ``to_dict()`` (or
    ``report["key"]``) gives ``op``, ``device``, ``tensors``, ``bytes``,
    ``seconds``, ``gb_per_s``, ``moves`` (one dict per native move:
    ``kind``, ``bytes``, ``pieces``, ``rung``, ``check``, ``attempts``,
    ``seconds``), ``caught`` (every failure a rung met, served by the next),
    ``kept_on_host`` (tensors an upload could not place, by position) and
    ``unchecked`` (what was moved by torch without a check, and why)."""

    def __init__(self, op: str, device: str) -> None:
        self._d: Dict[str, Any] = {
            "op": op,
            "device": device,
            "tensors": 0,
            "bytes": 0,
            "seconds": 0.0,
            "gb_per_s": 0.0,
            "moves": [],
            "caught": [],
            "kept_on_host": [],
            "unchecked": [],
        }

    def _add(self, native: Dict[str, Any]) -> None:
        self._d["moves"].append(native)
        self._d["caught"].extend(f"{rung}: {why}" for rung, why in native["attempts"])

    def _finish(self, tensors: int, nbytes: int, seconds: float) -> None:
        self._d["tensors"] = tensors
        self._d["bytes"] = nbytes
        self._d["seconds"] = seconds
        self._d["gb_per_s"] = nbytes / seconds / 1e9 if seconds > 0 else 0.0

    def to_dict(self) -> Dict[str, Any]:
        return dict(self._d)

    def __getitem__(self, key: str) -> Any:
        return self._d[key]

    def __str__(self) -> str:
        d = self._d
        rungs: Dict[str, int] = {}
        for m in d["moves"]:
            rungs[m["rung"]] = rungs.get(m["rung"], 0) + 1
        by_rung = ", ".join(f"{k} x{v}" for k, v in rungs.items()) or "no device move"
        lines = [
            f"{d['op']} to {d['device']}: {d['tensors']} tensors, {d['bytes']} bytes in "
            f"{d['seconds'] * 1e3:.3f} ms ({d['gb_per_s']:.2f} GB/s); {len(d['moves'])} "
            f"checked moves ({by_rung})"
        ]
        lines += [f"  caught: {c}" for c in d["caught"]]
        lines += [f"  kept on host: {k}" for k in d["kept_on_host"]]
        lines += [f"  unchecked: {u}" for u in d["unchecked"]]
        return "\n".join(lines)

    __repr__ = __str__


def last_move_report() -> Optional[MoveReport]:
    """The report of this thread's last move (``None`` before one)."""
    return getattr(_state, "report", None)


# --------------------------------------------------------------------------
# walking a batch


def _walk(obj: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``obj`` with every tensor leaf replaced by ``fn(leaf)``: tensors,
    and any nesting of Mapping, list, tuple and namedtuple (as
    Accelerate's ``send_to_device`` walks a batch); other leaves as they
    are."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # namedtuple
        return type(obj)(*(_walk(v, fn) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(_walk(v, fn) for v in obj)
    if isinstance(obj, Mapping):
        items = {k: _walk(v, fn) for k, v in obj.items()}
        try:
            return type(obj)(items)
        except TypeError:
            return items
    return obj


def _tensors(obj: Any) -> List[torch.Tensor]:
    """The distinct tensor leaves of ``obj`` (the same object once)."""
    seen: Dict[int, torch.Tensor] = {}

    def visit(t: torch.Tensor) -> torch.Tensor:
        seen.setdefault(id(t), t)
        return t

    _walk(obj, visit)
    return list(seen.values())


def _target_dtype(t: torch.Tensor, dtype: Optional[torch.dtype]) -> torch.dtype:
    """``dtype`` for floating-point tensors, the tensor's own otherwise (as
    ``load_file(dtype=)`` and ``Module.to(dtype)`` do)."""
    if dtype is None or not t.is_floating_point():
        return t.dtype
    return dtype


def _as_dtype(dtype: Any) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    from ._dtypes import torch_dtype

    return torch_dtype(safetensors_name(dtype))


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 tensor (same memory)."""
    return t.reshape(-1).view(torch.uint8)


# Dtypes DLPack carries as they are (the natives view any capsule as bytes);
# others travel as a uint8 view of their bytes.
_DLPACK_DTYPES = frozenset(
    {
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float64,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    }
)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as a capsule takes it: as it is where DLPack
    carries its dtype (the natives read any capsule as bytes), else its
    bytes as uint8."""
    return t if t.dtype in _DLPACK_DTYPES else _bytes_of(t)


def _capsule(t: torch.Tensor):
    return torch.utils.dlpack.to_dlpack(t)


@functools.lru_cache(maxsize=None)
def _st_name(dtype: torch.dtype) -> Optional[str]:
    """The safetensors name of a torch dtype, ``None`` for one without."""
    try:
        return safetensors_name(dtype)
    except ValueError:
        return None


def _native_device(device: torch.device) -> Tuple[str, int]:
    """The native device and stream of a move to or from ``device``."""
    if device.type == "cpu":
        return "cpu", 0
    if device.type != "cuda":
        raise ValueError(
            f"device {device}: rocm_safe moves tensors between the CPU and \"cuda[:N]\" "
            "devices (ROCm and CUDA builds of torch both call them cuda)"
        )
    return _device_and_stream(device)


def _verified_target(device: torch.device) -> bool:
    """Whether a move to or from ``device`` goes through the verified path."""
    return device.type == "cuda" or (device.type == "cpu" and _host_as_device[0])


# --------------------------------------------------------------------------
# uploads


def _upload_group(
    srcs: List[torch.Tensor],
    device: torch.device,
    verify: bool,
    report: MoveReport,
) -> Optional[List[torch.Tensor]]:
    """Uploads contiguous CPU tensors as one packed span; their device
    views (sharing one allocation), or ``None`` when no rung served (the
    report says why)."""
    lens = [t.numel() * t.element_size() for t in srcs]
    offsets, sizes, at = [], [], 0
    for n in lens:
        off = -(-at // _ALIGN) * _ALIGN
        sizes += [off - at, n]
        offsets.append(off)
        at = off + n
    total = max(at, 1)
    sizes.append(total - at)
    land = torch.empty(total, dtype=torch.uint8, device=device)
    if not _native_upload(srcs, offsets, land, verify, report):
        return None
    views = land.split(sizes)[1::2]  # one call for every slice
    return [v.view(t.dtype).view(t.shape) for v, t in zip(views, srcs)]


def _upload_one(
    src: torch.Tensor, device: torch.device, verify: bool, report: MoveReport
) -> Optional[torch.Tensor]:
    out = torch.empty(src.shape, dtype=src.dtype, device=device)
    return out if _native_upload([src], [0], _raw(out), verify, report) else None


def _native_upload(
    srcs: List[torch.Tensor], offsets: List[int], dst: torch.Tensor, verify: bool, report: MoveReport
) -> bool:
    """The checked upload of CPU ``srcs`` into ``dst`` at byte ``offsets``;
    ``False`` (the failure in the report) when no rung served."""
    dev, stream = _native_device(dst.device)
    try:
        r = _native.move_upload(
            dev, stream, [_capsule(_raw(t)) for t in srcs], offsets, _capsule(dst), verify, _backend()
        )
    except RuntimeError as e:
        report._d["caught"].append(str(e))
        return False
    report._add(r)
    return True


def _cast_on_device(
    t: torch.Tensor, dtype: torch.dtype, verify: bool, report: MoveReport
) -> torch.Tensor:
    """``t`` (on a verified device, contiguous) converted to ``dtype``
    through the checked native cast; torch's own conversion, counted as
    unchecked, for a pair the crate does not convert."""
    if t.dtype == dtype:
        return t
    frm, to = _st_name(t.dtype), _st_name(dtype)
    if frm is None or to is None or (frm, to) not in _conversion_pairs():
        report._d["unchecked"].append(f"cast {t.dtype}->{dtype}: no exact conversion in rocm-safe (torch's)")
        return t.to(dtype)
    out = torch.empty(t.shape, dtype=dtype, device=t.device)
    dev, stream = _native_device(t.device)
    src = t.contiguous()
    r = _native.move_cast(
        dev,
        stream,
        _capsule(_raw(src)),
        frm,
        _capsule(_raw(out)),
        to,
        verify,
        _backend(),
    )
    report._add(r)
    return out


_PAIRS: set = set()


def _conversion_pairs() -> set:
    """The ``(from, to)`` pairs rocm-safe converts exactly."""
    if not _PAIRS:
        _PAIRS.update((c[0], c[1]) for c in _native.conversions())
    return _PAIRS


def _now() -> float:
    import time

    return time.perf_counter()


def _upload_all(
    tensors: List[torch.Tensor],
    device: torch.device,
    dtype: Optional[torch.dtype],
    verify: bool,
    report: MoveReport,
    pack_bytes: int = _PACK_BYTES,
) -> Dict[int, torch.Tensor]:
    """Moved versions of CPU ``tensors`` (by id); a tensor no rung could
    place stays the CPU tensor (and is listed in the report)."""
    moved: Dict[int, torch.Tensor] = {}
    groups: List[List[Tuple[torch.Tensor, torch.Tensor]]] = [[]]
    group_bytes = 0
    large: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for t in tensors:
        src = t.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        nbytes = src.numel() * src.element_size()
        if nbytes > pack_bytes:
            large.append((t, src))
            continue
        if group_bytes + nbytes > _GROUP_BYTES and groups[-1]:
            groups.append([])
            group_bytes = 0
        groups[-1].append((t, src))
        group_bytes += nbytes + _ALIGN
    results: List[Tuple[torch.Tensor, Optional[torch.Tensor]]] = []
    for small in groups:
        if not small:
            continue
        got = _upload_group([s for _, s in small], device, verify, report)
        if got is None:
            # The packed span failed every rung: each one on its own.
            results += [(t, _upload_one(s, device, verify, report)) for t, s in small]
        else:
            results += list(zip([t for t, _ in small], got))
    results += [(t, _upload_one(s, device, verify, report)) for t, s in large]
    for i, (t, out) in enumerate(results):
        if out is None:
            report._d["kept_on_host"].append(f"tensor {i}: {tuple(t.shape)} {t.dtype}")
            warnings.warn(
                f"rocm_safe.to_device: a {tuple(t.shape)} {t.dtype} tensor could not be placed on "
                f"{device} by any checked path and stays on the CPU (see last_move_report())",
                RuntimeWarning,
                stacklevel=5,
            )
            moved[id(t)] = t
            continue
        target = _target_dtype(t, dtype)
        moved[id(t)] = _cast_on_device(out, target, verify, report)
    return moved


def to_device(obj: Any, device: Any, *, dtype: Any = None, verify: bool = True) -> Any:
    """``obj`` with its tensors on ``device``, every byte checked.

    ``obj`` is a tensor or any nesting of Mapping, list, tuple and
    namedtuple (a DataLoader batch, as Accelerate's ``send_to_device``
    walks it); the same structure comes back, non-tensor leaves untouched
    and a tensor appearing twice moved once. ``dtype`` converts
    floating-point tensors only (integer and bool tensors keep theirs),
    on the device after the upload, checked.

    CPU tensors of at most 16 MiB travel together (one staging copy, one
    copy and one check for up to 64 MiB of them; they then share one
    device allocation). Each upload is checked (the host's fingerprint of the
    staged bytes against the device's of what landed) and goes down the
    ladder on failure; a tensor that no rung could place stays on the CPU,
    with a ``RuntimeWarning`` and a line in :func:`last_move_report`.
    Tensors already on a GPU are moved by torch (``.to``), counted as
    unchecked. ``verify=False`` copies without the checks.
    """
    return _to_device(obj, device, dtype, verify, _PACK_BYTES)


def _to_device(obj: Any, device: Any, dtype: Any, verify: bool, pack_bytes: int) -> Any:
    """:func:`to_device`, with tensors of at most ``pack_bytes`` packed."""
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(
            f"to_device({dev}): rocm_safe moves tensors between the CPU and \"cuda[:N]\" devices "
            "(ROCm and CUDA builds of torch both call them cuda)"
        )
    dt = _as_dtype(dtype)
    report = MoveReport("to_device", str(dev))
    t0 = _now()
    tensors = _tensors(obj)
    moved: Dict[int, torch.Tensor] = {}
    verified = _verified_target(dev)
    cpu_ones = [t for t in tensors if t.device.type == "cpu" and verified]
    if cpu_ones:
        moved.update(_upload_all(cpu_ones, dev, dt, verify, report, pack_bytes))
    for t in tensors:
        if id(t) in moved:
            continue
        target = _target_dtype(t, dt)
        if t.device == dev:
            moved[id(t)] = _cast_on_device(t, target, verify, report) if _verified_target(dev) else t.to(target)
        else:
            report._d["unchecked"].append(f"{t.device}->{dev}: moved by torch")
            moved[id(t)] = t.to(dev, dtype=target)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    report._finish(len(tensors), nbytes, _now() - t0)
    _state.report = report
    return _walk(obj, lambda t: moved[id(t)])


# --------------------------------------------------------------------------
# downloads and casts


def _download(t: torch.Tensor, dtype: torch.dtype, verify: bool, report: MoveReport) -> torch.Tensor:
    src = t.detach()
    if not src.is_contiguous():
        report._d["unchecked"].append(f"{tuple(t.shape)}: made contiguous on the device by torch")
        src = src.contiguous()
    frm, to = _st_name(src.dtype), _st_name(dtype)
    convert_here = frm is not None and to is not None and (frm == to or (frm, to) in _conversion_pairs())
    out_dtype = dtype if convert_here else src.dtype
    out = torch.empty(src.shape, dtype=out_dtype, device="cpu")
    dev, stream = _native_device(src.device)
    r = _native.move_download(
        dev,
        stream,
        _capsule(_raw(src)),
        frm if convert_here else "U8",
        _capsule(_raw(out)),
        (to if convert_here else "U8"),
        verify,
        _backend(),
    )
    report._add(r)
    if out_dtype != dtype:
        report._d["unchecked"].append(f"{src.dtype}->{dtype}: converted by torch on the CPU")
        out = out.to(dtype)
    return out


def to_cpu(obj: Any, *, dtype: Any = None, verify: bool = True) -> Any:
    """``obj`` (a tensor or a nesting as in :func:`to_device`) with its GPU
    tensors copied to the CPU, every byte checked: the device's
    fingerprint of each tensor, taken before the copy, against the host's
    of what arrived. ``dtype`` converts floating-point tensors exactly on
    the CPU as the bytes arrive (bf16 latents to float32: half the bytes
    cross the bus). A copy that fails its check goes down the ladder;
    when no rung serves, ``RuntimeError`` (nothing wrong is returned).
    CPU tensors are returned as they are (converted when ``dtype`` asks).
    """
    dt = _as_dtype(dtype)
    report = MoveReport("to_cpu", "cpu")
    t0 = _now()
    tensors = _tensors(obj)
    moved: Dict[int, torch.Tensor] = {}
    for t in tensors:
        target = _target_dtype(t, dt)
        if _verified_target(t.device) and (t.device.type != "cpu" or _host_as_device[0]):
            moved[id(t)] = _download(t, target, verify, report)
        elif t.device.type == "cpu":
            moved[id(t)] = t if target == t.dtype else t.to(target)
        else:
            report._d["unchecked"].append(f"{t.device}: moved by torch")
            moved[id(t)] = t.to("cpu", dtype=target)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    report._finish(len(tensors), nbytes, _now() - t0)
    _state.report = report
    return _walk(obj, lambda t: moved[id(t)])


def cast(tensor: torch.Tensor, dtype: Any, *, verify: bool = True) -> torch.Tensor:
    """``tensor`` converted to ``dtype`` on its own device, checked: on a
    GPU a widening (bf16/f16/fp8 -> float32) element by element against
    the exact relation, a narrowing (float32 -> bf16/f16) at sampled
    elements against the CPU; a conversion that fails its check is served
    through the host (verified download, exact CPU conversion, verified
    upload). On the CPU, torch's conversion (exact for these pairs).
    A pair rocm-safe does not convert is torch's, counted as unchecked."""
    dt = _as_dtype(dtype)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"cast: expected a tensor, got {type(tensor).__name__}")
    report = MoveReport("cast", str(tensor.device))
    t0 = _now()
    if _verified_target(tensor.device):
        out = _cast_on_device(tensor.detach().contiguous(), dt, verify, report)
    else:
        out = tensor.to(dt)
    report._finish(1, tensor.numel() * tensor.element_size(), _now() - t0)
    _state.report = report
    return out


# --------------------------------------------------------------------------
# modules


def module_to(module: torch.nn.Module, device: Any = None, dtype: Any = None, *, verify: bool = True):
    """Moves ``module``'s parameters, buffers and gradients to ``device``
    (and floating-point ones to ``dtype``) in place, as ``Module.to``
    does, through the checked path; returns the module. Shared and tied
    tensors are moved once and stay shared. Small tensors (biases, norms)
    travel packed. All or nothing: when any tensor cannot be placed, the
    module is left as it was and ``RuntimeError`` says which."""
    if device is None and dtype is None:
        return module
    dev = torch.device(device) if device is not None else None
    if dev is not None and dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    dt = _as_dtype(dtype)
    tensors: Dict[int, torch.Tensor] = {}
    for m in module.modules():
        for p in m._parameters.values():
            if p is not None:
                tensors.setdefault(id(p), p)
                if p.grad is not None:
                    tensors.setdefault(id(p.grad), p.grad)
        for b in m._buffers.values():
            if b is not None:
                tensors.setdefault(id(b), b)
    items = list(tensors.values())
    data = [t.detach() for t in items]
    report = MoveReport("module_to", str(dev) if dev is not None else "(dtype only)")
    t0 = _now()
    new: Dict[int, torch.Tensor] = {}
    if dev is not None:
        with warnings.catch_warnings():
            # All or nothing: a tensor kept on the host raises below.
            warnings.simplefilter("ignore", RuntimeWarning)
            moved = _to_device(data, dev, dt, verify, _MODULE_PACK_BYTES)
        inner = last_move_report()
        if inner is not None:
            for k in ("moves", "caught", "kept_on_host", "unchecked"):
                report._d[k].extend(inner[k])
        if report["kept_on_host"]:
            raise RuntimeError(
                f"module_to({dev}): {len(report['kept_on_host'])} tensors could not be placed by "
                f"any checked path; the module is unchanged on {items[0].device if items else 'cpu'}. "
                + str(report)
            )
    else:
        moved = [cast(t, _target_dtype(t, dt), verify=verify) for t in data]
    for t, m in zip(items, moved):
        new[id(t)] = m

    def fn(t: torch.Tensor) -> torch.Tensor:
        return new.get(id(t), t)

    module._apply(fn)
    nbytes = sum(t.numel() * t.element_size() for t in data)
    report._finish(len(items), nbytes, _now() - t0)
    _state.report = report
    return module


# --------------------------------------------------------------------------
# where trainers move data


class VerifiedLoader:
    """Wraps a DataLoader (any iterable of batches) and delivers each batch
    on ``device`` through :func:`to_device`, one step ahead as Accelerate
    does: the next batch is fetched from the loader before the current one
    is yielded. ``len()`` and ``set_epoch`` pass through."""

    def __init__(self, loader: Any, device: Any, *, dtype: Any = None, verify: bool = True) -> None:
        self.loader = loader
        self.device = device
        self.dtype = dtype
        self.verify = verify

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.loader, "set_epoch"):
            self.loader.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        try:
            current = next(it)
        except StopIteration:
            return
        while True:
            moved = _guarded_to_device(current, self.device, dtype=self.dtype, verify=self.verify)
            try:
                current = next(it)
            except StopIteration:
                yield moved
                return
            yield moved


def verify_dataloader(dataloader: Any, *, dtype: Any = None, verify: bool = True) -> Any:
    """Makes an Accelerate-prepared DataLoader (``accelerator.prepare``'s
    ``DataLoaderShard``) deliver its batches through :func:`to_device`
    instead of ``send_to_device``; returns it (changed in place: its class
    becomes a subclass whose ``__iter__`` moves each batch, so
    ``isinstance`` checks and ``set_epoch``/``skip`` still work). A plain
    ``torch.utils.data.DataLoader`` has no device: wrap it in
    :class:`VerifiedLoader` instead. ``TypeError`` for Accelerate's
    ``DataLoaderDispatcher`` (``dispatch_batches=True``), whose batches
    arrive on the device through a broadcast."""
    try:
        from accelerate.data_loader import DataLoaderDispatcher, DataLoaderShard
    except ImportError:  # pragma: no cover - accelerate missing
        raise TypeError("verify_dataloader: accelerate is not installed; use VerifiedLoader") from None
    if isinstance(dataloader, DataLoaderDispatcher):
        raise TypeError(
            "verify_dataloader: a DataLoaderDispatcher (dispatch_batches=True) receives its "
            "batches on the device by a broadcast; prepare the loader without dispatch_batches"
        )
    if not isinstance(dataloader, DataLoaderShard):
        raise TypeError(
            f"verify_dataloader: expected an Accelerate-prepared DataLoaderShard, got "
            f"{type(dataloader).__name__} (wrap a plain DataLoader in VerifiedLoader)"
        )
    if getattr(dataloader, "_rocm_safe_verified", False):
        return dataloader
    base = type(dataloader)

    def __iter__(self):
        device = self.device
        self.device = None  # the base class then yields CPU batches
        try:
            for batch in base.__iter__(self):
                yield _guarded_to_device(batch, device, dtype=dtype, verify=verify) if device is not None else batch
        finally:
            self.device = device

    cls = type(f"Verified{base.__name__}", (base,), {"__iter__": __iter__})
    # Accelerate's loaders answer `__class__` with a read-only property
    # (so that isinstance(dl, DataLoader) holds); the object's own type is
    # set through object's descriptor. The new class inherits the property.
    object.__dict__["__class__"].__set__(dataloader, cls)
    dataloader._rocm_safe_verified = True
    return dataloader


# The loaders' batches go through the guarded entry point (a panic of the
# native code becomes InternalError, as for every public function), so
# the class counts as guarded (tests/test_panic.py checks every name of
# rocm_safe.torch.__all__).
_guarded_to_device = guard(to_device)
VerifiedLoader.__rocm_safe_guarded__ = True  # type: ignore[attr-defined]


# --------------------------------------------------------------------------
# tests


def _inject_move_faults(rules: List[Tuple[str, str, int]], seed: int = 0) -> None:
    """Test hook (a ``--features testing`` build only): from now on, moves
    run behind the crate's ``Faults`` backend with ``rules``, a list of
    ``(kind, when, n)`` (kinds: ``small_copy_lost``, ``copy_zeroed_range``,
    ``download_truncated``, ``invalid_value_on_large_copy``,
    ``pinned_refused_sticky``, ``convert_writes_zeros``,
    ``copy_lands_zeros``, ``copy_lands_stale``, ``copy_lands_garbage``,
    ``invalid_value_on_copy``; when: ``always``, ``nth``, ``every``). An
    empty list stops. ``RuntimeError`` in a release build."""
    hook = getattr(_native, "inject_move_faults", None)
    if hook is None:
        raise RuntimeError("this rocm_safe was built without --features testing: no fault injection")
    hook(list(rules), seed)


def _move_faults_injected() -> List[Tuple[str, str, int]]:
    """The faults injected so far (testing builds): ``(kind, op, index)``."""
    hook = getattr(_native, "move_faults_injected", None)
    return [] if hook is None else list(hook())
