"""Where the installed fallback's time goes in a Wan 2.1 VAE decode.

Usage (a CUDA machine with torch, diffusers and the rocm_safe wheel)::

    python3 python/bench/guard_profile.py [float32|bfloat16] [--latent 1,16,3,60,104]

Decodes with torch alone, then with ``install_conv3d_fallback`` in
``"fallback"`` and ``"verify"``: the wall time (median of 3), the GPU's
busy time (the sum of kernel times in one profiled decode: a decode is
GPU-bound when the two are close) and the kernels that take the most time,
rocm-safe's own listed apart (what the guard adds on the device).
"""

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

OURS = ("nonfinite", "conv3d_guard", "conv3d_check", "conv3d_layout", "conv3d_tiled", "convert_", "memset")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dtype", nargs="?", default="bfloat16")
    ap.add_argument("--latent", default="1,16,3,60,104")
    ap.add_argument("--cprofile", action="store_true", help="the host's time per function in one decode")
    ap.add_argument(
        "--micro",
        action="store_true",
        help="the host's time per conv3d call on a tiny shape (GPU time negligible): torch, fallback, verify",
    )
    a = ap.parse_args()
    from diffusers import AutoencoderKLWan

    import rocm_safe.torch as rst

    dtype = getattr(torch, a.dtype)
    if a.micro:
        micro(dtype, rst)
        return
    torch.manual_seed(0)
    vae = AutoencoderKLWan().to("cuda", dtype).eval()
    z = torch.randn([int(v) for v in a.latent.split(",")], device="cuda", dtype=dtype)

    def decode():
        with torch.no_grad():
            return vae.decode(z, return_dict=False)[0]

    for mode in (None, "fallback", "verify"):
        if mode is not None:
            rst.install_conv3d_fallback(mode=mode)
        decode()
        torch.cuda.synchronize()
        walls = []
        for _ in range(3):
            t = time.perf_counter()
            decode()
            torch.cuda.synchronize()
            walls.append(time.perf_counter() - t)
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            decode()
            torch.cuda.synchronize()
        rows = [(e.key, getattr(e, "device_time_total", 0) / 1e3, e.count) for e in prof.key_averages()]
        kernels = [r for r in rows if r[1] > 0]
        busy = sum(r[1] for r in kernels if not r[0].startswith(("aten::", "cuda")))
        ours = [r for r in kernels if any(k in r[0] for k in OURS)]
        print(f"{a.dtype} mode={mode}: wall {statistics.median(walls) * 1e3:.1f} ms, GPU kernels {busy:.1f} ms")
        for k, ms, n in sorted(ours, key=lambda r: -r[1])[:10]:
            print(f"    ours {ms:8.2f} ms  x{n:5}  {k[:90]}")
        if mode is None:
            for k, ms, n in sorted(kernels, key=lambda r: -r[1])[:6]:
                print(f"    top  {ms:8.2f} ms  x{n:5}  {k[:90]}")
        if mode is not None and a.cprofile:
            import cProfile
            import pstats

            pr = cProfile.Profile()
            pr.enable()
            decode()
            torch.cuda.synchronize()
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(14)
        if mode is not None:
            print("   ", {k: v for k, v in rst.conv3d_stats().items() if k in ("guarded", "repaired", "verified", "calls", "unguarded")})


def micro(dtype, rst):
    """Microseconds of host time per F.conv3d call, 2000 calls on a tiny
    shape (the GPU finishes each before the host has issued the next)."""
    F = torch.nn.functional
    x = torch.randn(1, 8, 4, 6, 6, device="cuda", dtype=dtype)
    w = torch.randn(8, 8, 3, 3, 3, device="cuda", dtype=dtype)
    b = torch.randn(8, device="cuda", dtype=dtype)
    for mode in (None, "fallback", "verify"):
        if mode is not None:
            rst.install_conv3d_fallback(mode=mode)
        with torch.no_grad():
            for _ in range(200):
                F.conv3d(x, w, b, padding=1)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(2000):
                F.conv3d(x, w, b, padding=1)
            host = time.perf_counter() - t
            torch.cuda.synchronize()
            wall = time.perf_counter() - t
        print(f"micro {dtype} mode={mode}: host {host / 2000 * 1e6:.1f} us/call, wall {wall / 2000 * 1e6:.1f} us/call")
        if mode == "fallback":
            import cProfile
            import pstats

            pr = cProfile.Profile()
            pr.enable()
            with torch.no_grad():
                for _ in range(500):
                    F.conv3d(x, w, b, padding=1)
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(12)
        if mode is not None:
            rst.conv3d_stats()


if __name__ == "__main__":
    main()
