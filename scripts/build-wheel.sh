#!/usr/bin/env bash
# Builds THE rocm_safe wheel, the one for every machine (issue 34):
#   - features hip + cuda (each runtime is loaded at run time: no ROCm and no
#     CUDA is needed to build, and none is linked);
#   - HIP code objects for every arch of build.rs's DEFAULT_ARCHS that the
#     compiler can target (ROCM_SAFE_OFFLOAD_ARCH / PYTORCH_ROCM_ARCH are
#     cleared so that no local list narrows it; docs/amd.md lists the archs);
#   - tagged manylinux_2_28 (glibc >= 2.28), linked against glibc 2.28's
#     symbols through zig (`pip install ziglang`), so the tag is true on the
#     newer glibc of the build machine too; stripped.
# Needs: cargo, maturin >= 1.7, clang >= 19 with lld (apt install clang-19
# lld-19), zig (`pip install ziglang`, or a zig on PATH).
#
# Usage: scripts/build-wheel.sh [OUT_DIR]   (default target/wheels-one)
# Prints the wheel's path as its last line. CARGO_TARGET_DIR is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-target/wheels-one}" && cd "${1:-target/wheels-one}" && pwd)
rm -f "$out"/rocm_safe-*.whl
unset ROCM_SAFE_OFFLOAD_ARCH PYTORCH_ROCM_ARCH ROCM_SAFE_CUDA_ARCH
# zig: on PATH, else pip's ziglang through a `zig` shim of our own (the
# Python that has it).
if ! command -v zig >/dev/null; then
  py=${PYTHON:-python3}
  if ! "$py" -c 'import ziglang' 2>/dev/null; then
    echo "scripts/build-wheel.sh: zig is needed for the manylinux_2_28 link: pip install ziglang" >&2
    exit 1
  fi
  shim=$(mktemp -d)
  trap 'rm -rf "$shim"' EXIT
  printf '#!/bin/sh\nexec "%s" -m ziglang "$@"\n' "$(command -v "$py")" > "$shim/zig"
  chmod +x "$shim/zig"
  export PATH="$shim:$PATH"
fi
zig version
(
  cd python
  maturin build --release --locked --features hip,cuda \
    --compatibility manylinux_2_28 --zig --strip --out "$out"
)
ls "$out"/rocm_safe-*.whl
