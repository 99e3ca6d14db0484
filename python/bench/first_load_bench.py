"""First load of a fresh process, page cache warm: rocm_safe (default
options, and with the ring's direct path on) against InstantTensor (its BUFFERED policy and its
MMAP backend, which registers the mapped file for DMA), in the same call.

Each measurement is a fresh process (``multiprocessing`` spawn): import
torch, bring up CUDA, then ONE timed load of the whole checkpoint to
``--device``, synchronized. bf16 as stored, and bf16 -> f32 (rocm_safe
converts on the device during the load, verified; InstantTensor loads then
``.float()``, unchecked). Loaders alternate within each round; the median
over ``--rounds`` is printed with the ratios against each InstantTensor
mode. rocm_safe's load report says how many bytes the direct path served.

Usage::

    python3 python/bench/first_load_bench.py FILE.safetensors [--rounds 3]
        [--make-gib 8] [--device cuda:0] [--json OUT]

``--make-gib N`` writes FILE first (scripts/make-checkpoint.py: bf16,
tensors up to 256 MiB) when it does not exist. InstantTensor is optional: without it only
rocm_safe's modes run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time


def _make(path, gib):
    """The checkpoint of BENCHMARKS.md's loads (scripts/make-checkpoint.py:
    finite bf16, tensors up to 256 MiB, offsets not aligned), one shard."""
    import shutil
    import subprocess
    import sys
    import tempfile

    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "..", "scripts", "make-checkpoint.py")
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(path))) as d:
        subprocess.run([sys.executable, script, d, "--gib", str(gib), "--shards", "1", "--largest-mib", "256"], check=True)
        shutil.move(os.path.join(d, "model.safetensors"), path)


def _warm(path):
    with open(path, "rb") as f:
        while f.read(64 << 20):
            pass


def _one(which, path, device, f32, q):
    import torch

    torch.cuda.init()
    torch.zeros(1, device=device)
    torch.cuda.synchronize()
    extra = None
    t0 = time.perf_counter()
    if which.startswith("rocm_safe"):
        if which == "rocm_safe_direct":
            os.environ["ROCM_SAFE_LOAD_DIRECT"] = "1"
        from rocm_safe import torch as rt

        sd = rt.load_file(path, device=device, dtype=torch.float32 if f32 else None)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        r = rt.last_load_report()
        if r is not None:
            d = r.to_dict()
            extra = {k: d.get(k) for k in ("direct_jobs", "direct_bytes", "direct_refused", "ring_jobs")}
    else:
        from instanttensor import safe_open
        from instanttensor._impl import Backend, BackendPolicy

        backend = BackendPolicy.BUFFERED if which == "it_buffered" else Backend.MMAP
        sd = {}
        with safe_open(path, framework="pt", device=torch.device(device).index or 0, backend=backend) as f:
            for k, v in f.tensors():
                sd[k] = v.float() if f32 else v
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    q.put((dt, extra))


def _run(which, path, device, f32):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_one, args=(which, path, device, f32, q))
    p.start()
    try:
        res = q.get(timeout=300)
    except Exception as e:  # noqa: BLE001 - a loader that dies is reported, not fatal
        res = (float("nan"), {"error": repr(e)})
    p.join()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--make-gib", type=float, default=0)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.make_gib and not os.path.exists(args.file):
        _make(args.file, args.make_gib)
    size = os.path.getsize(args.file)
    try:
        import instanttensor  # noqa: F401

        peers = ["it_buffered", "it_mmap"]
    except ImportError:
        peers = []
    loaders = ["rocm_safe", "rocm_safe_direct"] + peers
    results = {}
    for f32 in (False, True):
        tag = "bf16->f32" if f32 else "bf16"
        times = {w: [] for w in loaders}
        extras = {}
        for r in range(args.rounds):
            for w in loaders:
                _warm(args.file)
                dt, extra = _run(w, args.file, args.device, f32)
                times[w].append(dt)
                if extra:
                    extras[w] = extra
        gbs = {w: size / statistics.median(t) / 1e9 for w, t in times.items()}
        print(f"== {tag}: {size / 2**30:.2f} GiB, first load of a fresh process, median of {args.rounds}", flush=True)
        for w in loaders:
            runs = ", ".join(f"{size / t / 1e9:.1f}" for t in times[w])
            print(f"  {w:20s} {gbs[w]:6.1f} GB/s  (runs: {runs})  {extras.get(w, '')}", flush=True)
        for p in peers:
            print(f"  rocm_safe / {p}: {gbs['rocm_safe'] / gbs[p]:.2f}x", flush=True)
        print(f"  direct path on / default (off): {gbs['rocm_safe_direct'] / gbs['rocm_safe']:.2f}x", flush=True)
        results[tag] = {"gb_per_s": gbs, "runs_s": times, "report": extras}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
