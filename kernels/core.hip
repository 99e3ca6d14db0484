// The conversion, fingerprint and non-finite scan kernels: everything a
// conversion, a verified load or the self-test launches. The CUDA backend
// builds this file and conv3d.hip as two modules, so a process that never
// runs a conv3d never waits for the conv3d kernels' JIT compile (seconds on
// a machine whose driver cache is cold); HIP builds both through
// kernels.hip into one code object per arch.
#pragma once
#include "prelude.h"
#include "convert.hip"
#include "fingerprint.hip"
#include "convert_fingerprint.hip"
#include "nonfinite.hip"
#include "widen_check.hip"
