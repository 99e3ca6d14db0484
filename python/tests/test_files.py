"""Sharded checkpoints, OS errors, and the writer's safety."""

import errno
import json
import os

import numpy as np
import pytest

import rocm_safe
from rocm_safe import SafetensorError, safe_open
from rocm_safe.numpy import load_file, save_file


def make_sharded(d, metadata=None):
    a = {"layer.0.w": np.arange(12, dtype=np.float32).reshape(3, 4), "layer.0.b": np.ones(4, np.float16)}
    b = {"layer.1.w": np.arange(8, dtype=np.float64).reshape(2, 4), "ids": np.arange(3, dtype=np.int64)}
    save_file(a, d / "model-00001-of-00002.safetensors", metadata=metadata)
    save_file(b, d / "model-00002-of-00002.safetensors", metadata=metadata)
    index = {
        "metadata": {"total_size": 123},
        "weight_map": {
            **{k: "model-00001-of-00002.safetensors" for k in a},
            **{k: "model-00002-of-00002.safetensors" for k in b},
        },
    }
    p = d / "model.safetensors.index.json"
    p.write_text(json.dumps(index))
    return p, {**a, **b}


def test_sharded_checkpoint_everywhere_a_file_is(tmp_path):
    index, t = make_sharded(tmp_path, metadata={"format": "pt"})
    out = load_file(index)
    assert sorted(out) == sorted(t)
    for k in t:
        np.testing.assert_array_equal(out[k], t[k])
        assert out[k].dtype == t[k].dtype
    with safe_open(index, "np") as f:
        assert f.keys() == sorted(t)
        assert f.metadata() == {"format": "pt"}
        np.testing.assert_array_equal(f.get_slice("layer.1.w")[1:], t["layer.1.w"][1:])
    converted = load_file(str(index), dtype="float32")
    assert converted["layer.1.w"].dtype == np.float32 and converted["ids"].dtype == np.int64


def test_sharded_index_errors(tmp_path):
    index, _ = make_sharded(tmp_path)
    data = json.loads(index.read_text())
    data["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(data))
    with pytest.raises(SafetensorError, match="ghost"):
        load_file(index)
    data["weight_map"] = {"x": "../outside.safetensors"}
    index.write_text(json.dumps(data))
    with pytest.raises(SafetensorError, match="outside"):
        load_file(index)
    index.write_text("{not json")
    with pytest.raises(SafetensorError):
        load_file(index)


def test_missing_shard_is_file_not_found(tmp_path):
    index, _ = make_sharded(tmp_path)
    os.remove(tmp_path / "model-00002-of-00002.safetensors")
    with pytest.raises(FileNotFoundError):
        load_file(index)


def test_os_errors_stay_os_errors(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        safe_open(tmp_path / "nope.safetensors", "np")
    assert e.value.errno == errno.ENOENT
    assert e.value.filename == str(tmp_path / "nope.safetensors")
    with pytest.raises(IsADirectoryError):
        safe_open(tmp_path, "np")
    with pytest.raises(OSError):
        safe_open("/dev/null", "np")
    if os.geteuid() != 0:
        p = tmp_path / "locked.safetensors"
        save_file({"a": np.zeros(1)}, p)
        p.chmod(0)
        with pytest.raises(PermissionError):
            safe_open(p, "np")


def test_fifo_is_refused_without_blocking(tmp_path):
    p = tmp_path / "fifo.safetensors"
    os.mkfifo(p)
    with pytest.raises(OSError, match="fifo"):
        load_file(p)


def test_save_over_a_file_being_read_replaces_it_and_the_reader_keeps_its_bytes(tmp_path):
    # As safetensors: the save is a rename over the path, so an open handle
    # keeps reading the file it opened, and saves racing loads never fail.
    p = tmp_path / "m.safetensors"
    save_file({"a": np.arange(4, dtype=np.float32)}, p)
    with safe_open(p, "np") as f:
        x = f.get_tensor("a")
        save_file({"a": x * 2}, p)
        np.testing.assert_array_equal(f.get_tensor("a"), x)
        link = tmp_path / "link.safetensors"
        os.symlink(p, link)
        save_file({"a": x * 3}, link)  # written through the link
        assert os.path.islink(link)
        np.testing.assert_array_equal(f.get_tensor("a"), x)
    np.testing.assert_array_equal(load_file(p)["a"], x * 3)


def test_saves_racing_loads_never_fail(tmp_path):
    import threading

    p = tmp_path / "race.safetensors"
    save_file({"a": np.zeros(16, dtype=np.float32)}, p)
    stop = threading.Event()
    errors = []

    def loads():
        while not stop.is_set():
            try:
                v = load_file(p)["a"]
                assert (v == v[0]).all()
            except Exception as e:  # noqa: BLE001 - collected for the assert
                errors.append(e)

    t = threading.Thread(target=loads)
    t.start()
    try:
        for i in range(200):
            save_file({"a": np.full(16, i, dtype=np.float32)}, p)
    finally:
        stop.set()
        t.join()
    assert errors == []


def test_a_replaced_file_keeps_its_mode(tmp_path):
    p = tmp_path / "private.safetensors"
    save_file({"a": np.zeros(2, dtype=np.float32)}, p)
    os.chmod(p, 0o600)
    save_file({"a": np.ones(2, dtype=np.float32)}, p)
    assert os.stat(p).st_mode & 0o7777 == 0o600


def test_save_refuses_a_device_node_and_leaves_no_temporary(tmp_path):
    with pytest.raises(SafetensorError, match="not a regular file"):
        save_file({"a": np.zeros(2)}, "/dev/null")
    p = tmp_path / "out.safetensors"
    save_file({"a": np.zeros(2)}, p)
    assert sorted(os.listdir(tmp_path)) == ["out.safetensors"]


def test_save_to_missing_folder_is_os_error(tmp_path):
    with pytest.raises(FileNotFoundError):
        save_file({"a": np.zeros(2)}, tmp_path / "no" / "such" / "m.safetensors")


def test_native_writer_order_and_abort(tmp_path):
    p = tmp_path / "w.safetensors"
    w = rocm_safe._native.Writer(str(p), [("b", "F32", [1]), ("a", "F32", [1]), ("i", "I64", [1])], None)
    assert w.order() == ["i", "a", "b"]  # widest dtype first, then by name: safetensors' layout
    with pytest.raises(SafetensorError, match="order"):
        w.write("b", b"\0" * 4)
    w.abort()
    assert not p.exists() and os.listdir(tmp_path) == []
    with pytest.raises(RuntimeError):
        w.finish()
