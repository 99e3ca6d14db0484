// The tiled weight gradient of a conv3d (the conv3d chain's tiled tier).
// Part of the conv3d module: included by conv3d.hip after rs_conv3d_args
// and the shared helpers (rs_ld); not compiled on its own.
#pragma once

// conv3d_bwd_weight_tiled_{f32,bf16}(const T* x, const T* dy, float* dw,
//   rs_conv3d_args a, rs_u64 chunk): the weight gradient of the forward
//   convolution `a` as one GEMM per group g (Kg = K/G, Cg = C/G, KV = KD *
//   KH * KW taps, OSP = OD * OH * OW output points):
//     dw[g*Kg + m][col] = sum over j < N * OSP of dy[n][g*Kg + m][o] * X[col][j]
//   with col = (c, kd, kh, kw) < Cg * KV (dw's [K][Cg][KD][KH][KW] layout),
//   j = n * OSP + o, o = (od, oh, ow), and X[col][j] = x[n][g*Cg + c][od*sd -
//   pd + kd*dd][oh*sh - ph + kh*dh][ow*sw - pw + kw*dw] (0 outside the input:
//   padding), gathered on the fly (no im2col buffer). f32 or bf16 operands
//   (widened exactly), f32 accumulation.
//
//   Grid: x = ceil(Cg * KV / 64) column tiles, y = ceil(Kg / 64) * G (row
//   tile, then group), z = split-K chunks: block z sums j in [z * chunk,
//   min((z + 1) * chunk, N * OSP)) (chunk a multiple of 16, from the host).
//   Exactly 256 threads: a 64 x 64 tile of dw (4 x 4 per thread), 16-deep
//   slices of j staged in shared memory (the dy tile [16][64] and the
//   gathered x tile [16][64], padded rows), the next slice loaded into
//   registers while the current one is multiplied.
//
//   The partial tile is ADDED to dw with float atomicAdd: dw must be zeroed
//   first (the host does, on the same stream), and since the chunks' sums
//   arrive in any order the last bits of a result vary run to run.
//   64-bit indices throughout; the positions (n, od, oh, ow) of a thread's
//   j advance incrementally (no division in the main loop).
#define RS_WG_TM 64
#define RS_WG_TN 64
#define RS_WG_TK 16
#define RS_WG_LD (RS_WG_TM + 4)

// A thread's reduction index j = n * OSP + o, o = (od * OH + oh) * OW + ow,
// moved on by whole slices without division.
struct rs_wg_pos {
    rs_u64 j, n, o, od, oh, ow;
};

RS_DEVICE void rs_wg_start(rs_wg_pos& p, const rs_conv3d_args& a, rs_u64 osp, rs_u64 j) {
    p.j = j;
    p.n = j / osp;
    p.o = j - p.n * osp;
    const rs_u64 ohw = a.oh * a.ow;
    p.od = p.o / ohw;
    p.oh = (p.o - p.od * ohw) / a.ow;
    p.ow = p.o - p.od * ohw - p.oh * a.ow;
}

RS_DEVICE void rs_wg_advance(rs_wg_pos& p, const rs_conv3d_args& a, rs_u64 osp) {
    p.j += RS_WG_TK;
    p.o += RS_WG_TK;
    while (p.o >= osp) {
        p.o -= osp;
        ++p.n;
    }
    p.ow += RS_WG_TK;
    while (p.ow >= a.ow) {
        p.ow -= a.ow;
        ++p.oh;
    }
    while (p.oh >= a.oh) {
        p.oh -= a.oh;
        ++p.od;
    }
    while (p.od >= a.od) p.od -= a.od;
}

// What one thread loads of every slice: the offsets of its dy rows
// (channel g*Kg + m times OSP, or ~0 past Kg) and, per x column, the
// channel's offset and the tap's offsets (padding included; ok false past
// the last column).
struct rs_wg_cols {
    rs_u64 a_off[4];
    rs_u64 b_chan[4];
    long long b_z[4], b_y[4], b_x[4];
    bool b_ok[4];
};

// Loads this thread's elements of the slice at p (zeros past j_hi, outside
// the input, past the tile) into ra (dy) and rb (gathered x).
template <typename T>
RS_DEVICE void rs_wg_load(const T* __restrict__ x, const T* __restrict__ dy,
                          const rs_conv3d_args& a, const rs_wg_cols& c, const rs_wg_pos& p,
                          rs_u64 j_hi, rs_u64 osp, rs_u64 dhw, float* ra, float* rb) {
    const bool on = p.j < j_hi;
    const rs_u64 dyb = p.n * a.k * osp + p.o;
    const rs_u64 xb = p.n * a.c * dhw;
    const rs_u64 hw = a.h * a.w;
    const long long D = (long long)a.d, H = (long long)a.h, W = (long long)a.w;
    const long long pz = (long long)(p.od * a.sd), py = (long long)(p.oh * a.sh),
                    px = (long long)(p.ow * a.sw);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        ra[q] = (on && c.a_off[q] != ~0ull) ? rs_ld(dy, dyb + c.a_off[q]) : 0.0f;
        float v = 0.0f;
        const long long z = pz + c.b_z[q], yy = py + c.b_y[q], xx = px + c.b_x[q];
        if (on && c.b_ok[q] && z >= 0 && z < D && yy >= 0 && yy < H && xx >= 0 && xx < W)
            v = rs_ld(x, xb + c.b_chan[q] + (rs_u64)z * hw + (rs_u64)yy * a.w + (rs_u64)xx);
        rb[q] = v;
    }
}

template <typename T>
static __device__ __forceinline__ void rs_conv3d_bwd_weight_tiled(const T* __restrict__ x,
                                                                  const T* __restrict__ dy,
                                                                  float* __restrict__ dw,
                                                                  const rs_conv3d_args a,
                                                                  rs_u64 chunk) {
    __shared__ __align__(16) float As[RS_WG_TK][RS_WG_LD];
    __shared__ __align__(16) float Bs[RS_WG_TK][RS_WG_LD];
    const rs_u32 tid = threadIdx.x;
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u64 khw = a.kh * a.kw, kvol = a.kd * khw;
    const rs_u64 cols = cg * kvol;
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 total = a.n * osp;
    const rs_u64 dhw = a.d * a.h * a.w;
    const rs_u64 row_tiles = (kg + RS_WG_TM - 1) / RS_WG_TM;
    const rs_u64 g = (rs_u64)blockIdx.y / row_tiles;
    const rs_u64 m0 = ((rs_u64)blockIdx.y - g * row_tiles) * RS_WG_TM;
    const rs_u64 n0 = (rs_u64)blockIdx.x * RS_WG_TN;
    const rs_u64 j_lo = (rs_u64)blockIdx.z * chunk;
    // Uniform per block, before any barrier.
    if (j_lo >= total || chunk == 0) return;
    const rs_u64 j_hi = total - j_lo < chunk ? total : j_lo + chunk;

    // Loads: slice row kk = tid % 16 (consecutive threads, consecutive j:
    // consecutive dy elements), tile rows / columns lane + 16 q.
    const rs_u32 kk = tid & 15u, lane = tid >> 4;
    rs_wg_cols c;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const rs_u64 m = m0 + lane + 16u * q;
        c.a_off[q] = m < kg ? (g * kg + m) * osp : ~0ull;
        const rs_u64 col = n0 + lane + 16u * q;
        c.b_ok[q] = col < cols;
        const rs_u64 cc = c.b_ok[q] ? col : 0;
        const rs_u64 ci = cc / kvol;
        const rs_u64 t = cc - ci * kvol;
        const rs_u64 td = t / khw;
        const rs_u64 th = (t - td * khw) / a.kw;
        const rs_u64 tw = t - td * khw - th * a.kw;
        c.b_chan[q] = (g * cg + ci) * dhw;
        c.b_z[q] = (long long)(td * a.dd) - (long long)a.pd;
        c.b_y[q] = (long long)(th * a.dh) - (long long)a.ph;
        c.b_x[q] = (long long)(tw * a.dw) - (long long)a.pw;
    }
    rs_wg_pos pos;
    rs_wg_start(pos, a, osp, j_lo + kk);
    float ra[4], rb[4];

    // Compute: rows ty * 4 + {0..3}, columns tx * 4 + {0..3}.
    const rs_u32 tx = tid & 15u, ty = tid >> 4;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;

    rs_wg_load(x, dy, a, c, pos, j_hi, osp, dhw, ra, rb);
    for (rs_u64 j0 = j_lo; j0 < j_hi; j0 += RS_WG_TK) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            As[kk][lane + 16 * q] = ra[q];
            Bs[kk][lane + 16 * q] = rb[q];
        }
        __syncthreads();
        if (j0 + RS_WG_TK < j_hi) {
            rs_wg_advance(pos, a, osp);
            rs_wg_load(x, dy, a, c, pos, j_hi, osp, dhw, ra, rb);
        }
#pragma unroll
        for (int s = 0; s < RS_WG_TK; ++s) {
            const float4 av = *reinterpret_cast<const float4*>(&As[s][ty * 4]);
            const float4 bv = *reinterpret_cast<const float4*>(&Bs[s][tx * 4]);
            const float am[4] = {av.x, av.y, av.z, av.w};
            const float bm[4] = {bv.x, bv.y, bv.z, bv.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][e] = fmaf(am[i], bm[e], acc[i][e]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const rs_u64 m = m0 + ty * 4 + i;
        if (m >= kg) continue;
        float* row = dw + (g * kg + m) * cols;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const rs_u64 col = n0 + tx * 4 + e;
            if (col < cols) rs_atomic_add_f32(row + col, acc[i][e]);
        }
    }
}

KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_weight_tiled_f32(const float* x, const float* dy, float* dw, rs_conv3d_args a,
                                rs_u64 chunk) {
    rs_conv3d_bwd_weight_tiled<float>(x, dy, dw, a, chunk);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_weight_tiled_bf16(const rs_u16* x, const rs_u16* dy, float* dw, rs_conv3d_args a,
                                 rs_u64 chunk) {
    rs_conv3d_bwd_weight_tiled<rs_u16>(x, dy, dw, a, chunk);
}
