//! The buffer fingerprint of crate [contract 2](crate#contracts).
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
//!   partial sums over word ranges add up ([`sum_bytes`]).
//! - **position-keyed**: every position has its own `add_i`/`mul_i`, so
//!   swapped or shifted chunks change it.
//! - **any single-word change is always detected**: for fixed `i`, `t_i` is
//!   injective in `w[i]` (a bijection mod 2^32 times an odd multiplier, as an
//!   exact 64-bit product), and `mix64` is a bijection.
//! - **an all-zero buffer** hashes to its own value, different from the data's
//!   with overwhelming probability.
//!
//! The GPU kernel (`kernels/fingerprint.hip`) computes `S` with the same
//! formula; the host finishes it with [`finish`].
//!
//! # Computing it
//!
//! - [`fingerprint_bytes`] / [`fingerprint_words`]: a whole buffer (parallel
//!   above a size threshold).
//! - [`sum_bytes`] (one thread) and [`par_sum_bytes`] (rayon): the partial
//!   sum `S` of a word-aligned piece of a buffer, given the word position of
//!   its first word; add the partial sums of all pieces (wrapping) and
//!   [`finish`] with the total byte length (how a device's partial sums,
//!   [`Stream::fingerprint_sum_into`](crate::device::Stream::fingerprint_sum_into),
//!   are finished).
//! - [`Fingerprinter`]: the same for a buffer that arrives in order, in
//!   pieces of any length (not necessarily whole words).
//! - [`sum_raw_and_widened`]: for a piece of a bf16 or f16 buffer, both the
//!   partial sum of its bytes and that of their f32 widening, in one pass
//!   (what a verified bf16/f16 -> f32 upload checks).
//!

mod blocks;
mod spec;
mod stream;
#[cfg(test)]
mod tests;
pub(crate) mod value;
mod widened;
#[cfg(target_arch = "x86_64")]
mod x86;

pub(crate) use blocks::sum_bf16_as_f32_blocks;
pub(crate) use spec::mix64;
pub(crate) use spec::term;
pub use spec::{finish, Fingerprint};
pub use stream::Fingerprinter;
// The loader's one-pass host sums: public for benches/convert.rs only (a
// bench is a crate of its own), not part of the API.
#[doc(hidden)]
pub use widened::{sum_raw_and_widened, RawAndWidened};

use blocks::sum_whole_words;

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

/// Copies `src` into `dst` (the same length) and returns [`sum_bytes`]`(
/// start_word, src)`, in one pass over `src` where the CPU allows (AVX2,
/// `start_word` at a block boundary: the whole blocks are summed as they
/// are stored, with non-temporal stores into an aligned `dst`), else a
/// copy then a sum. The staging copy of an upload and its fingerprint.
pub(crate) fn copy_and_sum(start_word: u64, src: &[u8], dst: &mut [u8]) -> u64 {
    debug_assert_eq!(src.len(), dst.len());
    #[cfg(target_arch = "x86_64")]
    if start_word.is_multiple_of(256)
        && crate::convert::kernels::has_avx2()
        && src.len() == dst.len()
    {
        let (blocks, _) = src.as_chunks::<1024>();
        let head = 1024 * blocks.len();
        // SAFETY: `dst` is a distinct, writable slice as long as `src`
        // (both borrowed: they cannot overlap), so its first `head` bytes
        // take the blocks; the CPU was just detected to have AVX2.
        let s = unsafe { x86::copy_sum_blocks_avx2(start_word / 256, blocks, dst.as_mut_ptr()) };
        dst[head..].copy_from_slice(&src[head..]);
        return s.wrapping_add(sum_bytes(start_word + (head / 4) as u64, &src[head..]));
    }
    dst.copy_from_slice(src);
    sum_bytes(start_word, dst)
}

/// The partial sum `S` over `words`, the first of which sits at word
/// position `start` of the whole buffer, on the calling thread. Partial
/// sums of disjoint ranges add (wrapping) to the sum of their union.
pub(crate) fn sum_words(start: u64, words: &[u32]) -> u64 {
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
const PAR_MIN_BYTES: usize = 512 * 1024;

/// [`sum_bytes`] split over the rayon pool for large inputs (same result).
pub fn par_sum_bytes(start_word: u64, bytes: &[u8]) -> u64 {
    use rayon::prelude::*;
    if bytes.len() < PAR_MIN_BYTES || crate::par::threads() < 2 {
        return sum_bytes(start_word, bytes);
    }
    crate::par::install(|| {
        bytes
            .par_chunks(PAR_CHUNK_BYTES)
            .enumerate()
            .map(|(k, c)| sum_bytes(start_word + (k * (PAR_CHUNK_BYTES / 4)) as u64, c))
            .reduce(|| 0, u64::wrapping_add)
    })
}

/// [`sum_words`] split over the rayon pool for large inputs (same result).
pub(crate) fn par_sum_words(start: u64, words: &[u32]) -> u64 {
    use rayon::prelude::*;
    const CHUNK: usize = PAR_CHUNK_BYTES / 4;
    if words.len() < PAR_MIN_BYTES / 4 || crate::par::threads() < 2 {
        return sum_words(start, words);
    }
    crate::par::install(|| {
        words
            .par_chunks(CHUNK)
            .enumerate()
            .map(|(k, c)| sum_words(start + (k * CHUNK) as u64, c))
            .reduce(|| 0, u64::wrapping_add)
    })
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
