"""Every malformed file the safetensors package refuses is refused by
rocm_safe too (as SafetensorError), and so are the files rocm_safe refuses
beyond it."""

import json
import struct

import numpy as np
import pytest

import rocm_safe
import rocm_safe.numpy as rn
from conftest import raw_file

st = pytest.importorskip("safetensors")
stn = pytest.importorskip("safetensors.numpy")

F32_4 = struct.pack("<4f", 1.0, 2.0, 3.0, 4.0)


def t(dtype="F32", shape=(4,), offsets=(0, 16)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


# name -> file bytes. Each is malformed; the test finds out which ones the
# safetensors package refuses, and requires rocm_safe to refuse those.
CORPUS = {
    "empty file": b"",
    "7 bytes": b"\x01\x00\x00\x00\x00\x00\x00",
    "length only": struct.pack("<Q", 0),
    "header past the end": struct.pack("<Q", 1000) + b"{}      ",
    "header length 2^64-1": struct.pack("<Q", 2**64 - 1) + b"{}      ",
    "header over 100 MB": struct.pack("<Q", 100_000_008) + b"{}      ",
    "not utf-8": raw_file(b'{"a\xff":1}'),
    "not json": raw_file("{not json}"),
    "json array": raw_file("[1, 2, 3]"),
    "json string": raw_file('"abc"'),
    "leading space": raw_file(' {"a":' + json.dumps(t()) + "}", F32_4),
    "nul padding": raw_file(b"{}\x00\x00\x00\x00\x00\x00", pad=False),
    "truncated json": raw_file('{"a": {"dtype": "F32"'),
    "unknown dtype": raw_file({"a": t("F128")}, F32_4),
    "lowercase dtype": raw_file({"a": t("f32")}, F32_4),
    "negative shape": raw_file({"a": t(shape=(-4,))}, F32_4),
    "float shape": raw_file({"a": t(shape=(4.0,))}, F32_4),
    "string shape": raw_file({"a": {"dtype": "F32", "shape": "4", "data_offsets": [0, 16]}}, F32_4),
    "shape too small for span": raw_file({"a": t(shape=(3,))}, F32_4),
    "shape too large for span": raw_file({"a": t(shape=(5,))}, F32_4),
    "begin after end": raw_file({"a": t(offsets=(16, 0))}, F32_4),
    "offsets past the end": raw_file({"a": t(offsets=(16, 32))}, F32_4),
    "three offsets": raw_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8, 16]}}, F32_4),
    "one offset": raw_file({"a": {"dtype": "F32", "shape": [4], "data_offsets": [16]}}, F32_4),
    "negative offset": raw_file({"a": t(offsets=(-16, 0))}, F32_4),
    "missing dtype": raw_file({"a": {"shape": [4], "data_offsets": [0, 16]}}, F32_4),
    "missing shape": raw_file({"a": {"dtype": "F32", "data_offsets": [0, 16]}}, F32_4),
    "missing offsets": raw_file({"a": {"dtype": "F32", "shape": [4]}}, F32_4),
    "entry not an object": raw_file({"a": [1, 2, 3]}, F32_4),
    "entry a string": raw_file({"a": "F32"}, F32_4),
    "shape overflows": raw_file({"a": t(shape=(2**62, 2**62, 16))}, F32_4),
    "byte size overflows": raw_file({"a": t(shape=(2**62,))}, F32_4),
    "metadata value not a string": raw_file({"__metadata__": {"k": 1}, "a": t()}, F32_4),
    "metadata nested": raw_file({"__metadata__": {"k": {"x": "y"}}, "a": t()}, F32_4),
    "metadata a list": raw_file({"__metadata__": ["k"], "a": t()}, F32_4),
    "hole between tensors": raw_file({"a": t(shape=(1,), offsets=(0, 4)), "b": t(shape=(2,), offsets=(8, 16))}, F32_4),
    "hole at the start": raw_file({"a": t(shape=(3,), offsets=(4, 16))}, F32_4),
    "trailing bytes": raw_file({"a": t(shape=(3,), offsets=(0, 12))}, F32_4),
    "overlapping tensors": raw_file(
        {"a": t(shape=(3,), offsets=(0, 12)), "b": t(shape=(3,), offsets=(4, 16))}, F32_4
    ),
    "same span twice": raw_file({"a": t(), "b": t()}, F32_4),
    "tensor past data": raw_file({"a": t(shape=(8,), offsets=(0, 32))}, F32_4),
    "git lfs pointer": (
        b"version https://git-lfs.github.com/spec/v1\n"
        b"oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\n"
        b"size 12345\n"
    ),
    "duplicate tensor name": raw_file(
        '{"a":' + json.dumps(t(shape=(2,), offsets=(0, 8))) + ',"a":' + json.dumps(t(shape=(2,), offsets=(8, 16))) + "}",
        F32_4,
    ),
    "duplicate after unescaping": raw_file(
        '{"a":' + json.dumps(t(shape=(2,), offsets=(0, 8))) + ',"\\u0061":' + json.dumps(t(shape=(2,), offsets=(8, 16))) + "}",
        F32_4,
    ),
    "duplicate field in entry": raw_file('{"a":{"dtype":"F32","dtype":"F32","shape":[4],"data_offsets":[0,16]}}', F32_4),
    "duplicate metadata key": raw_file('{"__metadata__":{"k":"1","k":"2"},"a":' + json.dumps(t()) + "}", F32_4),
    "unknown field in entry": raw_file({"a": {**t(), "extra": 1}}, F32_4),
}

# What rocm_safe refuses beyond safetensors (each must be refused by us,
# whatever safetensors does with it).
OURS_ONLY = {
    "git lfs pointer",
    "duplicate tensor name",
    "duplicate after unescaping",
    "duplicate field in entry",
    "duplicate metadata key",
    "overlapping tensors",
    "same span twice",
    "unknown field in entry",
    "trailing bytes",
    "hole between tensors",
    "leading space",
}


def safetensors_refuses(path):
    try:
        with st.safe_open(str(path), "np") as f:
            for k in f.keys():
                f.get_tensor(k)
    except Exception:
        return True
    return False


def safetensors_refuses_bytes(data):
    try:
        stn.load(data)
    except Exception:
        return True
    return False


def rocm_safe_error(path):
    """The SafetensorError rocm_safe raises for ``path`` (open or read), or None."""
    try:
        with rocm_safe.safe_open(path, "np") as f:
            for k in f.keys():
                f.get_tensor(k)
    except rocm_safe.SafetensorError as e:
        return e
    return None


def test_corpus_is_malformed_for_someone():
    # Every case is refused by safetensors or listed as one of ours.
    for name, data in CORPUS.items():
        assert name in OURS_ONLY or safetensors_refuses_bytes(data), name


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_refused_like_safetensors(tmp_path, name):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(CORPUS[name])
    if safetensors_refuses(p) or name in OURS_ONLY:
        err = rocm_safe_error(p)
        assert err is not None, f"{name}: accepted by rocm_safe"
        assert str(p) in str(err), f"{name}: message does not name the file: {err}"
    else:
        pytest.fail(f"{name}: not refused by safetensors and not one of ours")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_refused_as_bytes(name):
    data = CORPUS[name]
    if safetensors_refuses_bytes(data) or name in OURS_ONLY:
        with pytest.raises(rocm_safe.SafetensorError):
            rn.load(data)


@pytest.mark.parametrize(
    "name,needle",
    [
        ("git lfs pointer", "git lfs"),
        ("duplicate tensor name", "duplicate key"),
        ("duplicate after unescaping", "duplicate key"),
        ("duplicate field in entry", "duplicate key"),
        ("duplicate metadata key", "duplicate key"),
        ("overlapping tensors", "overlap"),
        ("same span twice", "overlap"),
        ("unknown field in entry", "extra"),
        ("trailing bytes", "trailing"),
        ("hole between tensors", "hole"),
        ("leading space", "start"),
    ],
)
def test_our_extra_refusals_say_why(tmp_path, name, needle):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(CORPUS[name])
    err = rocm_safe_error(p)
    assert err is not None and needle in str(err).lower(), (name, err)


def test_valid_edge_cases_are_accepted(tmp_path):
    cases = {
        "empty header": raw_file("{}"),
        "only metadata": raw_file({"__metadata__": {"k": "v"}}),
        "zero-size tensor": raw_file({"a": t(shape=(0, 4), offsets=(0, 0))}),
        "scalar": raw_file({"a": t(shape=(), offsets=(0, 4))}, F32_4[:4]),
        "unpadded header": raw_file({"a": t()}, F32_4, pad=False),
        "tensors out of header order": raw_file(
            {"b": t(shape=(2,), offsets=(8, 16)), "a": t(shape=(2,), offsets=(0, 8))}, F32_4
        ),
    }
    for name, data in cases.items():
        p = tmp_path / "ok.safetensors"
        p.write_bytes(data)
        assert not safetensors_refuses(p), name
        assert rocm_safe_error(p) is None, name
        ours, theirs = rn.load_file(p), stn.load_file(p)
        assert sorted(ours) == sorted(theirs)
        for k in ours:
            assert ours[k].tobytes() == theirs[k].tobytes() and ours[k].shape == theirs[k].shape


def test_error_names_the_tensor(tmp_path):
    p = tmp_path / "bad.safetensors"
    p.write_bytes(raw_file({"weight.q": t("F99")}, F32_4))
    err = rocm_safe_error(p)
    assert "weight.q" in str(err)


def test_truncated_after_open_is_refused(tmp_path):
    p = tmp_path / "m.safetensors"
    rn.save_file({"a": np.arange(1024, dtype=np.float32)}, p)
    with rocm_safe.safe_open(p, "np") as f:
        with open(p, "r+b") as g:
            g.truncate(100)
        with pytest.raises(rocm_safe.SafetensorError, match="shrank|changed"):
            f.get_tensor("a")
