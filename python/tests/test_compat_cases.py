"""One script, run against the safetensors package and against rocm_safe,
case by case: the results must be equal, or both must raise, ours an
instance of the class safetensors raised (so the ``except`` written for
safetensors catches ours).

Where rocm_safe differs on purpose (python/README.md, "What differs from
safetensors"), the case asserts what each side does, so that a change on
either side is noticed.

Never point safetensors' writer at a device node: as root it replaces
``/dev/full`` with a regular file.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import types

import numpy as np
import pytest

import rocm_safe
import rocm_safe.numpy as rn

st = pytest.importorskip("safetensors")
stn = pytest.importorskip("safetensors.numpy")
ml_dtypes = pytest.importorskip("ml_dtypes")

THEIRS = types.SimpleNamespace(name="safetensors", safe_open=st.safe_open, np=stn, Error=st.SafetensorError)
OURS = types.SimpleNamespace(name="rocm_safe", safe_open=rocm_safe.safe_open, np=rn, Error=rocm_safe.SafetensorError)


def raw(header, data=b""):
    """A safetensors file's bytes: ``header`` (a dict, or bytes verbatim)
    padded with spaces to 8 bytes, then ``data``."""
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def put(d, name, content):
    p = d / name
    p.write_bytes(content)
    return p


def norm(x):
    """A comparable form of a result: arrays by dtype, shape and bytes;
    dicts as ordered pairs (key order is compared too)."""
    if isinstance(x, np.ndarray) or type(x).__module__ == "numpy":
        a = np.asarray(x)
        return ("array", a.dtype.str, a.dtype.name, a.shape, a.tobytes())
    if isinstance(x, dict):
        return ("dict", [(k, norm(v)) for k, v in x.items()])
    if isinstance(x, (list, tuple)):
        return [norm(v) for v in x]
    return x


def run(case, lib, d):
    d.mkdir(parents=True)
    try:
        return ("ok", norm(case(lib, d)))
    except Exception as e:  # noqa: BLE001 - the outcome being compared
        return ("raised", e)


def outcomes(case, tmp_path):
    return run(case, THEIRS, tmp_path / "theirs"), run(case, OURS, tmp_path / "ours")


def assert_same(case, tmp_path):
    theirs, ours = outcomes(case, tmp_path)
    if theirs[0] == "raised":
        assert ours[0] == "raised", f"safetensors raised {theirs[1]!r}, rocm_safe returned {ours[1]!r}"
        assert isinstance(ours[1], type(theirs[1])), f"safetensors: {theirs[1]!r}; rocm_safe: {ours[1]!r}"
        if isinstance(theirs[1], st.SafetensorError):
            assert isinstance(ours[1], rocm_safe.SafetensorError)
    else:
        assert ours[0] == "ok", f"safetensors returned, rocm_safe raised {ours[1]!r}"
        assert ours[1] == theirs[1]
    return theirs, ours


# --------------------------------------------------------------------------
# The cases both libraries must agree on. Each takes (lib, folder).

ALL_DTYPES = {
    "f64": np.arange(6, dtype=np.float64).reshape(2, 3) / 3,
    "f32": np.linspace(-1, 1, 8, dtype=np.float32),
    "f16": np.linspace(-2, 2, 5).astype(np.float16),
    "bf16": np.linspace(-2, 2, 5).astype(ml_dtypes.bfloat16),
    "f8_e4m3": np.linspace(-2, 2, 5).astype(ml_dtypes.float8_e4m3fn),
    "f8_e5m2": np.linspace(-2, 2, 5).astype(ml_dtypes.float8_e5m2),
    "i64": np.array([-(2**62), 0, 2**62], dtype=np.int64),
    "i32": np.arange(-3, 3, dtype=np.int32),
    "i16": np.arange(-3, 3, dtype=np.int16),
    "i8": np.arange(-3, 3, dtype=np.int8),
    "u64": np.array([0, 2**63 + 5], dtype=np.uint64),
    "u32": np.arange(4, dtype=np.uint32),
    "u16": np.arange(4, dtype=np.uint16),
    "u8": np.arange(4, dtype=np.uint8),
    "bool": np.array([True, False, True]),
    "c64": np.arange(3, dtype=np.complex64) * (1 + 2j),
    "scalar": np.array(7, dtype=np.int32),
    "empty": np.zeros((0, 3), dtype=np.float32),
    "big_endian": np.arange(3, dtype=">i4"),
}


def roundtrip_file(dtype):
    def case(lib, d):
        lib.np.save_file({"t": ALL_DTYPES[dtype]}, d / "m.safetensors", metadata={"k": dtype})
        with lib.safe_open(d / "m.safetensors", "np") as f:
            meta = f.metadata()
        return (d / "m.safetensors").read_bytes(), lib.np.load_file(d / "m.safetensors"), meta

    return case


def save_only(dtype):
    def case(lib, d):
        lib.np.save_file({"t": ALL_DTYPES[dtype]}, d / "m.safetensors")
        return (d / "m.safetensors").read_bytes()

    return case


def roundtrip_bytes(lib, d):
    # safetensors.numpy.load has no BF16/F8 table: the dtypes it has.
    plain = {k: v for k, v in ALL_DTYPES.items() if not k.startswith(("bf16", "f8"))}
    data = lib.np.save(plain)
    # load(bytes): safetensors' key order is a hash map's (arbitrary): compare sorted.
    return data, sorted(lib.np.load(data).items())


def safe_open_api(lib, d):
    stn.save_file({"w": np.arange(24, dtype=np.float32).reshape(2, 3, 4), "b": np.arange(3)}, d / "m.safetensors",
                  metadata={"format": "np"})
    with lib.safe_open(str(d / "m.safetensors"), framework="numpy", device="cpu") as f:
        s = f.get_slice("w")
        return (
            f.keys(), f.offset_keys(), f.metadata(), f.get_tensor("w"), f.get_tensor("b"), f.get_tensors(),
            s.get_shape(), s.get_dtype(), s[1], s[:, 1:3], s[..., 2], s[0, 1, 2], s[:, ::2, 1:], s[0:0],
            s[np.int64(1), np.int32(0)], s[1:], s[:],
        )


def load_file_order(lib, d):
    # load_file/get_tensors give the file's data order (offsets), not sorted.
    header = {
        "m": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]},
        "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]},
        "z": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
        "e": {"dtype": "U8", "shape": [0], "data_offsets": [3, 3]},
        "b": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]},
    }
    p = put(d, "o.safetensors", raw(header, b"\1\2\3"))
    return list(lib.np.load_file(p)), lib.np.load_file(p)


def null_metadata(lib, d):
    p = put(d, "n.safetensors", raw({"__metadata__": None, "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
                                    b"\0" * 8))
    with lib.safe_open(p, "np") as f:
        return f.metadata(), f.keys(), lib.np.load_file(p)


def device_none(lib, d):
    stn.save_file({"a": np.ones(2, np.float32)}, d / "m.safetensors")
    with lib.safe_open(d / "m.safetensors", "np", device=None) as f:
        return f.get_tensor("a")


def slice_after_close(lib, d):
    stn.save_file({"a": np.arange(12, dtype=np.int16).reshape(3, 4)}, d / "m.safetensors")
    with lib.safe_open(d / "m.safetensors", "np") as f:
        s = f.get_slice("a")
    return s[1:], s.get_shape(), s.get_dtype()


def keys_after_close(lib, d):
    stn.save_file({"a": np.zeros(1)}, d / "m.safetensors")
    with lib.safe_open(d / "m.safetensors", "np") as f:
        pass
    return f.keys()


def get_tensor_after_close(lib, d):
    stn.save_file({"a": np.zeros(1)}, d / "m.safetensors")
    with lib.safe_open(d / "m.safetensors", "np") as f:
        pass
    return f.get_tensor("a")


def slicing(index):
    def case(lib, d):
        stn.save_file({"x": np.arange(12, dtype=np.float32).reshape(3, 4)}, d / "m.safetensors")
        with lib.safe_open(d / "m.safetensors", "np") as f:
            return f.get_slice("x")[index]

    return case


def framework(name, read=True):
    def case(lib, d):
        stn.save_file({"a": np.arange(3, dtype=np.float32)}, d / "m.safetensors")
        with lib.safe_open(d / "m.safetensors", name) as f:
            if not read:
                return f.keys()
            t = f.get_tensor("a")
            return type(t).__module__.split(".")[0], np.asarray(t)

    return case


def wrong_key(method):
    def case(lib, d):
        stn.save_file({"a": np.zeros(1)}, d / "m.safetensors")
        with lib.safe_open(d / "m.safetensors", "np") as f:
            return getattr(f, method)("missing")

    return case


def bad_file(content):
    def case(lib, d):
        return lib.np.load_file(put(d, "bad.safetensors", content))

    return case


GOOD = raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "U8", "shape": [2],
                                                                               "data_offsets": [8, 10]}}, b"\0" * 10)
BAD_FILES = {
    "empty": b"",
    "three_bytes": b"\1\2\3",
    "truncated_data": GOOD[:-3],
    "truncated_header": GOOD[:20],
    "trailing_bytes": GOOD + b"xx",
    "garbage": b"\x10\0\0\0\0\0\0\0not json at all!",
    "header_not_object": raw(b"[]"),
    "huge_header_length": struct.pack("<Q", 1 << 40) + b"{}",
    "overlap": raw({"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                    "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\1\2\3"),
    "hole": raw({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                 "b": {"dtype": "U8", "shape": [1], "data_offsets": [2, 3]}}, b"\1\2\3"),
    "unknown_dtype": raw({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    "shape_mismatch": raw({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
    "metadata_not_str": raw({"__metadata__": {"a": 1}}),
    "metadata_list": raw({"__metadata__": ["x"]}),
}


def bad_save(tensors, metadata=None):
    def case(lib, d):
        return lib.np.save(tensors, metadata=metadata)

    return case


def save_into_missing_folder(lib, d):
    return lib.np.save_file({"a": np.zeros(2)}, d / "missing" / "m.safetensors")


def open_missing(lib, d):
    return lib.safe_open(d / "missing.safetensors", "np")


def open_folder(lib, d):
    return lib.safe_open(d, "np")


def metadata_empty_map(lib, d):
    p = put(d, "e.safetensors", raw({"__metadata__": {}}))
    with lib.safe_open(p, "np") as f:
        return f.metadata(), f.keys()


def raw_api(lib, d):
    # safetensors 0.8's TensorSpec / serialize / serialize_file / deserialize.
    mod = st if lib is THEIRS else rocm_safe
    arrays = {k: ALL_DTYPES[k] for k in ("f32", "bf16", "i8", "bool", "c64", "scalar", "empty")}
    specs = {k: mod.TensorSpec(dtype=v.dtype.name, shape=v.shape, data_ptr=v.ctypes.data, data_len=v.nbytes)
             for k, v in arrays.items()}
    data = mod.serialize(specs, metadata={"m": "x"})
    mod.serialize_file(specs, d / "m.safetensors", metadata={"m": "x"})
    f4 = mod.TensorSpec(dtype="float4_e2m1fn_x2", shape=[2, 3], data_ptr=1, data_len=6)
    # deserialize: safetensors' order (of the list, and of each dict) is a
    # hash map's: compared sorted.
    back = sorted((name, sorted(entry.items())) for name, entry in mod.deserialize(data))
    return (data, (d / "m.safetensors").read_bytes(), back,
            [(s.dtype, s.shape, s.data_len) for s in specs.values()], f4.dtype, f4.shape)


def raw_api_refusal(what):
    def case(lib, d):
        mod = st if lib is THEIRS else rocm_safe
        a = np.arange(6, dtype=np.float32)
        if what == "unknown_dtype":
            return mod.TensorSpec(dtype="F32", shape=[1], data_ptr=0, data_len=0)
        if what == "negative_dim":
            return mod.TensorSpec(dtype="float32", shape=[-1], data_ptr=0, data_len=0)
        if what == "positional":
            return mod.TensorSpec("float32", [1], 0, 0)
        if what == "raw_dict":
            return mod.serialize({"a": {"dtype": "float32", "shape": [6], "data_ptr": a.ctypes.data, "data_len": 24}})
        if what == "wrong_len":
            return mod.serialize({"a": mod.TensorSpec(dtype="float32", shape=[2], data_ptr=a.ctypes.data, data_len=24)})
        if what == "metadata_not_str":
            return mod.serialize({}, metadata={"a": 1})
        if what == "immutable":
            s = mod.TensorSpec(dtype="float32", shape=[1], data_ptr=0, data_len=0)
            s.data_len = 4
        if what == "deserialize_garbage":
            return mod.deserialize(b"abc")
        raise AssertionError(what)

    return case


def file_handle(lib, d):
    stn.save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3)}, d / "m.safetensors", metadata={"k": "v"})
    handle = st._safe_open_handle if lib is THEIRS else rocm_safe._safe_open_handle
    with open(d / "m.safetensors", "rb") as f, handle(f, framework="np") as g:
        return g.keys(), g.metadata(), g.get_tensor("a"), g.get_slice("a")[1:]


SAME = {
    "raw_api": raw_api,
    **{f"raw_api_{w}": raw_api_refusal(w) for w in ("unknown_dtype", "negative_dim", "positional", "raw_dict",
                                                    "wrong_len", "metadata_not_str", "immutable",
                                                    "deserialize_garbage")},
    "file_handle": file_handle,
    "slice_empty_list": slicing([]),
    **{f"roundtrip_file_{k}": roundtrip_file(k) for k in ALL_DTYPES if not k.startswith("f8")},
    **{f"save_file_{k}": save_only(k) for k in ("f8_e4m3", "f8_e5m2")},
    "roundtrip_bytes": roundtrip_bytes,
    "safe_open_api": safe_open_api,
    "load_file_order": load_file_order,
    "null_metadata": null_metadata,
    "device_none": device_none,
    "slice_after_close": slice_after_close,
    "keys_after_close": keys_after_close,
    "get_tensor_after_close": get_tensor_after_close,
    "slice_float_bound": slicing(np.s_[0.0:1]),
    "slice_float_index": slicing(1.0),
    "slice_none_index": slicing(None),
    "slice_list_index": slicing([0, 1]),
    "slice_too_many": slicing(np.s_[0, 0, 0]),
    "slice_step": slicing(np.s_[::2, 1::2]),
    **{f"framework_{n}_open": framework(n, read=False) for n in ("np", "numpy", "jax", "flax", "tf", "tensorflow",
                                                                  "mlx", "JAX", "Pt", "numpy2", "")},
    **{f"framework_{n}_read": framework(n) for n in ("jax", "flax", "tf", "tensorflow", "mlx", "paddle")},
    "wrong_key_get_tensor": wrong_key("get_tensor"),
    "wrong_key_get_slice": wrong_key("get_slice"),
    **{f"bad_file_{k}": bad_file(v) for k, v in BAD_FILES.items()},
    "save_metadata_not_str": bad_save({"a": np.zeros(1)}, {"k": 1}),
    "save_metadata_key_not_str": bad_save({"a": np.zeros(1)}, {1: "x"}),
    "save_key_not_str": bad_save({1: np.zeros(1)}),
    "save_dtype_object": bad_save({"a": np.array([object()])}),
    "save_dtype_complex128": bad_save({"a": np.zeros(2, np.complex128)}),
    "save_into_missing_folder": save_into_missing_folder,
    "open_missing": open_missing,
    "open_folder": open_folder,
    "metadata_empty_map": metadata_empty_map,
}


@pytest.mark.parametrize("name", list(SAME))
def test_same_outcome(name, tmp_path):
    assert_same(SAME[name], tmp_path)


def test_the_cases_cover_both_outcomes(tmp_path):
    # Guards the harness: cases that return and cases that raise exist.
    theirs, _ = assert_same(SAME["roundtrip_file_f32"], tmp_path / "a")
    assert theirs[0] == "ok"
    theirs, _ = assert_same(SAME["bad_file_overlap"], tmp_path / "b")
    assert theirs[0] == "raised" and isinstance(theirs[1], st.SafetensorError)
    with pytest.raises(AssertionError):
        assert_same(lambda lib, d: lib.name, tmp_path / "c")


# --------------------------------------------------------------------------
# Where rocm_safe differs on purpose (each listed in python/README.md).


@pytest.mark.parametrize("index", [True, False, np.s_[:, True], np.s_[True:2], np.s_[0:2:True], np.bool_(True)])
def test_bool_indices_are_refused(index, tmp_path):
    # safetensors reads a bool as 0/1; numpy and torch as a mask (a new axis):
    # we refuse it rather than give another result than the loaded tensor.
    theirs, ours = outcomes(slicing(index), tmp_path)
    if not isinstance(index, np.bool_):
        assert theirs[0] == "ok"
    assert ours[0] == "raised" and isinstance(ours[1], st.SafetensorError), ours
    assert "bool" in str(ours[1])


@pytest.mark.parametrize(
    "index", [np.s_[-1:], np.s_[::-1], np.s_[-2:, -3:-1], np.s_[1:, ::-2], np.s_[2:10], np.s_[3:], np.s_[5:], np.s_[:, 1:99]]
)
def test_slices_index_as_numpy(index, tmp_path):
    # Negative bounds and steps, bounds past the end: safetensors raises
    # (OverflowError, SafetensorError); we index as numpy does.
    theirs, ours = outcomes(slicing(index), tmp_path)
    assert theirs[0] == "raised"
    full = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert ours == ("ok", norm(full[index]))


@pytest.mark.parametrize("content", ["duplicate_key", "unknown_field", "lfs_pointer"])
def test_stricter_headers(content, tmp_path):
    files = {
        "duplicate_key": raw(b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
                             b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\1"),
        "unknown_field": raw({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1], "x": 1}}, b"\1"),
        "lfs_pointer": b"version https://git-lfs.github.com/spec/v1\noid sha256:ab\nsize 12\n",
    }
    theirs, ours = outcomes(bad_file(files[content]), tmp_path)
    assert ours[0] == "raised" and isinstance(ours[1], st.SafetensorError)
    if content == "lfs_pointer":
        assert theirs[0] == "raised" and "lfs" in str(ours[1])
    else:
        assert theirs[0] == "ok"


@pytest.mark.parametrize("layout", ["strided", "fortran"])
def test_non_c_contiguous_arrays_are_saved_by_value(layout, tmp_path):
    # safetensors.numpy saves such an array's memory as it lies (other
    # values); we save the array's values, in C order.
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    arr = a[:, ::2] if layout == "strided" else np.asfortranarray(a)
    theirs, ours = outcomes(lambda lib, d: lib.np.load(lib.np.save({"a": arr}))["a"], tmp_path)
    assert ours == ("ok", norm(np.ascontiguousarray(arr)))
    assert theirs[0] == "ok" and theirs != ours


@pytest.mark.parametrize("value", [[1, 2], "x"])
def test_save_of_a_non_array_is_a_value_error(value, tmp_path):
    # safetensors.numpy fails on its attribute access (AttributeError);
    # we raise safetensors.torch's ValueError.
    theirs, ours = outcomes(bad_save({"a": value}), tmp_path)
    assert isinstance(theirs[1], AttributeError)
    assert ours[0] == "raised" and isinstance(ours[1], ValueError)
    theirs, ours = outcomes(bad_save([np.zeros(1)]), tmp_path / "list")
    assert isinstance(theirs[1], AttributeError)
    assert isinstance(ours[1], ValueError)


@pytest.mark.parametrize("dtype", ["f8_e4m3", "f8_e5m2"])
def test_f8_arrays_load_as_ml_dtypes(dtype, tmp_path):
    # safetensors.numpy saves them but cannot load them (AttributeError: it
    # looks for np.float8_*); we give ml_dtypes arrays.
    theirs, ours = outcomes(roundtrip_file(dtype), tmp_path)
    assert isinstance(theirs[1], AttributeError)
    assert ours[0] == "ok" and ours[1][1] == norm({"t": ALL_DTYPES[dtype]})


def test_a_missing_file_says_errno_and_name(tmp_path):
    # Both FileNotFoundError; ours is the OS error's own message.
    theirs, ours = outcomes(open_missing, tmp_path)
    assert isinstance(theirs[1], FileNotFoundError) and isinstance(ours[1], FileNotFoundError)
    path = str(tmp_path / "ours" / "missing.safetensors")
    assert str(theirs[1]) == f"No such file or directory: {tmp_path / 'theirs' / 'missing.safetensors'}"
    assert str(ours[1]) == f"[Errno 2] {path}: open: No such file or directory (os error 2): {path!r}"
    assert ours[1].errno == 2 and ours[1].filename == path


@pytest.mark.parametrize("index", [np.s_[:, []], np.s_[[], :], np.s_[..., []]])
def test_an_empty_list_among_slices(index, tmp_path):
    # safetensors takes `[]` alone only; we index as numpy does.
    theirs, ours = outcomes(slicing(index), tmp_path)
    assert theirs[0] == "raised" and isinstance(theirs[1], st.SafetensorError)
    assert ours == ("ok", norm(np.arange(12, dtype=np.float32).reshape(3, 4)[index]))


def test_file_objects_without_a_name(tmp_path):
    # safetensors reopens a file object by its `name`; we read the object,
    # so a BytesIO (or an fsspec memory file) works, and so does safe_open.
    data = stn.save({"a": np.arange(3, dtype=np.int16)})

    def from_bytes_io(lib, d):
        handle = st._safe_open_handle if lib is THEIRS else rocm_safe._safe_open_handle
        with handle(__import__("io").BytesIO(data), "np") as g:
            return g.get_tensor("a")

    theirs, ours = outcomes(from_bytes_io, tmp_path / "h")
    assert isinstance(theirs[1], AttributeError) and ours == ("ok", norm(np.arange(3, dtype=np.int16)))
    theirs, ours = outcomes(lambda lib, d: lib.safe_open(__import__("io").BytesIO(data), "np").keys(), tmp_path / "s")
    assert isinstance(theirs[1], TypeError) and ours == ("ok", ["a"])


def test_sub_byte_tensors_load_as_bytes_in_numpy(tmp_path):
    # F4 and F6 (no numpy type holds them packed): their bytes, where
    # safetensors.numpy fails.
    f = raw({"f4": {"dtype": "F4", "shape": [2, 4], "data_offsets": [0, 4]},
             "f6": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [4, 7]}}, bytes(range(7)))
    theirs, ours = outcomes(bad_file(f), tmp_path)
    assert theirs[0] == "raised"
    assert ours == ("ok", norm({"f4": np.arange(4, dtype=np.uint8).reshape(2, 2),
                                "f6": np.arange(4, 7, dtype=np.uint8)}))


def test_deserialize_takes_a_bytearray(tmp_path):
    data = stn.save({"a": np.arange(3, dtype=np.int8)})
    theirs, ours = outcomes(lambda lib, d: (st if lib is THEIRS else rocm_safe).deserialize(bytearray(data)), tmp_path)
    assert isinstance(theirs[1], TypeError)
    assert ours == ("ok", norm([("a", {"shape": [3], "dtype": "I8", "data": bytearray(b"\0\1\2")})]))


def test_our_additions(tmp_path):
    # len() of a slice and bytearray input: safetensors raises TypeError.
    data = stn.save({"a": np.arange(3, dtype=np.int8)})
    theirs, ours = outcomes(lambda lib, d: lib.np.load(bytearray(data)), tmp_path / "b")
    assert isinstance(theirs[1], TypeError) and ours[0] == "ok"

    def length(lib, d):
        stn.save_file({"a": np.zeros((5, 2))}, d / "m.safetensors")
        with lib.safe_open(d / "m.safetensors", "np") as f:
            return len(f.get_slice("a"))

    theirs, ours = outcomes(length, tmp_path / "l")
    assert isinstance(theirs[1], TypeError) and ours == ("ok", 5)


# --------------------------------------------------------------------------
# Write errors: the OSError subclass of the errno, also a SafetensorError.


def test_save_into_missing_folder_is_both_classes(tmp_path):
    target = tmp_path / "missing" / "m.safetensors"
    with pytest.raises(FileNotFoundError) as e:
        rn.save_file({"a": np.zeros(2)}, target)
    assert isinstance(e.value, st.SafetensorError) and isinstance(e.value, rocm_safe.SafetensorError)
    assert e.value.errno == 2 and e.value.filename == str(target)
    assert str(target) in str(e.value) and "nothing written" in str(e.value)
    assert not (tmp_path / "missing").exists()
    # It pickles (crosses multiprocessing) as the same class.
    import pickle

    again = pickle.loads(pickle.dumps(e.value))
    assert type(again) is type(e.value) and again.errno == 2


@pytest.mark.parametrize("target", ["/", ".", ""])
def test_an_io_error_without_errno_has_a_message(target, tmp_path):
    # The library's "path has no file name" carries no errno: EINVAL, a
    # message naming the path, never "[Errno None] None: '/'".
    with pytest.raises(OSError) as e:
        rn.save_file({"a": np.zeros(2)}, target)
    assert isinstance(e.value, st.SafetensorError)
    assert e.value.errno == 22
    assert "None" not in str(e.value) and "no file name" in str(e.value), str(e.value)


def test_a_full_disk_is_both_classes(tmp_path):
    # A 64 KiB tmpfs in a user and mount namespace of our own (no root).
    if not shutil.which("unshare"):
        pytest.skip("no unshare")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = tmp_path / "full.py"
    script.write_text(
        "import sys, numpy as np, rocm_safe.numpy as rn, safetensors\n"
        "target = sys.argv[1] + '/m.safetensors'\n"
        "try:\n"
        "    rn.save_file({'a': np.zeros(1 << 16, np.float32)}, target)\n"
        "except OSError as e:\n"
        "    import os\n"
        "    print(type(e).__name__, e.errno, isinstance(e, safetensors.SafetensorError), e.filename == target,\n"
        "          'No space left' in str(e), os.listdir(sys.argv[1]))\n"
    )
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here: {probe.stderr.decode(errors='replace')}")
    out = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=64k tmpfs "$1" && exec "{sys.executable}" "$2" "$1"',
         "sh", str(mnt), str(script)],
        capture_output=True, timeout=120, env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr.decode(errors="replace")
    assert out.stdout.decode().split() == ["SafetensorOSError", "28", "True", "True", "True", "[]"], out.stdout
