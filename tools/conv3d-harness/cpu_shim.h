// Just enough of the CUDA kernel environment to run conv3d.hip's naive
// kernels and the tiled weight gradient (conv3d_wgrad.hip) on the CPU: one block at a time, one std::thread per thread of the
// block, __shared__ = static (shared by the block's threads),
// __syncthreads = std::barrier. __CUDA_ARCH__ 700 leaves the tensor-core
// kernel out.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __CUDA_ARCH__ 700
struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
struct float4 { float x, y, z, w; };
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline int __clz(int x) { return __builtin_clz((unsigned)x); }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { auto o = *p; *p += v; return o; }
// A block's threads run at once (std::threads): a real atomic.
inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) { auto o = *p; if (v > o) *p = v; return o; }
std::barrier<>* g_bar;
inline void __syncthreads() { g_bar->arrive_and_wait(); }
// Blocks run one after another here: a fence orders nothing more than the
// barrier does (the guard's fused check, compiled with the file, uses it).
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
// A launch over a 3-D grid (x fastest): one std::thread per thread of the
// block, the blocks one after another.
template <class F> void emu_launch3(dim3 grid, unsigned block, F f) {
    blockDim = {block, 1, 1};
    gridDim = grid;
    std::barrier<> bar(block);
    g_bar = &bar;
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < block; t++)
        ts.emplace_back([&, t] {
            threadIdx = {t, 0, 0};
            for (unsigned bz = 0; bz < grid.z; bz++)
                for (unsigned by = 0; by < grid.y; by++)
                    for (unsigned bx = 0; bx < grid.x; bx++) {
                        blockIdx = {bx, by, bz};
                        f();
                        bar.arrive_and_wait();
                    }
        });
    for (auto& t : ts) t.join();
}
// A launch over a 1-D grid.
template <class F> void emu_launch(unsigned grid, unsigned block, F f) {
    emu_launch3(dim3{grid, 1, 1}, block, f);
}
