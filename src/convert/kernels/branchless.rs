//! Branchless element conversions and their short forms for the common case.
//!
//! Each gives the scalar reference's result with no data-dependent branch,
//! so LLVM vectorises the loops built from them.

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
pub(super) fn f16_is_special(h: u16) -> bool {
    let em = h & 0x7fff;
    em.wrapping_sub(1) < 0x3ff || em >= 0x7c00
}

/// [`f16_to_f32`] of a zero or a normal f16.
#[inline(always)]
pub(super) fn f16_to_f32_normal(h: u16) -> u32 {
    let h = h as u32;
    let em = h & 0x7fff;
    let r = if em == 0 { 0 } else { (em << 13) + (112 << 23) };
    ((h & 0x8000) << 16) | r
}

/// Whether f32 `x` needs the general [`f32_to_f16`]: anything but a zero or
/// a value in the f16 normal range `[2^-14, 2^16)` (before rounding).
#[inline(always)]
pub(super) fn f32_is_special_for_f16(x: u32) -> bool {
    let a = x & 0x7fff_ffff;
    a != 0 && a.wrapping_sub(0x3880_0000) >= 0x4780_0000 - 0x3880_0000
}

/// [`f32_to_f16`] of a zero or a value in the f16 normal range.
#[inline(always)]
pub(super) fn f32_to_f16_normal(x: u32) -> u16 {
    let a = x & 0x7fff_ffff;
    let normal = ((a + 0x0fff + ((a >> 13) & 1)) >> 13).wrapping_sub(112 << 10);
    let r = if a == 0 { 0 } else { normal };
    (((x >> 16) & 0x8000) | r) as u16
}

/// Whether f64 `x` needs the general [`f64_to_f32`]: anything but a zero or
/// a value in the f32 normal range.
#[inline(always)]
pub(super) fn f64_is_special(x: u64) -> bool {
    let a = x & 0x7fff_ffff_ffff_ffff;
    a != 0 && a.wrapping_sub(0x3810_0000_0000_0000) >= 0x47f0_0000_0000_0000 - 0x3810_0000_0000_0000
}

/// [`f64_to_f32`] of a zero or a value in the f32 normal range.
#[inline(always)]
pub(super) fn f64_to_f32_normal(x: u64) -> u32 {
    let a = x & 0x7fff_ffff_ffff_ffff;
    let normal = (((a + 0x0fff_ffff + ((a >> 29) & 1)) >> 29) as u32).wrapping_sub(896 << 23);
    let r = if a == 0 { 0 } else { normal };
    ((x >> 32) as u32 & 0x8000_0000) | r
}
