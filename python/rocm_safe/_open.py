"""``safe_open``: the ``safetensors.safe_open`` API over rocm-safe's reader."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import _dtypes, _native, _stream
from ._native import SafetensorError

# The framework names safetensors accepts (case-sensitive, as there).
_FRAMEWORKS = {
    "pt": "pt",
    "torch": "pt",
    "pytorch": "pt",
    "np": "np",
    "numpy": "np",
    "jax": "flax",
    "flax": "flax",
    "tf": "tf",
    "tensorflow": "tf",
    "mlx": "mlx",
    "paddle": "paddle",
}


def _framework(framework: str) -> str:
    fw = _FRAMEWORKS.get(framework) if isinstance(framework, str) else None
    if fw is None:
        raise SafetensorError(
            f"framework {framework!r} is invalid: use one of {', '.join(repr(k) for k in _FRAMEWORKS)}"
        )
    if fw == "paddle":
        import paddle  # noqa: F401 - as safetensors: fails at open without paddle
    return fw


def _from_numpy(framework: str, arr: np.ndarray):
    """A numpy array as an array of ``framework`` (jax/flax, tf, mlx,
    paddle), imported on first use: ``ModuleNotFoundError`` without it, as
    with safetensors."""
    if framework == "flax":
        import jax.numpy as jnp

        return jnp.asarray(arr)
    if framework == "tf":
        import tensorflow as tf

        return tf.convert_to_tensor(arr)
    if framework == "mlx":
        import mlx.core as mx

        if arr.dtype.name == "bfloat16":  # mlx takes no ml_dtypes arrays
            return mx.array(arr.astype(np.float32)).astype(mx.bfloat16)
        return mx.array(arr)
    if framework == "paddle":
        import paddle

        return paddle.to_tensor(arr)
    raise SafetensorError(f"framework {framework!r} is invalid")


def _device(device: Union[str, int, Any]) -> str:
    """Normalises a device as safetensors accepts it: "cpu", "cuda",
    "cuda:N", an int N, or a torch.device."""
    if device is None:
        return "cpu"  # as safetensors
    if isinstance(device, bool):
        raise SafetensorError(f"invalid device {device!r}")
    if isinstance(device, int):
        device = f"cuda:{device}"
    elif type(device).__module__ == "torch":  # torch.device, torch not imported here
        device = str(device)
    kind, ordinal = _native.parse_device(str(device))
    return "cpu" if kind == "cpu" else f"cuda:{ordinal}"


def _verify(verify: Any) -> str:
    """``verify=``: None/True (the default policy, "fingerprint"), False
    ("off"), or a policy name. On the CPU the policy is validated only:
    host reads are exact copies, and every read already checks that the file
    did not change while it was read."""
    if verify is None or verify is True:
        return "fingerprint"
    if verify is False:
        return "off"
    if not isinstance(verify, str):
        raise ValueError(f"verify={verify!r}: expected a policy name, True, False or None")
    return _native.parse_verify(verify)


class _Tensors:
    """Turns (bytearray, dtype, shape) from the native reader into arrays or
    tensors of one framework."""

    def __init__(self, framework: str):
        self.framework = framework

    def wrap(self, storage: np.ndarray, dtype: str, shape):
        """``storage`` (see ``_dtypes.storage_array``) as a tensor of this
        framework; ``shape`` is its logical shape (as in the file), which
        differs from the storage's for sub-byte dtypes."""
        if self.framework == "pt":
            return _dtypes.to_torch(storage, dtype, shape)
        arr = _dtypes.to_numpy(storage, dtype)
        return arr if self.framework == "np" else _from_numpy(self.framework, arr)

    def check(self, dtype: str) -> None:
        """Fails before any array is made when numpy cannot hold ``dtype``
        (bf16/fp8 without ml_dtypes: ``TypeError``, as safetensors.numpy)."""
        if self.framework != "pt" and dtype not in _dtypes.SUB_BYTE:
            _dtypes.numpy_dtype(dtype)

    def from_buffer(self, buf, dtype: str, shape) -> Any:
        self.check(dtype)
        return self.wrap(_dtypes.storage_array(buf, dtype, shape), dtype, shape)


class safe_open:
    """Opens a safetensors file, or a sharded checkpoint's
    ``*.safetensors.index.json``, lazily: the header (of every shard) is read
    and validated at open, tensors are read when asked for.

    Same API as ``safetensors.safe_open``::

        with safe_open("model.safetensors", framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)

    Args:
        filename: a ``.safetensors`` file or a ``.safetensors.index.json``;
            or an open file object (anything with ``seek`` and ``readinto``
            or ``read``: a file opened ``"rb"``, ``io.BytesIO``, an fsspec
            file), read from its first byte whatever its position (which the
            reads move), with the same validation; it is not closed with the
            ``safe_open``.
        framework: ``"pt"``/``"torch"``/``"pytorch"`` (torch tensors),
            ``"np"``/``"numpy"``, or, as safetensors takes them, ``"jax"``/``"flax"``,
            ``"tf"``/``"tensorflow"``, ``"mlx"``, ``"paddle"`` (that framework's
            arrays, made from numpy ones; ``ModuleNotFoundError`` when reading
            without it installed).
        device: ``"cpu"`` (the default; also ``None``), ``"cuda"``, ``"cuda:N"`` or ``N``
            (framework ``"pt"``; also on ROCm, where torch calls the GPU
            ``cuda``): ``get_tensor`` / ``get_tensors`` load through the
            staged, verified GPU loader into device memory handed to torch
            through DLPack (no copy); ``get_slice`` reads the rows on the host
            and moves them. Needs a wheel built with ``--features cuda`` or
            ``--features hip``.
        dtype: (rocm-safe) convert float tensors (F64, F32, F16, BF16)
            exactly to this dtype while reading (``"float32"``,
            ``torch.bfloat16``, ``np.float16``, ``"F32"``, ...); other tensors
            are returned as stored. Default: as stored, as safetensors does.
        verify: (rocm-safe) the verification policy of GPU loads: ``"off"``,
            ``"fingerprint"`` (default), ``"fused_fingerprint"``,
            ``"readback"``, or True/False. On a GPU every staged piece is checked
            with it. On the CPU it is validated and otherwise has no effect: host reads are exact, and every read
            checks that the file did not change while it was read.
        backend: accepted for compatibility (``"mmap"``, ``"pread"``);
            rocm-safe always reads with ``pread``, never a memory map.
    """

    def __init__(
        self,
        filename: Union[str, os.PathLike],
        framework: str,
        device: Union[str, int, Any] = "cpu",
        *,
        dtype: Any = None,
        verify: Any = None,
        backend: str = "mmap",
    ):
        if backend not in ("mmap", "pread"):
            raise SafetensorError(f"backend {backend!r} is not supported: use \"mmap\" or \"pread\"")
        self._framework = _framework(framework)
        self._device = _device(device)
        self._dtype = _dtypes.conversion_target(dtype)
        self._verify = _verify(verify)
        self._tensors = _Tensors(self._framework)
        if _stream.is_file_object(filename):
            self._ckpt = _stream.StreamCheckpoint(filename)
        else:
            self._ckpt = _native.Checkpoint(os.fspath(filename))
        if self._device != "cpu" and self._framework != "pt":
            self._ckpt.close()
            shown = "numpy" if self._framework == "np" else framework
            raise SafetensorError(f"Device {self._device} is not supported for framework {shown}")

    # -- context manager ------------------------------------------------
    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the files (also done on leaving the ``with`` block)."""
        self._ckpt.close()

    # -- header -----------------------------------------------------------
    def keys(self) -> List[str]:
        """The tensor names, sorted."""
        return sorted(name for name, _, _ in self._ckpt.tensors())

    def offset_keys(self) -> List[str]:
        """The tensor names in file order (shard by shard for a sharded
        checkpoint), by data offset."""
        return [name for name, _, _ in self._ckpt.tensors()]

    def metadata(self) -> Optional[Dict[str, str]]:
        """The ``__metadata__`` string map, or None (merged over the shards
        of a sharded checkpoint, which must agree)."""
        return self._ckpt.metadata()

    # -- data ---------------------------------------------------------------
    def _target(self, dtype: Any) -> Optional[str]:
        return self._dtype if dtype is None else _dtypes.conversion_target(dtype)

    def get_tensor(self, name: str, *, dtype: Any = None) -> Any:
        """The whole tensor ``name``, read from the file into memory Python
        owns (one copy). ``dtype`` overrides the file-wide ``dtype=``."""
        target = self._target(dtype)
        if self._device != "cpu":
            return self._to_device([name], target)[name]
        buf, out, shape = self._ckpt.read(name, to=target, floats_only=True)
        return self._tensors.from_buffer(buf, out, shape)

    def get_tensors(self) -> Dict[str, Any]:
        """Every tensor, by name, in file order (:meth:`offset_keys`), as
        safetensors orders them."""
        names = self.offset_keys()
        if self._device != "cpu":
            return self._to_device(names, self._dtype)
        return {name: self.get_tensor(name) for name in names}

    def get_slice(self, name: str) -> "_Slice":
        """A lazy view of tensor ``name``: ``get_shape()``, ``get_dtype()``
        and indexing (``[a:b]``, ``[a:b, c:d]``, ``[i]``, ``[..., j]``); only
        the rows of the first dimension that the index selects are read.
        The slice keeps the file open: it can be read after the ``with``
        block, as with safetensors."""
        dtype, shape = self._ckpt.describe(name)
        return _Slice(self, name, dtype, shape)

    def _to_device(self, names: List[str], target: Optional[str]) -> Dict[str, Any]:
        """The GPU path: the verified loader fills device memory and returns
        DLPack capsules, which torch takes without a copy. A tensor the
        loader's ladder had to keep on the host (see
        ``rocm_safe.torch.last_load_report()``) is moved to the device."""
        import torch

        stream = isinstance(self._ckpt, _stream.StreamCheckpoint)
        # A file object, and sub-byte tensors (F4 and F6, whose torch form is
        # not DLPack's), are read on the host, then moved.
        on_host = [n for n in names if stream or self._ckpt.describe(n)[0] in _dtypes.SUB_BYTE]
        out = {}
        for name in on_host:
            buf, dt, shape = self._ckpt.read(name, to=target, floats_only=True)
            out[name] = self._tensors.from_buffer(buf, dt, shape).to(self._device)
        rest = [n for n in names if n not in out]
        backend = "hip" if getattr(torch.version, "hip", None) else "cuda"
        loaded = _native.load_to_device(self._ckpt, rest, self._device, target, self._verify, backend) if rest else []
        for name, capsule in loaded:
            t = torch.from_dlpack(capsule)
            if t.device.type == "cpu":
                t = t.to(self._device)
            out[name] = t
        # In the order asked for (file order for get_tensors).
        ordered = {n: out.pop(n) for n in names if n in out}
        ordered.update(out)
        return ordered

    def _device_of(self, t):
        """A slice read on the host, moved to the open's GPU device (slices
        are row reads of the file; whole tensors take the verified loader)."""
        if self._device == "cpu":
            return t
        return t.to(self._device)

    def __repr__(self) -> str:
        return f"rocm_safe.safe_open({os.fspath(self._ckpt.path)!r}, framework={self._framework!r}, device={self._device!r})"


class _safe_open_handle(safe_open):
    """``safetensors._safe_open_handle``: :class:`safe_open` over an open
    file object ``f`` (anything with ``seek`` and ``readinto`` or ``read``:
    a file opened ``"rb"`` or ``"r"``, ``io.BytesIO``, an fsspec file),
    validated as a file is; ``f`` stays open. ``TypeError`` for anything
    else (a path: use :class:`safe_open`)."""

    def __init__(self, f: Any, framework: str, device: Union[str, int, Any] = "cpu", *, backend: str = "mmap"):
        if not _stream.is_file_object(f):
            raise TypeError(
                f"_safe_open_handle takes an open file object (with seek and readinto), not {type(f).__name__}"
            )
        super().__init__(f, framework, device, backend=backend)


# safetensors reads True/False as 1/0, numpy and torch as a mask (a new
# axis): the same index would give another result on the loaded tensor.
_BOOL_INDEX = "a bool is not an index here (safetensors reads it as 0/1, numpy and torch as a mask): use 0 or 1"


def _slice_error(name: str, index, shape, why: str) -> SafetensorError:
    return SafetensorError(f"tensor {name!r}: error during slicing {index!r} with shape {list(shape)}: {why}")


class _Slice:
    """What ``get_slice`` returns (``PySafeSlice`` in safetensors)."""

    def __init__(self, owner: safe_open, name: str, dtype: str, shape: List[int]):
        self._owner = owner
        # A handle of its own on the open files: readable after the owner
        # closes, as safetensors' slices are.
        self._ckpt = owner._ckpt.share()
        self._name = name
        self._dtype = dtype
        self._shape = list(shape)

    def get_shape(self) -> List[int]:
        """The tensor's shape, as stored."""
        return list(self._shape)

    def get_dtype(self) -> str:
        """The tensor's dtype as stored, by its safetensors name ("F32", "BF16", ...)."""
        return self._dtype

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of a 0-d tensor")
        return self._shape[0]

    def _normalize(self, index) -> tuple:
        shape = self._shape
        idx = index if isinstance(index, tuple) else (index,)
        lists = [x for x in idx if isinstance(x, list)]
        if lists:
            # numpy, torch and safetensors: `[]` selects nothing of its
            # dimension (`t[[]]` has shape [0, ...]). Alone, or with slices
            # and `...`: with an int or a second list numpy broadcasts them
            # together and may move the dimensions.
            if any(lists):
                raise SafetensorError(
                    f"tensor {self._name!r}: a non-empty list is not an index here (numpy's integer-array"
                    " indexing is not supported): use slices and ints"
                )
            if len(lists) > 1 or any(_is_int(x) for x in idx):
                raise _slice_error(
                    self._name, index, shape, "an empty list indexes here only with slices and an ellipsis"
                )
            idx = tuple(slice(0, 0) if isinstance(x, list) else x for x in idx)
        ells = [i for i, x in enumerate(idx) if x is Ellipsis]
        if len(ells) > 1:
            raise _slice_error(self._name, index, shape, "an index can only have a single ellipsis")
        if ells:
            pos = ells[0]
            fill = len(shape) - (len(idx) - 1)
            if fill < 0:
                raise _slice_error(self._name, index, shape, "more slicing indexes than dimensions in tensor")
            idx = idx[:pos] + (slice(None),) * fill + idx[pos + 1 :]
        if len(idx) > len(shape):
            raise _slice_error(self._name, index, shape, "more slicing indexes than dimensions in tensor")
        out = []
        for axis, (x, dim) in enumerate(zip(idx, shape)):
            if isinstance(x, slice):
                for part in (x.start, x.stop, x.step):
                    if isinstance(part, bool):
                        raise _slice_error(self._name, index, shape, _BOOL_INDEX)
                    if part is not None and not _is_int(part):
                        # As safetensors (and range()): a TypeError.
                        raise TypeError(
                            f"tensor {self._name!r}: slice bounds must be integers, not {type(part).__name__}"
                            f" (dimension #{axis} of {index!r})"
                        )
                if x.step == 0:
                    raise _slice_error(self._name, index, shape, "slice step cannot be zero")
                out.append(x)
            elif _is_int(x):
                i = int(x)
                if i < -dim or i >= dim:
                    raise _slice_error(
                        self._name, index, shape, f"index {i} out of bounds for tensor dimension #{axis} of size {dim}"
                    )
                out.append(i + dim if i < 0 else i)
            elif isinstance(x, (bool, np.bool_)):
                raise _slice_error(self._name, index, shape, _BOOL_INDEX)
            else:
                raise SafetensorError(
                    f"tensor {self._name!r}: unsupported slice index at position {axis}: expected slice, int,"
                    " ellipsis or an empty list"
                )
        return tuple(out)

    def _rows(self, first) -> Tuple[int, int, Any]:
        """``(lo, hi, local)``: the rows ``lo..hi`` of the first dimension
        that the first index (an int or a slice) needs, and that index
        relative to ``lo``."""
        if isinstance(first, int):
            return first, first + 1, 0
        r = range(*first.indices(self._shape[0]))
        if len(r) == 0:
            return 0, 0, slice(0, 0)
        lo, hi = min(r), max(r) + 1
        stop = r.stop - lo
        return lo, hi, slice(r.start - lo, stop if stop >= 0 else None, r.step)

    def __getitem__(self, index: Any) -> Any:
        idx = self._normalize(index)
        owner = self._owner
        ckpt = self._ckpt
        target = owner._dtype
        if self._dtype in _dtypes.SUB_BYTE:
            return self._packed(idx, index)
        if not self._shape or not idx:
            buf, out, shape = ckpt.read(self._name, to=target, floats_only=True)
            storage = _dtypes.storage_array(buf, out, shape)
            part = storage[idx + (Ellipsis,)]
            return owner._device_of(owner._tensors.wrap(part, out, part.shape))
        lo, hi, local = self._rows(idx[0])
        owner._tensors.check(ckpt.target_dtype(self._name, target, True))
        buf, out, shape = ckpt.read(self._name, to=target, rows=(lo, hi), floats_only=True)
        storage = _dtypes.storage_array(buf, out, shape)
        part = storage[(local,) + idx[1:] + (Ellipsis,)]
        if part.nbytes != storage.nbytes or not part.flags.c_contiguous:
            # Keep only what was asked for, not the rows it was cut from.
            part = part.copy(order="C")
        return owner._device_of(owner._tensors.wrap(part, out, part.shape))

    def _packed(self, idx: tuple, index):
        """A slice of a sub-byte tensor (F4, F6_*: several elements per
        byte): whole rows only. The index may select the whole tensor, or
        rows of its first dimension when every row is whole bytes (two
        dimensions at least, the last one whole bytes); any index inside
        a row is a ``SafetensorError``."""
        owner, shape, name = self._owner, self._shape, self._name
        owner._tensors.check(self._dtype)
        rest_full = all(
            isinstance(x, slice) and range(*x.indices(d)) == range(d) for x, d in zip(idx[1:], shape[1:])
        )
        first = idx[0] if idx else slice(None)
        every_row = not shape or (isinstance(first, slice) and range(*first.indices(shape[0])) == range(shape[0]))
        if rest_full and every_row:
            buf, out, s = self._ckpt.read(name)
            return owner._device_of(owner._tensors.from_buffer(buf, out, s))
        if not rest_full or not _dtypes.keeps_rows(self._dtype, shape):
            raise _slice_error(
                name,
                index,
                shape,
                f"{self._dtype} packs several elements per byte: a slice of it selects whole rows (an index of the"
                " first dimension only, of a tensor whose rows are whole bytes)",
            )
        lo, hi, local = self._rows(first)
        buf, out, s = self._ckpt.read(name, rows=(lo, hi))
        part = _dtypes.storage_array(buf, out, s)[local]
        logical = list(shape[1:]) if isinstance(local, int) else [len(range(*local.indices(hi - lo)))] + list(shape[1:])
        if part.nbytes != len(buf) or not part.flags.c_contiguous:
            part = part.copy(order="C")
        return owner._device_of(owner._tensors.wrap(part, out, logical))

    def __repr__(self) -> str:
        return f"<rocm_safe slice {self._name!r} {self._dtype} {self._shape}>"


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


from ._panic import guard_methods as _guard_methods  # noqa: E402

_guard_methods(
    safe_open,
    ("__init__", "__enter__", "__exit__", "close", "keys", "offset_keys", "metadata",
     "get_tensor", "get_tensors", "get_slice"),
)
_guard_methods(_safe_open_handle, ("__init__",))
_guard_methods(_Slice, ("get_shape", "get_dtype", "__len__", "__getitem__"))
