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

/// The partial sum `S` over `words`, the first of which sits at word
/// position `start` of the whole buffer. Partial sums of disjoint ranges add
/// (wrapping) to the sum of their union.
pub fn sum_words(start: u64, words: &[u32]) -> u64 {
    words
        .iter()
        .enumerate()
        .fold(0u64, |s, (k, &w)| s.wrapping_add(term(start + k as u64, w)))
}

/// Finishes a total sum `S` of a buffer of `len_bytes` bytes.
#[inline]
pub const fn finish(sum: u64, len_bytes: u64) -> Fingerprint {
    Fingerprint(mix64(sum ^ mix64(len_bytes.wrapping_add(LEN_SEED))))
}

/// The fingerprint of a byte buffer (any length, any alignment).
pub fn fingerprint_bytes(bytes: &[u8]) -> Fingerprint {
    let mut sum = 0u64;
    let mut chunks = bytes.chunks_exact(4);
    let mut i = 0u64;
    for c in &mut chunks {
        sum = sum.wrapping_add(term(i, u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        i += 1;
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut last = [0u8; 4];
        last[..rest.len()].copy_from_slice(rest);
        sum = sum.wrapping_add(term(i, u32::from_le_bytes(last)));
    }
    finish(sum, bytes.len() as u64)
}

/// The fingerprint of a buffer of 32-bit words (`4 * words.len()` bytes).
pub fn fingerprint_words(words: &[u32]) -> Fingerprint {
    finish(sum_words(0, words), 4 * words.len() as u64)
}
