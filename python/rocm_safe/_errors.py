"""The package's exception class, defined in Python so that it can derive
from the ``safetensors`` package's when that is installed: code written
for ``safetensors`` (``except safetensors.SafetensorError``) keeps catching
rocm_safe's refusals. The native module raises this class. Imports nothing
of rocm_safe (the native module imports it while the package loads)."""

from __future__ import annotations

import os

try:  # the safetensors package's, when installed (it imports no framework)
    from safetensors import SafetensorError as _SafetensorsError

    _BASES: tuple = (_SafetensorsError,)
except Exception:  # noqa: BLE001 - not installed, or broken: stand alone
    _BASES = (Exception,)


class SafetensorError(*_BASES):  # type: ignore[misc]
    """A safetensors file, index or bytes that rocm-safe refuses (every
    failure the ``safetensors`` package refuses, and stricter ones), a
    missing tensor, or a write refused. The message names the file and the
    tensor. Where the ``safetensors`` package is installed this is a
    subclass of ``safetensors.SafetensorError``."""


def _write_error_class(base: type) -> type:
    """The class of a failed save whose I/O error was ``base`` (an
    ``OSError`` subclass): a subclass of both ``base`` and
    :class:`SafetensorError`, named ``Safetensor<base>`` and kept in this
    module (so that it pickles)."""
    name = "Safetensor" + base.__name__
    cls = globals().get(name)
    if not (isinstance(cls, type) and issubclass(cls, base) and issubclass(cls, SafetensorError)):
        cls = type(
            name,
            (base, SafetensorError),
            {
                "__module__": __name__,
                "__doc__": f"A save that failed with {base.__name__}: caught by ``except {base.__name__}``"
                " (and ``OSError``) and by ``except SafetensorError`` (as the safetensors package raises it).",
            },
        )
        globals()[name] = cls
    return cls


def write_error(e: OSError, filename: object) -> BaseException:
    """The exception for a save to ``filename`` that failed with ``e``: the
    same ``OSError`` subclass and errno, ``filename`` the file being saved,
    also a :class:`SafetensorError` (the safetensors package raises that
    for every failed write: a missing folder, a full disk)."""
    if isinstance(e, SafetensorError):
        return e
    target = os.fsdecode(os.fspath(filename)) if isinstance(filename, (str, bytes, os.PathLike)) else str(filename)
    detail = e.strerror if e.errno is not None and e.strerror else str(e)
    msg = f"saving {target} failed, nothing written: {detail}"
    cls = _write_error_class(type(e))
    if e.errno is None:
        return cls(msg)
    return cls(e.errno, msg, target)


class SafetensorValueError(ValueError, SafetensorError):
    """A value that cannot be saved (a dtype safetensors has no name for):
    caught by ``except ValueError`` and by ``except SafetensorError`` (the
    class the safetensors package raises for it)."""
