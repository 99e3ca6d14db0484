//! The buffer fingerprint of DESIGN.md contract 2.
//!
//! # Definition (version 1)
//!
//! A buffer of `n` bytes is read as `W = ceil(n / 4)` little-endian 32-bit
//! words `w[0..W]`, the last one zero-padded. With
//!
//! ```text
//! mix64(z):  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//!            z = (z ^ (z >> 27)) * 0x94D049BB133111EB
//!            z ^ (z >> 31)                      (all mod 2^64)
//! lane j = i mod 256, block b = i / 256
//! L = mix64(j + 0x6A09E667F3BCC908),  B = mix64(b + 0xBB67AE8584CAA73B)
//! add_i = lo32(L) ^ lo32(B)
//! mul_i = (hi32(L) ^ hi32(B)) | 1
//! t_i   = ((w[i] + add_i) mod 2^32) * mul_i       (exact 32x32 -> 64-bit product)
//! S     = sum of t_i mod 2^64
//! fingerprint = mix64(S ^ mix64(n + 0x3C6EF372FE94F82B))
//! ```
//!
//! Properties that the verification relies on:
//! - **order-independent**: `S` is a wrapping sum, so any partition of the
//!   words (CPU threads, GPU blocks, transfer chunks) gives the same value;
//!   partial sums over word ranges add up ([`sum_words`]).
//! - **position-keyed**: every position has its own `add_i`/`mul_i`, so
//!   swapped or shifted chunks change it.
//! - **any single-word change is always detected**: for fixed `i`, `t_i` is
//!   injective in `w[i]` (a bijection mod 2^32 times an odd multiplier, as an
//!   exact 64-bit product), and `mix64` is a bijection.
//! - **an all-zero buffer** hashes to its own value, different from the data's
//!   with overwhelming probability.
//!
//! The GPU kernel (`hip-kernels/fingerprint.hip`) computes `S` with the same
//! formula; the host finishes it with [`finish`].
//!
//! # Computing it
//!
//! - [`fingerprint_bytes`] / [`fingerprint_words`]: a whole buffer (parallel
//!   above a size threshold).
//! - [`sum_bytes`] / [`sum_words`] (one thread) and [`par_sum_bytes`] /
//!   [`par_sum_words`] (rayon): the partial sum `S` of a word-aligned piece
//!   of a buffer, given the word position of its first word; add the partial
//!   sums of all pieces (wrapping) and [`finish`] with the total byte length.
//! - [`Fingerprinter`]: the same for a buffer that arrives in order, in
//!   pieces of any length (not necessarily whole words).
//! - [`sum_raw_and_widened`]: for a piece of a bf16 or f16 buffer, both the
//!   partial sum of its bytes and that of their f32 widening, in one pass
//!   (what a verified bf16/f16 -> f32 upload checks).
//!
//! Inside a 256-word block the block key is constant, so the loops work
//! block by block with the lane keys taken from precomputed tables
//! ([`LANE_ADD`], [`LANE_MUL`]): a portable loop the compiler vectorises
//! (SSE2 on x86-64), and on x86-64 an AVX2 loop chosen at run time, which
//! also computes block keys ahead and prefetches the data 4 KiB ahead
//! (for [`sum_raw_and_widened`] also an AVX-512 loop, chosen first when the
//! CPU has AVX-512F and AVX-512BW).
//! [`term`] is the one-word reference; [`sum_bytes`] and [`sum_words`] equal
//! the sum of [`term`] over the words (tested).

/// Words per keyed block (the block key changes every 256 words = 1 KiB).
pub const BLOCK_WORDS: u64 = 256;
const LANE_SEED: u64 = 0x6A09_E667_F3BC_C908;
const BLOCK_SEED: u64 = 0xBB67_AE85_84CA_A73B;
const LEN_SEED: u64 = 0x3C6E_F372_FE94_F82B;

/// A 64-bit buffer fingerprint. Equal buffers have equal fingerprints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint(pub u64);

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The splitmix64 finaliser used throughout the fingerprint.
#[inline(always)]
pub const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of a lane (`i mod 256`).
#[inline(always)]
pub const fn lane_key(lane: u64) -> u64 {
    mix64(lane.wrapping_add(LANE_SEED))
}

/// The key of a block (`i / 256`).
#[inline(always)]
pub const fn block_key(block: u64) -> u64 {
    mix64(block.wrapping_add(BLOCK_SEED))
}

/// The term `t_i` of word `word` at word position `index`.
#[inline(always)]
pub const fn term(index: u64, word: u32) -> u64 {
    let l = lane_key(index % BLOCK_WORDS);
    let b = block_key(index / BLOCK_WORDS);
    let add = (l as u32) ^ (b as u32);
    let mul = ((l >> 32) as u32 ^ (b >> 32) as u32) | 1;
    (word.wrapping_add(add) as u64) * (mul as u64)
}

/// `lo32(L)` for every lane `j` (the lane's part of `add_i`).
pub const LANE_ADD: [u32; 256] = lane_table(false);

/// `hi32(L) | 1` for every lane `j` (the lane's part of `mul_i`; since bit 0
/// of `mul_i` is always set, `mul_i = LANE_MUL[j] ^ (hi32(B) & !1)`).
pub const LANE_MUL: [u32; 256] = lane_table(true);

const fn lane_table(mul: bool) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut j = 0;
    while j < 256 {
        let l = lane_key(j as u64);
        t[j] = if mul { (l >> 32) as u32 | 1 } else { l as u32 };
        j += 1;
    }
    t
}

/// The two per-block constants: `lo32(B)` and `hi32(B)` with bit 0 cleared.
#[inline(always)]
fn block_consts(block: u64) -> (u32, u32) {
    let b = block_key(block);
    (b as u32, (b >> 32) as u32 & !1)
}

/// The lane tables split by even and odd lanes, zero-extended to 64 bits:
/// `[add even, add odd, mul even, mul odd]`.
const PAIR_TABLES: [[u64; 128]; 4] = pair_tables();

const fn pair_tables() -> [[u64; 128]; 4] {
    let mut t = [[0u64; 128]; 4];
    let mut k = 0;
    while k < 128 {
        t[0][k] = LANE_ADD[2 * k] as u64;
        t[1][k] = LANE_ADD[2 * k + 1] as u64;
        t[2][k] = LANE_MUL[2 * k] as u64;
        t[3][k] = LANE_MUL[2 * k + 1] as u64;
        k += 1;
    }
    t
}

/// Sum of the terms of one whole block of 256 words, read as 128
/// little-endian pairs of words.
///
/// Written for the vectoriser: a pair `d = w[2k] | w[2k+1] << 32` is one
/// 64-bit lane; the even word's sum `lo32(d + add)` and the odd word's
/// `lo32((d >> 32) + add)` need no zero-extension, and the products of two
/// values below 2^32 map to `pmuludq`, which reads only the low halves.
#[inline(always)]
fn full_block(block: u64, pairs: &[[u8; 8]; 128]) -> u64 {
    let (ba, bm) = block_consts(block);
    let (ba, bm) = (ba as u64, bm as u64);
    let [ae, ao, me, mo] = &PAIR_TABLES;
    let mut s = 0u64;
    for k in 0..128 {
        let d = u64::from_le_bytes(pairs[k]);
        let xe = d.wrapping_add(ae[k] ^ ba) as u32 as u64;
        let xo = (d >> 32).wrapping_add(ao[k] ^ ba) as u32 as u64;
        s = s
            .wrapping_add(xe * ((me[k] ^ bm) as u32 as u64))
            .wrapping_add(xo * ((mo[k] ^ bm) as u32 as u64));
    }
    s
}

/// Sum of the terms of `words`, the first at lane `lane` of block `block`
/// (`words` must not run past the block's end: extra words are ignored).
#[inline(always)]
fn part_block(block: u64, lane: usize, words: &[[u8; 4]]) -> u64 {
    let (ba, bm) = block_consts(block);
    let la = LANE_ADD.get(lane..).unwrap_or(&[]);
    let lm = LANE_MUL.get(lane..).unwrap_or(&[]);
    let mut s = 0u64;
    for ((&w, &a), &m) in words.iter().zip(la).zip(lm) {
        let x = u32::from_le_bytes(w).wrapping_add(a ^ ba);
        s = s.wrapping_add(x as u64 * (m ^ bm) as u64);
    }
    s
}

/// The sum of the terms of whole blocks, the first being block
/// `first_block`: AVX2 code when the CPU has it, else the portable loop.
fn sum_blocks(first_block: u64, blocks: &[[u8; 1024]]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if super::kernels::has_avx2() {
        // SAFETY: `sum_blocks_avx2` only needs the AVX2 instruction set (it
        // is otherwise an ordinary safe function), and the CPU running this
        // code was just detected to have it.
        return unsafe { x86::sum_blocks_avx2(first_block, blocks) };
    }
    sum_blocks_portable(first_block, blocks)
}

fn sum_blocks_portable(first_block: u64, blocks: &[[u8; 1024]]) -> u64 {
    let mut s = 0u64;
    for (block, b) in (first_block..).zip(blocks) {
        let (pairs, _) = b.as_chunks::<8>();
        if let Ok(pairs) = <&[[u8; 8]; 128]>::try_from(pairs) {
            s = s.wrapping_add(full_block(block, pairs));
        }
    }
    s
}

/// The partial sum `S` of the f32 output of bf16 -> f32 for whole blocks
/// of the source (256 bf16 values = one 1 KiB output block each), the first
/// being output block `first_block`: fused (no output written) with AVX2
/// when the CPU has it, else through a 1 KiB buffer.
pub(crate) fn sum_bf16_as_f32_blocks(first_block: u64, blocks: &[[u8; 512]]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if super::kernels::has_avx2() {
        // SAFETY: `sum_bf16_as_f32_blocks_avx2` only needs the AVX2
        // instruction set (it is otherwise an ordinary safe function), and
        // the CPU running this code was just detected to have it.
        return unsafe { x86::sum_bf16_as_f32_blocks_avx2(first_block, blocks) };
    }
    let mut s = 0u64;
    for (block, b) in (first_block..).zip(blocks) {
        let mut out = [[0u8; 1024]; 1];
        let [o] = &mut out;
        for (w, h) in o
            .as_chunks_mut::<4>()
            .0
            .iter_mut()
            .zip(b.as_chunks::<2>().0)
        {
            *w = ((u16::from_le_bytes(*h) as u32) << 16).to_le_bytes();
        }
        s = s.wrapping_add(sum_blocks_portable(block, &out));
    }
    s
}

// ----- raw and widened sums in one pass --------------------------------------

/// The two partial sums that verify a piece of a bf16 or f16 buffer widened
/// to f32 (see [`sum_raw_and_widened`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RawAndWidened {
    /// The partial sum of the piece's own bytes: exactly
    /// [`sum_bytes`]`(start_word, bytes)`.
    pub raw: u64,
    /// The partial sum of the exact f32 widening of the piece's whole
    /// elements, whose first word is word `2 * start_word` of the f32
    /// output.
    pub widened: u64,
}

impl RawAndWidened {
    /// Both sums added (wrapping): the sums of the union of two disjoint
    /// pieces.
    #[inline]
    #[must_use]
    pub const fn add(self, o: RawAndWidened) -> RawAndWidened {
        RawAndWidened {
            raw: self.raw.wrapping_add(o.raw),
            widened: self.widened.wrapping_add(o.widened),
        }
    }
}

/// Both partial sums that verify a bf16 -> f32 or f16 -> f32 piece, in one
/// pass over its bytes: the sum of the bytes themselves (what a copy must
/// deliver) and the sum of their f32 widening (what the conversion must
/// write), without writing the widening anywhere.
///
/// `bytes` is a piece of a buffer of `from` elements whose first byte is
/// byte `4 * start_word` of that buffer: it starts on a word of the buffer
/// (element `2 * start_word`), and its widening starts on word
/// `2 * start_word` of the f32 output. Any alignment of `bytes` in memory
/// and any `start_word` are accepted (`start_word + bytes.len()` below 2^61,
/// as for every buffer that fits in memory). Then
///
/// - `raw == sum_bytes(start_word, bytes)` (a trailing partial word is
///   zero-padded, as there: so `bytes` must end at a word boundary of the
///   buffer or at its end);
/// - `widened == sum_bytes(2 * start_word, w)` where `w` is the exact
///   widening ([`super::scalar::bf16_to_f32`] or
///   [`super::scalar::f16_to_f32`]) of the whole elements of `bytes` (a
///   trailing odd byte is not an element and is left out of `widened`).
///
/// Every 1 KiB of `bytes` that is a whole keyed block of the buffer (it
/// starts at a word position that is a multiple of [`BLOCK_WORDS`]) is one
/// block of the raw sum and two blocks of the widened sum; those are summed
/// together, each 32-byte (or, with AVX-512, 64-byte) load feeding both
/// sums: AVX-512 or AVX2 loops chosen at run time on x86-64, a portable loop
/// elsewhere. The words before the first whole block and after the last
/// one (less than 1 KiB each) take the separate loops.
///
/// Returns `None` when `from` is neither [`DType::BF16`](crate::DType::BF16)
/// nor [`DType::F16`](crate::DType::F16).
///
/// ```
/// use rocm_safe::convert::fingerprint::{sum_bytes, sum_raw_and_widened};
/// use rocm_safe::DType;
/// let bf16: Vec<u8> = (0..4096u32).map(|i| (i * 37) as u8).collect();
/// let f32: Vec<u8> = bf16
///     .chunks_exact(2)
///     .flat_map(|h| [0, 0, h[0], h[1]])
///     .collect();
/// let s = sum_raw_and_widened(DType::BF16, 256, &bf16).unwrap();
/// assert_eq!(s.raw, sum_bytes(256, &bf16));
/// assert_eq!(s.widened, sum_bytes(512, &f32));
/// ```
pub fn sum_raw_and_widened(
    from: crate::dtype::DType,
    start_word: u64,
    bytes: &[u8],
) -> Option<RawAndWidened> {
    use crate::dtype::DType;
    match from {
        DType::BF16 => Some(raw_and_widened::<false>(start_word, bytes)),
        DType::F16 => Some(raw_and_widened::<true>(start_word, bytes)),
        _ => None,
    }
}

/// The exact f32 widening of one bf16 (`F16 == false`) or f16 value.
#[inline(always)]
fn widen<const F16: bool>(h: u16) -> u32 {
    if F16 {
        super::kernels::f16_to_f32(h)
    } else {
        super::scalar::bf16_to_f32(h)
    }
}

/// [`sum_raw_and_widened`] for bf16 (`F16 == false`) or f16.
fn raw_and_widened<const F16: bool>(start_word: u64, bytes: &[u8]) -> RawAndWidened {
    // Head: up to the first word position that starts a block.
    let lane = (start_word % BLOCK_WORDS) as usize;
    let head_len = if lane == 0 { 0 } else { 4 * (256 - lane) };
    let (head, rest) = bytes.split_at_checked(head_len).unwrap_or((bytes, &[]));
    let mut s = raw_and_widened_separately::<F16>(start_word, head);
    let word = start_word.wrapping_add((head.len() / 4) as u64);
    // Whole blocks: raw block `word / 256` is widened blocks `2 * that`
    // and `2 * that + 1`.
    let (blocks, tail) = rest.as_chunks::<1024>();
    let first = word / BLOCK_WORDS;
    s = s.add(fused_blocks::<F16>(first, first.wrapping_mul(2), blocks));
    let word = word.wrapping_add(BLOCK_WORDS.wrapping_mul(blocks.len() as u64));
    s.add(raw_and_widened_separately::<F16>(word, tail))
}

/// [`sum_raw_and_widened`] of a short piece with the separate loops: the
/// raw sum by [`sum_bytes`], the widened one by widening into a buffer.
fn raw_and_widened_separately<const F16: bool>(start_word: u64, bytes: &[u8]) -> RawAndWidened {
    let raw = sum_bytes(start_word, bytes);
    let mut widened = 0u64;
    let mut word = start_word.wrapping_mul(2);
    let mut buf = [[0u8; 4]; 512];
    for piece in bytes.chunks(1024) {
        let (elems, _) = piece.as_chunks::<2>();
        for (o, &h) in buf.iter_mut().zip(elems) {
            *o = widen::<F16>(u16::from_le_bytes(h)).to_le_bytes();
        }
        let out = buf.get(..elems.len()).unwrap_or(&[]);
        widened = widened.wrapping_add(sum_bytes(word, out.as_flattened()));
        word = word.wrapping_add(elems.len() as u64);
    }
    RawAndWidened { raw, widened }
}

/// Both sums of whole 1 KiB source blocks, the first being raw block
/// `first_raw` and widened blocks `first_wide` and `first_wide + 1`:
/// AVX-512 or AVX2 code when the CPU has it, else the portable loop.
fn fused_blocks<const F16: bool>(
    first_raw: u64,
    first_wide: u64,
    blocks: &[[u8; 1024]],
) -> RawAndWidened {
    #[cfg(target_arch = "x86_64")]
    {
        if x86::has_avx512() {
            // SAFETY: `fused_blocks_avx512` only needs the AVX-512
            // foundation and byte/word instructions (it is otherwise an ordinary safe
            // function apart from its loads, argued inside), and the CPU
            // running this code was just detected to have them.
            return unsafe { x86::fused_blocks_avx512::<F16>(first_raw, first_wide, blocks) };
        }
        if super::kernels::has_avx2() {
            // SAFETY: `fused_blocks_avx2` only needs the AVX2 instruction
            // set (it is otherwise an ordinary safe function), and the CPU
            // running this code was just detected to have it.
            return unsafe { x86::fused_blocks_avx2::<F16>(first_raw, first_wide, blocks) };
        }
    }
    fused_blocks_portable::<F16>(first_raw, first_wide, blocks)
}

/// [`fused_blocks`] without SIMD intrinsics: each 1 KiB block is summed as
/// it is, then widened into a 2 KiB buffer and summed again while it is in
/// the L1 cache (the loops vectorise).
fn fused_blocks_portable<const F16: bool>(
    first_raw: u64,
    first_wide: u64,
    blocks: &[[u8; 1024]],
) -> RawAndWidened {
    let mut s = RawAndWidened::default();
    let mut wide = [[0u8; 8]; 256];
    for (k, b) in (0u64..).zip(blocks) {
        let (pairs, _) = b.as_chunks::<8>();
        if let Ok(pairs) = <&[[u8; 8]; 128]>::try_from(pairs) {
            s.raw = s
                .raw
                .wrapping_add(full_block(first_raw.wrapping_add(k), pairs));
        }
        for (o, h) in wide.iter_mut().zip(b.as_chunks::<4>().0) {
            let lo = widen::<F16>(u16::from_le_bytes([h[0], h[1]])) as u64;
            let hi = widen::<F16>(u16::from_le_bytes([h[2], h[3]])) as u64;
            *o = (lo | hi << 32).to_le_bytes();
        }
        let (w0, w1) = wide.split_at(128);
        let wb = first_wide.wrapping_add(2 * k);
        if let (Ok(w0), Ok(w1)) = (
            <&[[u8; 8]; 128]>::try_from(w0),
            <&[[u8; 8]; 128]>::try_from(w1),
        ) {
            s.widened = s
                .widened
                .wrapping_add(full_block(wb, w0))
                .wrapping_add(full_block(wb.wrapping_add(1), w1));
        }
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{block_consts, LANE_ADD, LANE_MUL};

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

    /// [`super::sum_bf16_as_f32_blocks`] with AVX2, fused: each 32-byte load
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
    fn fused_keys<const N: usize>(
        first_raw: u64,
        first_wide: u64,
        group: u64,
    ) -> [[(u32, u32); 3]; N] {
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

    /// [`super::fused_blocks`] with AVX2: each 32-byte load is 8 raw words
    /// and the 16 elements whose widenings are summed against the lane
    /// keys of [`ROWS8`].
    #[target_feature(enable = "avx2")]
    pub(super) fn fused_blocks_avx2<const F16: bool>(
        first_raw: u64,
        first_wide: u64,
        blocks: &[[u8; 1024]],
    ) -> super::RawAndWidened {
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
        super::RawAndWidened {
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

    /// [`super::fused_blocks`] with AVX-512 (F and BW): each 64-byte load is 16 raw
    /// words and the 32 elements whose widenings are summed against the
    /// lane keys of [`ROWS16`].
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) fn fused_blocks_avx512<const F16: bool>(
        first_raw: u64,
        first_wide: u64,
        blocks: &[[u8; 1024]],
    ) -> super::RawAndWidened {
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
        super::RawAndWidened {
            raw: _mm512_reduce_add_epi64(raw_total) as u64,
            widened: _mm512_reduce_add_epi64(wide_total) as u64,
        }
    }

    /// [`super::sum_blocks`] with AVX2: 8 words per vector; the word sums
    /// are 32-bit lane adds, and `vpmuludq` multiplies the even lanes and
    /// (after a 64-bit shift right by 32) the odd lanes, exactly into
    /// 64-bit products.
    #[target_feature(enable = "avx2")]
    pub(super) fn sum_blocks_avx2(first_block: u64, blocks: &[[u8; 1024]]) -> u64 {
        // Block keys are computed 8 at a time ahead of the blocks that use
        // them: a key is a chain of dependent multiplies, which would
        // otherwise stall the start of every block.
        const AHEAD: usize = 8;
        const PREFETCH_BYTES: usize = 4096;
        let mut total = _mm256_setzero_si256();
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
        let lanes: [u64; 4] = bytemuck::cast(total);
        lanes.iter().fold(0u64, |s, &l| s.wrapping_add(l))
    }
}

/// The partial sum over the whole little-endian words of `bytes`, the
/// first at word position `start` (a trailing partial word is ignored).
fn sum_whole_words(start: u64, bytes: &[u8]) -> u64 {
    let mut s = 0u64;
    let mut i = start;
    let mut rest = bytes;
    // Head: up to the next block boundary.
    let lane = (i % BLOCK_WORDS) as usize;
    if lane != 0 {
        let take = (256 - lane).min(rest.len() / 4);
        if let Some((head, tail)) = rest.split_at_checked(4 * take) {
            s = s.wrapping_add(part_block(i / BLOCK_WORDS, lane, head.as_chunks().0));
            i += take as u64;
            rest = tail;
        }
    }
    // Whole blocks.
    let (blocks, tail) = rest.as_chunks::<1024>();
    s = s.wrapping_add(sum_blocks(i / BLOCK_WORDS, blocks));
    i += BLOCK_WORDS * blocks.len() as u64;
    // Tail: the start of one more block.
    s.wrapping_add(part_block(i / BLOCK_WORDS, 0, tail.as_chunks().0))
}

/// The partial sum `S` over the little-endian words of `bytes` (any
/// alignment), the first of which sits at word position `start_word` of
/// the whole buffer, on the calling thread. A trailing partial word is
/// zero-padded, as at the end of a buffer: so `bytes` must end at a word
/// boundary of the buffer or at its end. Partial sums of disjoint ranges
/// add (wrapping) to the sum of their union.
pub fn sum_bytes(start_word: u64, bytes: &[u8]) -> u64 {
    let s = sum_whole_words(start_word, bytes);
    let (words, rest) = bytes.as_chunks::<4>();
    if rest.is_empty() {
        return s;
    }
    let mut last = [0u8; 4];
    for (d, &b) in last.iter_mut().zip(rest) {
        *d = b;
    }
    s.wrapping_add(term(
        start_word + words.len() as u64,
        u32::from_le_bytes(last),
    ))
}

/// The partial sum `S` over `words`, the first of which sits at word
/// position `start` of the whole buffer, on the calling thread. Partial
/// sums of disjoint ranges add (wrapping) to the sum of their union.
pub fn sum_words(start: u64, words: &[u32]) -> u64 {
    if cfg!(target_endian = "little") {
        // On a little-endian target the words' memory is their
        // little-endian bytes.
        sum_whole_words(start, bytemuck::cast_slice(words))
    } else {
        words
            .iter()
            .enumerate()
            .fold(0u64, |s, (k, &w)| s.wrapping_add(term(start + k as u64, w)))
    }
}

/// Bytes per parallel task (a whole number of blocks).
const PAR_CHUNK_BYTES: usize = 256 * 1024;
/// Below this many bytes the parallel sums run on the calling thread.
pub const PAR_MIN_BYTES: usize = 512 * 1024;

/// [`sum_bytes`] split over the rayon pool for large inputs (same result).
pub fn par_sum_bytes(start_word: u64, bytes: &[u8]) -> u64 {
    use rayon::prelude::*;
    if bytes.len() < PAR_MIN_BYTES || rayon::current_num_threads() < 2 {
        return sum_bytes(start_word, bytes);
    }
    bytes
        .par_chunks(PAR_CHUNK_BYTES)
        .enumerate()
        .map(|(k, c)| sum_bytes(start_word + (k * (PAR_CHUNK_BYTES / 4)) as u64, c))
        .reduce(|| 0, u64::wrapping_add)
}

/// [`sum_words`] split over the rayon pool for large inputs (same result).
pub fn par_sum_words(start: u64, words: &[u32]) -> u64 {
    use rayon::prelude::*;
    const CHUNK: usize = PAR_CHUNK_BYTES / 4;
    if words.len() < PAR_MIN_BYTES / 4 || rayon::current_num_threads() < 2 {
        return sum_words(start, words);
    }
    words
        .par_chunks(CHUNK)
        .enumerate()
        .map(|(k, c)| sum_words(start + (k * CHUNK) as u64, c))
        .reduce(|| 0, u64::wrapping_add)
}

/// Finishes a total sum `S` of a buffer of `len_bytes` bytes.
#[inline]
pub const fn finish(sum: u64, len_bytes: u64) -> Fingerprint {
    Fingerprint(mix64(sum ^ mix64(len_bytes.wrapping_add(LEN_SEED))))
}

/// The fingerprint of a byte buffer (any length, any alignment); parallel
/// for large buffers.
pub fn fingerprint_bytes(bytes: &[u8]) -> Fingerprint {
    finish(par_sum_bytes(0, bytes), bytes.len() as u64)
}

/// The fingerprint of a buffer of 32-bit words (`4 * words.len()` bytes,
/// each word little-endian); parallel for large buffers.
pub fn fingerprint_words(words: &[u32]) -> Fingerprint {
    finish(par_sum_words(0, words), 4 * words.len() as u64)
}

/// The fingerprint of a buffer that arrives in order, in pieces of any
/// length.
///
/// ```
/// use rocm_safe::convert::fingerprint::{fingerprint_bytes, Fingerprinter};
/// let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
/// let mut f = Fingerprinter::new();
/// for piece in data.chunks(333) {
///     f.update(piece);
/// }
/// assert_eq!(f.finish(), fingerprint_bytes(&data));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Fingerprinter {
    sum: u64,
    len: u64,
    pending: [u8; 4],
}

impl Fingerprinter {
    /// An empty buffer so far.
    pub const fn new() -> Self {
        Self {
            sum: 0,
            len: 0,
            pending: [0; 4],
        }
    }

    /// Bytes seen so far.
    pub const fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte was seen yet.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes` to the buffer (parallel for large pieces).
    pub fn update(&mut self, mut bytes: &[u8]) {
        // Complete a word left partial by the previous piece.
        let mut fill = (self.len % 4) as usize;
        while fill != 0 {
            let Some((&b, rest)) = bytes.split_first() else {
                return;
            };
            if let Some(p) = self.pending.get_mut(fill) {
                *p = b;
            }
            bytes = rest;
            self.len += 1;
            fill = (self.len % 4) as usize;
            if fill == 0 {
                let w = u32::from_le_bytes(self.pending);
                self.sum = self.sum.wrapping_add(term(self.len / 4 - 1, w));
                self.pending = [0; 4];
            }
        }
        let (words, rest) = bytes.as_chunks::<4>();
        let whole = words.as_flattened();
        self.sum = self.sum.wrapping_add(par_sum_bytes(self.len / 4, whole));
        self.len += whole.len() as u64;
        for (p, &b) in self.pending.iter_mut().zip(rest) {
            *p = b;
        }
        self.len += rest.len() as u64;
    }

    /// The fingerprint of everything appended so far.
    pub fn finish(&self) -> Fingerprint {
        let mut sum = self.sum;
        if !self.len.is_multiple_of(4) {
            // The pending bytes past `len` are still zero: padding.
            sum = sum.wrapping_add(term(self.len / 4, u32::from_le_bytes(self.pending)));
        }
        finish(sum, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both builds of the block loop (the tests elsewhere only reach the
    /// one the CPU selects) against the one-word definition.
    #[test]
    fn portable_and_simd_block_sums_equal_the_definition() {
        let mut s = 5u64;
        let bytes: Vec<u8> = (0..4 * 1024 + 3)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                mix64(s) as u8
            })
            .collect();
        let (blocks, _) = bytes.as_chunks::<1024>();
        for first in [0u64, 1, 1 << 40] {
            let want = bytes[..4 * 1024]
                .chunks_exact(4)
                .enumerate()
                .fold(0u64, |acc, (k, w)| {
                    let w = u32::from_le_bytes(w.try_into().unwrap());
                    acc.wrapping_add(term(first * BLOCK_WORDS + k as u64, w))
                });
            assert_eq!(sum_blocks_portable(first, blocks), want);
            assert_eq!(sum_blocks(first, blocks), want);
            #[cfg(target_arch = "x86_64")]
            if super::super::kernels::has_avx2() {
                // SAFETY: AVX2 was just detected.
                assert_eq!(unsafe { x86::sum_blocks_avx2(first, blocks) }, want);
            }
        }
    }

    /// The fused bf16 -> f32 block sums (both builds) equal the sum of the
    /// widened words.
    #[test]
    fn fused_bf16_block_sums_equal_the_definition() {
        let mut s = 6u64;
        let src: Vec<u8> = (0..3 * 512)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                mix64(s) as u8
            })
            .collect();
        let (blocks, _) = src.as_chunks::<512>();
        for first in [0u64, 5, 1 << 40] {
            let want = src.chunks_exact(2).enumerate().fold(0u64, |acc, (k, h)| {
                let w = (u16::from_le_bytes(h.try_into().unwrap()) as u32) << 16;
                acc.wrapping_add(term(first * BLOCK_WORDS + k as u64, w))
            });
            assert_eq!(sum_bf16_as_f32_blocks(first, blocks), want);
            #[cfg(target_arch = "x86_64")]
            if super::super::kernels::has_avx2() {
                // SAFETY: AVX2 was just detected.
                let fused = unsafe { x86::sum_bf16_as_f32_blocks_avx2(first, blocks) };
                assert_eq!(fused, want);
            }
        }
    }

    /// Deterministic pseudo-random bytes.
    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                mix64(s) as u8
            })
            .collect()
    }

    /// Mostly normal f16 values (as in real tensors) with zeros, both
    /// infinities, NaNs (quiet and signalling) and subnormals planted at
    /// varying positions; as bf16 the same bits are ordinary values.
    fn mostly_normal_f16(n: usize, seed: u64) -> Vec<u8> {
        const SPECIAL: [u16; 10] = [
            0x0000, 0x8000, 0x0001, 0x83ff, 0x03ff, 0x7c00, 0xfc00, 0x7e01, 0x7c01, 0xffff,
        ];
        let mut s = seed;
        (0..n)
            .flat_map(|i| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let r = mix64(s);
                let h = if i % 97 == 13 {
                    SPECIAL[(r >> 40) as usize % SPECIAL.len()]
                } else {
                    (r as u16 & 0x83ff) | ((1 + (r >> 16) as u16 % 30) << 10)
                };
                h.to_le_bytes()
            })
            .collect()
    }

    /// The definition: `(raw, widened)` of `bytes` at word `start` as sums
    /// of [`term`] over the words and over the widened elements.
    fn fused_by_definition(f16: bool, start: u64, bytes: &[u8]) -> RawAndWidened {
        let raw = bytes.chunks(4).enumerate().fold(0u64, |acc, (k, w)| {
            let mut b = [0u8; 4];
            b[..w.len()].copy_from_slice(w);
            acc.wrapping_add(term(start + k as u64, u32::from_le_bytes(b)))
        });
        let widened = bytes.chunks_exact(2).enumerate().fold(0u64, |acc, (k, h)| {
            let h = u16::from_le_bytes([h[0], h[1]]);
            let w = if f16 {
                crate::convert::scalar::f16_to_f32(h)
            } else {
                crate::convert::scalar::bf16_to_f32(h)
            };
            acc.wrapping_add(term(2 * start + k as u64, w))
        });
        RawAndWidened { raw, widened }
    }

    /// The two separate existing sums: [`sum_bytes`] of the bytes and
    /// [`sum_bytes`] of the output of `convert_bytes`.
    fn fused_by_separate_sums(f16: bool, start: u64, bytes: &[u8]) -> RawAndWidened {
        use crate::dtype::DType;
        let from = if f16 { DType::F16 } else { DType::BF16 };
        let whole = &bytes[..bytes.len() / 2 * 2];
        let mut out = vec![0u8; 2 * whole.len()];
        crate::convert::convert_bytes(from, whole, DType::F32, &mut out).unwrap();
        RawAndWidened {
            raw: sum_bytes(start, bytes),
            widened: sum_bytes(2 * start, &out),
        }
    }

    /// Every build of the fused block loop (portable, AVX2, AVX-512 where
    /// the CPU has them) against the definition, for bf16 and f16 over
    /// every 16-bit pattern in both halves of a word, random words, and
    /// mostly normal data with planted special values.
    #[test]
    fn fused_block_builds_equal_the_definition() {
        let every: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        let every_swapped: Vec<u8> = (0..=u16::MAX).flat_map(|h| (h ^ 1).to_le_bytes()).collect();
        let inputs = [
            every,
            every_swapped,
            random_bytes(37 * 1024, 7),
            mostly_normal_f16(40 * 512, 8),
        ];
        for bytes in &inputs {
            let (blocks, _) = bytes.as_chunks::<1024>();
            let whole = blocks.as_flattened();
            for first in [0u64, 3, 1 << 40] {
                for f16 in [false, true] {
                    let want = fused_by_definition(f16, first * BLOCK_WORDS, whole);
                    let mut got = vec![(
                        "portable",
                        if f16 {
                            fused_blocks_portable::<true>(first, 2 * first, blocks)
                        } else {
                            fused_blocks_portable::<false>(first, 2 * first, blocks)
                        },
                    )];
                    #[cfg(target_arch = "x86_64")]
                    {
                        if super::super::kernels::has_avx2() {
                            // SAFETY: AVX2 was just detected.
                            let s = unsafe {
                                if f16 {
                                    x86::fused_blocks_avx2::<true>(first, 2 * first, blocks)
                                } else {
                                    x86::fused_blocks_avx2::<false>(first, 2 * first, blocks)
                                }
                            };
                            got.push(("avx2", s));
                        }
                        if x86::has_avx512() {
                            // SAFETY: AVX-512F and AVX-512BW were just detected.
                            let s = unsafe {
                                if f16 {
                                    x86::fused_blocks_avx512::<true>(first, 2 * first, blocks)
                                } else {
                                    x86::fused_blocks_avx512::<false>(first, 2 * first, blocks)
                                }
                            };
                            got.push(("avx512", s));
                        }
                    }
                    for (name, s) in got {
                        assert_eq!(s, want, "{name} f16={f16} first block {first}");
                    }
                }
            }
        }
    }

    /// Which builds the machine running the tests exercised (so a run on a
    /// CPU without AVX-512 is visible in the log, not silently passing).
    #[test]
    fn report_fused_builds_tested() {
        #[cfg(target_arch = "x86_64")]
        println!(
            "fused sums: avx2 {}, avx512 {}",
            super::super::kernels::has_avx2(),
            x86::has_avx512()
        );
        let s = sum_raw_and_widened(crate::dtype::DType::BF16, 0, &[1, 2, 3, 4]).unwrap();
        assert_eq!(s, fused_by_definition(false, 0, &[1, 2, 3, 4]));
    }

    /// [`sum_raw_and_widened`] equals both the separate existing sums and
    /// the definition at every start position the loader uses (multiples
    /// of 64 KiB), at misaligned starts (head before the first block), with
    /// lengths that are not a multiple of the block, odd word tails and a
    /// trailing odd byte.
    #[test]
    fn fused_sums_equal_the_separate_sums() {
        use crate::dtype::DType;
        let starts = [
            0u64,
            1,
            2,
            127,
            128,
            255,
            256,
            257,
            16 * 1024,
            3 * 16 * 1024,
            1 << 40,
        ];
        let lens = [
            0usize,
            1,
            2,
            3,
            4,
            5,
            6,
            1018,
            1020,
            1022,
            1023,
            1024,
            1026,
            2048,
            4 * 1024 + 6,
            9 * 1024 + 2,
            20_000,
            65_536 + 1,
        ];
        let data = [random_bytes(70_000, 11), mostly_normal_f16(35_000, 12)];
        for bytes in &data {
            for &start in &starts {
                for &len in &lens {
                    let b = &bytes[..len];
                    for (from, f16) in [(DType::BF16, false), (DType::F16, true)] {
                        let got = sum_raw_and_widened(from, start, b).unwrap();
                        let want = fused_by_separate_sums(f16, start, b);
                        assert_eq!(got, want, "{from:?} start {start} len {len}");
                        if len <= 4 * 1024 + 6 {
                            assert_eq!(got, fused_by_definition(f16, start, b));
                        }
                    }
                }
            }
        }
        // The same at every alignment of the bytes in memory.
        for shift in 1..8 {
            let b = &data[0][shift..shift + 5000];
            for (from, f16) in [(DType::BF16, false), (DType::F16, true)] {
                assert_eq!(
                    sum_raw_and_widened(from, 256, b).unwrap(),
                    fused_by_separate_sums(f16, 256, b)
                );
            }
        }
    }

    /// Pieces add up: the sums of consecutive word-aligned pieces equal
    /// those of the whole (as the loader adds its 1 MiB parts).
    #[test]
    fn fused_sums_of_pieces_add_up() {
        use crate::dtype::DType;
        let bytes = random_bytes(3 * 65_536 + 10, 13);
        let whole = sum_raw_and_widened(DType::F16, 0, &bytes).unwrap();
        let mut acc = RawAndWidened::default();
        for (k, piece) in bytes.chunks(65_536).enumerate() {
            let s = sum_raw_and_widened(DType::F16, (k * 16_384) as u64, piece).unwrap();
            acc = acc.add(s);
        }
        assert_eq!(acc, whole);
        assert_eq!(whole.raw, sum_bytes(0, &bytes));
    }

    /// Only bf16 and f16 widen to f32 here: any other dtype is `None`.
    #[test]
    fn fused_sums_of_other_dtypes_are_none() {
        use crate::dtype::DType;
        for d in DType::ALL {
            let got = sum_raw_and_widened(d, 0, &[0u8; 8]);
            assert_eq!(
                got.is_some(),
                matches!(d, DType::BF16 | DType::F16),
                "{d:?}"
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]
        /// Random pieces at random starts, for both dtypes.
        #[test]
        fn fused_sums_match_separate_sums(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..6000),
            start in 0u64..5000,
            f16 in proptest::prelude::any::<bool>(),
        ) {
            use crate::dtype::DType;
            let from = if f16 { DType::F16 } else { DType::BF16 };
            let got = sum_raw_and_widened(from, start, &bytes).unwrap();
            proptest::prop_assert_eq!(got, fused_by_separate_sums(f16, start, &bytes));
        }
    }
}
