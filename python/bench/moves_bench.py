"""Verified moves against torch's own, on one GPU: the five figures of the
moves' speed goals (BENCHMARKS.md, "Verified moves"), each ours and its
anchor measured in the same process, alternating, best of ``--repeat``.

Usage::

    python3 python/bench/moves_bench.py [--repeat 10] [--device cuda:0]
        [--only batch,large,module,to_cpu,cast] [--json out.json]

1. ``batch``: a Wan LoRA trainer's batch (bf16 latents 1x16x21x60x104,
   text embeddings 1x512x4096, a timestep, a mask and 16 scalars: 20
   tensors): ``to_device`` (checks on) against torch's per-tensor
   ``.to(device)`` (Accelerate's ``send_to_device``), each followed by a
   synchronize.
2. ``large``: 64 and 256 MiB tensors in pageable memory: ``to_device``
   against torch's pinned ``.to(device, non_blocking=True)`` + synchronize
   (the source already pinned: torch's best case, the anchor the goal
   names).
3. ``module``: ``module_to`` of a 2.1 GB bf16 model of ``torch.nn`` layers
   against ``model.to(device)``, each timed from the CPU to the device
   (the model is moved back with ``.to("cpu")`` between, untimed).
4. ``to_cpu``: bf16 latents on the GPU to float32 on the CPU:
   ``to_cpu(x, dtype=float32)`` against ``x.float().cpu()``.
5. ``cast``: bf16 -> float32 on the GPU: ``cast(x, float32)`` (exact check
   included) against ``x.float()`` + synchronize.

Prints one line per figure: our time, the anchor's, and the ratio (anchor
time / ours: above 1 is faster than torch).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from rocm_safe import torch as rt


def best(fn, repeat):
    times = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return min(times)


def pair(name, ours, anchor, repeat, nbytes, results):
    ours(), anchor()  # warm: staging, kernels, caching allocators
    o, a = [], []
    for _ in range(repeat):  # alternate, so drift hits both
        o.append(best(ours, 1))
        a.append(best(anchor, 1))
    o, a = min(o), min(a)
    r = {
        "name": name,
        "ours_ms": o * 1e3,
        "anchor_ms": a * 1e3,
        "ratio": a / o,
        "ours_gb_s": nbytes / o / 1e9,
        "anchor_gb_s": nbytes / a / 1e9,
        "bytes": nbytes,
    }
    results.append(r)
    print(
        f"{name:44s} ours {o * 1e3:9.3f} ms ({r['ours_gb_s']:6.2f} GB/s)   torch {a * 1e3:9.3f} ms "
        f"({r['anchor_gb_s']:6.2f} GB/s)   ratio {r['ratio']:.2f}x",
        flush=True,
    )
    return r


def wan_batch():
    g = torch.Generator().manual_seed(0)
    b = {
        "latents": torch.randn(1, 16, 21, 60, 104, generator=g).bfloat16(),
        "text": torch.randn(1, 512, 4096, generator=g).bfloat16(),
        "timesteps": torch.tensor([417]),
        "mask": torch.ones(1, 512, dtype=torch.bool),
    }
    for i in range(16):
        b[f"s{i}"] = torch.tensor(float(i))
    return b


def model(gb):
    layers = []
    per = 4096 * 4096 * 2  # one bf16 4096x4096 linear
    for _ in range(max(1, int(gb * 1e9 / per))):
        layers += [torch.nn.Linear(4096, 4096, dtype=torch.bfloat16), torch.nn.LayerNorm(4096, dtype=torch.bfloat16)]
    return torch.nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--only", default="batch,large,module,to_cpu,cast")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    dev = torch.device(a.device)
    only = set(a.only.split(","))
    res = []
    print(torch.cuda.get_device_name(dev), "torch", torch.__version__, flush=True)

    if "batch" in only:
        b = wan_batch()
        nb = sum(t.numel() * t.element_size() for t in b.values())
        pair(
            "batch (20 tensors, 8.4 MB) to_device",
            lambda: rt.to_device(b, dev),
            lambda: {k: v.to(dev) for k, v in b.items()},
            a.repeat,
            nb,
            res,
        )
        print(" ", rt.last_move_report(), flush=True)

    if "large" in only:
        for mib in (64, 256):
            x = torch.randn(mib << 18)
            xp = x.pin_memory()
            pair(
                f"{mib} MiB to_device (pageable) vs pinned .to",
                lambda: rt.to_device(x, dev),
                lambda: xp.to(dev, non_blocking=True),
                a.repeat,
                x.numel() * 4,
                res,
            )
            pair(
                f"{mib} MiB to_device vs pageable .to",
                lambda: rt.to_device(x, dev),
                lambda: x.to(dev),
                a.repeat,
                x.numel() * 4,
                res,
            )

    if "module" in only:
        m = model(2.1)
        nb = sum(p.numel() * p.element_size() for p in m.parameters())
        # The move alone: time to the device only.
        def ours_only():
            m.to("cpu")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            rt.module_to(m, dev)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        def anchor_only():
            m.to("cpu")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            m.to(dev)
            torch.cuda.synchronize()
            return time.perf_counter() - t0

        ours_only(), anchor_only()  # warm
        o = min(ours_only() for _ in range(3))
        an = min(anchor_only() for _ in range(3))
        res.append({"name": "module_to alone", "ours_ms": o * 1e3, "anchor_ms": an * 1e3, "ratio": an / o,
                    "ours_gb_s": nb / o / 1e9, "anchor_gb_s": nb / an / 1e9, "bytes": nb})
        print(f"{'module_to alone':44s} ours {o * 1e3:9.3f} ms ({nb / o / 1e9:6.2f} GB/s)   torch {an * 1e3:9.3f} ms "
              f"({nb / an / 1e9:6.2f} GB/s)   ratio {an / o:.2f}x", flush=True)
        print(" ", rt.last_move_report().to_dict()["moves"][:2], flush=True)
        del m

    if "to_cpu" in only:
        x = torch.randn(1, 16, 21, 60, 104, device=dev).bfloat16()
        nb = x.numel() * 2
        pair("to_cpu bf16 latents -> f32", lambda: rt.to_cpu(x, dtype=torch.float32), lambda: x.float().cpu(), a.repeat, nb, res)
        y = torch.randn(64 << 20, device=dev).bfloat16()
        pair("to_cpu 128 MiB bf16 -> f32", lambda: rt.to_cpu(y, dtype=torch.float32), lambda: y.float().cpu(), a.repeat, y.numel() * 2, res)

    if "cast" in only:
        for n in (1 * 16 * 21 * 60 * 104, 64 << 20):
            x = torch.randn(n, device=dev).bfloat16()
            pair(f"cast bf16->f32 {n * 2 / 2**20:.0f} MiB", lambda: rt.cast(x, torch.float32), lambda: x.float(), a.repeat, n * 2, res)
        print(" ", rt.last_move_report(), flush=True)

    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
