//! Raw and widened sums of a bf16/f16 piece in one pass.

use super::blocks::full_block;
use super::spec::BLOCK_WORDS;
use super::sum_bytes;

#[cfg(target_arch = "x86_64")]
use super::x86;

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
///   widening ([`crate::convert::scalar::bf16_to_f32`] or
///   [`crate::convert::scalar::f16_to_f32`]) of the whole elements of `bytes` (a
///   trailing odd byte is not an element and is left out of `widened`).
///
/// Every 1 KiB of `bytes` that is a whole keyed block of the buffer (it
/// starts at a word position that is a multiple of 256 (`BLOCK_WORDS`)) is one
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
        crate::convert::kernels::f16_to_f32(h)
    } else {
        crate::convert::scalar::bf16_to_f32(h)
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
pub(super) fn fused_blocks<const F16: bool>(
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
        if crate::convert::kernels::has_avx2() {
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
pub(super) fn fused_blocks_portable<const F16: bool>(
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
