"""Which GPU backend this process's ``rocm_safe`` serves, chosen at import.

One wheel carries both GPU backends (``hip`` and ``cuda``, each loading its
runtime only when a device is first asked for). Which one ``"cuda:N"``
means is chosen here, from what the machine and the process show, without
loading any runtime (a runtime loaded at import could be a second copy
beside the one PyTorch brings):

1. ``ROCM_SAFE_BACKEND`` (``hip``, ``cuda`` or ``cpu``), when set;
2. what each backend has here: a runtime already in the process (a
   ``libamdhip64`` or ``libcuda`` mapped), asked for its devices (it is the
   one rocm_safe would use); else the machine's files: an AMD GPU (a GPU
   node of the KFD topology in sysfs) with a HIP runtime rocm_safe can
   find, an NVIDIA GPU (``/proc/driver/nvidia/gpus``) with a ``libcuda``;
   under WSL2, where there is no KFD and no NVIDIA ``/proc`` entry,
   ``/dev/dxg`` with AMD's ``librocdxg`` (HIP) or
   ``/usr/lib/wsl/lib/libcuda.so.1`` (CUDA) stands for the GPU;
3. PyTorch, when it is already imported, decides between them: a ROCm build
   (``torch.version.hip``) means HIP, a CUDA build (``torch.version.cuda``)
   CUDA, and the CPU when that backend has nothing here: a ROCm torch never
   drives the CUDA path, nor the reverse;
4. without torch (or with a CPU build of torch): the backend that has a GPU
   and its runtime; both: HIP first (the crate's order);
5. else the CPU.

The choice is made again when PyTorch was imported after rocm_safe (rule 2
then applies). :func:`choose` returns it with the reason and every finding;
``rocm_safe.features()``, ``rocm_safe.backend()`` and ``rocm_safe.doctor()``
report it.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import sys
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

#: The variable that forces a backend (``hip``, ``cuda`` or ``cpu``).
BACKEND_VAR = "ROCM_SAFE_BACKEND"

#: The HIP runtime's file names, newest major first (as the crate's loader).
HIP_SONAMES = ("libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so")
#: The CUDA driver's file names.
CUDA_SONAMES = ("libcuda.so.1", "libcuda.so")


class Choice(NamedTuple):
    """The backend ``"cuda:N"`` means in this process, and why."""

    #: ``"hip"``, ``"cuda"`` or ``"cpu"``.
    backend: str
    #: One sentence: what decided it.
    reason: str
    #: The GPU backends this wheel was built with (``("cuda", "hip")`` for
    #: the one wheel).
    built: Tuple[str, ...]
    #: What each probe found, one line each (the doctor prints them).
    evidence: Tuple[str, ...]

    def to_dict(self) -> Dict[str, Any]:
        """The choice as a JSON-ready dict (``rocm_safe.doctor()``'s
        ``"backend_choice"``)."""
        return {
            "backend": self.backend,
            "reason": self.reason,
            "built": list(self.built),
            "evidence": list(self.evidence),
        }


class Facts(NamedTuple):
    """What the probes found (each from files only: nothing is loaded)."""

    #: GPU backends built into the wheel.
    built: Tuple[str, ...]
    #: ``ROCM_SAFE_BACKEND``'s value, lower case, or ``None``.
    forced: Optional[str]
    #: Whether torch is imported in this process.
    torch_imported: bool
    #: ``torch.version.hip`` when imported (``None`` otherwise).
    torch_hip: Optional[str]
    #: ``torch.version.cuda`` when imported (``None`` otherwise).
    torch_cuda: Optional[str]
    #: The ``libamdhip64`` files mapped in this process.
    hip_mapped: Tuple[str, ...]
    #: The ``libcuda`` files mapped in this process.
    cuda_mapped: Tuple[str, ...]
    #: The HIP runtime file rocm_safe would load (the first found), or ``None``.
    hip_runtime: Optional[str]
    #: The CUDA driver file found, or ``None``.
    cuda_driver: Optional[str]
    #: gfx archs of the KFD topology's GPU nodes (``["gfx1151"]``).
    amd_gpus: Tuple[str, ...]
    #: Number of NVIDIA GPUs the driver lists.
    nvidia_gpus: int
    #: Whether ``/dev/dxg`` exists (WSL2's GPU paravirtualisation).
    wsl_dxg: bool
    #: AMD's WSL2 bridge library (``librocdxg``) found, or ``None``.
    rocdxg: Optional[str]


# --------------------------------------------------------------- probes


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def mapped(maps_text: str, stem: str) -> Tuple[str, ...]:
    """The distinct files of ``/proc/self/maps``'s text whose name starts
    with ``stem`` (``"libamdhip64.so"``)."""
    seen: List[str] = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if path.startswith("/") and os.path.basename(path).startswith(stem) and path not in seen:
                seen.append(path)
    return tuple(seen)


def gfx_name(target_version: int) -> Optional[str]:
    """The gfx name of a KFD ``gfx_target_version`` (``110501`` ->
    ``"gfx1151"``, ``90010`` -> ``"gfx90a"``); ``None`` for 0 (a CPU node)."""
    if target_version <= 0:
        return None
    major, minor, step = target_version // 10000, (target_version // 100) % 100, target_version % 100
    return f"gfx{major}{minor:x}{step:x}"


def kfd_gpus(root: str = "/") -> Tuple[str, ...]:
    """The gfx archs of the GPU nodes of ``<root>/sys/class/kfd/kfd/topology/nodes``,
    in node order."""
    nodes = os.path.join(root, "sys/class/kfd/kfd/topology/nodes")
    found: List[Tuple[int, str]] = []
    for d in glob.glob(os.path.join(nodes, "*")):
        name = os.path.basename(d)
        if not name.isdigit():
            continue
        m = re.search(r"^gfx_target_version\s+(\d+)", _read(os.path.join(d, "properties")), re.M)
        arch = gfx_name(int(m.group(1))) if m else None
        if arch:
            found.append((int(name), arch))
    return tuple(a for _, a in sorted(found))


def nvidia_gpus(root: str = "/") -> int:
    """How many GPUs the NVIDIA kernel driver lists (``/proc/driver/nvidia/gpus``)."""
    return len(glob.glob(os.path.join(root, "proc/driver/nvidia/gpus/*")))


def _ld_cache_paths(stem: str, cache: str = "/etc/ld.so.cache") -> List[str]:
    """Paths of ``stem*`` files listed in the dynamic loader's cache (its
    strings, read without running ``ldconfig``)."""
    try:
        with open(cache, "rb") as f:
            data = f.read()
    except OSError:
        return []
    pat = re.compile(rb"/[^\x00]*/" + re.escape(stem.encode()) + rb"[^\x00/]*")
    return sorted({m.group(0).decode(errors="replace") for m in pat.finditer(data)})


def _site_dirs() -> List[str]:
    return [p for p in sys.path if p and os.path.basename(p) in ("site-packages", "dist-packages")]


def _first_file(folders: Sequence[str], names: Sequence[str]) -> Optional[str]:
    for folder in folders:
        for n in names:
            p = os.path.join(folder, n)
            if os.path.isfile(p):
                return p
    return None


def find_hip_runtime(env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The HIP runtime file rocm_safe would load, found in the crate
    loader's places without loading it: ``$ROCM_SAFE_HIP_RUNTIME`` (a file
    or a folder), ``$ROCM_PATH/lib``, ``$HIP_PATH/lib``, ``$LD_LIBRARY_PATH``,
    the loader's cache, ``/opt/rocm/lib``, TheRock's pip SDK
    (``_rocm_sdk_core/lib``), and a ROCm build of PyTorch's own ``torch/lib``
    (installed, not imported)."""
    env = dict(os.environ) if env is None else env
    named = env.get("ROCM_SAFE_HIP_RUNTIME", "")
    if named and os.path.isfile(named):
        return named
    # A folder named by the variable first; a name that holds no runtime is
    # passed over, as the loader does.
    folders = [named] if named else []
    folders += [os.path.join(env[v], "lib") for v in ("ROCM_PATH", "HIP_PATH") if env.get(v)]
    folders += [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    found = _first_file(folders, HIP_SONAMES)
    if found:
        return found
    cached = _ld_cache_paths("libamdhip64.so")
    if cached:
        return cached[0]
    later = ["/opt/rocm/lib"]
    for site in _site_dirs():
        later += sorted(glob.glob(os.path.join(site, "_rocm_sdk_core*", "lib")))
    spec = importlib.util.find_spec("torch") if "torch" not in sys.modules else None
    if spec is not None and spec.origin:
        later.append(os.path.join(os.path.dirname(spec.origin), "lib"))
    return _first_file(later, HIP_SONAMES)


def find_cuda_driver(env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """The CUDA driver library (``libcuda``) the loader would find:
    ``$LD_LIBRARY_PATH``, the loader's cache, WSL2's ``/usr/lib/wsl/lib``,
    the usual library folders."""
    env = dict(os.environ) if env is None else env
    folders = [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    found = _first_file(folders, CUDA_SONAMES)
    if found:
        return found
    cached = _ld_cache_paths("libcuda.so")
    if cached:
        return cached[0]
    return _first_file(
        ["/usr/lib/wsl/lib", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"],
        CUDA_SONAMES,
    )


def find_rocdxg(env: Optional[Dict[str, str]] = None) -> Optional[str]:
    """AMD's ROCm-on-WSL2 bridge (``librocdxg.so``, the thunk the HSA
    runtime uses over ``/dev/dxg``): ``$ROCM_PATH/lib``, ``$LD_LIBRARY_PATH``,
    the loader's cache, ``/opt/rocm/lib``."""
    env = dict(os.environ) if env is None else env
    folders = [os.path.join(env["ROCM_PATH"], "lib")] if env.get("ROCM_PATH") else []
    folders += [p for p in env.get("LD_LIBRARY_PATH", "").split(":") if p]
    found = _first_file(folders, ("librocdxg.so.1", "librocdxg.so"))
    if found:
        return found
    cached = _ld_cache_paths("librocdxg.so")
    return cached[0] if cached else _first_file(["/opt/rocm/lib"], ("librocdxg.so.1", "librocdxg.so"))


def gather(native_features: Sequence[str]) -> Facts:
    """Every probe, on this machine and process."""
    torch = sys.modules.get("torch")
    version = getattr(torch, "version", None)
    maps = _read("/proc/self/maps")
    forced = os.environ.get(BACKEND_VAR, "").strip().lower() or None
    return Facts(
        built=tuple(sorted(set(native_features) & {"hip", "cuda"})),
        forced=forced,
        torch_imported=torch is not None,
        torch_hip=getattr(version, "hip", None) or None,
        torch_cuda=getattr(version, "cuda", None) or None,
        hip_mapped=mapped(maps, "libamdhip64.so"),
        cuda_mapped=mapped(maps, "libcuda.so"),
        hip_runtime=find_hip_runtime(),
        cuda_driver=find_cuda_driver(),
        amd_gpus=kfd_gpus(),
        nvidia_gpus=nvidia_gpus(),
        wsl_dxg=os.path.exists("/dev/dxg"),
        rocdxg=find_rocdxg(),
    )


# ------------------------------------------------------------- decision

#: Asks an already-loaded runtime for its devices: ``(backend) -> (archs,
#: error)``. The default asks the native module (``_native.gpu_devices``).
DeviceLister = Callable[[str], Tuple[List[str], Optional[str]]]


def evidence(f: Facts) -> Tuple[str, ...]:
    """The findings, one line each."""
    lines = [
        "built: " + (", ".join(f.built) if f.built else "no GPU backend (CPU only)"),
        f"{BACKEND_VAR}: " + (f.forced or "unset"),
    ]
    if f.torch_imported:
        lines.append(f"torch: imported, version.hip={f.torch_hip}, version.cuda={f.torch_cuda}")
    else:
        lines.append("torch: not imported")
    lines.append("HIP runtime in this process: " + ("; ".join(f.hip_mapped) or "none"))
    lines.append("CUDA driver in this process: " + ("; ".join(f.cuda_mapped) or "none"))
    lines.append("HIP runtime found: " + (f.hip_runtime or "none"))
    lines.append("CUDA driver found: " + (f.cuda_driver or "none"))
    lines.append("AMD GPUs (KFD topology): " + (", ".join(f.amd_gpus) or "none"))
    lines.append(f"NVIDIA GPUs (/proc/driver/nvidia): {f.nvidia_gpus}")
    if f.wsl_dxg:
        lines.append("/dev/dxg: present (WSL2 GPU paravirtualisation); librocdxg: " + (f.rocdxg or "none"))
    return tuple(lines)


def decide(f: Facts, list_devices: Optional[DeviceLister] = None) -> Tuple[str, str]:
    """``(backend, reason)`` from the facts, by the module's rules.
    ``list_devices`` asks a runtime already in the process for its devices
    (rule 2); without it only the files count."""
    hip_built, cuda_built = "hip" in f.built, "cuda" in f.built
    if f.forced:
        if f.forced == "cpu":
            return "cpu", f"{BACKEND_VAR}=cpu"
        if f.forced in f.built:
            return f.forced, f"{BACKEND_VAR}={f.forced}"
        return "cpu", (
            f"{BACKEND_VAR}={f.forced}, but this rocm_safe has no {f.forced!r} backend"
            if f.forced in ("hip", "cuda")
            else f"{BACKEND_VAR}={f.forced!r} is not one of hip, cuda, cpu"
        )
    if not f.built:
        return "cpu", "this rocm_safe was built without a GPU backend"
    # What each backend has here: (usable, why), from a runtime already in
    # the process (asked for its devices) or from the machine's files.
    seen: Dict[str, Tuple[bool, str]] = {}
    wsl_amd = f.wsl_dxg and f.rocdxg is not None
    wsl_nvidia = f.wsl_dxg and (f.cuda_driver or "").startswith("/usr/lib/wsl/lib/")
    amd = ", ".join(f.amd_gpus) if f.amd_gpus else ("through WSL2's /dev/dxg" if wsl_amd else "")
    nvidia = f"{f.nvidia_gpus} NVIDIA GPU(s)" if f.nvidia_gpus else ("an NVIDIA GPU through WSL2's /dev/dxg" if wsl_nvidia else "")
    for kind, built, files, gpus, runtime, what in (
        ("hip", hip_built, f.hip_mapped, amd, f.hip_runtime, "HIP runtime"),
        ("cuda", cuda_built, f.cuda_mapped, nvidia, f.cuda_driver, "CUDA driver"),
    ):
        if not built:
            seen[kind] = (False, f"this rocm_safe has no {kind.upper()} backend")
            continue
        if files and list_devices is not None:
            archs, err = list_devices(kind)
            if archs:
                seen[kind] = (True, f"the {what} already in this process ({files[0]}) has {len(archs)} device(s): {', '.join(archs)}")
                continue
            if err:
                seen[kind] = (False, f"the {what} already in this process ({files[0]}) sees no device: {err}")
                continue
        label = "AMD GPU(s) " + gpus if kind == "hip" and gpus else gpus
        if gpus and (runtime or files):
            seen[kind] = (True, f"{label} and a {what} ({runtime or files[0]})")
        elif gpus:
            seen[kind] = (False, f"{label} but no {what} found" + (" (ROCm, TheRock's rocm-sdk, a ROCm torch)" if kind == "hip" else ""))
        elif runtime:
            seen[kind] = (False, f"a {what} ({runtime}) but no " + ("AMD GPU (no KFD GPU node, no WSL2 librocdxg)" if kind == "hip" else "NVIDIA GPU"))
        else:
            seen[kind] = (False, ("no AMD GPU with a HIP runtime" if kind == "hip" else "no NVIDIA GPU with its driver"))
    if f.torch_hip or f.torch_cuda:
        kind = "hip" if f.torch_hip else "cuda"
        build = f"ROCm build (HIP {f.torch_hip})" if f.torch_hip else f"CUDA build (CUDA {f.torch_cuda})"
        ok, why = seen[kind]
        if ok:
            return kind, f"torch is a {build}, and {why}: rocm_safe follows torch"
        return "cpu", f"torch is a {build}, but {why}; rocm_safe never serves it with the other backend"
    note = " (torch is a CPU build)" if f.torch_imported else ""
    (hip_ok, hip_why), (cuda_ok, cuda_why) = seen["hip"], seen["cuda"]
    if hip_ok and cuda_ok:
        return "hip", f"{hip_why}; {cuda_why}; torch not telling{note}: HIP first (import torch first, or set {BACKEND_VAR})"
    if hip_ok:
        return "hip", hip_why + note
    if cuda_ok:
        return "cuda", cuda_why + note
    why = [hip_why, cuda_why]
    if f.wsl_dxg and not amd and not nvidia:
        why.append("WSL2's /dev/dxg, but neither AMD's librocdxg nor /usr/lib/wsl/lib/libcuda.so.1")
    return "cpu", "; ".join(why) + note


def _native_devices(kind: str) -> Tuple[List[str], Optional[str]]:
    from . import _native

    try:
        return [arch for _, _, arch in _native.gpu_devices(kind)], None
    except Exception as e:  # noqa: BLE001 - a runtime's error is a finding, not a failure
        return [], str(e)


_cache: List[Tuple[bool, Choice]] = []


def choose(native_features: Sequence[str], refresh: bool = False) -> Choice:
    """The choice for this process: made at import, made again when torch
    was imported since (or with ``refresh``). Sets the native default, so
    that a ``"cuda:N"`` asked for without a backend is this one."""
    torch_now = "torch" in sys.modules
    if _cache and not refresh and _cache[0][0] == torch_now:
        return _cache[0][1]
    facts = gather(native_features)
    backend, reason = decide(facts, _native_devices)
    choice = Choice(backend, reason, facts.built, evidence(facts))
    from . import _native

    _native.set_default_backend(backend, reason)
    _cache[:] = [(torch_now, choice)]
    return choice
