"""One rank of the distributed-load tests (``test_distributed.py`` starts
2 or 3 of these on gloo, CPU only). Usage:

    python _dist_worker.py SCENARIO RANK WORLD DIR

SCENARIO ``suite``: the loads and failures of one process group in turn,
each checked here against safetensors' (or rocm_safe's single-process)
load; writes ``DIR/result-RANK.json``. ``die``: every rank loads, the
rank named by ROCM_SAFE_DIST_FAULT exits in the middle; the others write
what they raised and how long it took. Exits non-zero when a check fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import rocm_safe.torch as rt


def reference(path, dtype=None):
    try:
        from safetensors.torch import load_file
    except ImportError:  # pragma: no cover - safetensors is optional
        load_file = None
    sd = load_file(path) if load_file is not None else rt.load_file(path)
    if dtype is not None:
        sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in sd.items()}
    return sd


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: dtype, shape and bytes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def expect_error(fn, phase, failing):
    """Runs ``fn``, which must raise DistributedLoadError of ``phase`` whose
    failing ranks are ``failing``; returns its message."""
    try:
        fn()
    except rt.DistributedLoadError as e:
        assert e.phase == phase, (e.phase, phase, str(e))
        assert sorted(e.failures) == sorted(failing), (e.failures, failing, str(e))
        return str(e)
    raise AssertionError(f"expected a DistributedLoadError in {phase}, got none")


def suite(rank, world, d, out):
    path = os.path.join(d, "model.safetensors")
    ref = reference(path)
    names = list(ref)

    # 1. replicate: every tensor, bit for bit; read once across the ranks.
    sd = rt.load_distributed(path, mode="replicate")
    assert list(sd) == list(rt.safe_open(path, "pt").offset_keys())
    assert sorted(sd) == sorted(names)
    for k in names:
        assert same(sd[k], ref[k]), k
    r = rt.last_distributed_report()
    assert r["mode"] == "replicate" and r["world_size"] == world and r["rank"] == rank
    assert r["checked"] == r["received_tensors"] > 0, r
    out["replicate"] = {"read_bytes": r["read_bytes"], "received_bytes": r["received_bytes"], "bytes": r["bytes"]}

    # 2. replicate, converted to f32 while reading.
    sd = rt.load_distributed(path, mode="replicate", dtype=torch.float32)
    ref32 = reference(path, torch.float32)
    for k in names:
        assert same(sd[k], ref32[k]), k

    # 3. shard: colwise, rowwise, explicit dims, the rest replicated.
    plan = {"layers.*.q": "colwise", "layers.*.o": "rowwise", "emb": 1, "cube": -1, "bias": 0}
    sd = rt.load_distributed(path, mode="shard", shard_plan=plan)
    dims = {"layers.0.q.weight": 0, "layers.0.q.bias": 0, "layers.1.q.weight": 0, "layers.0.o.weight": 1,
            "emb": 1, "cube": 2, "bias": 0}
    for k in names:
        want = ref[k]
        if k in dims:
            want = torch.tensor_split(want, world, dim=dims[k])[rank]
        assert same(sd[k], want), (k, sd[k].shape, want.shape)
    r = rt.last_distributed_report()
    assert r["sharded"] == len(dims), r
    out["shard"] = {"read_bytes": r["read_bytes"]}

    # 3b. shard converted to f32 while reading, and on a sharded
    # checkpoint (an index over two files).
    sd = rt.load_distributed(path, mode="shard", shard_plan=plan, dtype=torch.float32)
    for k in names:
        want = ref32[k]
        if k in dims:
            want = torch.tensor_split(want, world, dim=dims[k])[rank]
        assert same(sd[k], want), (k, sd[k].dtype, want.dtype)
    index = os.path.join(d, "sharded", "model.safetensors.index.json")
    sd = rt.load_distributed(index, mode="shard", shard_plan=plan)
    for k in names:
        want = ref[k]
        if k in dims:
            want = torch.tensor_split(want, world, dim=dims[k])[rank]
        assert same(sd[k], want), (k, "sharded checkpoint")
    sd = rt.load_distributed(index)
    for k in names:
        assert same(sd[k], ref[k]), (k, "sharded checkpoint")

    # 4. the same through load_file(process_group=...).
    sd = rt.load_file(path, process_group=dist.group.WORLD)
    for k in names:
        assert same(sd[k], ref[k]), k

    # 5. a corrupted exchange: rank 1 flips a byte of what it received; it
    # reports it, and every rank raises.
    rt._inject_distributed_fault("corrupt_received", 1)
    try:
        msg = expect_error(lambda: rt.load_distributed(path), "verify", [1])
    finally:
        rt._inject_distributed_fault(None)
    assert "received with bytes other than their owner read" in msg, msg
    out["corrupt_received"] = msg

    # 5b. a rank whose read fails, a rank that cannot allocate what it
    # receives: every rank raises, naming it.
    for kind, phase in (("fail_read", "read"), ("fail_alloc", "alloc")):
        rt._inject_distributed_fault(kind, world - 1)
        try:
            msg = expect_error(lambda: rt.load_distributed(path), phase, [world - 1])
        finally:
            rt._inject_distributed_fault(None)
        assert "injected" in msg and f"rank {world - 1}" in msg, msg

    # 6. rank 1's file is truncated: every rank raises before any byte moves.
    bad = os.path.join(d, "truncated.safetensors") if rank == 1 else path
    msg = expect_error(lambda: rt.load_distributed(bad), "plan", [1])
    assert "truncated.safetensors" in msg, msg

    # 7. rank 1's file is another checkpoint: the plans differ.
    other = os.path.join(d, "other.safetensors") if rank == 1 else path
    expect_error(lambda: rt.load_distributed(other), "plan", list(range(world)))

    # 8. a plan that splits a dimension a tensor lacks: every rank raises.
    expect_error(lambda: rt.load_distributed(path, mode="shard", shard_plan={"bias": 3}), "plan", list(range(world)))

    # 9. the group still works after the failures.
    sd = rt.load_distributed(path)
    for k in names:
        assert same(sd[k], ref[k]), k


def die(rank, world, d, out):
    path = os.path.join(d, "model.safetensors")
    timeout = float(os.environ.get("DIST_TEST_CONTROL_TIMEOUT", "0"))
    kw = {}
    if timeout:
        # The control group rocm-safe makes for an NCCL group (a gloo group
        # of its own with `timeout`), here over a gloo group told to look
        # like NCCL: the status exchanges time out on it.
        from rocm_safe import _distributed

        _distributed.dist.get_backend = lambda group=None: "nccl"
        kw["timeout"] = timeout
        kw["device"] = "cpu"
        # (A real NCCL group refuses a load to the CPU before any collective.)
        try:
            rt.load_distributed(path, device="cpu")
        except ValueError as e:
            assert "moves GPU tensors only" in str(e), e
        else:
            raise AssertionError("an NCCL group took a load to the CPU")
        _distributed._backend_name = lambda pg: "another backend"
    t0 = time.monotonic()
    try:
        rt.load_distributed(path, **kw)
    except rt.DistributedLoadError as e:
        out["raised"] = {"phase": e.phase, "message": str(e)}
    except Exception as e:  # noqa: BLE001 - recorded: the test says what was expected
        out["raised"] = {"phase": None, "message": f"{type(e).__name__}: {e}"}
    out["seconds"] = time.monotonic() - t0


def main():
    scenario, rank, world, d = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    dist.init_process_group(
        "gloo",
        init_method="file://" + os.path.join(d, "store"),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=30),
    )
    out = {"rank": rank}
    try:
        {"suite": suite, "die": die}[scenario](rank, world, d, out)
        out["ok"] = True
    except BaseException:  # noqa: BLE001 - written for the test to show
        out["ok"] = False
        out["traceback"] = traceback.format_exc()
    with open(os.path.join(d, f"result-{rank}.json"), "w") as fh:
        json.dump(out, fh)
    if scenario == "suite":
        dist.destroy_process_group()
    sys.exit(0 if out["ok"] else 1)


if __name__ == "__main__":
    main()
