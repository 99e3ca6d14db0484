// The one translation unit build.rs compiles for HIP (hipcc --genco per
// arch). Every kernel file is reached from here. CUDA builds core.hip and
// conv3d.hip as two modules instead (nvcc --ptx, or NVRTC at run time).
#include "prelude.h"
#include "core.hip"
#include "conv3d.hip"
