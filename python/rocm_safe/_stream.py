"""Reading a safetensors file from a Python file object: ``safe_open(f)``
and ``_safe_open_handle(f)``, for anything with ``readinto`` (or ``read``)
and ``seek``: an ``open(path, "rb")`` file (a text-mode one through its
binary ``buffer``), ``io.BytesIO``, fsspec files (local, memory, remote).

The header goes through the library's validator (``_native.header_len``
and ``_native.parse_head``: every check a file on disk gets, the layout
of the data section against the stream's length included); tensors are
then read at their validated offsets with ``seek`` + ``readinto``, straight
into the buffer the array is made of, a bounded chunk per call. A converted
read (``dtype=``) holds one chunk of the source at a time. Nothing else of
the stream is kept in memory.

What a file on disk has and a stream has not: the check that the file did
not change while it was read is reduced to the stream's length (a stream
that ends before a tensor's last byte is a ``SafetensorError``).
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any, Dict, List, Optional, Tuple

from . import _dtypes, _native
from ._native import SafetensorError

# Bytes per readinto call, and the source bytes of one converted chunk.
CHUNK = 16 << 20

# How many first bytes the length prefix's checks need (a Git LFS pointer
# prefix is 40 bytes).
_PREFIX = 64


def is_file_object(obj: Any) -> bool:
    """Whether ``obj`` is taken as a file object (not a path): something
    with ``seek`` and ``readinto`` or ``read``, that is not a str, bytes or
    ``os.PathLike``."""
    if isinstance(obj, (str, bytes, os.PathLike)):
        return False
    return callable(getattr(obj, "seek", None)) and (
        callable(getattr(obj, "readinto", None)) or callable(getattr(obj, "read", None))
    )


def _binary(f: Any) -> Any:
    """The binary stream of ``f``: a text-mode file's ``buffer``."""
    if isinstance(f, io.TextIOBase):
        buf = getattr(f, "buffer", None)
        if buf is None:
            raise SafetensorError(f"{f!r} is a text stream without a binary buffer: open the file with 'rb'")
        return buf
    return f


def _name(f: Any) -> str:
    """What errors call the stream: its path or name where it has one."""
    for attr in ("path", "name"):
        v = getattr(f, attr, None)
        if isinstance(v, (str, bytes, os.PathLike)):
            return os.fsdecode(v)
    return f"<{type(f).__name__}>"


class _Stream:
    """One file object, read under a lock (seek + readinto are not atomic)
    by every handle on it."""

    def __init__(self, f: Any):
        self.f = _binary(f)
        self.name = _name(f)
        self.lock = threading.Lock()
        self._readinto = getattr(self.f, "readinto", None)
        with self.lock:
            self.f.seek(0, io.SEEK_END)
            self.length = int(self.f.tell())

    def _fill(self, view: memoryview, at: int, what: str) -> None:
        """Fills ``view`` with the stream's bytes from offset ``at``
        (lock held), a bounded chunk per call."""
        self.f.seek(at)
        got = 0
        n = len(view)
        while got < n:
            part = view[got : min(n, got + CHUNK)]
            if self._readinto is not None:
                k = self._readinto(part)
            else:
                data = self.f.read(len(part)) or b""
                k = min(len(data), len(part))
                part[:k] = data[:k]
            if not k:
                raise SafetensorError(
                    f"{self.name}: the stream ended at byte {at + got} while reading {what}, which ends at byte"
                    f" {at + n} (the stream is {self.length} bytes long at open): it changed while being read"
                )
            got += k

    def read_into(self, view: memoryview, at: int, what: str) -> None:
        with self.lock:
            self._fill(view, at, what)

    def read(self, at: int, n: int, what: str) -> bytearray:
        buf = bytearray(n)
        self.read_into(memoryview(buf), at, what)
        return buf


class StreamCheckpoint:
    """The part of ``_native.Checkpoint``'s interface that ``safe_open``
    uses, over a file object: ``tensors``, ``describe``, ``metadata``,
    ``target_dtype``, ``read`` (whole tensors and rows, converted or not),
    ``share``, ``close``."""

    def __init__(self, f: Any, _shared: Optional[Tuple[_Stream, list, dict, Any]] = None):
        if _shared is not None:
            self._stream, self._order, self._by_name, self._metadata = _shared
            self._closed = False
            return
        stream = _Stream(f)
        head = stream.read(0, min(stream.length, _PREFIX), "the header's length")
        n = _native.header_len(stream.name, bytes(head), stream.length)
        if 8 + n > len(head):
            head = stream.read(0, 8 + n, "the header")
        entries, metadata = _native.parse_head(stream.name, bytes(head), stream.length)
        self._stream = stream
        self._order = [e[0] for e in entries]
        self._by_name: Dict[str, Tuple[str, List[int], int, int]] = {
            name: (dtype, list(shape), begin, end) for name, dtype, shape, begin, end in entries
        }
        self._metadata = metadata
        self._closed = False

    # -- the handle ---------------------------------------------------------
    @property
    def path(self) -> str:
        return self._stream.name

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Closes this handle (the file object stays open: it is the
        caller's)."""
        self._closed = True

    def share(self) -> "StreamCheckpoint":
        self._check()
        return StreamCheckpoint(None, (self._stream, self._order, self._by_name, self._metadata))

    def _check(self) -> None:
        if self._closed:
            raise SafetensorError(f"{self.path}: file is closed")

    def _info(self, name: str) -> Tuple[str, List[int], int, int]:
        self._check()
        info = self._by_name.get(name)
        if info is None:
            raise SafetensorError(f"{self.path}: no tensor named {name!r}")
        return info

    # -- the header ---------------------------------------------------------
    def tensors(self) -> List[Tuple[str, str, List[int]]]:
        self._check()
        return [(n, self._by_name[n][0], list(self._by_name[n][1])) for n in self._order]

    def describe(self, name: str) -> Tuple[str, List[int]]:
        dtype, shape, _, _ = self._info(name)
        return dtype, list(shape)

    def metadata(self) -> Optional[Dict[str, str]]:
        self._check()
        return None if self._metadata is None else dict(self._metadata)

    def target_dtype(self, name: str, to: Optional[str] = None, floats_only: bool = False) -> str:
        """The dtype a read of ``name`` with ``to`` returns: the rule of
        the native reader (``target`` in python/src/lib.rs)."""
        dtype = self._info(name)[0]
        if to is None or to == dtype or (dtype, to) in _dtypes.CONVERSIONS:
            return dtype if to is None else to
        if floats_only and dtype not in _dtypes.CONVERT_SOURCES:
            return dtype
        raise SafetensorError(f"tensor {name!r}: cannot convert {dtype} to {to}")

    # -- the data -------------------------------------------------------------
    def read(
        self,
        name: str,
        to: Optional[str] = None,
        rows: Optional[Tuple[int, int]] = None,
        floats_only: bool = False,
    ) -> Tuple[bytearray, str, List[int]]:
        """``(bytearray, dtype, shape)`` of tensor ``name`` or of its rows
        ``rows`` (``(start, end)`` of the first dimension), converted to
        ``to`` (see ``target_dtype``)."""
        dtype, shape, begin, end = self._info(name)
        out = self.target_dtype(name, to, floats_only)
        shape = list(shape)
        if rows is not None:
            lo, hi = rows
            if not _dtypes.keeps_rows(dtype, shape) or not 0 <= lo <= hi <= shape[0]:
                raise SafetensorError(f"{self.path}: tensor {name!r} of shape {shape}: no rows {lo}..{hi} to read")
            row = _dtypes.nbytes(dtype, shape[1:])
            begin, end = begin + lo * row, begin + hi * row
            shape[0] = hi - lo
        what = f"tensor {name!r}"
        if out == dtype:
            return self._stream.read(begin, end - begin, what), out, shape
        src_size, dst_size = _dtypes.ITEMSIZE[dtype], _dtypes.ITEMSIZE[out]
        result = bytearray((end - begin) // src_size * dst_size)
        dst = memoryview(result)
        step = max(1, CHUNK // src_size) * src_size
        chunk = bytearray(min(step, end - begin))
        view = memoryview(chunk)
        at = 0
        for off in range(begin, end, step):
            n = min(step, end - off)
            self._stream.read_into(view[:n], off, what)
            converted = _native.convert_chunk(dtype, bytes(view[:n]), out)
            dst[at : at + len(converted)] = converted
            at += len(converted)
        return result, out, shape
