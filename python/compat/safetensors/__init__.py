"""A shim named ``safetensors`` that serves the ``safetensors`` package's
public names from ``rocm_safe``: what CI runs the safetensors project's own
tests through (``python/compat/run-upstream-suite.sh``). Put this folder first on
``PYTHONPATH`` to use it; nothing else imports it."""

from rocm_safe import (  # noqa: F401
    SafetensorError,
    TensorSpec,
    __version__,
    _safe_open_handle,
    deserialize,
    safe_open,
    serialize,
    serialize_file,
)
