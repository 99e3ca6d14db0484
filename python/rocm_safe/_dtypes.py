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
from ._native import SafetensorError

# Element sizes in bytes (sub-byte F4/F6 have none): from the library's
# dtype list.
ITEMSIZE = {name: bits // 8 for name, bits in _native.dtypes() if bits % 8 == 0}

# The sub-byte dtypes (F4, F6_E2M3, F6_E3M2) and their widths in bits:
# several elements share a byte, so they load as their packed bytes (see
# ``storage_shape``), or, for F4 in torch, as ``torch.float4_e2m1fn_x2``.
SUB_BYTE = {name: bits for name, bits in _native.dtypes() if bits % 8 != 0}

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
    "F4": "float4_e2m1fn_x2",
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
    "float4_e2m1fn_x2": "F4",
}


def safetensors_name(dtype: Any) -> str:
    """The safetensors name ("F32", "BF16", ...) of a dtype given as such a
    name, a numpy/torch/ml_dtypes name, a numpy dtype or type, or a torch
    dtype. ``ValueError`` for anything else."""
    if isinstance(dtype, str):
        if dtype in ITEMSIZE or dtype in SUB_BYTE:
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
    """The torch dtype of a safetensors dtype (imports torch), or None
    where this torch has none (F6_E2M3 and F6_E3M2 in any torch; F4 and
    F8_E8M0 before torch 2.8): such tensors load as their bytes (uint8)."""
    import torch

    attr = _TORCH.get(name)
    return getattr(torch, attr, None) if attr else None


def nbytes(name: str, shape) -> int:
    """Bytes of a tensor of dtype ``name`` and ``shape``
    (``SafetensorError`` when sub-byte elements do not fill whole bytes,
    which no valid file holds)."""
    elements = 1
    for d in shape:
        elements *= int(d)
    if name in ITEMSIZE:
        return elements * ITEMSIZE[name]
    bits = elements * SUB_BYTE[name]
    if bits % 8:
        raise SafetensorError(f"{elements} {name} elements do not fill whole bytes")
    return bits // 8


def storage_shape(name: str, shape) -> list:
    """The shape of a tensor's bytes as they load where the framework has
    no type for its dtype: ``shape`` for dtypes of whole bytes; for the
    sub-byte dtypes (F4, F6_*) ``shape`` with its last dimension counted in
    bytes (``last * bits / 8``: F4 ``[4, 6]`` -> ``[4, 3]``, F6 ``[2, 8]`` ->
    ``[2, 6]``) when that is whole, else one dimension of all the bytes."""
    shape = [int(d) for d in shape]
    bits = SUB_BYTE.get(name)
    if bits is None:
        return shape
    if shape and (shape[-1] * bits) % 8 == 0:
        return shape[:-1] + [shape[-1] * bits // 8]
    return [nbytes(name, shape)]


def keeps_rows(name: str, shape) -> bool:
    """Whether the bytes of a tensor keep its first dimension as theirs
    (``storage_shape`` above): always for whole-byte dtypes (not for a
    scalar), for sub-byte ones when the last dimension fills whole bytes
    and there are two dimensions at least. Slices of sub-byte tensors
    select such rows."""
    if not shape:
        return False
    if name not in SUB_BYTE:
        return True
    return len(shape) >= 2 and (int(shape[-1]) * SUB_BYTE[name]) % 8 == 0


def storage_array(buf, name: str, shape) -> np.ndarray:
    """A numpy view of ``buf`` (a bytearray) as same-width integers of the
    given shape: the form in which any dtype can be sliced. Sub-byte
    dtypes: uint8 of ``storage_shape(name, shape)``."""
    size = ITEMSIZE.get(name)
    if size is None:
        return np.frombuffer(buf, dtype=np.uint8).reshape(storage_shape(name, shape))
    arr = np.frombuffer(buf, dtype=_SURROGATE[size]).reshape(shape)
    if sys.byteorder == "big":  # the file is little-endian
        arr = arr.byteswap()
    return arr


def to_numpy(storage: np.ndarray, name: str) -> np.ndarray:
    """A storage view (see ``storage_array``) as an array of its dtype;
    sub-byte tensors stay their packed bytes (uint8): ml_dtypes' float4 and
    float6 types hold one element per byte."""
    if name in SUB_BYTE:
        return storage
    return storage.view(numpy_dtype(name))


def to_torch(storage: np.ndarray, name: str, shape):
    """A storage view as a torch tensor of its dtype, sharing memory; a
    tensor of a dtype this torch lacks (F6_*) as its bytes (uint8, see
    ``storage_shape``). F4 is ``torch.float4_e2m1fn_x2``, two elements per
    item: the last dimension of ``shape`` (the logical shape, as in the
    file) halved, which needs it even (``SafetensorError`` otherwise)."""
    import torch

    dt = torch_dtype(name)
    t = torch.from_numpy(storage)
    if dt is None or t.dtype == dt:
        return t
    if name == "F4" and (not shape or int(shape[-1]) % 2):
        raise SafetensorError(
            f"a F4 tensor of shape {list(shape)} cannot be a torch.float4_e2m1fn_x2 tensor: that type packs"
            " two elements of the last dimension per item, so the last dimension must be even"
        )
    return t.view(dt)
