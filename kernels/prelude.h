// rocm-safe kernel prelude: the ONLY file where HIP and CUDA differ.
//
// Every kernel file includes this first. It gives fixed-width integer types,
// the KERNEL qualifier (extern "C" __global__, so symbols are unmangled
// `{op}_{src}_{dst}`), a 16-byte vector type, count-leading-zeros and the
// 64-bit atomic add and maximum. No CUDA or HIP header beyond hip_runtime.h
// is used, so the same text also compiles under NVRTC with no include paths.
#pragma once

#if defined(__HIPCC__) || defined(__HIP_PLATFORM_AMD__)
#if !defined(RS_HIP_STANDIN)
#include <hip/hip_runtime.h>
#endif
// (With a plain clang >= 19, build.rs passes -include hip_standin.h and
// -DRS_HIP_STANDIN instead: no ROCm headers needed, and the CUDA sources,
// flattened from these files, never contain the stand-in.)
#define RS_HIP 1
#else
#define RS_CUDA 1
#endif

// The CUDA backend compiles kernels/conv3d.hip as five modules, so that
// a process compiles only the kernels it launches (src/device/kernels.rs,
// KernelModule): NVRTC is given -DRS_PART=n, and each part's kernels sit
// under #if RS_BUILDS(n). Unset (HIP, and every other file), every kernel is
// built. The numbers are KernelModule::part's (a Rust test compares them).
#ifndef RS_PART
#define RS_PART 0
#endif
#define RS_PART_CONV3D 1
#define RS_PART_CONV3D_NAIVE 2
#define RS_PART_CONV3D_TILED_F32 3
#define RS_PART_CONV3D_TILED_BF16 4
#define RS_PART_CONV3D_TILED_BF16_MMA 5
#define RS_BUILDS(p) (RS_PART == 0 || RS_PART == (p))

typedef unsigned char rs_u8;
typedef unsigned short rs_u16;
typedef unsigned int rs_u32;
typedef unsigned long long rs_u64;

#define KERNEL extern "C" __global__

// Put on every kernel that assumes its block size (the 256-thread reductions,
// the tiled conv3d kernels): __launch_bounds__(n) on HIP, where without it the
// compiler budgets registers for 1024 threads per block (the tiled conv3d
// kernels spilled to scratch on every arch). Nothing on CUDA, whose kernels
// keep the register budgets their timings were measured with (a CUDA bound
// is written out where one is wanted, as on the naive and mma kernels).
#if defined(RS_HIP)
#define RS_HIP_BLOCK(n) __launch_bounds__(n)
#else
#define RS_HIP_BLOCK(n)
#endif
#define RS_DEVICE static __device__ __forceinline__

// 16 bytes, 16-byte aligned: one vector load or store.
struct __align__(16) rs_v4 {
    rs_u32 x, y, z, w;
};

// Count leading zeros of a non-zero 32-bit value.
RS_DEVICE rs_u32 rs_clz32(rs_u32 x) { return (rs_u32)__clz((int)x); }

// Exact 64-bit atomic add (wrapping), order-independent.
RS_DEVICE void rs_atomic_add_u64(rs_u64* p, rs_u64 v) { atomicAdd(p, v); }
// f32 atomic add (relaxed, device scope): the order of concurrent adds, and
// so the rounding of the sum, is not fixed.
RS_DEVICE void rs_atomic_add_f32(float* p, float v) { atomicAdd(p, v); }
// 64-bit atomic maximum (unsigned), order-independent.
RS_DEVICE void rs_atomic_max_u64(rs_u64* p, rs_u64 v) { atomicMax(p, v); }

// The linear thread id and the grid's thread count, both 64-bit.
RS_DEVICE rs_u64 rs_tid() { return (rs_u64)blockIdx.x * (rs_u64)blockDim.x + (rs_u64)threadIdx.x; }
RS_DEVICE rs_u64 rs_nthreads() { return (rs_u64)gridDim.x * (rs_u64)blockDim.x; }

// A 16-byte load of read-only data.
RS_DEVICE rs_v4 rs_load4(const rs_v4* __restrict__ p) { return *p; }

// The guarded fallback's gate (src/conv3d_chain/guard.rs): a kernel given a
// gate runs only when *gate != 0 (the device decided torch's output is
// wrong); a null gate runs always. Uniform over the grid: whole blocks
// return before any barrier.
RS_DEVICE bool rs_gate_closed(const rs_u64* gate) { return gate != 0 && *gate == 0; }
