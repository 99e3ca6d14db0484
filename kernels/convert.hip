// Exact, integer-only dtype conversions (the crate's contract 1: src/lib.rs,
// "# Contracts"): the device kernels of the rows of src/convert/table.rs that name one (each symbol
// there, `convert_{src}_{dst}`, is defined here).
//
// Each function reproduces src/convert/scalar.rs bit for bit, NaN handling
// included; no float arithmetic is used. Kernels read the source with 16-byte
// vector loads where source and destination can both be aligned, with a scalar
// head and tail; otherwise they fall back to a scalar loop. All indices are
// 64-bit (grid-stride loops over size_t counts).
#pragma once
#include "prelude.h"
#include "bf16.h"

RS_DEVICE rs_u32 rs_bf16_to_f32(rs_u16 h) { return ((rs_u32)h) << 16; }

RS_DEVICE rs_u32 rs_f16_to_f32(rs_u16 h) {
    rs_u32 sign = (((rs_u32)h) & 0x8000u) << 16;
    rs_u32 exp = (((rs_u32)h) >> 10) & 0x1fu;
    rs_u32 man = ((rs_u32)h) & 0x3ffu;
    if (exp == 0x1fu) return sign | 0x7f800000u | (man << 13);
    if (exp != 0u) return sign | ((exp + 112u) << 23) | (man << 13);
    if (man == 0u) return sign;
    rs_u32 p = 31u - rs_clz32(man);
    return sign | ((p + 103u) << 23) | ((man << (23u - p)) & 0x7fffffu);
}


RS_DEVICE rs_u16 rs_f32_to_f16(rs_u32 x) {
    rs_u32 sign = (x >> 16) & 0x8000u;
    int exp = (int)((x >> 23) & 0xffu);
    rs_u32 man = x & 0x7fffffu;
    if (exp == 0xff) {
        if (man != 0u) return (rs_u16)(sign | 0x7e00u | (man >> 13));
        return (rs_u16)(sign | 0x7c00u);
    }
    int e = exp - 127 + 15;
    if (e >= 0x1f) return (rs_u16)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10) return (rs_u16)sign;
        rs_u32 m = man | 0x800000u;
        rs_u32 shift = (rs_u32)(14 - e);  // 14..=24
        rs_u32 q = m >> shift;
        rs_u32 rem = m & ((1u << shift) - 1u);
        rs_u32 half = 1u << (shift - 1u);
        rs_u32 up = (rem > half || (rem == half && (q & 1u) == 1u)) ? 1u : 0u;
        return (rs_u16)(sign | (q + up));
    }
    rs_u32 h = (((rs_u32)e) << 10) | (man >> 13);
    rs_u32 rem = man & 0x1fffu;
    rs_u32 up = (rem > 0x1000u || (rem == 0x1000u && (h & 1u) == 1u)) ? 1u : 0u;
    return (rs_u16)(sign | (h + up));
}

// ---- 16-bit -> f32: 8 elements per vector step (one 16-byte load, two stores)

#define RS_WIDEN_KERNEL(NAME, FN)                                                        \
    KERNEL void NAME(const rs_u16* __restrict__ src, rs_u32* __restrict__ dst, rs_u64 n) { \
        const rs_u64 tid = rs_tid();                                                     \
        const rs_u64 stride = rs_nthreads();                                             \
        const rs_u64 sa = (rs_u64)src;                                                   \
        rs_u64 head = ((16u - (sa & 15u)) & 15u) / 2u;                                   \
        const bool vec = (sa & 1u) == 0u && (((rs_u64)dst + 4u * head) & 15u) == 0u;     \
        if (!vec) head = n;                                                              \
        if (head > n) head = n;                                                          \
        const rs_u64 nvec = (n - head) / 8u;                                             \
        for (rs_u64 i = tid; i < head; i += stride) dst[i] = FN(src[i]);                 \
        const rs_v4* s4 = (const rs_v4*)(src + head);                                    \
        rs_v4* d4 = (rs_v4*)(dst + head);                                                \
        for (rs_u64 v = tid; v < nvec; v += stride) {                                    \
            rs_v4 a = rs_load4(s4 + v);                                                  \
            rs_v4 lo, hi;                                                                \
            lo.x = FN((rs_u16)(a.x & 0xffffu)); lo.y = FN((rs_u16)(a.x >> 16));          \
            lo.z = FN((rs_u16)(a.y & 0xffffu)); lo.w = FN((rs_u16)(a.y >> 16));          \
            hi.x = FN((rs_u16)(a.z & 0xffffu)); hi.y = FN((rs_u16)(a.z >> 16));          \
            hi.z = FN((rs_u16)(a.w & 0xffffu)); hi.w = FN((rs_u16)(a.w >> 16));          \
            d4[2u * v] = lo;                                                             \
            d4[2u * v + 1u] = hi;                                                        \
        }                                                                                \
        for (rs_u64 i = head + nvec * 8u + tid; i < n; i += stride) dst[i] = FN(src[i]); \
    }

RS_WIDEN_KERNEL(convert_bf16_f32, rs_bf16_to_f32)
RS_WIDEN_KERNEL(convert_f16_f32, rs_f16_to_f32)

// ---- f32 -> 16-bit: 8 elements per vector step (two 16-byte loads, one store)

#define RS_NARROW_KERNEL(NAME, FN)                                                       \
    KERNEL void NAME(const rs_u32* __restrict__ src, rs_u16* __restrict__ dst, rs_u64 n) { \
        const rs_u64 tid = rs_tid();                                                     \
        const rs_u64 stride = rs_nthreads();                                             \
        const rs_u64 da = (rs_u64)dst;                                                   \
        rs_u64 head = ((16u - (da & 15u)) & 15u) / 2u;                                   \
        const bool vec = (da & 1u) == 0u && (((rs_u64)src + 4u * head) & 15u) == 0u;     \
        if (!vec) head = n;                                                              \
        if (head > n) head = n;                                                          \
        const rs_u64 nvec = (n - head) / 8u;                                             \
        for (rs_u64 i = tid; i < head; i += stride) dst[i] = FN(src[i]);                 \
        const rs_v4* s4 = (const rs_v4*)(src + head);                                    \
        rs_v4* d4 = (rs_v4*)(dst + head);                                                \
        for (rs_u64 v = tid; v < nvec; v += stride) {                                    \
            rs_v4 a = rs_load4(s4 + 2u * v);                                             \
            rs_v4 b = rs_load4(s4 + 2u * v + 1u);                                        \
            rs_v4 o;                                                                     \
            o.x = (rs_u32)FN(a.x) | ((rs_u32)FN(a.y) << 16);                             \
            o.y = (rs_u32)FN(a.z) | ((rs_u32)FN(a.w) << 16);                             \
            o.z = (rs_u32)FN(b.x) | ((rs_u32)FN(b.y) << 16);                             \
            o.w = (rs_u32)FN(b.z) | ((rs_u32)FN(b.w) << 16);                             \
            d4[v] = o;                                                                   \
        }                                                                                \
        for (rs_u64 i = head + nvec * 8u + tid; i < n; i += stride) dst[i] = FN(src[i]); \
    }

RS_NARROW_KERNEL(convert_f32_bf16, rs_f32_to_bf16)
RS_NARROW_KERNEL(convert_f32_f16, rs_f32_to_f16)

// ---- f8 -> f32: 16 elements per vector step (one 16-byte load, four stores)

// e4m3fn: bias 7, 3 mantissa bits, subnormals, no infinities, 0x7F/0xFF NaN
// (sign and mantissa kept, as src/convert/scalar.rs's f8_e4m3_to_f32).
RS_DEVICE rs_u32 rs_f8_e4m3_to_f32(rs_u8 b) {
    rs_u32 sign = (((rs_u32)b) & 0x80u) << 24;
    rs_u32 exp = (((rs_u32)b) >> 3) & 0xfu;
    rs_u32 man = ((rs_u32)b) & 0x7u;
    if (exp == 0xfu && man == 0x7u) return sign | 0x7f800000u | (man << 20);
    if (exp != 0u) return sign | ((exp + 120u) << 23) | (man << 20);
    if (man == 0u) return sign;
    rs_u32 p = 31u - rs_clz32(man);
    return sign | ((p + 118u) << 23) | ((man << (23u - p)) & 0x7fffffu);
}

// e5m2: the upper byte of an f16.
RS_DEVICE rs_u32 rs_f8_e5m2_to_f32(rs_u8 b) { return rs_f16_to_f32((rs_u16)(((rs_u16)b) << 8)); }

#define RS_WIDEN8_KERNEL(NAME, FN)                                                      \
    KERNEL void NAME(const rs_u8* __restrict__ src, rs_u32* __restrict__ dst, rs_u64 n) { \
        const rs_u64 tid = rs_tid();                                                    \
        const rs_u64 stride = rs_nthreads();                                            \
        const rs_u64 sa = (rs_u64)src;                                                  \
        rs_u64 head = (16u - (sa & 15u)) & 15u;                                         \
        const bool vec = (((rs_u64)dst + 4u * head) & 15u) == 0u;                       \
        if (!vec) head = n;                                                             \
        if (head > n) head = n;                                                         \
        const rs_u64 nvec = (n - head) / 16u;                                           \
        for (rs_u64 i = tid; i < head; i += stride) dst[i] = FN(src[i]);                \
        const rs_v4* s4 = (const rs_v4*)(src + head);                                   \
        rs_v4* d4 = (rs_v4*)(dst + head);                                               \
        for (rs_u64 v = tid; v < nvec; v += stride) {                                   \
            rs_v4 a = rs_load4(s4 + v);                                                 \
            const rs_u32 w[4] = {a.x, a.y, a.z, a.w};                                   \
            _Pragma("unroll") for (int k = 0; k < 4; ++k) {                             \
                rs_v4 o;                                                                \
                o.x = FN((rs_u8)(w[k] & 0xffu));                                        \
                o.y = FN((rs_u8)((w[k] >> 8) & 0xffu));                                 \
                o.z = FN((rs_u8)((w[k] >> 16) & 0xffu));                                \
                o.w = FN((rs_u8)(w[k] >> 24));                                          \
                d4[4u * v + (rs_u64)k] = o;                                             \
            }                                                                           \
        }                                                                               \
        for (rs_u64 i = head + nvec * 16u + tid; i < n; i += stride) dst[i] = FN(src[i]); \
    }

RS_WIDEN8_KERNEL(convert_f8_e4m3_f32, rs_f8_e4m3_to_f32)
RS_WIDEN8_KERNEL(convert_f8_e5m2_f32, rs_f8_e5m2_to_f32)
