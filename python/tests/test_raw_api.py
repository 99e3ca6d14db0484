"""safetensors 0.8's raw API in rocm_safe: TensorSpec, serialize,
serialize_file, deserialize; compared with the safetensors package where
it is installed, and every refusal made to happen."""

import os
import threading
import time

import numpy as np
import pytest

import rocm_safe
from rocm_safe import SafetensorError, TensorSpec, deserialize, serialize, serialize_file

ml_dtypes = pytest.importorskip("ml_dtypes")


def spec(arr, dtype=None):
    return TensorSpec(dtype=dtype or arr.dtype.name, shape=arr.shape, data_ptr=arr.ctypes.data, data_len=arr.nbytes)


ARRAYS = {
    "f32": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
    "bf16": np.linspace(-2, 2, 6).astype(ml_dtypes.bfloat16),
    "i8": np.arange(-3, 3, dtype=np.int8),
    "u64": np.array([0, 2**63 + 5], dtype=np.uint64),
    "bool": np.array([True, False]),
    "c64": np.arange(3, dtype=np.complex64),
    "scalar": np.array(7, dtype=np.int32),
    "empty": np.zeros((0, 3), dtype=np.float16),
    "e4m3": np.linspace(-2, 2, 4).astype(ml_dtypes.float8_e4m3fn),
    "e8m0": np.array([0.5, 2.0]).astype(ml_dtypes.float8_e8m0fnu),
}


def test_tensor_spec_properties_and_names():
    a = ARRAYS["f32"]
    s = spec(a)
    assert (s.dtype, s.shape, s.data_ptr, s.data_len) == ("F32", [3, 4], a.ctypes.data, 48)
    assert "F32" in repr(s) and "[3, 4]" in repr(s)
    codes = {n: TensorSpec(dtype=n, shape=[2], data_ptr=0, data_len=0).dtype for n in rocm_safe._spec.SPEC_DTYPES}
    assert codes["bfloat16"] == "BF16" and codes["float8_e8m0fnu"] == "F8_E8M0" and codes["complex64"] == "C64"
    # The packed F4 type: the last dimension doubles into the logical shape.
    f4 = TensorSpec(dtype="float4_e2m1fn_x2", shape=(2, 3), data_ptr=1, data_len=6)
    assert (f4.dtype, f4.shape) == ("F4", [2, 6])
    assert TensorSpec(dtype="float4_e2m1fn_x2", shape=[], data_ptr=1, data_len=1).shape == []


def test_tensor_spec_refusals():
    with pytest.raises(SafetensorError, match="Unknown dtype 'F32'"):
        TensorSpec(dtype="F32", shape=[1], data_ptr=0, data_len=0)  # the header's name is not taken
    with pytest.raises(SafetensorError, match="nonsense"):
        TensorSpec(dtype="nonsense", shape=[1], data_ptr=0, data_len=0)
    with pytest.raises(TypeError):
        TensorSpec(dtype=np.float32, shape=[1], data_ptr=0, data_len=0)
    with pytest.raises(TypeError):
        TensorSpec("float32", [1], 0, 0)  # keyword-only
    with pytest.raises(TypeError):
        TensorSpec(dtype="float32", shape="12", data_ptr=0, data_len=0)
    with pytest.raises(TypeError):
        TensorSpec(dtype="float32", shape=[1.0], data_ptr=0, data_len=0)
    with pytest.raises(TypeError):
        TensorSpec(dtype="float32", shape=[True], data_ptr=0, data_len=0)
    with pytest.raises(OverflowError):
        TensorSpec(dtype="float32", shape=[-1], data_ptr=0, data_len=0)
    with pytest.raises(OverflowError):
        TensorSpec(dtype="float32", shape=[1], data_ptr=-8, data_len=4)
    with pytest.raises(TypeError):
        TensorSpec(dtype="float32", shape=[1], data_ptr=0, data_len="4")
    s = TensorSpec(dtype="float32", shape=[1], data_ptr=0, data_len=0)
    with pytest.raises(AttributeError):
        s.data_len = 3
    with pytest.raises(AttributeError):
        del s.dtype
    with pytest.raises(AttributeError):
        s.extra = 1


def test_serialize_matches_the_package_and_round_trips(tmp_path):
    specs = {k: spec(v) for k, v in ARRAYS.items()}
    data = serialize(specs, metadata={"format": "np"})
    assert isinstance(data, bytes)
    serialize_file(specs, tmp_path / "a.safetensors", metadata={"format": "np"})
    assert (tmp_path / "a.safetensors").read_bytes() == data
    # Same bytes as rocm_safe.numpy.save (one writer).
    assert data == rocm_safe.numpy.save(ARRAYS, metadata={"format": "np"})
    back = deserialize(data)
    assert [name for name, _ in back] == rocm_safe.safe_open(tmp_path / "a.safetensors", "np").offset_keys()
    for name, entry in back:
        a = ARRAYS[name]
        assert set(entry) == {"shape", "dtype", "data"}
        assert entry["shape"] == list(a.shape) and isinstance(entry["data"], bytearray)
        assert bytes(entry["data"]) == a.tobytes()
    assert deserialize(bytearray(data)) == back
    st = pytest.importorskip("safetensors")
    theirs = st.serialize({k: st.TensorSpec(dtype=v.dtype.name, shape=v.shape, data_ptr=v.ctypes.data,
                                            data_len=v.nbytes) for k, v in ARRAYS.items()}, metadata={"format": "np"})
    assert theirs == data
    assert sorted(st.deserialize(data), key=lambda x: x[0]) == sorted(back, key=lambda x: x[0])


def test_serialize_refusals(tmp_path):
    a = np.arange(6, dtype=np.float32)
    with pytest.raises(TypeError):
        serialize({"a": {"dtype": "float32", "shape": [6], "data_ptr": a.ctypes.data, "data_len": 24}})
    with pytest.raises(TypeError):
        serialize([("a", spec(a))])
    with pytest.raises(TypeError):
        serialize({1: spec(a)})
    with pytest.raises(TypeError):
        serialize({"a": spec(a)}, metadata={"k": 1})
    with pytest.raises(SafetensorError, match="data_len is 24 bytes, but dtype F32 and shape \\[2\\] need 8"):
        serialize({"a": TensorSpec(dtype="float32", shape=[2], data_ptr=a.ctypes.data, data_len=24)})
    with pytest.raises(SafetensorError, match="need 40"):
        serialize_file({"a": TensorSpec(dtype="float32", shape=[10], data_ptr=a.ctypes.data, data_len=24)},
                       tmp_path / "x.safetensors")
    with pytest.raises(SafetensorError, match="data_ptr is null"):
        serialize({"a": TensorSpec(dtype="float32", shape=[2], data_ptr=0, data_len=8)})
    with pytest.raises(SafetensorError, match="whole bytes"):
        serialize({"a": TensorSpec(dtype="float4_e2m1fn_x2", shape=[], data_ptr=a.ctypes.data, data_len=1)})
    with pytest.raises(SafetensorError, match="reserved"):
        serialize({"__metadata__": spec(a)})
    with pytest.raises(SafetensorError):
        deserialize(b"abc")
    with pytest.raises(SafetensorError):
        deserialize(serialize({"a": spec(a)})[:-1])
    assert os.listdir(tmp_path) == []
    # An empty tensor needs no memory: a null address is fine.
    out = serialize({"a": TensorSpec(dtype="float32", shape=[0], data_ptr=0, data_len=0)})
    assert deserialize(out) == [("a", {"shape": [0], "dtype": "F32", "data": bytearray()})]


def test_write_address_refuses_bad_memory_ranges(tmp_path):
    # The native writer's own checks, under the Python layer's.
    w = rocm_safe._native.Writer(str(tmp_path / "w.safetensors"), [("a", "U8", [4])], None)
    try:
        with pytest.raises(SafetensorError, match="not valid memory"):
            w.write_address("a", 0, 4)
        with pytest.raises(SafetensorError, match="not valid memory"):
            w.write_address("a", 2**64 - 2, 4)
        with pytest.raises(SafetensorError, match="more than one buffer"):
            w.write_address("a", 8, 2**63)
        a = np.arange(8, dtype=np.uint8)
        with pytest.raises(SafetensorError):  # past the tensor's end: refused before reading
            w.write_address("a", a.ctypes.data, 8)
        w.write_address("a", a.ctypes.data, 4)
        w.finish()
    finally:
        w.abort()
    assert rocm_safe.numpy.load_file(tmp_path / "w.safetensors")["a"].tolist() == [0, 1, 2, 3]


def test_serialize_file_releases_the_gil(tmp_path):
    # While one thread writes 256 MiB through serialize_file, another
    # Python thread keeps running (it could not if the GIL were held).
    big = np.ones(64 << 20, dtype=np.float32)
    specs = {"big": spec(big)}
    ticks = []
    done = threading.Event()

    def ticker():
        while not done.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    start = time.monotonic()
    try:
        serialize_file(specs, tmp_path / "big.safetensors")
    finally:
        end = time.monotonic()
        done.set()
        t.join()
    during = [x for x in ticks if start < x < end]
    # A write of this size takes well over 50 ms; ticks are 1 ms apart.
    assert end - start > 0.05
    assert len(during) >= 5, (len(during), end - start)
    loaded = rocm_safe.numpy.load_file(tmp_path / "big.safetensors")["big"]
    assert loaded.shape == big.shape and bool((loaded == 1).all())
