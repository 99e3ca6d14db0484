// The buffer fingerprint (src/convert/fingerprint/, version 1), as a
// reduction of the wrapping 64-bit sum S. The host applies finish(S, len).
//
// Word i of the buffer (little-endian u32, last one zero-padded) contributes
//   t_i = ((w[i] + add_i) mod 2^32) * mul_i        (exact 32x32 -> 64 product)
// with add_i/mul_i from the lane key L = mix64(i % 256 + LANE_SEED) and the
// block key B = mix64(i / 256 + BLOCK_SEED). S is a wrapping sum, so partial
// sums from threads and blocks are added with one exact 64-bit atomicAdd per
// block, in any order.
//
// Launch with blockDim.x == RS_FP_BLOCK (256) and any grid: the grid stride of
// every loop is then a multiple of 256 words, so each thread's lanes (and
// their keys) never change and are computed once; only the block key is
// computed per step (once per 4 or 8 words).
#pragma once
#include "prelude.h"

#define RS_FP_BLOCK 256
#define RS_LANE_SEED 0x6A09E667F3BCC908ull
#define RS_BLOCK_SEED 0xBB67AE8584CAA73Bull

RS_DEVICE rs_u64 rs_mix64(rs_u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
RS_DEVICE rs_u64 rs_lane_key(rs_u64 lane) { return rs_mix64(lane + RS_LANE_SEED); }
RS_DEVICE rs_u64 rs_block_key(rs_u64 block) { return rs_mix64(block + RS_BLOCK_SEED); }

RS_DEVICE rs_u64 rs_term_keys(rs_u64 l, rs_u64 b, rs_u32 w) {
    rs_u32 add = (rs_u32)l ^ (rs_u32)b;
    rs_u32 mul = ((rs_u32)(l >> 32) ^ (rs_u32)(b >> 32)) | 1u;
    return (rs_u64)(w + add) * (rs_u64)mul;
}
RS_DEVICE rs_u64 rs_term(rs_u64 i, rs_u32 w) {
    return rs_term_keys(rs_lane_key(i & 255u), rs_block_key(i >> 8), w);
}

// Adds the block's partial sums to *acc (one atomic per block).
RS_DEVICE void rs_block_reduce_add(rs_u64 s, rs_u64* acc) {
    __shared__ rs_u64 part[RS_FP_BLOCK];
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned int k = RS_FP_BLOCK / 2; k > 0; k >>= 1) {
        if (threadIdx.x < k) part[threadIdx.x] += part[threadIdx.x + k];
        __syncthreads();
    }
    if (threadIdx.x == 0) rs_atomic_add_u64(acc, part[0]);
}

// S over nbytes bytes at p, whose first byte is byte 4*first_word of the
// fingerprinted buffer; added to *acc.
KERNEL void RS_HIP_BLOCK(RS_FP_BLOCK)
    fingerprint_sum_u8(const rs_u8* __restrict__ p, rs_u64 nbytes, rs_u64 first_word, rs_u64* acc) {
    const rs_u64 tid = rs_tid();
    const rs_u64 stride = rs_nthreads();
    const rs_u64 nfull = nbytes / 4u;
    rs_u64 s = 0;
    const rs_u64 pa = (rs_u64)p;
    if ((pa & 3u) != 0u) {
        // Unaligned: assemble each word from bytes.
        for (rs_u64 i = tid; i < nfull; i += stride) {
            const rs_u8* q = p + 4u * i;
            rs_u32 w = (rs_u32)q[0] | ((rs_u32)q[1] << 8) | ((rs_u32)q[2] << 16) | ((rs_u32)q[3] << 24);
            s += rs_term(first_word + i, w);
        }
    } else {
        const rs_u32* w32 = (const rs_u32*)p;
        rs_u64 head = ((16u - (pa & 15u)) & 15u) / 4u;
        if (head > nfull) head = nfull;
        const rs_u64 nvec = (nfull - head) / 4u;
        for (rs_u64 i = tid; i < head; i += stride) s += rs_term(first_word + i, w32[i]);
        // Vector v holds words g .. g+3 with g = first_word + head + 4v. The
        // stride (in words, 4*stride) is a multiple of 256: lanes are fixed.
        const rs_u64 g0 = first_word + head + 4u * tid;
        const rs_u32 lane0 = (rs_u32)(g0 & 255u);
        rs_u64 l0 = rs_lane_key(lane0), l1 = rs_lane_key((lane0 + 1u) & 255u);
        rs_u64 l2 = rs_lane_key((lane0 + 2u) & 255u), l3 = rs_lane_key((lane0 + 3u) & 255u);
        const bool wraps = lane0 > 252u;  // some of the 4 words fall in the next block
        const rs_v4* v4 = (const rs_v4*)(w32 + head);
        for (rs_u64 v = tid; v < nvec; v += stride) {
            const rs_v4 a = rs_load4(v4 + v);
            const rs_u64 blk = (first_word + head + 4u * v) >> 8;
            const rs_u64 b0 = rs_block_key(blk);
            if (!wraps) {
                s += rs_term_keys(l0, b0, a.x) + rs_term_keys(l1, b0, a.y) +
                     rs_term_keys(l2, b0, a.z) + rs_term_keys(l3, b0, a.w);
            } else {
                const rs_u64 b1 = rs_block_key(blk + 1u);
                s += rs_term_keys(l0, b0, a.x);
                s += rs_term_keys(l1, lane0 + 1u > 255u ? b1 : b0, a.y);
                s += rs_term_keys(l2, lane0 + 2u > 255u ? b1 : b0, a.z);
                s += rs_term_keys(l3, b1, a.w);
            }
        }
        for (rs_u64 i = head + 4u * nvec + tid; i < nfull; i += stride)
            s += rs_term(first_word + i, w32[i]);
    }
    // The last, zero-padded word.
    const rs_u64 rest = nbytes & 3u;
    if (rest != 0u && tid == 0u) {
        const rs_u8* q = p + 4u * nfull;
        rs_u32 w = 0;
        for (rs_u64 k = 0; k < rest; ++k) w |= (rs_u32)q[k] << (8u * k);
        s += rs_term(first_word + nfull, w);
    }
    rs_block_reduce_add(s, acc);
}
