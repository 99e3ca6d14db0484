//! Bulk conversion kernels: one specialised loop per (from, to) pair.
//!
//! Every loop reads fixed-size little-endian byte arrays (`as_chunks`) and
//! applies a *branchless* form of the scalar reference conversion, so LLVM
//! turns it into straight-line SIMD code. Where the general form is long
//! (f16 sources, f16 targets, f64 sources), groups of 16 elements that are
//! all zeros or normal numbers, the usual case, take a short form instead
//! ([`map_split`]). Each loop is built three ways: for the baseline target
//! (SSE2 on x86-64), for AVX2 (chosen at run time), and for AVX2 with
//! streaming stores (for outputs larger than the caches). All of them are
//! tested against [`super::scalar`] over every 16-bit pattern and over large
//! samples of f32/f64 patterns.

use crate::dtype::DType;

// ----- branchless element conversions -----------------------------------------

/// f16 -> f32 (exact widening), written without branches.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> u32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let man = h & 0x3ff;
    // Normal: rebias the exponent (15 -> 127). Inf/NaN: exponent 0x1f -> 0xff.
    let normal = (em << 13) + (112 << 23);
    let special = (em << 13) + (224 << 23);
    // Subnormal: man * 2^-24 = 1.f * 2^(p - 24), p the top set bit of man.
    // For man == 0 the result is discarded below (and nothing overflows:
    // leading_zeros(0) = 32 gives p = u32::MAX, only used in wrapping ops).
    let p = 31u32.wrapping_sub(man.leading_zeros());
    let sub = (p.wrapping_add(103) << 23) | (man.wrapping_shl(23u32.wrapping_sub(p)) & 0x7f_ffff);
    let r = if em >= 0x7c00 {
        special
    } else if em >= 0x0400 {
        normal
    } else if em != 0 {
        sub
    } else {
        0
    };
    sign | r
}

/// f32 -> f16 (round to nearest, ties to even; NaN kept quiet with its top
/// payload bits), written without branches.
#[inline(always)]
pub(crate) fn f32_to_f16(x: u32) -> u16 {
    let sign = (x >> 16) & 0x8000;
    let a = x & 0x7fff_ffff;
    let nan = 0x7e00 | ((a >> 13) & 0x3ff);
    // Normal results: drop 13 mantissa bits with round-to-nearest-even, then
    // rebias the exponent (127 -> 15). A carry out of the mantissa moves into
    // the exponent, up to infinity (0x7c00) exactly as IEEE rounding does.
    let normal = ((a + 0x0fff + ((a >> 13) & 1)) >> 13).wrapping_sub(112 << 10);
    // Subnormal results: the full significand shifted right by 126 - exp
    // (14..=24 where the result is not zero). Lanes outside that range are
    // discarded below; the clamp keeps their shifts in range (no shift by
    // 32 or more, no `shift - 1` underflow).
    let exp = a >> 23;
    let shift = 126u32.wrapping_sub(exp).clamp(14, 31);
    let m = (a & 0x7f_ffff) | 0x80_0000;
    let q = m >> shift;
    let sub = (m + ((1 << (shift - 1)) - 1) + (q & 1)) >> shift;
    let r = if a > 0x7f80_0000 {
        nan
    } else if a >= 0x4780_0000 {
        0x7c00
    } else if a >= 0x3880_0000 {
        normal
    } else {
        sub
    };
    (sign | r) as u16
}

/// f32 -> bf16 (round to nearest, ties to even; NaN kept quiet with its top
/// payload bits). The scalar reference is already branch-free after LLVM.
#[inline(always)]
pub(crate) fn f32_to_bf16(x: u32) -> u16 {
    let nan = (x >> 16) | 0x0040;
    let r = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
    (if (x & 0x7fff_ffff) > 0x7f80_0000 {
        nan
    } else {
        r
    }) as u16
}

/// f64 -> f32 (round to nearest, ties to even), written without branches.
#[inline(always)]
pub(crate) fn f64_to_f32(x: u64) -> u32 {
    let sign = ((x >> 32) & 0x8000_0000) as u32;
    let a = x & 0x7fff_ffff_ffff_ffff;
    let nan = 0x7fc0_0000 | ((a >> 29) as u32 & 0x7f_ffff);
    // Normal results (f32 exponent >= 1, i.e. f64 exponent >= 897): drop 29
    // mantissa bits with round-to-nearest-even, rebias 1023 -> 127.
    let normal = (((a + 0x0fff_ffff + ((a >> 29) & 1)) >> 29) as u32).wrapping_sub(896 << 23);
    // Subnormal results: shift right by 926 - exp (30..=54 where the result
    // is not zero; clamped as in `f32_to_f16`).
    let exp = a >> 52;
    let shift = 926u64.wrapping_sub(exp).clamp(30, 63);
    let m = (a & 0x000f_ffff_ffff_ffff) | 0x0010_0000_0000_0000;
    let q = m >> shift;
    let sub = ((m + ((1 << (shift - 1)) - 1) + (q & 1)) >> shift) as u32;
    let r = if a > 0x7ff0_0000_0000_0000 {
        nan
    } else if a >= 0x47f0_0000_0000_0000 {
        0x7f80_0000
    } else if a >= 0x3810_0000_0000_0000 {
        normal
    } else {
        sub
    };
    sign | r
}

// ----- fast forms for the common case ------------------------------------------
//
// Real tensors are almost all normal numbers and zeros. The loops below
// convert 16 elements at a time with these shorter forms when none of the
// 16 needs the general one (a subnormal input or result, an infinity, a NaN
// or an overflow), and with the general form otherwise; the results are the
// same either way (tested over every pattern).

/// Whether f16 `h` needs the general [`f16_to_f32`]: a subnormal, an
/// infinity or a NaN.
#[inline(always)]
fn f16_is_special(h: u16) -> bool {
    let em = h & 0x7fff;
    em.wrapping_sub(1) < 0x3ff || em >= 0x7c00
}

/// [`f16_to_f32`] of a zero or a normal f16.
#[inline(always)]
fn f16_to_f32_normal(h: u16) -> u32 {
    let h = h as u32;
    let em = h & 0x7fff;
    let r = if em == 0 { 0 } else { (em << 13) + (112 << 23) };
    ((h & 0x8000) << 16) | r
}

/// Whether f32 `x` needs the general [`f32_to_f16`]: anything but a zero or
/// a value in the f16 normal range `[2^-14, 2^16)` (before rounding).
#[inline(always)]
fn f32_is_special_for_f16(x: u32) -> bool {
    let a = x & 0x7fff_ffff;
    a != 0 && a.wrapping_sub(0x3880_0000) >= 0x4780_0000 - 0x3880_0000
}

/// [`f32_to_f16`] of a zero or a value in the f16 normal range.
#[inline(always)]
fn f32_to_f16_normal(x: u32) -> u16 {
    let a = x & 0x7fff_ffff;
    let normal = ((a + 0x0fff + ((a >> 13) & 1)) >> 13).wrapping_sub(112 << 10);
    let r = if a == 0 { 0 } else { normal };
    (((x >> 16) & 0x8000) | r) as u16
}

/// Whether f64 `x` needs the general [`f64_to_f32`]: anything but a zero or
/// a value in the f32 normal range.
#[inline(always)]
fn f64_is_special(x: u64) -> bool {
    let a = x & 0x7fff_ffff_ffff_ffff;
    a != 0 && a.wrapping_sub(0x3810_0000_0000_0000) >= 0x47f0_0000_0000_0000 - 0x3810_0000_0000_0000
}

/// [`f64_to_f32`] of a zero or a value in the f32 normal range.
#[inline(always)]
fn f64_to_f32_normal(x: u64) -> u32 {
    let a = x & 0x7fff_ffff_ffff_ffff;
    let normal = (((a + 0x0fff_ffff + ((a >> 29) & 1)) >> 29) as u32).wrapping_sub(896 << 23);
    let r = if a == 0 { 0 } else { normal };
    ((x >> 32) as u32 & 0x8000_0000) | r
}

// ----- loops ------------------------------------------------------------------

/// Applies `f` to every `S`-byte source element, writing `D` bytes each.
/// Stops at the shorter of the two (callers pass matching lengths).
#[inline(always)]
fn map<const S: usize, const D: usize>(src: &[u8], dst: &mut [u8], f: impl Fn([u8; S]) -> [u8; D]) {
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
fn map_split<const S: usize, const D: usize>(
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
fn map_stream<const S: usize, const D: usize, const SB: usize, const PIECE: usize>(
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

/// Defines, for the slice converter `$g` (a closure calling [`map`] or
/// [`map_split`] on `$s`-byte source and `$d`-byte destination elements):
/// `$name(src, dst)`, dispatched to an AVX2 build when the CPU has it;
/// `$stream(src, dst)`, the same with streaming stores (AVX2 only, else
/// `$portable`); and `$portable`, the baseline build.
macro_rules! kernel {
    ($name:ident, $stream:ident, $portable:ident, $s:literal, $d:literal, $piece:literal, $g:expr) => {
        #[inline(never)]
        pub(crate) fn $portable(src: &[u8], dst: &mut [u8]) {
            ($g)(src, dst)
        }

        pub(crate) fn $name(src: &[u8], dst: &mut [u8]) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2(src: &[u8], dst: &mut [u8]) {
                    ($g)(src, dst)
                }
                if has_avx2() {
                    // SAFETY: `avx2` only needs the AVX2 instruction set
                    // (it is otherwise an ordinary safe function), and
                    // `is_x86_feature_detected!` just reported that the CPU
                    // running this code has it.
                    return unsafe { avx2(src, dst) };
                }
            }
            $portable(src, dst)
        }

        pub(crate) fn $stream(src: &[u8], dst: &mut [u8]) {
            #[cfg(target_arch = "x86_64")]
            if has_avx2() {
                // SAFETY: `map_stream` needs the AVX2 instruction set (its
                // own unsafe store is argued inside it), and
                // `is_x86_feature_detected!` just reported that the CPU
                // running this code has it.
                return unsafe { map_stream::<$s, $d, { 64 / $d * $s }, $piece>(src, dst, $g) };
            }
            $portable(src, dst)
        }
    };
}

#[inline(always)]
fn rd16(b: [u8; 2]) -> u16 {
    u16::from_le_bytes(b)
}
#[inline(always)]
fn rd32(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}
#[inline(always)]
fn rd64(b: [u8; 8]) -> u64 {
    u64::from_le_bytes(b)
}

kernel!(
    bf16_f32,
    bf16_f32_stream,
    bf16_f32_portable,
    2,
    4,
    1,
    |s: &[u8], d: &mut [u8]| { map(s, d, |b| ((rd16(b) as u32) << 16).to_le_bytes()) }
);
kernel!(
    f16_f32,
    f16_f32_stream,
    f16_f32_portable,
    2,
    4,
    64,
    |s: &[u8], d: &mut [u8]| {
        map_split(
            s,
            d,
            |b| f16_is_special(rd16(b)),
            |b| f16_to_f32_normal(rd16(b)).to_le_bytes(),
            |b| f16_to_f32(rd16(b)).to_le_bytes(),
        )
    }
);
kernel!(
    bf16_f16,
    bf16_f16_stream,
    bf16_f16_portable,
    2,
    2,
    64,
    |s: &[u8], d: &mut [u8]| {
        map_split(
            s,
            d,
            |b| f32_is_special_for_f16((rd16(b) as u32) << 16),
            |b| f32_to_f16_normal((rd16(b) as u32) << 16).to_le_bytes(),
            |b| f32_to_f16((rd16(b) as u32) << 16).to_le_bytes(),
        )
    }
);
kernel!(
    f16_bf16,
    f16_bf16_stream,
    f16_bf16_portable,
    2,
    2,
    64,
    |s: &[u8], d: &mut [u8]| {
        map_split(
            s,
            d,
            |b| f16_is_special(rd16(b)),
            |b| f32_to_bf16(f16_to_f32_normal(rd16(b))).to_le_bytes(),
            |b| f32_to_bf16(f16_to_f32(rd16(b))).to_le_bytes(),
        )
    }
);
kernel!(
    f32_bf16,
    f32_bf16_stream,
    f32_bf16_portable,
    4,
    2,
    1,
    |s: &[u8], d: &mut [u8]| { map(s, d, |b| f32_to_bf16(rd32(b)).to_le_bytes()) }
);
kernel!(
    f32_f16,
    f32_f16_stream,
    f32_f16_portable,
    4,
    2,
    64,
    |s: &[u8], d: &mut [u8]| {
        map_split(
            s,
            d,
            |b| f32_is_special_for_f16(rd32(b)),
            |b| f32_to_f16_normal(rd32(b)).to_le_bytes(),
            |b| f32_to_f16(rd32(b)).to_le_bytes(),
        )
    }
);
kernel!(
    f64_f32,
    f64_f32_stream,
    f64_f32_portable,
    8,
    4,
    64,
    |s: &[u8], d: &mut [u8]| {
        map_split(
            s,
            d,
            |b| f64_is_special(rd64(b)),
            |b| f64_to_f32_normal(rd64(b)).to_le_bytes(),
            |b| f64_to_f32(rd64(b)).to_le_bytes(),
        )
    }
);
kernel!(
    f64_bf16,
    f64_bf16_stream,
    f64_bf16_portable,
    8,
    2,
    64,
    |s: &[u8], d: &mut [u8]| {
        map_split(
            s,
            d,
            |b| f64_is_special(rd64(b)),
            |b| f32_to_bf16(f64_to_f32_normal(rd64(b))).to_le_bytes(),
            |b| f32_to_bf16(f64_to_f32(rd64(b))).to_le_bytes(),
        )
    }
);
kernel!(
    f64_f16,
    f64_f16_stream,
    f64_f16_portable,
    8,
    2,
    64,
    |s: &[u8], d: &mut [u8]| {
        map_split(
            s,
            d,
            |b| {
                let x = rd64(b);
                f64_is_special(x) || f32_is_special_for_f16(f64_to_f32_normal(x))
            },
            |b| f32_to_f16_normal(f64_to_f32_normal(rd64(b))).to_le_bytes(),
            |b| f32_to_f16(f64_to_f32(rd64(b))).to_le_bytes(),
        )
    }
);

/// The identity pairs: a plain copy (the standard library's `memcpy`
/// already uses the best stores for large sizes).
fn copy(src: &[u8], dst: &mut [u8]) {
    let n = src.len().min(dst.len());
    if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
        d.copy_from_slice(s);
    }
}

/// A bulk conversion loop and its element sizes.
#[derive(Clone, Copy)]
pub(crate) struct Kernel {
    /// Source element size in bytes.
    pub src_size: usize,
    /// Destination element size in bytes.
    pub dst_size: usize,
    /// Converts `min(src.len() / src_size, dst.len() / dst_size)` elements.
    pub run: fn(&[u8], &mut [u8]),
    /// The same loop with streaming stores where the CPU has them (for
    /// outputs much larger than the caches).
    pub stream: fn(&[u8], &mut [u8]),
    /// The same loop, baseline instruction set only.
    #[cfg_attr(not(test), allow(dead_code))]
    pub portable: fn(&[u8], &mut [u8]),
}

/// The kernel of a supported pair, `None` for any other pair.
pub(crate) fn kernel(from: DType, to: DType) -> Option<Kernel> {
    let k = |src_size, dst_size, (run, stream, portable)| {
        Some(Kernel {
            src_size,
            dst_size,
            run,
            stream,
            portable,
        })
    };
    let copies = (
        copy as fn(&[u8], &mut [u8]),
        copy as fn(&[u8], &mut [u8]),
        copy as fn(&[u8], &mut [u8]),
    );
    match (from, to) {
        (DType::BF16, DType::F32) => k(2, 4, (bf16_f32, bf16_f32_stream, bf16_f32_portable)),
        (DType::F16, DType::F32) => k(2, 4, (f16_f32, f16_f32_stream, f16_f32_portable)),
        (DType::F32, DType::F32) => k(4, 4, copies),
        (DType::F64, DType::F32) => k(8, 4, (f64_f32, f64_f32_stream, f64_f32_portable)),
        (DType::BF16, DType::BF16) => k(2, 2, copies),
        (DType::F16, DType::BF16) => k(2, 2, (f16_bf16, f16_bf16_stream, f16_bf16_portable)),
        (DType::F32, DType::BF16) => k(4, 2, (f32_bf16, f32_bf16_stream, f32_bf16_portable)),
        (DType::F64, DType::BF16) => k(8, 2, (f64_bf16, f64_bf16_stream, f64_bf16_portable)),
        (DType::BF16, DType::F16) => k(2, 2, (bf16_f16, bf16_f16_stream, bf16_f16_portable)),
        (DType::F16, DType::F16) => k(2, 2, copies),
        (DType::F32, DType::F16) => k(4, 2, (f32_f16, f32_f16_stream, f32_f16_portable)),
        (DType::F64, DType::F16) => k(8, 2, (f64_f16, f64_f16_stream, f64_f16_portable)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::scalar;

    const FROM: [DType; 4] = [DType::F64, DType::F32, DType::F16, DType::BF16];
    const TO: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Runs both builds of the kernel of `from -> to` over `src` (element
    /// patterns, zero-extended) and compares every element with the scalar
    /// reference.
    fn check_pair(from: DType, to: DType, patterns: &[u64]) {
        let k = kernel(from, to).unwrap();
        let src: Vec<u8> = patterns
            .iter()
            .flat_map(|p| p.to_le_bytes()[..k.src_size].to_vec())
            .collect();
        let runs = [
            ("dispatched", k.run),
            ("stream", k.stream),
            ("portable", k.portable),
        ];
        for (name, run) in runs {
            // The streaming variant at every destination offset that
            // changes its head/body/tail split.
            let offsets: &[usize] = if name == "stream" {
                &[0, 1, 2, 6, 31]
            } else {
                &[0]
            };
            for &off in offsets {
                let mut buf = vec![0xa5u8; off + patterns.len() * k.dst_size + 64];
                let dst = &mut buf[off..off + patterns.len() * k.dst_size];
                run(&src, dst);
                for (p, out) in patterns.iter().zip(dst.chunks_exact(k.dst_size)) {
                    let mut b = [0u8; 8];
                    b[..k.dst_size].copy_from_slice(out);
                    let want = scalar::convert_bits(from, to, *p).unwrap();
                    assert_eq!(
                        u64::from_le_bytes(b),
                        want,
                        "{name} {from:?}->{to:?} of {p:#x} at offset {off}"
                    );
                }
                assert!(
                    buf[..off].iter().all(|&b| b == 0xa5),
                    "{name} wrote before dst"
                );
                assert!(
                    buf[off + patterns.len() * k.dst_size..]
                        .iter()
                        .all(|&b| b == 0xa5),
                    "{name} wrote past dst"
                );
            }
        }
    }

    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        crate::convert::fingerprint::mix64(*state)
    }

    #[test]
    fn every_16_bit_pattern_matches_the_reference() {
        let all: Vec<u64> = (0..=u16::MAX as u64).collect();
        for from in [DType::F16, DType::BF16] {
            for to in TO {
                check_pair(from, to, &all);
            }
        }
    }

    /// Every exponent, both signs, mantissas at and around the rounding
    /// boundaries of both targets, and random mantissas.
    #[test]
    fn f32_patterns_match_the_reference() {
        let mut rng = 1u64;
        let mut pats = Vec::new();
        let edges = [
            0u32, 1, 2, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001,
            0xffff, 0x1_0000, 0x1_8000, 0x40_0000, 0x40_0001, 0x7f_e000, 0x7f_efff, 0x7f_f000,
            0x7f_f001, 0x7f_ffff,
        ];
        for sign in [0u32, 0x8000_0000] {
            for exp in 0..=255u32 {
                for m in edges {
                    pats.push((sign | exp << 23 | m) as u64);
                }
                for _ in 0..256 {
                    pats.push((sign | exp << 23 | (splitmix(&mut rng) as u32 & 0x7f_ffff)) as u64);
                }
            }
        }
        for _ in 0..100_000 {
            pats.push(splitmix(&mut rng) as u32 as u64);
        }
        for to in TO {
            check_pair(DType::F32, to, &pats);
        }
    }

    #[test]
    fn f64_patterns_match_the_reference() {
        let mut rng = 2u64;
        let mut pats = Vec::new();
        let edges = [
            0u64,
            1,
            0xfff_ffff,
            0x1000_0000,
            0x1000_0001,
            0x1fff_ffff,
            0x2000_0000,
            0x3000_0000,
            0x7_ffff_ffff,
            0x10_0000_0000,
            0x10_0000_0001,
            0x8_0000_0000_0000,
            0xf_ffff_e000_0000,
            0xf_ffff_f000_0000,
            0xf_ffff_ffff_ffff,
        ];
        for sign in [0u64, 1 << 63] {
            for exp in (0..=2047u64).filter(|e| !(30..=800).contains(e) && *e < 1300 || *e > 2040) {
                for m in edges {
                    pats.push(sign | exp << 52 | m);
                }
                for _ in 0..64 {
                    pats.push(sign | exp << 52 | (splitmix(&mut rng) & 0xf_ffff_ffff_ffff));
                }
            }
        }
        for _ in 0..100_000 {
            pats.push(splitmix(&mut rng));
        }
        for to in TO {
            check_pair(DType::F64, to, &pats);
        }
    }

    /// Mostly normal values, as in real tensors, so most groups of 16 take
    /// the fast forms; a special value (subnormal, zero, infinity, NaN,
    /// overflow) is planted in some groups at varying positions.
    #[test]
    fn mostly_normal_data_matches_the_reference() {
        let mut rng = 4u64;
        let n = 20_000;
        let mut f16s = Vec::new();
        let mut f32s = Vec::new();
        let mut f64s = Vec::new();
        for i in 0..n {
            let r = splitmix(&mut rng);
            // Normal f16 (exponent 1..=30), f32 and f64 within f16's normal
            // range, as the common case of each pair.
            let h = (r as u16 & 0x83ff) | ((1 + (r >> 16) as u16 % 30) << 10);
            let x = ((r >> 32) as u32 & 0x807f_ffff) | ((113 + (r >> 24) as u32 % 30) << 23);
            let y = (r & 0x800f_ffff_ffff_ffff) | ((1009 + (r >> 52) % 30) << 52);
            let (h, x, y) = if i % 53 == 7 {
                let k = (r >> 8) as usize % 6;
                (
                    [0x0001, 0x03ff, 0x8000, 0x7c00, 0x7e01, 0xfc00][k],
                    [
                        1,
                        0x3880_0000 - 1,
                        0x8000_0000,
                        0x7f80_0000,
                        0x7fc0_0001,
                        0x4780_0000,
                    ][k],
                    [
                        1,
                        0x3810_0000_0000_0000 - 1,
                        1 << 63,
                        0x7ff0_0000_0000_0000,
                        0x7ff8_0000_0000_0001,
                        0x47f0_0000_0000_0000,
                    ][k],
                )
            } else {
                (h, x, y)
            };
            f16s.push(h as u64);
            f32s.push(x as u64);
            f64s.push(y);
        }
        for to in TO {
            check_pair(DType::F16, to, &f16s);
            check_pair(
                DType::BF16,
                to,
                &f32s.iter().map(|x| x >> 16).collect::<Vec<_>>(),
            );
            check_pair(DType::F32, to, &f32s);
            check_pair(DType::F64, to, &f64s);
        }
        // The fast forms agree with the general ones wherever they are used.
        for h in 0..=u16::MAX {
            if !f16_is_special(h) {
                assert_eq!(f16_to_f32_normal(h), f16_to_f32(h), "{h:#x}");
            }
        }
        for &x in &f32s {
            let x = x as u32;
            if !f32_is_special_for_f16(x) {
                assert_eq!(f32_to_f16_normal(x), f32_to_f16(x), "{x:#x}");
            }
        }
        for &y in &f64s {
            if !f64_is_special(y) {
                assert_eq!(f64_to_f32_normal(y), f64_to_f32(y), "{y:#x}");
            }
        }
    }

    /// Short buffers: streaming with no aligned middle, a middle of one
    /// block, and odd tails.
    #[test]
    fn short_buffers_match_the_reference() {
        let mut rng = 3u64;
        let pats: Vec<u64> = (0..300).map(|_| splitmix(&mut rng)).collect();
        for from in FROM {
            for to in TO {
                for n in [0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 129, 300] {
                    check_pair(from, to, &pats[..n]);
                }
            }
        }
    }

    #[test]
    fn every_supported_pair_has_a_kernel() {
        for from in DType::ALL {
            for to in DType::ALL {
                assert_eq!(
                    kernel(from, to).is_some(),
                    crate::convert::supported(from, to)
                );
                if let Some(k) = kernel(from, to) {
                    assert_eq!(Some(k.src_size), from.size());
                    assert_eq!(Some(k.dst_size), to.size());
                }
            }
        }
        assert_eq!(FROM.len() * TO.len(), 12);
    }
}
