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
//!
//! Inside a 256-word block the block key is constant, so the loops work
//! block by block with the lane keys taken from precomputed tables
//! ([`LANE_ADD`], [`LANE_MUL`]): a portable loop the compiler vectorises
//! (SSE2 on x86-64), and on x86-64 an AVX2 loop chosen at run time, which
//! also computes block keys ahead and prefetches the data 4 KiB ahead.
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
}
