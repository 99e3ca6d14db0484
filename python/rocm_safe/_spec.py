"""The ``safetensors`` module's raw API of 0.8: ``TensorSpec``,
``serialize``, ``serialize_file`` and ``deserialize``, over rocm-safe's
atomic writer and strict parser.

``TensorSpec`` names a tensor's bytes by a memory address, as in the
``safetensors`` package: the caller keeps that memory alive and unchanged
until the ``serialize``/``serialize_file`` call returns. The bytes are
written straight from it with the GIL released.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _dtypes, _native, _save
from ._native import SafetensorError

# TensorSpec's dtype names (torch's and numpy's spelling) -> the
# safetensors name, exactly those the safetensors package takes.
SPEC_DTYPES = {
    "bool": "BOOL",
    "int8": "I8",
    "uint8": "U8",
    "int16": "I16",
    "uint16": "U16",
    "int32": "I32",
    "uint32": "U32",
    "int64": "I64",
    "uint64": "U64",
    "float16": "F16",
    "float32": "F32",
    "float64": "F64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e4m3fnuz": "F8_E4M3FNUZ",
    "float8_e5m2": "F8_E5M2",
    "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "float8_e8m0fnu": "F8_E8M0",
    "float4_e2m1fn_x2": "F4",
    "complex64": "C64",
}


def _unsigned(value: Any, what: str) -> int:
    """A non-negative int (``TypeError`` for another type, ``OverflowError``
    for a negative one, as the safetensors package's argument parsing)."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be an int, not {type(value).__name__}")
    v = value.__index__()
    if v < 0:
        raise OverflowError(f"{what} must not be negative: {v}")
    return v


class TensorSpec:
    """One tensor for :func:`serialize` / :func:`serialize_file`, as in
    ``safetensors`` 0.8: ``TensorSpec(*, dtype, shape, data_ptr, data_len)``.

    ``dtype`` is a torch/numpy name (``"float32"``, ``"bfloat16"``,
    ``"float8_e4m3fn"``, ``"float4_e2m1fn_x2"``, ...; ``SafetensorError`` for
    any other), ``shape`` the tensor's shape (for ``float4_e2m1fn_x2``, two
    F4 values per item, the storage shape torch reports: the last dimension
    is doubled into the logical shape the file records), ``data_ptr`` the
    address of its ``data_len`` contiguous little-endian bytes.

    The properties give the header's view: ``dtype`` is the safetensors
    name (``"F32"``), ``shape`` the logical shape. Immutable.
    """

    __slots__ = ("_dtype", "_shape", "_data_ptr", "_data_len")

    def __init__(self, *, dtype: str, shape, data_ptr: int, data_len: int):
        if not isinstance(dtype, str):
            raise TypeError(f"dtype must be a str, not {type(dtype).__name__}")
        code = SPEC_DTYPES.get(dtype)
        if code is None:
            raise SafetensorError(f"Unknown dtype {dtype!r}. Supported dtypes: {', '.join(SPEC_DTYPES)}")
        if isinstance(shape, (str, bytes)):
            raise TypeError("shape must be a sequence of ints, not a string")
        dims = [_unsigned(d, "a shape dimension") for d in shape]
        if code == "F4" and dims:
            dims[-1] *= 2  # two F4 values per float4_e2m1fn_x2 item
        object.__setattr__(self, "_dtype", code)
        object.__setattr__(self, "_shape", dims)
        object.__setattr__(self, "_data_ptr", _unsigned(data_ptr, "data_ptr"))
        object.__setattr__(self, "_data_len", _unsigned(data_len, "data_len"))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"TensorSpec is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"TensorSpec is immutable: cannot delete {name!r}")

    @property
    def dtype(self) -> str:
        """The safetensors name of the dtype (``"F32"``, ``"BF16"``, ``"F4"``)."""
        return self._dtype

    @property
    def shape(self) -> List[int]:
        """The logical shape, as the header records it."""
        return list(self._shape)

    @property
    def data_ptr(self) -> int:
        """The address of the tensor's bytes."""
        return self._data_ptr

    @property
    def data_len(self) -> int:
        """The number of bytes at ``data_ptr``."""
        return self._data_len

    def __repr__(self) -> str:
        return (
            f"TensorSpec(dtype={self._dtype!r}, shape={self._shape}, data_ptr={self._data_ptr},"
            f" data_len={self._data_len})"
        )


def _items(tensor_dict: Any) -> List[_save.Item]:
    """The writer's items of a ``{name: TensorSpec}`` dict: ``TypeError``
    for another argument (a raw dict per tensor, as before 0.8, included),
    ``SafetensorError`` when ``data_len`` is not the size that the dtype
    and shape give or the address is null."""
    if not isinstance(tensor_dict, dict):
        raise TypeError(f"tensor_dict must be a dict of str to TensorSpec, not {type(tensor_dict).__name__}")
    items = []
    for name, spec in tensor_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}: {name!r}")
        if not isinstance(spec, TensorSpec):
            raise TypeError(f"tensor {name!r}: expected a TensorSpec, not {type(spec).__name__}")
        try:
            need = _dtypes.nbytes(spec.dtype, spec.shape)
        except SafetensorError as e:
            raise SafetensorError(f"Error while serializing: tensor {name!r}: {e}") from None
        if spec.data_len != need:
            raise SafetensorError(
                f"Error while serializing: tensor {name!r}: data_len is {spec.data_len} bytes, but dtype"
                f" {spec.dtype} and shape {spec.shape} need {need}"
            )
        if need and not spec.data_ptr:
            raise SafetensorError(f"Error while serializing: tensor {name!r}: data_ptr is null")
        items.append((name, spec.dtype, spec.shape, _save.Span(spec.data_ptr, spec.data_len)))
    return items


def serialize(tensor_dict: Dict[str, TensorSpec], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The safetensors file of ``tensor_dict`` (``{name: TensorSpec}``)
    and ``metadata``, as bytes (the bytes ``safetensors.serialize``
    returns). The memory each spec names must stay alive and unchanged
    during the call."""
    return _save.write_bytes(_items(tensor_dict), metadata)


def serialize_file(
    tensor_dict: Dict[str, TensorSpec],
    filename: Union[str, os.PathLike],
    metadata: Optional[Dict[str, str]] = None,
) -> None:
    """Writes the safetensors file of ``tensor_dict`` (``{name:
    TensorSpec}``) and ``metadata`` to ``filename``, atomically (a
    temporary file, fsync, rename), streamed straight from the memory each
    spec names with the GIL released: other threads run meanwhile. That
    memory must stay alive and unchanged during the call. Errors: as
    ``rocm_safe.torch.save_file``."""
    _save.write_file(_items(tensor_dict), filename, metadata)


def deserialize(data: Union[bytes, bytearray]) -> List[Tuple[str, Dict[str, Any]]]:
    """Validates a whole safetensors file held in memory (the checks of a
    file) and returns its tensors as ``safetensors.deserialize`` does:
    ``[(name, {"shape": [...], "dtype": "F32", "data": bytearray}), ...]``,
    in file order. The shape is the header's (logical) one."""
    tensors, _meta = _native.load_bytes(bytes(data), None)
    return [(name, {"shape": list(shape), "dtype": dt, "data": buf}) for name, buf, dt, shape in tensors]
