"""The safetensors API, numpy framework, and what rocm_safe adds."""

import os
import subprocess
import sys

import numpy as np
import pytest

import rocm_safe
from rocm_safe import SafetensorError, safe_open
from rocm_safe.numpy import load, load_file, save, save_file

ml_dtypes = pytest.importorskip("ml_dtypes")


def sample():
    rng = np.random.default_rng(0)
    return {
        "f64": rng.standard_normal((3, 5)),
        "f32": rng.standard_normal((4, 6)).astype(np.float32),
        "f16": rng.standard_normal((2, 3, 4)).astype(np.float16),
        "bf16": rng.standard_normal((8, 2)).astype(ml_dtypes.bfloat16),
        "i64": np.arange(-5, 5, dtype=np.int64),
        "u64": np.arange(7, dtype=np.uint64) * np.uint64(2**40),
        "i32": np.arange(12, dtype=np.int32).reshape(3, 4),
        "u32": np.arange(3, dtype=np.uint32),
        "i16": np.arange(3, dtype=np.int16),
        "u16": np.arange(3, dtype=np.uint16),
        "i8": np.arange(-3, 3, dtype=np.int8),
        "u8": np.arange(250, 256, dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "c64": (np.arange(4) + 1j * np.arange(4)).astype(np.complex64),
        "f8": np.arange(6, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


def assert_same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    assert a.tobytes() == b.tobytes()


def test_import_does_not_import_torch():
    code = "import sys, rocm_safe, rocm_safe.numpy; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_round_trip_every_dtype(tmp_path):
    t = sample()
    p = tmp_path / "m.safetensors"
    save_file(t, p, metadata={"format": "np", "k": "v"})
    back = load_file(p)
    assert sorted(back) == sorted(t)
    for k in t:
        assert_same(back[k], t[k])
        assert back[k].flags.writeable
    assert load(p.read_bytes()).keys() == back.keys()
    for k, v in load(save(t)).items():
        assert_same(v, t[k])


def test_safe_open_api(tmp_path):
    t = sample()
    p = tmp_path / "m.safetensors"
    save_file(t, str(p), metadata={"a": "1"})
    with safe_open(p, framework="np") as f:
        assert f.keys() == sorted(t)
        assert sorted(f.offset_keys()) == sorted(t)
        assert f.metadata() == {"a": "1"}
        assert_same(f.get_tensor("f32"), t["f32"])
        s = f.get_slice("f32")
        assert s.get_shape() == [4, 6]
        assert s.get_dtype() == "F32"
        assert_same(s[1:3], t["f32"][1:3])
        assert_same(s[1:3, 2:5], t["f32"][1:3, 2:5])
        assert_same(s[2], t["f32"][2])
        assert_same(s[-1], t["f32"][-1])
        assert_same(s[:, 1], t["f32"][:, 1])
        assert_same(s[..., 1], t["f32"][..., 1])
        assert_same(s[::2], t["f32"][::2])
        assert_same(s[:, ::2], t["f32"][:, ::2])
        assert_same(s[:], t["f32"])
        assert_same(s[...], t["f32"])
        assert_same(f.get_slice("bf16")[3:5], t["bf16"][3:5])
        assert_same(f.get_slice("scalar")[...], t["scalar"])
        assert [f.get_slice(k).get_dtype() for k in ("f64", "bf16", "bool", "f8", "c64")] == [
            "F64",
            "BF16",
            "BOOL",
            "F8_E4M3",
            "C64",
        ]
        for bad in (np.s_[1, 2, 3], np.s_[10], np.s_[None], np.s_[..., ...]):
            with pytest.raises(SafetensorError):
                s[bad]
        with pytest.raises(SafetensorError, match="no tensor named"):
            f.get_tensor("missing")
        tensors = f.get_tensors()
        assert sorted(tensors) == sorted(t)
    with pytest.raises(SafetensorError, match="closed"):
        f.get_tensor("f32")


def test_no_metadata_is_none(tmp_path):
    p = tmp_path / "m.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, p)
    with safe_open(p, "numpy") as f:
        assert f.metadata() is None


def test_dtype_converts_floats_exactly(tmp_path):
    t = sample()
    p = tmp_path / "m.safetensors"
    save_file(t, p)
    out = load_file(p, dtype=np.float32)
    for k in ("bf16", "f16", "f64", "f32"):
        assert out[k].dtype == np.float32
    # bf16 and f16 -> f32 is exact; f64 -> f32 rounds to nearest even, as numpy does.
    assert_same(out["bf16"], t["bf16"].astype(np.float32))
    assert_same(out["f16"], t["f16"].astype(np.float32))
    assert_same(out["f64"], t["f64"].astype(np.float32))
    # fp8 (e4m3fn, e5m2) -> f32 is exact too.
    assert_same(out["f8"], t["f8"].astype(np.float32))
    # Other tensors as stored.
    for k in ("i64", "bool", "c64", "u8"):
        assert_same(out[k], t[k])
    for spelling in ("bfloat16", "BF16", ml_dtypes.bfloat16, "bf16"):
        assert load_file(p, dtype=spelling)["f32"].dtype == ml_dtypes.bfloat16
    assert_same(load_file(p, dtype="bfloat16")["f32"], t["f32"].astype(ml_dtypes.bfloat16))
    assert_same(load_file(p, dtype="float16")["bf16"], t["bf16"].astype(np.float16))
    with safe_open(p, "np", dtype="float32") as f:
        assert_same(f.get_slice("bf16")[2:6], t["bf16"][2:6].astype(np.float32))
        assert f.get_tensor("bf16", dtype="float16").dtype == np.float16
        assert f.get_slice("bf16").get_dtype() == "BF16"  # as stored
    assert load(p.read_bytes(), dtype="float32")["bf16"].dtype == np.float32
    for bad in ("int8", np.float64, "nope"):
        with pytest.raises(ValueError):
            load_file(p, dtype=bad)


def test_verify_is_validated(tmp_path):
    p = tmp_path / "m.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, p)
    for v in (None, True, False, "off", "fingerprint", "fused_fingerprint", "readback", "READBACK"):
        assert load_file(p, verify=v)["a"].shape == (2,)
    with pytest.raises(ValueError, match="verify"):
        load_file(p, verify="sometimes")
    with pytest.raises(ValueError):
        load_file(p, verify=3)


def test_framework_device_backend(tmp_path):
    p = tmp_path / "m.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, p)
    with pytest.raises(SafetensorError, match="framework"):
        safe_open(p, "tpu")
    with pytest.raises(SafetensorError, match="not supported for framework numpy"):
        safe_open(p, "np", device="cuda")
    with pytest.raises(SafetensorError):
        safe_open(p, "np", device="tpu")
    with safe_open(p, "np", backend="pread") as f:
        assert f.keys() == ["a"]
    with pytest.raises(SafetensorError, match="backend"):
        safe_open(p, "np", backend="nope")


def test_gpu_hook_validates_and_needs_a_gpu_build(tmp_path):
    p = tmp_path / "m.safetensors"
    save_file({"a": np.zeros(2, np.float32)}, p)
    ckpt = rocm_safe._native.Checkpoint(str(p))
    if not rocm_safe.features():
        with pytest.raises(RuntimeError, match="--features cuda"):
            rocm_safe._native.load_to_device(ckpt, ["a"], "cuda:1", "F32", "readback")
    with pytest.raises(SafetensorError, match="no tensor named"):
        rocm_safe._native.load_to_device(ckpt, ["b"], "cuda", None, "fingerprint")
    with pytest.raises(ValueError):
        rocm_safe._native.load_to_device(ckpt, ["a"], "cuda", None, "bogus")


def test_bf16_without_ml_dtypes_is_a_type_error(tmp_path):
    p = tmp_path / "m.safetensors"
    save_file({"w": np.ones(2, ml_dtypes.bfloat16)}, p)
    code = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import numpy as np, rocm_safe.numpy as rn\n"
        f"p = {str(p)!r}\n"
        "try:\n    rn.load_file(p)\nexcept TypeError as e:\n    assert 'bfloat16' in str(e), e\n"
        "else:\n    raise SystemExit('no TypeError')\n"
        "assert rn.load_file(p, dtype=np.float32)['w'].tolist() == [1.0, 1.0]\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_save_refuses_bad_input(tmp_path):
    p = tmp_path / "m.safetensors"
    with pytest.raises(ValueError):
        save_file([np.zeros(2)], p)
    with pytest.raises(ValueError):
        save_file({"a": [1, 2]}, p)
    with pytest.raises(ValueError):
        save_file({"a": np.zeros(2, dtype=object)}, p)
    with pytest.raises(TypeError):
        save_file({"a": np.zeros(2)}, p, metadata={"k": 1})
    with pytest.raises(SafetensorError, match="reserved"):
        save_file({"__metadata__": np.zeros(2)}, p)
    assert not p.exists()
    assert os.listdir(tmp_path) == []


def test_save_non_contiguous_and_big_endian(tmp_path):
    a = np.arange(20, dtype=np.float32).reshape(4, 5)
    b = np.arange(6, dtype=">i4")
    p = tmp_path / "m.safetensors"
    save_file({"t": a.T, "b": b}, p)
    back = load_file(p)
    np.testing.assert_array_equal(back["t"], a.T)
    np.testing.assert_array_equal(back["b"], b)
    assert back["b"].dtype == np.int32


def test_doctor():
    import json

    text = rocm_safe.doctor(json=True)
    report = json.loads(text)
    assert report["schema_version"] == 5 and report["self_tests"] and report["matrix"]
    # Schema 3: what this build compiled for AMD GPUs, and how to rebuild.
    # (a build without `hip` says how to rebuild; a hip build whose archs
    # cover every device has nothing to suggest).
    hb = report["hip_build"]
    assert isinstance(hb["built"], bool)
    assert hb["rebuild_command"] if not hb["built"] else ("archs" in hb and hb["archs"])
    # Schema 4: the library files in use, and none mapped twice.
    assert [f["library"] for f in report["runtime_files"]] == [
        "hip_runtime", "cuda_driver", "cudnn", "nvrtc", "miopen"
    ]
    assert report["duplicate_libraries"] == []
    assert all(m["status"] in ("verified", "falls_back", "skipped", "fails") for m in report["matrix"])


def test_doctor_table(capsys):
    report = rocm_safe.doctor()
    out = capsys.readouterr().out
    assert "Self-tests" in out and "Compatibility" in out
    assert isinstance(report, dict) and report["schema_version"] == 5
    # Schema 5: the verdict, the first and the last line of the table.
    lines = out.strip().splitlines()
    assert lines[0] == report["verdict"]["line"] == lines[-1]
    assert report["verdict"]["level"] in ("ready", "cpu_only", "fix", "failed")
    # One renderer (the library's): every section of the Rust doctor, the
    # host memory figures as the platform reports them, and commands for a
    # pip user rather than cargo.
    for section in (
        "Platform", "Libraries in use (this process)", "HIP kernels in this build",
        "Environment", "Self-tests", "Backends and devices",
    ):
        assert section in lines, section
    total = report["platform"]["memory_total_bytes"]
    if total:
        assert f"{total / (1 << 30):.1f} GiB total" in out
    assert "cargo run" not in out
    if not report["hip_build"]["built"]:
        assert report["hip_build"]["rebuild_command"].endswith('pip install ./python')
        assert 'MATURIN_PEP517_ARGS="--features hip" pip install ./python' in out
