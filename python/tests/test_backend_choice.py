"""The backend chosen at import (rocm_safe/_backend.py): the rules over
every combination of machine, process and torch (the decision is a pure
function of the facts), the probes over fake sysfs/proc trees, what
``features()``, ``backend()`` and ``doctor()`` report, and, for a wheel with
``hip``, the choice over the stand-in HIP runtime (tests/hip-standin) in
fresh interpreters."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import rocm_safe
from rocm_safe import _backend as B

BOTH = ("cuda", "hip")
NONE = B.Facts(
    built=BOTH, forced=None, torch_imported=False, torch_hip=None, torch_cuda=None,
    hip_mapped=(), cuda_mapped=(), hip_runtime=None, cuda_driver=None,
    amd_gpus=(), nvidia_gpus=0, wsl_dxg=False, rocdxg=None,
)
AMD = dict(amd_gpus=("gfx1151",), hip_runtime="/opt/rocm/lib/libamdhip64.so.7")
NV = dict(nvidia_gpus=1, cuda_driver="/usr/lib/x86_64-linux-gnu/libcuda.so.1")
TORCH_ROCM = dict(torch_imported=True, torch_hip="7.0.51831")
TORCH_CUDA = dict(torch_imported=True, torch_cuda="12.8")
TORCH_CPU = dict(torch_imported=True)


def facts(**kw):
    return NONE._replace(**kw)


@pytest.mark.parametrize(
    "kw, want, says",
    [
        ({}, "cpu", "no AMD GPU"),
        (AMD, "hip", "gfx1151"),
        (NV, "cuda", "NVIDIA"),
        ({**AMD, **NV}, "hip", "HIP first"),
        ({**AMD, **NV, **TORCH_ROCM}, "hip", "ROCm build"),
        ({**AMD, **NV, **TORCH_CUDA}, "cuda", "CUDA build"),
        ({**AMD, **NV, **TORCH_CPU}, "hip", "CPU build"),
        # A ROCm torch never drives the CUDA path, nor the reverse.
        ({**NV, **TORCH_ROCM}, "cpu", "never serves it with the other"),
        ({**AMD, **TORCH_CUDA}, "cpu", "never serves it with the other"),
        ({**TORCH_CUDA}, "cpu", "no NVIDIA GPU"),
        # A GPU without its runtime, a runtime without its GPU.
        ({"amd_gpus": ("gfx1100",)}, "cpu", "no HIP runtime"),
        ({"hip_runtime": "/opt/rocm/lib/libamdhip64.so.6"}, "cpu", "no AMD GPU"),
        ({"nvidia_gpus": 2}, "cpu", "no CUDA driver"),
        # WSL2: /dev/dxg and AMD's bridge, or WSL's libcuda.
        ({"wsl_dxg": True, "rocdxg": "/opt/rocm/lib/librocdxg.so", "hip_runtime": "/opt/rocm/lib/libamdhip64.so.7"}, "hip", "WSL2"),
        ({"wsl_dxg": True, "cuda_driver": "/usr/lib/wsl/lib/libcuda.so.1"}, "cuda", "WSL2"),
        ({"wsl_dxg": True}, "cpu", "librocdxg"),
        # The variable wins; a backend the wheel lacks is refused.
        ({**AMD, "forced": "cpu"}, "cpu", "ROCM_SAFE_BACKEND=cpu"),
        ({"forced": "cuda"}, "cuda", "ROCM_SAFE_BACKEND=cuda"),
        ({"forced": "hip", "built": ("cuda",)}, "cpu", "no 'hip' backend"),
        ({"forced": "tpu"}, "cpu", "not one of"),
        # What the wheel has bounds the choice.
        ({**AMD, "built": ("cuda",)}, "cpu", "no HIP backend"),
        ({**AMD, **NV, "built": ()}, "cpu", "without a GPU backend"),
    ],
)
def test_the_rules(kw, want, says):
    backend, reason = B.decide(facts(**kw))
    assert backend == want and says in reason, (backend, reason)


def test_a_runtime_in_the_process_is_asked_for_its_devices():
    mapped = facts(hip_mapped=("/venv/torch/lib/libamdhip64.so",))
    asked = []

    def lister(kind):
        asked.append(kind)
        return (["gfx1151"], None)

    backend, reason = B.decide(mapped, lister)
    assert backend == "hip" and "already in this process" in reason and "gfx1151" in reason
    assert asked == ["hip"]
    # It sees no device: the CPU, with the runtime's own words.
    backend, reason = B.decide(mapped, lambda kind: ([], "no HIP device"))
    assert backend == "cpu" and "no HIP device" in reason


def test_probes_read_fake_trees(tmp_path):
    nodes = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    for i, version in ((0, 0), (1, 110501), (2, 90010)):
        (nodes / str(i)).mkdir(parents=True)
        (nodes / str(i) / "properties").write_text(f"cpu_cores_count 16\ngfx_target_version {version}\n")
    assert B.kfd_gpus(str(tmp_path)) == ("gfx1151", "gfx90a")
    assert B.kfd_gpus(str(tmp_path / "nowhere")) == ()
    gpus = tmp_path / "proc/driver/nvidia/gpus"
    (gpus / "0000:01:00.0").mkdir(parents=True)
    assert B.nvidia_gpus(str(tmp_path)) == 1
    maps = (
        "7f00-7f01 r-xp 00000000 08:01 12 /opt/rocm/lib/libamdhip64.so.7.1.0\n"
        "7f01-7f02 r--p 00001000 08:01 12 /opt/rocm/lib/libamdhip64.so.7.1.0\n"
        "7f02-7f03 rw-p 00000000 00:00 0 [heap]\n"
    )
    assert B.mapped(maps, "libamdhip64.so") == ("/opt/rocm/lib/libamdhip64.so.7.1.0",)
    assert B.gfx_name(100300) == "gfx1030" and B.gfx_name(0) is None


def test_the_hip_runtime_search_names_the_variables_file(tmp_path):
    lib = tmp_path / "libamdhip64.so.6"
    lib.write_bytes(b"")
    assert B.find_hip_runtime({"ROCM_SAFE_HIP_RUNTIME": str(lib)}) == str(lib)
    assert B.find_hip_runtime({"ROCM_SAFE_HIP_RUNTIME": str(tmp_path)}) == str(lib)
    # A name that holds no runtime is passed over (the search goes on).
    assert B.find_hip_runtime({"ROCM_SAFE_HIP_RUNTIME": str(tmp_path / "none")}) != str(tmp_path / "none")
    assert B.find_hip_runtime({"ROCM_PATH": str(tmp_path.parent), "LD_LIBRARY_PATH": str(tmp_path)}) == str(lib)


def test_features_backend_and_doctor_say_the_same():
    f = rocm_safe.features()
    assert isinstance(f, list) and set(f) <= {"cuda", "hip", "testing"}
    choice = rocm_safe.backend()
    assert f.backend == choice.backend in ("hip", "cuda", "cpu") and f.reason == choice.reason
    assert choice.built == tuple(sorted(set(f) & {"cuda", "hip"}))
    assert "backend=" in repr(f)
    report = json.loads(rocm_safe.doctor(json=True))
    assert report["backend_choice"]["backend"] == choice.backend
    assert report["backend_choice"]["evidence"] and report["schema_version"] >= 5


def test_on_this_machine_without_a_gpu_the_choice_is_the_cpu():
    # CI: no GPU, no ROCm, no NVIDIA driver.
    if B.kfd_gpus() or B.nvidia_gpus() or os.path.exists("/dev/dxg") or os.environ.get(B.BACKEND_VAR):
        pytest.skip("a GPU (or a forced backend) here")
    choice = rocm_safe.backend(refresh=True)
    assert choice.backend == "cpu", choice
    if choice.built:
        from rocm_safe import _native

        with pytest.raises(RuntimeError, match="no GPU backend serves this process"):
            _native.device_owned_bytes("cuda:0")


# ------------------------------------------------ over the stand-in runtime

STANDIN = Path(__file__).resolve().parents[2] / "tests" / "hip-standin" / "standin.c"
# An NVIDIA GPU with its driver here (the GPU machine): CUDA is then chosen
# where the stand-in HIP runtime is not.
NVIDIA_HERE = "cuda" in rocm_safe.features() and (
    (B.nvidia_gpus() > 0 and B.find_cuda_driver() is not None)
    or (os.path.exists("/dev/dxg") and (B.find_cuda_driver() or "").startswith("/usr/lib/wsl/lib/"))
)
CLEARED = ["ROCM_SAFE_HIP_RUNTIME", "ROCM_PATH", "HIP_PATH", "HSA_OVERRIDE_GFX_VERSION", "HIP_VISIBLE_DEVICES",
           "ROCR_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "LD_PRELOAD", B.BACKEND_VAR]


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    if "hip" not in rocm_safe.features():
        pytest.skip("wheel built without hip")
    prebuilt = os.environ.get("ROCM_SAFE_TEST_STANDIN")  # see test_hip_runtime.py
    if prebuilt:
        return Path(prebuilt) / "so7" / "libamdhip64.so.7"
    import shutil

    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or not STANDIN.is_file():
        pytest.skip("no C compiler, or no stand-in source")
    out = tmp_path_factory.mktemp("standin") / "libamdhip64.so.7"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-DSTANDIN_MAJOR=7", "-Wl,-soname,libamdhip64.so.7",
                    "-o", str(out), str(STANDIN), "-lpthread"], check=True)
    return out


def choice_in_child(code_before: str, **env) -> dict:
    child_env = {k: v for k, v in os.environ.items() if k not in CLEARED}
    child_env.update({k: str(v) for k, v in env.items()})
    code = code_before + "\nimport json, rocm_safe\nc = rocm_safe.backend()\nprint(json.dumps(c.to_dict()))\n"
    p = subprocess.run([sys.executable, "-c", code], env=child_env, cwd=Path(__file__).resolve().parents[2],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_over_the_standin_runtime_in_the_process_hip_is_chosen(standin):
    load = f"import ctypes; ctypes.CDLL({str(standin)!r}, mode=ctypes.RTLD_GLOBAL)"
    c = choice_in_child(load)
    assert c["backend"] == "hip" and "already in this process" in c["reason"] and "1 device(s)" in c["reason"], c
    # The arch comes from the KFD topology (none here) or the override.
    c = choice_in_child(load, HSA_OVERRIDE_GFX_VERSION="11.5.1")
    assert c["backend"] == "hip" and "1 device(s): gfx1151" in c["reason"], c
    # A ROCm torch in the process: HIP, following torch.
    fake_rocm_torch = load + "\nimport sys, types\nt = types.ModuleType('torch'); t.version = types.SimpleNamespace(hip='7.1.0', cuda=None); sys.modules['torch'] = t"
    c = choice_in_child(fake_rocm_torch)
    assert c["backend"] == "hip" and "ROCm build" in c["reason"], c
    # A CUDA torch with only an AMD GPU (the stand-in): never HIP for it.
    fake_cuda_torch = load + "\nimport sys, types\nt = types.ModuleType('torch'); t.version = types.SimpleNamespace(hip=None, cuda='12.8'); sys.modules['torch'] = t"
    c = choice_in_child(fake_cuda_torch)
    assert c["backend"] in ("cpu", "cuda") and c["backend"] != "hip", c
    # The stand-in with no device: not HIP; the CPU here, saying why (CUDA
    # on a machine with an NVIDIA GPU).
    c = choice_in_child(load, ROCM_SAFE_STANDIN_DEVICES=0)
    if NVIDIA_HERE:
        assert c["backend"] == "cuda", c
    else:
        assert c["backend"] == "cpu" and "sees no device" in c["reason"], c


def test_a_runtime_file_without_an_amd_gpu_is_not_loaded_at_import(standin):
    if B.kfd_gpus():
        pytest.skip("an AMD GPU here")
    code = "import rocm_safe\nassert not [l for l in open('/proc/self/maps') if 'libamdhip64' in l]"
    c = choice_in_child(code, ROCM_SAFE_HIP_RUNTIME=standin)
    assert c["backend"] == ("cuda" if NVIDIA_HERE else "cpu") and str(standin) in " ".join(c["evidence"]), c
    # Forced: HIP, and a device asked for without a backend opens over the
    # stand-in.
    opens = "import rocm_safe\nfrom rocm_safe import _native\nassert _native.device_owned_bytes('cuda:0') == 0"
    c = choice_in_child(opens, ROCM_SAFE_HIP_RUNTIME=standin, ROCM_SAFE_BACKEND="hip")
    assert c["backend"] == "hip", c
