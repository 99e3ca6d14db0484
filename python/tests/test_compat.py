"""The same files through the safetensors package and through rocm_safe."""

import numpy as np
import pytest

import rocm_safe
import rocm_safe.numpy as rn

st = pytest.importorskip("safetensors")
stn = pytest.importorskip("safetensors.numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")


def tensors(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "model.embed.weight": rng.standard_normal((16, 8)).astype(np.float32),
        "model.layers.0.attn.q": rng.standard_normal((8, 8)).astype(ml_dtypes.bfloat16),
        "model.layers.0.attn.k": rng.standard_normal((8, 8)).astype(np.float16),
        "model.layers.0.norm": rng.standard_normal(8),
        "position_ids": np.arange(32, dtype=np.int64).reshape(1, 32),
        "mask": rng.standard_normal(10) > 0,
        "zeros": np.zeros((0, 4), dtype=np.int32),
        "scalar": np.array(3, dtype=np.uint8),
        "a": np.arange(5, dtype=np.int16),
        "b": np.arange(5, dtype=np.uint32),
        "z": np.arange(4, dtype=np.complex64),
    }


def compare_dicts(ours, theirs):
    assert sorted(ours) == sorted(theirs)
    for k in theirs:
        assert ours[k].dtype == theirs[k].dtype, k
        assert ours[k].shape == theirs[k].shape, k
        assert ours[k].tobytes() == theirs[k].tobytes(), k


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}])
def test_save_is_byte_identical_to_safetensors(tmp_path, metadata):
    t = tensors()
    ours = rn.save(t, metadata=metadata)
    theirs = stn.save(t, metadata=metadata)
    assert ours == theirs
    rn.save_file(t, tmp_path / "a.safetensors", metadata=metadata)
    stn.save_file(t, tmp_path / "b.safetensors", metadata=metadata)
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()


def test_metadata_with_many_keys_round_trips(tmp_path):
    meta = {f"key{i}": f"value {i} \u00e9\"\\" for i in range(20)}
    rn.save_file(tensors(), tmp_path / "a.safetensors", metadata=meta)
    with st.safe_open(tmp_path / "a.safetensors", "np") as f:
        assert f.metadata() == meta
    stn.save_file(tensors(), tmp_path / "b.safetensors", metadata=meta)
    with rocm_safe.safe_open(tmp_path / "b.safetensors", "np") as f:
        assert f.metadata() == meta


@pytest.mark.parametrize("writer", ["ours", "theirs"])
def test_same_arrays_and_metadata_through_both_readers(tmp_path, writer):
    p = tmp_path / "m.safetensors"
    (rn if writer == "ours" else stn).save_file(tensors(1), p, metadata={"w": writer})
    compare_dicts(rn.load_file(p), stn.load_file(p))
    # safetensors.numpy.load (bytes) has no BF16 (a KeyError): compare without it.
    plain = {k: v for k, v in tensors(1).items() if v.dtype != ml_dtypes.bfloat16}
    data = (rn if writer == "ours" else stn).save(plain)
    compare_dicts(rn.load(data), stn.load(data))
    with rocm_safe.safe_open(p, "np") as ours, st.safe_open(p, "np") as theirs:
        assert ours.keys() == theirs.keys()
        assert ours.offset_keys() == theirs.offset_keys()
        assert ours.metadata() == theirs.metadata()
        for k in theirs.keys():
            a, b = ours.get_slice(k), theirs.get_slice(k)
            assert a.get_shape() == b.get_shape()
            assert a.get_dtype() == b.get_dtype()
            if a.get_shape() and a.get_shape()[0] >= 2:
                assert a[1:2].tobytes() == b[1:2].tobytes()
                assert a[0].tobytes() == b[0].tobytes()
                assert a[:, ...].tobytes() == b[:, ...].tobytes()
            assert ours.get_tensor(k).tobytes() == theirs.get_tensor(k).tobytes()


def test_our_conversion_matches_the_reference(tmp_path):
    p = tmp_path / "m.safetensors"
    stn.save_file(tensors(2), p)
    ref = stn.load_file(p)
    ours = rn.load_file(p, dtype="float32")
    for k in ("model.layers.0.attn.q", "model.layers.0.attn.k", "model.layers.0.norm", "model.embed.weight"):
        assert ours[k].tobytes() == ref[k].astype(np.float32).tobytes(), k


def test_code_written_for_safetensors_catches_our_refusals(tmp_path):
    # `except safetensors.SafetensorError` keeps working after switching
    # imports: ours derives from it where safetensors is installed.
    import safetensors

    import rocm_safe
    from rocm_safe.numpy import load_file

    assert issubclass(rocm_safe.SafetensorError, safetensors.SafetensorError)
    p = tmp_path / "bad.safetensors"
    p.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{oops}  ")
    try:
        load_file(p)
    except safetensors.SafetensorError as e:
        assert isinstance(e, rocm_safe.SafetensorError)
    else:
        raise AssertionError("not refused")


def test_without_safetensors_our_exception_stands_alone():
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['safetensors'] = None\n"
        "import rocm_safe\n"
        "assert rocm_safe.SafetensorError.__mro__[1] is Exception, rocm_safe.SafetensorError.__mro__\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == b"ok", out.stderr.decode(errors="replace")
