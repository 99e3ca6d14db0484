// The exact check of a widening conversion that already ran (the crate's
// moves: src/moves/cast.rs): counts the elements of `dst` (f32 bit
// patterns) that differ from the exact widening of the same element of
// `src`, computed here with the integer functions of convert.hip, and adds
// the count to *count (one atomic per block). A separate launch that reads
// both buffers from memory: a conversion kernel that did not run, ran on
// other data, or wrote zeros is counted element by element.
//
// Launch with blockDim.x == RS_FP_BLOCK (256) and any grid.
#pragma once
#include "prelude.h"
#include "convert.hip"
#include "fingerprint.hip"

#define RS_WIDEN_CHECK_KERNEL(NAME, SRC_T, FN)                                                \
    KERNEL void RS_HIP_BLOCK(RS_FP_BLOCK)                                                     \
        NAME(const SRC_T* __restrict__ src, const rs_u32* __restrict__ dst, rs_u64 n,         \
             rs_u64* count) {                                                                 \
        const rs_u64 tid = rs_tid();                                                          \
        const rs_u64 stride = rs_nthreads();                                                  \
        rs_u64 bad = 0;                                                                       \
        for (rs_u64 i = tid; i < n; i += stride) bad += (dst[i] != FN(src[i])) ? 1u : 0u;     \
        rs_block_reduce_add(bad, count);                                                      \
    }

RS_WIDEN_CHECK_KERNEL(widen_check_bf16_f32, rs_u16, rs_bf16_to_f32)
RS_WIDEN_CHECK_KERNEL(widen_check_f16_f32, rs_u16, rs_f16_to_f32)
RS_WIDEN_CHECK_KERNEL(widen_check_f8_e4m3_f32, rs_u8, rs_f8_e4m3_to_f32)
RS_WIDEN_CHECK_KERNEL(widen_check_f8_e5m2_f32, rs_u8, rs_f8_e5m2_to_f32)
