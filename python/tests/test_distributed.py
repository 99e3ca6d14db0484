"""Loads through torch.distributed (``rocm_safe.torch.load_distributed``) on
torch's gloo backend, CPU only: 2 and 3 processes started here (each one
``_dist_worker.py``), on a file store in a temporary directory (nothing
listens on a network). Replicate and shard bit for bit against
safetensors, a corrupted exchange reported by the rank that got it, a rank
whose file is truncated or different, a rank that dies (the others raise
within a bounded time). Plus the plan and the fingerprint natives in this
process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available():  # pragma: no cover - torch built without distributed
    pytest.skip("torch.distributed is not available in this torch build", allow_module_level=True)

import rocm_safe.torch as rt  # noqa: E402
from rocm_safe import _native  # noqa: E402
from rocm_safe import _distributed as D  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_dist_worker.py")


def _model(seed: int):
    g = torch.Generator().manual_seed(seed)
    return {
        # Large (> 4 MiB: one broadcast each) and small (packed) tensors.
        "emb": torch.randn(300, 4099, generator=g).to(torch.bfloat16),  # 2.3 MiB
        "layers.0.q.weight": torch.randn(1031, 1030, generator=g),  # 4.05 MiB, f32
        "layers.0.q.bias": torch.randn(1031, generator=g),
        "layers.0.o.weight": torch.randn(65, 67, generator=g).to(torch.float16),
        "layers.1.q.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16),
        "cube": torch.randn(3, 4, 5, generator=g),
        "bias": torch.randn(10, generator=g).to(torch.float64),
        "ids": torch.randint(-(2**40), 2**40, (33,), generator=g, dtype=torch.int64),
        "mask": torch.rand(17, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "f8": torch.randn(9, 7, generator=g).to(torch.float8_e4m3fn),
        "c64": torch.randn(5, generator=g, dtype=torch.complex64),
        "u8": torch.randint(0, 255, (13,), generator=g, dtype=torch.uint8),
    }


def _run(scenario: str, world: int, d: str, env_extra=None, timeout=150, wait_for=None):
    """Starts ``world`` workers and waits for those of ``wait_for`` (all by
    default), then kills any still running; returns the processes, their
    output and the results they wrote."""
    env = dict(os.environ)
    env.update(env_extra or {})
    env.setdefault("OMP_NUM_THREADS", "1")
    procs = [
        subprocess.Popen(
            [sys.executable, WORKER, scenario, str(r), str(world), d],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(world)
    ]
    outs = [""] * world
    try:
        for r in wait_for if wait_for is not None else range(world):
            o, _ = procs[r].communicate(timeout=timeout)
            outs[r] = o.decode(errors="replace")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = {}
    for r in range(world):
        f = os.path.join(d, f"result-{r}.json")
        if os.path.exists(f):
            with open(f) as fh:
                results[r] = json.load(fh)
    return procs, outs, results


@pytest.fixture()
def files(tmp_path):
    from safetensors.torch import save_file

    save_file(_model(1), str(tmp_path / "model.safetensors"))
    save_file(_model(2) | {"extra": torch.ones(3)}, str(tmp_path / "other.safetensors"))
    # The same tensors as a sharded checkpoint: two files and an index.
    model = _model(1)
    names = list(model)
    (tmp_path / "sharded").mkdir()
    parts = {"part-1.safetensors": names[::2], "part-2.safetensors": names[1::2]}
    weight_map = {}
    for file, keys in parts.items():
        save_file({k: model[k] for k in keys}, str(tmp_path / "sharded" / file))
        weight_map.update({k: file for k in keys})
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(data[: len(data) // 2])
    return tmp_path


@pytest.mark.parametrize("world", [2, 3])
def test_suite_on_gloo(files, world):
    pytest.importorskip("safetensors")
    procs, outs, results = _run("suite", world, str(files))
    for r in range(world):
        assert r in results, f"rank {r} wrote no result: {outs[r][-3000:]}"
        assert results[r]["ok"], f"rank {r}: {results[r].get('traceback')}\n{outs[r][-3000:]}"
        assert procs[r].returncode == 0, outs[r][-3000:]
    # Each byte read from the file once across the ranks, every rank whole.
    total = sum(t.numel() * t.element_size() for t in _model(1).values())
    reps = [results[r]["replicate"] for r in range(world)]
    assert sum(x["read_bytes"] for x in reps) == total
    for x in reps:
        assert x["bytes"] == total
        assert x["read_bytes"] + x["received_bytes"] == total
        assert 0 < x["read_bytes"] < total
    # Shard: the split tensors are read in slices (less than the whole file).
    assert all(results[r]["shard"]["read_bytes"] < total for r in range(world))
    # The corrupted exchange was reported by rank 1 itself, named on every rank.
    assert "rank 1:" in results[0]["corrupt_received"]


@pytest.mark.parametrize("when", ["exit_before_read", "exit_before_exchange"])
def test_a_rank_that_dies(files, when):
    t0 = time.monotonic()
    procs, outs, results = _run("die", 2, str(files), {"ROCM_SAFE_DIST_FAULT": f"{when}:1"}, timeout=90)
    assert procs[1].returncode == 17, outs[1][-3000:]
    assert 0 in results, outs[0][-3000:]
    raised = results[0].get("raised")
    assert raised is not None, f"rank 0 did not raise: {results[0]}"
    assert raised["phase"] == ("read" if when == "exit_before_read" else "exchange"), raised
    # Bounded: well under the group's 30 s timeout plus start-up.
    assert results[0]["seconds"] < 40, results[0]
    assert time.monotonic() - t0 < 90


def test_a_rank_that_hangs_times_out_on_the_control_group(files):
    # Rank 1 hangs before its read; rank 0 waits in the read status
    # exchange, on the gloo control group rocm-safe makes (5 s timeout),
    # and raises; the test then ends rank 1.
    procs, outs, results = _run(
        "die",
        2,
        str(files),
        {"ROCM_SAFE_DIST_FAULT": "hang_before_read:1", "DIST_TEST_CONTROL_TIMEOUT": "5"},
        timeout=60,
        wait_for=[0],
    )
    assert 0 in results, outs[0][-3000:]
    raised = results[0].get("raised")
    assert raised is not None and raised["phase"] == "read", results[0]
    assert "status exchange failed" in raised["message"], raised
    assert 4 < results[0]["seconds"] < 30, results[0]
    assert 1 not in results  # the hanging rank never finished


# ---------------------------------------------------------------- one GPU

@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (torch.cuda)")
def test_gpu_one_rank_replicate_and_shard(files, tmp_path):
    """The GPU paths of one rank (the verified loader for its share and its
    slices of any dimension in one verified load, device
    fingerprints), on a group of one over gloo in this process."""
    import rocm_safe

    assert set(rocm_safe.features()) & {"cuda", "hip"}, "this wheel was built without a GPU backend"
    from safetensors.torch import load_file

    ref = load_file(str(files / "model.safetensors"))
    dist.init_process_group(
        "gloo", init_method="file://" + str(tmp_path / "gpu_store"), rank=0, world_size=1
    )
    try:
        for dtype in (None, torch.float32):
            sd = rt.load_distributed(str(files / "model.safetensors"), device="cuda:0", dtype=dtype)
            for k, v in ref.items():
                want = v.to(dtype) if dtype is not None and v.is_floating_point() else v
                assert sd[k].device.type == "cuda", k
                assert torch.equal(sd[k].cpu().reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), k
                assert sd[k].dtype == want.dtype and sd[k].shape == want.shape, k
            plan = {"layers.*.q": "colwise", "layers.*.o": "rowwise", "emb": 1, "cube": -1}
            sd = rt.load_distributed(
                str(files / "model.safetensors"), device="cuda:0", dtype=dtype, mode="shard", shard_plan=plan
            )
            # layers.0.q.weight and .bias, layers.1.q.weight (colwise),
            # layers.0.o.weight (rowwise), emb, cube.
            assert rt.last_distributed_report()["sharded"] == 6
            for k, v in ref.items():
                want = v.to(dtype) if dtype is not None and v.is_floating_point() else v
                assert torch.equal(sd[k].cpu().reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), k
        # Device fingerprints are the host's.
        t = torch.randn(12345, device="cuda:0")
        assert D._fingerprints([t], t.device) == D._fingerprints([t.cpu()], torch.device("cpu"))
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (torch.cuda)")
@pytest.mark.parametrize("dtype", [None, "F32"])
def test_gpu_slices_of_any_dimension_load_exactly(tmp_path, dtype):
    """``load_slices_to_device`` (the shard mode's GPU read): slices of the
    first, a middle and the last dimension, as stored and converted, each a
    contiguous tensor equal to torch's slice of safetensors' load; a bad
    dimension or range is the library's error."""
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(7)
    ref = {
        "w": torch.randn(96, 1000, generator=g).to(torch.bfloat16),
        "c": torch.randn(3, 5, 40, 7, generator=g),
        "h": torch.randn(4, 4096, generator=g).to(torch.float16),
        "i": torch.arange(60, dtype=torch.int32).reshape(6, 10),
    }
    path = str(tmp_path / "s.safetensors")
    save_file(ref, path)
    ref = load_file(path)
    asks = [("w", 1, 250, 750), ("c", 2, 10, 31), ("c", 3, 6, 7), ("h", 1, 2048, 4096), ("w", 0, 3, 9), ("i", 1, 2, 5), ("w", 1, 5, 5)]
    ck = _native.Checkpoint(path)
    got = _native.load_slices_to_device(ck, asks, "cuda:0", dtype, "fingerprint")
    assert [n for n, _ in got] == [a[0] for a in asks]
    for (name, dim, lo, hi), (_, cap) in zip(asks, got):
        x = torch.from_dlpack(cap)
        want = ref[name].narrow(dim, lo, hi - lo).contiguous()
        if dtype == "F32" and want.is_floating_point():
            want = want.float()
        assert x.device.type == "cuda" and x.is_contiguous(), name
        assert x.dtype == want.dtype and x.shape == want.shape, (name, dim, x.shape, want.shape)
        assert torch.equal(x.cpu().reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)), (name, dim)
    with pytest.raises(Exception, match="no dimension 2 to slice"):
        _native.load_slices_to_device(ck, [("w", 2, 0, 1)], "cuda:0")
    with pytest.raises(Exception, match="invalid for 7 rows"):
        _native.load_slices_to_device(ck, [("c", 3, 6, 8)], "cuda:0")


# ---------------------------------------------------------------- in process

def test_plan_is_balanced_and_deterministic():
    entries = [(f"t{i}", "F32", [n], "F32", 4 * n) for i, n in enumerate([100, 5, 70, 30, 30, 1, 0])]
    p1 = D._make_plan(entries, 3, "replicate", None)
    p2 = D._make_plan(list(entries), 3, "replicate", None)
    assert D._digest(p1) == D._digest(p2)
    loads = [0, 0, 0]
    for t in p1["tensors"]:
        loads[t["owner"]] += t["bytes"]
    # Largest first to the least-loaded rank: 400 | 280 | 120+120+20+4+0.
    assert sorted(loads) == [264, 280, 400]
    # Another world size, another plan.
    assert D._digest(D._make_plan(entries, 2, "replicate", None)) != D._digest(p1)


def test_shard_rules():
    entries = [
        ("a.q.weight", "F32", [10, 4], "F32", 160),
        ("a.q.bias", "F32", [10], "F32", 40),
        ("a.o.weight", "F32", [4, 10], "F32", 160),
        ("a.o.bias", "F32", [4], "F32", 16),
        ("norm", "F32", [4], "F32", 16),
    ]
    plan = D._make_plan(entries, 3, "shard", {"a.o.weight": 0, "*.q": "colwise", "*.o": "rowwise"})
    by = {t["name"]: t for t in plan["tensors"]}
    assert by["a.q.weight"]["dim"] == 0 and by["a.q.weight"]["ranges"] == [(0, 4), (4, 7), (7, 10)]
    assert by["a.q.bias"]["dim"] == 0
    assert by["a.o.weight"]["dim"] == 0  # the exact name wins over the pattern
    assert "dim" not in by["a.o.bias"] and "owner" in by["a.o.bias"]  # rowwise bias: replicated
    assert "dim" not in by["norm"]
    with pytest.raises(ValueError, match="cannot split dimension 2"):
        D._make_plan(entries, 2, "shard", {"norm": 2})
    with pytest.raises(ValueError, match="is not a dimension"):
        D._make_plan(entries, 2, "shard", {"norm": "diagonal"})


def test_arguments_are_checked_before_any_collective():
    with pytest.raises(ValueError, match="mode"):
        rt.load_distributed("x.safetensors", mode="broadcast")
    with pytest.raises(ValueError, match="needs a shard_plan"):
        rt.load_distributed("x.safetensors", mode="shard")
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            rt.load_distributed("x.safetensors")


def test_fault_spec_is_checked(monkeypatch):
    with pytest.raises(ValueError, match="unknown fault"):
        rt._inject_distributed_fault("melt", 0)
    monkeypatch.setenv("ROCM_SAFE_DIST_FAULT", "corrupt_received:x")
    with pytest.raises(ValueError, match="kind:rank"):
        D._faults()


def test_fingerprints_match_the_crates_and_see_one_flipped_bit():
    t = torch.randn(1001, dtype=torch.float32)
    fp = D._fingerprints([t], torch.device("cpu"))[0]
    assert fp == _native.bytes_fingerprint(t.numpy().tobytes())
    u = t.clone()
    u.view(torch.int32)[500] ^= 1 << 7
    assert D._fingerprints([u], torch.device("cpu"))[0] != fp
    # Same bytes, another dtype and shape: the same fingerprint (bytes only).
    assert D._fingerprints([t.view(torch.uint8).reshape(4, -1)], torch.device("cpu"))[0] == fp
    # Empty and 0-d tensors.
    e = D._fingerprints([torch.zeros(0), torch.tensor(1.0)], torch.device("cpu"))
    assert e[0] == _native.bytes_fingerprint(b"")
    assert e[1] == _native.bytes_fingerprint(torch.tensor(1.0).numpy().tobytes())


def test_fingerprint_native_refuses_what_is_not_a_capsule():
    with pytest.raises(TypeError, match="DLPack capsule"):
        _native.tensor_fingerprint("cpu", 0, object())
    with pytest.raises(ValueError):
        _native.tensor_fingerprints("gpu:x", 0, [])


def test_read_strided_reads_only_its_runs_and_refuses_what_does_not_fit(tmp_path):
    p = tmp_path / "f.bin"
    data = bytes(range(256)) * 4
    p.write_bytes(data)
    # 4 runs of 3 bytes, stride 10, 2 bytes in, from byte 100.
    got = _native.read_strided(str(p), 100, 140, 4, 10, 2, 3)
    assert bytes(got) == b"".join(data[100 + o * 10 + 2 : 100 + o * 10 + 5] for o in range(4))
    # Many runs (several threads).
    got = _native.read_strided(str(p), 0, 1024, 512, 2, 1, 1)
    assert bytes(got) == data[1::2]
    with pytest.raises(ValueError, match="do not fit"):
        _native.read_strided(str(p), 100, 140, 5, 10, 2, 3)  # past the range
    with pytest.raises(ValueError, match="do not fit"):
        _native.read_strided(str(p), 100, 140, 4, 10, 8, 3)  # a run past its row
    from rocm_safe import SafetensorError

    with pytest.raises(SafetensorError, match="shorter"):
        _native.read_strided(str(p), 1000, 2000, 1, 10, 0, 3)  # the file is shorter
    with pytest.raises(OSError):
        _native.read_strided(str(tmp_path / "missing.bin"), 0, 10, 1, 10, 0, 3)


def test_load_slices_to_device_refuses_the_cpu(tmp_path):
    from safetensors.torch import save_file

    save_file({"a": torch.ones(4, 2)}, str(tmp_path / "m.safetensors"))
    ck = _native.Checkpoint(str(tmp_path / "m.safetensors"))
    with pytest.raises(ValueError, match="Checkpoint.read"):
        _native.load_slices_to_device(ck, [("a", 0, 0, 2)], "cpu")
