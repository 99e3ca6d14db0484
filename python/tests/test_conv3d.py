"""rocm_safe.torch.conv3d and the installed fallback against torch's own
conv3d: on the CPU (rocm-safe's host backend; runs in CI) and, where
torch.cuda is available, on the GPU (torch's current stream)."""

import math
import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import rocm_safe  # noqa: E402
from rocm_safe import torch as rt  # noqa: E402

# The conv3d failure-injection hook exists in `--features testing` builds
# only (a release wheel, as CI installs one, has none).
HOOKS = "testing" in rocm_safe.features()
needs_hooks = pytest.mark.skipif(not HOOKS, reason="needs a build with --features testing")

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
def exact_torch(monkeypatch):
    """torch's reference without TF32 (its cuDNN default for conv). Takes
    ``monkeypatch`` so that its teardown (uninstalling the fallback) runs
    before monkeypatch puts back a patched ``F.conv3d``."""
    old = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = old
    if HOOKS:
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


@needs_hooks
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
    # Served by the chain, or (a NaN on the GPU) repaired by its tiled
    # kernel behind the device's verdict.
    assert sum(t["served"] for t in s["tiers"].values()) + s["repaired"] == 1
    assert s["repaired"] == (1 if (device == "cuda" and failure == "nan") else 0)
    # Calls the chain cannot take keep torch's behaviour (its error).
    if failure == "raises":
        with pytest.raises(RuntimeError, match="simulated"):
            F.conv3d(x.double(), w.double())
    rt.uninstall_conv3d_fallback()
    assert F.conv3d is broken


# --------------------------------------------------------------------------
# install_conv3d_fallback(mode=...): "fallback", "verify", "replace", and the
# memory of call signatures whose torch call failed.


def counting(real, failure):
    """A stand-in for torch's conv3d that fails as asked ("raises", "nan",
    "wrong": finite values a little off, beyond the chain's tolerance even
    for bf16, or None: correct) and counts its calls."""
    calls = [0]

    def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        calls[0] += 1
        if failure == "raises":
            raise RuntimeError("miopenStatusUnknownError (simulated)")
        out = real(input, weight, bias, stride, padding, dilation, groups)
        if failure == "nan":
            return out.fill_(float("nan"))
        if failure == "wrong":
            return out * 1.02 + 0.3
        return out

    return conv, calls


def test_modes_switch_and_unknown_modes_are_refused():
    orig = F.conv3d
    rt.install_conv3d_fallback(mode="verify")
    wrapper = F.conv3d
    assert rt.conv3d_stats()["mode"] == "verify"
    rt.install_conv3d_fallback(mode="replace")
    assert F.conv3d is wrapper and rt.conv3d_stats()["mode"] == "replace"
    rt.install_conv3d_fallback()
    assert F.conv3d is wrapper and rt.conv3d_stats()["mode"] == "fallback"
    with pytest.raises(ValueError, match="mode"):
        rt.install_conv3d_fallback(mode="sometimes")
    assert rt.conv3d_stats()["mode"] == "fallback"
    rt.uninstall_conv3d_fallback()
    assert F.conv3d is orig and rt.conv3d_stats()["mode"] is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_verify_catches_slightly_wrong_torch_output(device, dtype, monkeypatch):
    real = F.conv3d
    broken, calls = counting(real, "wrong")
    monkeypatch.setattr(F, "conv3d", broken)
    rt.install_conv3d_fallback(mode="verify")
    rt.reset_conv3d_stats()
    x, w, b = operands(device, dtype)
    ref = real(x.float(), w.float(), b.float(), padding=1)
    # On the GPU the verdict comes back with the stats (no wait per call).
    with pytest.warns(RuntimeWarning, match="wrong values"):
        out = F.conv3d(x, w, b, padding=1)
        s = rt.conv3d_stats()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    assert (s["calls"], s["verified"], s["mismatches"], s["fell_back_on_mismatch"]) == (1, 1, 1, 1)
    assert "differs from the f64 reference" in s["last_mismatch"], s["last_mismatch"]
    assert s["remembered"] == 1 and calls[0] == 1
    # The same signature again: straight to the chain, torch not called.
    out = F.conv3d(x, w, b, padding=1)
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
    s = rt.conv3d_stats()
    assert (s["calls"], s["direct"], calls[0]) == (2, 1, 1)
    # In "fallback" mode the same wrong (finite) output is not looked at.
    rt.uninstall_conv3d_fallback()
    rt.install_conv3d_fallback(mode="fallback")
    rt.reset_conv3d_stats()
    out = F.conv3d(x, w, b, padding=1)
    assert calls[0] == 2
    assert not torch.allclose(out.float(), ref, rtol=tol, atol=tol)
    assert rt.conv3d_stats()["fell_back"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_verify_passes_a_correct_torch_output(device):
    rt.install_conv3d_fallback(mode="verify")
    rt.reset_conv3d_stats()
    for dtype in (torch.float32, torch.bfloat16):
        x, w, b = operands(device, dtype)
        out = F.conv3d(x, w, b, stride=2, padding=1)
        assert out.dtype == dtype
    s = rt.conv3d_stats()
    assert (s["calls"], s["verified"], s["mismatches"], s["fell_back"]) == (2, 2, 0, 0)
    assert s["last_mismatch"] is None and s["remembered"] == 0


@pytest.mark.parametrize("device", DEVICES)
def test_replace_never_calls_torch_for_what_the_chain_takes(device, monkeypatch):
    real = F.conv3d
    spy, calls = counting(real, None)
    monkeypatch.setattr(F, "conv3d", spy)
    rt.install_conv3d_fallback(mode="replace")
    rt.reset_conv3d_stats()
    x, w, b = operands(device, torch.float32)
    out = F.conv3d(x, w, b, padding=1)
    torch.testing.assert_close(out, real(x, w, b, padding=1), rtol=1e-4, atol=1e-4)
    s = rt.conv3d_stats()
    assert (s["calls"], s["direct"], s["fell_back"], calls[0]) == (1, 1, 0, 0)
    assert sum(t["served"] for t in s["tiers"].values()) == 1
    # What the chain cannot take goes to torch, counted as unchecked with
    # the reason: other dtypes. An asymmetric "same" padding is padded
    # explicitly (as torch does) and served by the chain.
    F.conv3d(x.double(), w.double())
    w2 = torch.randn(8, 8, 2, 2, 2, device=device)
    out = F.conv3d(x, w2, padding="same")
    torch.testing.assert_close(out, real(x, w2, padding="same"), rtol=1e-4, atol=1e-4)
    s = rt.conv3d_stats()
    assert calls[0] == 1 and s["direct"] == 2 and s["unchecked"] == {"dtype torch.float64": 1}, s


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("failure", ["raises", "nan"])
def test_a_failed_signature_goes_straight_to_the_chain(device, failure, monkeypatch):
    real = F.conv3d
    broken, calls = counting(real, failure)
    monkeypatch.setattr(F, "conv3d", broken)
    rt.install_conv3d_fallback()
    rt.reset_conv3d_stats()
    x, w, b = operands(device, torch.float32)
    ref = real(x, w, b, padding=1)
    for _ in range(3):
        torch.testing.assert_close(F.conv3d(x, w, b, padding=1), ref, rtol=1e-4, atol=1e-4)
        rt.conv3d_stats()  # a guarded call's verdict comes back here
    s = rt.conv3d_stats()
    key = "fell_back_on_error" if failure == "raises" else "fell_back_on_non_finite"
    assert (s["calls"], s[key], s["direct"], s["remembered"], calls[0]) == (3, 1, 2, 1, 1)
    # Another signature (another padding) is torch's first again.
    F.conv3d(x, w, b, padding=0)
    assert calls[0] == 2 and rt.conv3d_stats()["remembered"] == 2
    # Uninstalling forgets them.
    rt.uninstall_conv3d_fallback()
    rt.install_conv3d_fallback()
    assert rt.conv3d_stats()["remembered"] == 0


def test_non_finite_inputs_are_not_remembered_as_failures():
    rt.install_conv3d_fallback(mode="verify")
    rt.reset_conv3d_stats()
    x, w, b = operands("cpu", torch.float32)
    x[0, 0, 1, 1, 1] = float("nan")
    out = F.conv3d(x, w, b, padding=1)
    assert not bool(torch.isfinite(out).all())
    s = rt.conv3d_stats()
    assert (s["fell_back"], s["remembered"], s["direct"]) == (0, 0, 0)


def test_installing_again_after_someone_replaced_ours_wraps_theirs():
    real = F.conv3d  # torch's own: the fixture uninstalled the last test's
    real_t = F.conv_transpose3d

    def theirs(*a, **k):
        return real(*a, **k)

    try:
        rt.install_conv3d_fallback()
        F.conv3d = theirs  # another library, after ours
        rt.install_conv3d_fallback(mode="verify")
        assert getattr(F.conv3d, "__rocm_safe_fallback__", False)
        assert F.conv3d.__wrapped__ is theirs
        assert rt.conv3d_stats()["mode"] == "verify"
        rt.uninstall_conv3d_fallback()
        assert F.conv3d is theirs
        # The function nobody replaced is torch's again, never a wrapper.
        assert F.conv_transpose3d is real_t
    finally:
        F.conv3d = real


def test_verify_spot_checks_the_first_calls_of_a_signature_then_one_in_sixteen():
    rt.install_conv3d_fallback(mode="verify")
    rt.reset_conv3d_stats()
    x, w, b = operands("cpu", torch.float32)
    for _ in range(40):
        F.conv3d(x, w, b, padding=1)
    s = rt.conv3d_stats()
    # Calls 0, 1, 16 and 32 of the signature are checked.
    assert (s["calls"], s["verified"], s["verify_skipped"]) == (40, 4, 36)
    # Another signature starts over.
    F.conv3d(x, w, None, padding=1)
    assert rt.conv3d_stats()["verified"] == 5


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU")
def test_verify_accepts_torch_tf32_output_when_torch_allows_tf32():
    # torch's default for cuDNN convolutions: TF32 products. Its output is
    # right at that precision and must not be sent to the chain.
    torch.backends.cudnn.allow_tf32 = True  # the fixture restores it
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 64, 8, 32, 32, generator=g).cuda()
    w = (torch.randn(64, 64, 3, 3, 3, generator=g) / 40).cuda()
    rt.install_conv3d_fallback(mode="verify")
    rt.reset_conv3d_stats()
    for _ in range(3):
        F.conv3d(x, w, None, padding=1)
    s = rt.conv3d_stats()
    # Guarded on the GPU: every call checked.
    assert (s["verified"], s["guarded"], s["mismatches"], s["fell_back"]) == (3, 3, 0, 0), s


# --------------------------------------------------------------------------
# The guard: on a GPU, torch's output is checked on the device and repaired
# there behind the device's verdict, with no wait per call.

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs torch.cuda")


@needs_cuda
@pytest.mark.parametrize("mode", ["fallback", "verify"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_guard_leaves_a_right_output_alone(mode, dtype):
    x, w, b = operands("cuda", dtype)
    ref = F.conv3d(x, w, b, padding=1)
    rt.install_conv3d_fallback(mode=mode)
    rt.reset_conv3d_stats()
    out = F.conv3d(x, w, b, padding=1)
    s = rt.conv3d_stats()
    assert torch.equal(out, ref)
    assert (s["guarded"], s["repaired"], s["fell_back"], s["verified"]) == (1, 0, 0, int(mode == "verify")), s


@needs_cuda
@pytest.mark.parametrize("mode", ["fallback", "verify"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_guard_repairs_wrong_outputs_on_the_device(mode, dtype, monkeypatch):
    real = F.conv3d
    x, w, b = operands("cuda", dtype)
    ref = real(x.float(), w.float(), b.float(), padding=1)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    for failure in ("nan", "wrong"):
        broken, calls = counting(real, failure)
        monkeypatch.setattr(F, "conv3d", broken)
        rt.install_conv3d_fallback(mode=mode)
        rt.reset_conv3d_stats()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = F.conv3d(x, w, b, padding=1)
            s = rt.conv3d_stats()
        caught_it = failure == "nan" or mode == "verify"
        assert s["guarded"] == 1 and s["repaired"] == int(caught_it), s
        assert s["repair_failed"] == 0, s
        if caught_it:
            torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol)
            assert s["remembered"] == 1 and s["fell_back"] == 1, s
            key = "fell_back_on_non_finite" if failure == "nan" else "fell_back_on_mismatch"
            assert s[key] == 1, s
            assert any("wrong values" in str(c.message) for c in caught) == (failure == "wrong")
            # Remembered: the next call goes straight to the chain.
            F.conv3d(x, w, b, padding=1)
            assert calls[0] == 1 and rt.conv3d_stats()["direct"] == 1
        else:
            assert s["fell_back"] == 0 and not torch.allclose(out.float(), ref, rtol=tol, atol=tol)
        rt.uninstall_conv3d_fallback()


@needs_cuda
def test_guard_steps_aside_where_it_cannot_guard(monkeypatch):
    """Kernels of more than 1024 taps take the synchronous checks (and are
    still served when torch fails); non-contiguous operands are copied and guarded, and
    so are fewer than 8 output channels (the chain's naive case: the
    repair's tiled kernel computes them too)."""
    real = F.conv3d
    broken, calls = counting(real, "nan")
    monkeypatch.setattr(F, "conv3d", broken)
    rt.install_conv3d_fallback(mode="verify")
    rt.reset_conv3d_stats()
    x, w, b = operands("cuda", torch.float32)
    xt = x.transpose(3, 4)
    out = F.conv3d(xt, w, b, padding=1)
    w3, b3 = w[:3].clone(), b[:3].clone()
    out3 = F.conv3d(x, w3, b3, padding=1)
    wg = w.clone().requires_grad_()
    F.conv3d(x, wg, b, stride=2, padding=1)
    big = torch.randn(2, 8, 11, 11, 11, device="cuda") / 100
    xb = torch.randn(1, 8, 12, 12, 12, device="cuda")
    torch.testing.assert_close(F.conv3d(xb, big), real(xb, big), rtol=1e-3, atol=1e-3)

    def strided_nan(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        calls[0] += 1
        y = real(input, weight, bias, stride, padding, dilation, groups)
        return y.transpose(3, 4).contiguous().transpose(3, 4).fill_(float("nan"))

    monkeypatch.setattr(F, "conv3d", strided_nan)
    rt.install_conv3d_fallback(mode="verify")
    outs = F.conv3d(x, w, b, padding=1)
    torch.testing.assert_close(outs, real(x, w, b, padding=1), rtol=1e-4, atol=1e-4)
    s = rt.conv3d_stats()
    # The guarded outputs were repaired in place (read after the stats
    # call, which collects their verdicts).
    torch.testing.assert_close(out, real(xt, w, b, padding=1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out3, real(x, w3, b3, padding=1), rtol=1e-4, atol=1e-4)
    # (Since issue 31 the operator returns its outputs compact and owns the
    # gradients: a strided output and inputs that need gradients are
    # guarded too.)
    assert (s["guarded"], s["repaired"], s["fell_back_on_non_finite"], calls[0]) == (4, 4, 5, 5), s
    assert s["unguarded"] == {"the tiled kernel does not take it": 1}, s


@needs_cuda
def test_guard_verdicts_come_back_without_being_asked(monkeypatch):
    """More guarded calls than the verdict ring holds (64): the oldest
    verdicts come back during later calls, so a failing signature is
    remembered with no stats call."""
    real = F.conv3d
    broken, calls = counting(real, "nan")
    monkeypatch.setattr(F, "conv3d", broken)
    rt.install_conv3d_fallback()
    rt.reset_conv3d_stats()
    x, w, b = operands("cuda", torch.float32)
    ref = real(x, w, b, padding=1)
    outs = [F.conv3d(x, w, b, padding=1) for _ in range(70)]
    # Call 65 collected call 1's verdict; from then on, the chain serves.
    assert calls[0] == 65, calls
    for o in outs:
        torch.testing.assert_close(o, ref, rtol=1e-4, atol=1e-4)
    s = rt.conv3d_stats()
    assert (s["guarded"], s["repaired"], s["direct"], s["remembered"]) == (65, 65, 5, 1), s


@needs_cuda
def test_verify_checks_every_guarded_call(monkeypatch):
    """On the GPU, "verify" checks every guarded call (its verdict comes
    back later, so a schedule would let the calls before it through): wrong
    values on any call are repaired, here calls 5 and 17 of 40."""
    real = F.conv3d
    n = [0]

    def sometimes_wrong(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        n[0] += 1
        out = real(input, weight, bias, stride, padding, dilation, groups)
        return out * 1.02 + 0.3 if n[0] in (5, 17) else out

    monkeypatch.setattr(F, "conv3d", sometimes_wrong)
    rt.install_conv3d_fallback(mode="verify")
    rt.reset_conv3d_stats()
    x, w, b = operands("cuda", torch.float32)
    ref = real(x, w, b, padding=1)
    outs = [F.conv3d(x, w, b, padding=1) for _ in range(40)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        s = rt.conv3d_stats()
    assert (s["guarded"], s["verified"], s["verify_skipped"]) == (40, 40, 0), s
    for o in outs:
        torch.testing.assert_close(o, ref, rtol=1e-4, atol=1e-4)
    assert (s["mismatches"], s["repaired"], s["remembered"]) == (2, 2, 1), s
