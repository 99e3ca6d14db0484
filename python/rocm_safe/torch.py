"""``safetensors.torch``'s API over rocm-safe: switch with one import line::

    # from safetensors.torch import load_file, save_file
    from rocm_safe.torch import load_file, save_file

and, on a GPU build (``--features cuda`` / ``--features hip``)::

    sd = load_file("model.safetensors", device="cuda:0", dtype=torch.float32)
    print(last_load_report())          # which rung served each tensor, GB/s

plus verified moves of the tensors a trainer already holds
(:func:`to_device` for batches, :func:`to_cpu` for latents, :func:`cast`,
:func:`module_to` for models, :class:`VerifiedLoader` and
:func:`verify_dataloader` for DataLoaders; every byte checked, a ladder
on failure, :func:`last_move_report`), and
the conv3d chain (vendor -> tiled -> naive -> CPU, each result
checked) on torch tensors: :func:`conv3d` and :func:`conv_transpose3d`
(both differentiable: their gradients go through the chain's backward
ops, checked the same way), and :func:`install_conv3d_fallback` to serve
``torch.nn.functional.conv3d`` and ``conv_transpose3d`` calls that fail
(or return NaN/Inf from finite inputs, or wrong values) through it.

Imported only when used: ``import rocm_safe`` never imports torch.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

import torch

from . import _dtypes, _native, _save
from ._errors import SafetensorValueError
from ._open import _Tensors, safe_open

# The conv3d chain and the GPU load report live in _conv3d.py, the fallback
# in _conv3d_fallback.py; their names
# are part of this module's API (and the private ones tests use).
from ._conv3d import (  # noqa: F401
    _backend,
    _Conv3dFunction,
    _ConvTranspose3dFunction,
    _device_name,
    conv3d,
    conv_transpose3d,
    last_conv3d_report,
    last_load_report,
    release_memory,
)
from ._moves import (  # noqa: F401
    MoveReport,
    VerifiedLoader,
    _inject_move_faults,
    _move_faults_injected,
    _verified_cpu_moves,
    cast,
    last_move_report,
    module_to,
    to_cpu,
    to_device,
    verify_dataloader,
)
from ._distributed import (  # noqa: F401
    DistributedLoadError,
    _inject_distributed_fault,
    last_distributed_report,
    load_distributed,
)
from ._conv3d_fallback import (  # noqa: F401
    _inject_conv3d_failures,
    conv3d_stats,
    install_conv3d_fallback,
    reset_conv3d_stats,
    uninstall_conv3d_fallback,
)

__all__ = [
    "load",
    "load_file",
    "save",
    "save_file",
    "load_model",
    "save_model",
    "storage_ptr",
    "storage_size",
    "last_load_report",
    "release_memory",
    "conv3d",
    "conv_transpose3d",
    "last_conv3d_report",
    "install_conv3d_fallback",
    "uninstall_conv3d_fallback",
    "conv3d_stats",
    "reset_conv3d_stats",
    "to_device",
    "to_cpu",
    "cast",
    "module_to",
    "last_move_report",
    "VerifiedLoader",
    "verify_dataloader",
    "load_distributed",
    "last_distributed_report",
]


def load_file(
    filename: Union[str, os.PathLike],
    device: Union[str, int, Any] = "cpu",
    *,
    dtype: Any = None,
    verify: Any = None,
    backend: str = "mmap",
    process_group: Any = None,
    mode: str = "replicate",
    shard_plan: Optional[Dict[str, Any]] = None,
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
    checks as a file, as CPU tensors, in file order (data offsets;
    safetensors' order is arbitrary here)."""
    target = _dtypes.conversion_target(dtype)
    tensors, _meta = _native.load_bytes(bytes(data), target)
    wrap = _Tensors("pt")
    return {name: wrap.from_buffer(buf, dt, shape) for name, buf, dt, shape in tensors}


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
            f" when loading them again: {failing}. A potential way to correctly save your model is to use"
            " `save_model` (or clone the tensors)."
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
            raise SafetensorValueError(f"Key `{name}`: dtype {t.dtype} cannot be saved in safetensors") from None
        shape = list(t.shape)
        if dtype == "F4":
            # float4_e2m1fn_x2 holds two F4 values per item: the file
            # records the logical shape, the last dimension doubled.
            if not shape:
                raise SafetensorValueError(
                    f"Key `{name}`: a 0-d float4_e2m1fn_x2 tensor holds two F4 values in no dimension: give it a"
                    " shape (e.g. .reshape(1)) to save it"
                )
            shape[-1] *= 2
        flat = t.detach()
        if flat.device.type != "cpu":
            flat = flat.to("cpu")
        flat = flat.reshape(-1)
        if flat.is_complex():
            flat = torch.view_as_real(flat).reshape(-1)
        raw = flat.view(torch.uint8).numpy()
        items.append((name, dtype, shape, raw))
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
# Models: shared (tied) tensors saved once, as safetensors.torch does


def storage_ptr(tensor: torch.Tensor) -> int:
    """The address of ``tensor``'s storage (0 where it has none: a meta
    tensor), as ``safetensors.torch.storage_ptr``."""
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - no storage (meta, some subclasses)
        return 0


def _end_ptr(tensor: torch.Tensor) -> int:
    """The address one past the last byte of ``tensor``'s last element in
    memory (its ``data_ptr()`` when it is empty), as
    ``safetensors.torch._end_ptr``: for a strided view, the last element
    its strides reach."""
    if not tensor.nelement():
        return tensor.data_ptr()
    size = tensor.element_size()
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + last * size + size


def storage_size(tensor: torch.Tensor) -> int:
    """The size of ``tensor``'s storage in bytes, as
    ``safetensors.torch.storage_size`` (the tensor's own size where the
    storage cannot say)."""
    try:
        return tensor.untyped_storage().nbytes()
    except Exception:  # noqa: BLE001 - no storage (meta, some subclasses)
        return tensor.nelement() * tensor.element_size()


def _is_complete(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` covers its whole storage (first byte to last)."""
    return tensor.data_ptr() == storage_ptr(tensor) and tensor.nelement() * tensor.element_size() == storage_size(
        tensor
    )


def _find_shared_tensors(state_dict: Dict[str, torch.Tensor]) -> List[Set[str]]:
    """The names of ``state_dict`` in groups that share memory: one group
    per run of overlapping tensors of one storage (a tensor alone in its
    storage is a group of one). Meta tensors and empty storages are left
    out. The groups ``safetensors.torch._find_shared_tensors`` makes, except
    that a tensor overlapping any earlier one of its run joins it (safetensors
    compares with the previous tensor only)."""
    by_storage: Dict[Any, List[Tuple[int, int, str]]] = {}
    for name, t in state_dict.items():
        if t.device.type == "meta":
            continue
        ptr, size = storage_ptr(t), storage_size(t)
        if ptr == 0 or size == 0:
            continue
        start = t.data_ptr()
        by_storage.setdefault((t.device, ptr, size), []).append((start, start + t.nelement() * t.element_size(), name))
    groups: List[Set[str]] = []
    for spans in by_storage.values():
        spans.sort()
        current: Set[str] = set()
        end = None
        for s, e, name in spans:
            if end is not None and s < end:
                current.add(name)
                end = max(end, e)
            else:
                if current:
                    groups.append(current)
                current, end = {name}, e
        if current:
            groups.append(current)
    return groups


def _remove_duplicate_names(
    state_dict: Dict[str, torch.Tensor],
    *,
    preferred_names: Optional[Iterable[str]] = None,
    discard_names: Optional[Iterable[str]] = None,
) -> Dict[str, List[str]]:
    """For each group of shared tensors, the name kept -> the names dropped
    (sorted), as ``safetensors.torch._remove_duplicate_names``: the kept
    name covers the whole storage; among those, the first (sorted) of
    ``preferred_names``, else the first not in ``discard_names``, else the
    first. ``RuntimeError`` when no name of a group covers its storage
    (saving it would store more than the tensors)."""
    preferred = set(preferred_names or ())
    discard = set(discard_names or ())
    out: Dict[str, List[str]] = {}
    for group in _find_shared_tensors(state_dict):
        complete = {name for name in group if _is_complete(state_dict[name])}
        if not complete:
            raise RuntimeError(
                f"Error while trying to find names to remove to save state dict: no name among {sorted(group)} covers"
                " the entire storage. Refusing to save/load the model, which could store much more memory than"
                " needed: clone the tensors that are views of a larger one."
            )
        keep = min(complete)
        if complete - discard:
            keep = min(complete - discard)
        if preferred & complete:
            keep = min(preferred & complete)
        dropped = sorted(name for name in group if name != keep)
        if dropped:
            out[keep] = dropped
    return out


def save_model(
    model: torch.nn.Module,
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
    force_contiguous: bool = True,
) -> None:
    """Saves ``model.state_dict()`` to ``filename`` (atomically, as
    :func:`save_file`), as ``safetensors.torch.save_model`` does: of
    tensors that share memory (tied weights) one name is saved (see
    ``_remove_duplicate_names``) and each dropped name is recorded in the
    metadata as ``{dropped: kept}`` (entries the caller gave are kept; the
    caller's dict is not changed). ``force_contiguous``: save
    non-contiguous tensors as contiguous copies (else ``ValueError``)."""
    state_dict = model.state_dict()
    for kept, dropped in _remove_duplicate_names(state_dict).items():
        for name in dropped:
            metadata = dict(metadata or {})  # never the caller's dict
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(
            f"{e} Or use save_model(..., force_contiguous=True), read the docs for potential caveats."
        ) from None


def load_model(
    model: torch.nn.Module,
    filename: Union[str, os.PathLike],
    strict: bool = True,
    device: Union[str, int, Any] = "cpu",
    *,
    backend: str = "mmap",
) -> Tuple[Set[str], List[str]]:
    """Loads ``filename`` (a file or a ``*.safetensors.index.json``) into
    ``model``, as ``safetensors.torch.load_model`` does: the model's shared
    tensors are matched to the name the file has (a file written by
    :func:`save_model` holds one name per shared storage), so the names
    dropped at save are neither missing nor unexpected.

    Returns ``(missing, unexpected)``: ``missing`` (a set) the model's
    names the file did not fill; ``unexpected`` (a list) the file's names
    the model did not take, and shared names of the model that the file
    also holds. ``strict``: ``RuntimeError`` naming them when either is
    not empty. ``device``: as :func:`load_file`."""
    state_dict = load_file(filename, device=device, backend=backend)
    to_removes = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    result = model.load_state_dict(state_dict, strict=False)
    missing = set(result.missing_keys)
    unexpected = list(result.unexpected_keys)
    for dropped in to_removes.values():
        for name in dropped:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return missing, unexpected


from ._panic import guard_names as _guard_names  # noqa: E402

_guard_names(globals(), __all__)
