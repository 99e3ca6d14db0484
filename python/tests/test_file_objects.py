"""safe_open and _safe_open_handle over open file objects: files opened
"rb" and "r", io.BytesIO, fsspec's local and memory file systems; the same
validation as a path (every malformed file of the compat cases), bounded
memory, and every failure of a stream made to happen."""

import io
import os
import threading
import tracemalloc
import uuid

import numpy as np
import pytest

import rocm_safe
import rocm_safe.numpy as rn
from rocm_safe import SafetensorError, _safe_open_handle, _stream, safe_open

from conftest import raw_file

ml_dtypes = pytest.importorskip("ml_dtypes")

try:  # the malformed files of the compat tests (which need safetensors)
    from test_compat_cases import BAD_FILES
    from test_malformed import CORPUS
except pytest.skip.Exception:
    BAD_FILES = CORPUS = {}
MALFORMED = {**{f"compat: {k}": v for k, v in BAD_FILES.items()}, **{f"malformed: {k}": v for k, v in CORPUS.items()}}
GOOD = raw_file({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                 "b": {"dtype": "U8", "shape": [2], "data_offsets": [8, 10]}}, b"\0" * 10)

TENSORS = {
    "w": np.arange(60, dtype=np.float32).reshape(5, 3, 4),
    "b": np.linspace(-1, 1, 7).astype(ml_dtypes.bfloat16),
    "i": np.arange(10, dtype=np.int64).reshape(2, 5),
    "s": np.array(3, dtype=np.uint8),
    "e": np.zeros((0, 2), dtype=np.float16),
}


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "m.safetensors"
    rn.save_file(TENSORS, p, metadata={"k": "v"})
    return p


def read_all(g):
    return {k: g.get_tensor(k) for k in g.keys()}, g.offset_keys(), g.metadata()


def same(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def check_reads_like_the_path(g, path):
    tensors, order, meta = read_all(g)
    with safe_open(path, "np") as f:
        want, want_order, want_meta = read_all(f)
    assert order == want_order and meta == want_meta == {"k": "v"}
    for k in want:
        same(tensors[k], want[k])
    s = g.get_slice("w")
    assert s.get_shape() == [5, 3, 4] and s.get_dtype() == "F32"
    same(s[1:4:2, ::-1], TENSORS["w"][1:4:2, ::-1])
    same(s[[]], TENSORS["w"][[]])


@pytest.mark.parametrize("mode", ["rb", "r"])
def test_open_file(path, mode):
    with open(path, mode) as f:
        if mode == "rb":
            f.read(3)  # wherever the position is, the file is read from byte 0
        with _safe_open_handle(f, framework="np", device="cpu") as g:
            check_reads_like_the_path(g, path)
        assert not f.closed  # the caller's file stays open
        with safe_open(f, "numpy") as g:
            check_reads_like_the_path(g, path)


def test_bytes_io_and_a_read_only_object(path):
    data = path.read_bytes()
    with safe_open(io.BytesIO(data), "np") as g:
        check_reads_like_the_path(g, path)

    class ReadOnly:
        """seek/tell/read, no readinto, short reads."""

        def __init__(self, b):
            self.b, self.pos = b, 0

        def seek(self, pos, whence=0):
            self.pos = pos if whence == 0 else len(self.b) + pos
            return self.pos

        def tell(self):
            return self.pos

        def read(self, n):
            out = self.b[self.pos : self.pos + min(n, 5)]
            self.pos += len(out)
            return out

    with safe_open(ReadOnly(data), "np") as g:
        check_reads_like_the_path(g, path)


@pytest.mark.parametrize("protocol", ["file", "memory"])
def test_fsspec(path, tmp_path, protocol):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem(protocol)
    target = str(tmp_path / "fs.safetensors") if protocol == "file" else f"/rocm_safe-{uuid.uuid4().hex}.safetensors"
    with fs.open(target, "wb") as f:
        f.write(rn.save(TENSORS, metadata={"k": "v"}))
    try:
        with fs.open(target, "rb") as f:
            with _safe_open_handle(f, framework="np") as g:
                check_reads_like_the_path(g, path)
                assert os.path.basename(target) in repr(g)
    finally:
        fs.rm(target)


def test_torch_and_conversion_through_a_stream(path, monkeypatch):
    torch = pytest.importorskip("torch")
    # Small chunks: a converted read goes through many of them.
    monkeypatch.setattr(_stream, "CHUNK", 16)
    with open(path, "rb") as f, safe_open(f, "pt", dtype=torch.float16) as g, safe_open(path, "pt", dtype="F16") as h:
        for k in h.keys():
            a, b = g.get_tensor(k), h.get_tensor(k)
            assert a.dtype == b.dtype and torch.equal(a, b), k
        assert g.get_tensor("w").dtype == torch.float16 and g.get_tensor("i").dtype == torch.int64
        assert torch.equal(g.get_slice("w")[2:4], h.get_slice("w")[2:4])
        assert torch.equal(g.get_tensor("b", dtype=torch.float32), h.get_tensor("b", dtype=torch.float32))
        assert torch.equal(g.get_tensors()["w"], h.get_tensors()["w"])
        with pytest.raises(SafetensorError, match="cannot convert I64 to F32"):
            g._ckpt.read("i", to="F32")


def outcome(source):
    """What reading every tensor of ``source`` gives: the tensors, or the
    exception's class and message."""
    try:
        with safe_open(source, "np") as g:
            tensors, order, meta = read_all(g)
            return "ok", [(k, tensors[k].dtype.str, tensors[k].shape, tensors[k].tobytes()) for k in order], meta
    except Exception as e:  # noqa: BLE001 - the outcome compared
        return "raised", type(e), str(e)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_files_read_as_from_a_path(name, tmp_path):
    # Same outcome from the file object as from the path, to the message.
    p = tmp_path / "bad.safetensors"
    p.write_bytes(MALFORMED[name])
    from_path = outcome(p)
    with open(p, "rb") as f:
        assert outcome(f) == from_path
    if from_path[0] == "raised":
        assert issubclass(from_path[1], SafetensorError), from_path


def test_stricter_checks_hold_for_streams():
    one = b'"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}'
    dup = raw_file(b"{" + one + b"," + one + b"}", b"\1")
    for content, what in [(dup, "duplicate"), (b"version https://git-lfs.github.com/spec/v1\noid x\n", "lfs pointer")]:
        with pytest.raises(SafetensorError, match=what):
            safe_open(io.BytesIO(content), "np")


def test_a_stream_that_shrinks_after_open(tmp_path):
    p = tmp_path / "m.safetensors"
    rn.save_file({"a": np.arange(1000, dtype=np.float64)}, p)
    with open(p, "rb") as f, safe_open(f, "np") as g:
        os.truncate(p, os.path.getsize(p) - 100)
        with pytest.raises(SafetensorError, match="the stream ended at byte .* changed while being read"):
            g.get_tensor("a")


def test_refusals_of_the_handle(path):
    with pytest.raises(TypeError, match="file object"):
        _safe_open_handle(str(path), "np")
    with pytest.raises(TypeError):
        safe_open(12, "np")
    with pytest.raises(SafetensorError, match="binary buffer"):
        safe_open(io.StringIO("text"), "np")
    with open(path, "rb") as f:
        with pytest.raises(SafetensorError, match="framework"):
            _safe_open_handle(f, "nope")
        with _safe_open_handle(f, "np") as g:
            s = g.get_slice("w")
            with pytest.raises(SafetensorError, match="no tensor named 'x'"):
                g.get_tensor("x")
            with pytest.raises(SafetensorError, match="no tensor named 'x'"):
                g.get_slice("x")
            with pytest.raises(SafetensorError, match="no rows"):
                g._ckpt.read("w", rows=(4, 9))
            with pytest.raises(SafetensorError, match="no rows"):
                g._ckpt.read("s", rows=(0, 1))
        with pytest.raises(SafetensorError, match="closed"):
            g.keys()
        with pytest.raises(SafetensorError, match="closed"):
            g.metadata()
        with pytest.raises(SafetensorError, match="closed"):
            g.get_tensor("w")
        # A slice taken before the close still reads, as from a path.
        same(s[0], TENSORS["w"][0])


def test_threads_share_one_stream(path):
    with open(path, "rb") as f, safe_open(f, "np") as g:
        errors = []

        def work():
            try:
                for _ in range(50):
                    same(g.get_tensor("w"), TENSORS["w"])
                    same(g.get_slice("i")[1], TENSORS["i"][1])
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors


def test_memory_is_bounded_by_the_tensor_read(monkeypatch):
    # A stream of two 8 MiB tensors: reading one allocates that tensor (and
    # a converted read one small chunk of its source), never the stream.
    n = 2 << 20
    data = rn.save({"a": np.ones(n, np.float32), "z": np.full(n, 2.0, np.float32)})
    monkeypatch.setattr(_stream, "CHUNK", 256 << 10)
    with safe_open(io.BytesIO(data), "np") as g:
        tracemalloc.start()
        try:
            t = g.get_tensor("z")
            held, peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            h = g.get_tensor("z", dtype="bfloat16")
            peak_converted = tracemalloc.get_traced_memory()[1] - held
        finally:
            tracemalloc.stop()
    assert float(t[-1]) == 2.0 and float(h[0]) == 2.0 and h.dtype == ml_dtypes.bfloat16
    assert 4 * n <= peak < 4 * n + (1 << 20), peak
    # 4 MiB of bf16 out, a few 256 KiB chunks: well under the 8 MiB source.
    assert 2 * n <= peak_converted < 2 * n + (2 << 20), peak_converted


def test_the_good_file_opens_from_every_kind_of_stream(tmp_path):
    p = tmp_path / "g.safetensors"
    p.write_bytes(GOOD)
    with open(p, "rb") as f, safe_open(f, "np") as g:
        assert g.keys() == ["a", "b"] and g.get_tensor("b").tolist() == [0, 0]
    with safe_open(io.BytesIO(GOOD), "np") as g:
        assert g.get_tensor("a").tolist() == [0.0, 0.0]
    assert rocm_safe._stream.is_file_object(io.BytesIO()) and not rocm_safe._stream.is_file_object(p)
