"""``safetensors.numpy``'s API over rocm-safe: switch with one import line::

    # from safetensors.numpy import load_file, save_file
    from rocm_safe.numpy import load_file, save_file

bf16 and fp8 tensors come back as ``ml_dtypes`` arrays (as with
safetensors.numpy, which needs ``import ml_dtypes`` first; rocm_safe imports
it when it is installed), or convert them while loading with
``dtype=np.float32``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional, Union

import numpy as np

from . import _dtypes, _native, _save
from ._errors import SafetensorValueError
from ._open import _Tensors, safe_open

__all__ = ["load", "load_file", "save", "save_file"]


def load_file(
    filename: Union[str, os.PathLike],
    *,
    dtype: Any = None,
    verify: Any = None,
    backend: str = "mmap",
) -> Dict[str, np.ndarray]:
    """Loads every tensor of a safetensors file, or of a sharded checkpoint
    (``*.safetensors.index.json``), as numpy arrays, each read once into
    memory Python owns.

    ``dtype``: convert float tensors (F64, F32, F16, BF16) exactly to
    float32, float16 or bfloat16 while reading; other tensors as stored.
    ``verify``: the GPU verification policy (validated; no effect on the CPU).
    """
    with safe_open(filename, framework="np", dtype=dtype, verify=verify, backend=backend) as f:
        return f.get_tensors()


def load(data: bytes, *, dtype: Any = None) -> Dict[str, np.ndarray]:
    """Loads a safetensors file held in memory (``bytes``), with the same
    checks as a file, in file order (data offsets; safetensors' order is
    arbitrary here)."""
    target = _dtypes.conversion_target(dtype)
    tensors, _meta = _native.load_bytes(bytes(data), target)
    wrap = _Tensors("np")
    return {name: wrap.from_buffer(buf, dt, shape) for name, buf, dt, shape in tensors}


def _items(tensor_dict: Dict[str, np.ndarray]):
    if not isinstance(tensor_dict, dict):
        raise ValueError(f"Expected a dict of [str, np.ndarray] but received {type(tensor_dict)}")
    items = []
    for name, arr in tensor_dict.items():
        if not isinstance(arr, np.ndarray):
            raise ValueError(f"Key `{name}` is invalid, expected np.ndarray but received {type(arr)}")
        try:
            dtype = _dtypes.safetensors_name(arr.dtype)
        except ValueError:
            raise SafetensorValueError(f"Key `{name}`: dtype {arr.dtype} cannot be saved in safetensors") from None
        if arr.dtype.byteorder == ">" or (arr.dtype.byteorder == "=" and sys.byteorder == "big"):
            arr = arr.byteswap().view(arr.dtype.newbyteorder("<"))
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        raw = arr.reshape(-1).view(np.uint8)
        items.append((name, dtype, list(arr.shape), raw))
    return items


def save_file(
    tensor_dict: Dict[str, np.ndarray],
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
) -> None:
    """Saves numpy arrays to ``filename`` atomically (temporary file, fsync,
    rename). Never replaces a file this process is reading."""
    _save.write_file(_items(tensor_dict), filename, metadata)


def save(tensor_dict: Dict[str, np.ndarray], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes ``save_file`` would write."""
    return _save.write_bytes(_items(tensor_dict), metadata)




from ._panic import guard_names as _guard_names  # noqa: E402

_guard_names(globals(), __all__)
