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
// The raw bits of a bf16 element (the f32 overload is never called).
RS_DEVICE rs_u32 rs_bits16(const rs_u16* p, rs_u64 i) { return p[i]; }
RS_DEVICE rs_u32 rs_bits16(const float*, rs_u64) { return 0; }

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

// The direct naive loop: output point i of the flat output, read straight
// from global memory. The index arithmetic is done once per point; the
// loops walk pointers (a tap step along w is `dw` elements), the input
// axes' tap ranges are clipped up front so the loops have no bounds checks
// (taps in the padding are skipped), and the common full-width rows of three
// taps are unrolled.
template <typename T>
static __device__ __forceinline__ float rs_conv3d_naive_point(const T* __restrict__ x,
                                                              const T* __restrict__ wt,
                                                              const float* __restrict__ bias,
                                                              const rs_conv3d_args& a,
                                                              rs_u64 i) {
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u64 hw = a.h * a.w, dhw = a.d * hw;
    const rs_u64 khw = a.kh * a.kw, kvol = a.kd * khw;
    // Pointer steps: one tap along each axis.
    const rs_u64 sx_d = a.dd * hw, sx_h = a.dh * a.w, sx_w = a.dw;
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
    const rs_u64 nd = d_hi - d_lo, nh = h_hi - h_lo, nw = w_hi - w_lo;
    if (nd != 0 && nh != 0 && nw != 0) {
        // The first tap that lands inside the input: every pointer below
        // stays inside its tensor.
        const rs_u64 zi = (rs_u64)(z0 + (long long)(d_lo * a.dd));
        const rs_u64 yi = (rs_u64)(y0 + (long long)(h_lo * a.dh));
        const rs_u64 xi = (rs_u64)(x0 + (long long)(w_lo * a.dw));
        const T* xc = x + (n * a.c + g * cg) * dhw + zi * hw + yi * a.w + xi;
        const T* wc = wt + k * cg * kvol + d_lo * khw + h_lo * a.kw + w_lo;
        const bool row3 = nw == 3 && sx_w == 1;
        for (rs_u64 ci = 0; ci < cg; ++ci, xc += dhw, wc += kvol) {
            const T* xz = xc;
            const T* wz = wc;
            for (rs_u64 kd = 0; kd < nd; ++kd, xz += sx_d, wz += khw) {
                const T* xy = xz;
                const T* wy = wz;
                if (row3) {
                    for (rs_u64 kh = 0; kh < nh; ++kh, xy += sx_h, wy += a.kw) {
                        acc = fmaf(rs_ld(xy, 0), rs_ld(wy, 0), acc);
                        acc = fmaf(rs_ld(xy, 1), rs_ld(wy, 1), acc);
                        acc = fmaf(rs_ld(xy, 2), rs_ld(wy, 2), acc);
                    }
                } else {
                    for (rs_u64 kh = 0; kh < nh; ++kh, xy += sx_h, wy += a.kw) {
                        const T* xp = xy;
                        for (rs_u64 kw = 0; kw < nw; ++kw, xp += sx_w) {
                            acc = fmaf(rs_ld(xp, 0), rs_ld(wy, kw), acc);
                        }
                    }
                }
            }
        }
    }
    return acc;
}

// Every output point by the direct loop, one thread per point
// (grid-stride). Threads next to each other take neighbouring `ow`, so
// input loads are coalesced and the weight loads of a warp are (mostly) one
// broadcast; but a block's input working set does not fit the L1 cache, so
// most input loads go to L2 (75 ms on an H100 for 1x128x9x128x128, 128 out,
// k3 p1). The staged kernel below falls back to it.
template <typename T>
static __device__ __forceinline__ void rs_conv3d_naive_direct(const T* __restrict__ x,
                                                              const T* __restrict__ wt,
                                                              const float* __restrict__ bias,
                                                              float* __restrict__ y,
                                                              const rs_conv3d_args& a) {
    const rs_u64 total = a.n * a.k * a.od * a.oh * a.ow;
    for (rs_u64 i = rs_tid(); i < total; i += rs_nthreads()) {
        y[i] = rs_conv3d_naive_point(x, wt, bias, a, i);
    }
}

// Shared memory of the naive kernel, in floats: the staged input and the
// staged weights (32 KiB together).
#define RS_NV_XS 6144
#define RS_NV_WS 2048

// The staged naive kernel, one tile shape: a block of TK * TD * TH * TW
// threads computes TK output channels (of one group) x TD x TH x TW output
// points (of one batch item), one output point per thread. Thread tid is
// (tk, td, th, tw), tw fastest: with TW = 32 a warp is 32 neighbouring `ow`
// of one output channel, so its weight reads are broadcasts. For each slice
// of `cc` input channels the block stages in shared memory the input region
// its tile reads (zero where it lies in the padding) and the tile's weights
// (rows of KD * KH * KW taps padded to a multiple of 4), then every thread
// accumulates its point's taps from there: an input element is loaded from
// global memory once per tile instead of once per tap and output channel.
//
// Per point the order is that of the direct loop (bias, then channel, kd,
// kh, kw, f32 fmaf); taps in the padding add 0 * w (as the tiled kernel and
// vendor libraries do) where the direct loop skips them. 3x3x3 kernels with
// unit strides and dilations take an unrolled path (compile-time shared
// memory offsets, 16-byte broadcast weight reads) when FAST is set; with
// PAIRS too, bf16 inputs on that path are staged as raw bf16 pairs (two
// 32-bit reads for the three taps of a kernel row, see `pairs` below).
//
// Tiles are numbered with the output-channel tile fastest, so the blocks in
// flight at one time share their input regions in L2. Grid-stride over
// tiles (any grid size). When one channel's region or weights do not fit
// xs_len / ws_len floats (large strides or dilations, huge kernels), or
// blockDim.x is not TK * TD * TH * TW, every block runs the direct loop
// instead (the choice is the same for the whole grid).
template <typename T, int TK, int TD, int TH, int TW, bool FAST, bool PAIRS>
static __device__ __forceinline__ void rs_conv3d_naive_staged(
    const T* __restrict__ x, const T* __restrict__ wt, const float* __restrict__ bias,
    float* __restrict__ y, const rs_conv3d_args& a, float* __restrict__ xs, rs_u32 xs_len,
    float* __restrict__ ws, rs_u32 ws_len) {
    constexpr rs_u32 NT = (rs_u32)(TK * TD * TH * TW);
    const rs_u64 G = a.groups, cg = a.c / G, kg = a.k / G;
    const rs_u64 lim = xs_len;
    // Every factor below is at most xs_len (< 2^16), so no product overflows.
    const bool small = a.kd <= lim && a.kh <= lim && a.kw <= lim && a.sd <= lim &&
                       a.sh <= lim && a.sw <= lim && a.dd <= lim && a.dh <= lim &&
                       a.dw <= lim;
    rs_u64 rd = lim + 1, rh = lim + 1, rw = lim + 1, kvp = ws_len + 1ull;
    if (small) {
        // One channel's input region: rd x rh x rw.
        rd = (rs_u64)(TD - 1) * a.sd + (a.kd - 1) * a.dd + 1;
        rh = (rs_u64)(TH - 1) * a.sh + (a.kh - 1) * a.dh + 1;
        rw = (rs_u64)(TW - 1) * a.sw + (a.kw - 1) * a.dw + 1;
        kvp = (a.kd * a.kh * a.kw + 3) & ~3ull;
    }
    const bool fast = FAST && a.kd == 3 && a.kh == 3 && a.kw == 3 && a.sd == 1 && a.sh == 1 &&
                      a.sw == 1 && a.dd == 1 && a.dh == 1 && a.dw == 1;
    // bf16 on the fast path: the region is staged as raw bf16 pairs, twice
    // (plane A: pairs (2j, 2j+1) of a row, plane B: pairs (2j+1, 2j+2)), so
    // that a thread gets the three taps of a kernel row from two 32-bit reads
    // of one plane (its `ow` parity picks it) instead of three. Rows of FPW
    // words; plane B starts FBO words after plane A, FBO = 16 (mod 32), so
    // the even lanes (plane A) and odd lanes (plane B) of a warp read
    // different banks; a channel takes FCS words.
    constexpr rs_u32 FPW = TW / 2 + 1, FNR = (TD + 2) * (TH + 2);
    constexpr rs_u32 FBO = (FNR * FPW + 15) / 32 * 32 + 16, FCS = 2 * FBO;
    const bool pairs = fast && PAIRS && sizeof(T) == 2 && TW % 2 == 0;
    rs_u64 cc = 0;
    if (blockDim.x == NT && rd <= lim && rh <= lim && rw <= lim && kvp * TK <= ws_len) {
        // Words of one staged channel.
        const rs_u64 region = pairs ? FCS : rd * rh * rw;
        if (region <= lim) {
            cc = lim / region;
            if (ws_len / (TK * kvp) < cc) cc = ws_len / (TK * kvp);
            if (cg < cc) cc = cg;
        }
    }
    if (cc == 0) {
        rs_conv3d_naive_direct<T>(x, wt, bias, y, a);
        return;
    }
    // From here every size fits 32 bits.
    const rs_u32 RD = (rs_u32)rd, RH = (rs_u32)rh, RW = (rs_u32)rw;
    const rs_u32 REG = RD * RH * RW, KVP = (rs_u32)kvp, CC = (rs_u32)cc;
    const rs_u32 KD = (rs_u32)a.kd, KH = (rs_u32)a.kh, KW = (rs_u32)a.kw;
    const rs_u32 kvol = KD * KH * KW;
    const rs_u32 tid = threadIdx.x;
    const rs_u32 tw = tid % TW, th = (tid / TW) % TH, td = (tid / (TW * TH)) % TD;
    const rs_u32 tk = tid / (TW * TH * TD);
    const rs_u64 nkt = (kg + TK - 1) / TK, nwt = (a.ow + TW - 1) / TW;
    const rs_u64 nht = (a.oh + TH - 1) / TH, ndt = (a.od + TD - 1) / TD;
    const rs_u64 ntiles = a.n * ndt * nht * nwt * G * nkt;
    const rs_u64 hw = a.h * a.w, dhw = a.d * hw;
    // The staging loops walk element e = tid + j * NT of a slice as
    // mixed-radix digits, (w, h, d, channel) of the input region and (tap,
    // row) of the weights, advanced by NT with carries: no division per
    // element. Start digits of tid and step digits of NT:
    const rs_u32 x0w = tid % RW, x0h = (tid / RW) % RH, x0d = (tid / (RW * RH)) % RD;
    const rs_u32 x0c = tid / REG;
    const rs_u32 xsw = NT % RW, xsh = (NT / RW) % RH, xsd = (NT / (RW * RH)) % RD;
    const rs_u32 xsc = NT / REG;
    const rs_u32 w0t = tid % KVP, w0r = tid / KVP, wst = NT % KVP, wsr = NT / KVP;
    // This thread's first tap in a channel's region, and the tap steps.
    const rs_u32 xoff =
        (td * (rs_u32)a.sd * RH + th * (rs_u32)a.sh) * RW + tw * (rs_u32)a.sw;
    const rs_u32 step_d = (rs_u32)a.dd * RH * RW, step_h = (rs_u32)a.dh * RW;
    const rs_u32 step_w = (rs_u32)a.dw;

    for (rs_u64 tile = blockIdx.x; tile < ntiles; tile += gridDim.x) {
        rs_u64 t = tile;
        const rs_u64 kt = t % nkt;
        t /= nkt;
        const rs_u64 g = t % G;
        t /= G;
        const rs_u64 wti = t % nwt;
        t /= nwt;
        const rs_u64 hti = t % nht;
        t /= nht;
        const rs_u64 dti = t % ndt;
        const rs_u64 n = t / ndt;
        const rs_u64 kl = kt * TK + tk;
        const rs_u64 od = dti * TD + td, oh = hti * TH + th, ow = wti * TW + tw;
        const bool mine = kl < kg && od < a.od && oh < a.oh && ow < a.ow;
        const rs_u64 k = g * kg + kl;
        float acc = (mine && a.has_bias) ? bias[k] : 0.0f;
        // The region's first element (in the padding when negative).
        const long long z0 = (long long)(dti * TD * a.sd) - (long long)a.pd;
        const long long y0 = (long long)(hti * TH * a.sh) - (long long)a.ph;
        const long long x0 = (long long)(wti * TW * a.sw) - (long long)a.pw;
        const T* xg = x + (n * a.c + g * cg) * dhw;
        const T* wg = wt + (g * kg + kt * TK) * cg * kvol;
        for (rs_u64 c0 = 0; c0 < cg; c0 += CC) {
            const rs_u32 nc = (rs_u32)(cg - c0 < CC ? cg - c0 : CC);
            __syncthreads();  // the previous slice's readers are done
            if (pairs) {
                // Raw bf16 into both planes (position 0 of a row only into A).
                rs_u16* xh = reinterpret_cast<rs_u16*>(xs);
                rs_u32 ew = x0w, eh = x0h, ed = x0d, ec = x0c;
                const rs_u32 ne = nc * REG;
                for (rs_u32 e = tid; e < ne; e += 4 * NT) {
                    rs_u32 v[4], o[4], p[4];
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const rs_u64 zz = (rs_u64)(z0 + (long long)ed);
                        const rs_u64 yy = (rs_u64)(y0 + (long long)eh);
                        const rs_u64 xx = (rs_u64)(x0 + (long long)ew);
                        v[u] = 0;
                        if (e + u * NT < ne && zz < a.d && yy < a.h && xx < a.w) {
                            v[u] = rs_bits16(xg, (c0 + ec) * dhw + zz * hw + yy * a.w + xx);
                        }
                        o[u] = (ec * FCS + (ed * RH + eh) * FPW) * 2;
                        p[u] = ew;
                        ew += xsw;
                        eh += xsh;
                        ed += xsd;
                        ec += xsc;
                        if (ew >= RW) {
                            ew -= RW;
                            ++eh;
                        }
                        if (eh >= RH) {
                            eh -= RH;
                            ++ed;
                        }
                        if (ed >= RD) {
                            ed -= RD;
                            ++ec;
                        }
                    }
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        if (e + u * NT < ne) {
                            xh[o[u] + p[u]] = (rs_u16)v[u];
                            if (p[u] != 0) xh[o[u] + 2 * FBO + p[u] - 1] = (rs_u16)v[u];
                        }
                    }
                }
            } else {
                // Four elements per round: their loads are in flight together.
                rs_u32 ew = x0w, eh = x0h, ed = x0d, ec = x0c;
                const rs_u32 ne = nc * REG;
                for (rs_u32 e = tid; e < ne; e += 4 * NT) {
                    float v[4];
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        // Negative coordinates wrap to huge values: one compare.
                        const rs_u64 zz = (rs_u64)(z0 + (long long)ed);
                        const rs_u64 yy = (rs_u64)(y0 + (long long)eh);
                        const rs_u64 xx = (rs_u64)(x0 + (long long)ew);
                        v[u] = 0.0f;
                        if (e + u * NT < ne && zz < a.d && yy < a.h && xx < a.w) {
                            v[u] = rs_ld(xg, (c0 + ec) * dhw + zz * hw + yy * a.w + xx);
                        }
                        ew += xsw;
                        eh += xsh;
                        ed += xsd;
                        ec += xsc;
                        if (ew >= RW) {
                            ew -= RW;
                            ++eh;
                        }
                        if (eh >= RH) {
                            eh -= RH;
                            ++ed;
                        }
                        if (ed >= RD) {
                            ed -= RD;
                            ++ec;
                        }
                    }
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        if (e + u * NT < ne) xs[e + u * NT] = v[u];
                    }
                }
            }
            {
                // Row r = c * TK + q: weights of output channel kt * TK + q,
                // input channel c0 + c. Four elements per round.
                rs_u32 et = w0t, er = w0r;
                const rs_u32 ne = nc * TK * KVP;
                for (rs_u32 e = tid; e < ne; e += 4 * NT) {
                    float v[4];
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        const rs_u32 c = er / TK, q = er % TK;
                        v[u] = 0.0f;
                        if (e + u * NT < ne && et < kvol && kt * TK + q < kg) {
                            v[u] = rs_ld(wg, ((rs_u64)q * cg + c0 + c) * kvol + et);
                        }
                        et += wst;
                        er += wsr;
                        if (et >= KVP) {
                            et -= KVP;
                            ++er;
                        }
                    }
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        if (e + u * NT < ne) ws[e + u * NT] = v[u];
                    }
                }
            }
            __syncthreads();
            if (mine) {
                if (pairs) {
                    constexpr rs_u32 FH = TH + 2;
                    const rs_u32* xp = reinterpret_cast<const rs_u32*>(xs) +
                                       ((tw & 1u) ? FBO : 0u) + (td * FH + th) * FPW + (tw >> 1);
                    const float4* wp = reinterpret_cast<const float4*>(ws) + tk * 7;
                    for (rs_u32 c = 0; c < nc; ++c, xp += FCS, wp += TK * 7) {
                        float wv[28];
#pragma unroll
                        for (int q = 0; q < 7; ++q) {
                            const float4 v = wp[q];
                            wv[4 * q] = v.x;
                            wv[4 * q + 1] = v.y;
                            wv[4 * q + 2] = v.z;
                            wv[4 * q + 3] = v.w;
                        }
#pragma unroll
                        for (int kd = 0; kd < 3; ++kd)
#pragma unroll
                            for (int kh = 0; kh < 3; ++kh) {
                                const rs_u32 p0 = xp[(kd * FH + kh) * FPW];
                                const rs_u32 p1 = xp[(kd * FH + kh) * FPW + 1];
                                const float* wr = wv + (kd * 3 + kh) * 3;
                                acc = fmaf(__uint_as_float(p0 << 16), wr[0], acc);
                                acc = fmaf(__uint_as_float(p0 & 0xffff0000u), wr[1], acc);
                                acc = fmaf(__uint_as_float(p1 << 16), wr[2], acc);
                            }
                    }
                } else if (fast) {
                    // Region (TD + 2) x (TH + 2) x (TW + 2), rows of 28 weights.
                    constexpr rs_u32 FW = TW + 2, FH = TH + 2, FREG = (TD + 2) * FH * FW;
                    const float* xp = xs + (td * FH + th) * FW + tw;
                    const float4* wp = reinterpret_cast<const float4*>(ws) + tk * 7;
                    for (rs_u32 c = 0; c < nc; ++c, xp += FREG, wp += TK * 7) {
                        float wv[28];
#pragma unroll
                        for (int q = 0; q < 7; ++q) {
                            const float4 v = wp[q];
                            wv[4 * q] = v.x;
                            wv[4 * q + 1] = v.y;
                            wv[4 * q + 2] = v.z;
                            wv[4 * q + 3] = v.w;
                        }
#pragma unroll
                        for (int kd = 0; kd < 3; ++kd)
#pragma unroll
                            for (int kh = 0; kh < 3; ++kh)
#pragma unroll
                                for (int kw = 0; kw < 3; ++kw)
                                    acc = fmaf(xp[(kd * FH + kh) * FW + kw],
                                               wv[(kd * 3 + kh) * 3 + kw], acc);
                    }
                } else {
                    const float* xp = xs + xoff;
                    const float* wp = ws + tk * KVP;
                    for (rs_u32 c = 0; c < nc; ++c, xp += REG, wp += TK * KVP) {
                        const float* wq = wp;
                        const float* xz = xp;
                        for (rs_u32 kd = 0; kd < KD; ++kd, xz += step_d) {
                            const float* xy = xz;
                            for (rs_u32 kh = 0; kh < KH; ++kh, xy += step_h) {
                                for (rs_u32 kw = 0; kw < KW; ++kw) {
                                    acc = fmaf(xy[kw * step_w], *wq++, acc);
                                }
                            }
                        }
                    }
                }
            }
        }
        if (mine) y[(((n * a.k + k) * a.od + od) * a.oh + oh) * a.ow + ow] = acc;
    }
}

// One output point per thread, staged through shared memory
// (rs_conv3d_naive_staged). The tile shape is chosen by the sizes: 32
// neighbouring `ow` per warp when OW > 8 (else 8), and 4 output channels
// per block when each group has at least 4 (else 1, e.g. depthwise).
template <typename T>
static __device__ __forceinline__ void rs_conv3d_naive(const T* __restrict__ x,
                                                       const T* __restrict__ wt,
                                                       const float* __restrict__ bias,
                                                       float* __restrict__ y,
                                                       const rs_conv3d_args& a) {
    __shared__ __align__(16) float xs[RS_NV_XS];
    __shared__ __align__(16) float ws[RS_NV_WS];
    const bool wide = a.ow > 8;
    const bool many = a.k / a.groups >= 4;
    if (wide && many) {
        rs_conv3d_naive_staged<T, 4, 1, 2, 32, true, true>(x, wt, bias, y, a, xs, RS_NV_XS, ws,
                                                     RS_NV_WS);
    } else if (wide) {
        rs_conv3d_naive_staged<T, 1, 1, 8, 32, true, true>(x, wt, bias, y, a, xs, RS_NV_XS, ws,
                                                     RS_NV_WS);
    } else if (many) {
        rs_conv3d_naive_staged<T, 4, 1, 8, 8, true, true>(x, wt, bias, y, a, xs, RS_NV_XS, ws,
                                                    RS_NV_WS);
    } else {
        rs_conv3d_naive_staged<T, 1, 4, 8, 8, true, true>(x, wt, bias, y, a, xs, RS_NV_XS, ws,
                                                    RS_NV_WS);
    }
}

// 256 threads per block (the host's BLOCK), any grid. On CUDA at least 4
// blocks per SM (at most 64 registers). H100, 1x128x9x128x128 k128 k3p1,
// f32 / bf16: nvcc build 19.8 / 22.5 ms with the bound against 21.8 / 23.9
// without (naive_harness.cu); through NVRTC (the crate's build) 21.7 / 23.6
// against 21.6 / 24.1. Six blocks per SM spilled and ran slower.
#if defined(RS_CUDA)
#define RS_NAIVE_BOUNDS __launch_bounds__(256, 4)
#else
#define RS_NAIVE_BOUNDS __launch_bounds__(256)
#endif
KERNEL void RS_NAIVE_BOUNDS
    conv3d_naive_f32(const float* x, const float* w, const float* bias, float* y,
                     rs_conv3d_args a) {
    rs_conv3d_naive<float>(x, w, bias, y, a);
}
KERNEL void RS_NAIVE_BOUNDS
    conv3d_naive_bf16(const rs_u16* x, const rs_u16* w, const float* bias, float* y,
                      rs_conv3d_args a) {
    rs_conv3d_naive<rs_u16>(x, w, bias, y, a);
}

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

    rs_conv3d_tap_table(a, tid, kvol, khw, tap_d, tap_h, tap_w);

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

KERNEL void RS_HIP_BLOCK(256)
    conv3d_tiled_f32(const float* x, const float* w_t, const float* bias, float* y,
                     rs_conv3d_args a) {
    rs_conv3d_tiled<float>(x, w_t, bias, y, a);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_tiled_bf16(const rs_u16* x, const rs_u16* w_t, const float* bias, float* y,
                      rs_conv3d_args a) {
    rs_conv3d_tiled<rs_u16>(x, w_t, bias, y, a);
}

// conv3d_tiled_bf16_mma: the tiled kernel for bf16 on tensor cores (CUDA,
// sm_80 and newer; the symbol does not exist elsewhere, and the host then
// uses conv3d_tiled_bf16). Implicit GEMM out[m][p] = sum_r W[m][r] X[r][p]
// in 128 x 128 tiles per 256-thread block, 32-deep slices of r, each warp a
// 64 x 32 sub-tile of m16n8k16 bf16 products with f32 accumulation (bf16
// products are exact in f32). Weights come packed per group, zero padded:
// wp[g][mp][rp], mp = K/G rounded up to 128, rp = R rounded up to 32, so
// their loads are unconditional 16-byte vectors. The input column is
// gathered on the fly as in the scalar kernel. Grid: x = ceil(P / 128),
// y = mp / 128, z = groups.
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

RS_DEVICE void rs_mma_bf16(float* c, const rs_u32* a, const rs_u32* b) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two blocks per SM (at most 128 registers): NVRTC's build otherwise takes
// 158 registers, one block per SM, and runs 1.45x slower.
KERNEL void __launch_bounds__(256, 2)
    conv3d_tiled_bf16_mma(const rs_u16* __restrict__ x, const rs_u16* __restrict__ wp,
                          const float* __restrict__ bias, float* __restrict__ y,
                          rs_conv3d_args a, rs_u64 rp, rs_u64 mp) {
    __shared__ __align__(16) rs_u16 As[2][RS_TC_BM * RS_TC_LD];
    __shared__ __align__(16) rs_u16 Bs[2][RS_TC_BN * RS_TC_LD];
    __shared__ int tap_d[RS_TC_MAX_TAPS], tap_h[RS_TC_MAX_TAPS], tap_w[RS_TC_MAX_TAPS];
    const rs_u32 tid = threadIdx.x;
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u32 khw = (rs_u32)(a.kh * a.kw);
    const rs_u32 kvol = (rs_u32)(a.kd * a.kh * a.kw);
    const rs_u64 osp = a.od * a.oh * a.ow;
    const rs_u64 P = a.n * osp;
    const rs_u64 g = blockIdx.z;
    const rs_u64 m0 = (rs_u64)blockIdx.y * RS_TC_BM;
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
    __syncthreads();

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
            if (b_ok && ci < cg) {                                                           \
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
    const rs_u32 wm = (warp & 1u) * 64u, wn = (warp >> 1) * 32u;
    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
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
            rs_u32 af[4][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 4; ++mi) {
                const rs_u16* r0 = as + (wm + mi * 16 + gid) * RS_TC_LD + kk + tig * 2;
                const rs_u16* r1 = r0 + 8 * RS_TC_LD;
                af[mi][0] = *reinterpret_cast<const rs_u32*>(r0);
                af[mi][1] = *reinterpret_cast<const rs_u32*>(r1);
                af[mi][2] = *reinterpret_cast<const rs_u32*>(r0 + 8);
                af[mi][3] = *reinterpret_cast<const rs_u32*>(r1 + 8);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const rs_u16* c0 = bs + (wn + ni * 8 + gid) * RS_TC_LD + kk + tig * 2;
                bf[ni][0] = *reinterpret_cast<const rs_u32*>(c0);
                bf[ni][1] = *reinterpret_cast<const rs_u32*>(c0 + 8);
            }
#pragma unroll
            for (int mi = 0; mi < 4; ++mi)
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
            for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const rs_u64 mi_row = m0 + wm + mi * 16 + gid + h * 8;
                    if (mi_row >= kg) continue;
                    const rs_u64 k = g * kg + mi_row;
                    const float b = a.has_bias ? bias[k] : 0.0f;
                    y[(n * a.k + k) * osp + s] = acc[mi][ni][h * 2 + e] + b;
                }
            }
        }
    }
}
#endif

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

// ---------------------------------------------------------------- the checks
//
// conv3d_check_{f32,bf16}: the chain's sampled-point check on the device. One
// 256-thread block per sample j < nsamples (grid x = nsamples): the flat
// output index is rs_conv3d_sample(total, seed, j) (the host's
// `sample_index`, bit for bit), or with `located` != 0 (one block) the index
// conv3d_locate_nonfinite_f32 stored there. The block recomputes that output
// point in double (products of f32 or widened bf16 values are exact in
// double; partial sums per thread, then a tree over the block) together with
// its magnitude |bias| + sum |x * w|, reads the tier's value y[index] and
// writes res[4j..4j+4] = (index, value, reference, magnitude), the last three
// as doubles. An index past the output (nothing located) is written as
// ~0 with NaNs. bias_kind: 0 none, 1 f32, 2 bf16 (read as given: the check
// does not trust the widening the tiers use); y_kind: 1 f32, 2 bf16 (an
// output another library wrote; `located` is used with f32 outputs only).
RS_DEVICE rs_u64 rs_check_mix64(rs_u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

// Sample j of an output of `total` points: 0, total - 1, then splitmix64.
RS_DEVICE rs_u64 rs_conv3d_sample(rs_u64 total, rs_u64 seed, rs_u64 j) {
    if (j == 0) return 0;
    if (j == 1) return total - 1;
    return rs_check_mix64(seed + (j - 1) * 0x9e3779b97f4a7c15ull) % total;
}

RS_DEVICE double rs_abs_d(double v) { return v < 0.0 ? -v : v; }

RS_DEVICE double rs_check_out(const void* y, rs_u64 y_kind, rs_u64 i) {
    if (y_kind == 2) return (double)rs_ld((const rs_u16*)y, i);
    return (double)((const float*)y)[i];
}

RS_DEVICE double rs_check_bias(const void* bias, rs_u64 bias_kind, rs_u64 k) {
    if (bias_kind == 1) return (double)((const float*)bias)[k];
    if (bias_kind == 2) return (double)rs_ld((const rs_u16*)bias, k);
    return 0.0;
}

template <typename T>
static __device__ __forceinline__ void rs_conv3d_check(const T* __restrict__ x,
                                                       const T* __restrict__ wt,
                                                       const void* bias, rs_u64 bias_kind,
                                                       const void* y, rs_u64 y_kind, rs_u64* res,
                                                       const rs_conv3d_args& a, rs_u64 nsamples,
                                                       rs_u64 seed, const rs_u64* located) {
    __shared__ double pv[256];
    __shared__ double pm[256];
    const rs_u64 total = a.n * a.k * a.od * a.oh * a.ow;
    const rs_u64 cg = a.c / a.groups, kg = a.k / a.groups;
    const rs_u64 khw = a.kh * a.kw, kvol = a.kd * khw, R = cg * kvol;
    for (rs_u64 j = blockIdx.x; j < nsamples; j += gridDim.x) {
        rs_u64 i = ~0ull;
        if (located != 0) {
            const rs_u64 v = *located;
            if (v != 0 && v <= total) i = total - v;
        } else if (total != 0) {
            i = rs_conv3d_sample(total, seed, j);
        }
        double val = 0.0, mag = 0.0;
        rs_u64 n = 0, k = 0, g = 0, od = 0, oh = 0, ow = 0;
        const bool ok = i < total;
        if (ok) {
            rs_u64 t = i;
            ow = t % a.ow;
            t /= a.ow;
            oh = t % a.oh;
            t /= a.oh;
            od = t % a.od;
            t /= a.od;
            k = t % a.k;
            n = t / a.k;
            g = k / kg;
            for (rs_u64 r = threadIdx.x; r < R; r += blockDim.x) {
                const rs_u64 ci = r / kvol;
                const rs_u64 tap = r - ci * kvol;
                const rs_u64 td = tap / khw;
                const rs_u64 th = (tap - td * khw) / a.kw;
                const rs_u64 tw = tap - td * khw - th * a.kw;
                const long long z = (long long)(od * a.sd + td * a.dd) - (long long)a.pd;
                const long long yy = (long long)(oh * a.sh + th * a.dh) - (long long)a.ph;
                const long long xx = (long long)(ow * a.sw + tw * a.dw) - (long long)a.pw;
                if (z < 0 || yy < 0 || xx < 0 || z >= (long long)a.d || yy >= (long long)a.h ||
                    xx >= (long long)a.w)
                    continue;
                const rs_u64 xi =
                    (((n * a.c + g * cg + ci) * a.d + (rs_u64)z) * a.h + (rs_u64)yy) * a.w +
                    (rs_u64)xx;
                const rs_u64 wi = k * R + r;
                const double p = (double)rs_ld(x, xi) * (double)rs_ld(wt, wi);
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
            double* out = (double*)(res + 4 * j);
            if (ok) {
                const double b = rs_check_bias(bias, bias_kind, k);
                res[4 * j] = i;
                out[1] = rs_check_out(y, y_kind, i);
                out[2] = b + pv[0];
                out[3] = rs_abs_d(b) + pm[0];
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
    conv3d_check_f32(const float* x, const float* w, const void* bias, rs_u64 bias_kind,
                     const void* y, rs_u64 y_kind, rs_u64* res, rs_conv3d_args a,
                     rs_u64 nsamples, rs_u64 seed, const rs_u64* located) {
    rs_conv3d_check<float>(x, w, bias, bias_kind, y, y_kind, res, a, nsamples, seed, located);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_check_bf16(const rs_u16* x, const rs_u16* w, const void* bias, rs_u64 bias_kind,
                      const void* y, rs_u64 y_kind, rs_u64* res, rs_conv3d_args a,
                      rs_u64 nsamples, rs_u64 seed, const rs_u64* located) {
    rs_conv3d_check<rs_u16>(x, w, bias, bias_kind, y, y_kind, res, a, nsamples, seed, located);
}

// *slot = max over non-finite y[i] of (n - i): the first non-finite index is
// n - *slot (the caller zeroes the slot; 0 means none). Grid-stride.
KERNEL void conv3d_locate_nonfinite_f32(const rs_u32* y, rs_u64 n, rs_u64* slot) {
    rs_u64 best = 0;
    for (rs_u64 i = rs_tid(); i < n; i += rs_nthreads()) {
        if ((y[i] & 0x7f800000u) == 0x7f800000u) {
            best = n - i;
            break;  // later indices of this thread are larger
        }
    }
    if (best != 0) rs_atomic_max_u64(slot, best);
}

// ---------------------------------------------------------------- weight layouts
//
// conv3d_layout_{u32,u16}: the standard weight [G][KG][R] (R = C/G*KD*KH*KW)
// rearranged for the tiled kernels, one output element per thread
// (grid-stride over `total` outputs):
//   packed == 0: [G][R][KG]   (conv3d_tiled_*; total = G * KG * R)
//   packed != 0: [G][rows][cols], zero where m >= KG or r >= R
//                (conv3d_tiled_bf16_mma; total = G * rows * cols)
#define RS_LAYOUT_KERNEL(NAME, T)                                                          \
    KERNEL void NAME(const T* __restrict__ w, T* __restrict__ out, rs_u64 total, rs_u64 kg, \
                     rs_u64 r, rs_u64 rows, rs_u64 cols, rs_u64 packed) {                   \
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
