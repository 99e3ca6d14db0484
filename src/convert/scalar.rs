//! Scalar, integer-only conversions of single values (bit patterns in, bit
//! patterns out). These are the reference every bulk, SIMD and GPU path is
//! tested against.

use crate::dtype::DType;

/// bf16 -> f32: the bit pattern shifted left by 16, exactly as PyTorch does.
/// Signalling NaNs stay signalling (unlike `half::bf16::to_f32`).
#[inline(always)]
pub const fn bf16_to_f32(h: u16) -> u32 {
    (h as u32) << 16
}

/// f16 -> f32: the exact IEEE widening. Subnormals become normal f32 values,
/// NaN payloads are kept (shifted into the top of the f32 mantissa).
#[inline(always)]
pub const fn f16_to_f32(h: u16) -> u32 {
    let sign = ((h as u32) & 0x8000) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    if exp == 0x1f {
        return sign | 0x7f80_0000 | (man << 13);
    }
    if exp != 0 {
        return sign | ((exp + 112) << 23) | (man << 13);
    }
    if man == 0 {
        return sign;
    }
    // Subnormal: value = man * 2^-24 = 1.f * 2^(p - 24), p = top set bit.
    let p = 31 - man.leading_zeros();
    sign | ((p + 103) << 23) | ((man << (23 - p)) & 0x7f_ffff)
}

/// f32 -> bf16: round to nearest, ties to even. NaN stays NaN (sign and the
/// top payload bits kept, quiet bit set so the payload cannot vanish into an
/// infinity); overflow rounds to infinity; subnormals are rounded, not flushed.
#[inline(always)]
pub const fn f32_to_bf16(x: u32) -> u16 {
    if (x & 0x7fff_ffff) > 0x7f80_0000 {
        return ((x >> 16) | 0x0040) as u16;
    }
    let lsb = (x >> 16) & 1;
    (x.wrapping_add(0x7fff + lsb) >> 16) as u16
}

/// f32 -> f16: round to nearest, ties to even. NaN stays NaN (quiet bit set,
/// top payload bits kept); values past the f16 range become infinity;
/// results in the f16 subnormal range are rounded, not flushed.
#[inline(always)]
pub const fn f32_to_f16(x: u32) -> u16 {
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        if man != 0 {
            return sign | 0x7e00 | (man >> 13) as u16;
        }
        return sign | 0x7c00;
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32; // 14..=24
        let q = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let half = 1 << (shift - 1);
        let up = (rem > half || (rem == half && (q & 1) == 1)) as u32;
        return sign | (q + up) as u16;
    }
    let h = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    let up = (rem > 0x1000 || (rem == 0x1000 && (h & 1) == 1)) as u32;
    sign | (h + up) as u16
}

/// f64 -> f32: round to nearest, ties to even, in integer arithmetic (the same
/// result as an IEEE `as f32`, independent of any denormal mode).
#[inline(always)]
pub const fn f64_to_f32(x: u64) -> u32 {
    let sign = ((x >> 32) & 0x8000_0000) as u32;
    let exp = ((x >> 52) & 0x7ff) as i64;
    let man = x & ((1u64 << 52) - 1);
    if exp == 0x7ff {
        if man != 0 {
            return sign | 0x7fc0_0000 | (man >> 29) as u32;
        }
        return sign | 0x7f80_0000;
    }
    let e = exp - 1023 + 127;
    if e >= 0xff {
        return sign | 0x7f80_0000;
    }
    if e <= 0 {
        if e < -24 || exp == 0 {
            return sign;
        }
        let m = man | (1u64 << 52);
        let shift = (30 - e) as u32; // 30..=54
        let q = m >> shift;
        let rem = m & ((1u64 << shift) - 1);
        let half = 1u64 << (shift - 1);
        let up = (rem > half || (rem == half && (q & 1) == 1)) as u64;
        return sign | (q + up) as u32;
    }
    let h = ((e as u64) << 23) | (man >> 29);
    let rem = man & ((1u64 << 29) - 1);
    let half = 1u64 << 28;
    let up = (rem > half || (rem == half && (h & 1) == 1)) as u64;
    sign | (h + up) as u32
}

/// f64 -> bf16 through f32 (two roundings, exactly as PyTorch does).
#[inline(always)]
pub const fn f64_to_bf16(x: u64) -> u16 {
    f32_to_bf16(f64_to_f32(x))
}

/// f64 -> f16 through f32 (two roundings, exactly as PyTorch does).
#[inline(always)]
pub const fn f64_to_f16(x: u64) -> u16 {
    f32_to_f16(f64_to_f32(x))
}

/// bf16 -> f16 through f32 (exact widening, then one rounding).
#[inline(always)]
pub const fn bf16_to_f16(h: u16) -> u16 {
    f32_to_f16(bf16_to_f32(h))
}

/// f16 -> bf16 through f32 (exact widening, then one rounding).
#[inline(always)]
pub const fn f16_to_bf16(h: u16) -> u16 {
    f32_to_bf16(f16_to_f32(h))
}

/// f8 E4M3 ("e4m3fn", the safetensors `F8_E4M3`, torch's
/// `float8_e4m3fn`) -> f32: exact. Bias 7, 3 mantissa bits, subnormals
/// (`0x01..=0x07` are `m * 2^-9`), no infinities; `0x7F` and `0xFF` are
/// NaN and become an f32 NaN with the sign and the mantissa bits kept (as
/// PyTorch gives them: `0x7FF0_0000`), every other code its exact value.
#[inline(always)]
pub const fn f8_e4m3_to_f32(b: u8) -> u32 {
    let sign = ((b as u32) & 0x80) << 24;
    let exp = ((b >> 3) & 0xf) as u32;
    let man = (b & 0x7) as u32;
    if exp == 0xf && man == 0x7 {
        return sign | 0x7f80_0000 | (man << 20);
    }
    if exp != 0 {
        // (1.m) * 2^(exp - 7): f32 exponent exp - 7 + 127.
        return sign | ((exp + 120) << 23) | (man << 20);
    }
    if man == 0 {
        return sign;
    }
    // Subnormal: value = man * 2^-9 = 1.f * 2^(p - 9), p = top set bit.
    let p = 31 - man.leading_zeros();
    sign | ((p + 118) << 23) | ((man << (23 - p)) & 0x7f_ffff)
}

/// f8 E5M2 (the safetensors `F8_E5M2`, torch's `float8_e5m2`) -> f32:
/// exact. IEEE-like with bias 15, 2 mantissa bits, subnormals, infinities
/// (`0x7C`, `0xFC`) and NaNs (`0x7D..=0x7F`, `0xFD..=0xFF`, payload kept as
/// [`f16_to_f32`] keeps it): the code is the upper byte of an f16.
#[inline(always)]
pub const fn f8_e5m2_to_f32(b: u8) -> u32 {
    f16_to_f32((b as u16) << 8)
}

/// f8 E4M3 -> bf16 through f32 (exact for every number; a NaN stays NaN).
#[inline(always)]
pub const fn f8_e4m3_to_bf16(b: u8) -> u16 {
    f32_to_bf16(f8_e4m3_to_f32(b))
}

/// f8 E4M3 -> f16 through f32 (exact for every number; a NaN stays NaN).
#[inline(always)]
pub const fn f8_e4m3_to_f16(b: u8) -> u16 {
    f32_to_f16(f8_e4m3_to_f32(b))
}

/// f8 E5M2 -> bf16 through f32 (exact for every number; a NaN stays NaN).
#[inline(always)]
pub const fn f8_e5m2_to_bf16(b: u8) -> u16 {
    f32_to_bf16(f8_e5m2_to_f32(b))
}

/// f8 E5M2 -> f16 through f32 (exact for every number; a NaN stays NaN,
/// quieted as [`f32_to_f16`] quiets it).
#[inline(always)]
pub const fn f8_e5m2_to_f16(b: u8) -> u16 {
    f32_to_f16(f8_e5m2_to_f32(b))
}

/// The conversion of one element's bit pattern (zero-extended to 64 bits)
/// for a supported pair, `None` for any other pair. The result is the
/// target's bit pattern, zero-extended. This is the row's scalar function
/// of the conversion table ([`crate::convert::table`]).
pub fn convert_bits(from: DType, to: DType, bits: u64) -> Option<u64> {
    super::table::find(from, to).map(|row| (row.scalar)(bits))
}

/// The element-by-element reference for [`super::convert_bytes`]: the same
/// contract and errors, one [`convert_bits`] per element, no SIMD, no
/// threads. Slow; meant for tests and self-checks.
pub fn convert_bytes_reference(
    from: DType,
    src: &[u8],
    to: DType,
    dst: &mut [u8],
) -> crate::error::Result<()> {
    super::check("convert_bytes_reference", from, to, src.len(), dst.len())?;
    let (ss, ds) = (from.size().unwrap_or(1), to.size().unwrap_or(1));
    for (s, d) in src.chunks_exact(ss).zip(dst.chunks_exact_mut(ds)) {
        let mut b = [0u8; 8];
        for (x, y) in b.iter_mut().zip(s) {
            *x = *y;
        }
        let Some(v) = convert_bits(from, to, u64::from_le_bytes(b)) else {
            return Err(crate::error::Error::UnsupportedConversion {
                op: "convert_bytes_reference",
                from,
                to,
                tensor: None,
            });
        };
        for (x, y) in d.iter_mut().zip(v.to_le_bytes()) {
            *x = y;
        }
    }
    Ok(())
}
