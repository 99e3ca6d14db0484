// conv3d_naive_{f32,bf16}: one thread per output point (see conv3d.hip).
// Part of the conv3d module: included by conv3d.hip after rs_conv3d_args
// and the shared helpers (rs_ld, rs_bits16, rs_tap_range); not compiled
// on its own.
#pragma once

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
#if RS_BUILDS(RS_PART_CONV3D_NAIVE)
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
#endif
