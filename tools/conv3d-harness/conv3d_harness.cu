// Standalone check + timing of the conv3d kernels (lead's dev harness).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <cmath>
#include <cuda_runtime.h>
#include "conv3d.hip"

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

static unsigned short f2bf(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (unsigned short)(u >> 16); }
static float bf2f(unsigned short b) { unsigned u = ((unsigned)b) << 16; float f; memcpy(&f, &u, 4); return f; }

struct Case { int n,c,d,h,w,k,kd,kh,kw,sd,sh,sw,pd,ph,pw,dd,dh,dw,g,bias; };

static void run(const Case& cs, bool timeit) {
    rs_conv3d_args a;
    a.n=cs.n;a.c=cs.c;a.d=cs.d;a.h=cs.h;a.w=cs.w;a.k=cs.k;a.kd=cs.kd;a.kh=cs.kh;a.kw=cs.kw;
    a.sd=cs.sd;a.sh=cs.sh;a.sw=cs.sw;a.pd=cs.pd;a.ph=cs.ph;a.pw=cs.pw;a.dd=cs.dd;a.dh=cs.dh;a.dw=cs.dw;a.groups=cs.g;a.has_bias=cs.bias;
    a.od=(cs.d+2*cs.pd-cs.dd*(cs.kd-1)-1)/cs.sd+1; a.oh=(cs.h+2*cs.ph-cs.dh*(cs.kh-1)-1)/cs.sh+1; a.ow=(cs.w+2*cs.pw-cs.dw*(cs.kw-1)-1)/cs.sw+1;
    size_t nx=(size_t)a.n*a.c*a.d*a.h*a.w, cg=a.c/a.groups, kg=a.k/a.groups, kvol=a.kd*a.kh*a.kw, R=cg*kvol;
    size_t nw=(size_t)a.k*R, osp=a.od*a.oh*a.ow, ny=(size_t)a.n*a.k*osp, P=(size_t)a.n*osp;
    std::vector<unsigned short> xb(nx), wb(nw); std::vector<float> xf(nx), wf(nw), bias(a.k);
    srand(1);
    for (size_t i=0;i<nx;i++){ xb[i]=f2bf((rand()/(float)RAND_MAX)*2-1); xf[i]=bf2f(xb[i]); }
    for (size_t i=0;i<nw;i++){ wb[i]=f2bf((rand()/(float)RAND_MAX)*2-1); wf[i]=bf2f(wb[i]); }
    for (int i=0;i<cs.k;i++) bias[i]=i*0.25f-1;
    // transposed per group for the scalar tiled kernel: wt[g][r][m]
    std::vector<float> wtf(nw); std::vector<unsigned short> wtb(nw);
    for (size_t g=0; g<a.groups; g++) for (size_t m=0;m<kg;m++) for (size_t r=0;r<R;r++) { wtf[g*R*kg + r*kg + m] = wf[(g*kg+m)*R + r]; wtb[g*R*kg + r*kg + m] = wb[(g*kg+m)*R + r]; }
    size_t mp=(kg+127)/128*128, rp=(R+31)/32*32;
    std::vector<unsigned short> wpk((size_t)a.groups*mp*rp, 0);
    for (size_t g=0; g<a.groups; g++) for (size_t m=0;m<kg;m++) for (size_t r=0;r<R;r++) wpk[(g*mp+m)*rp + r] = wb[(g*kg+m)*R + r];
    void *dxf,*dxb,*dwf,*dwb,*dwtf,*dwtb,*dwp,*db,*dy; 
    CK(cudaMalloc(&dxf,nx*4));CK(cudaMalloc(&dxb,nx*2));CK(cudaMalloc(&dwf,nw*4));CK(cudaMalloc(&dwb,nw*2));
    CK(cudaMalloc(&dwtf,nw*4));CK(cudaMalloc(&dwtb,nw*2));CK(cudaMalloc(&dwp,wpk.size()*2));CK(cudaMalloc(&db,a.k*4));CK(cudaMalloc(&dy,ny*4));
    CK(cudaMemcpy(dxf,xf.data(),nx*4,cudaMemcpyHostToDevice));CK(cudaMemcpy(dxb,xb.data(),nx*2,cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwf,wf.data(),nw*4,cudaMemcpyHostToDevice));CK(cudaMemcpy(dwb,wb.data(),nw*2,cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwtf,wtf.data(),nw*4,cudaMemcpyHostToDevice));CK(cudaMemcpy(dwtb,wtb.data(),nw*2,cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dwp,wpk.data(),wpk.size()*2,cudaMemcpyHostToDevice));CK(cudaMemcpy(db,bias.data(),a.k*4,cudaMemcpyHostToDevice));
    // CPU reference (double) on sampled points
    std::vector<size_t> samples; for (size_t i=0;i<2000 && ny;i++) samples.push_back(((size_t)rand()*7919ull + i*104729ull) % ny);
    if (ny && ny < 5000) { samples.clear(); for (size_t i=0;i<ny;i++) samples.push_back(i); }
    std::vector<double> ref(samples.size());
    for (size_t si=0; si<samples.size(); si++) {
        size_t i=samples[si], t=i; size_t ow=t%a.ow; t/=a.ow; size_t oh=t%a.oh; t/=a.oh; size_t od=t%a.od; t/=a.od; size_t k=t%a.k, n=t/a.k, g=k/kg;
        double acc = a.has_bias ? bias[k] : 0;
        for (size_t ci=0; ci<cg; ci++) for (size_t zd=0; zd<a.kd; zd++) for (size_t yh=0; yh<a.kh; yh++) for (size_t xw=0; xw<a.kw; xw++) {
            long z=(long)(od*a.sd)-(long)a.pd+(long)(zd*a.dd), yy=(long)(oh*a.sh)-(long)a.ph+(long)(yh*a.dh), xx=(long)(ow*a.sw)-(long)a.pw+(long)(xw*a.dw);
            if (z<0||z>=(long)a.d||yy<0||yy>=(long)a.h||xx<0||xx>=(long)a.w) continue;
            acc += (double)xf[(((n*a.c + g*cg + ci)*a.d + z)*a.h + yy)*a.w + xx] * (double)wf[(k*cg+ci)*kvol + (zd*a.kh+yh)*a.kw + xw];
        }
        ref[si]=acc;
    }
    std::vector<float> y(ny);
    cudaEvent_t e0,e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int which=0; which<5; which++) {
        const char* name[]={"naive_f32","naive_bf16","tiled_f32","tiled_bf16","tiled_bf16_mma"};
        auto launch=[&](){
            if (which<2) { int blocks=(int)std::min<size_t>((ny+255)/256, 132*32); if(blocks<1)blocks=1;
                if(which==0) conv3d_naive_f32<<<blocks,256>>>((float*)dxf,(float*)dwf,(float*)db,(float*)dy,a);
                else conv3d_naive_bf16<<<blocks,256>>>((rs_u16*)dxb,(rs_u16*)dwb,(float*)db,(float*)dy,a); }
            else if (which<4) { dim3 gr((P+127)/128,(kg%96==0)?kg/96:(kg+127)/128,a.groups);
                if(which==2) conv3d_tiled_f32<<<gr,256>>>((float*)dxf,(float*)dwtf,(float*)db,(float*)dy,a);
                else conv3d_tiled_bf16<<<gr,256>>>((rs_u16*)dxb,(rs_u16*)dwtb,(float*)db,(float*)dy,a); }
            else { dim3 gr((P+127)/128,(kg%96==0&&kg%128!=0)?kg/96:mp/128,a.groups); conv3d_tiled_bf16_mma<<<gr,256>>>((rs_u16*)dxb,(rs_u16*)dwp,(float*)db,(float*)dy,a,rp,mp); }
        };
        CK(cudaMemset(dy,0xff,ny*4)); launch(); CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(y.data(),dy,ny*4,cudaMemcpyDeviceToHost));
        double maxerr=0, maxref=1e-30; bool nan=false;
        for (size_t si=0; si<samples.size(); si++){ double d=fabs(y[samples[si]]-ref[si]); if(!(d==d)) nan=true; if(d>maxerr)maxerr=d; if(fabs(ref[si])>maxref)maxref=fabs(ref[si]); }
        float ms=0;
        if (timeit) { launch(); cudaEventRecord(e0); for(int r=0;r<5;r++) launch(); cudaEventRecord(e1); CK(cudaEventSynchronize(e1)); cudaEventElapsedTime(&ms,e0,e1); ms/=5; }
        printf("  %-15s max abs err %.3g (max |ref| %.3g)%s  %s %.3f ms\n", name[which], maxerr, maxref, nan?" NaN!":"", timeit?"time":"", ms);
    }
    cudaFree(dxf);cudaFree(dxb);cudaFree(dwf);cudaFree(dwb);cudaFree(dwtf);cudaFree(dwtb);cudaFree(dwp);cudaFree(db);cudaFree(dy);
}

int main() {
    Case cases[] = {
        {2,12,5,7,9, 9,2,3,1, 1,2,1, 1,0,2, 2,1,1, 3,1},
        {1,3,4,5,6, 5,1,1,1, 1,1,1, 0,0,0, 1,1,1, 1,0},
        {2,8,6,6,6, 8,3,3,3, 2,2,2, 1,1,1, 1,1,1, 8,1},
        {1,16,3,17,33, 200,3,3,3, 1,1,1, 1,1,1, 1,2,1, 1,1},
        {1,64,8,64,64, 64,3,3,3, 1,1,1, 1,1,1, 1,1,1, 1,0},
        {1,5,6,7,8, 9,4,4,5, 1,1,1, 1,2,2, 1,1,1, 1,1},
        {1,32,5,9,70, 40,3,3,3, 1,1,1, 0,1,1, 1,1,1, 1,1},
        {2,16,3,6,20, 192,3,3,3, 1,1,1, 1,1,1, 1,1,1, 2,1},
        {1,8,4,5,37, 288,3,3,3, 1,1,1, 1,1,1, 1,1,1, 1,0},
    };
    for (auto& c : cases) { printf("case n%d c%d %dx%dx%d k%d %dx%dx%d g%d\n", c.n,c.c,c.d,c.h,c.w,c.k,c.kd,c.kh,c.kw,c.g); run(c, false); }
    Case big = {1,128,9,128,128, 128,3,3,3, 1,1,1, 1,1,1, 1,1,1, 1,0};
    printf("bench 1x128x9x128x128, 128 out, k3 p1\n"); run(big, true);
    return 0;
}
