"""F4, F6_E2M3, F6_E3M2 and F8_E8M0 tensors: files the safetensors package
wrote load (torch's types where torch has them, else the packed bytes),
saves are byte-identical to the package's, and every conversion that is not
defined is a SafetensorError (never a TypeError)."""

import io
import json
import struct

import numpy as np
import pytest

import rocm_safe
import rocm_safe.numpy as rn
from rocm_safe import SafetensorError, safe_open

ml_dtypes = pytest.importorskip("ml_dtypes")


def raw(header, data=b""):
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


# Hand-made: what no framework can write. F6: 4 elements in 3 bytes.
F6_FILE = raw(
    {
        "rows": entry("F6_E2M3", [2, 8], 0, 12),  # last dim 8 * 6 bits = 6 bytes
        "flat": entry("F6_E3M2", [2, 2], 12, 15),  # 4 elements, rows of 12 bits
        "vec": entry("F6_E3M2", [4], 15, 18),
        "f4_odd": entry("F4", [2, 3], 18, 21),  # rows of 3 elements, 12 bits
        "f4_vec": entry("F4", [6], 21, 24),
    },
    bytes(range(24)),
)


@pytest.fixture
def f6(tmp_path):
    p = tmp_path / "f6.safetensors"
    p.write_bytes(F6_FILE)
    return p


def test_packed_bytes_in_numpy(f6):
    t = rn.load_file(f6)
    data = bytes(range(24))
    assert t["rows"].dtype == np.uint8 and t["rows"].shape == (2, 6) and t["rows"].tobytes() == data[:12]
    assert t["flat"].shape == (3,) and t["flat"].tobytes() == data[12:15]
    assert t["vec"].shape == (3,) and t["vec"].tobytes() == data[15:18]
    assert t["f4_odd"].shape == (3,) and t["f4_vec"].shape == (3,) and t["f4_vec"].tobytes() == data[21:24]
    assert rn.load(F6_FILE)["rows"].shape == (2, 6)
    first = ("rows", {"shape": [2, 8], "dtype": "F6_E2M3", "data": bytearray(data[:12])})
    assert rocm_safe.deserialize(F6_FILE)[0] == first
    with safe_open(f6, "np") as f:
        s = f.get_slice("rows")
        assert s.get_shape() == [2, 8] and s.get_dtype() == "F6_E2M3"
        assert s[1].tobytes() == data[6:12] and s[1].shape == (6,)
        assert s[::-1].tobytes() == data[6:12] + data[:6] and s[:].shape == (2, 6)
        assert f.get_slice("vec")[:].tobytes() == data[15:18]
        # Inside a row, or rows that are not whole bytes: refused.
        for name, index in [("rows", np.s_[:, :4]), ("rows", np.s_[0, 1]), ("vec", np.s_[:2]), ("flat", np.s_[0])]:
            with pytest.raises(SafetensorError, match="packs several elements per byte"):
                f.get_slice(name)[index]
        # dtype= converts float tensors only: these stay as stored.
        assert f.get_tensor("rows", dtype=np.float32).dtype == np.uint8


def test_the_package_refuses_what_we_load(f6):
    st = pytest.importorskip("safetensors")
    with st.safe_open(f6, "np") as f:
        with pytest.raises(Exception, match="Dtype not understood"):
            f.get_tensor("rows")


def test_f6_in_torch_and_odd_f4(f6):
    torch = pytest.importorskip("torch")
    with safe_open(f6, "pt") as f:
        t = f.get_tensor("rows")
        assert t.dtype == torch.uint8 and tuple(t.shape) == (2, 6)
        assert f.get_slice("rows")[1].tolist() == list(range(6, 12))
        # F4 with an odd last dimension has no float4_e2m1fn_x2 form.
        for name in ("f4_odd",):
            with pytest.raises(SafetensorError, match="last dimension must be even"):
                f.get_tensor(name)
        assert f.get_tensor("f4_vec").dtype == torch.float4_e2m1fn_x2
    with pytest.raises(SafetensorError, match="last dimension must be even"):
        rocm_safe.torch.load_file(f6)
    with pytest.raises(SafetensorError, match="last dimension must be even"):
        rocm_safe.torch.load(F6_FILE)


def torch_tensors():
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("torch < 2.8: no float4_e2m1fn_x2")
    g = torch.Generator().manual_seed(0)
    return {
        "f4": torch.randint(0, 256, (3, 4), dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2),
        "f4_3d": torch.randint(0, 256, (2, 2, 1), dtype=torch.uint8, generator=g).view(torch.float4_e2m1fn_x2),
        "e8m0": torch.tensor([0.5, 2.0, 1024.0], dtype=torch.float8_e8m0fnu),
        "f32": torch.arange(4, dtype=torch.float32),
    }


def bytes_of(t):
    import torch

    return t.contiguous().view(torch.uint8).numpy().tobytes()


def test_torch_files_the_package_wrote_load(tmp_path):
    torch = pytest.importorskip("torch")
    stt = pytest.importorskip("safetensors.torch")
    src = torch_tensors()
    p = tmp_path / "theirs.safetensors"
    stt.save_file(src, p)
    header = json.loads(p.read_bytes()[8 : 8 + struct.unpack("<Q", p.read_bytes()[:8])[0]])
    assert header["f4"]["dtype"] == "F4" and header["f4"]["shape"] == [3, 8]
    for loaded in (rocm_safe.torch.load_file(p), rocm_safe.torch.load(p.read_bytes())):
        for k, t in src.items():
            assert loaded[k].dtype == t.dtype and loaded[k].shape == t.shape, k
            assert bytes_of(loaded[k]) == bytes_of(t), k
    with open(p, "rb") as f, safe_open(f, "pt") as g:
        assert bytes_of(g.get_tensor("f4")) == bytes_of(src["f4"])
        s = g.get_slice("f4")
        assert s.get_shape() == [3, 8]
        assert s[1:].shape == (2, 4) and bytes_of(s[1:]) == bytes_of(src["f4"][1:])
        assert s[2].shape == (4,) and bytes_of(s[2]) == bytes_of(src["f4"][2])
        assert bytes_of(g.get_slice("f4_3d")[1]) == bytes_of(src["f4_3d"][1])
    # numpy: E8M0 as ml_dtypes' type, F4 as its packed bytes.
    n = rn.load_file(p)
    assert n["e8m0"].dtype == ml_dtypes.float8_e8m0fnu and n["e8m0"].astype(np.float32).tolist() == [0.5, 2.0, 1024.0]
    assert n["f4"].dtype == np.uint8 and n["f4"].shape == (3, 4) and n["f4"].tobytes() == bytes_of(src["f4"])


def test_torch_saves_are_the_package_bytes(tmp_path):
    stt = pytest.importorskip("safetensors.torch")
    src = torch_tensors()
    ours = rocm_safe.torch.save(src)
    assert ours == stt.save(src)
    rocm_safe.torch.save_file(src, tmp_path / "a.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == ours
    back = stt.load_file(tmp_path / "a.safetensors")
    assert back["f4"].shape == src["f4"].shape and bytes_of(back["f4"]) == bytes_of(src["f4"])


def test_f4_save_refusals_and_numpy_types(tmp_path):
    torch = pytest.importorskip("torch")
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("torch < 2.8")
    with pytest.raises(SafetensorError, match="0-d float4_e2m1fn_x2"):
        rocm_safe.torch.save({"a": torch.zeros((), dtype=torch.uint8).view(torch.float4_e2m1fn_x2)})
    # ml_dtypes' float4/float6 hold one element per byte: not F4/F6.
    for dt in (ml_dtypes.float4_e2m1fn, ml_dtypes.float6_e2m3fn):
        with pytest.raises(ValueError, match="cannot be saved"):
            rn.save({"a": np.zeros(2, dt)})
    # E8M0 from numpy saves as F8_E8M0 and reloads.
    e = np.array([0.25, 8.0]).astype(ml_dtypes.float8_e8m0fnu)
    data = rn.save({"e": e})
    assert b'"F8_E8M0"' in data and rn.load(data)["e"].tobytes() == e.tobytes()
    t = rocm_safe.torch.load(data)["e"]
    assert t.dtype == torch.float8_e8m0fnu and t.float().tolist() == [0.25, 8.0]


def test_stream_of_sub_byte_tensors():
    with safe_open(io.BytesIO(F6_FILE), "np") as f:
        assert f.get_tensor("rows").shape == (2, 6) and f.get_slice("rows")[0].tobytes() == bytes(range(6))


def test_gpu_loads_take_sub_byte_tensors_through_the_host(tmp_path, monkeypatch):
    # DLPack has no F4/F6: those are read on the host and moved; the rest
    # goes to the verified GPU loader (both stubbed here: no GPU needed).
    torch = pytest.importorskip("torch")
    src = torch_tensors()
    p = tmp_path / "m.safetensors"
    rocm_safe.torch.save_file(src, p)
    asked = []

    def loader(ckpt, names, device, target, verify, backend):
        asked.append(list(names))
        return [(n, torch.utils.dlpack.to_dlpack(src[n].clone())) for n in names]

    monkeypatch.setattr(rocm_safe._native, "load_to_device", loader)
    moved = []
    monkeypatch.setattr(torch.Tensor, "to", lambda self, device: moved.append(device) or self)
    with safe_open(p, "pt", device="cuda:0") as f:
        out = f.get_tensors()
        order = f.offset_keys()
    assert sorted(asked[0]) == ["e8m0", "f32"] and len(asked) == 1, asked
    assert list(out) == order and sorted(order) == sorted(src)
    assert out["f4"].dtype == torch.float4_e2m1fn_x2 and bytes_of(out["f4"]) == bytes_of(src["f4"])
    assert moved.count("cuda:0") >= 2  # f4 and f4_3d
