"""The torch API (skipped where torch is not importable)."""

import numpy as np
import pytest

try:
    torch = pytest.importorskip("torch")
except Exception as e:  # installed but not importable (e.g. a CUDA wheel without its libraries)
    pytest.skip(f"torch is installed but cannot be imported: {e}", allow_module_level=True)
st = pytest.importorskip("safetensors")
stt = pytest.importorskip("safetensors.torch")

import rocm_safe  # noqa: E402
import rocm_safe.torch as rt  # noqa: E402
from rocm_safe import safe_open  # noqa: E402


def tensors():
    g = torch.Generator().manual_seed(0)
    out = {
        "f32": torch.randn(4, 6, generator=g),
        "bf16": torch.randn(8, 3, generator=g).to(torch.bfloat16),
        "f16": torch.randn(5, generator=g).to(torch.float16),
        "f64": torch.randn(2, 2, generator=g, dtype=torch.float64),
        "i64": torch.arange(10),
        "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
        "i8": torch.arange(-4, 4, dtype=torch.int8),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "c64": torch.arange(4, dtype=torch.float32).to(torch.complex64),
        "scalar": torch.tensor(1.5),
        "empty": torch.zeros(0, 3),
    }
    if hasattr(torch, "float8_e4m3fn"):
        out["f8"] = torch.arange(6, dtype=torch.float32).to(torch.float8_e4m3fn)
    if hasattr(torch, "uint16"):
        out["u16"] = torch.arange(5, dtype=torch.int32).to(torch.uint16)
    return out


def raw(t):
    flat = t.detach().contiguous().reshape(-1)
    if flat.is_complex():
        flat = torch.view_as_real(flat).reshape(-1)
    return bytes(flat.view(torch.uint8).numpy())


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, b.dtype, a.shape, b.shape)
    assert raw(a) == raw(b)


def test_round_trip_and_byte_identical_to_safetensors(tmp_path):
    t = tensors()
    p = tmp_path / "m.safetensors"
    rt.save_file(t, p, metadata={"format": "pt"})
    q = tmp_path / "theirs.safetensors"
    stt.save_file(t, q, metadata={"format": "pt"})
    assert p.read_bytes() == q.read_bytes()
    assert rt.save(t) == stt.save(t)
    ours, theirs = rt.load_file(p), stt.load_file(p)
    assert sorted(ours) == sorted(theirs) == sorted(t)
    for k in t:
        same(ours[k], theirs[k])
        same(ours[k], t[k])
    for k, v in rt.load(p.read_bytes()).items():
        same(v, t[k])


def test_safe_open_torch(tmp_path):
    t = tensors()
    p = tmp_path / "m.safetensors"
    stt.save_file(t, p)
    with safe_open(p, framework="pt") as f, st.safe_open(p, framework="pt") as g:
        assert f.keys() == g.keys()
        assert f.metadata() == g.metadata()
        for k in g.keys():
            same(f.get_tensor(k), g.get_tensor(k))
            assert f.get_slice(k).get_dtype() == g.get_slice(k).get_dtype()
            assert f.get_slice(k).get_shape() == g.get_slice(k).get_shape()
        for idx in (np.s_[1:3], np.s_[1:3, 1:2], np.s_[0], np.s_[:, 1], np.s_[::2]):
            same(f.get_slice("bf16")[idx], g.get_slice("bf16")[idx])
            same(f.get_slice("f32")[idx], g.get_slice("f32")[idx])
    with safe_open(p, framework="torch") as f:
        x = f.get_tensor("f32")
        x += 1  # writable, owned by Python
        assert isinstance(x, torch.Tensor)


def test_dtype_conversion_exact(tmp_path):
    t = tensors()
    p = tmp_path / "m.safetensors"
    rt.save_file(t, p)
    out = rt.load_file(p, dtype=torch.float32)
    for k in ("bf16", "f16", "f64"):
        assert out[k].dtype == torch.float32
        assert torch.equal(out[k], t[k].to(torch.float32))
    assert out["i64"].dtype == torch.int64
    down = rt.load_file(p, dtype=torch.bfloat16)
    assert torch.equal(down["f32"], t["f32"].to(torch.bfloat16))
    with safe_open(p, "pt", dtype="float32") as f:
        assert torch.equal(f.get_slice("bf16")[2:5], t["bf16"][2:5].to(torch.float32))


@pytest.mark.skipif(bool(rocm_safe.features()), reason="a GPU build (see test_gpu.py)")
def test_device_cuda_needs_a_gpu_build(tmp_path):
    p = tmp_path / "m.safetensors"
    rt.save_file({"a": torch.zeros(2)}, p)
    for device in ("cuda", "cuda:0", 0, torch.device("cuda", 1)):
        with pytest.raises(RuntimeError, match="--features cuda"):
            rt.load_file(p, device=device)
    with safe_open(p, "pt", device="cuda") as f:
        with pytest.raises(RuntimeError, match="without a GPU backend"):
            f.get_tensor("a")


def test_save_refusals_match_safetensors(tmp_path):
    base = torch.zeros(4, 4)
    for bad, exc in (
        ({"a": base, "b": base[0]}, RuntimeError),  # shared memory
        ({"a": base.t()[1:]}, ValueError),  # non contiguous
        ({"a": np.zeros(2)}, ValueError),
        ([base], ValueError),
    ):
        with pytest.raises(exc):
            stt.save_file(bad, tmp_path / "theirs.safetensors")
        with pytest.raises(exc):
            rt.save_file(bad, tmp_path / "ours.safetensors")
    assert not (tmp_path / "ours.safetensors").exists()
    # Non-overlapping views of one storage are fine for both.
    ok = {"a": base[:2], "b": base[2:]}
    rt.save_file(ok, tmp_path / "ok.safetensors")
    stt.save_file(ok, tmp_path / "ok2.safetensors")
    assert (tmp_path / "ok.safetensors").read_bytes() == (tmp_path / "ok2.safetensors").read_bytes()


def test_save_over_an_open_file_replaces_it_and_the_reader_keeps_its_bytes(tmp_path):
    # As safetensors: the save is a rename over the path; the open handle
    # keeps reading the file it opened.
    p = tmp_path / "m.safetensors"
    rt.save_file({"a": torch.ones(3)}, p)
    with safe_open(p, "pt") as f:
        rt.save_file({"a": f.get_tensor("a") * 2}, p)
        assert torch.equal(f.get_tensor("a"), torch.ones(3))
    assert torch.equal(rt.load_file(p)["a"], torch.full((3,), 2.0))


def test_requires_grad_and_import_isolation(tmp_path):
    p = tmp_path / "m.safetensors"
    w = torch.ones(2, requires_grad=True)
    rt.save_file({"w": w}, p)
    assert torch.equal(rt.load_file(p)["w"], torch.ones(2))
    assert rocm_safe.torch is rt
