// The naive conv3d kernels run on the CPU (cpu_shim.h: one std::thread per
// GPU thread, blocks one after another) against a double-precision
// reference on every point of small cases: checks the staged kernel's
// indexing, slicing, fallbacks and grid-stride without a GPU. Each case runs
// conv3d_naive_{f32,bf16} on the crate's grid, on 3 and 5 blocks
// (grid-stride over tiles), with 128-thread blocks (direct-loop fallback),
// and the direct loop itself.
#include "cpu_shim.h"
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include "conv3d.hip"

static unsigned short f2bf(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (unsigned short)(u >> 16); }
static float bf2f(unsigned short b) { unsigned u = ((unsigned)b) << 16; float f; memcpy(&f, &u, 4); return f; }
struct Case { int n,c,d,h,w,k,kd,kh,kw,sd,sh,sw,pd,ph,pw,dd,dh,dw,g,bias; };
int bad = 0;
static void run(const Case& cs) {
    rs_conv3d_args a;
    a.n=cs.n;a.c=cs.c;a.d=cs.d;a.h=cs.h;a.w=cs.w;a.k=cs.k;a.kd=cs.kd;a.kh=cs.kh;a.kw=cs.kw;
    a.sd=cs.sd;a.sh=cs.sh;a.sw=cs.sw;a.pd=cs.pd;a.ph=cs.ph;a.pw=cs.pw;a.dd=cs.dd;a.dh=cs.dh;a.dw=cs.dw;a.groups=cs.g;a.has_bias=cs.bias;
    a.od=(cs.d+2*cs.pd-cs.dd*(cs.kd-1)-1)/cs.sd+1; a.oh=(cs.h+2*cs.ph-cs.dh*(cs.kh-1)-1)/cs.sh+1; a.ow=(cs.w+2*cs.pw-cs.dw*(cs.kw-1)-1)/cs.sw+1;
    size_t nx=(size_t)a.n*a.c*a.d*a.h*a.w, cg=a.c/a.groups, kg=a.k/a.groups, kvol=a.kd*a.kh*a.kw, R=cg*kvol;
    size_t nw=(size_t)a.k*R, osp=a.od*a.oh*a.ow, ny=(size_t)a.n*a.k*osp;
    std::vector<unsigned short> xb(nx), wb(nw); std::vector<float> xf(nx), wf(nw), bias(a.k);
    srand(1);
    for (size_t i=0;i<nx;i++){ xb[i]=f2bf((rand()/(float)RAND_MAX)*2-1); xf[i]=bf2f(xb[i]); }
    for (size_t i=0;i<nw;i++){ wb[i]=f2bf((rand()/(float)RAND_MAX)*2-1); wf[i]=bf2f(wb[i]); }
    for (int i=0;i<cs.k;i++) bias[i]=i*0.25f-1;
    std::vector<double> ref(ny);
    for (size_t i=0;i<ny;i++) {
        size_t t=i; size_t ow=t%a.ow; t/=a.ow; size_t oh=t%a.oh; t/=a.oh; size_t od=t%a.od; t/=a.od; size_t k=t%a.k, n=t/a.k, g=k/kg;
        double acc = a.has_bias ? bias[k] : 0;
        for (size_t ci=0; ci<cg; ci++) for (size_t zd=0; zd<a.kd; zd++) for (size_t yh=0; yh<a.kh; yh++) for (size_t xw=0; xw<a.kw; xw++) {
            long z=(long)(od*a.sd)-(long)a.pd+(long)(zd*a.dd), yy=(long)(oh*a.sh)-(long)a.ph+(long)(yh*a.dh), xx=(long)(ow*a.sw)-(long)a.pw+(long)(xw*a.dw);
            if (z<0||z>=(long)a.d||yy<0||yy>=(long)a.h||xx<0||xx>=(long)a.w) continue;
            acc += (double)xf[(((n*a.c + g*cg + ci)*a.d + z)*a.h + yy)*a.w + xx] * (double)wf[(k*cg+ci)*kvol + (zd*a.kh+yh)*a.kw + xw];
        }
        ref[i]=acc;
    }
    std::vector<float> y(ny);
    unsigned full = (unsigned)std::max<size_t>(1, (ny + 255) / 256);
    struct V { const char* name; unsigned grid, block; int which; };
    V vs[] = {{"naive_f32", full, 256, 0}, {"naive_bf16", full, 256, 1}, {"naive_f32 grid3", 3, 256, 0},
              {"naive_bf16 grid5", 5, 256, 1}, {"naive_f32 blk128", full, 128, 0}, {"direct_f32", full, 256, 2}};
    for (auto& v : vs) {
        std::fill(y.begin(), y.end(), NAN);
        emu_launch(v.grid, v.block, [&] {
            if (v.which == 0) conv3d_naive_f32(xf.data(), wf.data(), bias.data(), y.data(), a);
            else if (v.which == 1) conv3d_naive_bf16(xb.data(), wb.data(), bias.data(), y.data(), a);
            else rs_conv3d_naive_direct<float>(xf.data(), wf.data(), bias.data(), y.data(), a);
        });
        double maxerr = 0, maxref = 1e-30; bool nan = false;
        for (size_t i=0;i<ny;i++){ double d=fabs(y[i]-ref[i]); if(!(d==d)) nan=true; if(d>maxerr)maxerr=d; if(fabs(ref[i])>maxref)maxref=fabs(ref[i]); }
        bool ok = !nan && maxerr <= 1e-5 * maxref + 1e-6;
        if (!ok) bad++;
        printf("  %-18s err %.3g (|ref| %.3g) %s\n", v.name, maxerr, maxref, ok ? "ok" : "BAD");
    }
}
int main() {
    Case cases[] = {
        {2,12,5,7,9, 9,2,3,1, 1,2,1, 1,0,2, 2,1,1, 3,1},
        {1,3,4,5,6, 5,1,1,1, 1,1,1, 0,0,0, 1,1,1, 1,0},
        {2,8,6,6,6, 8,3,3,3, 2,2,2, 1,1,1, 1,1,1, 8,1},
        {1,16,3,17,33, 20,3,3,3, 1,1,1, 1,1,1, 1,2,1, 1,1},
        {1,40,4,9,40, 9,3,3,3, 1,1,1, 1,1,1, 1,1,1, 1,0},
        {2,5,7,13,45, 7,3,3,3, 1,1,1, 1,1,1, 1,1,1, 1,1},
        {1,6,5,9,37, 6,3,3,3, 1,1,1, 1,1,1, 1,1,1, 6,1},
        {1,8,4,6,35, 16,3,3,3, 1,1,1, 1,1,1, 1,1,1, 8,0},
        {1,3,12,12,40, 4,3,3,3, 1,1,1, 9,9,9, 9,9,9, 1,1},
        {1,4,7,9,40, 5,5,5,5, 1,2,3, 2,2,2, 1,1,1, 1,1},
        {1,2,5,6,7, 9,1,2,3, 2,1,2, 0,1,3, 1,3,1, 1,1},
        {1,40,4,9,8, 9,3,3,3, 1,1,1, 1,1,1, 1,1,1, 1,0},
        {2,4,6,7,5, 4,3,3,3, 1,1,1, 1,1,1, 1,1,1, 4,1},
        {1,3,3,4,70, 5,3,3,3, 1,1,1, 0,1,1, 1,1,1, 1,1},
    };
    for (auto& c : cases) { printf("case n%d c%d %dx%dx%d k%d %dx%dx%d s%d%d%d d%d%d%d g%d\n", c.n,c.c,c.d,c.h,c.w,c.k,c.kd,c.kh,c.kw,c.sd,c.sh,c.sw,c.dd,c.dh,c.dw,c.g); run(c); }
    printf(bad ? "FAILURES %d\n" : "all ok\n", bad);
    return bad != 0;
}
