// The conv3d gradient kernels (dx, dw, db), their sampled-point check, and
// the flipped weight and zero-inserted dy through which the tiled kernels
// compute dx.
// Part of the conv3d module: included by conv3d.hip after rs_conv3d_args
// and the shared helpers (rs_ld, rs_bits16, rs_tap_range); not compiled
// on its own.
#pragma once

// ---------------------------------------------------------------- gradients
//
// The backward ops of the forward convolution `a` (input [N, C, D, H, W],
// weight [K, C/G, KD, KH, KW], dy [N, K, OD, OH, OW]); f32 or bf16 operands
// (widened exactly), f32 accumulation, f32 results. An `a` whose output is
// smaller than the forward formula (conv_transpose3d with output_padding >=
// stride) is fine: every loop below ranges over a.od, a.oh, a.ow.
//
// conv3d_bwd_data_{f32,bf16}:   dx (also conv_transpose3d), gather form, one
//   thread per dx element (grid-stride): dx[n][c][z][y][x] = bias[c] (when
//   a.has_bias) + sum over the output channels k of c's group and the taps
//   (kd, kh, kw) with z + pd - kd * dd = od * sd (0 <= od < OD; likewise h,
//   w) of dy[n][k][od][oh][ow] * w[k][c % (C/G)][kd][kh][kw]. No atomics.
// conv3d_bwd_weight_{f32,bf16}: dw, one 256-thread block per dw element
//   (grid-stride over elements): per-thread f32 partial sums over n and the
//   output volume (neighbouring threads take neighbouring ow), then a tree
//   over the block.
// conv3d_bwd_bias_{f32,bf16}:   db[k] = sum over n and the output volume of
//   dy, one 256-thread block per channel, as the weight kernel.
// conv3d_bwd_check_{f32,bf16}:  the chain's sampled-point check of a
//   backward result (op 0 data, 1 weight, 2 bias), as conv3d_check_*: one
//   block per sample j (index rs_conv3d_sample(len, seed, j) of the result,
//   or the located one), the point recomputed in double with its magnitude
//   |bias| + sum |a * b|, res[4j..4j+4] = (index, value, reference,
//   magnitude).
template <typename T>
static __device__ __forceinline__ void rs_conv3d_bwd_data(const T* __restrict__ dy,
                                                          const T* __restrict__ wt,
                                                          const float* __restrict__ bias,
                                                          float* __restrict__ dx,
                                                          const rs_conv3d_args& a) {
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u64 khw = a.kh * a.kw, kvol = a.kd * khw;
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 total = a.n * a.c * a.d * a.h * a.w;
    for (rs_u64 i = rs_tid(); i < total; i += rs_nthreads()) {
        rs_u64 t = i;
        const rs_u64 x = t % a.w;
        t /= a.w;
        const rs_u64 y = t % a.h;
        t /= a.h;
        const rs_u64 z = t % a.d;
        t /= a.d;
        const rs_u64 c = t % a.c;
        const rs_u64 n = t / a.c;
        const rs_u64 g = c / cg;
        const rs_u64 ci = c - g * cg;
        float acc = a.has_bias ? bias[c] : 0.0f;
        for (rs_u64 k = g * kg; k < (g + 1) * kg; ++k) {
            const T* dyk = dy + (n * a.k + k) * osp;
            const T* wk = wt + (k * cg + ci) * kvol;
            for (rs_u64 kd = 0; kd < a.kd; ++kd) {
                const long long vz = (long long)(z + a.pd) - (long long)(kd * a.dd);
                if (vz < 0) break;  // later taps are further out
                if ((rs_u64)vz % a.sd != 0) continue;
                const rs_u64 od = (rs_u64)vz / a.sd;
                if (od >= a.od) continue;
                for (rs_u64 kh = 0; kh < a.kh; ++kh) {
                    const long long vy = (long long)(y + a.ph) - (long long)(kh * a.dh);
                    if (vy < 0) break;
                    if ((rs_u64)vy % a.sh != 0) continue;
                    const rs_u64 oh = (rs_u64)vy / a.sh;
                    if (oh >= a.oh) continue;
                    for (rs_u64 kw = 0; kw < a.kw; ++kw) {
                        const long long vx = (long long)(x + a.pw) - (long long)(kw * a.dw);
                        if (vx < 0) break;
                        if ((rs_u64)vx % a.sw != 0) continue;
                        const rs_u64 ow = (rs_u64)vx / a.sw;
                        if (ow >= a.ow) continue;
                        acc = fmaf(rs_ld(dyk, (od * a.oh + oh) * a.ow + ow),
                                   rs_ld(wk, kd * khw + kh * a.kw + kw), acc);
                    }
                }
            }
        }
        dx[i] = acc;
    }
}

KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_data_f32(const float* dy, const float* w, const float* bias, float* dx,
                        rs_conv3d_args a) {
    rs_conv3d_bwd_data<float>(dy, w, bias, dx, a);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_data_bf16(const rs_u16* dy, const rs_u16* w, const float* bias, float* dx,
                         rs_conv3d_args a) {
    rs_conv3d_bwd_data<rs_u16>(dy, w, bias, dx, a);
}

// The sum of v over the block's 256 threads, returned to thread 0 (`part`:
// 256 floats of shared memory; every thread calls it).
RS_DEVICE float rs_block_sum_f32(float* part, float v) {
    part[threadIdx.x] = v;
    __syncthreads();
    for (unsigned int s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    const float r = part[0];
    __syncthreads();
    return r;
}

template <typename T>
static __device__ __forceinline__ void rs_conv3d_bwd_weight(const T* __restrict__ x,
                                                            const T* __restrict__ dy,
                                                            float* __restrict__ dw,
                                                            const rs_conv3d_args& a) {
    __shared__ float part[256];
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u64 khw = a.kh * a.kw, kvol = a.kd * khw;
    const rs_u64 total = a.k * cg * kvol;
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 m = a.n * osp;
    const rs_u64 dhw = a.d * a.h * a.w;
    for (rs_u64 e = blockIdx.x; e < total; e += gridDim.x) {
        const rs_u64 k = e / (cg * kvol);
        const rs_u64 r = e - k * cg * kvol;
        const rs_u64 ci = r / kvol;
        const rs_u64 tap = r - ci * kvol;
        const rs_u64 td = tap / khw;
        const rs_u64 th = (tap - td * khw) / a.kw;
        const rs_u64 tw = tap - td * khw - th * a.kw;
        const rs_u64 c = (k / kg) * cg + ci;
        const long long oz = (long long)(td * a.dd) - (long long)a.pd;
        const long long oy = (long long)(th * a.dh) - (long long)a.ph;
        const long long ox = (long long)(tw * a.dw) - (long long)a.pw;
        float acc = 0.0f;
        for (rs_u64 j = threadIdx.x; j < m; j += blockDim.x) {
            rs_u64 t = j;
            const rs_u64 ow = t % a.ow;
            t /= a.ow;
            const rs_u64 oh = t % a.oh;
            t /= a.oh;
            const rs_u64 od = t % a.od;
            const rs_u64 n = t / a.od;
            const long long z = (long long)(od * a.sd) + oz;
            const long long yy = (long long)(oh * a.sh) + oy;
            const long long xx = (long long)(ow * a.sw) + ox;
            if (z < 0 || yy < 0 || xx < 0 || z >= (long long)a.d || yy >= (long long)a.h ||
                xx >= (long long)a.w)
                continue;
            const rs_u64 xi = (n * a.c + c) * dhw + ((rs_u64)z * a.h + (rs_u64)yy) * a.w + (rs_u64)xx;
            const rs_u64 yi = (n * a.k + k) * osp + (od * a.oh + oh) * a.ow + ow;
            acc = fmaf(rs_ld(dy, yi), rs_ld(x, xi), acc);
        }
        const float s = rs_block_sum_f32(part, acc);
        if (threadIdx.x == 0) dw[e] = s;
    }
}

KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_weight_f32(const float* x, const float* dy, float* dw, rs_conv3d_args a) {
    rs_conv3d_bwd_weight<float>(x, dy, dw, a);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_weight_bf16(const rs_u16* x, const rs_u16* dy, float* dw, rs_conv3d_args a) {
    rs_conv3d_bwd_weight<rs_u16>(x, dy, dw, a);
}

template <typename T>
static __device__ __forceinline__ void rs_conv3d_bwd_bias(const T* __restrict__ dy,
                                                          float* __restrict__ db,
                                                          const rs_conv3d_args& a) {
    __shared__ float part[256];
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 m = a.n * osp;
    for (rs_u64 k = blockIdx.x; k < a.k; k += gridDim.x) {
        float acc = 0.0f;
        for (rs_u64 j = threadIdx.x; j < m; j += blockDim.x) {
            const rs_u64 n = j / osp;
            acc += rs_ld(dy, (n * a.k + k) * osp + (j - n * osp));
        }
        const float s = rs_block_sum_f32(part, acc);
        if (threadIdx.x == 0) db[k] = s;
    }
}

KERNEL void RS_HIP_BLOCK(256) conv3d_bwd_bias_f32(const float* dy, float* db, rs_conv3d_args a) {
    rs_conv3d_bwd_bias<float>(dy, db, a);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_bias_bf16(const rs_u16* dy, float* db, rs_conv3d_args a) {
    rs_conv3d_bwd_bias<rs_u16>(dy, db, a);
}

template <typename T>
static __device__ __forceinline__ void rs_conv3d_bwd_check(const T* __restrict__ dy,
                                                           const T* __restrict__ other,
                                                           const void* bias, rs_u64 bias_kind,
                                                           const float* out, rs_u64* res,
                                                           const rs_conv3d_args& a, rs_u64 op,
                                                           rs_u64 nsamples, rs_u64 seed,
                                                           const rs_u64* located) {
    __shared__ double pv[256];
    __shared__ double pm[256];
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u64 khw = a.kh * a.kw, kvol = a.kd * khw;
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 dhw = a.d * a.h * a.w;
    rs_u64 total = a.k;  // op 2: db
    if (op == 0) total = a.n * a.c * dhw;
    if (op == 1) total = a.k * cg * kvol;
    for (rs_u64 j = blockIdx.x; j < nsamples; j += gridDim.x) {
        rs_u64 i = ~0ull;
        if (located != 0) {
            const rs_u64 v = *located;
            if (v != 0 && v <= total) i = total - v;
        } else if (total != 0) {
            i = rs_conv3d_sample(total, seed, j);
        }
        double val = 0.0, mag = 0.0;
        rs_u64 chan = 0;
        const bool ok = i < total;
        if (ok && op == 0) {
            rs_u64 t = i;
            const rs_u64 x = t % a.w;
            t /= a.w;
            const rs_u64 y = t % a.h;
            t /= a.h;
            const rs_u64 z = t % a.d;
            t /= a.d;
            const rs_u64 c = t % a.c;
            const rs_u64 n = t / a.c;
            const rs_u64 g = c / cg;
            const rs_u64 ci = c - g * cg;
            chan = c;
            for (rs_u64 r = threadIdx.x; r < kg * kvol; r += blockDim.x) {
                const rs_u64 k = g * kg + r / kvol;
                const rs_u64 tap = r % kvol;
                const rs_u64 td = tap / khw;
                const rs_u64 th = (tap - td * khw) / a.kw;
                const rs_u64 tw = tap - td * khw - th * a.kw;
                const long long vz = (long long)(z + a.pd) - (long long)(td * a.dd);
                const long long vy = (long long)(y + a.ph) - (long long)(th * a.dh);
                const long long vx = (long long)(x + a.pw) - (long long)(tw * a.dw);
                if (vz < 0 || vy < 0 || vx < 0) continue;
                if ((rs_u64)vz % a.sd != 0 || (rs_u64)vy % a.sh != 0 || (rs_u64)vx % a.sw != 0)
                    continue;
                const rs_u64 od = (rs_u64)vz / a.sd, oh = (rs_u64)vy / a.sh, ow = (rs_u64)vx / a.sw;
                if (od >= a.od || oh >= a.oh || ow >= a.ow) continue;
                const double p = (double)rs_ld(dy, (n * a.k + k) * osp + (od * a.oh + oh) * a.ow + ow) *
                                 (double)rs_ld(other, (k * cg + ci) * kvol + tap);
                val += p;
                mag += rs_abs_d(p);
            }
        } else if (ok && op == 1) {
            const rs_u64 k = i / (cg * kvol);
            const rs_u64 r = i - k * cg * kvol;
            const rs_u64 ci = r / kvol;
            const rs_u64 tap = r - ci * kvol;
            const rs_u64 td = tap / khw;
            const rs_u64 th = (tap - td * khw) / a.kw;
            const rs_u64 tw = tap - td * khw - th * a.kw;
            const rs_u64 c = (k / kg) * cg + ci;
            for (rs_u64 q = threadIdx.x; q < a.n * osp; q += blockDim.x) {
                rs_u64 t = q;
                const rs_u64 ow = t % a.ow;
                t /= a.ow;
                const rs_u64 oh = t % a.oh;
                t /= a.oh;
                const rs_u64 od = t % a.od;
                const rs_u64 n = t / a.od;
                const long long z = (long long)(od * a.sd + td * a.dd) - (long long)a.pd;
                const long long yy = (long long)(oh * a.sh + th * a.dh) - (long long)a.ph;
                const long long xx = (long long)(ow * a.sw + tw * a.dw) - (long long)a.pw;
                if (z < 0 || yy < 0 || xx < 0 || z >= (long long)a.d || yy >= (long long)a.h ||
                    xx >= (long long)a.w)
                    continue;
                const double p =
                    (double)rs_ld(dy, (n * a.k + k) * osp + (od * a.oh + oh) * a.ow + ow) *
                    (double)rs_ld(other, (n * a.c + c) * dhw +
                                             ((rs_u64)z * a.h + (rs_u64)yy) * a.w + (rs_u64)xx);
                val += p;
                mag += rs_abs_d(p);
            }
        } else if (ok) {
            for (rs_u64 q = threadIdx.x; q < a.n * osp; q += blockDim.x) {
                const rs_u64 n = q / osp;
                const double p = (double)rs_ld(dy, (n * a.k + i) * osp + (q - n * osp));
                val += p;
                mag += rs_abs_d(p);
            }
        }
        pv[threadIdx.x] = val;
        pm[threadIdx.x] = mag;
        __syncthreads();
        for (unsigned int s = 128; s > 0; s >>= 1) {
            if (threadIdx.x < s) {
                pv[threadIdx.x] += pv[threadIdx.x + s];
                pm[threadIdx.x] += pm[threadIdx.x + s];
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            double* o = (double*)(res + 4 * j);
            if (ok) {
                const double b = op == 0 ? rs_check_bias(bias, bias_kind, chan) : 0.0;
                res[4 * j] = i;
                o[1] = (double)out[i];
                o[2] = b + pv[0];
                o[3] = rs_abs_d(b) + pm[0];
            } else {
                res[4 * j] = ~0ull;
                res[4 * j + 1] = 0x7ff8000000000000ull;  // NaN
                res[4 * j + 2] = 0x7ff8000000000000ull;
                res[4 * j + 3] = 0x7ff8000000000000ull;
            }
        }
        __syncthreads();
    }
}

KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_check_f32(const float* dy, const float* other, const void* bias,
                         rs_u64 bias_kind, const float* out, rs_u64* res, rs_conv3d_args a,
                         rs_u64 op, rs_u64 nsamples, rs_u64 seed, const rs_u64* located) {
    rs_conv3d_bwd_check<float>(dy, other, bias, bias_kind, out, res, a, op, nsamples, seed,
                               located);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_bwd_check_bf16(const rs_u16* dy, const rs_u16* other, const void* bias,
                          rs_u64 bias_kind, const float* out, rs_u64* res, rs_conv3d_args a,
                          rs_u64 op, rs_u64 nsamples, rs_u64 seed, const rs_u64* located) {
    rs_conv3d_bwd_check<rs_u16>(dy, other, bias, bias_kind, out, res, a, op, nsamples, seed,
                                located);
}

// ------------------------------------------------------------ flipped weight
//
// conv3d_flip_weight_{u32,u16}: the weight W [K][Cg][KD][KH][KW] of the
// forward convolution (Cg = C/G, Kg = K/G) as the weight W' [C][Kg][KD][KH][KW]
// of the forward convolution that computes its input gradient at stride 1
// (dy convolved with W', padding dil*(k-1) - pad): input and output channels
// swapped within each group, every tap flipped,
//   W'[g*Cg + c][k][a][b][e] = W[g*Kg + k][c][KD-1-a][KH-1-b][KW-1-e].
// One output element per thread (grid-stride over total = C * Kg * taps),
// 64-bit indices; f32 and bf16 move as their bits.
#define RS_FLIP_KERNEL(NAME, T)                                                              \
    KERNEL void NAME(const T* __restrict__ w, T* __restrict__ out, rs_u64 total, rs_u64 cg,   \
                     rs_u64 kg, rs_u64 kd, rs_u64 kh, rs_u64 kw) {                            \
        for (rs_u64 o = rs_tid(); o < total; o += rs_nthreads()) {                            \
            rs_u64 t = o;                                                                     \
            const rs_u64 e = t % kw;                                                          \
            t /= kw;                                                                          \
            const rs_u64 b = t % kh;                                                          \
            t /= kh;                                                                          \
            const rs_u64 a = t % kd;                                                          \
            t /= kd;                                                                          \
            const rs_u64 k = t % kg;                                                          \
            const rs_u64 cc = t / kg;                                                         \
            const rs_u64 grp = cc / cg;                                                       \
            const rs_u64 c = cc - grp * cg;                                                   \
            const rs_u64 row = (grp * kg + k) * cg + c;                                       \
            out[o] = w[((row * kd + (kd - 1 - a)) * kh + (kh - 1 - b)) * kw + (kw - 1 - e)]; \
        }                                                                                     \
    }
RS_FLIP_KERNEL(conv3d_flip_weight_u32, rs_u32)
RS_FLIP_KERNEL(conv3d_flip_weight_u16, rs_u16)

// ------------------------------------------------------------ zero insertion
//
// conv3d_zero_insert_{u32,u16}: dy [NK][OD][OH][OW] (NK = N * K) spread by
// the stride into out [NK][ZD][ZH][ZW] (Z* >= (O* - 1) * s* + 1):
//   out[nk][z][y][x] = dy[nk][z/sd][y/sh][x/sw] where z % sd == 0 and
//   z / sd < OD (likewise y, x), else 0,
// so that the input gradient of a strided convolution is the stride-1 one
// of `out` (the tiled tier's path: then flipped, conv3d_flip_weight_*). One
// output element per thread (grid-stride over total = NK * ZD * ZH * ZW),
// every element written; 64-bit indices.
#define RS_ZERO_INSERT_KERNEL(NAME, T)                                                       \
    KERNEL void NAME(const T* __restrict__ dy, T* __restrict__ out, rs_u64 total, rs_u64 od, \
                     rs_u64 oh, rs_u64 ow, rs_u64 zd, rs_u64 zh, rs_u64 zw, rs_u64 sd,        \
                     rs_u64 sh, rs_u64 sw) {                                                  \
        for (rs_u64 o = rs_tid(); o < total; o += rs_nthreads()) {                            \
            rs_u64 t = o;                                                                     \
            const rs_u64 x = t % zw;                                                          \
            t /= zw;                                                                          \
            const rs_u64 y = t % zh;                                                          \
            t /= zh;                                                                          \
            const rs_u64 z = t % zd;                                                          \
            const rs_u64 nk = t / zd;                                                         \
            const rs_u64 iz = z / sd, iy = y / sh, ix = x / sw;                               \
            const bool hit = z == iz * sd && y == iy * sh && x == ix * sw && iz < od &&       \
                             iy < oh && ix < ow;                                              \
            out[o] = hit ? dy[((nk * od + iz) * oh + iy) * ow + ix] : (T)0;                   \
        }                                                                                     \
    }
RS_ZERO_INSERT_KERNEL(conv3d_zero_insert_u32, rs_u32)
RS_ZERO_INSERT_KERNEL(conv3d_zero_insert_u16, rs_u16)
