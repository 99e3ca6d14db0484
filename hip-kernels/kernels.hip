// The one translation unit build.rs compiles (hipcc --genco per arch, nvcc
// --ptx, or NVRTC at run time). Every kernel file is listed here.
#include "prelude.h"
#include "convert.hip"
#include "fingerprint.hip"
#include "convert_fingerprint.hip"
#include "nonfinite.hip"
#include "conv3d.hip"
