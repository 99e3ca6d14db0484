"""fp8 checkpoints: every e4m3fn and e5m2 code converts exactly to float32,
bfloat16 and float16 on load (against ml_dtypes' own conversion), and the
dtype tables come from the library's conversion table."""

import numpy as np
import pytest

from rocm_safe import _dtypes, _native
from rocm_safe.numpy import load_file, save_file

ml_dtypes = pytest.importorskip("ml_dtypes")


def test_tables_come_from_the_native_table():
    rows = _native.conversions()
    pairs = {(r[0], r[1]) for r in rows}
    assert ("F8_E4M3", "F32") in pairs and ("F8_E5M2", "F16") in pairs
    assert ("F32", "F8_E4M3") not in pairs
    assert set(_dtypes.CONVERT_TARGETS) == {"F32", "F16", "BF16"}
    assert set(_dtypes.CONVERT_SOURCES) == {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"}
    by_pair = {(r[0], r[1]): r for r in rows}
    # (from, to, src_size, dst_size, kernel, fused, per_item, lossless)
    assert by_pair[("F8_E4M3", "F32")][2:] == (1, 4, "convert_f8_e4m3_f32", None, 16, True)
    assert by_pair[("BF16", "F32")][5] == "convert_fingerprint_bf16_f32"
    assert _dtypes.ITEMSIZE["F8_E5M2"] == 1 and "F4" not in _dtypes.ITEMSIZE
    assert _dtypes.conversion_target("float16") == "F16"
    with pytest.raises(ValueError):
        _dtypes.conversion_target("float8_e4m3fn")


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_every_code_loads_exactly(tmp_path, name):
    codes = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, name))
    p = tmp_path / "f8.safetensors"
    save_file({"w": codes}, p)
    assert load_file(p)["w"].tobytes() == codes.tobytes()
    for target in (np.float32, ml_dtypes.bfloat16, np.float16):
        got = load_file(p, dtype=target)["w"]
        want = codes.astype(np.float32).astype(target)
        assert got.dtype == np.dtype(target)
        finite = np.isfinite(want.astype(np.float32))
        assert got[finite].tobytes() == want[finite].tobytes(), (name, target)
        assert np.isnan(got.astype(np.float32)[np.isnan(want.astype(np.float32))]).all()
        assert np.array_equal(np.isinf(got.astype(np.float32)), np.isinf(want.astype(np.float32)))
