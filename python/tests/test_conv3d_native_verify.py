"""The native device check behind install_conv3d_fallback(mode="verify"),
on numpy arrays lent through DLPack to the host backend (no torch needed):
an output the chain computed passes; slightly wrong finite values and a NaN
at a sampled point are reported."""

import numpy as np
import pytest

from rocm_safe import _native

PARAMS = ([1, 1, 1], [1, 1, 1], [1, 1, 1], 1)  # stride, padding, dilation, groups


def operands(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 8, 5, 6, 7), dtype=np.float32)
    w = (rng.standard_normal((16, 8, 3, 3, 3), dtype=np.float32) / np.sqrt(8 * 27)).astype(np.float32)
    b = rng.standard_normal(16, dtype=np.float32)
    return x, w, b


def chain_output(x, w, b):
    y = np.zeros((2, 16, 5, 6, 7), dtype=np.float32)
    served, report = _native.conv3d(
        "cpu", 0, x.__dlpack__(), w.__dlpack__(), b.__dlpack__(), y.__dlpack__(), *PARAMS
    )
    assert served, report
    return y


def verify(x, w, b, y):
    return _native.conv3d_verify(
        "cpu", 0, x.__dlpack__(), w.__dlpack__(), b.__dlpack__(), y.__dlpack__(), *PARAMS
    )


def test_a_correct_output_passes_and_wrong_ones_are_reported():
    x, w, b = operands()
    y = chain_output(x, w, b)
    assert verify(x, w, b, y) is None
    off = (y * np.float32(1.001) + np.float32(0.01)).astype(np.float32)
    msg = verify(x, w, b, off)
    assert msg is not None and "differs from the f64 reference" in msg, msg
    nan = y.copy()
    nan.flat[0] = np.nan  # sampled point 0 is always index 0
    msg = verify(x, w, b, nan)
    assert msg is not None and "index 0" in msg, msg


def test_shapes_the_check_does_not_take_are_value_errors():
    x, w, b = operands()
    y = chain_output(x, w, b)
    with pytest.raises(ValueError, match="conv3d_verify"):
        verify(x, w, b, y[:, :8].copy())
