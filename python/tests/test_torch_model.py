"""``rocm_safe.torch``'s model API (``save_model``/``load_model``, the
shared-tensor helpers) against ``safetensors.torch``, and the names that
``torch.py`` re-exports from ``_conv3d.py``/``_conv3d_fallback.py``."""

import json

import pytest

torch = pytest.importorskip("torch")
stt = pytest.importorskip("safetensors.torch")

import safetensors  # noqa: E402

import rocm_safe  # noqa: E402
from rocm_safe import torch as rt  # noqa: E402


class Tied(torch.nn.Module):
    """An embedding and a head sharing one weight (tied weights)."""

    def __init__(self, tie=True):
        super().__init__()
        self.embed = torch.nn.Embedding(6, 4)
        self.head = torch.nn.Linear(4, 6, bias=False)
        self.norm = torch.nn.LayerNorm(4)
        if tie:
            self.head.weight = self.embed.weight


def fresh(tie=True, seed=0):
    torch.manual_seed(seed)
    return Tied(tie)


def split(path):
    """(header as a dict, data bytes) of a safetensors file."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def test_save_model_writes_what_safetensors_writes(tmp_path):
    m = fresh()
    rt.save_model(m, tmp_path / "ours.safetensors", metadata={"format": "pt"})
    stt.save_model(m, str(tmp_path / "theirs.safetensors"), metadata={"format": "pt"})
    # Same header (safetensors writes metadata keys in hash order, so the
    # bytes may differ there) and same data.
    assert split(tmp_path / "ours.safetensors") == split(tmp_path / "theirs.safetensors")
    with rocm_safe.safe_open(tmp_path / "ours.safetensors", "pt") as f:
        assert f.keys() == ["embed.weight", "norm.bias", "norm.weight"]
        # The dropped name is recorded, as safetensors records it.
        assert f.metadata() == {"format": "pt", "head.weight": "embed.weight"}
    # Without shared tensors, no metadata is added.
    rt.save_model(fresh(tie=False), tmp_path / "plain.safetensors")
    with rocm_safe.safe_open(tmp_path / "plain.safetensors", "pt") as f:
        assert f.metadata() is None
        assert len(f.keys()) == 4


def test_save_model_leaves_the_callers_metadata_alone(tmp_path):
    meta = {"head.weight": "mine"}
    rt.save_model(fresh(), tmp_path / "m.safetensors", metadata=meta)
    assert meta == {"head.weight": "mine"}
    with rocm_safe.safe_open(tmp_path / "m.safetensors", "pt") as f:
        assert f.metadata() == {"head.weight": "mine"}  # the caller's entry wins


@pytest.mark.parametrize("writer", ["ours", "theirs"])
def test_load_model_matches_safetensors(tmp_path, writer):
    src = fresh(seed=1)
    p = tmp_path / "m.safetensors"
    (rt if writer == "ours" else stt).save_model(src, str(p))
    a, b = fresh(seed=2), fresh(seed=2)
    ours = rt.load_model(a, p)
    theirs = stt.load_model(b, str(p))
    assert ours == theirs == (set(), [])
    assert isinstance(ours[0], set) and isinstance(ours[1], list)
    for (k, x), (_, y) in zip(a.state_dict().items(), src.state_dict().items()):
        assert torch.equal(x, y), k
    assert a.head.weight.data_ptr() == a.embed.weight.data_ptr()  # still tied


def test_load_model_missing_and_unexpected_as_safetensors(tmp_path):
    # A file of an untied model (both names) into a tied one: the model's
    # dropped name is unexpected; a missing tensor is missing.
    p = tmp_path / "m.safetensors"
    sd = {k: v.clone() for k, v in fresh(tie=False).state_dict().items() if k != "norm.bias"}
    stt.save_file(sd, str(p))
    for strict in (False, True):
        results = []
        for lib in (rt, stt):
            try:
                results.append(("ok", lib.load_model(fresh(), str(p), strict=strict)))
            except RuntimeError as e:
                results.append(("raised", str(e)))
        assert results[0] == results[1], results
    assert results[0][0] == "raised" and "norm.bias" in results[0][1] and "head.weight" in results[0][1]
    missing, unexpected = rt.load_model(fresh(), p, strict=False)
    assert missing == {"norm.bias"} and unexpected == ["head.weight"]


def test_save_model_refusals_as_safetensors(tmp_path):
    class View(torch.nn.Module):
        def __init__(self):
            super().__init__()
            big = torch.zeros(10)
            self.register_buffer("part", big[2:5])

    class Strided(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("t", torch.zeros(4, 4).t())

    for model, kwargs, exc in ((View(), {}, RuntimeError), (Strided(), {"force_contiguous": False}, ValueError)):
        for lib, name in ((rt, "ours"), (stt, "theirs")):
            with pytest.raises(exc):
                lib.save_model(model, str(tmp_path / f"{name}.safetensors"), **kwargs)
    rt.save_model(Strided(), tmp_path / "c.safetensors")  # force_contiguous=True (default)
    assert rt.load_file(tmp_path / "c.safetensors")["t"].shape == (4, 4)


def test_shared_tensor_helpers_as_safetensors():
    base = torch.arange(12.0)
    sd = {"a": base, "b": base.view(3, 4), "c": torch.ones(2), "d": base[:6], "m": torch.empty(3, device="meta")}
    for t in sd.values():
        assert rt.storage_ptr(t) == stt.storage_ptr(t)
        assert rt.storage_size(t) == stt.storage_size(t)
    assert sorted(map(sorted, rt._find_shared_tensors(sd))) == sorted(map(sorted, stt._find_shared_tensors(sd)))
    for kw in ({}, {"preferred_names": ["b"]}, {"discard_names": ["a"]}):
        assert dict(rt._remove_duplicate_names(sd, **kw)) == dict(stt._remove_duplicate_names(sd, **kw)), kw
    with pytest.raises(RuntimeError):
        rt._remove_duplicate_names({"d": base[:6]})
    with pytest.raises(RuntimeError):
        stt._remove_duplicate_names({"d": base[:6]})


def test_save_file_refuses_shared_tensors_and_names_save_model(tmp_path):
    base = torch.zeros(4)
    for lib in (rt, stt):
        with pytest.raises(RuntimeError, match="save_model"):
            lib.save_file({"a": base, "b": base}, str(tmp_path / "x.safetensors"))


def test_load_file_order_and_device_none(tmp_path):
    p = tmp_path / "m.safetensors"
    stt.save_file({"z": torch.zeros(3, dtype=torch.float64), "a": torch.ones(2, dtype=torch.int8)}, str(p))
    assert list(rt.load_file(p)) == list(stt.load_file(str(p)))
    with rocm_safe.safe_open(p, "pt", device=None) as f, safetensors.safe_open(str(p), "pt", device=None) as g:
        assert torch.equal(f.get_tensor("a"), g.get_tensor("a"))
    # load(bytes): file order (safetensors': a hash map's), same tensors.
    data = stt.save({"z": torch.zeros(3), "a": torch.ones(2)})
    assert sorted(rt.load(data)) == sorted(stt.load(data))


def test_unsupported_dtype_is_a_value_error_and_a_safetensor_error(tmp_path):
    with pytest.raises(ValueError) as e:
        rt.save({"a": torch.zeros(2, dtype=torch.complex128)})
    assert isinstance(e.value, safetensors.SafetensorError)


def test_the_split_keeps_every_name():
    from rocm_safe import _conv3d, _conv3d_fallback

    for name in (
        "conv3d", "conv_transpose3d", "install_conv3d_fallback", "uninstall_conv3d_fallback", "conv3d_stats",
        "reset_conv3d_stats", "last_conv3d_report", "last_load_report", "release_memory", "load_model",
        "save_model", "storage_ptr", "storage_size",
    ):
        assert name in rt.__all__ and callable(getattr(rt, name)), name
    assert rt.conv3d is _conv3d.conv3d
    assert rt.install_conv3d_fallback is _conv3d_fallback.install_conv3d_fallback
    for name in ("_backend", "_inject_conv3d_failures", "_Conv3dFunction", "_ConvTranspose3dFunction"):
        assert getattr(rt, name) is not None, name
