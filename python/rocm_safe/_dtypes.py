"""Dtype names: safetensors <-> numpy <-> torch, without importing torch.

numpy is the only required dependency; torch is imported only by the
functions that build torch tensors (``torch_dtype``), which are called only
when a user asked for ``framework="pt"`` or ``rocm_safe.torch``.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import numpy as np

from . import _native

# Element sizes in bytes (sub-byte F4/F6 have none): from the library's
# dtype list.
ITEMSIZE = {name: bits // 8 for name, bits in _native.dtypes() if bits % 8 == 0}

# The library's conversion table, one row per (source, target) pair:
# (from, to, src_size, dst_size, kernel, fused, per_item, lossless).
CONVERSIONS = {(row[0], row[1]): row for row in _native.conversions()}

# The dtypes a load converts from and to (exactly, in Rust): F64, F32, F16,
# BF16, F8_E4M3 and F8_E5M2 tensors convert to any target; other tensors are
# returned as stored.
CONVERT_SOURCES = tuple(dict.fromkeys(f for f, _ in CONVERSIONS))
CONVERT_TARGETS = tuple(dict.fromkeys(t for _, t in CONVERSIONS))

_NUMPY_PLAIN = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "I64": np.int64,
    "U64": np.uint64,
    "I32": np.int32,
    "U32": np.uint32,
    "I16": np.int16,
    "U16": np.uint16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
    "C64": np.complex64,
}

# numpy has no bf16/fp8: like safetensors.numpy, they are ml_dtypes' types
# (safetensors.numpy needs `import ml_dtypes` first; we import it ourselves
# when it is installed).
_ML_DTYPES = {
    "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}

# Same-width integers: the storage view used for slicing (any framework).
_SURROGATE = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}

# torch dtype attribute names.
_TORCH = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "C64": "complex64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}

# Names accepted for dtype= (lower case) -> safetensors name.
_ALIASES = {
    "f32": "F32",
    "float32": "F32",
    "float": "F32",
    "f16": "F16",
    "float16": "F16",
    "half": "F16",
    "bf16": "BF16",
    "bfloat16": "BF16",
    "f64": "F64",
    "float64": "F64",
    "double": "F64",
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "uint32": "U32",
    "int64": "I64",
    "uint64": "U64",
    "complex64": "C64",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
}


def safetensors_name(dtype: Any) -> str:
    """The safetensors name ("F32", "BF16", ...) of a dtype given as such a
    name, a numpy/torch/ml_dtypes name, a numpy dtype or type, or a torch
    dtype. ``ValueError`` for anything else."""
    if isinstance(dtype, str):
        if dtype in ITEMSIZE or dtype in ("F4", "F6_E2M3", "F6_E3M2"):
            return dtype
        key = dtype.lower()
        if key.startswith("torch."):
            key = key[len("torch.") :]
        if key in _ALIASES:
            return _ALIASES[key]
        raise ValueError(f"unknown dtype {dtype!r}")
    if type(dtype).__module__ == "torch":  # a torch.dtype, torch not imported here
        return safetensors_name(str(dtype))
    try:
        name = np.dtype(dtype).name
    except TypeError:
        raise ValueError(f"unknown dtype {dtype!r}") from None
    return safetensors_name(name)


def conversion_target(dtype: Any) -> Optional[str]:
    """``dtype=`` of a load: None, or one of F32, F16, BF16."""
    if dtype is None:
        return None
    name = safetensors_name(dtype)
    if name not in CONVERT_TARGETS:
        raise ValueError(
            f"dtype={dtype!r}: loads convert float tensors to float32, float16 or bfloat16 only"
        )
    return name


def _ml_dtypes():
    try:
        import ml_dtypes  # noqa: F401  (registers the types with numpy)
    except ImportError:
        return None
    return ml_dtypes


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a safetensors dtype (bf16/fp8 through ml_dtypes).
    ``TypeError`` as safetensors.numpy when numpy cannot represent it."""
    if name in _NUMPY_PLAIN:
        return np.dtype(_NUMPY_PLAIN[name])
    if name in _ML_DTYPES:
        ml = _ml_dtypes()
        if ml is not None and hasattr(ml, _ML_DTYPES[name]):
            return np.dtype(getattr(ml, _ML_DTYPES[name]))
        raise TypeError(
            f"data type {_ML_DTYPES[name]!r} not understood: numpy has no {name} type; "
            "install ml_dtypes (pip install ml_dtypes), or load with dtype=np.float32"
        )
    raise TypeError(f"safetensors dtype {name} has no numpy equivalent")


def torch_dtype(name: str):
    """The torch dtype of a safetensors dtype (imports torch)."""
    import torch

    attr = _TORCH.get(name)
    dt = getattr(torch, attr, None) if attr else None
    if dt is None:
        raise TypeError(f"safetensors dtype {name} has no equivalent in torch {torch.__version__}")
    return dt


def storage_array(buf, name: str, shape) -> np.ndarray:
    """A numpy view of ``buf`` (a bytearray) as same-width integers of the
    given shape: the form in which any dtype can be sliced."""
    size = ITEMSIZE.get(name)
    if size is None:
        raise TypeError(f"safetensors dtype {name} (sub-byte) cannot be loaded as an array")
    arr = np.frombuffer(buf, dtype=_SURROGATE[size]).reshape(shape)
    if sys.byteorder == "big":  # the file is little-endian
        arr = arr.byteswap()
    return arr


def to_numpy(storage: np.ndarray, name: str) -> np.ndarray:
    """A storage view (see ``storage_array``) as an array of its dtype."""
    return storage.view(numpy_dtype(name))


def to_torch(storage: np.ndarray, name: str):
    """A storage view as a torch tensor of its dtype, sharing memory."""
    import torch

    dt = torch_dtype(name)
    t = torch.from_numpy(storage)
    return t if t.dtype == dt else t.view(dt)
