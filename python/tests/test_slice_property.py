"""A property test of ``get_slice(name)[index]`` against numpy: random
shapes and random index expressions (ints, slices with any bounds and
steps, ``...``, an empty list), seeded, each compared with
``numpy.asarray(t)[index]``. The documented differences (python/README.md,
"What differs") are drawn too and must be refused with a SafetensorError:
a bool, ``None`` (a new axis), a non-empty list, an empty list with an int
or a second list."""

import io

import numpy as np
import pytest

import rocm_safe.numpy as rn
from rocm_safe import SafetensorError, safe_open

ml_dtypes = pytest.importorskip("ml_dtypes")

DTYPES = [np.float32, np.int16, np.uint8, np.bool_, np.float64, ml_dtypes.bfloat16]


def random_tensors(rng, count):
    out = {}
    for i in range(count):
        shape = tuple(int(d) for d in rng.integers(0, 6, size=rng.integers(0, 5)))
        dt = DTYPES[i % len(DTYPES)]
        a = np.asarray(rng.standard_normal(shape) * 10)
        out[f"t{i}"] = np.asarray((a > 0) if dt is np.bool_ else a.astype(dt))
    return out


def random_bound(rng, dim):
    r = rng.random()
    if r < 0.25:
        return None
    return int(rng.integers(-dim - 3, dim + 4))


def random_item(rng, dim):
    """One index item for a dimension of size ``dim``: mostly what numpy and
    we both take."""
    r = rng.random()
    if r < 0.3 and dim > 0:
        return int(rng.integers(-dim, dim))
    if r < 0.35:
        return np.int64(rng.integers(-dim, dim)) if dim > 0 else slice(None)
    step = None if rng.random() < 0.4 else int(rng.choice([-3, -2, -1, 1, 2, 3]))
    return slice(random_bound(rng, dim), random_bound(rng, dim), step)


def random_index(rng, shape):
    n = int(rng.integers(0, len(shape) + 1))
    items = [random_item(rng, d) for d in shape[:n]]
    if rng.random() < 0.3:  # an ellipsis somewhere
        items.insert(int(rng.integers(0, len(items) + 1)), Ellipsis)
    if rng.random() < 0.15 and items:  # an empty list in place of a slice
        slots = [i for i, x in enumerate(items) if isinstance(x, slice)]
        if slots and not any(isinstance(x, (int, np.integer)) for x in items):
            items[int(rng.choice(slots))] = []
    if len(items) == 1 and rng.random() < 0.5:
        return items[0]
    return tuple(items)


def differing_index(rng, shape):
    """An index that numpy takes and we refuse (documented)."""
    kind = int(rng.integers(0, 5))
    if kind == 0:
        return True
    if kind == 1:
        return (None,) + (slice(None),) * min(1, len(shape))
    if kind == 2:
        return [0] if shape and shape[0] else [0, 0]
    if kind == 3:
        return ([], 0) if len(shape) >= 2 and shape[1] else ([], [])
    return (slice(None), np.bool_(False))


def same(ours, want, context):
    assert ours.dtype == want.dtype, context
    assert ours.shape == want.shape, context
    assert ours.tobytes() == np.ascontiguousarray(want).tobytes(), context


@pytest.mark.parametrize("seed", range(6))
def test_getitem_indexes_as_numpy(seed, tmp_path):
    rng = np.random.default_rng(seed)
    tensors = random_tensors(rng, 12)
    p = tmp_path / "m.safetensors"
    rn.save_file(tensors, p)
    compared = refused = 0
    # From a path and from a file object: one indexing code.
    for source in (p, io.BytesIO(p.read_bytes())):
        with safe_open(source, "np") as f:
            for name, t in tensors.items():
                s = f.get_slice(name)
                for _ in range(40):
                    index = random_index(rng, t.shape)
                    try:
                        want = np.asarray(t)[index]
                    except IndexError:
                        with pytest.raises(SafetensorError):
                            s[index]
                        refused += 1
                        continue
                    same(np.asarray(s[index]), np.asarray(want), (name, t.shape, index))
                    compared += 1
                index = differing_index(rng, t.shape)
                try:
                    np.asarray(t)[index]
                except IndexError:
                    pass  # numpy refuses it too for this shape
                else:
                    with pytest.raises(SafetensorError):
                        s[index]
                    refused += 1
    # The generator covers both outcomes.
    assert compared > 400 and refused > 5, (compared, refused)


def test_the_empty_list_cases_are_drawn():
    # Guards the generator: empty lists, ellipses, negative steps occur.
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(2000):
        idx = random_index(rng, (4, 3, 2))
        items = idx if isinstance(idx, tuple) else (idx,)
        seen.update(
            "list" if isinstance(x, list) else "ellipsis" if x is Ellipsis else
            "negstep" if isinstance(x, slice) and (x.step or 1) < 0 else type(x).__name__
            for x in items
        )
    assert {"list", "ellipsis", "negstep", "int", "slice", "int64"} <= seen, seen
