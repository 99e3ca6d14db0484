#!/usr/bin/env bash
# Runs the safetensors project's own Python tests (from its pinned sdist on
# PyPI, never copied here) against the installed rocm_safe, through the shim
# package python/compat/safetensors/, with the failures listed in
# python/compat/expected-failures.txt expected (rocm_safe_upstream.py).
#
#   python/compat/run-upstream-suite.sh [extra pytest arguments]
#
# Needs: rocm_safe installed, pip, maturin (pip download builds the sdist's
# metadata), pytest, numpy, torch, fsspec. A later safetensors release is the
# version below.
set -euo pipefail
SAFETENSORS_VERSION=0.8.0
FILES=(test_simple test_handle test_multithreaded test_pread_backend test_pt_comparison test_pt_model test_threadable)

here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
  "safetensors==$SAFETENSORS_VERSION" -d "$work"
tar -xzf "$work/safetensors-$SAFETENSORS_VERSION.tar.gz" -C "$work"
suite="$work/safetensors-$SAFETENSORS_VERSION/bindings/python"
args=()
for f in "${FILES[@]}"; do args+=("tests/$f.py"); done

# From the sdist's bindings/python (the tests write ./tests/data/...), the
# shim first on the path; pytest's exit status is this script's.
cd "$suite"
PYTHONPATH="$here${PYTHONPATH:+:$PYTHONPATH}" "$python" -m pytest -q -p no:cacheprovider \
  -p rocm_safe_upstream -rfxX "${args[@]}" "$@"
