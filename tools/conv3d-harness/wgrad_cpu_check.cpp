// The tiled weight-gradient kernels (conv3d_bwd_weight_tiled_{f32,bf16})
// run on the CPU (cpu_shim.h: one std::thread per GPU thread, blocks one
// after another, float atomicAdd a real atomic) against a double reference
// on every dw element of small cases: checks the tiles' indexing, the
// gather's padding / stride / dilation, groups, rows and columns past the
// tile, and split-K chunks (1 chunk, 3 chunks, and 16-point chunks that
// cross samples) without a GPU. dw starts as garbage-free zeros, as the
// host's memset leaves it.
#include "cpu_shim.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include "conv3d.hip"

static unsigned short f2bf(float f) { unsigned u; memcpy(&u, &f, 4); u += 0x7fff + ((u >> 16) & 1); return (unsigned short)(u >> 16); }
static float bf2f(unsigned short b) { unsigned u = ((unsigned)b) << 16; float f; memcpy(&f, &u, 4); return f; }
struct Case { int n,c,d,h,w,k,kd,kh,kw,sd,sh,sw,pd,ph,pw,dd,dh,dw,g; };
int bad = 0;
static void run(const Case& cs) {
    rs_conv3d_args a;
    a.n=cs.n;a.c=cs.c;a.d=cs.d;a.h=cs.h;a.w=cs.w;a.k=cs.k;a.kd=cs.kd;a.kh=cs.kh;a.kw=cs.kw;
    a.sd=cs.sd;a.sh=cs.sh;a.sw=cs.sw;a.pd=cs.pd;a.ph=cs.ph;a.pw=cs.pw;a.dd=cs.dd;a.dh=cs.dh;a.dw=cs.dw;a.groups=cs.g;a.has_bias=0;
    a.od=(cs.d+2*cs.pd-cs.dd*(cs.kd-1)-1)/cs.sd+1; a.oh=(cs.h+2*cs.ph-cs.dh*(cs.kh-1)-1)/cs.sh+1; a.ow=(cs.w+2*cs.pw-cs.dw*(cs.kw-1)-1)/cs.sw+1;
    size_t nx=(size_t)a.n*a.c*a.d*a.h*a.w, cg=a.c/a.groups, kg=a.k/a.groups, kvol=a.kd*a.kh*a.kw, R=cg*kvol;
    size_t nw=(size_t)a.k*R, osp=a.od*a.oh*a.ow, ny=(size_t)a.n*a.k*osp, total=(size_t)a.n*osp;
    std::vector<unsigned short> xb(nx), yb(ny); std::vector<float> xf(nx), yf(ny);
    srand(3);
    for (size_t i=0;i<nx;i++){ xb[i]=f2bf((rand()/(float)RAND_MAX)*2-1); xf[i]=bf2f(xb[i]); }
    for (size_t i=0;i<ny;i++){ yb[i]=f2bf((rand()/(float)RAND_MAX)*2-1); yf[i]=bf2f(yb[i]); }
    std::vector<double> ref(nw, 0.0), mag(nw, 0.0);
    for (size_t e=0;e<nw;e++) {
        size_t k=e/R, r=e%R, ci=r/kvol, t=r%kvol, zd=t/(a.kh*a.kw), yh=(t/a.kw)%a.kh, xw=t%a.kw, g=k/kg;
        for (size_t n=0;n<a.n;n++) for (size_t od=0;od<a.od;od++) for (size_t oh=0;oh<a.oh;oh++) for (size_t ow=0;ow<a.ow;ow++) {
            long z=(long)(od*a.sd)-(long)a.pd+(long)(zd*a.dd), yy=(long)(oh*a.sh)-(long)a.ph+(long)(yh*a.dh), xx=(long)(ow*a.sw)-(long)a.pw+(long)(xw*a.dw);
            if (z<0||z>=(long)a.d||yy<0||yy>=(long)a.h||xx<0||xx>=(long)a.w) continue;
            double p=(double)xf[(((n*a.c + g*cg + ci)*a.d + z)*a.h + yy)*a.w + xx] * (double)yf[((n*a.k + k)*a.od + od)*a.oh*a.ow + oh*a.ow + ow];
            ref[e]+=p; mag[e]+=std::fabs(p);
        }
    }
    const unsigned cols_t = (unsigned)((R + 63) / 64), rows_t = (unsigned)((kg + 63) / 64) * (unsigned)a.groups;
    size_t max_splits = (total + 15) / 16;
    size_t splits_list[] = {1, 3, max_splits};
    std::vector<float> dw(nw);
    for (int bf = 0; bf < 2; bf++) for (size_t want : splits_list) {
        size_t chunk = ((total + want - 1) / want + 15) / 16 * 16;
        unsigned splits = (unsigned)((total + chunk - 1) / chunk);
        std::fill(dw.begin(), dw.end(), 0.0f);
        emu_launch3({cols_t, rows_t, splits}, 256, [&] {
            if (bf) conv3d_bwd_weight_tiled_bf16(xb.data(), yb.data(), dw.data(), a, chunk);
            else conv3d_bwd_weight_tiled_f32(xf.data(), yf.data(), dw.data(), a, chunk);
        });
        int wrong = 0;
        for (size_t e=0;e<nw;e++) {
            if (!(std::fabs(dw[e]-ref[e]) <= 1e-5*mag[e]+1e-30)) {
                if (wrong++ < 3) printf("  dw[%zu] = %g, expected %g\n", e, dw[e], ref[e]);
            }
        }
        printf("case n%d c%d %dx%dx%d k%d %dx%dx%d s%d%d%d p%d%d%d d%d%d%d g%d %s grid %ux%ux%u chunk %zu: %s\n",
               cs.n,cs.c,cs.d,cs.h,cs.w,cs.k,cs.kd,cs.kh,cs.kw,cs.sd,cs.sh,cs.sw,cs.pd,cs.ph,cs.pw,cs.dd,cs.dh,cs.dw,cs.g,
               bf ? "bf16" : "f32", cols_t, rows_t, splits, chunk, wrong ? "WRONG" : "ok");
        bad += wrong != 0;
    }
}
int main() {
    Case cases[] = {
        {2,8,4,5,6, 8,3,3,3, 1,1,1, 1,1,1, 1,1,1, 1},
        {1,16,6,7,8, 16,3,2,3, 2,1,2, 1,1,0, 1,2,1, 2},
        {2,12,5,9,11, 70,3,3,3, 1,1,1, 1,0,2, 1,1,1, 1},
        {3,9,7,7,7, 10,1,1,1, 3,3,3, 0,0,0, 1,1,1, 1},
        {1,8,3,4,4, 8,1,1,1, 1,1,1, 1,1,1, 1,1,1, 1},
        {2,24,3,5,1, 48,3,3,1, 1,1,1, 1,1,0, 1,1,1, 3},
        {1,4,3,3,20, 130,1,1,5, 1,1,2, 0,0,2, 1,1,3, 1},
    };
    for (auto& c : cases) run(c);
    printf(bad ? "%d bad\n" : "all ok\n", bad);
    return bad != 0;
}
