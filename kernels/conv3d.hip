// conv3d kernels: NCDHW input [N, C, D, H, W], weight [K, C/G, KD, KH, KW],
// optional bias [K], f32 output [N, K, OD, OH, OW]. Inputs f32 or bf16
// (widened exactly: bits << 16), f32 accumulation. 64-bit indices
// throughout; every kernel is grid-stride or checks its bounds.
//
// conv3d_naive_{f32,bf16}:  one thread per output point; a block's tile of
//   points stages its input region and weights in shared memory, slice by
//   slice of input channels (grid-stride over tiles; the direct loop where a
//   tile does not fit).
// conv3d_tiled_{f32,bf16}:  implicit GEMM, out[k][p] = sum_r W[k][r] * X[r][p]
//   with p = (n, od, oh, ow) and r = (ci, kd, kh, kw): a 128 x 128 output
//   tile per 256-thread block (8 x 8 per thread), 8-deep slices of r staged
//   in shared memory, the input "column" gathered on the fly (no im2col
//   buffer).
// conv3d_bias_f32, conv3d_widen_bias_bf16: epilogues of the vendor tier.
//
// The rest of the conv3d module lives in files this one includes (each
// reads the definitions above; none is compiled on its own):
//   conv3d_naive.hip     conv3d_naive_{f32,bf16}
//   conv3d_check.hip     conv3d_check_*, conv3d_locate_nonfinite_f32, conv3d_guard_*
//   conv3d_backward.hip  conv3d_bwd_* (the naive gradients), the flip, the zero insertion
//   conv3d_wgrad.hip     conv3d_bwd_weight_tiled_* (the tiled weight gradient, split-K)
#pragma once
#include "prelude.h"
#include "bf16.h"

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
// The raw bits of a bf16 element (the f32 overload is never called).
RS_DEVICE rs_u32 rs_bits16(const rs_u16* p, rs_u64 i) { return p[i]; }
RS_DEVICE rs_u32 rs_bits16(const float*, rs_u64) { return 0; }

// Stores output element i: f32, or rounded to bf16 (nearest even) when
// y_bf16 != 0 (the guarded fallback writes over a bf16 tensor in place).
RS_DEVICE void rs_conv3d_store(float* y, rs_u64 i, float v, rs_u64 y_bf16) {
    if (y_bf16) {
        ((rs_u16*)y)[i] = rs_f32_to_bf16(__float_as_uint(v));
    } else {
        y[i] = v;
    }
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

#include "conv3d_naive.hip"

// The tiled kernels' tap table: for each kernel tap t (a block's threads
// share the work), its dilated offsets along d, h, w.
RS_DEVICE void rs_conv3d_tap_table(const rs_conv3d_args& a, rs_u32 tid, rs_u32 kvol, rs_u32 khw,
                                   int* tap_d, int* tap_h, int* tap_w) {
    for (rs_u32 t = tid; t < kvol; t += blockDim.x) {
        const rs_u32 kd = t / khw;
        const rs_u32 kh = (t - kd * khw) / (rs_u32)a.kw;
        const rs_u32 kw = t - kd * khw - kh * (rs_u32)a.kw;
        tap_d[t] = (int)(kd * a.dd);
        tap_h[t] = (int)(kh * a.dh);
        tap_w[t] = (int)(kw * a.dw);
    }
}

// Output point p = (n, od, oh, ow) of group g: the input coordinates of its
// first tap (may be negative: padding) and the offset of its group's first
// input channel.
RS_DEVICE void rs_conv3d_point(const rs_conv3d_args& a, rs_u64 p, rs_u64 g, rs_u64 cg,
                               long long* z, long long* y, long long* x, rs_u64* base) {
    rs_u64 t = p;
    const rs_u64 ow = t % a.ow;
    t /= a.ow;
    const rs_u64 oh = t % a.oh;
    t /= a.oh;
    const rs_u64 od = t % a.od;
    const rs_u64 n = t / a.od;
    *z = (long long)(od * a.sd) - (long long)a.pd;
    *y = (long long)(oh * a.sh) - (long long)a.ph;
    *x = (long long)(ow * a.sw) - (long long)a.pw;
    *base = (n * a.c + g * cg) * a.d * a.h * a.w;
}

// The fast gathers' limit on KD * KH * KW (one bit per tap in a u64).
#define RS_FAST_TAPS 64

// Whether the tiled kernels gather with rs_conv3d_tap_mask and tap offsets:
// at most RS_FAST_TAPS taps and an input of fewer than 2^31 elements.
RS_DEVICE bool rs_conv3d_fast_gather(const rs_conv3d_args& a) {
    return a.kd * a.kh * a.kw <= RS_FAST_TAPS && a.n * a.c * a.d * a.h * a.w < (1ull << 31);
}

// For each tap t < kvol (kvol <= RS_FAST_TAPS, an input of fewer than 2^31
// elements), its offset in the input: the dilated d, h, w offsets folded
// into one int.
RS_DEVICE void rs_conv3d_tap_offsets(const rs_conv3d_args& a, rs_u32 tid, rs_u32 kvol,
                                     rs_u32 khw, int* tap_off) {
    for (rs_u32 t = tid; t < kvol; t += blockDim.x) {
        const rs_u32 kd = t / khw;
        const rs_u32 kh = (t - kd * khw) / (rs_u32)a.kw;
        const rs_u32 kw = t - kd * khw - kh * (rs_u32)a.kw;
        tap_off[t] = (int)(kd * a.dd * a.h * a.w + kh * a.dh * a.w + kw * a.dw);
    }
}

// Bit t set when the point whose first tap is at (z, y, x) reads inside the
// input at tap t < kvol (kvol <= 64; the tap tables after a barrier); 0 when
// !on.
RS_DEVICE rs_u64 rs_conv3d_tap_mask(const rs_conv3d_args& a, bool on, rs_u32 kvol, long long z,
                                    long long y, long long x, const int* tap_d,
                                    const int* tap_h, const int* tap_w) {
    rs_u64 m = 0;
    if (!on) return 0;
    const long long D = (long long)a.d, H = (long long)a.h, W = (long long)a.w;
    for (rs_u32 t = 0; t < kvol; ++t) {
        const long long zz = z + tap_d[t], yy = y + tap_h[t], xx = x + tap_w[t];
        if (zz >= 0 && zz < D && yy >= 0 && yy < H && xx >= 0 && xx < W) m |= 1ull << t;
    }
    return m;
}

#define RS_TBM 128
#define RS_TBN 128
#define RS_TBK 8
// Largest KD * KH * KW the tiled kernel takes (its tap table in shared memory).
#define RS_MAX_TAPS 1024

// Grid: x = ceil(P / 128) point tiles, y = ceil((K / G) / BM) channel
// tiles, z = groups. Exactly 256 threads per block. The weights come
// transposed per group, wt_t[g][r][m] = w[g * K/G + m][r], so that a tile's
// weight loads are coalesced. The host checks that KD * KH * KW <=
// RS_MAX_TAPS, that C / G fits 32 bits and that every (tap * dilation) fits
// an int.
// Two floats, 8-byte aligned: one 8-byte shared-memory read.
struct __align__(8) rs_f2 {
    float x, y;
};

// The tiled kernels' shared memory (declared once per kernel: both tile
// heights use it).
struct rs_tiled_smem {
    __align__(16) float As[2][RS_TBK][RS_TBM];
    __align__(16) float Bs[2][RS_TBK][RS_TBN];
    // Per kernel tap t: its dilated offsets along d, h, w, and (fast
    // gather) along the flat input.
    int tap_d[RS_MAX_TAPS], tap_h[RS_MAX_TAPS], tap_w[RS_MAX_TAPS];
    int tap_off[RS_FAST_TAPS];
};

// Whether the tiles of the K/G = kg output channels are 96 rows high rather
// than 128 (no padded rows for 96, 192, 384 channels; the 96-row tiles also
// need fewer registers): conv3d_tiled_* where kg is a multiple of 96,
// conv3d_tiled_bf16_mma where it is a multiple of 96 and not of 128. The
// host.s grids follow the same rules (`tile_m` in src/device/raw/conv3d/forward_launch.rs).
RS_DEVICE bool rs_conv3d_tiled_bm96(rs_u64 kg) { return kg % 96 == 0; }
RS_DEVICE bool rs_conv3d_mma_bm96(rs_u64 kg) { return kg % 96 == 0 && kg % 128 != 0; }

template <typename T, int BM, bool FAST>
static __device__ __forceinline__ void rs_conv3d_tiled(const T* __restrict__ x,
                                                       const T* __restrict__ wt_t,
                                                       const float* __restrict__ bias,
                                                       float* __restrict__ y,
                                                       const rs_conv3d_args a,
                                                       rs_tiled_smem& sm, rs_u64 y_bf16) {
    // Rows of the tile per thread: ty * 4 + {0..3} and 64 + ty * (MI - 4) +
    // {0..MI - 5}.
    constexpr int MI = BM == 128 ? 8 : 6;
    auto& As = sm.As;
    auto& Bs = sm.Bs;
    int* tap_d = sm.tap_d;
    int* tap_h = sm.tap_h;
    int* tap_w = sm.tap_w;
    int* tap_off = sm.tap_off;
    const rs_u32 tid = threadIdx.x;
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u32 khw = (rs_u32)(a.kh * a.kw);
    const rs_u32 kvol = (rs_u32)(a.kd * a.kh * a.kw);
    const rs_u64 R = cg * kvol;
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 P = a.n * osp;
    const rs_u64 g = blockIdx.z;
    const rs_u64 m0 = (rs_u64)blockIdx.y * BM;
    const rs_u64 p0 = (rs_u64)blockIdx.x * RS_TBN;

    rs_conv3d_tap_table(a, tid, kvol, khw, tap_d, tap_h, tap_w);

    // A (weight) loads (128 columns also for 96-row tiles: the last 32 are
    // read, not used) from the transposed weights wt_t [G][R][K/G]:
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
    if (b_ok) rs_conv3d_point(a, p, g, cg, &bz, &by, &bx, &b_base);
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
    // FAST (rs_conv3d_fast_gather): the point's valid taps as a bit mask,
    // each tap's offset from the tap table. A template parameter, so that
    // neither loop keeps the other's state live.
    const bool fast = FAST;
    if (fast) rs_conv3d_tap_offsets(a, tid, kvol, khw, tap_off);
    __syncthreads();
    int b_pt = 0;
    const rs_u64 b_mask = rs_conv3d_tap_mask(a, fast && b_ok, kvol, bz, by, bx, tap_d, tap_h, tap_w);
    if (fast && b_ok) b_pt = (int)b_base + (int)(bz * (long long)hw + by * W + bx);

    // Compute: MI x 8 per thread; rows as above (acc[i]), columns
    // tx * 4 + {0..3} and + 64 (16-byte reads of shared memory). Two
    // shared-memory stages: the next slice is loaded into registers while
    // the current one is multiplied, then stored into the other stage.
    const rs_u32 tx = tid & 15u, ty = tid >> 4;
    float acc[MI][8];
#pragma unroll
    for (int i = 0; i < MI; ++i)
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
            if (fast) {                                                                      \
                const rs_u32 t = btap[q];                                                    \
                if (bci[q] < cg && ((b_mask >> t) & 1ull))                                   \
                    v = rs_ld(x, (rs_u64)(rs_u32)(b_pt + (int)(bci[q] * (rs_u32)dhw) +         \
                                                  tap_off[t]));                              \
            } else if (b_ok && bci[q] < cg) {                                                \
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
            float av[MI] = {a0.x, a0.y, a0.z, a0.w};
            if (MI == 8) {
                const float4 a1 = *reinterpret_cast<const float4*>(&As[cur][kk][ty * 4 + 64]);
                av[MI - 4] = a1.x, av[MI - 3] = a1.y, av[MI - 2] = a1.z, av[MI - 1] = a1.w;
            } else {
                const rs_f2 a1 = *reinterpret_cast<const rs_f2*>(&As[cur][kk][ty * 2 + 64]);
                av[MI - 2] = a1.x, av[MI - 1] = a1.y;
            }
            const float4 b0 = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * 4]);
            const float4 b1 = *reinterpret_cast<const float4*>(&Bs[cur][kk][tx * 4 + 64]);
            const float bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int i = 0; i < MI; ++i)
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
        for (int i = 0; i < MI; ++i) {
            const rs_u64 mi = m0 + (i < 4 ? ty * 4 + i : 64 + ty * (MI - 4) + (i - 4));
            if (mi >= kg) continue;
            const rs_u64 k = g * kg + mi;
            const float b = a.has_bias ? bias[k] : 0.0f;
            rs_conv3d_store(y, (n * a.k + k) * osp + s, acc[i][j] + b, y_bf16);
        }
    }
}

// Two blocks per SM on CUDA (128 registers: the fast gather's state would
// otherwise take the count past it and halve the resident blocks).
#if defined(RS_CUDA)
#define RS_TILED_CUDA_BOUNDS __launch_bounds__(256, 2)
#else
#define RS_TILED_CUDA_BOUNDS
#endif
#if RS_BUILDS(RS_PART_CONV3D_TILED_F32)
KERNEL void RS_HIP_BLOCK(256) RS_TILED_CUDA_BOUNDS
    conv3d_tiled_f32(const float* x, const float* w_t, const float* bias, float* y,
                     rs_conv3d_args a, const rs_u64* gate, rs_u64 y_bf16) {
    __shared__ rs_tiled_smem sm;
    if (rs_gate_closed(gate)) return;
    const bool bm96 = rs_conv3d_tiled_bm96(a.k / a.groups);
    if (rs_conv3d_fast_gather(a)) {
        if (bm96) {
            rs_conv3d_tiled<float, 96, true>(x, w_t, bias, y, a, sm, y_bf16);
        } else {
            rs_conv3d_tiled<float, 128, true>(x, w_t, bias, y, a, sm, y_bf16);
        }
    } else if (bm96) {
        rs_conv3d_tiled<float, 96, false>(x, w_t, bias, y, a, sm, y_bf16);
    } else {
        rs_conv3d_tiled<float, 128, false>(x, w_t, bias, y, a, sm, y_bf16);
    }
}
#endif
#if RS_BUILDS(RS_PART_CONV3D_TILED_BF16)
KERNEL void RS_HIP_BLOCK(256) RS_TILED_CUDA_BOUNDS
    conv3d_tiled_bf16(const rs_u16* x, const rs_u16* w_t, const float* bias, float* y,
                      rs_conv3d_args a, const rs_u64* gate, rs_u64 y_bf16) {
    __shared__ rs_tiled_smem sm;
    if (rs_gate_closed(gate)) return;
    const bool bm96 = rs_conv3d_tiled_bm96(a.k / a.groups);
    if (rs_conv3d_fast_gather(a)) {
        if (bm96) {
            rs_conv3d_tiled<rs_u16, 96, true>(x, w_t, bias, y, a, sm, y_bf16);
        } else {
            rs_conv3d_tiled<rs_u16, 128, true>(x, w_t, bias, y, a, sm, y_bf16);
        }
    } else if (bm96) {
        rs_conv3d_tiled<rs_u16, 96, false>(x, w_t, bias, y, a, sm, y_bf16);
    } else {
        rs_conv3d_tiled<rs_u16, 128, false>(x, w_t, bias, y, a, sm, y_bf16);
    }
}
#endif

// conv3d_tiled_bf16_mma: the tiled kernel for bf16 on tensor cores (CUDA,
// sm_80 and newer; the symbol does not exist elsewhere, and the host then
// uses conv3d_tiled_bf16). Implicit GEMM out[m][p] = sum_r W[m][r] X[r][p]
// in 128 x 128 tiles per 256-thread block (96 x 128 where rs_conv3d_mma_bm96),
// 32-deep slices of r, each warp a 64 (48) x 32 sub-tile of m16n8k16 bf16
// products with f32 accumulation (bf16
// products are exact in f32). Weights come packed per group, zero padded:
// wp[g][mp][rp], mp = K/G rounded up to 128, rp = R rounded up to 32, so
// their loads are unconditional 16-byte vectors. The input column is
// gathered on the fly as in the scalar kernel. Grid: x = ceil(P / 128),
// y = ceil(K/G / BM), z = groups.
#if defined(RS_CUDA) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
#define RS_TC_BM 128
#define RS_TC_BN 128
#define RS_TC_BK 32
// Padded shared-memory row (bf16 elements): 20 words, so the fragment reads
// of a warp (8 rows x 4 words) hit 32 different banks.
#define RS_TC_LD 40
// Largest KD * KH * KW the tensor-core kernel takes (its tap table keeps the
// static shared memory under 48 KiB).
#define RS_TC_MAX_TAPS 512

// Four 8 x 8 bf16 matrices from shared memory (ldmatrix.x4): lane l names
// row l % 8 of matrix l / 8 (16-byte aligned); r[j] is this lane's part of
// matrix j (row lane / 4, columns (lane % 4) * 2 and + 1).
RS_DEVICE void rs_ldmatrix_x4(rs_u32* r, const rs_u16* p) {
    rs_u32 s;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"
                 : "=r"(s)
                 : "l"(p));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

RS_DEVICE void rs_mma_bf16(float* c, const rs_u32* a, const rs_u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two blocks per SM (at most 128 registers): NVRTC's build otherwise takes
// 158 registers, one block per SM, and runs 1.45x slower.
struct rs_mma_smem {
    __align__(16) rs_u16 As[2][RS_TC_BM * RS_TC_LD];
    __align__(16) rs_u16 Bs[2][RS_TC_BN * RS_TC_LD];
    int tap_d[RS_TC_MAX_TAPS], tap_h[RS_TC_MAX_TAPS], tap_w[RS_TC_MAX_TAPS];
    int tap_off[RS_FAST_TAPS];
};

// BM: the tile's rows, 128 or 96 (rs_conv3d_mma_bm96; A is still staged 128
// rows high, within the packed weight's padding, and the warps' 64-row
// halves become 48).
template <int BM, bool FAST>
static __device__ __forceinline__ void rs_conv3d_tiled_mma(const rs_u16* __restrict__ x,
                                                           const rs_u16* __restrict__ wp,
                                                           const float* __restrict__ bias,
                                                           float* __restrict__ y,
                                                           const rs_conv3d_args& a, rs_u64 rp,
                                                           rs_u64 mp, rs_mma_smem& sm,
                                                           rs_u64 y_bf16) {
    constexpr int MI = BM / 32;  // m16 tiles per warp
    auto& As = sm.As;
    auto& Bs = sm.Bs;
    int* tap_d = sm.tap_d;
    int* tap_h = sm.tap_h;
    int* tap_w = sm.tap_w;
    int* tap_off = sm.tap_off;
    const rs_u32 tid = threadIdx.x;
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u32 khw = (rs_u32)(a.kh * a.kw);
    const rs_u32 kvol = (rs_u32)(a.kd * a.kh * a.kw);
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 P = a.n * osp;
    const rs_u64 g = blockIdx.z;
    const rs_u64 m0 = (rs_u64)blockIdx.y * BM;
    const rs_u64 p0 = (rs_u64)blockIdx.x * RS_TC_BN;

    rs_conv3d_tap_table(a, tid, kvol, khw, tap_d, tap_h, tap_w);

    // A: row m0 + tid / 2 of the packed weights, 16 elements from column
    // (tid % 2) * 16 of each slice: two 16-byte loads.
    const rs_u32 a_m = tid >> 1, a_k = (tid & 1u) * 16u;
    const rs_v4* a_src = reinterpret_cast<const rs_v4*>(wp + (g * mp + m0 + a_m) * rp + a_k);

    // B: point p0 + tid % 128, 16 rows from (tid / 128) * 16 of each slice,
    // row r = ci * kvol + tap tracked incrementally.
    const rs_u32 bp = tid & 127u, bk = (tid >> 7) * 16u;
    const rs_u64 p = p0 + bp;
    const bool b_ok = p < P;
    long long bz = 0, by = 0, bx = 0;
    rs_u64 b_base = 0;
    if (b_ok) rs_conv3d_point(a, p, g, cg, &bz, &by, &bx, &b_base);
    rs_u32 bci = bk / kvol, btap = bk - (bk / kvol) * kvol;
    const long long D = (long long)a.d, H = (long long)a.h, W = (long long)a.w;
    const rs_u64 dhw = a.d * a.h * a.w;
    const rs_u64 hw = a.h * a.w;
    const bool b_small = a.n * a.c * dhw < (1ull << 31);
    const bool fast = FAST;  // rs_conv3d_fast_gather, as in rs_conv3d_tiled
    if (fast) rs_conv3d_tap_offsets(a, tid, kvol, khw, tap_off);
    __syncthreads();
    int b_pt = 0;
    const rs_u64 b_mask = rs_conv3d_tap_mask(a, fast && b_ok, kvol, bz, by, bx, tap_d, tap_h, tap_w);
    if (fast && b_ok) b_pt = (int)b_base + (int)(bz * (long long)hw + by * W + bx);

    rs_v4 ra[2];
    rs_u32 rb[8];
    rs_u64 k0 = 0;
    // Loads the slice at k0 into ra / rb and advances the B row tracker.
#define RS_TC_LOAD()                                                                        \
    {                                                                                        \
        ra[0] = a_src[k0 / 8];                                                               \
        ra[1] = a_src[k0 / 8 + 1];                                                           \
        rs_u32 ci = bci, t = btap;                                                           \
        _Pragma("unroll") for (rs_u32 q = 0; q < 16; ++q) {                                  \
            rs_u32 v = 0;                                                                    \
            if (fast) {                                                                      \
                if (ci < cg && ((b_mask >> t) & 1ull))                                       \
                    v = x[(rs_u32)(b_pt + (int)(ci * (rs_u32)dhw) + tap_off[t])];            \
            } else if (b_ok && ci < cg) {                                                    \
                const long long z = bz + tap_d[t];                                           \
                const long long yy = by + tap_h[t];                                          \
                const long long xx = bx + tap_w[t];                                          \
                if (z >= 0 && z < D && yy >= 0 && yy < H && xx >= 0 && xx < W) {             \
                    if (b_small) {                                                           \
                        v = x[(rs_u32)b_base + ci * (rs_u32)dhw + (rs_u32)z * (rs_u32)hw +    \
                              (rs_u32)yy * (rs_u32)a.w + (rs_u32)xx];                        \
                    } else {                                                                 \
                        v = x[b_base + (rs_u64)ci * dhw + (rs_u64)z * hw + (rs_u64)yy * a.w + \
                              (rs_u64)xx];                                                   \
                    }                                                                        \
                }                                                                            \
            }                                                                                \
            if (q & 1u) {                                                                    \
                rb[q / 2] |= v << 16;                                                        \
            } else {                                                                         \
                rb[q / 2] = v;                                                               \
            }                                                                                \
            if (++t == kvol) {                                                               \
                t = 0;                                                                       \
                ++ci;                                                                        \
            }                                                                                \
        }                                                                                    \
        btap += RS_TC_BK;                                                                    \
        while (btap >= kvol) {                                                               \
            btap -= kvol;                                                                    \
            ++bci;                                                                           \
        }                                                                                    \
    }
#define RS_TC_STORE(stage)                                                                  \
    {                                                                                        \
        rs_v4* as = reinterpret_cast<rs_v4*>(&As[stage][a_m * RS_TC_LD + a_k]);              \
        as[0] = ra[0];                                                                       \
        as[1] = ra[1];                                                                       \
        rs_v4* bs = reinterpret_cast<rs_v4*>(&Bs[stage][bp * RS_TC_LD + bk]);                \
        bs[0] = rs_v4{rb[0], rb[1], rb[2], rb[3]};                                           \
        bs[1] = rs_v4{rb[4], rb[5], rb[6], rb[7]};                                           \
    }

    const rs_u32 lane = tid & 31u, warp = tid >> 5;
    const rs_u32 gid = lane >> 2, tig = lane & 3u;
    const rs_u32 wm = (warp & 1u) * (rs_u32)(BM / 2), wn = (warp >> 1) * 32u;
    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    RS_TC_LOAD();
    RS_TC_STORE(0);
    __syncthreads();
    rs_u32 cur = 0;
    for (; k0 < rp;) {
        const bool more = k0 + RS_TC_BK < rp;
        k0 += RS_TC_BK;
        if (more) RS_TC_LOAD();
        const rs_u16* as = As[cur];
        const rs_u16* bs = Bs[cur];
#pragma unroll
        for (rs_u32 kk = 0; kk < RS_TC_BK; kk += 16) {
            // ldmatrix.x4: lane l gives the row address of matrix l / 8.
            rs_u32 af[MI][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
                rs_ldmatrix_x4(af[mi], as + (wm + mi * 16 + (lane & 15u)) * RS_TC_LD + kk +
                                           (lane >> 4) * 8u);
#pragma unroll
            for (int pi = 0; pi < 2; ++pi) {
                rs_u32 b4[4];
                rs_ldmatrix_x4(b4, bs + (wn + pi * 16 + (lane >> 4) * 8u + (lane & 7u)) * RS_TC_LD +
                                       kk + ((lane >> 3) & 1u) * 8u);
                bf[2 * pi][0] = b4[0];
                bf[2 * pi][1] = b4[1];
                bf[2 * pi + 1][0] = b4[2];
                bf[2 * pi + 1][1] = b4[3];
            }
#pragma unroll
            for (int mi = 0; mi < MI; ++mi)
#pragma unroll
                for (int ni = 0; ni < 4; ++ni) rs_mma_bf16(acc[mi][ni], af[mi], bf[ni]);
        }
        if (more) RS_TC_STORE(cur ^ 1u);
        __syncthreads();
        cur ^= 1u;
    }
#undef RS_TC_LOAD
#undef RS_TC_STORE

#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const rs_u64 pj = p0 + wn + ni * 8 + tig * 2 + e;
            if (pj >= P) continue;
            const rs_u64 n = pj / osp;
            const rs_u64 s = pj - n * osp;
#pragma unroll
            for (int mi = 0; mi < MI; ++mi) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const rs_u64 mi_row = m0 + wm + mi * 16 + gid + h * 8;
                    if (mi_row >= kg) continue;
                    const rs_u64 k = g * kg + mi_row;
                    const float b = a.has_bias ? bias[k] : 0.0f;
                    rs_conv3d_store(y, (n * a.k + k) * osp + s, acc[mi][ni][h * 2 + e] + b,
                                    y_bf16);
                }
            }
        }
    }
}

#if RS_BUILDS(RS_PART_CONV3D_TILED_BF16_MMA)
KERNEL void __launch_bounds__(256, 2)
    conv3d_tiled_bf16_mma(const rs_u16* __restrict__ x, const rs_u16* __restrict__ wp,
                          const float* __restrict__ bias, float* __restrict__ y,
                          rs_conv3d_args a, rs_u64 rp, rs_u64 mp, const rs_u64* gate,
                          rs_u64 y_bf16) {
    __shared__ rs_mma_smem sm;
    if (rs_gate_closed(gate)) return;
    const bool bm96 = rs_conv3d_mma_bm96(a.k / a.groups);
    if (rs_conv3d_fast_gather(a)) {
        if (bm96) {
            rs_conv3d_tiled_mma<96, true>(x, wp, bias, y, a, rp, mp, sm, y_bf16);
        } else {
            rs_conv3d_tiled_mma<128, true>(x, wp, bias, y, a, rp, mp, sm, y_bf16);
        }
    } else if (bm96) {
        rs_conv3d_tiled_mma<96, false>(x, wp, bias, y, a, rp, mp, sm, y_bf16);
    } else {
        rs_conv3d_tiled_mma<128, false>(x, wp, bias, y, a, rp, mp, sm, y_bf16);
    }
}
#endif  // RS_BUILDS(RS_PART_CONV3D_TILED_BF16_MMA)
#endif

// Everything below is the conv3d module proper (RS_PART_CONV3D).
#if RS_BUILDS(RS_PART_CONV3D)
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
// ---------------------------------------------------------------- weight layouts
//
// conv3d_layout_{u32,u16}: the standard weight [G][KG][R] (R = C/G*KD*KH*KW)
// rearranged for the tiled kernels, one output element per thread
// (grid-stride over `total` outputs):
//   packed == 0: [G][R][KG]   (conv3d_tiled_*; total = G * KG * R)
//   packed != 0: [G][rows][cols], zero where m >= KG or r >= R
//                (conv3d_tiled_bf16_mma; total = G * rows * cols)
// With a gate (prelude.h: rs_gate_closed), only when it is open.
#define RS_LAYOUT_KERNEL(NAME, T)                                                          \
    KERNEL void NAME(const T* __restrict__ w, T* __restrict__ out, rs_u64 total, rs_u64 kg, \
                     rs_u64 r, rs_u64 rows, rs_u64 cols, rs_u64 packed,                     \
                     const rs_u64* gate) {                                                  \
        if (rs_gate_closed(gate)) return;                                                   \
        for (rs_u64 o = rs_tid(); o < total; o += rs_nthreads()) {                          \
            if (packed == 0) {                                                              \
                const rs_u64 m = o % kg;                                                    \
                const rs_u64 row = o / kg;                                                  \
                const rs_u64 ri = row % r;                                                  \
                const rs_u64 grp = row / r;                                                 \
                out[o] = w[(grp * kg + m) * r + ri];                                        \
            } else {                                                                        \
                const rs_u64 ri = o % cols;                                                 \
                const rs_u64 row = o / cols;                                                \
                const rs_u64 m = row % rows;                                                \
                const rs_u64 grp = row / rows;                                              \
                out[o] = (m < kg && ri < r) ? w[(grp * kg + m) * r + ri] : (T)0;            \
            }                                                                               \
        }                                                                                   \
    }
RS_LAYOUT_KERNEL(conv3d_layout_u32, rs_u32)
RS_LAYOUT_KERNEL(conv3d_layout_u16, rs_u16)

#include "conv3d_check.hip"
#include "conv3d_backward.hip"
#include "conv3d_wgrad.hip"
#endif  // RS_BUILDS(RS_PART_CONV3D)
