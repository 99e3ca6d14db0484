"""GPU load benchmark: rocm_safe.torch.load_file(device="cuda:0",
dtype=torch.float32) against safetensors.torch.load_file(device="cuda") +
.float(), warm, with the peak RSS growth of each.

Usage::

    python3 scripts/make-checkpoint.py /tmp/ckpt --gib 2   # or any checkpoint folder
    python3 python/bench/load_bench.py /tmp/ckpt [--repeat 5] [--device cuda:0]
        [--dtype float32|bfloat16|none] [--verify fingerprint]

The checkpoint is a folder (its ``*.safetensors.index.json`` when it has
one, else every ``*.safetensors`` file in it), a single file, or an index.
Each measurement runs in a fresh subprocess (``multiprocessing`` spawn):
one untimed load to warm the page cache, CUDA context, kernels and the
loader's staging, then ``--repeat`` timed loads; the best time gives GB/s
(bytes of the files per second). Peak RSS growth is ``VmHWM`` at the end
minus ``VmRSS`` just before the first load (after ``import torch`` and CUDA
init), from ``/proc/self/status``. Prints one line per loader and the
ratios.
"""

from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import sys
import time


def _files(path):
    """The safetensors files to load with safetensors (it has no index
    support), and what rocm_safe is given (the index when there is one)."""
    if os.path.isdir(path):
        idx = sorted(glob.glob(os.path.join(path, "*.safetensors.index.json")))
        if idx:
            return _files(idx[0])
        files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            sys.exit(f"{path}: no .safetensors files")
        return files, files
    if path.endswith(".json"):
        with open(path) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        return [os.path.join(os.path.dirname(path), s) for s in shards], [path]
    return [path], [path]


def _status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _measure(which, files, ours, device, dtype_name, verify, repeat, q):
    import torch

    torch.cuda.init()
    torch.zeros(1, device=device)
    dtype = None if dtype_name == "none" else getattr(torch, dtype_name)
    if which == "rocm_safe":
        from rocm_safe import torch as rt

        def load():
            out = {}
            for p in ours:
                out.update(rt.load_file(p, device=device, dtype=dtype, verify=verify))
            return out
    else:
        import safetensors.torch as st

        def load():
            out = {}
            for p in files:
                sd = st.load_file(p, device=device)
                if dtype is not None:
                    sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in sd.items()}
                out.update(sd)
            return out

    rss0 = _status("VmRSS")
    sd = load()  # warm
    torch.cuda.synchronize()
    del sd
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        sd = load()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
        del sd
    report = None
    if which == "rocm_safe":
        r = rt.last_load_report()
        report = str(r) if r is not None else None
    q.put((best, _status("VmHWM") - rss0, report))


def run(which, args, files, ours):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(
        target=_measure, args=(which, files, ours, args.device, args.dtype, args.verify, args.repeat, q)
    )
    p.start()
    result = q.get()
    p.join()
    if p.exitcode:
        sys.exit(f"{which}: the measuring process failed ({p.exitcode})")
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--dtype", default="float32", help="float32, bfloat16, float16 or none (as stored)")
    ap.add_argument("--verify", default="fingerprint")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    files, ours = _files(args.checkpoint)
    size = sum(os.path.getsize(f) for f in files)
    print(f"{len(files)} file(s), {size / 1e9:.3f} GB, device {args.device}, dtype {args.dtype}, verify {args.verify}")
    results = {}
    for which in ("safetensors", "rocm_safe"):
        t, rss, report = run(which, args, files, ours)
        results[which] = (t, rss)
        print(f"{which:12s} {t * 1e3:9.1f} ms  {size / t / 1e9:7.2f} GB/s  peak RSS +{rss / 2**20:8.1f} MiB")
        if report:
            print("  " + report.replace("\n", "\n  "))
    (ts, rs), (tr, rr) = results["safetensors"], results["rocm_safe"]
    print(f"speed-up (safetensors time / rocm_safe time): {ts / tr:.2f}x")
    print(f"peak RSS growth ratio (rocm_safe / safetensors): {rr / rs:.3f}" if rs > 0 else "peak RSS: n/a")


if __name__ == "__main__":
    main()
