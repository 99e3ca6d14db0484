"""rocm_safe: a drop-in for the ``safetensors`` package, over the rocm-safe
Rust library's strict reader and atomic writer.

Switching is one import line::

    # from safetensors import safe_open
    # from safetensors.torch import load_file, save_file
    from rocm_safe import safe_open
    from rocm_safe.torch import load_file, save_file

What rocm_safe adds, as keyword arguments whose defaults behave as
safetensors does: ``dtype=`` (exact conversion of float tensors while
reading), ``verify=`` (the GPU verification policy), and sharded
checkpoints (a ``*.safetensors.index.json`` wherever a file name is taken).
Files that safetensors refuses are refused, as :class:`SafetensorError`,
and so are files with duplicate keys, Git LFS pointers or overlapping
tensors, which safetensors may accept.

The ``safetensors`` module's raw API of 0.8 is here too: ``TensorSpec``,
``serialize``, ``serialize_file``, ``deserialize``; and ``safe_open`` (or
``_safe_open_handle``) reads open file objects (fsspec files included).

``import rocm_safe`` imports numpy only; ``rocm_safe.torch`` imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from . import _native
from ._native import SafetensorError, __version__
from ._open import _safe_open_handle, safe_open
from ._panic import InternalError, guard_names
from ._spec import TensorSpec, deserialize, serialize, serialize_file

__all__ = [
    "SafetensorError",
    "InternalError",
    "safe_open",
    "TensorSpec",
    "serialize",
    "serialize_file",
    "deserialize",
    "doctor",
    "features",
    "kernel_loads",
    "__version__",
]


def features() -> list:
    """The cargo features the native extension was built with (``"cuda"``,
    ``"hip"``, ``"testing"`` for a test build; empty for the default
    CPU-only build)."""
    return list(_native.features())


def kernel_loads() -> list:
    """Every GPU kernel module this process has loaded, in order: a list of
    dicts with ``backend``, ``arch``, ``module``, ``source`` (``"compiled"``
    is the slow case: the first use on this machine, compiled with NVRTC
    and then kept in the kernel cache, ``$ROCM_SAFE_CACHE_DIR``; otherwise
    ``"disk_cache"``, ``"process_cache"``, ``"embedded"`` or ``"nvcc"``) and
    ``seconds`` (the load's wall time, compile included). What a first
    call's time went to."""
    import json as _json

    return _json.loads(_native.kernel_loads_json())


def doctor(json: bool = False) -> Any:
    """The doctor's report: this machine, the GPU runtimes rocm-safe sees,
    and the self-tests of the conversions, the staged copy and the conv3d
    chain (the library's ``diagnostics`` engine and its one renderer, as
    ``cargo run --example doctor``; the commands it suggests are written for
    a pip install of this package).

    ``json=True``: returns the report as a JSON document (the same as
    ``doctor --json``; its ``schema_version`` field names the schema, which
    the crate's ``diagnostics`` docs describe) and prints nothing.
    ``json=False``: prints the report as the doctor's table (the verdict
    first and last) and returns it as a dict.
    """
    text, table, _all_passed, _usable = _native.doctor_report()
    if json:
        return text
    import json as _json

    print(table, end="")
    return _json.loads(text)


guard_names(globals(), ("doctor", "features", "kernel_loads", "serialize", "serialize_file", "deserialize"))


def __getattr__(name: str):
    # `rocm_safe.torch` / `rocm_safe.numpy` without importing them first;
    # torch is imported only here, on first use.
    if name in ("torch", "numpy"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
