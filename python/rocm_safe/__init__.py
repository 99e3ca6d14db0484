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
from typing import Any, Dict, List, Union

from . import _backend, _native
from ._backend import Choice
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
    "backend",
    "Choice",
    "Features",
    "kernel_loads",
    "__version__",
]


class Features(List[str]):
    """The cargo features the native extension was built with (a list:
    ``"cuda"``, ``"hip"``, ``"testing"`` for a test build; empty for a
    CPU-only build), and which backend serves ``"cuda:N"`` in this process:
    :attr:`backend` (``"hip"``, ``"cuda"`` or ``"cpu"``) and :attr:`reason`
    (see :func:`backend`)."""

    #: ``"hip"``, ``"cuda"`` or ``"cpu"``: the backend chosen.
    backend: str
    #: Why that backend (one sentence).
    reason: str

    def __init__(self, names: List[str], choice: Choice) -> None:
        super().__init__(names)
        self.backend = choice.backend
        self.reason = choice.reason

    def __repr__(self) -> str:
        return f"Features({list(self)!r}, backend={self.backend!r}, reason={self.reason!r})"


def features() -> Features:
    """The cargo features the native extension was built with (``"cuda"``,
    ``"hip"``, ``"testing"`` for a test build; empty for a CPU-only build),
    as a list whose ``.backend`` and ``.reason`` say which backend serves
    GPU requests in this process and why (:func:`backend`)."""
    names = list(_native.features())
    return Features(names, _backend.choose(names))


def backend(refresh: bool = False) -> Choice:
    """The GPU backend ``"cuda:N"`` means in this process, chosen at import
    from what the machine and process show, without loading any runtime:
    ``ROCM_SAFE_BACKEND`` when set; PyTorch's build when torch is imported
    (``torch.version.hip``: HIP; ``torch.version.cuda``: CUDA); a runtime
    already in the process; an AMD GPU with a HIP runtime (HIP), an NVIDIA
    GPU with its driver (CUDA); else the CPU. Chosen again once torch has
    been imported, or with ``refresh=True``.

    Returns a :class:`Choice`: ``backend`` (``"hip"``, ``"cuda"``,
    ``"cpu"``), ``reason``, ``built`` (the GPU backends of this wheel) and
    ``evidence`` (each probe's finding)."""
    return _backend.choose(list(_native.features()), refresh=refresh)


def kernel_loads() -> List[Dict[str, Any]]:
    """Every GPU kernel module this process has loaded, in order: a list of
    dicts with ``backend``, ``arch``, ``module``, ``source`` (``"compiled"``
    is the slow case: the first use on this machine, compiled with NVRTC
    and then kept in the kernel cache, ``$ROCM_SAFE_CACHE_DIR``; otherwise
    ``"disk_cache"``, ``"process_cache"``, ``"embedded"`` or ``"nvcc"``) and
    ``seconds`` (the load's wall time, compile included). What a first
    call's time went to."""
    import json as _json

    return _json.loads(_native.kernel_loads_json())


def doctor(json: bool = False) -> Union[str, Dict[str, Any]]:
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

    Either way the report has one key more than the crate's doctor:
    ``"backend_choice"``, :func:`backend`'s choice (``backend``,
    ``reason``, ``built``, ``evidence``), printed right after the verdict.
    """
    import json as _json

    choice = backend(refresh=True)
    text, table, _all_passed, _usable = _native.doctor_report()
    report: Dict[str, Any] = _json.loads(text)
    report["backend_choice"] = choice.to_dict()
    if json:
        return _json.dumps(report, indent=2)
    lines = ["backend choice (rocm_safe.backend())"]
    lines.append(f"  rocm_safe serves GPU requests with: {choice.backend} ({choice.reason})")
    lines += [f"    {e}" for e in choice.evidence]
    # The verdict stays the first line (and the last): the choice follows it.
    verdict, _, rest = table.partition("\n")
    print(verdict + "\n\n" + "\n".join(lines) + "\n" + rest, end="")
    return report


guard_names(globals(), ("doctor", "features", "backend", "kernel_loads", "serialize", "serialize_file", "deserialize"))


# The choice is made at import (nothing is loaded to make it) and made
# again once torch has been imported.
_backend.choose(list(_native.features()))


def __getattr__(name: str) -> Any:
    # `rocm_safe.torch` / `rocm_safe.numpy` without importing them first;
    # torch is imported only here, on first use.
    if name in ("torch", "numpy"):
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
