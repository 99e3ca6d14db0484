// Stands in for <hip/hip_runtime.h> when build.rs compiles the kernels with
// a plain clang (>= 19) in HIP device-only mode (-nogpuinc -nogpulib, so no
// ROCm headers or device libraries are needed). build.rs passes it with
// `-include` and defines RS_HIP_STANDIN (prelude.h then skips
// <hip/hip_runtime.h>); a ROCm hipcc gets the real headers instead.
//
// It holds only what kernels/*.hip use, built from clang's own HIP
// attributes and amdgcn builtins. A kernel that needs more fails to compile
// here first (`cargo build --features hip` with clang-19), so extend this file
// then, with the same meaning as the HIP header's definition.
#pragma once

#if !defined(__HIP__)
#error "hip_standin.h is for clang's HIP mode (-x hip)"
#endif

#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
// As HIP defines its one-argument form: the most threads per block, which the
// register budget is made for. (clang's CUDA `launch_bounds` attribute does
// nothing on amdgcn. No HIP kernel here uses the two-argument form.)
#define __launch_bounds__(t) __attribute__((amdgpu_flat_work_group_size(1, t)))

// threadIdx / blockIdx / blockDim / gridDim through the amdgcn builtins, only
// the components the kernels read (x; blockIdx also y and z). gridDim counts
// blocks, as in HIP (whose launches are always whole blocks). clang's builtins
// read the sizes from the implicit kernel arguments (code object v5) or the
// dispatch packet (v4).
struct rs_hip_thread_idx {
    __device__ unsigned int get_x() const { return __builtin_amdgcn_workitem_id_x(); }
    __declspec(property(get = get_x)) unsigned int x;
};
struct rs_hip_block_idx {
    __device__ unsigned int get_x() const { return __builtin_amdgcn_workgroup_id_x(); }
    __device__ unsigned int get_y() const { return __builtin_amdgcn_workgroup_id_y(); }
    __device__ unsigned int get_z() const { return __builtin_amdgcn_workgroup_id_z(); }
    __declspec(property(get = get_x)) unsigned int x;
    __declspec(property(get = get_y)) unsigned int y;
    __declspec(property(get = get_z)) unsigned int z;
};
struct rs_hip_block_dim {
    __device__ unsigned int get_x() const { return __builtin_amdgcn_workgroup_size_x(); }
    __declspec(property(get = get_x)) unsigned int x;
};
struct rs_hip_grid_dim {
    __device__ unsigned int get_x() const {
        return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x();
    }
    __declspec(property(get = get_x)) unsigned int x;
};
static constexpr __device__ rs_hip_thread_idx threadIdx{};
static constexpr __device__ rs_hip_block_idx blockIdx{};
static constexpr __device__ rs_hip_block_dim blockDim{};
static constexpr __device__ rs_hip_grid_dim gridDim{};

// A block-wide barrier that also orders shared (and global) memory, as HIP's
// __syncthreads: release fence, s_barrier, acquire fence (workgroup scope).
static __device__ inline void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

// A fence of every memory access at device (agent) scope, as HIP's
// __threadfence: what a thread wrote before it is seen by any thread of the
// device that synchronises with what it does after it (an atomic), and
// nothing read after it is older than that.
static __device__ inline void __threadfence() { __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent"); }

// HIP's 16-byte vector of floats (aligned, so one load or store moves it).
struct __align__(16) float4 {
    float x, y, z, w;
};

// The intrinsics the kernels use, with HIP's meaning.
static __device__ inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
static __device__ inline float __uint_as_float(unsigned int x) {
    return __builtin_bit_cast(float, x);
}
static __device__ inline unsigned int __float_as_uint(float x) {
    return __builtin_bit_cast(unsigned int, x);
}
static __device__ inline float fmaf(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
// Relaxed, device (agent) scope, as HIP's atomicAdd.
static __device__ inline unsigned long long atomicAdd(unsigned long long* p,
                                                      unsigned long long v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// Relaxed, device (agent) scope, as HIP's float atomicAdd.
static __device__ inline float atomicAdd(float* p, float v) {
    return __hip_atomic_fetch_add(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
// Relaxed, device (agent) scope, as HIP's atomicMax.
static __device__ inline unsigned long long atomicMax(unsigned long long* p,
                                                      unsigned long long v) {
    return __hip_atomic_fetch_max(p, v, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
}
