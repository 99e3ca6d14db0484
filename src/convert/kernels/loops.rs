//! The slice loops every kernel is built from, with streaming stores.
//!
//! Element maps, grouped maps with a short form, streaming stores; CPU
//! feature checks and prefetch.

/// Applies `f` to every `S`-byte source element, writing `D` bytes each.
/// Stops at the shorter of the two (callers pass matching lengths).
#[inline(always)]
pub(super) fn map<const S: usize, const D: usize>(
    src: &[u8],
    dst: &mut [u8],
    f: impl Fn([u8; S]) -> [u8; D],
) {
    let (s, _) = src.as_chunks::<S>();
    let (d, _) = dst.as_chunks_mut::<D>();
    for (o, i) in d.iter_mut().zip(s) {
        *o = f(*i);
    }
}

/// Elements per group of [`map_split`].
const GROUP: usize = 16;

/// [`map`] in groups of [`GROUP`] elements: a group none of whose elements
/// is `special` is converted with `fast`, any other with `full`. `fast` must
/// equal `full` on every element that is not `special`.
#[inline(always)]
pub(super) fn map_split<const S: usize, const D: usize>(
    src: &[u8],
    dst: &mut [u8],
    special: impl Fn([u8; S]) -> bool,
    fast: impl Fn([u8; S]) -> [u8; D],
    full: impl Fn([u8; S]) -> [u8; D],
) {
    let (s, _) = src.as_chunks::<S>();
    let (d, _) = dst.as_chunks_mut::<D>();
    let mut sg = s.chunks_exact(GROUP);
    let mut dg = d.chunks_exact_mut(GROUP);
    for (o, i) in (&mut dg).zip(&mut sg) {
        // One pass with the short form, noting any special element; redo
        // the group with the general form if there was one.
        let mut any = false;
        for (o, i) in o.iter_mut().zip(i) {
            *o = fast(*i);
            any |= special(*i);
        }
        if any {
            for (o, i) in o.iter_mut().zip(i) {
                *o = full(*i);
            }
        }
    }
    for (o, i) in dg.into_remainder().iter_mut().zip(sg.remainder()) {
        *o = full(*i);
    }
}

/// Asks the CPU to start loading `bytes` into the cache (x86-64; a no-op
/// elsewhere). Only a hint: it never faults and changes no result.
#[inline]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: `_mm_prefetch` only needs SSE, which every x86-64 CPU has
        // (it is part of the target's baseline); a prefetch of a valid
        // address (the start of `line`) is a hint that never faults and
        // writes nothing.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Whether the running CPU has AVX2 (cached by the standard library).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// A slice converter `g` ([`map`] or [`map_split`]) with non-temporal
/// (streaming) stores for the 32-byte aligned
/// middle of `dst`: the output goes to memory without first being read into
/// the cache, which saves a third of the memory traffic of a large
/// conversion whose output is not read back soon (a staging buffer, a
/// checkpoint being written). `SB` is the source bytes of one 64-byte
/// output block (`64 / D * S`); `PIECE` is the number of blocks converted
/// at a time (1 for loops LLVM keeps in registers, 64 for [`map_split`],
/// whose groups need a buffer).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) fn map_stream<const S: usize, const D: usize, const SB: usize, const PIECE: usize>(
    src: &[u8],
    dst: &mut [u8],
    g: impl Fn(&[u8], &mut [u8]) + Copy,
) {
    use std::arch::x86_64::{__m256i, _mm256_stream_si256, _mm_prefetch, _mm_sfence, _MM_HINT_T0};
    const PREFETCH_BYTES: usize = 4096;
    const { assert!(SB == 64 / D * S && 64 % D == 0 && PIECE > 0) };
    let n = (src.len() / S).min(dst.len() / D);
    let off = dst.as_ptr().align_offset(32);
    // Elements before the first 32-byte boundary; none fit when the
    // destination is not even aligned to an element.
    let head = if off.is_multiple_of(D) {
        (off / D).min(n)
    } else {
        n
    };
    let (Some((sh, sr)), Some((dh, dr))) = (
        src.split_at_checked(head * S),
        dst.split_at_mut_checked(head * D),
    ) else {
        return g(src, dst);
    };
    g(sh, dh);
    let (sblocks, _) = sr.as_chunks::<SB>();
    let (dblocks, _) = dr.as_chunks_mut::<64>();
    let blocks = sblocks.len().min(dblocks.len()).min((n - head) * D / 64);
    // Convert a piece of up to `PIECE` blocks into a buffer that stays in
    // the L1 cache (in registers for `PIECE == 1` and a simple `g`), then
    // stream it out.
    let mut buf = [[0u8; 64]; PIECE];
    for (d, s) in dblocks
        .get_mut(..blocks)
        .unwrap_or_default()
        .chunks_mut(PIECE)
        .zip(sblocks.chunks(PIECE))
    {
        // Ask for the source a few KiB ahead (a prefetch never faults, so
        // the address may lie past the end).
        let src_piece = s.as_flattened();
        for line in (0..src_piece.len()).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(
                src_piece
                    .as_ptr()
                    .wrapping_add(PREFETCH_BYTES + line)
                    .cast(),
            );
        }
        let out = buf.get_mut(..d.len()).unwrap_or_default();
        g(src_piece, out.as_flattened_mut());
        for (d, o) in d.iter_mut().zip(out.iter()) {
            let [lo, hi]: [[u8; 32]; 2] = bytemuck::cast(*o);
            let (lo, hi): (__m256i, __m256i) = (bytemuck::cast(lo), bytemuck::cast(hi));
            let p = d.as_mut_ptr().cast::<__m256i>();
            // SAFETY: `d` is an exclusive 64-byte chunk of `dst`, so both
            // 32-byte halves at `p` and `p + 1` are valid for writes. The
            // chunks start at `dr`, which is 32-byte aligned (`head * D ==
            // off`, the offset of the first 32-byte boundary, whenever
            // `blocks > 0`), and are 64 bytes long, so each half is 32-byte
            // aligned, as `_mm256_stream_si256` requires.
            unsafe {
                _mm256_stream_si256(p, lo);
                _mm256_stream_si256(p.add(1), hi);
            }
        }
    }
    // Streaming stores are weakly ordered: fence them before anything this
    // thread does next (such as signalling completion to another thread).
    _mm_sfence();
    let (Some(st), Some(dt)) = (sr.get(blocks * SB..), dr.get_mut(blocks * 64..)) else {
        return;
    };
    g(st, dt);
}
