"""GPU loading: rocm_safe.torch.load_file(device="cuda:0") against
safetensors.torch.load_file(device="cuda"), the DLPack lifetime, the load
report. Skipped unless torch.cuda is available (the conv3d tests, CPU and
GPU, are in test_conv3d.py)."""

import gc
import json
import re

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (torch.cuda)")

st = pytest.importorskip("safetensors.torch")

import rocm_safe  # noqa: E402
from rocm_safe import _native  # noqa: E402
from rocm_safe import torch as rt  # noqa: E402

MiB = 1 << 20


def test_the_wheel_has_a_gpu_backend():
    assert set(rocm_safe.features()) & {"cuda", "hip"}, (
        "this wheel was built without --features cuda / --features hip"
    )


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "f32": torch.randn(257, 33, generator=g),
        "f16": torch.randn(64, 65, generator=g).half(),
        "bf16": torch.randn(3, 1000, generator=g).bfloat16(),
        "f64": torch.randn(17, generator=g).double(),
        "i64": torch.randint(-(2**40), 2**40, (31,), generator=g),
        "i32": torch.randint(-1000, 1000, (4, 5), generator=g, dtype=torch.int32),
        "i8": torch.randint(-128, 127, (100,), generator=g, dtype=torch.int8),
        "u8": torch.randint(0, 255, (7, 3), generator=g, dtype=torch.uint8),
        "bool": torch.rand(11, generator=g) > 0.5,
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "big_bf16": torch.randn(2048, 1024, generator=g).bfloat16(),  # several ring slots
    }


def raw(t):
    """The bytes of a tensor (bit-exact comparisons, NaN payloads included)."""
    t = t.detach().cpu().contiguous().reshape(-1)
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert raw(a) == raw(b)


@pytest.fixture
def ckpt(tmp_path):
    path = tmp_path / "m.safetensors"
    st.save_file(tensors(), str(path), metadata={"format": "pt"})
    return path


@pytest.fixture
def sharded(tmp_path):
    ts = tensors(1)
    names = sorted(ts)
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        f = f"model-0000{i + 1}-of-00002.safetensors"
        st.save_file({n: ts[n] for n in part}, str(tmp_path / f))
        weight_map.update({n: f for n in part})
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return index, sorted(set(weight_map.values()))


def test_load_file_is_bit_exact(ckpt):
    ours = rt.load_file(ckpt, device="cuda:0")
    ref = st.load_file(str(ckpt), device="cuda")
    assert sorted(ours) == sorted(ref)
    for k in ref:
        assert ours[k].device == torch.device("cuda", 0), k
        same(ours[k], ref[k])


def test_load_file_converts_to_float32(ckpt):
    ours = rt.load_file(ckpt, device="cuda:0", dtype=torch.float32)
    ref = st.load_file(str(ckpt), device="cuda")
    for k, r in ref.items():
        want = r.float() if r.is_floating_point() else r
        same(ours[k], want)


@pytest.mark.parametrize("verify", ["off", "fingerprint", "fused_fingerprint", "readback"])
def test_every_policy_loads_the_same(ckpt, verify):
    ours = rt.load_file(ckpt, device=0, dtype="bfloat16", verify=verify)
    ref = st.load_file(str(ckpt), device="cuda")
    for k, r in ref.items():
        same(ours[k], r.bfloat16() if r.is_floating_point() else r)


def test_sharded_index(sharded):
    index, files = sharded
    ours = rt.load_file(index, device="cuda:0")
    ref = {}
    for f in files:
        ref.update(st.load_file(str(index.parent / f), device="cuda"))
    assert sorted(ours) == sorted(ref)
    for k in ref:
        same(ours[k], ref[k])


def test_safe_open_on_the_gpu(ckpt):
    ref = st.load_file(str(ckpt), device="cuda")
    with rocm_safe.safe_open(ckpt, framework="pt", device="cuda:0") as f:
        t = f.get_tensor("f32")
        part = f.get_slice("bf16")[1:3, 10:20]
    same(t, ref["f32"])
    same(part, ref["bf16"][1:3, 10:20].contiguous())
    assert part.device.type == "cuda"


def test_load_report(ckpt):
    rt.load_file(ckpt, device="cuda:0", dtype=torch.float32)
    r = rt.last_load_report()
    assert r is not None
    text = str(r)
    # The throughput in a unit that fits the load (a small one reads MB/s).
    assert "tensors" in text and re.search(r"[0-9.]+ [kMG]B/s", text), text
    d = r.to_dict()
    assert len(d["tensors"]) == len(tensors())
    assert d["file_bytes"] == sum(t.numel() * t.element_size() for t in tensors().values())
    assert d["all_fast"], text
    assert {t["name"] for t in d["tensors"]} == set(tensors())
    assert r["device"].startswith("cuda:0") or r["device"].startswith("hip:0")


def test_missing_tensor_and_closed_file(ckpt):
    f = rocm_safe.safe_open(ckpt, framework="pt", device="cuda:0")
    with pytest.raises(rocm_safe.SafetensorError):
        f.get_tensor("nope")
    f.close()
    with pytest.raises(rocm_safe.SafetensorError, match="closed"):
        f.get_tensor("f32")


def _free():
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(0)[0]


def _sync():
    """rocm-safe's sync point: frees what torch released since the last."""
    _native.device_synchronize("cuda:0", rt._backend(), False)


def test_tensors_outlive_the_file_and_free_with_the_last_one(tmp_path):
    n = 16 * MiB  # f32 elements: 64 MiB
    path = tmp_path / "big.safetensors"
    st.save_file({"big": torch.arange(n, dtype=torch.float32)}, str(path))
    dev, backend = "cuda:0", rt._backend()
    rt.load_file(path, device=dev)  # warm: the loader's staging is made once
    gc.collect()
    _sync()
    free0, owned0 = _free(), _native.device_owned_bytes(dev, backend)

    with rocm_safe.safe_open(path, framework="pt", device=dev) as f:
        t = f.get_tensor("big")
    # The file is closed; the tensor is torch's, memory lent by rocm-safe
    # (the sync frees the load's own temporaries).
    _sync()
    assert _native.device_owned_bytes(dev, backend) == owned0
    assert free0 - _free() >= 4 * n - 4 * MiB
    view = t[1:]  # shares the storage
    del t
    gc.collect()
    _sync()
    assert free0 - _free() >= 4 * n - 4 * MiB, "freed while a view was alive"
    assert float(view[-1]) == n - 1
    del view
    gc.collect()
    # The deleter gave the memory back: rocm-safe owns it until its next
    # sync point frees it.
    assert _native.device_owned_bytes(dev, backend) == owned0 + 4 * n
    _sync()
    assert _native.device_owned_bytes(dev, backend) == owned0
    assert abs(_free() - free0) <= 4 * MiB


def test_an_unconsumed_capsule_frees_its_memory(tmp_path):
    path = tmp_path / "c.safetensors"
    st.save_file({"x": torch.ones(4 * MiB)}, str(path))
    dev, backend = "cuda:0", rt._backend()
    ck = _native.Checkpoint(str(path))
    _native.load_to_device(ck, ["x"], dev, None, "fingerprint", backend)  # warm
    gc.collect()
    _sync()
    owned0 = _native.device_owned_bytes(dev, backend)
    caps = _native.load_to_device(ck, ["x"], dev, None, "fingerprint", backend)
    _sync()
    assert _native.device_owned_bytes(dev, backend) == owned0  # lent out
    del caps  # never consumed: the capsule's destructor runs the deleter
    gc.collect()
    assert _native.device_owned_bytes(dev, backend) == owned0 + 16 * MiB
    _sync()
    assert _native.device_owned_bytes(dev, backend) == owned0
    # A consumed capsule is not deleted twice.
    ((_, cap),) = _native.load_to_device(ck, ["x"], dev, None, "fingerprint", backend)
    t = torch.from_dlpack(cap)
    del cap
    gc.collect()
    assert float(t.sum()) == 4 * MiB
    del t
    gc.collect()
    _sync()
    assert _native.device_owned_bytes(dev, backend) == owned0
