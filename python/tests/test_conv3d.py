"""rocm_safe.torch.conv3d and the installed fallback against torch's own
conv3d: on the CPU (rocm-safe's host backend; runs in CI) and, where
torch.cuda is available, on the GPU (torch's current stream)."""

import math

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from rocm_safe import torch as rt  # noqa: E402

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch.cuda")
    ),
]

CASES = [
    dict(),
    dict(stride=2, padding=1),
    dict(padding=(1, 0, 2), dilation=(1, 2, 1)),
    dict(stride=(1, 2, 1), padding="same"),
    dict(groups=2, padding=1),
    dict(groups=8, padding=1),  # depthwise: the tiled kernel skips it
]


@pytest.fixture(autouse=True)
def exact_torch():
    """torch's reference without TF32 (its cuDNN default for conv)."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old
    rt._inject_conv3d_failures([])
    rt.uninstall_conv3d_fallback()


def operands(device, dtype, groups=1, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 6, 7, 9, generator=g)
    w = torch.randn(8, 8 // groups, 3, 3, 3, generator=g) / math.sqrt(8 * 27 / groups)
    b = torch.randn(8, generator=g) if bias else None
    move = lambda t: None if t is None else t.to(device=device, dtype=dtype)  # noqa: E731
    return move(x), move(w), move(b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", CASES, ids=str)
def test_conv3d_f32_matches_torch(device, kw):
    if kw.get("padding") == "same" and kw.get("stride", 1) != 1:
        kw = dict(kw, stride=1)
    x, w, b = operands(device, torch.float32, kw.get("groups", 1))
    ours = rt.conv3d(x, w, b, **kw)
    ref = F.conv3d(x, w, b, **kw)
    assert ours.dtype == torch.float32 and ours.device == ref.device and ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    assert "served" in rt.last_conv3d_report()


@pytest.mark.parametrize("device", DEVICES)
def test_conv3d_bf16_matches_torch(device):
    x, w, b = operands(device, torch.bfloat16)
    ours = rt.conv3d(x, w, b, padding=1)
    ref = F.conv3d(x, w, b, padding=1)
    assert ours.dtype == torch.bfloat16 and ours.shape == ref.shape
    # Both accumulate in f32 and round to bf16: at most a bf16 ulp or two.
    torch.testing.assert_close(ours.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_conv3d_unbatched_and_no_bias(device):
    x, w, _ = operands(device, torch.float32, bias=False)
    torch.testing.assert_close(rt.conv3d(x[0], w), F.conv3d(x[0], w), rtol=1e-4, atol=1e-4)


def test_conv3d_refuses_what_the_chain_does_not_take():
    x, w, b = operands("cpu", torch.float32)
    with pytest.raises(TypeError, match="float16"):
        rt.conv3d(x.half(), w.half())
    with pytest.raises(TypeError, match="one dtype"):
        rt.conv3d(x, w.bfloat16())
    with pytest.raises(ValueError, match="5-d"):
        rt.conv3d(x[0, 0], w)
    with pytest.raises(ValueError):
        rt.conv3d(x, w[:, :3])  # channels do not match
    with pytest.raises(ValueError, match="asymmetric"):
        rt.conv3d(x, torch.randn(8, 8, 2, 2, 2), padding="same")


@pytest.mark.parametrize("device", DEVICES)
def test_failing_tiers_are_served_by_the_next(device):
    x, w, b = operands(device, torch.float32)
    ref = F.conv3d(x, w, b, padding=1)
    rt.reset_conv3d_stats()
    rt._inject_conv3d_failures(["vendor"])
    ours = rt.conv3d(x, w, b, padding=1)
    report = rt.last_conv3d_report()
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    assert "failure injected" in report and "tiled: served" in report, report
    stats = rt.conv3d_stats()["tiers"]
    # The vendor tier of this device ("vendor" on the host, "cudnn",
    # "miopen"): the one that ran. Other devices' chains may list theirs
    # with nothing counted.
    vendor = [
        n
        for n, v in stats.items()
        if n not in ("tiled", "naive", "cpu") and (v["failed"] or v["served"])
    ]
    assert len(vendor) == 1, stats
    assert stats[vendor[0]]["failed"] == 1 and stats["tiled"]["served"] == 1
    # Every device tier failing: the CPU tier serves, output copied in.
    rt._inject_conv3d_failures(["vendor", "tiled", "naive"])
    ours = rt.conv3d(x, w, b, padding=1)
    assert "cpu: served" in rt.last_conv3d_report()
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    # Every tier failing: a RuntimeError with the report.
    rt._inject_conv3d_failures(["vendor", "tiled", "naive", "cpu"])
    with pytest.raises(RuntimeError, match="failure injected"):
        rt.conv3d(x, w, b, padding=1)


def test_fallback_install_is_idempotent_and_restores_exactly():
    orig = F.conv3d
    rt.install_conv3d_fallback()
    wrapper = F.conv3d
    assert wrapper is not orig
    rt.install_conv3d_fallback()
    assert F.conv3d is wrapper
    x, w, b = operands("cpu", torch.float32)
    rt.reset_conv3d_stats()
    torch.testing.assert_close(F.conv3d(x, w, b, padding=1), orig(x, w, b, padding=1))
    s = rt.conv3d_stats()
    assert s["calls"] == 1 and s["fell_back"] == 0
    rt.uninstall_conv3d_fallback()
    assert F.conv3d is orig
    rt.uninstall_conv3d_fallback()
    assert F.conv3d is orig


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("failure", ["raises", "nan"])
def test_fallback_serves_failing_torch_conv3d(device, failure, monkeypatch):
    real = F.conv3d

    def broken(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if failure == "raises":
            raise RuntimeError("miopenStatusUnknownError (simulated)")
        out = real(input, weight, bias, stride, padding, dilation, groups)
        return out.fill_(float("nan"))

    monkeypatch.setattr(F, "conv3d", broken)
    rt.install_conv3d_fallback()
    rt.reset_conv3d_stats()
    x, w, b = operands(device, torch.float32)
    conv = torch.nn.Conv3d(8, 8, 3, padding=1).to(device)
    with torch.no_grad():
        conv.weight.copy_(w)
        conv.bias.copy_(b)
        out = conv(x)  # nn.Conv3d -> F.conv3d -> the fallback
    torch.testing.assert_close(out, real(x, w, b, padding=1), rtol=1e-4, atol=1e-4)
    s = rt.conv3d_stats()
    assert s["calls"] == 1 and s["fell_back"] == 1
    key = "fell_back_on_error" if failure == "raises" else "fell_back_on_non_finite"
    assert s[key] == 1
    assert sum(t["served"] for t in s["tiers"].values()) == 1
    # Calls the chain cannot take keep torch's behaviour (its error).
    if failure == "raises":
        with pytest.raises(RuntimeError, match="simulated"):
            F.conv3d(x.double(), w.double())
    rt.uninstall_conv3d_fallback()
    assert F.conv3d is broken
