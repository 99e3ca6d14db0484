"""The cuDNN vendor tier inside a PyTorch process: one cuDNN, one NVRTC.

Inside a PyTorch process torch has mapped pip's cuDNN (and often NVRTC)
before rocm-safe asks for them. rocm-safe must use those copies, never map
the system's beside them: a second cuDNN fails every call with
CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH, and the conv3d chain then falls
back past its vendor tier (measured on the H100 before the fix: 627 of 627
calls). Each scenario runs in a fresh interpreter, so that the libraries
the process maps are the ones this scenario made it map, with an empty
kernel cache (NVRTC is then really used). Skipped without torch, without
CUDA, or for a wheel built without ``--features cuda``.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import rocm_safe  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch with CUDA"),
    pytest.mark.skipif("cuda" not in rocm_safe.features(), reason="wheel built without --features cuda"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only (/proc/self/maps)"),
]

# Run in the child: torch's cuDNN conv3d first, then rocm-safe's on CUDA
# tensors; prints what the process maps and what the chain did, as JSON.
CHILD = textwrap.dedent(
    r"""
    import json, os
    import torch
    import torch.nn.functional as F
    from rocm_safe import torch as rt

    def mapped(stem):
        # Distinct files (device, inode) whose name starts with `stem`.
        seen, files = set(), []
        with open("/proc/self/maps") as f:
            for line in f:
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue
                path = parts[5].strip()
                if not os.path.basename(path).startswith(stem):
                    continue
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                key = (st.st_dev, st.st_ino)
                if key not in seen:
                    seen.add(key)
                    files.append(path)
        return files

    torch.backends.cudnn.enabled = True
    torch.backends.cudnn.allow_tf32 = False
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 6, 7, 9, generator=g).cuda()
    w = (torch.randn(8, 8, 3, 3, 3, generator=g) / 15.0).cuda()
    b = torch.randn(8, generator=g).cuda()
    ref = F.conv3d(x, w, b, padding=1)
    torch.cuda.synchronize()
    before = {"cudnn": mapped("libcudnn.so"), "nvrtc": mapped("libnvrtc.so")}

    rt.reset_conv3d_stats()
    outs = [rt.conv3d(x, w, b, padding=1) for _ in range(3)]
    torch.cuda.synchronize()
    report = rt.last_conv3d_report()
    err = max(float((o - ref).abs().max()) for o in outs)
    after = {"cudnn": mapped("libcudnn.so"), "nvrtc": mapped("libnvrtc.so")}
    print(json.dumps({
        "before": before,
        "after": after,
        "report": report,
        "tiers": rt.conv3d_stats()["tiers"],
        "max_abs_err": err,
    }))
    """
)


def run_child(tmp_path):
    env = dict(os.environ)
    # An empty kernel cache: the kernels are compiled by NVRTC here.
    env["ROCM_SAFE_CACHE_DIR"] = str(tmp_path / "kernel-cache")
    for var in ("ROCM_SAFE_CUDNN", "ROCM_SAFE_NVRTC"):
        env.pop(var, None)
    p = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_cudnn_tier_serves_inside_torch_with_one_cudnn_and_one_nvrtc(tmp_path):
    r = run_child(tmp_path)
    # torch's conv3d mapped its cuDNN first.
    assert len(r["before"]["cudnn"]) == 1, r
    # The vendor tier (cuDNN) served every call; nothing fell back.
    cudnn = r["tiers"].get("cudnn", {})
    assert cudnn.get("served") == 3 and cudnn.get("failed") == 0, r
    assert r["report"].startswith("cudnn: served"), r
    assert r["max_abs_err"] < 1e-3, r
    # One cuDNN file: torch's, not a second one beside it.
    assert r["after"]["cudnn"] == r["before"]["cudnn"], r
    # One NVRTC file: torch's if it had one, else the one rocm-safe loaded.
    assert len(r["after"]["nvrtc"]) == 1, r
    if r["before"]["nvrtc"]:
        assert r["after"]["nvrtc"] == r["before"]["nvrtc"], r


def test_doctor_inside_torch_reports_the_files_in_use_and_no_duplicates(tmp_path):
    child = textwrap.dedent(
        """
        import json, torch, torch.nn.functional as F, rocm_safe
        x = torch.randn(1, 4, 5, 5, 5, device="cuda")
        w = torch.randn(4, 4, 3, 3, 3, device="cuda")
        F.conv3d(x, w)
        torch.cuda.synchronize()
        print(json.dumps(json.loads(rocm_safe.doctor(json=True))))
        """
    )
    env = dict(os.environ, ROCM_SAFE_CACHE_DIR=str(tmp_path / "kernel-cache"))
    p = subprocess.run(
        [sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=600
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout.strip().splitlines()[-1])
    assert report["duplicate_libraries"] == [], report["duplicate_libraries"]
    files = {f["library"]: f for f in report["runtime_files"]}
    cudnn = files["cudnn"]
    assert cudnn["loaded"], cudnn
    # torch's cuDNN, found in the process, not loaded again.
    assert cudnn["found_by"].startswith("already"), cudnn
    assert cudnn["version"].startswith("9."), cudnn
    assert files["nvrtc"]["loaded"] and files["cuda_driver"]["loaded"], files
