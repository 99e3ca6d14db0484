"""The sdist's (and ``pip install ./python``'s) build backend,
python/_build/rocm_safe_build.py: which features a build from source
chooses for the machine that builds, over every kind of machine (the
choice is a pure function of what the machine shows), and the probe over a
fake sysfs tree. No wheel is built here."""

import importlib.util
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "_build" / "rocm_safe_build.py"


@pytest.fixture(scope="module")
def b():
    if not PATH.is_file():
        pytest.skip("no python/_build (an installed copy of the tests)")
    spec = importlib.util.spec_from_file_location("rocm_safe_build", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CLANG = "/usr/bin/clang-19"


@pytest.mark.parametrize(
    "machine, env, features, arch_env, says",
    [
        (dict(amd_archs=(), wsl_amd=False, nvidia=False, hip_compiler=CLANG), {}, (), None, "CPU-only"),
        (dict(amd_archs=(), wsl_amd=False, nvidia=True, hip_compiler=None), {}, ("cuda",), None, "NVIDIA"),
        (dict(amd_archs=("gfx1151",), wsl_amd=False, nvidia=False, hip_compiler=CLANG), {}, ("hip",), "gfx1151", "this machine's archs"),
        (dict(amd_archs=("gfx1100", "gfx1151"), wsl_amd=False, nvidia=True, hip_compiler=CLANG), {}, ("cuda", "hip"), "gfx1100,gfx1151", "gfx1100,gfx1151"),
        (dict(amd_archs=("gfx1151",), wsl_amd=False, nvidia=False, hip_compiler=None), {}, (), None, "WITHOUT hip"),
        (dict(amd_archs=("gfx1151",), wsl_amd=False, nvidia=False, hip_compiler=CLANG), {"ROCM_SAFE_OFFLOAD_ARCH": "gfx942"}, ("hip",), None, "archs given"),
        (dict(amd_archs=(), wsl_amd=True, nvidia=False, hip_compiler=CLANG), {}, ("hip",), None, "WSL2"),
        (dict(amd_archs=(), wsl_amd=False, nvidia=False, hip_compiler=None), {"ROCM_SAFE_WHEEL": "all"}, ("cuda", "hip"), None, "one wheel"),
    ],
)
def test_a_build_from_source_is_for_this_machine(b, machine, env, features, arch_env, says):
    p = b.plan(b.Machine(**machine), env)
    assert p.features == features, p
    assert p.env.get("ROCM_SAFE_OFFLOAD_ARCH") == arch_env, p
    assert any(says in n for n in p.notes), p


def test_the_probe_reads_the_kfd_topology(b, tmp_path):
    nodes = tmp_path / "sys/class/kfd/kfd/topology/nodes"
    for i, v in ((0, 0), (1, 110501), (2, 110501), (3, 120001)):
        (nodes / str(i)).mkdir(parents=True)
        (nodes / str(i) / "properties").write_text(f"gfx_target_version {v}\n")
    assert b.amd_archs(str(tmp_path)) == ("gfx1151", "gfx1201")


def test_given_build_args_are_used_as_they_are(b, monkeypatch):
    monkeypatch.setenv("MATURIN_PEP517_ARGS", "--features cuda")
    b._apply(None)
    import os

    assert os.environ["MATURIN_PEP517_ARGS"] == "--features cuda"
