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

// The double whose bits are v.
RS_DEVICE double rs_u64_as_double(rs_u64 v) {
    union {
        rs_u64 u;
        double d;
    } c;
    c.u = v;
    return c.d;
}

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

// The lowest sample j < nsamples whose point is off (~0 when none), in
// thread 0: one 256-thread block's reduction (every thread calls it). In the
// fused check below the points were written by other blocks of the same
// launch: read after the ticket and a device fence (__threadfence: on AMD it
// invalidates the non-coherent vector caches, on CUDA it is the acquire half
// of the PTX memory model's fence synchronisation), plain loads see them.
RS_DEVICE rs_u64 rs_guard_lowest_off(const rs_u64* res, rs_u64 nsamples, double rel) {
    __shared__ rs_u64 lowest[256];
    rs_u64 mine = ~0ull;
    for (rs_u64 j = threadIdx.x; j < nsamples; j += blockDim.x) {
        if (res[4 * j] == ~0ull) continue;
        const double v = rs_u64_as_double(res[4 * j + 1]);
        const double ref = rs_u64_as_double(res[4 * j + 2]);
        const double mag = rs_u64_as_double(res[4 * j + 3]);
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
    return lowest[0];
}

// The six verdict words (see conv3d_guard_decide) from the counts' judgement
// and the lowest point off `j` (~0: none). One thread.
RS_DEVICE void rs_guard_write_verdict(bool nonfinite, bool operands_finite, const rs_u64* res,
                                      rs_u64 j, double rel, rs_u64* verdict) {
    rs_u64 bits = 0;
    if (nonfinite && operands_finite) bits |= 1;
    verdict[2] = ~0ull;
    verdict[3] = verdict[4] = verdict[5] = 0;
    if (j != ~0ull) {
        bits |= 2;
        const double tol = rel * rs_u64_as_double(res[4 * j + 3]) + 1.1754943508222875e-38;
        verdict[2] = res[4 * j];
        verdict[3] = res[4 * j + 1];
        verdict[4] = res[4 * j + 2];
        ((double*)verdict)[5] = tol;
    }
    verdict[0] = bits;
    verdict[1] = bits != 0 ? 1 : 0;
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
    const rs_u64 j = rs_guard_lowest_off(res, nsamples, rel);
    if (threadIdx.x != 0) return;
    const bool nonfinite = (out_counts[0] | out_counts[1]) != 0;
    bool operands_finite = true;
    if (in_counts != 0)
        for (int i = 0; i < 6; ++i) operands_finite = operands_finite && in_counts[i] == 0;
    rs_guard_write_verdict(nonfinite, operands_finite, res, j, rel, verdict);
}

// ---------------------------------------------------------------- the guard's fused check
//
// conv3d_guard_check_{f32,bf16}: one launch of the guarded fallback that does
// what a NaN/Inf count, conv3d_check and conv3d_guard_decide did in three (or,
// for the repair, five with the operands' counts): every block takes its share
// of the sampled points (rs_conv3d_check's loop over j = blockIdx.x, +=
// gridDim.x; res as conv3d_check writes it) and of the grid-stride NaN/Inf
// count of the output y (y_kind 1 f32, 2 bf16), with `repair` != 0 also of the
// input, the weight and the bias (as given: bias_kind 0 none, 1 f32, 2 bf16),
// and adds its counts into `acc`; the last block to finish (a device fence,
// then a ticket: acc[0]) reads the totals and every point and writes the
// verdict as conv3d_guard_decide would, then zeroes acc for the next launch.
//
// acc: 9 words (ticket; output NaN, Inf; input, weight, bias NaN, Inf), zero
// when the launch starts and zero again when it ends (the caller zeroes it
// once, when it is made, and orders launches that share it on one stream or
// behind an event).
// rec: with repair == 0, 22 words, all written: [0..2] the output's counts,
// [2..8] the verdict (any non-finite output counts), [8..22] zeros (the words
// a repair writes, so a repair that does not run leaves no stale words);
// with repair != 0, 14 words: [0..6] the operands' counts, [6..8] the
// output's, [8..14] the verdict (a non-finite output counts only from finite
// operands). With a gate, nothing runs (acc and rec untouched) unless open.
// NaN and Inf among the n elements (U: rs_u32 for f32, rs_u16 for bf16) at p,
// this thread's grid-stride share: 16-byte vectors where p is 16-byte aligned,
// then the elements past the last whole vector one by one.
template <typename U>
RS_DEVICE void rs_guard_scan(const void* p, rs_u64 n, rs_u64& nan, rs_u64& inf) {
    const rs_u32 E = sizeof(U) == 4 ? 0x7f800000u : 0x7f80u;
    const rs_u32 M = sizeof(U) == 4 ? 0x007fffffu : 0x007fu;
    const rs_u64 tid = rs_tid(), stride = rs_nthreads();
    rs_u64 first = 0;
    if ((((rs_u64)p) & 15u) == 0) {
        const rs_u64 per = 16 / sizeof(U);
        const rs_u64 nv = n / per;
        const rs_v4* v = (const rs_v4*)p;
        for (rs_u64 i = tid; i < nv; i += stride) {
            const rs_v4 q = rs_load4(v + i);
            const rs_u32 w[4] = {q.x, q.y, q.z, q.w};
            for (int k = 0; k < 4; ++k) {
                for (int h = 0; h < (int)(4 / sizeof(U)); ++h) {
                    const rs_u32 x = sizeof(U) == 4 ? w[k] : ((w[k] >> (16 * h)) & 0xffffu);
                    if ((x & E) == E) {
                        if ((x & M) != 0) {
                            ++nan;
                        } else {
                            ++inf;
                        }
                    }
                }
            }
        }
        first = nv * per;
    }
    const U* e = (const U*)p;
    for (rs_u64 i = first + tid; i < n; i += stride) {
        const rs_u32 x = (rs_u32)e[i];
        if ((x & E) == E) {
            if ((x & M) != 0) {
                ++nan;
            } else {
                ++inf;
            }
        }
    }
}

// The block's sums of nan and inf added to counts[0], counts[1] (thread 0;
// every thread calls it).
RS_DEVICE void rs_guard_add(rs_u64 nan, rs_u64 inf, rs_u64* counts) {
    __shared__ rs_u64 gn[256];
    __shared__ rs_u64 gi[256];
    gn[threadIdx.x] = nan;
    gi[threadIdx.x] = inf;
    __syncthreads();
    for (unsigned int k = 128; k > 0; k >>= 1) {
        if (threadIdx.x < k) {
            gn[threadIdx.x] += gn[threadIdx.x + k];
            gi[threadIdx.x] += gi[threadIdx.x + k];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (gn[0] != 0u) rs_atomic_add_u64(counts, gn[0]);
        if (gi[0] != 0u) rs_atomic_add_u64(counts + 1, gi[0]);
    }
}

// Counts the n elements of kind `kind` (1 f32, 2 bf16) at p into counts.
RS_DEVICE void rs_guard_count(const void* p, rs_u64 kind, rs_u64 n, rs_u64* counts) {
    rs_u64 nan = 0, inf = 0;
    if (kind == 2) {
        rs_guard_scan<rs_u16>(p, n, nan, inf);
    } else {
        rs_guard_scan<rs_u32>(p, n, nan, inf);
    }
    rs_guard_add(nan, inf, counts);
}

template <typename T>
static __device__ __forceinline__ void rs_guard_check(const T* __restrict__ x,
                                                      const T* __restrict__ wt, const void* bias,
                                                      rs_u64 bias_kind, const void* y,
                                                      rs_u64 y_kind, rs_u64* res,
                                                      const rs_conv3d_args& a, rs_u64 nsamples,
                                                      rs_u64 seed, double rel, rs_u64 repair,
                                                      rs_u64* acc, rs_u64* rec) {
    __shared__ int last;
    // 1. This block's sampled points (written by its thread 0).
    rs_conv3d_check<T>(x, wt, bias, bias_kind, y, y_kind, res, a, nsamples, seed, 0);
    // 2. Its share of the counts.
    const rs_u64 total = a.n * a.k * a.od * a.oh * a.ow;
    rs_guard_count(y, y_kind, total, acc + 1);
    if (repair != 0) {
        const rs_u64 xk = sizeof(T) == 2 ? 2 : 1;
        rs_guard_count(x, xk, a.n * a.c * a.d * a.h * a.w, acc + 3);
        rs_guard_count(wt, xk, a.k * (a.c / a.groups) * a.kd * a.kh * a.kw, acc + 5);
        if (bias_kind != 0) rs_guard_count(bias, bias_kind, a.k, acc + 7);
    }
    // 3. The last block decides: the points and counts of every block were
    // written (thread 0's stores and atomics) before its fence and ticket.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(acc, 1ull) == (rs_u64)gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    const rs_u64 j = rs_guard_lowest_off(res, nsamples, rel);
    if (threadIdx.x != 0) return;
    // The totals through atomics (where the blocks added them), then zero
    // for the next launch (plain stores: seen by every later kernel).
    rs_u64 c[8];
    for (int i = 0; i < 8; ++i) {
        c[i] = atomicAdd(acc + 1 + i, 0ull);
        acc[1 + i] = 0;
    }
    acc[0] = 0;
    const bool nonfinite = (c[0] | c[1]) != 0;
    if (repair == 0) {
        rec[0] = c[0];
        rec[1] = c[1];
        rs_guard_write_verdict(nonfinite, true, res, j, rel, rec + 2);
        for (int i = 8; i < 22; ++i) rec[i] = 0;
    } else {
        bool operands_finite = true;
        for (int i = 0; i < 6; ++i) {
            rec[i] = c[2 + i];
            operands_finite = operands_finite && c[2 + i] == 0;
        }
        rec[6] = c[0];
        rec[7] = c[1];
        rs_guard_write_verdict(nonfinite, operands_finite, res, j, rel, rec + 8);
    }
}

KERNEL void RS_HIP_BLOCK(256)
    conv3d_guard_check_f32(const float* x, const float* w, const void* bias, rs_u64 bias_kind,
                           const void* y, rs_u64 y_kind, rs_u64* res, rs_conv3d_args a,
                           rs_u64 nsamples, rs_u64 seed, double rel, rs_u64 repair, rs_u64* acc,
                           rs_u64* rec, const rs_u64* gate) {
    if (rs_gate_closed(gate)) return;
    rs_guard_check<float>(x, w, bias, bias_kind, y, y_kind, res, a, nsamples, seed, rel, repair,
                          acc, rec);
}
KERNEL void RS_HIP_BLOCK(256)
    conv3d_guard_check_bf16(const rs_u16* x, const rs_u16* w, const void* bias,
                            rs_u64 bias_kind, const void* y, rs_u64 y_kind, rs_u64* res,
                            rs_conv3d_args a, rs_u64 nsamples, rs_u64 seed, double rel,
                            rs_u64 repair, rs_u64* acc, rs_u64* rec, const rs_u64* gate) {
    if (rs_gate_closed(gate)) return;
    rs_guard_check<rs_u16>(x, w, bias, bias_kind, y, y_kind, res, a, nsamples, seed, rel, repair,
                           acc, rec);
}
