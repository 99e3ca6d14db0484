// f32 -> bf16 rounding, shared by the conversion kernels (convert.hip) and
// the conv3d kernels' bf16 output (conv3d.hip): the two are separate CUDA
// modules, one translation unit on HIP.
#pragma once
#include "prelude.h"

// Round to nearest even on the bits; NaN stays a (quiet) NaN.
RS_DEVICE rs_u16 rs_f32_to_bf16(rs_u32 x) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return (rs_u16)((x >> 16) | 0x0040u);
    rs_u32 lsb = (x >> 16) & 1u;
    return (rs_u16)((x + 0x7fffu + lsb) >> 16);
}
