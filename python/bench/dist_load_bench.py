"""Distributed load: check and benchmark ``rocm_safe.torch.load_distributed``
on N GPUs through NCCL/RCCL (run under torchrun, one process per GPU).

Usage (two H200s)::

    torchrun --nproc_per_node 2 python/bench/dist_load_bench.py \\
        --file /dev/shm/rs_dist.safetensors --make-gib 8 --check --repeat 3

``--make-gib N``: rank 0 writes a checkpoint of about N GiB of bf16
"layers" (q/k/v/o/up/down weights, norms, an embedding) when ``--file``
does not exist. Every rank then reads the file once (page cache warm).

What it does, in one process group:

1. one GPU alone: rank 0 ``load_file(device="cuda:0")`` (the first, fresh
   load of the process, then ``--repeat`` more; the best is the figure),
   the others wait;
2. ``replicate``: every rank the whole state dict; aggregate GB/s =
   world x file bytes / time (the slowest rank's time, barrier to barrier);
3. ``shard``: every 2-D weight split (q/k/v/up colwise, o/down rowwise),
   the rest replicated; per-rank GB/s = that rank's bytes / time.

``--dtype f32`` converts bf16 to f32 while loading (all three). ``--check``
compares every tensor, bit for bit, with ``safetensors.torch.load_file``
(on the CPU, moved to the GPU): whole in replicate, the rank's
``torch.tensor_split`` slice in shard. Rank 0 prints one JSON line with the
figures and the ratios (replicate aggregate / one GPU; shard per rank / one
GPU). Non-zero exit when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import rocm_safe.torch as rt


def make(path: str, gib: float) -> None:
    from safetensors.torch import save_file

    h = 4096
    ff = 14336
    per_layer = (4 * h * h + 3 * h * ff + 2 * h) * 2
    layers = max(1, int(gib * (1 << 30) / per_layer))
    g = torch.Generator().manual_seed(0)
    sd = {"model.embed_tokens.weight": torch.randn(32000, h, generator=g).to(torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        for n, shape in [
            ("self_attn.q_proj", (h, h)),
            ("self_attn.k_proj", (h, h)),
            ("self_attn.v_proj", (h, h)),
            ("self_attn.o_proj", (h, h)),
            ("mlp.gate_proj", (ff, h)),
            ("mlp.up_proj", (ff, h)),
            ("mlp.down_proj", (h, ff)),
        ]:
            sd[p + n + ".weight"] = torch.randn(*shape, generator=g).to(torch.bfloat16)
        sd[p + "input_layernorm.weight"] = torch.randn(h, generator=g).to(torch.bfloat16)
        sd[p + "post_attention_layernorm.weight"] = torch.randn(h, generator=g).to(torch.bfloat16)
    tmp = path + ".tmp"
    save_file(sd, tmp)
    os.replace(tmp, path)


PLAN = {
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.k_proj": "colwise",
    "model.layers.*.self_attn.v_proj": "colwise",
    "model.layers.*.self_attn.o_proj": "rowwise",
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": "rowwise",
    "model.embed_tokens.weight": 0,
}
DIMS = {"q_proj": 0, "k_proj": 0, "v_proj": 0, "o_proj": 1, "gate_proj": 0, "up_proj": 0, "down_proj": 1}


def shard_dim(name: str):
    if name == "model.embed_tokens.weight":
        return 0
    for k, d in DIMS.items():
        if f".{k}.weight" in name:
            return d
    return None


def nbytes(sd) -> int:
    return sum(t.numel() * t.element_size() for t in sd.values())


CPU = False  # --cpu: gloo on the CPU (a smoke test of this script, no GPU)


def sync():
    if not CPU:
        torch.cuda.synchronize()


def release(dev):
    """Frees what rocm-safe holds on the device between measurements."""
    if not CPU:
        rt.release_memory(dev)


def timed(fn):
    dist.barrier()
    sync()
    t0 = time.perf_counter()
    out = fn()
    sync()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device="cpu" if CPU else "cuda")
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank's time
    return out, float(dt.item())


def same(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8)
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--make-gib", type=float, default=0)
    ap.add_argument("--dtype", choices=["none", "f32"], default="none")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="gloo on the CPU: a smoke test of the script")
    ap.add_argument("--peer", action="store_true", help="also InstantTensor with the process group, where installed")
    a = ap.parse_args()

    global CPU
    CPU = a.cpu
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if CPU:
        dist.init_process_group("gloo")
        dev = torch.device("cpu")
    else:
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        dev = torch.device("cuda", local)
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = torch.float32 if a.dtype == "f32" else None

    if rank == 0 and not os.path.exists(a.file):
        if not a.make_gib:
            sys.exit(f"{a.file} does not exist: give --make-gib")
        make(a.file, a.make_gib)
    dist.barrier()
    with open(a.file, "rb") as fh:  # warm this rank's page cache
        while fh.read(1 << 26):
            pass
    file_bytes = os.path.getsize(a.file)
    ok = True
    ref = None
    if a.check:
        from safetensors.torch import load_file as st_load

        ref = st_load(a.file)
        if dtype is not None:
            ref = {k: v.to(dtype) if v.is_floating_point() else v for k, v in ref.items()}

    # 1. one GPU alone (rank 0), first load of the process then repeats.
    one = []
    for i in range(1 + a.repeat):
        if rank == 0:
            t0 = time.perf_counter()
            sd = rt.load_file(a.file, device=dev, dtype=dtype)
            sync()
            one.append(time.perf_counter() - t0)
            out_bytes = nbytes(sd)
            del sd
            release(dev)
        dist.barrier()

    # 2. replicate.
    rep = []
    for i in range(1 + a.repeat):
        sd, dt = timed(lambda: rt.load_distributed(a.file, mode="replicate", device=dev, dtype=dtype))
        rep.append(dt)
        rep_report = rt.last_distributed_report()
        if a.check and i == 0:
            bad = [k for k, v in ref.items() if not same(sd[k], v.to(dev))]
            if bad or len(sd) != len(ref):
                ok = False
                print(
                    f"rank {rank}: replicate differs from safetensors: {bad[:5]} ({len(sd)} vs {len(ref)})",
                    flush=True,
                )
        del sd
        release(dev)

    # 3. shard.
    sh = []
    for i in range(1 + a.repeat):
        sd, dt = timed(lambda: rt.load_distributed(a.file, mode="shard", shard_plan=PLAN, device=dev, dtype=dtype))
        sh.append(dt)
        my_bytes = nbytes(sd)
        sh_report = rt.last_distributed_report()
        if a.check and i == 0:
            bad = []
            for k, v in ref.items():
                d = shard_dim(k)
                want = v if d is None else torch.tensor_split(v, world, dim=d)[rank]
                if not same(sd[k], want.to(dev)):
                    bad.append(k)
            if bad:
                ok = False
                print(f"rank {rank}: shard differs from safetensors: {bad[:5]}", flush=True)
        del sd
        release(dev)

    # 4. the peer, where installed: InstantTensor with the process group
    # (each rank reads 1/N of every chunk, then an NCCL all-gather; no
    # checks), each rank ending with the whole state dict, as replicate.
    peer = []
    if not CPU and a.peer:
        try:
            from instanttensor import safe_open as it_open
        except ImportError:
            it_open = None
        for i in range(1 + a.repeat if it_open else 0):

            def it_load():
                out = {}
                with it_open(a.file, framework="pt", device=local, process_group=dist.group.WORLD) as f:
                    for k, v in f.tensors():
                        out[k] = v.float() if dtype is not None and v.is_floating_point() else v
                return out

            sd, dt = timed(it_load)
            peer.append(dt)
            del sd
            torch.cuda.empty_cache()

    oks = [None] * world
    dist.all_gather_object(oks, {"ok": ok, "shard_bytes": my_bytes, "shard_gbps": my_bytes / min(sh) / 1e9})
    if rank == 0:
        one_gbps = out_bytes / min(one) / 1e9
        rep_gbps = world * out_bytes / min(rep) / 1e9
        shard_gbps = [o["shard_gbps"] for o in oks]
        print(
            json.dumps(
                {
                    "world": world,
                    "file_gib": round(file_bytes / (1 << 30), 2),
                    "dtype": a.dtype,
                    "checked": bool(a.check),
                    "all_ok": all(o["ok"] for o in oks),
                    "one_gpu_first_s": round(one[0], 3),
                    "one_gpu_best_gbps": round(one_gbps, 1),
                    "replicate_first_s": round(rep[0], 3),
                    "replicate_best_s": round(min(rep), 3),
                    "replicate_aggregate_gbps": round(rep_gbps, 1),
                    "replicate_vs_one_gpu": round(rep_gbps / one_gbps, 2),
                    "replicate_report_rank0": rep_report,
                    "shard_best_s": round(min(sh), 3),
                    "shard_per_rank_gbps": [round(x, 1) for x in shard_gbps],
                    "shard_vs_one_gpu": [round(x / one_gbps, 2) for x in shard_gbps],
                    "shard_report_rank0": sh_report,
                    "instanttensor_pg_best_s": round(min(peer), 3) if peer else None,
                    "instanttensor_pg_first_s": round(peer[0], 3) if peer else None,
                    "replicate_vs_instanttensor_pg": round(min(peer) / min(rep), 2) if peer else None,
                }
            ),
            flush=True,
        )
    all_ok = all(o["ok"] for o in oks)
    dist.destroy_process_group()
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
