"""The chain's backward ops and conv_transpose3d behind rocm_safe.torch's
autograd (``_native.conv3d_backward``, ``_native.conv_transpose3d``,
``_native.conv_transpose3d_verify``) on numpy arrays lent through DLPack
to the host backend (no torch needed), against float64 numpy references
written here from the definitions."""

import itertools

import numpy as np
import pytest

from rocm_safe import _native


def conv3d_ref(x, w, stride, padding, dilation, groups):
    """conv3d in float64, by its definition."""
    n, c, d, h, wd = x.shape
    k, cg, kd, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0)] + [(p, p) for p in padding])
    out = [(s + 2 * p - dl * (kk - 1) - 1) // st + 1 for s, p, dl, kk, st in zip((d, h, wd), padding, dilation, (kd, kh, kw), stride)]
    y = np.zeros((n, k) + tuple(out))
    kg = k // groups
    for o in range(k):
        g = o // kg
        for a, b, cc in itertools.product(range(kd), range(kh), range(kw)):
            sl = xp[
                :,
                g * cg : (g + 1) * cg,
                a * dilation[0] : a * dilation[0] + stride[0] * (out[0] - 1) + 1 : stride[0],
                b * dilation[1] : b * dilation[1] + stride[1] * (out[1] - 1) + 1 : stride[1],
                cc * dilation[2] : cc * dilation[2] + stride[2] * (out[2] - 1) + 1 : stride[2],
            ]
            y[:, o] += np.einsum("ncdhw,c->ndhw", sl, w[o, :, a, b, cc].astype(np.float64))
    return y


def conv_transpose3d_ref(x, w, b, stride, padding, output_padding, dilation, groups):
    """conv_transpose3d in float64, by its scatter definition."""
    n, cin, d, h, wd = x.shape
    _, coutg, kd, kh, kw = w.shape
    cing = cin // groups
    out = [
        (s - 1) * st - 2 * p + dl * (kk - 1) + op + 1
        for s, st, p, dl, kk, op in zip((d, h, wd), stride, padding, dilation, (kd, kh, kw), output_padding)
    ]
    full = [o + 2 * p for o, p in zip(out, padding)]
    y = np.zeros((n, coutg * groups) + tuple(f + max(st, dl) * kk for f, st, dl, kk in zip(full, stride, dilation, (kd, kh, kw))))
    for g in range(groups):
        xs = x[:, g * cing : (g + 1) * cing].astype(np.float64)
        for a, bb, cc in itertools.product(range(kd), range(kh), range(kw)):
            contrib = np.einsum("ncdhw,co->nodhw", xs, w[g * cing : (g + 1) * cing, :, a, bb, cc].astype(np.float64))
            z0, y0, x0 = a * dilation[0], bb * dilation[1], cc * dilation[2]
            y[
                :,
                g * coutg : (g + 1) * coutg,
                z0 : z0 + stride[0] * (d - 1) + 1 : stride[0],
                y0 : y0 + stride[1] * (h - 1) + 1 : stride[1],
                x0 : x0 + stride[2] * (wd - 1) + 1 : stride[2],
            ] += contrib
    y = y[:, :, padding[0] : padding[0] + out[0], padding[1] : padding[1] + out[1], padding[2] : padding[2] + out[2]]
    if b is not None:
        y = y + b.astype(np.float64)[None, :, None, None, None]
    return y


CASES = [
    # stride, padding, dilation, groups, input, weight
    ((1, 1, 1), (1, 1, 1), (1, 1, 1), 1, (2, 3, 4, 5, 6), (4, 3, 3, 3, 3)),
    ((2, 1, 2), (1, 0, 2), (1, 2, 1), 1, (1, 2, 7, 6, 8), (3, 2, 3, 2, 3)),
    ((1, 2, 1), (0, 1, 1), (2, 1, 1), 2, (1, 4, 6, 5, 4), (6, 2, 2, 3, 3)),
]


def rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def backward(op, dy, other, x_shape, w_shape, stride, padding, dilation, groups, out_shape):
    out = np.zeros(out_shape, dtype=np.float32)
    served, report = _native.conv3d_backward(
        "cpu",
        0,
        op,
        dy.__dlpack__(),
        None if other is None else other.__dlpack__(),
        out.__dlpack__(),
        list(x_shape),
        list(w_shape),
        list(stride),
        list(padding),
        list(dilation),
        groups,
    )
    assert served == "naive", report
    return out


@pytest.mark.parametrize("case", CASES, ids=str)
def test_gradients_are_the_adjoints_of_conv3d(case):
    stride, padding, dilation, groups, xs, ws = case
    x, w = rand(xs, 1), rand(ws, 2)
    y = conv3d_ref(x, w, stride, padding, dilation, groups)
    dy = rand(y.shape, 3)
    dx = backward("data", dy, w, xs, ws, stride, padding, dilation, groups, xs)
    dw = backward("weight", dy, x, xs, ws, stride, padding, dilation, groups, ws)
    db = backward("bias", dy, None, xs, ws, stride, padding, dilation, groups, (ws[0],))
    # dx = conv_transpose3d(dy, w); dw: the correlation of x and dy.
    pad_out = [xi - ((yi - 1) * st - 2 * p + dl * (k - 1) + 1) for xi, yi, st, p, dl, k in zip(xs[2:], y.shape[2:], stride, padding, dilation, ws[2:])]
    want_dx = conv_transpose3d_ref(dy, w, None, stride, padding, pad_out, dilation, groups)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-4)
    lhs = float((y * dy.astype(np.float64)).sum())
    assert abs(float((dw.astype(np.float64) * w).sum()) - lhs) <= 1e-4 * (1 + np.abs(y).sum())
    np.testing.assert_allclose(db, dy.astype(np.float64).sum(axis=(0, 2, 3, 4)), rtol=1e-5, atol=1e-4)


TCASES = [
    # stride, padding, output_padding, dilation, groups, input, weight, bias
    ((2, 2, 2), (1, 1, 1), (1, 0, 1), (1, 1, 1), 1, (2, 3, 3, 4, 3), (3, 4, 3, 3, 3), True),
    ((1, 2, 3), (0, 1, 0), (0, 1, 2), (1, 1, 1), 2, (1, 4, 3, 4, 3), (4, 3, 2, 3, 1), False),
    ((1, 1, 1), (0, 0, 0), (2, 1, 0), (3, 3, 3), 1, (1, 2, 3, 3, 3), (2, 2, 2, 2, 2), True),
]


@pytest.mark.parametrize("case", TCASES, ids=str)
def test_conv_transpose3d_matches_its_definition_and_verifies(case):
    stride, padding, op, dilation, groups, xs, ws, has_bias = case
    x, w = rand(xs, 4), rand(ws, 5)
    b = rand((ws[1] * groups,), 6) if has_bias else None
    want = conv_transpose3d_ref(x, w, b, stride, padding, op, dilation, groups)
    out = np.zeros(want.shape, dtype=np.float32)
    params = (list(stride), list(padding), list(op), list(dilation), groups)
    served, report = _native.conv_transpose3d(
        "cpu", 0, x.__dlpack__(), w.__dlpack__(), None if b is None else b.__dlpack__(), out.__dlpack__(), *params
    )
    assert served == "naive", report
    assert "vendor: skipped" in report and "tiled: skipped" in report, report
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)

    def verify(y):
        return _native.conv_transpose3d_verify(
            "cpu", 0, x.__dlpack__(), w.__dlpack__(), None if b is None else b.__dlpack__(), y.__dlpack__(), *params
        )

    assert verify(out) is None
    off = (out * np.float32(1.01) + np.float32(0.05)).astype(np.float32)
    msg = verify(off)
    assert msg is not None and "differs from the f64 reference" in msg, msg


def test_refused_parameters_are_value_errors():
    x, w = rand((1, 2, 3, 3, 3), 7), rand((2, 2, 3, 3, 3), 8)
    out = np.zeros((1, 2, 6, 6, 6), dtype=np.float32)
    with pytest.raises(ValueError, match="output_padding"):
        _native.conv_transpose3d(
            "cpu", 0, x.__dlpack__(), w.__dlpack__(), None, out.__dlpack__(), [2, 2, 2], [0, 0, 0], [2, 0, 0], [1, 1, 1], 1
        )
    with pytest.raises(ValueError, match="conv3d_backward"):
        _native.conv3d_backward(
            "cpu", 0, "data", x.__dlpack__(), None, out.__dlpack__(), [1, 2, 3, 3, 3], [2, 2, 3, 3, 3], [1] * 3, [0] * 3, [1] * 3, 1
        )
