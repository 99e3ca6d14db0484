// The naive conv3d kernel (one thread per output point) and its variants:
// each checked against a double-precision CPU reference on small irregular
// cases, then timed on 1x128x9x128x128, 128 out, k3 p1 (f32 and bf16),
// with "floor" kernels that do only the loads and FMAs of that case.
// Build and run: see README.md (needs prelude.h and conv3d.hip copied here).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>
#include "conv3d.hip"

#define CK(x)                                                                          \
    do {                                                                               \
        cudaError_t e_ = (x);                                                          \
        if (e_ != cudaSuccess) {                                                       \
            printf("CUDA error %s at line %d\n", cudaGetErrorString(e_), __LINE__);    \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

// ---------------------------------------------------------------- variants
// The direct loop (the crate's naive kernel before staging).
template <typename T>
__global__ void __launch_bounds__(256)
    nv_direct(const T* x, const T* w, const float* b, float* y, rs_conv3d_args a) {
    rs_conv3d_naive_direct<T>(x, w, b, y, a);
}

// The staged kernel with one fixed tile shape and shared-memory sizes
// (XS + WS floats; at most 12288 for static shared memory), at least MINB
// blocks per SM (__launch_bounds__: caps the registers at 65536 / (256 MINB)).
template <typename T, int TK, int TD, int TH, int TW, bool FAST, bool PAIRS, int XS, int WS,
          int MINB>
__global__ void __launch_bounds__(256, MINB)
    nv_staged(const T* x, const T* w, const float* b, float* y, rs_conv3d_args a) {
    __shared__ __align__(16) float xs[XS];
    __shared__ __align__(16) float ws[WS];
    rs_conv3d_naive_staged<T, TK, TD, TH, TW, FAST, PAIRS>(x, w, b, y, a, xs, XS, ws, WS);
}

// ---------------------------------------------------------------- floors
// All for the bench case only (3x3x3 taps, cg input channels), one thread
// per output point on the crate's grid (ceil(total / 256) blocks of 256);
// they compute nothing meaningful (their error is not checked).

// The staged kernel's inner loop alone (no staging, no syncs): per channel
// 7 broadcast 16-byte weight reads and 27 input reads from shared memory,
// tile 4 k x 2 rows x 32 w (k4h2), cycling through 15 staged channels.
__global__ void __launch_bounds__(256) nv_floor_lds(float* y, rs_u64 total, int cg) {
    __shared__ __align__(16) float xs[RS_NV_XS];
    __shared__ __align__(16) float ws[RS_NV_WS];
    for (int i = threadIdx.x; i < RS_NV_XS; i += 256) xs[i] = (float)(i % 97) * 0.01f;
    for (int i = threadIdx.x; i < RS_NV_WS; i += 256) ws[i] = (float)(i % 89) * 0.01f;
    __syncthreads();
    const rs_u32 tid = threadIdx.x, tw = tid & 31u, th = (tid >> 5) & 1u, tk = tid >> 6;
    const float* xb = xs + th * 34 + tw;
    const float4* wb = reinterpret_cast<const float4*>(ws) + tk * 7;
    float acc = 0.0f;
    int s = 0;
    for (int c = 0; c < cg; ++c) {
        const float* xp = xb + s * 408;
        const float4* wp = wb + s * 28;
        if (++s == 15) s = 0;
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
                    acc = fmaf(xp[(kd * 4 + kh) * 34 + kw], wv[(kd * 3 + kh) * 3 + kw], acc);
    }
    const rs_u64 i = (rs_u64)blockIdx.x * 256 + tid;
    if (i < total) y[i] = acc;
}

// The bf16 pair path's inner loop alone: per channel 7 broadcast 16-byte
// weight reads and 18 32-bit reads of bf16 pairs (planes 208 words apart).
__global__ void __launch_bounds__(256) nv_floor_lds_pairs(float* y, rs_u64 total, int cg) {
    __shared__ __align__(16) float xs[RS_NV_XS];
    __shared__ __align__(16) float ws[RS_NV_WS];
    for (int i = threadIdx.x; i < RS_NV_XS; i += 256) xs[i] = (float)(i % 97) * 0.01f;
    for (int i = threadIdx.x; i < RS_NV_WS; i += 256) ws[i] = (float)(i % 89) * 0.01f;
    __syncthreads();
    const rs_u32 tid = threadIdx.x, tw = tid & 31u, th = (tid >> 5) & 1u, tk = tid >> 6;
    const rs_u32* xb = reinterpret_cast<const rs_u32*>(xs) + ((tw & 1u) ? 208u : 0u) + th * 17 + (tw >> 1);
    const float4* wb = reinterpret_cast<const float4*>(ws) + tk * 7;
    float acc = 0.0f;
    int s = 0;
    for (int c = 0; c < cg; ++c) {
        const rs_u32* xp = xb + s * 416;
        const float4* wp = wb + s * 28;
        if (++s == 14) s = 0;
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
                const rs_u32 p0 = xp[(kd * 4 + kh) * 17], p1 = xp[(kd * 4 + kh) * 17 + 1];
                const float* wr = wv + (kd * 3 + kh) * 3;
                acc = fmaf(__uint_as_float(p0 << 16), wr[0], acc);
                acc = fmaf(__uint_as_float(p0 & 0xffff0000u), wr[1], acc);
                acc = fmaf(__uint_as_float(p1 << 16), wr[2], acc);
            }
    }
    const rs_u64 i = (rs_u64)blockIdx.x * 256 + tid;
    if (i < total) y[i] = acc;
}

// The input operands alone: 27 shared-memory reads + 27 FMAs per channel,
// the weights loaded once (registers): the bound of any kernel that feeds
// one thread's 3456 input operands through shared memory (or L1).
__global__ void __launch_bounds__(256) nv_floor_lds_x(float* y, rs_u64 total, int cg) {
    __shared__ __align__(16) float xs[RS_NV_XS];
    for (int i = threadIdx.x; i < RS_NV_XS; i += 256) xs[i] = (float)(i % 97) * 0.01f;
    __syncthreads();
    const rs_u32 tid = threadIdx.x, tw = tid & 31u, th = (tid >> 5) & 1u;
    const float* xb = xs + th * 34 + tw;
    float wv[27];
#pragma unroll
    for (int q = 0; q < 27; ++q) wv[q] = xs[(tid + q * 37) % RS_NV_XS];
    float acc = 0.0f;
    int s = 0;
    for (int c = 0; c < cg; ++c) {
        const float* xp = xb + s * 408;
        if (++s == 15) s = 0;
#pragma unroll
        for (int kd = 0; kd < 3; ++kd)
#pragma unroll
            for (int kh = 0; kh < 3; ++kh)
#pragma unroll
                for (int kw = 0; kw < 3; ++kw)
                    acc = fmaf(xp[(kd * 4 + kh) * 34 + kw], wv[(kd * 3 + kh) * 3 + kw], acc);
    }
    const rs_u64 i = (rs_u64)blockIdx.x * 256 + tid;
    if (i < total) y[i] = acc;
}

// The direct loop's instruction mix with every load an L1 hit: input reads
// coalesced from a 24 KiB buffer, weight reads warp-uniform scalar loads
// from a 3.5 KiB buffer (both global memory), 54 loads per 27 FMAs.
__global__ void __launch_bounds__(256)
    nv_floor_l1(const float* xsmall, const float* wsmall, float* y, rs_u64 total, int cg) {
    const rs_u32 tid = threadIdx.x, tw = tid & 31u, th = (tid >> 5) & 1u, tk = tid >> 6;
    const float* xb = xsmall + th * 34 + tw;
    const float* wb = wsmall + ((rs_u32)blockIdx.x & 7u) * 4 * 28 + tk * 28;
    float acc = 0.0f;
    int s = 0;
    for (int c = 0; c < cg; ++c) {
        const float* xp = xb + s * 408;
        if (++s == 15) s = 0;
#pragma unroll
        for (int kd = 0; kd < 3; ++kd)
#pragma unroll
            for (int kh = 0; kh < 3; ++kh)
#pragma unroll
                for (int kw = 0; kw < 3; ++kw)
                    acc = fmaf(__ldg(xp + (kd * 4 + kh) * 34 + kw),
                               __ldg(wb + (kd * 3 + kh) * 3 + kw), acc);
        wb += 4;
        if (s == 0) wb -= 60;
    }
    const rs_u64 i = (rs_u64)blockIdx.x * 256 + tid;
    if (i < total) y[i] = acc;
}

// The direct loop's mapping and addresses (real input, real weights,
// consecutive threads = consecutive ow of one k) without bounds checks or
// index arithmetic in the loop (taps clamped inside the input): the memory
// system's cost of the direct loop.
__global__ void __launch_bounds__(256)
    nv_floor_ldg(const float* x, const float* w, float* y, rs_conv3d_args a) {
    const rs_u64 total = a.n * a.k * a.od * a.oh * a.ow;
    const rs_u64 i = (rs_u64)blockIdx.x * 256 + threadIdx.x;
    if (i >= total) return;
    rs_u64 t = i;
    const rs_u64 ow = t % a.ow;
    t /= a.ow;
    const rs_u64 oh = t % a.oh;
    t /= a.oh;
    const rs_u64 od = t % a.od;
    const rs_u64 k = (t / a.od) % a.k;
    const rs_u64 hw = a.h * a.w, dhw = a.d * hw;
    const rs_u64 zc = od < a.d - 3 ? od : a.d - 3, yc = oh < a.h - 3 ? oh : a.h - 3;
    const rs_u64 xc = ow < a.w - 3 ? ow : a.w - 3;
    const float* xp = x + zc * hw + yc * a.w + xc;
    const float* wp = w + k * a.c * 27;
    float acc = 0.0f;
    for (rs_u64 c = 0; c < a.c; ++c, xp += dhw, wp += 27) {
#pragma unroll
        for (int kd = 0; kd < 3; ++kd)
#pragma unroll
            for (int kh = 0; kh < 3; ++kh)
#pragma unroll
                for (int kw = 0; kw < 3; ++kw)
                    acc = fmaf(xp[kd * hw + kh * a.w + kw], wp[(kd * 3 + kh) * 3 + kw], acc);
    }
    y[i] = acc;
}

// ---------------------------------------------------------------- driver
static unsigned short f2bf(float f) {
    unsigned u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (unsigned short)(u >> 16);
}
static float bf2f(unsigned short b) {
    unsigned u = ((unsigned)b) << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

struct Case {
    int n, c, d, h, w, k, kd, kh, kw, sd, sh, sw, pd, ph, pw, dd, dh, dw, g, bias;
};

typedef void (*KF32)(const float*, const float*, const float*, float*, rs_conv3d_args);
typedef void (*KBF16)(const rs_u16*, const rs_u16*, const float*, float*, rs_conv3d_args);

struct Variant {
    const char* name;
    KF32 f32;
    KBF16 bf16;
};

#define STAGED_P(TK, TD, TH, TW, FAST, PAIRS, XS, WS, MINB)                                 \
    nv_staged<float, TK, TD, TH, TW, FAST, PAIRS, XS, WS, MINB>,                             \
        nv_staged<rs_u16, TK, TD, TH, TW, FAST, PAIRS, XS, WS, MINB>
#define STAGED(TK, TD, TH, TW, FAST, XS, WS, MINB) STAGED_P(TK, TD, TH, TW, FAST, true, XS, WS, MINB)

static const Variant VARIANTS[] = {
    {"crate naive", conv3d_naive_f32, conv3d_naive_bf16},
    {"direct", nv_direct<float>, nv_direct<rs_u16>},
    {"k4h2", STAGED(4, 1, 2, 32, true, 6144, 2048, 1)},
    {"k4h2 generic", STAGED(4, 1, 2, 32, false, 6144, 2048, 1)},
    {"k4h2 nopairs", STAGED_P(4, 1, 2, 32, true, false, 6144, 2048, 1)},
    {"k4h2 16k", STAGED(4, 1, 2, 32, true, 3072, 1024, 1)},
    {"k4h2 48k", STAGED(4, 1, 2, 32, true, 9216, 3072, 1)},
    {"k4h2 lb4", STAGED(4, 1, 2, 32, true, 6144, 2048, 4)},
    {"k4h2 lb6", STAGED(4, 1, 2, 32, true, 6144, 2048, 6)},
    {"k4h2 16k lb6", STAGED(4, 1, 2, 32, true, 3072, 1024, 6)},
    {"k8h1", STAGED(8, 1, 1, 32, true, 6144, 2048, 1)},
    {"k2h4", STAGED(2, 1, 4, 32, true, 6144, 2048, 1)},
    {"k1h8", STAGED(1, 1, 8, 32, true, 6144, 2048, 1)},
    {"k4d2h1", STAGED(4, 2, 1, 32, true, 6144, 2048, 1)},
    {"k4h8w8", STAGED(4, 1, 8, 8, true, 6144, 2048, 1)},
    {"k1d4h8w8", STAGED(1, 4, 8, 8, true, 6144, 2048, 1)},
};
static const int NVAR = sizeof(VARIANTS) / sizeof(VARIANTS[0]);

static int g_bad = 0;

static rs_conv3d_args make_args(const Case& cs) {
    rs_conv3d_args a;
    a.n = cs.n; a.c = cs.c; a.d = cs.d; a.h = cs.h; a.w = cs.w;
    a.k = cs.k; a.kd = cs.kd; a.kh = cs.kh; a.kw = cs.kw;
    a.sd = cs.sd; a.sh = cs.sh; a.sw = cs.sw;
    a.pd = cs.pd; a.ph = cs.ph; a.pw = cs.pw;
    a.dd = cs.dd; a.dh = cs.dh; a.dw = cs.dw;
    a.groups = cs.g; a.has_bias = cs.bias;
    a.od = (cs.d + 2 * cs.pd - cs.dd * (cs.kd - 1) - 1) / cs.sd + 1;
    a.oh = (cs.h + 2 * cs.ph - cs.dh * (cs.kh - 1) - 1) / cs.sh + 1;
    a.ow = (cs.w + 2 * cs.pw - cs.dw * (cs.kw - 1) - 1) / cs.sw + 1;
    return a;
}

static void run(const Case& cs, bool timeit) {
    const rs_conv3d_args a = make_args(cs);
    const size_t nx = (size_t)a.n * a.c * a.d * a.h * a.w, cg = a.c / a.groups,
                 kg = a.k / a.groups, kvol = a.kd * a.kh * a.kw, R = cg * kvol;
    const size_t nw = (size_t)a.k * R, osp = a.od * a.oh * a.ow, ny = (size_t)a.n * a.k * osp;
    std::vector<unsigned short> xb(nx), wb(nw);
    std::vector<float> xf(nx), wf(nw), bias(a.k);
    srand(1);
    for (size_t i = 0; i < nx; i++) {
        xb[i] = f2bf((rand() / (float)RAND_MAX) * 2 - 1);
        xf[i] = bf2f(xb[i]);
    }
    for (size_t i = 0; i < nw; i++) {
        wb[i] = f2bf((rand() / (float)RAND_MAX) * 2 - 1);
        wf[i] = bf2f(wb[i]);
    }
    for (int i = 0; i < cs.k; i++) bias[i] = i * 0.25f - 1;
    void *dxf, *dxb, *dwf, *dwb, *db, *dy;
    CK(cudaMalloc(&dxf, nx * 4));
    CK(cudaMalloc(&dxb, nx * 2));
    CK(cudaMalloc(&dwf, nw * 4));
    CK(cudaMalloc(&dwb, nw * 2));
    CK(cudaMalloc(&db, a.k * 4));
    CK(cudaMalloc(&dy, ny * 4));
    CK(cudaMemcpy(dxf, xf.data(), nx * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dxb, xb.data(), nx * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwf, wf.data(), nw * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwb, wb.data(), nw * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, bias.data(), a.k * 4, cudaMemcpyHostToDevice));
    // CPU reference (double): every point of small cases, 2000 samples of big ones.
    std::vector<size_t> samples;
    if (ny < 20000) {
        for (size_t i = 0; i < ny; i++) samples.push_back(i);
    } else {
        for (size_t i = 0; i < 2000; i++)
            samples.push_back(((size_t)rand() * 7919ull + i * 104729ull) % ny);
    }
    std::vector<double> ref(samples.size());
    for (size_t si = 0; si < samples.size(); si++) {
        size_t i = samples[si], t = i;
        size_t ow = t % a.ow; t /= a.ow;
        size_t oh = t % a.oh; t /= a.oh;
        size_t od = t % a.od; t /= a.od;
        size_t k = t % a.k, n = t / a.k, g = k / kg;
        double acc = a.has_bias ? bias[k] : 0;
        for (size_t ci = 0; ci < cg; ci++)
            for (size_t zd = 0; zd < a.kd; zd++)
                for (size_t yh = 0; yh < a.kh; yh++)
                    for (size_t xw = 0; xw < a.kw; xw++) {
                        long z = (long)(od * a.sd) - (long)a.pd + (long)(zd * a.dd);
                        long yy = (long)(oh * a.sh) - (long)a.ph + (long)(yh * a.dh);
                        long xx = (long)(ow * a.sw) - (long)a.pw + (long)(xw * a.dw);
                        if (z < 0 || z >= (long)a.d || yy < 0 || yy >= (long)a.h || xx < 0 ||
                            xx >= (long)a.w)
                            continue;
                        acc += (double)xf[(((n * a.c + g * cg + ci) * a.d + z) * a.h + yy) * a.w + xx] *
                               (double)wf[(k * cg + ci) * kvol + (zd * a.kh + yh) * a.kw + xw];
                    }
        ref[si] = acc;
    }
    std::vector<float> y(ny);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // The crate's grid: ceil(total / 256) blocks (at most 2^20), 256 threads.
    const unsigned blocks = (unsigned)std::max<size_t>(1, std::min<size_t>((ny + 255) / 256, 1u << 20));
    auto check = [&](const char* name, const char* dt, float ms, bool checked) {
        double maxerr = 0, maxref = 1e-30;
        bool nan = false;
        CK(cudaMemcpy(y.data(), dy, ny * 4, cudaMemcpyDeviceToHost));
        for (size_t si = 0; si < samples.size(); si++) {
            double d = fabs(y[samples[si]] - ref[si]);
            if (!(d == d)) nan = true;
            if (d > maxerr) maxerr = d;
            if (fabs(ref[si]) > maxref) maxref = fabs(ref[si]);
        }
        const bool ok = !nan && maxerr <= 1e-4 * maxref;
        if (checked && !ok) g_bad++;
        printf("  %-14s %-4s max abs err %-9.3g (max |ref| %-7.3g) %-4s", name, dt, maxerr, maxref,
               checked ? (ok ? "ok" : "BAD") : "-");
        if (timeit) printf("  %8.3f ms", ms);
        printf("\n");
    };
    for (int v = 0; v < NVAR; v++) {
        for (int dt = 0; dt < 2; dt++) {
            auto launch = [&]() {
                if (dt == 0)
                    VARIANTS[v].f32<<<blocks, 256>>>((float*)dxf, (float*)dwf, (float*)db, (float*)dy, a);
                else
                    VARIANTS[v].bf16<<<blocks, 256>>>((rs_u16*)dxb, (rs_u16*)dwb, (float*)db, (float*)dy, a);
            };
            CK(cudaMemset(dy, 0xff, ny * 4));
            launch();
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            float ms = 0;
            if (timeit) {
                // Checked after timing too: the timed launches rewrite y.
                launch();
                CK(cudaEventRecord(e0));
                for (int r = 0; r < 5; r++) launch();
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaEventElapsedTime(&ms, e0, e1));
                ms /= 5;
            }
            check(VARIANTS[v].name, dt == 0 ? "f32" : "bf16", ms, true);
        }
    }
    if (timeit) {
        // Floors: same grid, bench case only; their outputs are not checked.
        float *dxs, *dws;
        CK(cudaMalloc(&dxs, 6144 * 4));
        CK(cudaMalloc(&dws, 8 * 4 * 28 * 4 + 64 * 4));
        CK(cudaMemcpy(dxs, xf.data(), 6144 * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dws, wf.data(), (8 * 4 * 28 + 64) * 4, cudaMemcpyHostToDevice));
        for (int f = 0; f < 5; f++) {
            const char* names[] = {"floor lds", "floor lds_x", "floor l1", "floor ldg",
                                   "floor pairs"};
            auto launch = [&]() {
                if (f == 0) nv_floor_lds<<<blocks, 256>>>((float*)dy, ny, (int)cg);
                else if (f == 1) nv_floor_lds_x<<<blocks, 256>>>((float*)dy, ny, (int)cg);
                else if (f == 2) nv_floor_l1<<<blocks, 256>>>(dxs, dws, (float*)dy, ny, (int)cg);
                else if (f == 3) nv_floor_ldg<<<blocks, 256>>>((float*)dxf, (float*)dwf, (float*)dy, a);
                else nv_floor_lds_pairs<<<blocks, 256>>>((float*)dy, ny, (int)cg);
            };
            launch();
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaEventRecord(e0));
            for (int r = 0; r < 5; r++) launch();
            CK(cudaEventRecord(e1));
            CK(cudaEventSynchronize(e1));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            check(names[f], "f32", ms / 5, false);
        }
        cudaFree(dxs);
        cudaFree(dws);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(dxf); cudaFree(dxb); cudaFree(dwf); cudaFree(dwb); cudaFree(db); cudaFree(dy);
}

// Registers and resident blocks per SM of each kernel.
static void print_resources() {
    printf("kernel resources (f32 / bf16): registers, blocks per SM\n");
    for (int v = 0; v < NVAR; v++) {
        cudaFuncAttributes fa, fb;
        int ba = 0, bb = 0;
        CK(cudaFuncGetAttributes(&fa, (const void*)VARIANTS[v].f32));
        CK(cudaFuncGetAttributes(&fb, (const void*)VARIANTS[v].bf16));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ba, (const void*)VARIANTS[v].f32, 256, 0));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bb, (const void*)VARIANTS[v].bf16, 256, 0));
        printf("  %-14s %3d regs %d blocks / %3d regs %d blocks, %zu B shared\n", VARIANTS[v].name,
               fa.numRegs, ba, fb.numRegs, bb, fa.sharedSizeBytes);
    }
}

int main() {
    print_resources();
    const Case cases[] = {
        // The conv3d harness's five.
        {2, 12, 5, 7, 9, 9, 2, 3, 1, 1, 2, 1, 1, 0, 2, 2, 1, 1, 3, 1},
        {1, 3, 4, 5, 6, 5, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 0},
        {2, 8, 6, 6, 6, 8, 3, 3, 3, 2, 2, 2, 1, 1, 1, 1, 1, 1, 8, 1},
        {1, 16, 3, 17, 33, 200, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1},
        {1, 64, 8, 64, 64, 64, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0},
        // k3 p1 with partial tiles everywhere (k 7 of 4, ow 45 of 32, ...), bias.
        {2, 5, 7, 13, 45, 7, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},
        // Depthwise (groups = channels = outputs) and depthwise x2.
        {1, 6, 5, 9, 37, 6, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 6, 1},
        {1, 8, 4, 6, 35, 16, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 8, 0},
        // Dilation 9: the region does not fit shared memory (direct loop).
        {1, 3, 12, 12, 40, 4, 3, 3, 3, 1, 1, 1, 9, 9, 9, 9, 9, 9, 1, 1},
        // 5x5x5 with strides 1, 2, 3; mixed kernel 1x2x3, strides, dilations.
        {1, 4, 7, 9, 40, 5, 5, 5, 5, 1, 2, 3, 2, 2, 2, 1, 1, 1, 1, 1},
        {1, 2, 5, 6, 7, 9, 1, 2, 3, 2, 1, 2, 0, 1, 3, 1, 3, 1, 1, 1},
        // Many channels (several slices), narrow w (8-wide tiles).
        {1, 40, 4, 9, 8, 9, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0},
    };
    for (const Case& c : cases) {
        printf("case n%d c%d %dx%dx%d k%d %dx%dx%d s%d%d%d p%d%d%d d%d%d%d g%d bias%d\n", c.n, c.c,
               c.d, c.h, c.w, c.k, c.kd, c.kh, c.kw, c.sd, c.sh, c.sw, c.pd, c.ph, c.pw, c.dd, c.dh,
               c.dw, c.g, c.bias);
        run(c, false);
    }
    const Case big = {1, 128, 9, 128, 128, 128, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0};
    printf("bench 1x128x9x128x128, 128 out, k3 p1 (18.9 M points x 3456 MACs)\n");
    run(big, true);
    printf(g_bad ? "FAILED: %d variant runs outside tolerance\n" : "all variants within tolerance\n",
           g_bad);
    return g_bad != 0;
}
