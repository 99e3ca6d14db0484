"""Writing through the library's atomic streaming writer."""

from __future__ import annotations

import os
import tempfile
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np

from . import _native
from ._errors import write_error

class Span(NamedTuple):
    """A tensor's bytes as a memory address and a length (``TensorSpec``'s
    ``data_ptr`` and ``data_len``): the caller keeps that memory alive and
    unchanged while it is saved."""

    address: int
    length: int


# (name, safetensors dtype, shape, the tensor's bytes: a flat uint8 array
# that the item holds, or a Span)
Item = Tuple[str, str, List[int], Union[np.ndarray, Span]]


def _span(raw: Union[np.ndarray, Span]) -> Span:
    if isinstance(raw, Span):
        return raw
    if not raw.flags.c_contiguous:  # never made so by this package's callers
        raise ValueError("a tensor's bytes must be contiguous to be saved")
    return Span(raw.ctypes.data if raw.nbytes else 0, raw.nbytes)


def check_metadata(metadata: Optional[Dict[str, str]]) -> Optional[Dict[str, str]]:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str to str, not {type(metadata).__name__}")
    for k, v in metadata.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError(f"metadata must map str to str: {k!r}: {v!r}")
    return metadata


def write_file(items: List[Item], filename: Union[str, os.PathLike], metadata: Optional[Dict[str, str]]) -> None:
    """Writes ``items`` to ``filename``: a temporary file in its folder,
    fsynced, renamed into place. A file this process is reading (an open
    ``safe_open``, a loaded checkpoint still open) is never replaced
    (``SafetensorError``), nor is anything that is not a regular file.
    An I/O error (a missing folder, a full disk) raises its ``OSError``
    subclass, which is also a ``SafetensorError`` (as the safetensors
    package raises it), ``filename`` the file being saved. Each tensor is
    written from its own memory with the GIL released: other threads run
    while a large file is saved."""
    metadata = check_metadata(metadata)
    by_name = {}
    for name, dtype, shape, raw in items:
        if not isinstance(name, str):
            raise TypeError(f"tensor names must be str, not {type(name).__name__}: {name!r}")
        by_name[name] = raw
    try:
        w = _native.Writer(os.fspath(filename), [(n, d, list(s)) for n, d, s, _ in items], metadata)
    except OSError as e:
        raise write_error(e, filename) from None
    try:
        for name in w.order():
            # Straight from the tensor's memory, the GIL released while it
            # is written (`items` holds the arrays until the end).
            address, length = _span(by_name[name])
            w.write_address(name, address, length)
        w.finish()
    except OSError as e:
        w.abort()
        raise write_error(e, filename) from None
    except BaseException:
        w.abort()
        raise


def write_bytes(items: List[Item], metadata: Optional[Dict[str, str]]) -> bytes:
    """The file ``write_file`` would write, as bytes."""
    with tempfile.TemporaryDirectory(prefix="rocm_safe-") as d:
        path = os.path.join(d, "out.safetensors")
        write_file(items, path, metadata)
        with open(path, "rb") as f:
            return f.read()
