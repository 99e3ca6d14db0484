"""Where a verified move's time goes (a profile for BENCHMARKS.md's
"Verified moves" notes): cProfile of ``to_device`` of the Wan LoRA batch
and of ``cast``, and the host-copy ceiling of any staged upload on this
machine (torch's own copy of pageable memory into pinned memory, and our
upload with ``verify=False``).

    python3 python/bench/moves_profile.py [--device cuda:0]
"""

import argparse
import cProfile
import pstats
import time

import torch

from rocm_safe import torch as rt

import moves_bench  # noqa: E402  (same folder)


def best(fn, n=10):
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return min(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    dev = torch.device(a.device)
    b = moves_bench.wan_batch()
    rt.to_device(b, dev)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(50):
        rt.to_device(b, dev)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(14)
    x = torch.randn(1 * 16 * 21 * 60 * 104, device=dev).bfloat16()
    rt.cast(x, torch.float32)
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        rt.cast(x, torch.float32)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(10)
    for mib in (8, 64, 256):
        src = torch.randn(mib << 18)
        pinned = torch.empty_like(src).pin_memory()
        t_copy = best(lambda: pinned.copy_(src))
        t_off = best(lambda: rt.to_device(src, dev, verify=False))
        t_on = best(lambda: rt.to_device(src, dev))
        t_pin = best(lambda: pinned.to(dev, non_blocking=True))
        n = src.numel() * 4
        print(
            f"{mib:4d} MiB: torch pageable->pinned copy {n / t_copy / 1e9:6.1f} GB/s (threads {torch.get_num_threads()}); "
            f"to_device verify=False {n / t_off / 1e9:6.1f}, verify=True {n / t_on / 1e9:6.1f}; pinned .to {n / t_pin / 1e9:6.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
