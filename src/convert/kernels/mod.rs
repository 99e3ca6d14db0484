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

/// A 256-entry table of a scalar f8 conversion, made at compile time from
/// the scalar reference (so the table is the reference, code for code).
macro_rules! f8_table {
    ($name:ident, $t:ty, $f:path) => {
        static $name: [$t; 256] = {
            let mut t = [0; 256];
            let mut i = 0;
            while i < 256 {
                t[i] = $f(i as u8);
                i += 1;
            }
            t
        };
    };
}
f8_table!(E4M3_F32, u32, crate::convert::scalar::f8_e4m3_to_f32);
f8_table!(E5M2_F32, u32, crate::convert::scalar::f8_e5m2_to_f32);
f8_table!(E4M3_BF16, u16, crate::convert::scalar::f8_e4m3_to_bf16);
f8_table!(E5M2_BF16, u16, crate::convert::scalar::f8_e5m2_to_bf16);
f8_table!(E4M3_F16, u16, crate::convert::scalar::f8_e4m3_to_f16);
f8_table!(E5M2_F16, u16, crate::convert::scalar::f8_e5m2_to_f16);

/// The f8 kernels: one table look-up per element (a `u8` index cannot
/// leave a 256-entry table).
macro_rules! f8_kernel {
    ($name:ident, $stream:ident, $portable:ident, $d:literal, $table:ident) => {
        kernel!(
            $name,
            $stream,
            $portable,
            1,
            $d,
            1,
            |s: &[u8], d: &mut [u8]| {
                map(s, d, |b: [u8; 1]| $table[usize::from(b[0])].to_le_bytes())
            }
        );
    };
}
f8_kernel!(
    f8e4m3_f32,
    f8e4m3_f32_stream,
    f8e4m3_f32_portable,
    4,
    E4M3_F32
);
f8_kernel!(
    f8e5m2_f32,
    f8e5m2_f32_stream,
    f8e5m2_f32_portable,
    4,
    E5M2_F32
);
f8_kernel!(
    f8e4m3_bf16,
    f8e4m3_bf16_stream,
    f8e4m3_bf16_portable,
    2,
    E4M3_BF16
);
f8_kernel!(
    f8e5m2_bf16,
    f8e5m2_bf16_stream,
    f8e5m2_bf16_portable,
    2,
    E5M2_BF16
);
f8_kernel!(
    f8e4m3_f16,
    f8e4m3_f16_stream,
    f8e4m3_f16_portable,
    2,
    E4M3_F16
);
f8_kernel!(
    f8e5m2_f16,
    f8e5m2_f16_stream,
    f8e5m2_f16_portable,
    2,
    E5M2_F16
);

/// The identity pairs: a plain copy (the standard library's `memcpy`
/// already uses the best stores for large sizes).
pub(crate) fn copy(src: &[u8], dst: &mut [u8]) {
    let n = src.len().min(dst.len());
    if let (Some(d), Some(s)) = (dst.get_mut(..n), src.get(..n)) {
        d.copy_from_slice(s);
    }
}

/// A slice loop: converts `min(src.len() / src_size, dst.len() / dst_size)`
/// elements.
pub(crate) type Loop = fn(&[u8], &mut [u8]);

/// The three builds of a loop: dispatched, streaming stores, portable.
pub(crate) type Builds = [Loop; 3];

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

/// The kernel of a supported pair (its row of the conversion table),
/// `None` for any other pair.
pub(crate) fn kernel(from: DType, to: DType) -> Option<Kernel> {
    crate::convert::table::find(from, to).map(|row| row.bulk)
}

impl Kernel {
    /// A kernel of `src_size`- and `dst_size`-byte elements from its
    /// three builds (the conversion table's rows are made with it).
    pub(crate) const fn of(
        src_size: usize,
        dst_size: usize,
        [run, stream, portable]: Builds,
    ) -> Kernel {
        Kernel {
            src_size,
            dst_size,
            run,
            stream,
            portable,
        }
    }
}
