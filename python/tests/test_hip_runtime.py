"""The ``hip`` wheel and the HIP runtime of the process: one libamdhip64.

A ``hip`` wheel links no HIP library: it imports and works on the CPU
where there is no ROCm, and it opens the HIP runtime only when a device is
asked for, taking the one already in the process (PyTorch's, on ROCm) over
any other. Checked over the stand-in runtime (tests/hip-standin/standin.c,
built here with the C compiler), each scenario in a fresh interpreter
(the runtime is chosen once per process), by counting the distinct
``libamdhip64`` files in /proc/self/maps. Skipped for a wheel built without
``--features hip``, or without a C compiler.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import rocm_safe

pytestmark = [
    pytest.mark.skipif("hip" not in rocm_safe.features(), reason="wheel built without --features hip"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only (/proc/self/maps)"),
]

SOURCE = Path(__file__).resolve().parents[2] / "tests" / "hip-standin" / "standin.c"

# Every variable that chooses a HIP runtime or its device, removed from the
# children's environment.
CLEARED = [
    "ROCM_SAFE_HIP_RUNTIME",
    "ROCM_PATH",
    "HIP_PATH",
    "HSA_OVERRIDE_GFX_VERSION",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
]

# Prints, as its last line, "<number of distinct libamdhip64 files mapped>
# <their paths, ';'-separated>".
COUNT = r"""
import os
def hip_files():
    seen = {}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith("libamdhip64.so"):
                path = parts[5].strip()
                st = os.stat(path)
                seen.setdefault((st.st_dev, st.st_ino), path)
    return sorted(seen.values())
files = hip_files()
print(len(files), ";".join(files))
"""


def build_standin(folder: Path, major: int) -> Path:
    # Built beforehand where the suite runs without a compiler (CI's fresh
    # venv): $ROCM_SAFE_TEST_STANDIN/so<major>/libamdhip64.so.<major>.
    prebuilt = os.environ.get("ROCM_SAFE_TEST_STANDIN")
    if prebuilt:
        return Path(prebuilt) / f"so{major}" / f"libamdhip64.so.{major}"
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or not SOURCE.is_file():
        pytest.skip("no C compiler, or no stand-in source (tests/hip-standin/standin.c)")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"libamdhip64.so.{major}"
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", f"-DSTANDIN_MAJOR={major}",
         f"-Wl,-soname,libamdhip64.so.{major}", "-o", str(out), str(SOURCE), "-lpthread"],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def standins(tmp_path_factory):
    root = tmp_path_factory.mktemp("hip-standin")
    return {
        7: build_standin(root / "so7", 7),
        6: build_standin(root / "so6", 6),
    }


def run(code: str, **env) -> list:
    """Runs `code` then COUNT in a fresh interpreter with the HIP variables
    cleared and `env` set; its output lines."""
    child_env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    child_env.update({k: str(v) for k, v in env.items()})
    # The repository's python/ must not shadow the installed wheel.
    cwd = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, "-c", code + COUNT],
        env=child_env, cwd=cwd, capture_output=True, text=True, timeout=120,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout.strip().splitlines()


OPEN_DEVICE = """
from rocm_safe import _native
_native.device_owned_bytes("cuda:0", "hip")
"""


def test_a_runtime_loaded_before_import_is_the_one_used(standins):
    # The process loaded .so.7 (as `import torch` does) before importing
    # rocm_safe; $ROCM_SAFE_HIP_RUNTIME names another copy, which must not
    # be mapped as well.
    code = f"""
import ctypes
ctypes.CDLL({str(standins[7])!r}, mode=ctypes.RTLD_GLOBAL)
import rocm_safe
{OPEN_DEVICE}
"""
    out = run(code, ROCM_SAFE_HIP_RUNTIME=standins[6].parent)
    count, paths = out[-1].split(" ", 1)
    assert count == "1" and paths == str(standins[7]), out


def test_a_runtime_loaded_after_import_is_the_one_used(standins):
    # rocm_safe imported first (nothing HIP is opened by the import), the
    # runtime loaded afterwards, then a device opened.
    code = f"""
import rocm_safe
from rocm_safe import _native
import ctypes
ctypes.CDLL({str(standins[6])!r}, mode=ctypes.RTLD_GLOBAL)
{OPEN_DEVICE}
"""
    out = run(code, ROCM_SAFE_HIP_RUNTIME=standins[7])
    count, paths = out[-1].split(" ", 1)
    assert count == "1" and paths == str(standins[6]), out


def test_import_maps_no_runtime_and_the_variable_is_honoured(standins):
    # Importing maps nothing; opening a device with only the variable set
    # maps exactly that file.
    code = """
import rocm_safe
""" + COUNT + OPEN_DEVICE
    out = run(code, ROCM_SAFE_HIP_RUNTIME=standins[7])
    assert out[-2].split(" ")[0] == "0", out
    count, paths = out[-1].split(" ", 1)
    assert count == "1" and paths == str(standins[7]), out


def test_without_any_runtime_the_cpu_works_and_the_device_error_lists_the_places(tmp_path):
    if Path("/opt/rocm/lib").is_dir():
        pytest.skip("a ROCm in /opt/rocm would be found")
    import ctypes.util

    system = ctypes.util.find_library("amdhip64")
    if system:
        # e.g. the H200 machines' ROCm 5.7 libamdhip64.so.5 in
        # /lib/x86_64-linux-gnu: the dynamic loader finds it.
        pytest.skip(f"a HIP runtime on the loader's path would be found ({system})")
    st = tmp_path / "t.safetensors"
    code = f"""
import numpy as np
import rocm_safe
from rocm_safe.numpy import save_file, load_file
save_file({{"x": np.arange(6, dtype=np.float32)}}, {str(st)!r})
assert load_file({str(st)!r})["x"].tolist() == [0, 1, 2, 3, 4, 5]
from rocm_safe import _native
try:
    _native.device_owned_bytes("cuda:0", "hip")
except RuntimeError as e:
    msg = str(e)
    assert "runtime not available" in msg and "ROCM_SAFE_HIP_RUNTIME" in msg, msg
    assert "libamdhip64.so.7" in msg and "/opt/rocm/lib" in msg, msg
else:
    raise AssertionError("a HIP device opened without a runtime")
"""
    out = run(code, ROCM_SAFE_HIP_RUNTIME=tmp_path / "no-such-runtime")
    assert out[-1].split(" ")[0] == "0", out
