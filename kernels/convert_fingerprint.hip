// Fused "convert + fingerprint of the output": bf16/f16 -> f32 written exactly
// as convert.hip does, while the S of fingerprint.hip is summed over the f32
// words the kernel stores (word index == element index). This checks the
// kernel's arithmetic at no extra memory traffic; it does not re-read the
// stored output, which a separate fingerprint_sum_u8 pass does.
//
// Launch with blockDim.x == RS_FP_BLOCK (256). dst must be the start of the
// fingerprinted output (word 0).
#pragma once
#include "prelude.h"
#include "convert.hip"
#include "fingerprint.hip"

#define RS_WIDEN_FP_KERNEL(NAME, FN)                                                       \
    KERNEL void RS_HIP_BLOCK(RS_FP_BLOCK)                                                  \
        NAME(const rs_u16* __restrict__ src, rs_u32* __restrict__ dst, rs_u64 n,           \
             rs_u64* acc) {                                                                \
        const rs_u64 tid = rs_tid();                                                       \
        const rs_u64 stride = rs_nthreads();                                               \
        const rs_u64 sa = (rs_u64)src;                                                     \
        rs_u64 head = ((16u - (sa & 15u)) & 15u) / 2u;                                     \
        const bool vec = (sa & 1u) == 0u && (((rs_u64)dst + 4u * head) & 15u) == 0u;       \
        if (!vec) head = n;                                                                \
        if (head > n) head = n;                                                            \
        const rs_u64 nvec = (n - head) / 8u;                                               \
        rs_u64 s = 0;                                                                      \
        for (rs_u64 i = tid; i < head; i += stride) {                                      \
            rs_u32 w = FN(src[i]);                                                         \
            dst[i] = w;                                                                    \
            s += rs_term(i, w);                                                            \
        }                                                                                  \
        /* 8 words per step; stride*8 is a multiple of 256, so lanes are fixed. */         \
        const rs_u32 lane0 = (rs_u32)((head + 8u * tid) & 255u);                           \
        rs_u64 lk[8];                                                                      \
        _Pragma("unroll") for (int k = 0; k < 8; ++k) lk[k] = rs_lane_key((lane0 + k) & 255u); \
        const bool wraps = lane0 > 248u;                                                   \
        const rs_v4* s4 = (const rs_v4*)(src + head);                                      \
        rs_v4* d4 = (rs_v4*)(dst + head);                                                  \
        for (rs_u64 v = tid; v < nvec; v += stride) {                                      \
            rs_v4 a = rs_load4(s4 + v);                                                    \
            rs_u32 o[8];                                                                   \
            o[0] = FN((rs_u16)(a.x & 0xffffu)); o[1] = FN((rs_u16)(a.x >> 16));            \
            o[2] = FN((rs_u16)(a.y & 0xffffu)); o[3] = FN((rs_u16)(a.y >> 16));            \
            o[4] = FN((rs_u16)(a.z & 0xffffu)); o[5] = FN((rs_u16)(a.z >> 16));            \
            o[6] = FN((rs_u16)(a.w & 0xffffu)); o[7] = FN((rs_u16)(a.w >> 16));            \
            rs_v4 lo, hi;                                                                  \
            lo.x = o[0]; lo.y = o[1]; lo.z = o[2]; lo.w = o[3];                            \
            hi.x = o[4]; hi.y = o[5]; hi.z = o[6]; hi.w = o[7];                            \
            d4[2u * v] = lo;                                                               \
            d4[2u * v + 1u] = hi;                                                          \
            const rs_u64 blk = (head + 8u * v) >> 8;                                       \
            const rs_u64 b0 = rs_block_key(blk);                                           \
            if (!wraps) {                                                                  \
                _Pragma("unroll") for (int k = 0; k < 8; ++k) s += rs_term_keys(lk[k], b0, o[k]); \
            } else {                                                                       \
                const rs_u64 b1 = rs_block_key(blk + 1u);                                  \
                _Pragma("unroll") for (int k = 0; k < 8; ++k)                              \
                    s += rs_term_keys(lk[k], lane0 + (rs_u32)k > 255u ? b1 : b0, o[k]);    \
            }                                                                              \
        }                                                                                  \
        for (rs_u64 i = head + nvec * 8u + tid; i < n; i += stride) {                      \
            rs_u32 w = FN(src[i]);                                                         \
            dst[i] = w;                                                                    \
            s += rs_term(i, w);                                                            \
        }                                                                                  \
        rs_block_reduce_add(s, acc);                                                       \
    }

RS_WIDEN_FP_KERNEL(convert_fingerprint_bf16_f32, rs_bf16_to_f32)
RS_WIDEN_FP_KERNEL(convert_fingerprint_f16_f32, rs_f16_to_f32)
