// Counts NaN and Inf in f32 / bf16 / f16 buffers; with clamp != 0 it also
// rewrites them in place: NaN -> +0, +-Inf -> +-largest finite. Integer bit
// tests only. counts[0] += NaNs, counts[1] += Infs (one atomic each per block).
// With a gate (prelude.h: rs_gate_closed) the scan runs only when it is open.
#pragma once
#include "prelude.h"

RS_DEVICE void rs_count_reduce_add(rs_u64 nan, rs_u64 inf, rs_u64* counts) {
    __shared__ rs_u64 pn[256];
    __shared__ rs_u64 pi[256];
    pn[threadIdx.x] = nan;
    pi[threadIdx.x] = inf;
    __syncthreads();
    for (unsigned int k = 128; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            pn[threadIdx.x] += pn[threadIdx.x + k];
            pi[threadIdx.x] += pi[threadIdx.x + k];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (pn[0] != 0u) rs_atomic_add_u64(counts, pn[0]);
        if (pi[0] != 0u) rs_atomic_add_u64(counts + 1, pi[0]);
    }
}

// T: storage type; EXPMASK: exponent bits; MANMASK: mantissa bits;
// MAXFIN: largest finite magnitude pattern. Counting only (clamp == 0) over
// a 16-byte aligned buffer, the threads read 16-byte vectors (the guarded
// conv3d fallback scans every output it guards: a bandwidth-bound read),
// and the elements past the last whole vector one by one.
#define RS_NONFINITE_CLASSIFY(T, x, EXPMASK, MANMASK)                                   \
    if (((x) & (T)(EXPMASK)) == (T)(EXPMASK)) {                                         \
        if (((x) & (T)(MANMASK)) != 0) {                                                \
            ++nan;                                                                      \
        } else {                                                                        \
            ++inf;                                                                      \
        }                                                                               \
    }
#define RS_NONFINITE_KERNEL(NAME, T, EXPMASK, MANMASK, MAXFIN, SIGN)                    \
    KERNEL void RS_HIP_BLOCK(256)                                                       \
        NAME(T* p, rs_u64 n, rs_u32 clamp, rs_u64* counts, const rs_u64* gate) {        \
        if (rs_gate_closed(gate)) return;                                               \
        const rs_u64 tid = rs_tid();                                                    \
        const rs_u64 stride = rs_nthreads();                                            \
        rs_u64 nan = 0, inf = 0;                                                        \
        rs_u64 first = 0;                                                               \
        if (clamp == 0 && (((rs_u64)p) & 15u) == 0) {                                   \
            const rs_u64 per = 16 / sizeof(T);                                          \
            const rs_u64 nv = n / per;                                                  \
            const rs_v4* v = (const rs_v4*)p;                                           \
            for (rs_u64 i = tid; i < nv; i += stride) {                                 \
                const rs_v4 q = rs_load4(v + i);                                        \
                const rs_u32 w[4] = {q.x, q.y, q.z, q.w};                               \
                for (int k = 0; k < 4; ++k) {                                           \
                    if (sizeof(T) == 4) {                                               \
                        const T x = (T)w[k];                                            \
                        RS_NONFINITE_CLASSIFY(T, x, EXPMASK, MANMASK)                   \
                    } else {                                                            \
                        const T lo = (T)(w[k] & 0xffffu), hi = (T)(w[k] >> 16);         \
                        RS_NONFINITE_CLASSIFY(T, lo, EXPMASK, MANMASK)                  \
                        RS_NONFINITE_CLASSIFY(T, hi, EXPMASK, MANMASK)                  \
                    }                                                                   \
                }                                                                       \
            }                                                                           \
            first = nv * per;                                                           \
        }                                                                               \
        for (rs_u64 i = first + tid; i < n; i += stride) {                              \
            const T x = p[i];                                                           \
            if ((x & (T)(EXPMASK)) == (T)(EXPMASK)) {                                   \
                if ((x & (T)(MANMASK)) != 0) {                                          \
                    ++nan;                                                              \
                    if (clamp) p[i] = (T)0;                                             \
                } else {                                                                \
                    ++inf;                                                              \
                    if (clamp) p[i] = (T)((x & (T)(SIGN)) | (T)(MAXFIN));               \
                }                                                                       \
            }                                                                           \
        }                                                                               \
        rs_count_reduce_add(nan, inf, counts);                                          \
    }

RS_NONFINITE_KERNEL(nonfinite_f32, rs_u32, 0x7f800000u, 0x007fffffu, 0x7f7fffffu, 0x80000000u)
RS_NONFINITE_KERNEL(nonfinite_bf16, rs_u16, 0x7f80u, 0x007fu, 0x7f7fu, 0x8000u)
RS_NONFINITE_KERNEL(nonfinite_f16, rs_u16, 0x7c00u, 0x03ffu, 0x7bffu, 0x8000u)
