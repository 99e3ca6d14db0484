// The Wan 2.1 VAE decoder's largest conv3d layers through the tiled kernels
// (conv3d_tiled_f32, conv3d_tiled_bf16_mma; conv3d_tiled_bf16 with -DSIMT_BF16),
// built two ways: by nvcc (this file includes kernels/conv3d.hip) and by
// NVRTC with the cuda backend's options (--gpu-architecture=compute_90
// -default-device) from the same sources, flattened as build.rs does. Each
// kernel is checked on 2048 sampled output points against a double CPU
// reference (error over the point's magnitude sum |x * w| + |bias|: f32
// accumulation stays near 1e-7; `BAD` over 1e-5), then timed: median of
// 7 launches (CUDA events) after a warm-up. Exits non-zero on a bad point.
//
// Build (see README.md): nvcc -O3 -arch=sm_90 -I../../kernels -o wan
// wan_harness.cu -lnvrtc -lcuda; ./wan [SRC_DIR] (SRC_DIR: the kernel sources
// NVRTC compiles, default ../../kernels).
#include <cuda.h>
#include <cuda_runtime.h>
#include <nvrtc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "conv3d.hip"

#define CK(x)                                                                         \
    do {                                                                              \
        auto e_ = (x);                                                                \
        if (e_) {                                                                     \
            printf("error %d at line %d: %s\n", (int)e_, __LINE__, #x);               \
            exit(2);                                                                  \
        }                                                                             \
    } while (0)

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

// #include "file" inlined once each, #pragma once dropped (build.rs's flatten).
static void flatten(const std::string& dir, const std::string& name, std::vector<std::string>& seen,
                    std::string& out) {
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) return;
    seen.push_back(name);
    std::ifstream f(dir + "/" + name);
    if (!f) {
        printf("cannot read %s/%s\n", dir.c_str(), name.c_str());
        exit(2);
    }
    std::string line;
    while (std::getline(f, line)) {
        size_t s = line.find_first_not_of(" \t");
        std::string t = s == std::string::npos ? "" : line.substr(s);
        if (t == "#pragma once") continue;
        if (t.rfind("#include \"", 0) == 0) {
            flatten(dir, t.substr(10, t.size() - 11), seen, out);
            continue;
        }
        out += line + "\n";
    }
}

struct Shape {
    const char* name;
    int c, d, h, w, k, pd;  // input C x D x H x W, K out, time padding (k3, p_hw 1)
};

static unsigned long long g_rng = 88172645463325252ull;
static float frand() {  // uniform in [-1, 1)
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

static float median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int bad = 0;

int main(int argc, char** argv) {
    std::string dir = argc > 1 ? argv[1] : "../../kernels";
    std::string src;
    std::vector<std::string> seen;
    flatten(dir, "conv3d.hip", seen, src);
    nvrtcProgram prog;
    CK(nvrtcCreateProgram(&prog, src.c_str(), "conv3d.cu", 0, 0, 0));
    std::vector<const char*> opts = {"--gpu-architecture=compute_90", "-default-device"};
#if defined(RS_XP_FLAG)  // a -DRS_XP_... variant of the kernels: NVRTC builds it too
    opts.push_back("-D" RS_XP_FLAG);
#endif
    if (nvrtcCompileProgram(prog, (int)opts.size(), opts.data())) {
        size_t n;
        nvrtcGetProgramLogSize(prog, &n);
        std::string l(n, 0);
        nvrtcGetProgramLog(prog, &l[0]);
        printf("nvrtc failed:\n%s\n", l.c_str());
        return 2;
    }
    size_t pn;
    CK(nvrtcGetPTXSize(prog, &pn));
    std::string ptx(pn, 0);
    CK(nvrtcGetPTX(prog, &ptx[0]));
    CK(cudaFree(0));
    CUmodule mod;
    CK(cuModuleLoadData(&mod, ptx.c_str()));
    CUfunction rt_f32, rt_mma, rt_bf16;
    CK(cuModuleGetFunction(&rt_f32, mod, "conv3d_tiled_f32"));
    CK(cuModuleGetFunction(&rt_mma, mod, "conv3d_tiled_bf16_mma"));
    CK(cuModuleGetFunction(&rt_bf16, mod, "conv3d_tiled_bf16"));
    {
        int r1, r2;
        cuFuncGetAttribute(&r1, CU_FUNC_ATTRIBUTE_NUM_REGS, rt_f32);
        cuFuncGetAttribute(&r2, CU_FUNC_ATTRIBUTE_NUM_REGS, rt_mma);
        cudaFuncAttributes a1, a2;
        cudaFuncGetAttributes(&a1, conv3d_tiled_f32);
        cudaFuncGetAttributes(&a2, conv3d_tiled_bf16_mma);
        printf("regs: tiled_f32 nvcc %d nvrtc %d (smem %zu, local %zu); mma nvcc %d nvrtc %d (smem %zu, local %zu)\n",
               a1.numRegs, r1, a1.sharedSizeBytes, a1.localSizeBytes, a2.numRegs, r2,
               a2.sharedSizeBytes, a2.localSizeBytes);
    }

    const Shape shapes[] = {
        {"96->96 11x480x832", 96, 13, 480, 832, 96, 0},
        {"192->192 11x240x416", 192, 13, 240, 416, 192, 0},
        {"384->384 5x120x208", 384, 7, 120, 208, 384, 0},
        {"384->384 3x60x104 p1", 384, 3, 60, 104, 384, 1},
        {"128->128 9x128x128 p1", 128, 9, 128, 128, 128, 1},
    };
    printf("%-22s %-6s %-6s %10s %10s %9s\n", "shape", "kernel", "build", "median ms", "TFLOP/s", "err");
    for (const Shape& s : shapes) {
        rs_conv3d_args a;
        memset(&a, 0, sizeof a);
        a.n = 1, a.c = s.c, a.d = s.d, a.h = s.h, a.w = s.w, a.k = s.k, a.kd = a.kh = a.kw = 3;
        a.sd = a.sh = a.sw = 1, a.pd = s.pd, a.ph = a.pw = 1, a.dd = a.dh = a.dw = 1, a.groups = 1;
        a.has_bias = 1;
        a.od = a.d + 2 * a.pd - 2, a.oh = a.h, a.ow = a.w;
        const size_t nx = (size_t)a.c * a.d * a.h * a.w, kvol = 27, R = a.c * kvol, kg = a.k;
        const size_t nw = kg * R, osp = a.od * a.oh * a.ow, ny = kg * osp, P = osp;
        std::vector<unsigned short> xb(nx), wb(nw);
        std::vector<float> xf(nx), wf(nw), bias(a.k);
        for (size_t i = 0; i < nx; i++) xf[i] = bf2f(xb[i] = f2bf(frand()));
        for (size_t i = 0; i < nw; i++) wf[i] = bf2f(wb[i] = f2bf(frand() * 0.1f));
        for (size_t i = 0; i < a.k; i++) bias[i] = frand();
        std::vector<float> wtf(nw);
        std::vector<unsigned short> wtb(nw);
        for (size_t m = 0; m < kg; m++)
            for (size_t r = 0; r < R; r++) wtf[r * kg + m] = wf[m * R + r], wtb[r * kg + m] = wb[m * R + r];
        const size_t mp = (kg + 127) / 128 * 128, rp = (R + 31) / 32 * 32;
        std::vector<unsigned short> wpk(mp * rp, 0);
        for (size_t m = 0; m < kg; m++)
            for (size_t r = 0; r < R; r++) wpk[m * rp + r] = wb[m * R + r];
        void *dxf, *dxb, *dwtf, *dwtb, *dwp, *db, *dy;
        CK(cudaMalloc(&dxf, nx * 4));
        CK(cudaMalloc(&dxb, nx * 2));
        CK(cudaMalloc(&dwtf, nw * 4));
        CK(cudaMalloc(&dwtb, nw * 2));
        CK(cudaMalloc(&dwp, wpk.size() * 2));
        CK(cudaMalloc(&db, a.k * 4));
        CK(cudaMalloc(&dy, ny * 4));
        CK(cudaMemcpy(dxf, xf.data(), nx * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dxb, xb.data(), nx * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwtf, wtf.data(), nw * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwtb, wtb.data(), nw * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dwp, wpk.data(), wpk.size() * 2, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(db, bias.data(), a.k * 4, cudaMemcpyHostToDevice));
        // Sampled points (the borders included) and their double references.
        std::vector<size_t> smp;
        for (size_t i = 0; i < 2048; i++) {
            size_t v = (size_t)((g_rng = g_rng * 6364136223846793005ull + 1442695040888963407ull) >> 17) % ny;
            if (i % 8 == 0) {  // one in eight on a border row or column
                size_t k = v / osp, t = v % osp, ow = t % a.ow, oh = (t / a.ow) % a.oh, od = t / (a.ow * a.oh);
                if (i % 16 == 0) ow = (i / 16) % 2 ? 0 : a.ow - 1;
                else oh = (i / 16) % 2 ? 0 : a.oh - 1;
                v = k * osp + (od * a.oh + oh) * a.ow + ow;
            }
            smp.push_back(v);
        }
        std::vector<double> ref(smp.size()), mag(smp.size());
        for (size_t si = 0; si < smp.size(); si++) {
            size_t i = smp[si], k = i / osp, t = i % osp;
            long ow = t % a.ow, oh = (t / a.ow) % a.oh, od = t / (a.ow * a.oh);
            double acc = bias[k], m = fabs(bias[k]);
            for (size_t ci = 0; ci < a.c; ci++)
                for (long zd = 0; zd < 3; zd++)
                    for (long yh = 0; yh < 3; yh++)
                        for (long xw = 0; xw < 3; xw++) {
                            long z = od - (long)a.pd + zd, y = oh - 1 + yh, x = ow - 1 + xw;
                            if (z < 0 || z >= (long)a.d || y < 0 || y >= (long)a.h || x < 0 || x >= (long)a.w) continue;
                            double p = (double)xf[((ci * a.d + z) * a.h + y) * a.w + x] *
                                       (double)wf[(k * a.c + ci) * 27 + (zd * 3 + yh) * 3 + xw];
                            acc += p;
                            m += fabs(p);
                        }
            ref[si] = acc, mag[si] = m;
        }
        std::vector<float> y(ny);
        const double flop = 2.0 * kg * R * P;
        for (int which = 0; which < 6; which++) {
            const int kind = which / 2;  // 0 f32, 1 mma, 2 simt bf16
            const bool rt = which % 2;
#if !defined(SIMT_BF16)
            if (kind == 2) continue;
#endif
            const char* kname[] = {"f32", "mma", "bf16"};
            // rs_conv3d_tiled_bm96, rs_conv3d_mma_bm96
                        const bool bm96 = kg % 96 == 0 && (kind != 1 || kg % 128 != 0);
            dim3 gr((unsigned)((P + 127) / 128), (unsigned)(bm96 ? kg / 96 : (kg + 127) / 128), 1);
            unsigned long long rpv = rp, mpv = mp;
            void* wsrc = kind == 0 ? dwtf : kind == 1 ? dwp : dwtb;
            void* xsrc = kind == 0 ? dxf : dxb;
            void* args[] = {&xsrc, &wsrc, &db, &dy, &a, &rpv, &mpv};
            auto launch = [&]() {
                if (rt) {
                    CUfunction f = kind == 0 ? rt_f32 : kind == 1 ? rt_mma : rt_bf16;
                    CK(cuLaunchKernel(f, gr.x, gr.y, gr.z, 256, 1, 1, 0, 0, args, 0));
                } else if (kind == 0) {
                    conv3d_tiled_f32<<<gr, 256>>>((float*)dxf, (float*)dwtf, (float*)db, (float*)dy, a);
                } else if (kind == 1) {
                    conv3d_tiled_bf16_mma<<<gr, 256>>>((rs_u16*)dxb, (rs_u16*)dwp, (float*)db, (float*)dy, a, rp, mp);
                } else {
                    conv3d_tiled_bf16<<<gr, 256>>>((rs_u16*)dxb, (rs_u16*)dwtb, (float*)db, (float*)dy, a);
                }
            };
            CK(cudaMemset(dy, 0xff, ny * 4));
            launch();
            CK(cudaGetLastError());
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(y.data(), dy, ny * 4, cudaMemcpyDeviceToHost));
            double worst = 0;
            for (size_t si = 0; si < smp.size(); si++) {
                double e = fabs((double)y[smp[si]] - ref[si]) / (mag[si] + 1e-30);
                if (!(e == e)) e = 1e30;
                worst = std::max(worst, e);
            }
            const bool ok = worst < 1e-5;
            if (!ok) bad++;
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0);
            cudaEventCreate(&e1);
            std::vector<float> t;
            for (int r = 0; r < 7; r++) {
                cudaEventRecord(e0);
                launch();
                cudaEventRecord(e1);
                CK(cudaEventSynchronize(e1));
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                t.push_back(ms);
            }
            const float ms = median(t);
            printf("%-22s %-6s %-6s %10.3f %10.1f %9.2e %s\n", s.name, kname[kind], rt ? "nvrtc" : "nvcc", ms,
                   flop / ms * 1e-9, worst, ok ? "ok" : "BAD");
            fflush(stdout);
        }
        cudaFree(dxf), cudaFree(dxb), cudaFree(dwtf), cudaFree(dwtb), cudaFree(dwp), cudaFree(db), cudaFree(dy);
    }
    printf(bad ? "BAD: %d kernel runs off the reference\n" : "all ok\n", bad);
    return bad ? 1 : 0;
}
