"""A panic of the native code never reaches the caller as PyO3's
PanicException (a BaseException that ``except Exception`` misses): every
public entry point turns it into rocm_safe.InternalError, a RuntimeError."""

import pytest

import rocm_safe
import rocm_safe.numpy as rsn
from rocm_safe import _native, safe_open
from rocm_safe._open import _Slice
from rocm_safe._panic import guard

# What PyO3 raises, as far as the guard can tell: its name and module.
PanicException = type("PanicException", (BaseException,), {"__module__": "pyo3_runtime"})


def test_a_panic_becomes_an_ordinary_exception_with_the_panic_chained():
    def native():
        raise PanicException("index out of bounds: the len is 3 but the index is 7")

    with pytest.raises(rocm_safe.InternalError, match="index out of bounds") as e:
        guard(native)()
    assert isinstance(e.value, RuntimeError) and isinstance(e.value, Exception)
    assert isinstance(e.value.__cause__, PanicException)
    try:
        guard(native)()
    except Exception:  # what a training loop's handler catches
        pass


def test_other_exceptions_pass_through_unchanged():
    def fails(kind):
        raise kind("x")

    for kind in (ValueError, OSError, KeyboardInterrupt, rocm_safe.SafetensorError):
        with pytest.raises(kind):
            guard(fails)(kind)
    assert guard(lambda a, b=2: a + b)(1, b=3) == 4


def test_through_the_package_a_native_panic_is_an_internal_error(monkeypatch):
    def panics():
        raise PanicException("simulated")

    monkeypatch.setattr(_native, "features", panics)
    with pytest.raises(rocm_safe.InternalError, match="simulated"):
        rocm_safe.features()


def test_every_public_entry_point_is_guarded():
    def guarded(f):
        return getattr(f, "__rocm_safe_guarded__", False)

    assert guarded(rocm_safe.doctor) and guarded(rocm_safe.features)
    for name in rsn.__all__:
        assert guarded(getattr(rsn, name)), name
    for name in ("__init__", "__enter__", "__exit__", "keys", "metadata", "get_tensor", "get_tensors", "get_slice"):
        assert guarded(getattr(safe_open, name)), name
    for name in ("get_shape", "get_dtype", "__len__", "__getitem__"):
        assert guarded(getattr(_Slice, name)), name


def test_the_torch_entry_points_are_guarded():
    torch = pytest.importorskip("torch")  # noqa: F841
    import rocm_safe.torch as rst

    for name in rst.__all__:
        assert getattr(getattr(rst, name), "__rocm_safe_guarded__", False), name
    assert getattr(rst._Conv3dFunction.backward, "__rocm_safe_guarded__", False)
    assert getattr(rst._ConvTranspose3dFunction.backward, "__rocm_safe_guarded__", False)


def test_the_doctor_with_environment_variables_that_are_not_utf8():
    import os
    import subprocess
    import sys

    env = dict(os.environb)
    env[b"ROCM_SAFE_TEST_\xff"] = b"1"
    env[b"MIOPEN_DEBUG_ROCM_SAFE_TEST"] = b"\xfe"
    code = "import json, rocm_safe; r = json.loads(rocm_safe.doctor(json=True)); print(r['verdict']['level'])"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=300)
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert out.stdout.strip() in (b"ready", b"cpu_only", b"fix", b"failed")
