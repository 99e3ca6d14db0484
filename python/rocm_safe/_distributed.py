"""Loads on N ranks through ``torch.distributed`` (:func:`load_distributed`,
also ``load_file(..., process_group=pg)``): each byte read from host memory
once, every rank verified.

Modes
-----
``"replicate"``: every rank ends with the whole state dict. The tensors are
shared out among the ranks, balanced by bytes (largest first, each to the
rank with the fewest bytes so far; ties by file order and rank), so each
tensor is read from the file by one rank, its *owner*, with the verified
loader (on a GPU: pinned ring, every piece fingerprinted). The owner
fingerprints what it holds (the crate's position-keyed 64-bit fingerprint,
on the device where the tensor is) and the fingerprints of every tensor go
to every rank with the plan (one ``all_gather_object`` per load). The bytes
then go out from their owner by ``broadcast`` on the process group (NCCL,
RCCL or gloo: torch's transport, never one of ours): large tensors one by
one into their own memory, small ones packed per owner into one buffer and
unpacked into their own tensors (the memory for everything a rank receives
is allocated before the first broadcast, so running out of it is reported
like any failure). Every rank fingerprints every tensor it
received and compares it with the owner's: a corrupted exchange is caught
on the rank that got it.

``"shard"``: tensor parallel. ``shard_plan`` maps tensor names, or
``fnmatch`` patterns (a pattern also matches the parameters of the module it
names: ``"layers.*.q_proj"`` matches ``layers.0.q_proj.weight``), to the
dimension split across the ranks: an ``int``, ``"colwise"`` (dimension 0:
the output features of a ``Linear``, weight and bias; vLLM's
``ColumnParallelLinear``), ``"rowwise"`` (the last dimension of a weight of
two dimensions or more, as vLLM's ``RowParallelLinear``; a 1-D tensor, a
rowwise layer's bias, is replicated), or ``None`` / ``"replicate"``. An
exact name wins over patterns; among patterns, the first that matches (in
the mapping's order). A dimension of size ``d`` is split as
``numpy.array_split`` splits it: the first ``d % N`` ranks get one more.
Each rank reads only its own slice, from its own page cache (dimension 0:
the rows; another dimension: only the runs of bytes of its slice), and a
GPU rank moves it with the verified upload (host fingerprint against the
device's). Tensors the plan does not split are loaded as in
``"replicate"``.

Every rank computes the plan from its own file's header; a digest of it
(names, dtypes, shapes, owners, slices) is compared across ranks before any
byte moves, so ranks whose files differ raise before the exchange.

Failures
--------
The collectives run in the same order on every rank. A rank that fails
(the file cannot be opened or read, the plans differ, a verification
failed) takes part in the next status exchange with its error, and every
rank raises :class:`DistributedLoadError` naming the failing ranks and why;
no rank goes on to a collective the others skip. The status exchanges run
on a gloo group with a timeout (the process group itself when it is gloo,
else a gloo group over the same ranks, made once and kept), so a rank that
died or hangs makes the others raise within ``timeout`` seconds (gloo also
raises at once when a peer's connection closes). The data moves run on the
process group itself: a rank that dies during them leaves the others to
the process group's own timeout (NCCL's watchdog; set ``timeout=`` in
``init_process_group``).

Multi-node: nothing assumes one host. Every rank opens its own copy of the
file (the same path, or its own: ``filename`` may differ per rank when the
files are the same) and reads its share from its own page cache.

Reports: :func:`last_distributed_report` (bytes read and received per
rank, tensors checked, seconds per phase).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import time
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.distributed as dist

from . import _dtypes, _native
from ._conv3d import _backend, _device_and_stream
from ._open import safe_open

__all__ = ["load_distributed", "last_distributed_report", "DistributedLoadError"]

# Tensors below this many bytes travel packed per owner (one broadcast per
# bucket), each unpacked into its own memory; larger ones are broadcast one
# by one straight into their own tensor.
_PACK_BELOW = 4 << 20
# The largest packed bucket.
_BUCKET_BYTES = 64 << 20
# Offsets in a packed bucket are multiples of this (any dtype's alignment).
_ALIGN = 16


class DistributedLoadError(RuntimeError):
    """A distributed load failed on one rank or more; raised on every rank.
    ``failures`` maps each failing rank (of the process group) to its
    error message; ``phase`` is the phase that failed (``"plan"``,
    ``"read"``, ``"alloc"`` (memory for what a rank receives),
    ``"exchange"`` (a collective of the exchange failed), ``"verify"``)."""

    def __init__(self, message: str, phase: str, failures: Optional[Dict[int, str]] = None):
        super().__init__(message)
        self.phase = phase
        self.failures = dict(failures or {})


# ---------------------------------------------------------------- faults

# Test hooks: {kind: group rank}. Kinds: "corrupt_received" (flip a byte
# of the first tensor that rank received, after the exchange, before its
# check), "exit_before_read", "exit_before_exchange" (the process exits
# with status 17 at that point, as a rank that died), "hang_before_read"
# (the rank sleeps for an hour there, as a rank that hangs), "fail_read",
# "fail_alloc" (that phase raises on that rank, as an I/O error or
# running out of memory would). Also read from the
# environment (ROCM_SAFE_DIST_FAULT="kind:rank[,kind:rank]") at each load,
# for processes a launcher starts.
_FAULTS: Dict[str, int] = {}


def _inject_distributed_fault(kind: Optional[str], rank: Optional[int] = None) -> None:
    """Test hook: makes the next loads inject fault ``kind`` on group rank
    ``rank`` (``kind=None`` clears them all)."""
    if kind is None:
        _FAULTS.clear()
        return
    if kind not in (
        "corrupt_received",
        "exit_before_read",
        "exit_before_exchange",
        "hang_before_read",
        "fail_read",
        "fail_alloc",
    ):
        raise ValueError(f"unknown fault {kind!r}")
    _FAULTS[kind] = int(rank if rank is not None else 0)


def _faults() -> Dict[str, int]:
    out = dict(_FAULTS)
    spec = os.environ.get("ROCM_SAFE_DIST_FAULT", "")
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, rank = item.partition(":")
        try:
            out[kind] = int(rank)
        except ValueError:
            raise ValueError(f"ROCM_SAFE_DIST_FAULT: {item!r} is not kind:rank") from None
    return out


def _maybe_exit(faults: Dict[str, int], kind: str, rank: int) -> None:
    if faults.get(kind) == rank:
        os._exit(17)


# ---------------------------------------------------------------- report

_LAST: List[Dict[str, Any]] = []


def last_distributed_report() -> Optional[Dict[str, Any]]:
    """What this process's last distributed load did (``None`` before
    one): ``mode``, ``rank``, ``world_size``, ``tensors``, ``bytes`` (the
    state dict this rank holds), ``read_bytes`` (what this rank read from
    its file), ``received_bytes`` and ``received_tensors`` (what arrived
    from other ranks), ``checked`` (received tensors whose fingerprint
    matched the owner's), ``sharded`` (tensors this rank holds a slice
    of), ``seconds`` per phase (``plan``, ``read``, ``exchange``,
    ``verify``, ``total``), ``device``."""
    return dict(_LAST[-1]) if _LAST else None


# ---------------------------------------------------------------- groups

_CONTROL: Dict[Any, Any] = {}


def _backend_name(pg) -> str:
    try:
        return str(dist.get_backend(pg)).lower()
    except Exception:  # noqa: BLE001 - a group without a single backend name
        return ""


def _control_group(pg, timeout: float):
    """The gloo group the status exchanges run on: ``pg`` itself when it is
    gloo, else a gloo group over ``pg``'s ranks, made once per group (every
    rank of ``pg`` makes it in its first load: the same order everywhere)."""
    if _backend_name(pg) == "gloo":
        return pg
    key = id(pg)
    if key not in _CONTROL:
        ranks = dist.get_process_group_ranks(pg) if pg is not None else list(range(dist.get_world_size()))
        _CONTROL[key] = dist.new_group(
            ranks=ranks, backend="gloo", timeout=timedelta(seconds=timeout), use_local_synchronization=True
        )
    return _CONTROL[key]


def _gather(ctl, obj: Any, phase: str, rank: int) -> List[Any]:
    """``all_gather_object`` on the control group; a failure of the
    collective itself (a rank died, a timeout) is a DistributedLoadError."""
    out: List[Any] = [None] * dist.get_world_size(ctl)
    try:
        dist.all_gather_object(out, obj, group=ctl)
    except Exception as e:  # noqa: BLE001 - whatever the backend raises
        raise DistributedLoadError(
            f"rank {rank}: the {phase} status exchange failed (a rank died, hung past the timeout or left): {e}",
            phase,
        ) from e
    return out


def _check_status(statuses: List[Any], phase: str, rank: int) -> None:
    """Raises on every rank when any rank reported an error."""
    failures = {r: s["error"] for r, s in enumerate(statuses) if s.get("error")}
    if failures:
        lines = "; ".join(f"rank {r}: {m}" for r, m in sorted(failures.items()))
        raise DistributedLoadError(
            f"distributed load failed in {phase} on rank(s) {sorted(failures)} (raised on rank {rank}): {lines}",
            phase,
            failures,
        )


# ---------------------------------------------------------------- plan

def _dim_of(rule: Any, ndim: int, name: str) -> Optional[int]:
    if rule is None or rule == "replicate":
        return None
    if rule == "colwise":
        return 0 if ndim >= 1 else None
    if rule == "rowwise":
        return ndim - 1 if ndim >= 2 else None
    if isinstance(rule, bool) or not isinstance(rule, int):
        raise ValueError(
            f"shard_plan[{name!r}]: {rule!r} is not a dimension"
            " (an int, \"colwise\", \"rowwise\", \"replicate\" or None)"
        )
    d = rule + ndim if rule < 0 else rule
    if not 0 <= d < ndim:
        raise ValueError(f"shard_plan: tensor {name!r} has {ndim} dimension(s): cannot split dimension {rule}")
    return d


def _rule_for(name: str, plan: Dict[str, Any]) -> Tuple[bool, Any]:
    if name in plan:
        return True, plan[name]
    for pattern, rule in plan.items():
        if fnmatch.fnmatchcase(name, pattern) or fnmatch.fnmatchcase(name, pattern + ".*"):
            return True, rule
    return False, None


def _split(d: int, world: int) -> List[Tuple[int, int]]:
    """``numpy.array_split``'s ranges of ``d`` over ``world`` parts."""
    base, extra = divmod(d, world)
    out, at = [], 0
    for r in range(world):
        n = base + (1 if r < extra else 0)
        out.append((at, at + n))
        at += n
    return out


def _make_plan(
    entries: List[Tuple[str, str, List[int], str, int]],
    world: int,
    mode: str,
    shard_plan: Optional[Dict[str, Any]],
) -> Dict[str, Any]:
    """The plan, from the file's tensors ``(name, dtype, shape, out_dtype,
    out_bytes)`` in file order: per tensor its owner (or its split) --
    the same on every rank given the same header, world size and rules."""
    tensors = []
    loads = [0] * world
    replicated = []
    for name, dtype, shape, out_dtype, nbytes in entries:
        dim = None
        if mode == "shard" and shard_plan:
            found, rule = _rule_for(name, shard_plan)
            if found:
                dim = _dim_of(rule, len(shape), name)
        if dim is not None and dtype in _dtypes.SUB_BYTE:
            raise ValueError(f"tensor {name!r}: {dtype} packs several elements per byte; it cannot be sharded")
        t = {
            "name": name,
            "dtype": dtype,
            "shape": list(shape),
            "out_dtype": out_dtype,
            "bytes": nbytes,
            "file_bytes": _dtypes.nbytes(dtype, shape),
        }
        if dim is not None:
            t["dim"] = dim
            t["ranges"] = _split(shape[dim], world)
        else:
            replicated.append(len(tensors))
        tensors.append(t)
    # Owners: largest first to the least-loaded rank (ties: file order,
    # lowest rank).
    for i in sorted(replicated, key=lambda i: (-tensors[i]["bytes"], i)):
        r = min(range(world), key=lambda r: (loads[r], r))
        tensors[i]["owner"] = r
        loads[r] += tensors[i]["bytes"]
    return {"mode": mode, "world": world, "tensors": tensors}


def _digest(plan: Dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


# ---------------------------------------------------------------- devices

def _resolve_device(device: Any, pg) -> torch.device:
    if device is None:
        if _backend_name(pg) in ("nccl", "rccl") and torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    if d.type not in ("cpu", "cuda"):
        raise ValueError(f"device {device!r}: distributed loads go to \"cpu\" or \"cuda[:N]\"")
    return d


def _fingerprints(tensors: Sequence[torch.Tensor], device: torch.device) -> List[int]:
    """The crate's fingerprint of each tensor's bytes, computed where they
    are (the host for CPU tensors, the device on torch's current stream)."""
    if not tensors:
        return []
    dev, stream = _device_and_stream(device)
    caps = [torch.utils.dlpack.to_dlpack(_bytes(t)) for t in tensors]
    return list(_native.tensor_fingerprints(dev, stream, caps, _backend()))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 tensor (same memory)."""
    flat = t.reshape(-1)
    return flat if flat.dtype == torch.uint8 else flat.view(torch.uint8)


def _torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dt


# ---------------------------------------------------------------- reads

def _byte_ranges(f: safe_open) -> Dict[str, Tuple[str, int, int]]:
    """``name -> (file, first byte, end byte)`` (absolute offsets) for
    every tensor, from each file's header, validated by the library."""
    ckpt = f._ckpt
    paths = ckpt.shard_paths() if ckpt.is_sharded() else [ckpt.path]
    out: Dict[str, Tuple[str, int, int]] = {}
    for p in paths:
        p = os.fspath(p)
        size = os.path.getsize(p)
        with open(p, "rb") as fh:
            prefix = fh.read(min(size, 40))
            n = _native.header_len(p, prefix, size)
            fh.seek(0)
            head = fh.read(8 + n)
        tensors, _ = _native.parse_head(p, head, size)
        for name, _dt, _shape, begin, end in tensors:
            out[name] = (p, begin, end)
    return out


def _read_slice(f: safe_open, t: Dict[str, Any], rank: int, where) -> torch.Tensor:
    """This rank's slice of tensor ``t`` on the host, converted to its
    output dtype: dimension 0 through the library's row
    read; another dimension by reading only the runs of bytes of the slice
    (``_native.read_strided``, at the offsets of the validated header)."""
    name, dtype, shape, dim = t["name"], t["dtype"], t["shape"], t["dim"]
    lo, hi = t["ranges"][rank]
    target = t["out_dtype"] if t["out_dtype"] != dtype else None
    if dim == 0:
        buf, out, s = f._ckpt.read(name, to=target, rows=(lo, hi), floats_only=True)
        return f._tensors.from_buffer(buf, out, s)
    size = _dtypes.ITEMSIZE[dtype]
    outer = int(np.prod(shape[:dim], dtype=np.int64))
    inner = int(np.prod(shape[dim + 1 :], dtype=np.int64))
    path, begin, end = where[name]
    row = shape[dim] * inner * size
    raw = _native.read_strided(path, begin, end, outer, row, lo * inner * size, (hi - lo) * inner * size)
    out_shape = list(shape)
    out_shape[dim] = hi - lo
    if target is not None:
        raw = _native.convert_chunk(dtype, bytes(raw), target)
    return f._tensors.from_buffer(raw, target or dtype, out_shape)


def _load_slices(
    f: safe_open, sharded: List[Dict[str, Any]], rank: int, dev: torch.device
) -> Tuple[Dict[str, torch.Tensor], int]:
    """This rank's slice of every split tensor, on ``dev``, and the bytes
    read for them. On a GPU: every slice, of any dimension, through the
    verified loader in one load (``_native.load_slices_to_device``: a later
    dimension's slice is read run by run into the pinned ring, converted
    and checked on the device like a whole tensor); on the CPU, read on
    the host."""
    out: Dict[str, torch.Tensor] = {}
    read = sum(_slice_bytes(t, rank) for t in sharded)
    if dev.type == "cpu":
        where = _byte_ranges(f) if any(t["dim"] != 0 for t in sharded) else {}
        for t in sharded:
            out[t["name"]] = _read_slice(f, t, rank, where)
        return out, read
    asks = []
    for t in sharded:
        lo, hi = t["ranges"][rank]
        asks.append((t["name"], t["dim"], lo, hi))
    loaded = _native.load_slices_to_device(f._ckpt, asks, str(dev), f._dtype, f._verify, _backend())
    for name, capsule in loaded:
        x = torch.from_dlpack(capsule)
        out[name] = x if x.device == dev else x.to(dev)
    by = {t["name"]: t for t in sharded}
    for n, x in out.items():
        want = _dtypes.torch_dtype(by[n]["out_dtype"])
        if x.dtype != want:
            raise RuntimeError(f"tensor {n!r}: its slice loaded as {x.dtype}, not {want}")
    return out, read


def _slice_bytes(t: Dict[str, Any], rank: int) -> int:
    """The bytes of this rank's slice in the file."""
    lo, hi = t["ranges"][rank]
    n = int(np.prod(t["shape"], dtype=np.int64))
    d = t["shape"][t["dim"]]
    return 0 if d == 0 else (n // d) * (hi - lo) * _dtypes.ITEMSIZE[t["dtype"]]


# ---------------------------------------------------------------- the load

def load_distributed(
    filename: Union[str, os.PathLike],
    *,
    process_group: Any = None,
    mode: str = "replicate",
    shard_plan: Optional[Dict[str, Any]] = None,
    device: Any = None,
    dtype: Any = None,
    verify: Any = None,
    timeout: float = 300.0,
) -> Dict[str, torch.Tensor]:
    """Loads a safetensors file (or a sharded checkpoint's index) on every
    rank of ``process_group`` (``None``: the default group): see the
    module's documentation for what each mode does and checks.

    Every rank of the group calls it, with the same ``mode``,
    ``shard_plan`` and ``dtype``, and its own copy of the file (on its own
    host). ``device``: where this rank's tensors go (``"cpu"``,
    ``"cuda:N"``, ``N``; default: torch's current CUDA device on an
    NCCL/RCCL group, else the CPU). ``dtype``: convert float tensors exactly
    to it (as :func:`rocm_safe.torch.load_file`). ``verify``: the GPU
    loader's policy (as ``load_file``). ``timeout``: seconds a status
    exchange waits for the other ranks (when rocm-safe makes the gloo
    control group; a gloo ``process_group`` keeps its own).

    Returns ``{name: tensor}`` in file order: in ``"replicate"`` every
    tensor; in ``"shard"`` this rank's slice of each split tensor (the
    others whole). Raises :class:`DistributedLoadError` on every rank when
    any rank fails; ``ValueError`` (on every rank, before any collective)
    for a bad ``mode`` or ``shard_plan``.
    """
    if mode not in ("replicate", "shard"):
        raise ValueError(f"mode {mode!r}: use \"replicate\" or \"shard\"")
    if shard_plan is not None and not isinstance(shard_plan, dict):
        raise ValueError("shard_plan: a dict of tensor name (or fnmatch pattern) -> dimension")
    if mode == "shard" and shard_plan is None:
        raise ValueError("mode=\"shard\" needs a shard_plan (name or pattern -> dimension)")
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("load_distributed needs torch.distributed initialised (init_process_group)")
    pg = process_group if process_group is not None else dist.group.WORLD
    rank, world = dist.get_rank(pg), dist.get_world_size(pg)
    dev = _resolve_device(device, pg)
    backend = _backend_name(pg)
    if dev.type == "cpu" and "nccl" in backend and "gloo" not in backend:
        raise ValueError(
            f"device {dev}: an NCCL/RCCL process group moves GPU tensors only: pass this rank's GPU"
            " (device=f\"cuda:{local_rank}\"), or use a gloo group for a load to the CPU"
        )
    faults = _faults()
    ctl = _control_group(pg, timeout)
    secs: Dict[str, float] = {}
    t0 = time.perf_counter()

    # ---- plan: every rank from its own header; digests compared.
    f = None
    plan: Optional[Dict[str, Any]] = None
    error = None
    try:
        where = "cpu" if dev.type == "cpu" else str(dev)
        f = safe_open(filename, framework="pt", device=where, dtype=dtype, verify=verify)
        entries = []
        for name in f.offset_keys():
            dt, shape = f._ckpt.describe(name)
            out = f._ckpt.target_dtype(name, f._dtype, True)
            entries.append((name, dt, list(shape), out, _dtypes.nbytes(out, shape)))
        plan = _make_plan(entries, world, mode, shard_plan)
        digest = _digest(plan)
    except Exception as e:  # noqa: BLE001 - reported to every rank
        if f is not None:
            f.close()
        error, digest = f"{type(e).__name__}: {e}", None
    statuses = _gather(ctl, {"error": error, "digest": digest}, "plan", rank)
    _check_status(statuses, "plan", rank)
    digests = {s["digest"] for s in statuses}
    if len(digests) != 1:
        if f is not None:
            f.close()
        by = {r: s["digest"][:12] for r, s in enumerate(statuses)}
        raise DistributedLoadError(
            f"the ranks' plans differ (their files' headers, or their mode/shard_plan/dtype, are not the same): "
            f"plan digests by rank {by}",
            "plan",
            {r: f"plan digest {d}" for r, d in by.items()},
        )
    assert f is not None and plan is not None
    secs["plan"] = time.perf_counter() - t0

    try:
        return _load_planned(f, plan, pg, ctl, rank, world, dev, faults, secs, t0)
    finally:
        f.close()


def _load_planned(f, plan, pg, ctl, rank, world, dev, faults, secs, t0) -> Dict[str, torch.Tensor]:
    tensors = plan["tensors"]
    mine = [t for t in tensors if t.get("owner") == rank]
    sharded = [t for t in tensors if "dim" in t]

    # ---- read: this rank's share (and its slices).
    _maybe_exit(faults, "exit_before_read", rank)
    if faults.get("hang_before_read") == rank:
        time.sleep(3600)
    t1 = time.perf_counter()
    have: Dict[str, torch.Tensor] = {}
    meta: Dict[str, Tuple[str, List[int], int]] = {}
    read_bytes = 0
    error = None
    try:
        if faults.get("fail_read") == rank:
            raise OSError("injected read failure (test hook)")
        names = [t["name"] for t in mine]
        if dev.type == "cpu":
            for n in names:
                have[n] = f.get_tensor(n)
        elif names:
            have.update(f._to_device(names, f._dtype))
        for t in mine:
            read_bytes += t["file_bytes"]
        fps = _fingerprints([have[n] for n in names], dev)
        for n, fp in zip(names, fps):
            x = have[n]
            meta[n] = (str(x.dtype), list(x.shape), fp)
        if sharded:
            slices, n = _load_slices(f, sharded, rank, dev)
            have.update(slices)
            read_bytes += n
    except Exception as e:  # noqa: BLE001 - reported to every rank
        error = f"{type(e).__name__}: {e}"
    statuses = _gather(ctl, {"error": error, "meta": meta if error is None else {}}, "read", rank)
    _check_status(statuses, "read", rank)
    carried: Dict[str, Tuple[str, List[int], int]] = {}
    for s in statuses:
        carried.update(s["meta"])
    secs["read"] = time.perf_counter() - t1

    # ---- alloc: memory for what this rank receives.
    t2 = time.perf_counter()
    error = None
    big: List[str] = []
    small: Dict[int, Any] = {}
    received: List[str] = []
    scratch = None
    try:
        if faults.get("fail_alloc") == rank:
            raise MemoryError("injected allocation failure (test hook)")
        big, small, received, scratch = _allocate(tensors, carried, have, rank, world, dev)
    except Exception as e:  # noqa: BLE001 - reported to every rank
        error = f"{type(e).__name__}: {e}"
    statuses = _gather(ctl, {"error": error}, "alloc", rank)
    _check_status(statuses, "alloc", rank)
    received_bytes = sum(_bytes(have[n]).numel() for n in received)

    # ---- exchange: from each owner by broadcast, in the layout's order.
    _maybe_exit(faults, "exit_before_exchange", rank)
    owner_of = {t["name"]: t["owner"] for t in tensors if "owner" in t}
    try:
        _exchange(big, small, owner_of, have, pg, rank, world, scratch)
    except Exception as e:  # noqa: BLE001 - a failed collective
        raise DistributedLoadError(
            f"rank {rank}: the exchange failed (a rank died or the process group failed): {type(e).__name__}: {e}",
            "exchange",
            {rank: str(e)},
        ) from e
    del scratch
    secs["exchange"] = time.perf_counter() - t2

    # ---- verify: what arrived against the owner's fingerprint.
    t3 = time.perf_counter()
    if faults.get("corrupt_received") == rank:
        for n in received:
            b = _bytes(have[n])
            if b.numel():
                b[0] = b[0] ^ 0xFF
                break
    error = None
    try:
        got = _fingerprints([have[n] for n in received], dev)
        bad = [
            f"{n!r} (fingerprint {g:016x}, owner rank {_owner(tensors, n)} read {carried[n][2]:016x})"
            for n, g in zip(received, got)
            if g != carried[n][2]
        ]
        if bad:
            error = f"{len(bad)} tensor(s) received with bytes other than their owner read: " + ", ".join(bad[:8])
    except Exception as e:  # noqa: BLE001
        error = f"{type(e).__name__}: {e}"
    statuses = _gather(ctl, {"error": error}, "verify", rank)
    _check_status(statuses, "verify", rank)
    secs["verify"] = time.perf_counter() - t3
    secs["total"] = time.perf_counter() - t0

    out = {t["name"]: have[t["name"]] for t in tensors}
    _LAST[:] = [
        {
            "mode": plan["mode"],
            "rank": rank,
            "world_size": world,
            "device": str(dev),
            "tensors": len(out),
            "bytes": sum(x.numel() * x.element_size() for x in out.values()),
            "read_bytes": read_bytes,
            "received_bytes": received_bytes,
            "received_tensors": len(received),
            "checked": len(received),
            "sharded": len(sharded),
            "seconds": secs,
        }
    ]
    return out


def _owner(tensors, name: str) -> int:
    for t in tensors:
        if t["name"] == name:
            return t["owner"]
    return -1


def _layout(tensors, carried, world) -> Tuple[List[str], Dict[int, List[List[Tuple[str, int, int]]]]]:
    """The exchange's layout, the same on every rank: the names broadcast
    one by one (4 MiB or more, in plan order), and per owner its small
    tensors in buckets of ``(name, offset, bytes)`` (at most
    ``_BUCKET_BYTES`` each unless one tensor is larger)."""
    big: List[str] = []
    small: Dict[int, List[List[Tuple[str, int, int]]]] = {}
    if world == 1:
        return big, small
    for t in tensors:
        if "owner" not in t:
            continue
        name, owner = t["name"], t["owner"]
        dt, shape, _fp = carried[name]
        size = _torch_nbytes(dt, shape)
        if size >= _PACK_BELOW:
            big.append(name)
            continue
        buckets = small.setdefault(owner, [[]])
        at = 0
        if buckets[-1]:
            _n, off, n = buckets[-1][-1]
            at = -(-(off + n) // _ALIGN) * _ALIGN
        if buckets[-1] and at + size > _BUCKET_BYTES:
            buckets.append([])
            at = 0
        buckets[-1].append((name, at, size))
    return big, small


def _allocate(tensors, carried, have, rank, world, dev):
    """Memory for everything this rank will receive (so that running out
    of it is reported in a status exchange, not in the middle of the
    collectives), and one scratch buffer for the largest bucket."""
    big, small = _layout(tensors, carried, world)
    owner = {t["name"]: t.get("owner") for t in tensors}
    received: List[str] = []
    for name in big:
        if owner[name] != rank:
            dt, shape, _fp = carried[name]
            have[name] = torch.empty(shape, dtype=_torch_dtype(dt), device=dev)
            received.append(name)
    scratch_bytes = 0
    for o, buckets in small.items():
        for b in buckets:
            if b:
                _n, off, n = b[-1]
                scratch_bytes = max(scratch_bytes, off + n)
            if o != rank:
                for name, _off, _n in b:
                    dt, shape, _fp = carried[name]
                    have[name] = torch.empty(shape, dtype=_torch_dtype(dt), device=dev)
                    received.append(name)
    scratch = torch.empty(max(scratch_bytes, 1), dtype=torch.uint8, device=dev) if small else None
    return big, small, received, scratch


def _exchange(big, small, owner_of, have, pg, rank, world, scratch) -> None:
    """Every replicated tensor from its owner to every rank, in the
    layout's order: the large ones one broadcast each straight into their
    memory, then per owner its buckets of small ones, packed into
    ``scratch``, broadcast, and unpacked into their own memory. Only
    collectives and copies: the memory was allocated before."""

    def src_of(owner: int) -> int:
        return owner if pg is dist.group.WORLD else dist.get_global_rank(pg, owner)

    for name in big:
        o = owner_of[name]
        x = have[name]
        if o == rank and not x.is_contiguous():
            x = have[name] = x.contiguous()
        dist.broadcast(_bytes(x), src=src_of(o), group=pg)
    for o in range(world):
        for bucket in small.get(o, []):
            if not bucket:
                continue
            _n, off, n = bucket[-1]
            flat = scratch[: max(off + n, 1)]
            if o == rank:
                for name, off, n in bucket:
                    if n:
                        flat[off : off + n].copy_(_bytes(have[name].contiguous()))
            dist.broadcast(flat, src=src_of(o), group=pg)
            if o != rank:
                for name, off, n in bucket:
                    if n:
                        _bytes(have[name]).copy_(flat[off : off + n])


def _torch_nbytes(dt: str, shape: List[int]) -> int:
    return int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=_torch_dtype(dt)).element_size()
