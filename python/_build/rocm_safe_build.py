"""The PEP 517 build backend of ``pip install ./python`` and of the sdist:
maturin's, with the cargo features chosen for the machine that builds.

A wheel built from source is for the machine it is built on (the one wheel
for every machine is ``scripts/build-wheel.sh``'s, see README.md):

- ``cuda`` when an NVIDIA GPU is here (``/proc/driver/nvidia/gpus``, or
  WSL2's ``/usr/lib/wsl/lib/libcuda.so.1``): building it needs nothing more;
- ``hip`` when an AMD GPU is here (the KFD topology in sysfs, or WSL2's
  ``/dev/dxg`` with AMD's ``librocdxg``) and a HIP kernel compiler is found
  (clang >= 19 with lld, or ROCm's hipcc), with code objects for this
  machine's archs only (``ROCM_SAFE_OFFLOAD_ARCH``: one compile per arch,
  not the twelve of the one wheel); an AMD GPU without a compiler builds
  without ``hip`` and says so;
- neither: the CPU-only build.

``MATURIN_PEP517_ARGS`` (or ``--config-settings build-args=...``), when
given, is used as it is: nothing is chosen. ``ROCM_SAFE_WHEEL=all`` asks
for the one wheel's features (``hip,cuda``, every default arch).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

class Machine(NamedTuple):
    """What the build machine has (read from files; nothing is loaded)."""

    #: gfx archs of the KFD topology's GPU nodes.
    amd_archs: Tuple[str, ...]
    #: Whether WSL2's /dev/dxg and AMD's librocdxg are both here.
    wsl_amd: bool
    #: Whether an NVIDIA GPU is here.
    nvidia: bool
    #: The HIP kernel compiler found (a description), or None.
    hip_compiler: Optional[str]


class Plan(NamedTuple):
    """The features and environment of the build, and why."""

    features: Tuple[str, ...]
    env: Dict[str, str]
    notes: Tuple[str, ...]


def _gfx(target_version: int) -> Optional[str]:
    if target_version <= 0:
        return None
    return f"gfx{target_version // 10000}{(target_version // 100) % 100:x}{target_version % 100:x}"


def amd_archs(root: str = "/") -> Tuple[str, ...]:
    """The distinct gfx archs of ``<root>/sys/class/kfd/kfd/topology/nodes``."""
    out: List[str] = []
    for props in sorted(glob.glob(os.path.join(root, "sys/class/kfd/kfd/topology/nodes/*/properties"))):
        try:
            with open(props, encoding="utf-8", errors="replace") as f:
                m = re.search(r"^gfx_target_version\s+(\d+)", f.read(), re.M)
        except OSError:
            continue
        arch = _gfx(int(m.group(1))) if m else None
        if arch and arch not in out:
            out.append(arch)
    return tuple(out)


def hip_compiler() -> Optional[str]:
    """A compiler build.rs can use for the HIP kernels, as it looks for
    them: ``$ROCM_SAFE_HIP_CLANG``, a hipcc, a clang >= 19 with ``ld.lld``."""
    if os.environ.get("ROCM_SAFE_HIP_CLANG"):
        return os.environ["ROCM_SAFE_HIP_CLANG"]
    for d in [os.environ.get("ROCM_PATH", ""), os.environ.get("HIP_PATH", ""), "/opt/rocm"]:
        if d and os.path.isfile(os.path.join(d, "bin", "hipcc")):
            return os.path.join(d, "bin", "hipcc")
    names = ["clang"] + [f"clang-{n}" for n in range(40, 18, -1)]
    lld = shutil.which("ld.lld") or any(shutil.which(f"ld.lld-{n}") for n in range(40, 18, -1))
    for n in names:
        path = shutil.which(n)
        if not path:
            continue
        try:
            text = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        m = re.search(r"clang version (\d+)", text)
        if m and int(m.group(1)) >= 19 and lld:
            return path
    return shutil.which("hipcc")


def this_machine() -> Machine:
    """The build machine."""
    return Machine(
        amd_archs=amd_archs(),
        wsl_amd=os.path.exists("/dev/dxg")
        and any(os.path.exists(os.path.join(d, "librocdxg.so")) for d in ("/opt/rocm/lib", "/usr/lib", "/usr/local/lib")),
        nvidia=bool(glob.glob("/proc/driver/nvidia/gpus/*")) or os.path.exists("/usr/lib/wsl/lib/libcuda.so.1"),
        hip_compiler=hip_compiler(),
    )


def plan(m: Machine, env: Mapping[str, str]) -> Plan:
    """The build for machine ``m`` with the environment ``env``."""
    if env.get("ROCM_SAFE_WHEEL", "").strip().lower() == "all":
        return Plan(("cuda", "hip"), {}, ("ROCM_SAFE_WHEEL=all: the one wheel's features, every default arch",))
    features: List[str] = []
    extra: Dict[str, str] = {}
    notes: List[str] = []
    if m.nvidia:
        features.append("cuda")
        notes.append("an NVIDIA GPU here: feature cuda")
    if m.amd_archs or m.wsl_amd:
        if m.hip_compiler is None:
            notes.append(
                "an AMD GPU here, but no HIP kernel compiler (clang >= 19 with lld: `apt install clang-19 lld-19`, "
                "or ROCm's hipcc): built WITHOUT hip; install one and build again, or install the one wheel"
            )
        else:
            features.append("hip")
            given = env.get("ROCM_SAFE_OFFLOAD_ARCH") or env.get("PYTORCH_ROCM_ARCH")
            if given:
                notes.append(f"feature hip, for the archs given ({given})")
            elif m.amd_archs:
                extra["ROCM_SAFE_OFFLOAD_ARCH"] = ",".join(m.amd_archs)
                notes.append(f"feature hip, for this machine's archs: {','.join(m.amd_archs)} ({m.hip_compiler})")
            else:
                notes.append("feature hip (WSL2: no KFD topology names the arch; every default arch is built)")
    if not features:
        notes.append("no GPU here: the CPU-only build")
    return Plan(tuple(sorted(features)), extra, tuple(notes))


def _apply(config_settings: Optional[Mapping[str, Any]]) -> None:
    """Sets ``MATURIN_PEP517_ARGS`` (and the arch list) for this machine,
    unless the caller gave build arguments."""
    given = config_settings and ("maturin.build-args" in config_settings or "build-args" in config_settings)
    if given or os.environ.get("MATURIN_PEP517_ARGS"):
        print("rocm_safe build: MATURIN_PEP517_ARGS / build-args given; nothing chosen", file=sys.stderr)
        return
    p = plan(this_machine(), os.environ)
    for note in p.notes:
        print(f"rocm_safe build: {note}", file=sys.stderr)
    os.environ.update(p.env)
    if p.features:
        os.environ["MATURIN_PEP517_ARGS"] = "--features " + ",".join(p.features)


def _maturin() -> Any:
    import maturin  # the build requirement; imported only when a hook runs

    return maturin


def build_wheel(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """maturin's ``build_wheel``, with the features of this machine."""
    _apply(config_settings)
    return str(_maturin().build_wheel(wheel_directory, config_settings, metadata_directory))


def build_editable(
    wheel_directory: str,
    config_settings: Optional[Mapping[str, Any]] = None,
    metadata_directory: Optional[str] = None,
) -> str:
    """maturin's ``build_editable``, with the features of this machine."""
    _apply(config_settings)
    return str(_maturin().build_editable(wheel_directory, config_settings, metadata_directory))


def build_sdist(sdist_directory: str, config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """maturin's ``build_sdist`` (the sources: nothing is chosen)."""
    return str(_maturin().build_sdist(sdist_directory, config_settings))


def get_requires_for_build_wheel(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    """maturin's."""
    return list(_maturin().get_requires_for_build_wheel(config_settings))


def get_requires_for_build_sdist(config_settings: Optional[Mapping[str, Any]] = None) -> List[str]:
    """maturin's."""
    return list(_maturin().get_requires_for_build_sdist(config_settings))


def prepare_metadata_for_build_wheel(metadata_directory: str, config_settings: Optional[Mapping[str, Any]] = None) -> str:
    """maturin's (the metadata does not depend on the features)."""
    return str(_maturin().prepare_metadata_for_build_wheel(metadata_directory, config_settings))
