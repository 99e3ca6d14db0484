//! Bulk conversion kernels: one specialised loop per (from, to) pair.
//!
//! Every loop reads fixed-size little-endian byte arrays (`as_chunks`) and
//! applies a *branchless* form of the scalar reference conversion, so LLVM
//! turns it into straight-line SIMD code. Each loop is compiled twice: for the
//! baseline target (SSE2 on x86-64) and, on x86-64, for AVX2, chosen at run
//! time. The branchless forms are tested against [`super::scalar`] over every
//! 16-bit pattern and over large samples of f32/f64 patterns.

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

/// Whether the running CPU has AVX2 (cached by the standard library).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// Defines `$name(src, dst)`: the loop `map::<$s, $d>` with the element
/// function `$f`, dispatched to an AVX2 build of the same loop when the CPU
/// has it, and `$name_portable`, the baseline build (for tests).
macro_rules! kernel {
    ($name:ident, $portable:ident, $s:literal, $d:literal, $f:expr) => {
        #[inline(never)]
        pub(crate) fn $portable(src: &[u8], dst: &mut [u8]) {
            map::<$s, $d>(src, dst, $f)
        }

        pub(crate) fn $name(src: &[u8], dst: &mut [u8]) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                fn avx2(src: &[u8], dst: &mut [u8]) {
                    map::<$s, $d>(src, dst, $f)
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

kernel!(bf16_f32, bf16_f32_portable, 2, 4, |b| ((rd16(b) as u32)
    << 16)
    .to_le_bytes());
kernel!(f16_f32, f16_f32_portable, 2, 4, |b| f16_to_f32(rd16(b))
    .to_le_bytes());
kernel!(bf16_f16, bf16_f16_portable, 2, 2, |b| f32_to_f16(
    (rd16(b) as u32) << 16
)
.to_le_bytes());
kernel!(f16_bf16, f16_bf16_portable, 2, 2, |b| f32_to_bf16(
    f16_to_f32(rd16(b))
)
.to_le_bytes());
kernel!(f32_bf16, f32_bf16_portable, 4, 2, |b| f32_to_bf16(rd32(b))
    .to_le_bytes());
kernel!(f32_f16, f32_f16_portable, 4, 2, |b| f32_to_f16(rd32(b))
    .to_le_bytes());
kernel!(f64_f32, f64_f32_portable, 8, 4, |b| f64_to_f32(rd64(b))
    .to_le_bytes());
kernel!(f64_bf16, f64_bf16_portable, 8, 2, |b| f32_to_bf16(
    f64_to_f32(rd64(b))
)
.to_le_bytes());
kernel!(f64_f16, f64_f16_portable, 8, 2, |b| f32_to_f16(f64_to_f32(
    rd64(b)
))
.to_le_bytes());

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
    /// The same loop, baseline instruction set only.
    #[cfg_attr(not(test), allow(dead_code))]
    pub portable: fn(&[u8], &mut [u8]),
}

/// The kernel of a supported pair, `None` for any other pair.
pub(crate) fn kernel(from: DType, to: DType) -> Option<Kernel> {
    let k = |src_size, dst_size, run, portable| {
        Some(Kernel {
            src_size,
            dst_size,
            run,
            portable,
        })
    };
    match (from, to) {
        (DType::BF16, DType::F32) => k(2, 4, bf16_f32, bf16_f32_portable),
        (DType::F16, DType::F32) => k(2, 4, f16_f32, f16_f32_portable),
        (DType::F32, DType::F32) => k(4, 4, copy, copy),
        (DType::F64, DType::F32) => k(8, 4, f64_f32, f64_f32_portable),
        (DType::BF16, DType::BF16) => k(2, 2, copy, copy),
        (DType::F16, DType::BF16) => k(2, 2, f16_bf16, f16_bf16_portable),
        (DType::F32, DType::BF16) => k(4, 2, f32_bf16, f32_bf16_portable),
        (DType::F64, DType::BF16) => k(8, 2, f64_bf16, f64_bf16_portable),
        (DType::BF16, DType::F16) => k(2, 2, bf16_f16, bf16_f16_portable),
        (DType::F16, DType::F16) => k(2, 2, copy, copy),
        (DType::F32, DType::F16) => k(4, 2, f32_f16, f32_f16_portable),
        (DType::F64, DType::F16) => k(8, 2, f64_f16, f64_f16_portable),
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
        for (name, run) in [("dispatched", k.run), ("portable", k.portable)] {
            let mut dst = vec![0xa5u8; patterns.len() * k.dst_size];
            run(&src, &mut dst);
            for (p, out) in patterns.iter().zip(dst.chunks_exact(k.dst_size)) {
                let mut b = [0u8; 8];
                b[..k.dst_size].copy_from_slice(out);
                let want = scalar::convert_bits(from, to, *p).unwrap();
                assert_eq!(
                    u64::from_le_bytes(b),
                    want,
                    "{name} {from:?}->{to:?} of {p:#x}"
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
