"""A user's script, type-checked by CI with `mypy --strict` against the
installed wheel (its py.typed, the stubs of rocm_safe._native and the
package's annotations). It is checked, not run."""

from typing import Dict, List

import numpy as np

import rocm_safe
from rocm_safe import SafetensorError, safe_open
from rocm_safe.numpy import load_file, save_file


def main(path: str) -> None:
    tensors: Dict[str, np.ndarray] = {"w": np.zeros((2, 3), dtype=np.float32)}
    save_file(tensors, path, metadata={"format": "np"})
    loaded: Dict[str, np.ndarray] = load_file(path)
    with safe_open(path, framework="np") as f:
        names: List[str] = f.keys()
        first = f.get_tensor(names[0])
        rows = f.get_slice("w")[0:1]
        shape: List[int] = f.get_slice("w").get_shape()
        print(first.shape, rows, shape, f.metadata())
    features = rocm_safe.features()
    backend: str = features.backend
    choice = rocm_safe.backend()
    reason: str = choice.reason
    evidence: tuple[str, ...] = choice.evidence
    version: str = rocm_safe.__version__
    report = rocm_safe.doctor(json=True)
    assert isinstance(report, str)
    try:
        rocm_safe._native.Checkpoint(path).read("w", to="BF16")
    except SafetensorError as e:
        print(e)
    print(len(loaded), backend, reason, evidence, version, list(features))


if __name__ == "__main__":
    main("/tmp/rocm_safe_typing.safetensors")
