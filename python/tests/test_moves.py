"""Verified moves of the tensors a trainer holds (rocm_safe.torch's
to_device, to_cpu, cast, module_to, VerifiedLoader, verify_dataloader):
structure, dtypes and values bit for bit; every injected failure of the
reported ROCm bugs caught and served by the next rung (testing builds);
nothing wrong returned when every rung fails; real Accelerate and
diffusers code. On the CPU the whole verified path runs over rocm-safe's
host backend (``_verified_cpu_moves``); on a GPU build with CUDA the same
tests run on ``cuda:0``."""

import collections
import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

import rocm_safe  # noqa: E402
from rocm_safe import torch as rt  # noqa: E402

HOOKS = "testing" in rocm_safe.features()
needs_hooks = pytest.mark.skipif(not HOOKS, reason="needs a build with --features testing")
GPU = torch.cuda.is_available() and bool(set(rocm_safe.features()) & {"cuda", "hip"})

DEVICES = [
    "cpu",
    pytest.param("cuda:0", marks=pytest.mark.skipif(not GPU, reason="needs a GPU build and torch.cuda")),
]

Pair = collections.namedtuple("Pair", "left right")


@pytest.fixture(autouse=True)
def verified_cpu():
    """Moves to "cpu" run the verified path (host backend); faults off after."""
    with rt._verified_cpu_moves():
        yield
    if HOOKS:
        rt._inject_move_faults([])


def batch(seed=0, big=False):
    g = torch.Generator().manual_seed(seed)
    shape = (1, 16, 5, 60, 104) if big else (1, 4, 3, 6, 8)
    t = torch.randn(4, generator=g)
    return {
        "latents": torch.randn(*shape, generator=g).bfloat16(),
        "text": torch.randn(1, 12, 32, generator=g).bfloat16(),
        "timesteps": torch.randint(0, 1000, (1,), generator=g),
        "mask": torch.rand(1, 12, generator=g) > 0.5,
        "scalars": [t[0].clone(), t[1].clone(), torch.tensor(7, dtype=torch.int32)],
        "pair": Pair(torch.arange(5, dtype=torch.int16), "label"),
        "shared": t,
        "again": t,
        "name": "clip-0001",
        "fps": 16,
        "none": None,
    }


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a.cpu().view(-1).view(torch.uint8) if a.numel() else a.cpu(), b.cpu().view(-1).view(torch.uint8) if b.numel() else b.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_batch_structure_and_values_survive(device):
    b = batch()
    out = rt.to_device(b, device)
    dev = torch.device(device)
    assert set(out) == set(b)
    for k in ("latents", "text", "timesteps", "mask", "shared"):
        assert out[k].device == dev
        assert_same(out[k], b[k])
        # A copy, not the caller's memory.
        assert out[k].data_ptr() != b[k].data_ptr()
    assert isinstance(out["scalars"], list) and len(out["scalars"]) == 3
    for x, y in zip(out["scalars"], b["scalars"]):
        assert_same(x, y)
    assert isinstance(out["pair"], Pair) and out["pair"].right == "label"
    assert_same(out["pair"].left, b["pair"].left)
    assert out["shared"] is out["again"]  # one tensor twice: moved once
    assert (out["name"], out["fps"], out["none"]) == ("clip-0001", 16, None)
    r = rt.last_move_report()
    assert r["tensors"] == 9 and r["caught"] == [] and r["kept_on_host"] == []
    # The small ones travelled as one packed move.
    assert len(r["moves"]) == 1 and r["moves"][0]["pieces"] == 9, str(r)
    assert r["moves"][0]["check"] == "fingerprint"


@pytest.mark.parametrize("device", DEVICES)
def test_dtype_converts_floats_only_exactly(device):
    b = batch()
    out = rt.to_device(b, device, dtype=torch.float32)
    assert out["latents"].dtype == torch.float32
    assert torch.equal(out["latents"].cpu(), b["latents"].float())
    assert out["timesteps"].dtype == torch.int64 and out["mask"].dtype == torch.bool
    assert out["scalars"][2].dtype == torch.int32
    checks = {m["check"] for m in rt.last_move_report()["moves"]}
    assert "exact" in checks, str(rt.last_move_report())
    # A string dtype works too; an unknown one is refused.
    out = rt.to_device(b["text"], device, dtype="float16")
    assert torch.equal(out.cpu(), b["text"].half())
    with pytest.raises((ValueError, TypeError)):
        rt.to_device(b, device, dtype="float7")


@pytest.mark.parametrize("device", DEVICES)
def test_odd_tensors(device):
    x = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    cases = [x.t(), x[:, ::2], torch.empty(0, 3), torch.tensor(2.5), torch.zeros(3, 0, 2, dtype=torch.bfloat16)]
    out = rt.to_device(cases, device)
    for o, c in zip(out, cases):
        assert o.shape == c.shape and torch.equal(o.cpu(), c)
    back = rt.to_cpu(out)
    for o, c in zip(back, cases):
        assert torch.equal(o, c)
    # A 20 MiB tensor travels on its own (not packed).
    big = torch.randn(5 << 20)
    got = rt.to_device({"big": big, "t": torch.tensor(1)}, device)
    assert torch.equal(got["big"].cpu(), big)
    assert len(rt.last_move_report()["moves"]) == 2


@pytest.mark.parametrize("device", DEVICES)
def test_to_cpu_widens_on_arrival_and_cast_checks(device):
    pats = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    on = rt.to_device(pats, device)
    back = rt.to_cpu({"l": on}, dtype=torch.float32)["l"]
    assert back.device.type == "cpu"
    # Every bf16 pattern widened exactly (bits << 16), NaNs included.
    want = (pats.view(torch.int16).to(torch.int32) << 16).view(torch.float32)
    assert torch.equal(back.view(torch.int32), want.view(torch.int32))
    r = rt.last_move_report()
    assert r["moves"][0]["kind"] == "download" and r["moves"][0]["check"] == "fingerprint"
    w = rt.cast(on, torch.float32)
    assert w.device == on.device and torch.equal(w.cpu().view(torch.int32), want.view(torch.int32))
    assert rt.last_move_report()["moves"][0]["check"] == "exact"
    f = rt.to_device(torch.randn(10_000) * 100, device)
    for dt in (torch.bfloat16, torch.float16):
        n = rt.cast(f, dt)
        assert torch.equal(n.cpu(), f.cpu().to(dt))
        assert rt.last_move_report()["moves"][0]["check"] == "sampled"
    # No device kernel for f64 -> f32: served through the host, checked.
    d = rt.to_device(torch.randn(100, dtype=torch.float64), device)
    assert torch.equal(rt.cast(d, torch.float32).cpu(), d.cpu().float())
    assert rt.last_move_report()["moves"][0]["rung"] == "via host"
    with pytest.raises(TypeError):
        rt.cast([1, 2], torch.float32)


@pytest.mark.parametrize("device", DEVICES)
def test_module_to_keeps_ties_buffers_and_grads(device):
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Embedding(10, 8), torch.nn.LayerNorm(8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 10)
    )
    m[3].weight = m[0].weight  # tied
    m(torch.arange(4)).sum().backward()
    ref = {k: v.clone() for k, v in m.state_dict().items()}
    grads = {k: p.grad.clone() for k, p in m.named_parameters()}
    out = rt.module_to(m, device, torch.bfloat16)
    assert out is m
    assert m[3].weight is m[0].weight
    dev = torch.device(device)
    for k, v in m.state_dict().items():
        assert v.device == dev, k
        want = ref[k].bfloat16() if ref[k].is_floating_point() else ref[k]
        assert torch.equal(v.cpu(), want), k
    assert m[2].num_batches_tracked.dtype == torch.int64
    for k, p in m.named_parameters():
        assert p.grad is not None and p.grad.device == dev
        assert torch.equal(p.grad.cpu(), grads[k].bfloat16()), k
    # Back to the CPU in float32 through the same call.
    rt.module_to(m, device, torch.float32)
    assert m[0].weight.dtype == torch.float32


@needs_hooks
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "rules,what",
    [
        ([("small_copy_lost", "every", 2)], "upload"),
        ([("copy_zeroed_range", "nth", 0)], "upload"),
        ([("copy_lands_garbage", "nth", 0)], "upload"),
        ([("copy_lands_stale", "nth", 0)], "upload"),
        ([("invalid_value_on_copy", "nth", 0)], "upload"),
        ([("invalid_value_on_large_copy", "always", 0)], "upload"),
        ([("pinned_refused_sticky", "nth", 0)], "upload"),
        ([("download_truncated", "nth", 0)], "download"),
        ([("convert_writes_zeros", "nth", 0)], "cast"),
    ],
)
def test_every_injected_fault_is_caught_and_served(device, rules, what):
    # New data each round: a lost copy must leave wrong bytes behind (a
    # GPU's caching allocator may hand back memory that already holds an
    # earlier round's identical bytes). Made before the faults are on.
    rounds = []
    for i in range(3):  # the odd-numbered copies are the lost ones
        b = batch(10 + i)
        # 12 MiB: the staged rung copies it in 8 MiB pieces, above the
        # large-copy limit (1 MiB); the small chunks (1 MiB) are not.
        big = torch.randn(3 << 20)
        on = rt.to_device(b, device) if what != "upload" else None
        big_on = rt.to_device(big, device) if what == "download" else None
        rounds.append((b, big, on, big_on))
    rt._inject_move_faults(rules, seed=3)
    caught = []
    for b, big, on, big_on in rounds:
        if what == "upload":
            # Small copies are lost: the small batch alone is one small copy.
            small = rules[0][0] == "small_copy_lost"
            out = rt.to_device({"b": b} if small else {"b": b, "big": big}, device)
            assert_same(out["b"]["latents"], b["latents"])
            assert_same(out["b"]["mask"], b["mask"])
            if not small:
                assert_same(out["big"], big)
            assert out["b"]["latents"].device == torch.device(device)
        elif what == "download":
            back = rt.to_cpu({"l": on["latents"], "big": big_on}, dtype=torch.float32)
            assert torch.equal(back["l"], b["latents"].float())
            assert torch.equal(back["big"], big)
        else:
            w = rt.cast(on["latents"], torch.float32)
            assert torch.equal(w.cpu(), b["latents"].float())
        r = rt.last_move_report()
        assert r["kept_on_host"] == []
        caught += r["caught"]
    assert rt._move_faults_injected(), "no fault was injected"
    assert caught, "an injected fault was not caught"


@needs_hooks
@pytest.mark.parametrize("device", DEVICES)
def test_when_every_rung_fails_nothing_wrong_is_returned(device):
    b = batch(2)
    m = torch.nn.Linear(4, 4)
    on = rt.to_device(b["latents"], device)
    rt._inject_move_faults([("copy_lands_zeros", "always", 0), ("download_truncated", "always", 0)])
    with pytest.warns(RuntimeWarning, match="stays on the CPU"):
        out = rt.to_device(b, device)
    # Uploads: kept on the CPU (reported), never zeros on the device.
    assert out["latents"] is b["latents"] and len(rt.last_move_report()["kept_on_host"]) >= 1
    # A model: all or nothing.
    before = m.weight.data_ptr()
    with pytest.raises(RuntimeError, match="module is unchanged"):
        rt.module_to(m, device)
    assert m.weight.device.type == "cpu" and m.weight.data_ptr() == before
    # Downloads: an error, not a truncated tensor.
    with pytest.raises(RuntimeError, match="download"):
        rt.to_cpu(on)


@pytest.mark.parametrize("device", DEVICES)
def test_verified_loader_moves_each_batch(device):
    data = [batch(i) for i in range(3)]
    loader = rt.VerifiedLoader(data, device)
    assert len(loader) == 3
    got = list(loader)
    assert len(got) == 3
    for g, d in zip(got, data):
        assert g["latents"].device == torch.device(device)
        assert_same(g["latents"], d["latents"])
    assert list(rt.VerifiedLoader([], device)) == []


@pytest.mark.parametrize("device", DEVICES)
def test_accelerate_prepared_loader_delivers_through_the_verified_path(device):
    accelerate = pytest.importorskip("accelerate")
    from torch.utils.data import DataLoader, TensorDataset

    from accelerate.state import AcceleratorState

    xs = torch.randn(10, 3).bfloat16()
    ys = torch.arange(10)
    # Accelerate's state is a process singleton: each device starts afresh.
    AcceleratorState._reset_state(True)
    acc = accelerate.Accelerator(cpu=device == "cpu")
    assert acc.device.type == torch.device(device).type
    dl = acc.prepare(DataLoader(TensorDataset(xs, ys), batch_size=4))
    assert rt.verify_dataloader(dl) is dl
    assert rt.verify_dataloader(dl) is dl  # idempotent
    seen = []
    for x, y in dl:
        r = rt.last_move_report()
        assert r["op"] == "to_device" and len(r["moves"]) == 1, str(r)
        assert x.device == torch.device(device) and y.device == torch.device(device)
        seen.append((x.cpu(), y.cpu()))
    assert torch.equal(torch.cat([x for x, _ in seen]), xs)
    assert torch.equal(torch.cat([y for _, y in seen]), ys)
    assert isinstance(dl, accelerate.data_loader.DataLoaderShard)
    with pytest.raises(TypeError, match="VerifiedLoader"):
        rt.verify_dataloader(DataLoader(TensorDataset(xs, ys)))


@pytest.mark.parametrize("device", DEVICES)
def test_latent_cache_flow_with_a_diffusers_vae(device, tmp_path):
    pytest.importorskip("diffusers")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    try:
        import cache_latents
    finally:
        sys.path.pop(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = cache_latents.run(device, str(tmp_path), clips=2, verbose=False)
    assert r["latents_exact"]
    assert (r["latents_dtype"], r["timesteps_dtype"], r["mask_dtype"]) == (
        torch.bfloat16,
        torch.int64,
        torch.bool,
    )
    assert r["report"]["caught"] == []


def test_devices_other_than_cpu_and_cuda_are_refused():
    with pytest.raises((ValueError, RuntimeError)):
        rt.to_device(torch.ones(2), "meta")
