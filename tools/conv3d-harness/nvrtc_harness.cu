// Times conv3d_tiled_bf16_mma compiled by NVRTC (as the Rust cuda backend does) with various options.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>
#include <fstream>
#include <sstream>
#include <cuda.h>
#include <nvrtc.h>
#include <cuda_runtime.h>
#include "conv3d.hip"
#define CK(x) do { auto e = (x); if (e) { printf("error %d at %d\n", (int)e, __LINE__); exit(1);} } while (0)
static std::string slurp(const char* p) { std::ifstream f(p); std::stringstream s; s << f.rdbuf(); return s.str(); }
int main() {
    std::string src = slurp("prelude.h");
    std::string c3 = slurp("conv3d.hip");
    size_t at = c3.find("#include \"prelude.h\""); c3.replace(at, strlen("#include \"prelude.h\""), "");
    size_t po = src.find("#pragma once"); src.replace(po, 12, "");
    src += c3;
    rs_conv3d_args a; memset(&a, 0, sizeof a);
    a.n=1;a.c=128;a.d=9;a.h=128;a.w=128;a.k=128;a.kd=a.kh=a.kw=3;a.od=9;a.oh=128;a.ow=128;a.sd=a.sh=a.sw=1;a.pd=a.ph=a.pw=1;a.dd=a.dh=a.dw=1;a.groups=1;a.has_bias=1;
    size_t nx=128ull*9*128*128, R=128*27, rp=R, mp=128, ny=128ull*9*128*128, P=9ull*128*128;
    void *dx,*dw,*db,*dy; cudaMalloc(&dx,nx*2); cudaMalloc(&dw,mp*rp*2); cudaMalloc(&db,512); cudaMalloc(&dy,ny*4);
    std::vector<unsigned short> hx(nx); for (size_t i=0;i<nx;i++) hx[i]=0x3f80 ^ (i*2654435761u & 0x00ff);
    cudaMemcpy(dx,hx.data(),nx*2,cudaMemcpyHostToDevice); cudaMemset(dw,0x3c,mp*rp*2); cudaMemset(db,0,512);
    const char* sets[][4] = {
        {"--gpu-architecture=sm_90","-default-device",0,0},
        {"--gpu-architecture=compute_90","-default-device",0,0},
        {"--gpu-architecture=sm_90","-default-device","--extra-device-vectorization",0},
        {"--gpu-architecture=sm_90a","-default-device",0,0},
    };
    for (auto& set : sets) {
        std::vector<const char*> opts; for (int i=0;i<4;i++) if (set[i]) opts.push_back(set[i]);
        nvrtcProgram prog; CK(nvrtcCreateProgram(&prog, src.c_str(), "k.cu", 0, 0, 0));
        nvrtcResult r = nvrtcCompileProgram(prog, opts.size(), opts.data());
        if (r) { size_t n; nvrtcGetProgramLogSize(prog,&n); std::string l(n,0); nvrtcGetProgramLog(prog,&l[0]); printf("compile failed %s\n", l.c_str()); continue; }
        size_t n; nvrtcGetPTXSize(prog,&n); std::string ptx(n,0); nvrtcGetPTX(prog,&ptx[0]);
        CUmodule m; CK(cuModuleLoadData(&m, ptx.c_str())); CUfunction f; CK(cuModuleGetFunction(&f, m, "conv3d_tiled_bf16_mma"));
        int regs=0; cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f);
        void* args[] = {&dx,&dw,&db,&dy,&a,&rp,&mp};
        auto launch=[&](){ CK(cuLaunchKernel(f,(P+127)/128,1,1,256,1,1,0,0,args,0)); };
        launch(); cudaDeviceSynchronize();
        cudaEvent_t e0,e1; cudaEventCreate(&e0); cudaEventCreate(&e1); cudaEventRecord(e0); for(int i=0;i<10;i++) launch(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms,e0,e1);
        printf("nvrtc %s %s %s: %d regs, %.3f ms\n", set[0], set[1], set[2]?set[2]:"", regs, ms/10);
        cuModuleUnload(m); nvrtcDestroyProgram(&prog);
    }
    // nvcc-compiled same kernel
    cudaEvent_t e0,e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    dim3 gr((P+127)/128,1,1); conv3d_tiled_bf16_mma<<<gr,256>>>((rs_u16*)dx,(rs_u16*)dw,(float*)db,(float*)dy,a,rp,mp); cudaDeviceSynchronize();
    cudaEventRecord(e0); for(int i=0;i<10;i++) conv3d_tiled_bf16_mma<<<gr,256>>>((rs_u16*)dx,(rs_u16*)dw,(float*)db,(float*)dy,a,rp,mp); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms,e0,e1);
    cudaFuncAttributes at2; cudaFuncGetAttributes(&at2, conv3d_tiled_bf16_mma);
    printf("nvcc: %d regs, %.3f ms\n", at2.numRegs, ms/10);
    return 0;
}
