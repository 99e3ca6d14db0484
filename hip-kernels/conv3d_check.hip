// The conv3d checks: the sampled-point check kernels and the non-finite locator.
// Part of the conv3d module: included by conv3d.hip after rs_conv3d_args
// and the shared helpers (rs_ld, rs_bits16, rs_tap_range); not compiled
// on its own.
#pragma once

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
                     rs_u64 nsamples, rs_u64 seed, const rs_u64* located, const rs_u64* gate) {
    if (rs_gate_closed(gate)) return;
    rs_conv3d_check<float>(x, w, bias, bias_kind, y, y_kind, res, a, nsamples, seed, located);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_check_bf16(const rs_u16* x, const rs_u16* w, const void* bias, rs_u64 bias_kind,
                      const void* y, rs_u64 y_kind, rs_u64* res, rs_conv3d_args a,
                      rs_u64 nsamples, rs_u64 seed, const rs_u64* located,
                      const rs_u64* gate) {
    if (rs_gate_closed(gate)) return;
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

// ---------------------------------------------------------------- the guard's verdict
//
// conv3d_guard_decide: the guarded fallback's verdict (src/conv3d_chain/guard.rs)
// over the counts and sampled points queued before it, decided on the device
// so that no host waits for it. One 256-thread block; with a gate it runs only
// when the gate is open.
//   out_counts: the checked output's NaN and Inf counts (2 words);
//   in_counts:  the operands' (input, weight, bias: 6 words), or null (not
//               scanned: the output alone decides);
//   res:        nsamples points as conv3d_check writes them. A point is judged
//               as the host's `compare` judges it: not when its reference or
//               its value is not finite (the counts judge those), else off
//               when |value - reference| > rel * magnitude + FLT_MIN.
// verdict (6 words, all written): [0] bits: 1 = a non-finite output from
// finite operands (any non-finite output without in_counts), 2 = a sampled
// point off; [1] = bits != 0 (the gate of the work that follows);
// [2..6] the first off point (lowest j): index, value, reference, tolerance
// (the last three doubles' bits), or ~0 and zeros.
KERNEL void RS_HIP_BLOCK(256)
    conv3d_guard_decide(const rs_u64* gate, const rs_u64* out_counts, const rs_u64* in_counts,
                        const rs_u64* res, rs_u64 nsamples, double rel, rs_u64* verdict) {
    if (rs_gate_closed(gate)) return;
    __shared__ rs_u64 lowest[256];
    rs_u64 mine = ~0ull;
    for (rs_u64 j = threadIdx.x; j < nsamples; j += blockDim.x) {
        const rs_u64* r = res + 4 * j;
        if (r[0] == ~0ull) continue;
        const double* d = (const double*)r;
        const double v = d[1], ref = d[2], mag = d[3];
        // x - x is 0 exactly when x is finite.
        if (!(ref - ref == 0.0) || !(v - v == 0.0)) continue;
        const double tol = rel * mag + 1.1754943508222875e-38;
        if (!(rs_abs_d(v - ref) <= tol) && j < mine) mine = j;
    }
    lowest[threadIdx.x] = mine;
    __syncthreads();
    for (unsigned int s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s && lowest[threadIdx.x + s] < lowest[threadIdx.x])
            lowest[threadIdx.x] = lowest[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x != 0) return;
    rs_u64 bits = 0;
    const bool nonfinite = (out_counts[0] | out_counts[1]) != 0;
    bool operands_finite = true;
    if (in_counts != 0)
        for (int i = 0; i < 6; ++i) operands_finite = operands_finite && in_counts[i] == 0;
    if (nonfinite && operands_finite) bits |= 1;
    const rs_u64 j = lowest[0];
    verdict[2] = ~0ull;
    verdict[3] = verdict[4] = verdict[5] = 0;
    if (j != ~0ull) {
        bits |= 2;
        const rs_u64* r = res + 4 * j;
        const double tol = rel * ((const double*)r)[3] + 1.1754943508222875e-38;
        verdict[2] = r[0];
        verdict[3] = r[1];
        verdict[4] = r[2];
        ((double*)verdict)[5] = tol;
    }
    verdict[0] = bits;
    verdict[1] = bits != 0 ? 1 : 0;
}
