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
//! tested against [`crate::convert::scalar`] over every 16-bit pattern and over large
//! samples of f32/f64 patterns.
//!
//! Files: `branchless.rs` (the element conversions and short forms),
//! `loops.rs` (the slice loops and streaming stores), this file (one kernel
//! per pair, three builds each, and the table), `tests.rs`.

use crate::dtype::DType;

mod branchless;
mod loops;
#[cfg(test)]
mod tests;

pub(crate) use branchless::f16_to_f32;
use branchless::*;
#[cfg(target_arch = "x86_64")]
pub(crate) use loops::has_avx2;
#[cfg(target_arch = "x86_64")]
use loops::map_stream;
pub(crate) use loops::prefetch;
use loops::{map, map_split};

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
