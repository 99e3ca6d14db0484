//! Block sums: whole 256-word blocks (portable or AVX2) and partial blocks.

use super::spec::{block_consts, BLOCK_WORDS, LANE_ADD, LANE_MUL, PAIR_TABLES};

#[cfg(target_arch = "x86_64")]
use super::x86;

/// Sum of the terms of one whole block of 256 words, read as 128
/// little-endian pairs of words.
///
/// Written for the vectoriser: a pair `d = w[2k] | w[2k+1] << 32` is one
/// 64-bit lane; the even word's sum `lo32(d + add)` and the odd word's
/// `lo32((d >> 32) + add)` need no zero-extension, and the products of two
/// values below 2^32 map to `pmuludq`, which reads only the low halves.
#[inline(always)]
pub(super) fn full_block(block: u64, pairs: &[[u8; 8]; 128]) -> u64 {
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
pub(super) fn part_block(block: u64, lane: usize, words: &[[u8; 4]]) -> u64 {
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
pub(super) fn sum_blocks(first_block: u64, blocks: &[[u8; 1024]]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if crate::convert::kernels::has_avx2() {
        // SAFETY: `sum_blocks_avx2` only needs the AVX2 instruction set (it
        // is otherwise an ordinary safe function), and the CPU running this
        // code was just detected to have it.
        return unsafe { x86::sum_blocks_avx2(first_block, blocks) };
    }
    sum_blocks_portable(first_block, blocks)
}

pub(super) fn sum_blocks_portable(first_block: u64, blocks: &[[u8; 1024]]) -> u64 {
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
    if crate::convert::kernels::has_avx2() {
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

/// The partial sum over the whole little-endian words of `bytes`, the
/// first at word position `start` (a trailing partial word is ignored).
pub(super) fn sum_whole_words(start: u64, bytes: &[u8]) -> u64 {
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
