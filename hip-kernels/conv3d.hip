// conv3d kernels: NCDHW input [N, C, D, H, W], weight [K, C/G, KD, KH, KW],
// optional bias [K], f32 output [N, K, OD, OH, OW]. Inputs f32 or bf16
// (widened exactly: bits << 16), f32 accumulation. 64-bit indices
// throughout; every kernel is grid-stride or checks its bounds.
//
// conv3d_naive_{f32,bf16}:  one thread per output point (grid-stride).
// conv3d_tiled_{f32,bf16}:  implicit GEMM, out[k][p] = sum_r W[k][r] * X[r][p]
//   with p = (n, od, oh, ow) and r = (ci, kd, kh, kw): a 128 x 128 output
//   tile per 256-thread block (8 x 8 per thread), 8-deep slices of r staged
//   in shared memory, the input "column" gathered on the fly (no im2col
//   buffer).
// conv3d_bias_f32, conv3d_widen_bias_bf16: epilogues of the vendor tier.
#pragma once
#include "prelude.h"

// Sizes of one convolution (mirrors the Rust `KernelArgs`, repr(C)).
struct rs_conv3d_args {
    rs_u64 n, c, d, h, w;  // input
    rs_u64 k, kd, kh, kw;  // weight
    rs_u64 od, oh, ow;     // output
    rs_u64 sd, sh, sw;     // stride
    rs_u64 pd, ph, pw;     // padding
    rs_u64 dd, dh, dw;     // dilation
    rs_u64 groups;
    rs_u64 has_bias;
};

RS_DEVICE float rs_ld(const float* p, rs_u64 i) { return p[i]; }
RS_DEVICE float rs_ld(const rs_u16* p, rs_u64 i) {
    return __uint_as_float(((rs_u32)p[i]) << 16);
}

// First and one-past-last tap k with 0 <= o + k * dil < size (o may be
// negative): the taps of a kernel axis that land inside the input.
RS_DEVICE void rs_tap_range(long long o, rs_u64 dil, rs_u64 taps, long long size, rs_u64* lo,
                            rs_u64* hi) {
    const long long d = (long long)dil;
    long long l = 0;
    if (o < 0) l = (-o + d - 1) / d;
    long long h = 0;
    if (size - 1 - o >= 0) h = (size - 1 - o) / d + 1;
    if (h > (long long)taps) h = (long long)taps;
    if (l > h) l = h;
    *lo = (rs_u64)l;
    *hi = (rs_u64)h;
}

template <typename T>
static __device__ __forceinline__ void rs_conv3d_naive(const T* __restrict__ x,
                                                       const T* __restrict__ wt,
                                                       const float* __restrict__ bias,
                                                       float* __restrict__ y,
                                                       const rs_conv3d_args a) {
    const rs_u64 total = a.n * a.k * a.od * a.oh * a.ow;
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u64 hw = a.h * a.w, dhw = a.d * hw;
    const rs_u64 khw = a.kh * a.kw, kvol = a.kd * khw;
    for (rs_u64 i = rs_tid(); i < total; i += rs_nthreads()) {
        rs_u64 t = i;
        const rs_u64 ow = t % a.ow;
        t /= a.ow;
        const rs_u64 oh = t % a.oh;
        t /= a.oh;
        const rs_u64 od = t % a.od;
        t /= a.od;
        const rs_u64 k = t % a.k;
        const rs_u64 n = t / a.k;
        const rs_u64 g = k / kg;
        const long long z0 = (long long)(od * a.sd) - (long long)a.pd;
        const long long y0 = (long long)(oh * a.sh) - (long long)a.ph;
        const long long x0 = (long long)(ow * a.sw) - (long long)a.pw;
        rs_u64 d_lo, d_hi, h_lo, h_hi, w_lo, w_hi;
        rs_tap_range(z0, a.dd, a.kd, (long long)a.d, &d_lo, &d_hi);
        rs_tap_range(y0, a.dh, a.kh, (long long)a.h, &h_lo, &h_hi);
        rs_tap_range(x0, a.dw, a.kw, (long long)a.w, &w_lo, &w_hi);
        float acc = a.has_bias ? bias[k] : 0.0f;
        // Every index below is inside its tensor: the tap ranges keep the
        // input coordinates in [0, size).
        const T* xc = x + (n * a.c + g * cg) * dhw;
        const T* wc = wt + k * cg * kvol;
        for (rs_u64 ci = 0; ci < cg; ++ci, xc += dhw, wc += kvol) {
            for (rs_u64 kd = d_lo; kd < d_hi; ++kd) {
                const T* xz = xc + (rs_u64)(z0 + (long long)(kd * a.dd)) * hw;
                const T* wz = wc + kd * khw;
                for (rs_u64 kh = h_lo; kh < h_hi; ++kh) {
                    const T* xy = xz + (rs_u64)(y0 + (long long)(kh * a.dh)) * a.w;
                    const T* wy = wz + kh * a.kw;
                    for (rs_u64 kw = w_lo; kw < w_hi; ++kw) {
                        acc = fmaf(rs_ld(xy, (rs_u64)(x0 + (long long)(kw * a.dw))),
                                   rs_ld(wy, kw), acc);
                    }
                }
            }
        }
        y[i] = acc;
    }
}

KERNEL void conv3d_naive_f32(const float* x, const float* w, const float* bias, float* y,
                             rs_conv3d_args a) {
    rs_conv3d_naive<float>(x, w, bias, y, a);
}
KERNEL void conv3d_naive_bf16(const rs_u16* x, const rs_u16* w, const float* bias, float* y,
                              rs_conv3d_args a) {
    rs_conv3d_naive<rs_u16>(x, w, bias, y, a);
}

#define RS_TBM 128
#define RS_TBN 128
#define RS_TBK 8
// Largest KD * KH * KW the tiled kernel takes (its tap table in shared memory).
#define RS_MAX_TAPS 1024

// Grid: x = ceil(P / 128) point tiles, y = ceil((K / G) / 128) channel
// tiles, z = groups. Exactly 256 threads per block. The weights come
// transposed per group, wt_t[g][r][m] = w[g * K/G + m][r], so that a tile's
// weight loads are coalesced. The host checks that KD * KH * KW <=
// RS_MAX_TAPS, that C / G fits 32 bits and that every (tap * dilation) fits
// an int.
template <typename T>
static __device__ __forceinline__ void rs_conv3d_tiled(const T* __restrict__ x,
                                                       const T* __restrict__ wt_t,
                                                       const float* __restrict__ bias,
                                                       float* __restrict__ y,
                                                       const rs_conv3d_args a) {
    __shared__ __align__(16) float As[2][RS_TBK][RS_TBM];
    __shared__ __align__(16) float Bs[2][RS_TBK][RS_TBN];
    // Per kernel tap t: its dilated offsets along d, h, w.
    __shared__ int tap_d[RS_MAX_TAPS], tap_h[RS_MAX_TAPS], tap_w[RS_MAX_TAPS];
    const rs_u32 tid = threadIdx.x;
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u32 khw = (rs_u32)(a.kh * a.kw);
    const rs_u32 kvol = (rs_u32)(a.kd * a.kh * a.kw);
    const rs_u64 R = cg * kvol;
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 P = a.n * osp;
    const rs_u64 g = blockIdx.z;
    const rs_u64 m0 = (rs_u64)blockIdx.y * RS_TBM;
    const rs_u64 p0 = (rs_u64)blockIdx.x * RS_TBN;

    for (rs_u32 t = tid; t < kvol; t += blockDim.x) {
        const rs_u32 kd = t / khw;
        const rs_u32 kh = (t - kd * khw) / (rs_u32)a.kw;
        const rs_u32 kw = t - kd * khw - kh * (rs_u32)a.kw;
        tap_d[t] = (int)(kd * a.dd);
        tap_h[t] = (int)(kh * a.dh);
        tap_w[t] = (int)(kw * a.dw);
    }

    // A (weight) loads from the transposed weights wt_t [G][R][K/G]:
    // column m = tid % 128 (coalesced), rows (tid / 128) * 4 + q.
    const rs_u32 am = tid & 127u;
    const rs_u32 ar = (tid >> 7) * 4u;
    const bool a_ok = m0 + am < kg;
    const rs_u64 a_col = g * R * kg + m0 + am;

    // B (input column) loads: column p = tid % 128, rows (tid / 128) * 4 + q.
    // Row r = ci * kvol + t is tracked incrementally as (ci, t): no division
    // in the main loop.
    const rs_u32 bp = tid & 127u;
    const rs_u32 br = (tid >> 7) * 4u;
    const rs_u64 p = p0 + bp;
    const bool b_ok = p < P;
    long long bz = 0, by = 0, bx = 0;
    rs_u64 b_base = 0;
    if (b_ok) {
        rs_u64 t = p;
        const rs_u64 ow = t % a.ow;
        t /= a.ow;
        const rs_u64 oh = t % a.oh;
        t /= a.oh;
        const rs_u64 od = t % a.od;
        const rs_u64 n = t / a.od;
        bz = (long long)(od * a.sd) - (long long)a.pd;
        by = (long long)(oh * a.sh) - (long long)a.ph;
        bx = (long long)(ow * a.sw) - (long long)a.pw;
        b_base = (n * a.c + g * cg) * a.d * a.h * a.w;
    }
    rs_u32 bci[4];
    rs_u32 btap[4];
#pragma unroll
    for (rs_u32 q = 0; q < 4; ++q) {
        bci[q] = (br + q) / kvol;
        btap[q] = (br + q) - bci[q] * kvol;
    }
    const long long D = (long long)a.d, H = (long long)a.h, W = (long long)a.w;
    const rs_u64 dhw = a.d * a.h * a.w;
    const rs_u64 hw = a.h * a.w;
    // Inputs of fewer than 2^31 elements: 32-bit address arithmetic.
    const bool b_small = a.n * a.c * dhw < (1ull << 31);
    __syncthreads();

    // Compute: 8 x 8 per thread; rows ty * 4 + {0..3} and + 64, columns
    // tx * 4 + {0..3} and + 64 (16-byte reads of shared memory). Two
    // shared-memory stages: the next slice is loaded into registers while
    // the current one is multiplied, then stored into the other stage.
    const rs_u32 tx = tid & 15u, ty = tid >> 4;
    float acc[8][8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;

    float ra[4], rb[4];
    rs_u64 k0 = 0;
    // Loads slice k0 into ra / rb and advances the B row trackers.
#define RS_TILED_LOAD()                                                                     \
    {                                                                                        \
        _Pragma("unroll") for (rs_u32 q = 0; q < 4; ++q) {                                   \
            const rs_u64 r = k0 + ar + q;                                                    \
            ra[q] = (a_ok && r < R) ? rs_ld(wt_t, a_col + r * kg) : 0.0f;                     \
        }                                                                                    \
        _Pragma("unroll") for (rs_u32 q = 0; q < 4; ++q) {                                   \
            float v = 0.0f;                                                                  \
            if (b_ok && bci[q] < cg) {                                                       \
                const rs_u32 t = btap[q];                                                    \
                const long long z = bz + tap_d[t];                                           \
                const long long yy = by + tap_h[t];                                          \
                const long long xx = bx + tap_w[t];                                          \
                if (z >= 0 && z < D && yy >= 0 && yy < H && xx >= 0 && xx < W) {             \
                    if (b_small) {                                                           \
                        v = rs_ld(x, (rs_u64)((rs_u32)b_base + bci[q] * (rs_u32)dhw +          \
                                              (rs_u32)z * (rs_u32)hw +                       \
                                              (rs_u32)yy * (rs_u32)a.w + (rs_u32)xx));       \
                    } else {                                                                 \
                        v = rs_ld(x, b_base + (rs_u64)bci[q] * dhw + (rs_u64)z * hw +          \
                                         (rs_u64)yy * a.w + (rs_u64)xx);                     \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
            rb[q] = v;                                                                       \
            rs_u32 t = btap[q] + RS_TBK;                                                     \
            while (t >= kvol) {                                                              \
                t -= kvol;                                                                   \
                ++bci[q];                                                                    \
            }                                                                                \
            btap[q] = t;                                                                     \
        }                                                                                    \
    }
#define RS_TILED_STORE(stage)                                                               \
    {                                                                                        \
        _Pragma("unroll") for (rs_u32 q = 0; q < 4; ++q) As[stage][ar + q][am] = ra[q];      \
        _Pragma("unroll") for (rs_u32 q = 0; q < 4; ++q) Bs[stage][br + q][bp] = rb[q];      \
    }
    RS_TILED_LOAD();
    RS_TILED_STORE(0);
    __syncthreads();
    rs_u32 cur = 0;
    for (; k0 < R;) {
        const bool more = k0 + RS_TBK < R;
        k0 += RS_TBK;
        if (more) RS_TILED_LOAD();
#pragma unroll
        for (int kk = 0; kk < RS_TBK; ++kk) {
            const float4 a0 = *reinterpret_cast<const float4*>(&As[cur][kk][ty * 4]);
            const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][kk][ty * 4 + 64]);
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * 4 + 64]);
            const float av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < 8; ++i)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) RS_TILED_STORE(cur ^ 1u);
        __syncthreads();
        cur ^= 1u;
    }
#undef RS_TILED_LOAD
#undef RS_TILED_STORE

#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const rs_u64 pj = p0 + tx * 4 + (j & 3) + (j >> 2) * 64;
        if (pj >= P) continue;
        const rs_u64 n = pj / osp;
        const rs_u64 s = pj - n * osp;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const rs_u64 mi = m0 + ty * 4 + (i & 3) + (i >> 2) * 64;
            if (mi >= kg) continue;
            const rs_u64 k = g * kg + mi;
            const float b = a.has_bias ? bias[k] : 0.0f;
            y[(n * a.k + k) * osp + s] = acc[i][j] + b;
        }
    }
}

KERNEL void conv3d_tiled_f32(const float* x, const float* w_t, const float* bias, float* y,
                             rs_conv3d_args a) {
    rs_conv3d_tiled<float>(x, w_t, bias, y, a);
}
KERNEL void conv3d_tiled_bf16(const rs_u16* x, const rs_u16* w_t, const float* bias, float* y,
                              rs_conv3d_args a) {
    rs_conv3d_tiled<rs_u16>(x, w_t, bias, y, a);
}

// y[i] += bias[(i / spatial) % k] over `total` elements.
KERNEL void conv3d_bias_f32(float* y, const float* bias, rs_u64 total, rs_u64 spatial,
                            rs_u64 k) {
    for (rs_u64 i = rs_tid(); i < total; i += rs_nthreads()) y[i] += bias[(i / spatial) % k];
}

// y[i] = widen(src[i]) (+ bias[(i / spatial) % k] when has_bias != 0).
KERNEL void conv3d_widen_bias_bf16(const rs_u16* src, float* y, const float* bias, rs_u64 total,
                                   rs_u64 spatial, rs_u64 k, rs_u64 has_bias) {
    for (rs_u64 i = rs_tid(); i < total; i += rs_nthreads()) {
        float v = rs_ld(src, i);
        if (has_bias) v += bias[(i / spatial) % k];
        y[i] = v;
    }
}
