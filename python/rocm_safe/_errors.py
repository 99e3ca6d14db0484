"""The package's exception class, defined in Python so that it can derive
from the ``safetensors`` package's when that is installed: code written
for ``safetensors`` (``except safetensors.SafetensorError``) keeps catching
rocm_safe's refusals. The native module raises this class. Imports nothing
of rocm_safe (the native module imports it while the package loads)."""

from __future__ import annotations

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
