//! The x86-64 loops: AVX2 block sums, AVX2 and AVX-512 fused sums.

use std::arch::x86_64::*;

use super::spec::{block_consts, LANE_ADD, LANE_MUL};
use super::widened::RawAndWidened;

/// A lane table as 32 vectors of 8 lanes.
const fn by8(t: &[u32; 256]) -> [[u32; 8]; 32] {
    let mut v = [[0u32; 8]; 32];
    let mut j = 0;
    while j < 256 {
        v[j / 8][j % 8] = t[j];
        j += 1;
    }
    v
}
const ADD8: [[u32; 8]; 32] = by8(&LANE_ADD);
const MUL8: [[u32; 8]; 32] = by8(&LANE_MUL);

/// A lane table in the order `_mm256_unpack{lo,hi}_epi16` leave 16
/// widened bf16 values: per group of 16 lanes, vector `2g` holds lanes
/// 0-3 and 8-11, vector `2g + 1` lanes 4-7 and 12-15.
const fn by8_unpacked(t: &[u32; 256]) -> [[u32; 8]; 32] {
    let mut v = [[0u32; 8]; 32];
    let mut g = 0;
    while g < 16 {
        let mut k = 0;
        while k < 4 {
            v[2 * g][k] = t[16 * g + k];
            v[2 * g][4 + k] = t[16 * g + 8 + k];
            v[2 * g + 1][k] = t[16 * g + 4 + k];
            v[2 * g + 1][4 + k] = t[16 * g + 12 + k];
            k += 1;
        }
        g += 1;
    }
    v
}
const ADD8_UNPACKED: [[u32; 8]; 32] = by8_unpacked(&LANE_ADD);
const MUL8_UNPACKED: [[u32; 8]; 32] = by8_unpacked(&LANE_MUL);

/// Adds the terms of the 8 words `w` with lane keys `a`, `m` and block
/// keys `(ba, bm)` (broadcast) to the even- and odd-lane accumulators.
#[target_feature(enable = "avx2")]
#[inline]
fn step(
    w: __m256i,
    a: [u32; 8],
    m: [u32; 8],
    (ba, bm): (__m256i, __m256i),
    (even, odd): (__m256i, __m256i),
) -> (__m256i, __m256i) {
    let a: __m256i = bytemuck::cast(a);
    let m: __m256i = bytemuck::cast(m);
    let x = _mm256_add_epi32(w, _mm256_xor_si256(a, ba));
    let m = _mm256_xor_si256(m, bm);
    (
        _mm256_add_epi64(even, _mm256_mul_epu32(x, m)),
        _mm256_add_epi64(
            odd,
            _mm256_mul_epu32(_mm256_srli_epi64::<32>(x), _mm256_srli_epi64::<32>(m)),
        ),
    )
}

/// `sum_bf16_as_f32_blocks` with AVX2, fused: each 32-byte load
/// of 16 bf16 values becomes two vectors of f32 words (`value << 16`) by
/// interleaving with zeros, summed against the lane keys in the same
/// interleaved order.
#[target_feature(enable = "avx2")]
pub(super) fn sum_bf16_as_f32_blocks_avx2(first_block: u64, blocks: &[[u8; 512]]) -> u64 {
    const AHEAD: usize = 8;
    const PREFETCH_BYTES: usize = 2048;
    let zero = _mm256_setzero_si256();
    let mut total = _mm256_setzero_si256();
    let (add2, _) = ADD8_UNPACKED.as_chunks::<2>();
    let (mul2, _) = MUL8_UNPACKED.as_chunks::<2>();
    for (group, bs) in (0u64..).zip(blocks.chunks(AHEAD)) {
        let mut keys = [(0u32, 0u32); AHEAD];
        for (j, k) in (0u64..).zip(keys.iter_mut()) {
            *k = block_consts(first_block + group * AHEAD as u64 + j);
        }
        for (b, &(ba, bm)) in bs.iter().zip(&keys) {
            let ahead = b.as_ptr().wrapping_add(PREFETCH_BYTES);
            for line in 0..8 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
            }
            let vba = _mm256_set1_epi32(ba as i32);
            let vbm = _mm256_set1_epi32(bm as i32);
            let mut even = _mm256_setzero_si256();
            let mut odd = _mm256_setzero_si256();
            let (vectors, _) = b.as_chunks::<32>();
            for ((v, [a0, a1]), [m0, m1]) in vectors.iter().zip(add2).zip(mul2) {
                let v: __m256i = bytemuck::cast(*v);
                let lo = _mm256_unpacklo_epi16(zero, v);
                let hi = _mm256_unpackhi_epi16(zero, v);
                (even, odd) = step(lo, *a0, *m0, (vba, vbm), (even, odd));
                (even, odd) = step(hi, *a1, *m1, (vba, vbm), (even, odd));
            }
            total = _mm256_add_epi64(total, _mm256_add_epi64(even, odd));
        }
    }
    let lanes: [u64; 4] = bytemuck::cast(total);
    lanes.iter().fold(0u64, |s, &l| s.wrapping_add(l))
}

/// Whether the running CPU has the AVX-512 foundation and byte/word
/// instructions (cached by the standard library).
#[inline(always)]
pub(super) fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512bw")
}

/// The lane keys for `V` vectors of `N` words covering one raw block of
/// 256 words, for the fused raw and widened sums. Row `k` holds, for the
/// words `r = N k + i` of vector `k`: `[raw add, raw mul, even add, even
/// mul, odd add, odd mul]`, where "even" is the widening of the word's
/// low element (widened lane `2 r mod 256`) and "odd" that of its high
/// element (lane `2 r + 1 mod 256`). The first `V / 2` rows fall in the
/// first of the two widened blocks, the others in the second.
const fn fused_rows<const N: usize, const V: usize>() -> [[[u32; N]; 6]; V] {
    let mut rows = [[[0u32; N]; 6]; V];
    let mut k = 0;
    while k < V {
        let mut i = 0;
        while i < N {
            let r = N * k + i;
            let wide = (2 * r) % 256;
            rows[k][0][i] = LANE_ADD[r];
            rows[k][1][i] = LANE_MUL[r];
            rows[k][2][i] = LANE_ADD[wide];
            rows[k][3][i] = LANE_MUL[wide];
            rows[k][4][i] = LANE_ADD[wide + 1];
            rows[k][5][i] = LANE_MUL[wide + 1];
            i += 1;
        }
        k += 1;
    }
    rows
}
const ROWS8: [[[u32; 8]; 6]; 32] = fused_rows::<8, 32>();
const ROWS16: [[[u32; 16]; 6]; 16] = fused_rows::<16, 16>();

/// The exact f16 -> f32 widening of 8 values, for any value: `em` holds
/// each value's exponent and mantissa (`h & 0x7fff`), `sign` its sign
/// in bit 31. Integer operations only, as [`crate::convert::scalar::f16_to_f32`]:
/// a subnormal mantissa is normalised by shifting it left by 8, 4, 2
/// and 1 places, each shift taken while the result stays below 2^11
/// (the greedy sum is the shift `k` that puts its top bit at bit 10,
/// and a zero shift for normal numbers); then the rebiased value is
/// `(m << 13) + ((112 - k) << 23)` (the top bit at 10 lands on the
/// exponent's lowest bit). Infinities and NaNs get another `112 << 23`
/// (exponent 31 -> 255), zeros stay zero.
#[target_feature(enable = "avx2")]
#[inline]
fn widen8_f16_any(em: __m256i, sign: __m256i) -> __m256i {
    #[target_feature(enable = "avx2")]
    #[inline]
    fn norm<const S: i32>(m: __m256i, k: __m256i) -> (__m256i, __m256i) {
        let take = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x800 >> S), m);
        let by = _mm256_and_si256(take, _mm256_set1_epi32(S));
        (_mm256_sllv_epi32(m, by), _mm256_add_epi32(k, by))
    }
    let zero = _mm256_setzero_si256();
    let (m, k) = norm::<8>(em, zero);
    let (m, k) = norm::<4>(m, k);
    let (m, k) = norm::<2>(m, k);
    let (m, k) = norm::<1>(m, k);
    let bias = _mm256_set1_epi32(112 << 23);
    let r = _mm256_sub_epi32(
        _mm256_add_epi32(_mm256_slli_epi32::<13>(m), bias),
        _mm256_slli_epi32::<23>(k),
    );
    let inf_nan = _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7bff));
    let r = _mm256_add_epi32(r, _mm256_and_si256(inf_nan, bias));
    _mm256_or_si256(sign, _mm256_andnot_si256(_mm256_cmpeq_epi32(em, zero), r))
}

/// The f32 widenings of the low and the high 16-bit elements of the 8
/// words `v` (bf16 for `F16 == false`, else f16).
#[target_feature(enable = "avx2")]
#[inline]
fn widen8<const F16: bool>(v: __m256i) -> (__m256i, __m256i) {
    if !F16 {
        // bf16: the bit pattern shifted into the high half.
        let hi_mask = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        return (_mm256_slli_epi32::<16>(v), _mm256_and_si256(v, hi_mask));
    }
    // f16: zeros and normal numbers (the usual case) by rebiasing the
    // exponent; a vector holding any other value takes the general form.
    let em = _mm256_and_si256(v, _mm256_set1_epi16(0x7fff));
    let zero = _mm256_setzero_si256();
    let sign = _mm256_set1_epi32(0x8000_0000_u32 as i32);
    let lo_em = _mm256_and_si256(em, _mm256_set1_epi32(0xffff));
    let lo_sign = _mm256_and_si256(_mm256_slli_epi32::<16>(v), sign);
    let hi_em = _mm256_srli_epi32::<16>(em);
    let hi_sign = _mm256_and_si256(v, sign);
    let special = _mm256_or_si256(
        _mm256_cmpgt_epi16(em, _mm256_set1_epi16(0x7bff)),
        _mm256_and_si256(
            _mm256_cmpgt_epi16(em, zero),
            _mm256_cmpgt_epi16(_mm256_set1_epi16(0x0400), em),
        ),
    );
    if _mm256_movemask_epi8(special) != 0 {
        return (
            widen8_f16_any(lo_em, lo_sign),
            widen8_f16_any(hi_em, hi_sign),
        );
    }
    let bias = _mm256_set1_epi32(112 << 23);
    let normal = |em: __m256i, sign: __m256i| {
        let r = _mm256_add_epi32(_mm256_slli_epi32::<13>(em), bias);
        _mm256_or_si256(sign, _mm256_andnot_si256(_mm256_cmpeq_epi32(em, zero), r))
    };
    (normal(lo_em, lo_sign), normal(hi_em, hi_sign))
}

/// The keys of group `group` of `N` blocks for the fused loops, three
/// per block: the raw block's, then its two widened blocks' (each 1 KiB
/// raw block widens to 2 KiB).
fn fused_keys<const N: usize>(first_raw: u64, first_wide: u64, group: u64) -> [[(u32, u32); 3]; N] {
    let mut keys = [[(0u32, 0u32); 3]; N];
    for (j, k) in (0u64..).zip(keys.iter_mut()) {
        let b = group * N as u64 + j;
        let w = first_wide.wrapping_add(2 * b);
        *k = [
            block_consts(first_raw.wrapping_add(b)),
            block_consts(w),
            block_consts(w.wrapping_add(1)),
        ];
    }
    keys
}

/// `fused_blocks` with AVX2: each 32-byte load is 8 raw words
/// and the 16 elements whose widenings are summed against the lane
/// keys of [`ROWS8`].
#[target_feature(enable = "avx2")]
pub(super) fn fused_blocks_avx2<const F16: bool>(
    first_raw: u64,
    first_wide: u64,
    blocks: &[[u8; 1024]],
) -> RawAndWidened {
    // Block keys ahead, as in `sum_blocks_avx2`: three per block.
    const AHEAD: usize = 8;
    const PREFETCH_BYTES: usize = 4096;
    let mut raw_total = _mm256_setzero_si256();
    let mut wide_total = _mm256_setzero_si256();
    let bcast = |(a, m): (u32, u32)| (_mm256_set1_epi32(a as i32), _mm256_set1_epi32(m as i32));
    for (group, bs) in (0u64..).zip(blocks.chunks(AHEAD)) {
        let keys = fused_keys::<AHEAD>(first_raw, first_wide, group);
        for (b, [rk, wk0, wk1]) in bs.iter().zip(&keys) {
            let ahead = b.as_ptr().wrapping_add(PREFETCH_BYTES);
            for line in 0..16 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
            }
            let rk = bcast(*rk);
            let mut raw = (_mm256_setzero_si256(), _mm256_setzero_si256());
            let mut wide = raw;
            let (vectors, _) = b.as_chunks::<32>();
            for ((vs, rows), wk) in vectors.chunks(16).zip(ROWS8.chunks(16)).zip([*wk0, *wk1]) {
                let wk = bcast(wk);
                for (v, [ra, rm, ea, em, oa, om]) in vs.iter().zip(rows) {
                    let v: __m256i = bytemuck::cast(*v);
                    raw = step(v, *ra, *rm, rk, raw);
                    let (lo, hi) = widen8::<F16>(v);
                    wide = step(lo, *ea, *em, wk, wide);
                    wide = step(hi, *oa, *om, wk, wide);
                }
            }
            raw_total = _mm256_add_epi64(raw_total, _mm256_add_epi64(raw.0, raw.1));
            wide_total = _mm256_add_epi64(wide_total, _mm256_add_epi64(wide.0, wide.1));
        }
    }
    let fold = |v: __m256i| {
        let lanes: [u64; 4] = bytemuck::cast(v);
        lanes.iter().fold(0u64, |s, &l| s.wrapping_add(l))
    };
    RawAndWidened {
        raw: fold(raw_total),
        widened: fold(wide_total),
    }
}

/// Loads 64 bytes (16 words) into a vector.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn load16(b: &[u8; 64]) -> __m512i {
    // SAFETY: `b` is a reference to 64 initialised bytes, so the 64-byte
    // read at its address is in bounds; `_mm512_loadu_si512` accepts
    // any alignment, and the CPU has AVX-512F (one of this function's
    // target features).
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// [`step`] with AVX-512: 16 words per vector.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn step16(
    w: __m512i,
    a: &[u32; 16],
    m: &[u32; 16],
    (ba, bm): (__m512i, __m512i),
    (even, odd): (__m512i, __m512i),
) -> (__m512i, __m512i) {
    let a = load16(bytemuck::cast_ref(a));
    let m = load16(bytemuck::cast_ref(m));
    let x = _mm512_add_epi32(w, _mm512_xor_si512(a, ba));
    let m = _mm512_xor_si512(m, bm);
    (
        _mm512_add_epi64(even, _mm512_mul_epu32(x, m)),
        _mm512_add_epi64(
            odd,
            _mm512_mul_epu32(_mm512_srli_epi64::<32>(x), _mm512_srli_epi64::<32>(m)),
        ),
    )
}

/// [`widen8`] with AVX-512: 16 words.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn widen16<const F16: bool>(v: __m512i) -> (__m512i, __m512i) {
    let hi_mask = _mm512_set1_epi32(0xffff_0000_u32 as i32);
    if !F16 {
        return (_mm512_slli_epi32::<16>(v), _mm512_and_si512(v, hi_mask));
    }
    // Special: an infinity or NaN (em > 0x7bff) or a subnormal
    // (em - 1 < 0x3ff, unsigned: em = 0 wraps to the top), tested on
    // the 32 16-bit values at once.
    let em = _mm512_and_si512(v, _mm512_set1_epi16(0x7fff));
    let special = _mm512_cmpgt_epu16_mask(em, _mm512_set1_epi16(0x7bff))
        | _mm512_cmplt_epu16_mask(
            _mm512_sub_epi16(em, _mm512_set1_epi16(1)),
            _mm512_set1_epi16(0x3ff),
        );
    let lo_em = _mm512_and_si512(em, _mm512_set1_epi32(0xffff));
    let hi_em = _mm512_srli_epi32::<16>(em);
    let sign = _mm512_set1_epi32(0x8000_0000_u32 as i32);
    let lo_sign = _mm512_and_si512(_mm512_slli_epi32::<16>(v), sign);
    let hi_sign = _mm512_and_si512(v, sign);
    if special != 0 {
        return (
            widen16_f16_any(lo_em, lo_sign),
            widen16_f16_any(hi_em, hi_sign),
        );
    }
    let bias = _mm512_set1_epi32(112 << 23);
    // Zero stays zero (the mask keeps only non-zero lanes), normal
    // numbers are rebiased; the sign bit is put back on both.
    let normal = |em: __m512i, sign: __m512i| {
        let nz = _mm512_test_epi32_mask(em, em);
        _mm512_or_si512(
            sign,
            _mm512_maskz_add_epi32(nz, _mm512_slli_epi32::<13>(em), bias),
        )
    };
    (normal(lo_em, lo_sign), normal(hi_em, hi_sign))
}

/// [`widen8_f16_any`] with AVX-512: 16 values.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn widen16_f16_any(em: __m512i, sign: __m512i) -> __m512i {
    #[target_feature(enable = "avx512f,avx512bw")]
    #[inline]
    fn norm<const S: u32>(m: __m512i, k: __m512i) -> (__m512i, __m512i) {
        let take = _mm512_cmplt_epu32_mask(m, _mm512_set1_epi32(0x800 >> S));
        (
            _mm512_mask_slli_epi32::<S>(m, take, m),
            _mm512_mask_add_epi32(k, take, k, _mm512_set1_epi32(S as i32)),
        )
    }
    let (m, k) = norm::<8>(em, _mm512_setzero_si512());
    let (m, k) = norm::<4>(m, k);
    let (m, k) = norm::<2>(m, k);
    let (m, k) = norm::<1>(m, k);
    let bias = _mm512_set1_epi32(112 << 23);
    let r = _mm512_sub_epi32(
        _mm512_add_epi32(_mm512_slli_epi32::<13>(m), bias),
        _mm512_slli_epi32::<23>(k),
    );
    let inf_nan = _mm512_cmpgt_epu32_mask(em, _mm512_set1_epi32(0x7bff));
    let r = _mm512_mask_add_epi32(r, inf_nan, r, bias);
    let nz = _mm512_test_epi32_mask(em, em);
    _mm512_or_si512(sign, _mm512_maskz_mov_epi32(nz, r))
}

/// `fused_blocks` with AVX-512 (F and BW): each 64-byte load is 16 raw
/// words and the 32 elements whose widenings are summed against the
/// lane keys of [`ROWS16`].
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) fn fused_blocks_avx512<const F16: bool>(
    first_raw: u64,
    first_wide: u64,
    blocks: &[[u8; 1024]],
) -> RawAndWidened {
    const AHEAD: usize = 8;
    const PREFETCH_BYTES: usize = 4096;
    let mut raw_total = _mm512_setzero_si512();
    let mut wide_total = _mm512_setzero_si512();
    let bcast = |(a, m): (u32, u32)| (_mm512_set1_epi32(a as i32), _mm512_set1_epi32(m as i32));
    for (group, bs) in (0u64..).zip(blocks.chunks(AHEAD)) {
        let keys = fused_keys::<AHEAD>(first_raw, first_wide, group);
        for (b, [rk, wk0, wk1]) in bs.iter().zip(&keys) {
            let ahead = b.as_ptr().wrapping_add(PREFETCH_BYTES);
            for line in 0..16 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
            }
            let rk = bcast(*rk);
            let mut raw = (_mm512_setzero_si512(), _mm512_setzero_si512());
            let mut wide = raw;
            let (vectors, _) = b.as_chunks::<64>();
            for ((vs, rows), wk) in vectors.chunks(8).zip(ROWS16.chunks(8)).zip([*wk0, *wk1]) {
                let wk = bcast(wk);
                for (v, [ra, rm, ea, em, oa, om]) in vs.iter().zip(rows) {
                    let v = load16(v);
                    raw = step16(v, ra, rm, rk, raw);
                    let (lo, hi) = widen16::<F16>(v);
                    wide = step16(lo, ea, em, wk, wide);
                    wide = step16(hi, oa, om, wk, wide);
                }
            }
            raw_total = _mm512_add_epi64(raw_total, _mm512_add_epi64(raw.0, raw.1));
            wide_total = _mm512_add_epi64(wide_total, _mm512_add_epi64(wide.0, wide.1));
        }
    }
    RawAndWidened {
        raw: _mm512_reduce_add_epi64(raw_total) as u64,
        widened: _mm512_reduce_add_epi64(wide_total) as u64,
    }
}

/// `sum_blocks` with AVX2: 8 words per vector; the word sums
/// are 32-bit lane adds, and `vpmuludq` multiplies the even lanes and
/// (after a 64-bit shift right by 32) the odd lanes, exactly into
/// 64-bit products.
#[target_feature(enable = "avx2")]
pub(super) fn sum_blocks_avx2(first_block: u64, blocks: &[[u8; 1024]]) -> u64 {
    // SAFETY: without a copy, no destination is written; the caller's CPU
    // has AVX2 (this function's own contract).
    unsafe { blocks_avx2::<false>(first_block, blocks, std::ptr::null_mut()) }
}

/// [`sum_blocks_avx2`] that also copies each block to `dst` as it is
/// summed (one pass over the source: the staging copy of an upload and
/// its fingerprint). The stores are non-temporal when `dst` is 32-byte
/// aligned (the staging buffer is read by the copy engine, not the CPU),
/// followed by a store fence.
///
/// # Safety
/// `dst` is writable for `1024 * blocks.len()` bytes that overlap no
/// block; the CPU has AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn copy_sum_blocks_avx2(
    first_block: u64,
    blocks: &[[u8; 1024]],
    dst: *mut u8,
) -> u64 {
    // SAFETY: the caller's contract is the loop's with a copy.
    unsafe { blocks_avx2::<true>(first_block, blocks, dst) }
}

/// The block sums of [`sum_blocks_avx2`], and with `COPY` each block
/// stored to `dst` as it is summed (non-temporal where `dst` is 32-byte
/// aligned). Block keys are computed 8 at a time ahead of the blocks that
/// use them: a key is a chain of dependent multiplies, which would
/// otherwise stall the start of every block.
///
/// # Safety
/// With `COPY`, `dst` is writable for `1024 * blocks.len()` bytes that
/// overlap no block (without, `dst` is not used); the CPU has AVX2.
#[target_feature(enable = "avx2")]
unsafe fn blocks_avx2<const COPY: bool>(
    first_block: u64,
    blocks: &[[u8; 1024]],
    dst: *mut u8,
) -> u64 {
    const AHEAD: usize = 8;
    const PREFETCH_BYTES: usize = 4096;
    let stream = COPY && (dst as usize).is_multiple_of(32);
    let mut total = _mm256_setzero_si256();
    let mut out = dst;
    for (group, bs) in (0u64..).zip(blocks.chunks(AHEAD)) {
        let mut keys = [(0u32, 0u32); AHEAD];
        for (j, k) in (0u64..).zip(keys.iter_mut()) {
            *k = block_consts(first_block + group * AHEAD as u64 + j);
        }
        for (b, &(ba, bm)) in bs.iter().zip(&keys) {
            let ahead = b.as_ptr().wrapping_add(PREFETCH_BYTES);
            for line in 0..16 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64 * line).cast());
            }
            let vba = _mm256_set1_epi32(ba as i32);
            let vbm = _mm256_set1_epi32(bm as i32);
            let mut even = _mm256_setzero_si256();
            let mut odd = _mm256_setzero_si256();
            let (vectors, _) = b.as_chunks::<32>();
            for ((w, a), m) in vectors.iter().zip(&ADD8).zip(&MUL8) {
                let w: __m256i = bytemuck::cast(*w);
                if COPY {
                    // SAFETY: `out` walks `dst`'s `1024 * blocks.len()`
                    // bytes 32 at a time (the caller's), aligned when
                    // `stream`.
                    unsafe {
                        if stream {
                            _mm256_stream_si256(out.cast(), w);
                        } else {
                            _mm256_storeu_si256(out.cast(), w);
                        }
                        out = out.add(32);
                    }
                }
                let a: __m256i = bytemuck::cast(*a);
                let m: __m256i = bytemuck::cast(*m);
                let x = _mm256_add_epi32(w, _mm256_xor_si256(a, vba));
                let m = _mm256_xor_si256(m, vbm);
                even = _mm256_add_epi64(even, _mm256_mul_epu32(x, m));
                odd = _mm256_add_epi64(
                    odd,
                    _mm256_mul_epu32(_mm256_srli_epi64::<32>(x), _mm256_srli_epi64::<32>(m)),
                );
            }
            total = _mm256_add_epi64(total, _mm256_add_epi64(even, odd));
        }
    }
    if stream {
        _mm_sfence();
    }
    let lanes: [u64; 4] = bytemuck::cast(total);
    lanes.iter().fold(0u64, |s, &l| s.wrapping_add(l))
}
