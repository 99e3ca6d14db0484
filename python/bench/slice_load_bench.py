"""A tensor-parallel rank's read, on one GPU: the slices that
``load_distributed(mode="shard")`` loads for each rank of a group of
``--world`` (``_native.load_slices_to_device``: column slices read run by
run into the pinned ring), against the whole checkpoint loaded by
``rocm_safe.torch.load_file`` in the same process.

Usage (one H200)::

    python3 python/bench/slice_load_bench.py --file /dev/shm/rs_dist.safetensors \\
        --make-gib 4 --world 2 --rounds 3 --check

The checkpoint and the split (q/k/v/gate/up by rows, o/down by columns,
the embedding by rows) are ``dist_load_bench.py``'s. Each round loads the
whole file, then each rank's slices, alternating; the best of the rounds
is the figure. Per rank: its slices' bytes / time, and that against the
whole load's GB/s (the issue's "shard, each rank's bytes/s >= 0.9x one GPU
alone" without the sharing of one host by several ranks, which needs a
multi-GPU machine). ``--release`` frees rocm_safe's device memory and
pinned ring after every load (each load then pins its ring again). ``--check`` compares every slice, bit for bit, with
``torch.tensor_split`` of ``safetensors.torch.load_file``'s tensor.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dist_load_bench import make, shard_dim  # noqa: E402

import rocm_safe.torch as rt  # noqa: E402
from rocm_safe import _native  # noqa: E402


def split(n: int, world: int, rank: int):
    """``torch.tensor_split``'s range of index ``rank``."""
    q, r = divmod(n, world)
    lo = rank * q + min(rank, r)
    return lo, lo + q + (1 if rank < r else 0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--make-gib", type=float, default=4.0)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    ap.add_argument("--check", action="store_true")
    ap.add_argument(
        "--release",
        action="store_true",
        help="release rocm_safe's device memory (its pinned ring too) after every load",
    )
    a = ap.parse_args()
    if not os.path.exists(a.file):
        make(a.file, a.make_gib)
    with open(a.file, "rb") as f:  # page cache warm
        while f.read(1 << 26):
            pass
    dev = torch.device("cuda:0")
    dtype = torch.float32 if a.dtype == "f32" else None
    st = "F32" if a.dtype == "f32" else None
    ck = _native.Checkpoint(a.file)
    from safetensors import safe_open

    with safe_open(a.file, "pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        esize = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    split_names = [k for k in shapes if shard_dim(k) is not None]
    asks = {
        r: [(k, shard_dim(k), *split(shapes[k][shard_dim(k)], a.world, r)) for k in split_names]
        for r in range(a.world)
    }
    size = {"BF16": 2, "F16": 2, "F32": 4}

    def slice_bytes(ask):
        k, d, lo, hi = ask
        n = 1
        for x in shapes[k]:
            n *= x
        return n // shapes[k][d] * (hi - lo) * size[esize[k]]

    whole_bytes = os.path.getsize(a.file)
    whole, per_rank = [], {r: [] for r in range(a.world)}
    for _ in range(a.rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sd = rt.load_file(a.file, device="cuda:0", dtype=dtype)
        torch.cuda.synchronize()
        whole.append(time.perf_counter() - t0)
        del sd
        if a.release:
            rt.release_memory(dev)
        for r in range(a.world):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            got = _native.load_slices_to_device(ck, asks[r], "cuda:0", st, "fingerprint")
            out = {n: torch.from_dlpack(c) for n, c in got}
            torch.cuda.synchronize()
            per_rank[r].append(time.perf_counter() - t0)
            if a.check and len(per_rank[r]) == 1:
                from safetensors.torch import load_file

                ref = load_file(a.file)
                for k, d, lo, hi in asks[r]:
                    want = ref[k].narrow(d, lo, hi - lo).contiguous()
                    if dtype is not None:
                        want = want.to(dtype)
                    x = out[k]
                    if x.device != dev or x.dtype != want.dtype or x.shape != want.shape or not torch.equal(
                        x.cpu().reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)
                    ):
                        print(f"rank {r}: slice {k} dim {d} differs", flush=True)
                        return 1
                del ref
            del out, got
            if a.release:
                rt.release_memory(dev)
    one = whole_bytes / min(whole) / 1e9
    res = {
        "file_gib": round(whole_bytes / 2**30, 2),
        "world": a.world,
        "dtype": a.dtype,
        "split_tensors": len(split_names),
        "tensors": len(shapes),
        "whole_gbps": round(one, 1),
        "whole_s": [round(x, 3) for x in whole],
        "checked": a.check,
        "released_between_loads": a.release,
    }
    for r in range(a.world):
        b = sum(slice_bytes(x) for x in asks[r])
        g = b / min(per_rank[r]) / 1e9
        res[f"rank{r}"] = {
            "bytes": b,
            "s": [round(x, 3) for x in per_rank[r]],
            "gbps": round(g, 1),
            "vs_whole": round(g / one, 2),
        }
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
