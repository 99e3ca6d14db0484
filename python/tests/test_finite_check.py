"""The installed fallback's finiteness check of torch's output
(``_conv3d_fallback._all_finite``): one ``aminmax`` read instead of an
``isfinite`` mask, so it must see every NaN and infinity a mask would."""

import pytest

torch = pytest.importorskip("torch")

from rocm_safe import _conv3d_fallback as fb  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_non_finite_value_is_seen_wherever_it_is(device, dtype):
    t = torch.randn(2, 3, 4, 5, 6, device=device).to(dtype)
    assert fb._all_finite(t)
    for bad in (float("nan"), float("inf"), float("-inf")):
        for index in (0, t.numel() // 2, t.numel() - 1):
            u = t.clone()
            u.view(-1)[index] = bad
            assert not fb._all_finite(u), (bad, index)
            assert fb._all_finite(u) == bool(torch.isfinite(u).all())
    # The largest finite values are finite.
    big = torch.full((7,), torch.finfo(dtype).max, device=device, dtype=dtype)
    assert fb._all_finite(big) and fb._all_finite(-big)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_integer_tensors_are_finite(device):
    assert fb._all_finite(torch.empty(0, 3, device=device))
    assert fb._all_finite(torch.arange(5, device=device))
    assert fb._finite(torch.ones(2, device=device), None)
    assert not fb._finite(torch.ones(2, device=device), torch.tensor([float("nan")], device=device))
