//! f32 -> bf16/f16 and f64 -> f32/bf16/f16: rounding, NaN, infinities,
//! subnormals and overflow, against independent references computed with
//! f64 arithmetic (and `half`, where its NaN handling agrees).

use crate::common;

use common::Rng;
use rocm_safe::convert::{self, scalar};
use rocm_safe::DType;

// ----- independent references ------------------------------------------------

/// The value of a 16-bit float pattern with `mbits` mantissa bits and
/// exponent bias `bias`, exactly, in f64 (not NaN).
fn value16(h: u16, mbits: u32, bias: i32) -> f64 {
    let emask = (1u32 << (15 - mbits)) - 1;
    let e = ((h as u32 >> mbits) & emask) as i32;
    let m = (h as u32 & ((1 << mbits) - 1)) as f64;
    let scale = (1u64 << mbits) as f64;
    let mag = if e == 0 {
        m / scale * 2f64.powi(1 - bias)
    } else if e as u32 == emask {
        f64::INFINITY
    } else {
        (1.0 + m / scale) * 2f64.powi(e - bias)
    };
    if h & 0x8000 != 0 {
        -mag
    } else {
        mag
    }
}

/// Round-to-nearest-even of a non-NaN `x` to the 16-bit format, by binary
/// search over the (monotonic) positive patterns and an exact comparison
/// with the midpoint of the two neighbours. `max_finite` is the largest
/// finite pattern; past it the next "value" is 2^(emax+1), which makes the
/// overflow threshold max + half an ulp, as IEEE 754 says.
fn round16(x: f64, mbits: u32, bias: i32, max_finite: u16) -> u16 {
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    let inf = max_finite + 1;
    if a == f64::INFINITY {
        return sign | inf;
    }
    let v = |h: u16| {
        if h == inf {
            2f64.powi((max_finite >> mbits) as i32 + 1 - bias)
        } else {
            value16(h, mbits, bias)
        }
    };
    if a >= v(inf) {
        return sign | inf;
    }
    // Largest pattern p with v(p) <= a.
    let (mut lo, mut hi) = (0u16, inf); // v(lo) <= a < v(hi)
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if v(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let midpoint = (v(lo) + v(hi)) / 2.0; // exact: few significant bits
    let r = if a < midpoint {
        lo
    } else if a > midpoint {
        hi
    } else if lo & 1 == 0 {
        lo
    } else {
        hi
    };
    sign | r
}

fn ref_f16(x: f64) -> u16 {
    round16(x, 10, 15, 0x7bff)
}

fn ref_bf16(x: f64) -> u16 {
    round16(x, 7, 127, 0x7f7f)
}

fn f32_of(bits: u32) -> f64 {
    f32::from_bits(bits) as f64
}

/// One element through the bulk byte path.
fn bulk1(from: DType, bits: u64, to: DType) -> u64 {
    let ss = from.size().unwrap();
    let ds = to.size().unwrap();
    let mut out = [0u8; 8];
    convert::convert_bytes(from, &bits.to_le_bytes()[..ss], to, &mut out[..ds]).unwrap();
    u64::from_le_bytes(out)
}

/// Checks f32 -> bf16 and f32 -> f16 of `x` in every way: scalar, bulk,
/// and against the references.
fn check_f32(x: u32) {
    let b = scalar::f32_to_bf16(x);
    let h = scalar::f32_to_f16(x);
    assert_eq!(bulk1(DType::F32, x as u64, DType::BF16), b as u64);
    assert_eq!(bulk1(DType::F32, x as u64, DType::F16), h as u64);
    let f = f32::from_bits(x);
    if f.is_nan() {
        check_nan_bf16(x, b);
        check_nan_f16(x, h);
    } else {
        assert_eq!(b, ref_bf16(f as f64), "bf16 of {x:#010x} ({f:e})");
        assert_eq!(h, ref_f16(f as f64), "f16 of {x:#010x} ({f:e})");
        assert_eq!(h, half::f16::from_f32(f).to_bits(), "half f16 of {x:#010x}");
    }
}

fn check_nan_bf16(x: u32, b: u16) {
    assert!(f32::from_bits(scalar::bf16_to_f32(b)).is_nan(), "{x:#x}");
    assert_eq!(b & 0x8000, (x >> 16) as u16 & 0x8000, "sign of {x:#x}");
    assert_ne!(b & 0x0040, 0, "quiet bit of {x:#x}");
    assert_eq!(b & 0x3f, (x >> 16) as u16 & 0x3f, "payload of {x:#x}");
}

fn check_nan_f16(x: u32, h: u16) {
    assert!(half::f16::from_bits(h).is_nan(), "{x:#x}");
    assert_eq!(h & 0x8000, (x >> 16) as u16 & 0x8000, "sign of {x:#x}");
    assert_ne!(h & 0x0200, 0, "quiet bit of {x:#x}");
    assert_eq!(h & 0x1ff, (x >> 13) as u16 & 0x1ff, "payload of {x:#x}");
}

// ----- named edge cases ----------------------------------------------------------

#[test]
fn bf16_ties_round_to_even_in_both_directions() {
    // 1.0 + half a bf16 ulp: tie, 1.0's mantissa is even -> down.
    assert_eq!(scalar::f32_to_bf16(0x3f80_8000), 0x3f80);
    // Just above the tie -> up.
    assert_eq!(scalar::f32_to_bf16(0x3f80_8001), 0x3f81);
    // Odd lower neighbour, tie -> up to even.
    assert_eq!(scalar::f32_to_bf16(0x3f81_8000), 0x3f82);
    // Just below that tie -> down.
    assert_eq!(scalar::f32_to_bf16(0x3f81_7fff), 0x3f81);
    // Negative values mirror.
    assert_eq!(scalar::f32_to_bf16(0xbf80_8000), 0xbf80);
    assert_eq!(scalar::f32_to_bf16(0xbf81_8000), 0xbf82);
    // A carry from the mantissa into the exponent.
    assert_eq!(scalar::f32_to_bf16(0x3fff_8000), 0x4000);
    for x in [
        0x3f80_8000,
        0x3f80_8001,
        0x3f81_8000,
        0x3f81_7fff,
        0xbf81_8000,
        0x3fff_8000,
    ] {
        check_f32(x);
    }
}

#[test]
fn f16_ties_round_to_even_in_both_directions() {
    // 1.0 + 2^-11 (half an f16 ulp): tie, even -> 1.0.
    assert_eq!(scalar::f32_to_f16(0x3f80_1000), 0x3c00);
    assert_eq!(scalar::f32_to_f16(0x3f80_1001), 0x3c01);
    // 1.0 + 3 * 2^-11: tie between 0x3c01 (odd) and 0x3c02 -> 0x3c02.
    assert_eq!(scalar::f32_to_f16(0x3f80_3000), 0x3c02);
    assert_eq!(scalar::f32_to_f16(0x3f80_2fff), 0x3c01);
    assert_eq!(scalar::f32_to_f16(0xbf80_3000), 0xbc02);
    // 2047/1024 + half ulp -> carries into the exponent: 2.0.
    assert_eq!(scalar::f32_to_f16(0x3fff_f000), 0x4000);
    for x in [
        0x3f80_1000,
        0x3f80_1001,
        0x3f80_3000,
        0x3f80_2fff,
        0xbf80_3000,
        0x3fff_f000,
    ] {
        check_f32(x);
    }
}

#[test]
fn infinities_overflow_and_the_largest_finite_values() {
    let inf = f32::INFINITY.to_bits();
    let ninf = f32::NEG_INFINITY.to_bits();
    assert_eq!(scalar::f32_to_bf16(inf), 0x7f80);
    assert_eq!(scalar::f32_to_bf16(ninf), 0xff80);
    assert_eq!(scalar::f32_to_f16(inf), 0x7c00);
    assert_eq!(scalar::f32_to_f16(ninf), 0xfc00);
    // Largest finite bf16 stays; f32::MAX rounds past it to infinity.
    assert_eq!(scalar::f32_to_bf16(0x7f7f_0000), 0x7f7f);
    assert_eq!(scalar::f32_to_bf16(0x7f7f_7fff), 0x7f7f);
    assert_eq!(scalar::f32_to_bf16(0x7f7f_8000), 0x7f80); // tie, odd -> inf
    assert_eq!(scalar::f32_to_bf16(f32::MAX.to_bits()), 0x7f80);
    assert_eq!(scalar::f32_to_bf16(f32::MIN.to_bits()), 0xff80);
    // f16: 65504 is the largest finite; 65520 (max + half ulp) is a tie
    // with an odd mantissa -> infinity; just below stays finite.
    assert_eq!(scalar::f32_to_f16(65504f32.to_bits()), 0x7bff);
    assert_eq!(scalar::f32_to_f16(65519.996f32.to_bits()), 0x7bff);
    assert_eq!(scalar::f32_to_f16(65520f32.to_bits()), 0x7c00);
    assert_eq!(scalar::f32_to_f16((-65520f32).to_bits()), 0xfc00);
    assert_eq!(scalar::f32_to_f16(1e10f32.to_bits()), 0x7c00);
    assert_eq!(scalar::f32_to_f16(f32::MAX.to_bits()), 0x7c00);
    for x in [
        inf,
        ninf,
        0x7f7f_7fff,
        0x7f7f_8000,
        f32::MAX.to_bits(),
        65520f32.to_bits(),
    ] {
        check_f32(x);
    }
}

#[test]
fn nans_stay_nans_with_sign_quiet_bit_and_payload() {
    let cases = [
        0x7fc0_0000u32, // canonical quiet
        0xffc0_0000,    // negative quiet
        0x7f80_0001,    // signalling, lowest payload bit only
        0xff80_0001,
        0x7fa0_0000, // signalling with a high payload bit
        0x7fff_ffff,
        0xffff_ffff,
        0x7f80_2000, // payload only in bits f16 keeps
        0x7f81_0000, // payload only in bits bf16 keeps
    ];
    for x in cases {
        check_f32(x);
    }
    // A signalling NaN whose payload lies only in the dropped bits must not
    // become infinity.
    assert_eq!(scalar::f32_to_bf16(0x7f80_0001), 0x7fc0);
    assert_eq!(scalar::f32_to_f16(0x7f80_0001), 0x7e00);
    assert_eq!(scalar::f32_to_bf16(0xff80_0001), 0xffc0);
    assert_eq!(scalar::f32_to_bf16(0x7fa0_0000), 0x7fe0);
    assert_eq!(scalar::f32_to_f16(0x7fa0_0000), 0x7f00);
}

#[test]
fn subnormal_inputs_and_results_are_rounded_not_flushed() {
    // bf16 has f32's exponent: f32 subnormals round like normals.
    assert_eq!(scalar::f32_to_bf16(0x0000_0001), 0x0000); // far below half an ulp
    assert_eq!(scalar::f32_to_bf16(0x0001_0000), 0x0001); // smallest bf16 subnormal
    assert_eq!(scalar::f32_to_bf16(0x0000_8000), 0x0000); // tie at half of it -> 0 (even)
    assert_eq!(scalar::f32_to_bf16(0x0000_8001), 0x0001);
    assert_eq!(scalar::f32_to_bf16(0x0001_8000), 0x0002); // tie, odd -> up
    assert_eq!(scalar::f32_to_bf16(0x807f_ffff), 0x8080); // largest subnormal -> min normal
                                                          // f16: smallest subnormal 2^-24, half of it 2^-25 (a tie with 0).
    let p = |e: i32| 2f32.powi(e).to_bits();
    assert_eq!(scalar::f32_to_f16(p(-24)), 0x0001);
    assert_eq!(scalar::f32_to_f16(p(-25)), 0x0000);
    assert_eq!(scalar::f32_to_f16(p(-25) + 1), 0x0001);
    assert_eq!(scalar::f32_to_f16(p(-25) | 0x8000_0000), 0x8000); // -0
    assert_eq!(scalar::f32_to_f16(p(-26)), 0x0000);
    // 1.5 * 2^-24: tie between 1 and 2 subnormal ulps -> 2 (even).
    assert_eq!(
        scalar::f32_to_f16((1.5f32 * 2f32.powi(-24)).to_bits()),
        0x0002
    );
    // 2.5 * 2^-24: tie between 2 and 3 -> 2.
    assert_eq!(
        scalar::f32_to_f16((2.5f32 * 2f32.powi(-24)).to_bits()),
        0x0002
    );
    // Largest subnormal and the rounding into the smallest normal 2^-14.
    assert_eq!(
        scalar::f32_to_f16((1023f32 * 2f32.powi(-24)).to_bits()),
        0x03ff
    );
    assert_eq!(
        scalar::f32_to_f16((1023.5f32 * 2f32.powi(-24)).to_bits()),
        0x0400
    );
    assert_eq!(scalar::f32_to_f16(p(-14)), 0x0400);
    // An f32 subnormal is far below f16's range.
    assert_eq!(scalar::f32_to_f16(0x0000_0001), 0x0000);
    assert_eq!(scalar::f32_to_f16(0x807f_ffff), 0x8000);
    // -0.0 keeps its sign everywhere.
    assert_eq!(scalar::f32_to_bf16(0x8000_0000), 0x8000);
    assert_eq!(scalar::f32_to_f16(0x8000_0000), 0x8000);
    assert_eq!(scalar::f64_to_f32((-0.0f64).to_bits()), 0x8000_0000);
    for x in [
        0x0000_0001,
        0x0001_0000,
        0x0000_8000,
        0x0000_8001,
        0x0001_8000,
        0x807f_ffff,
        p(-24),
        p(-25),
        p(-25) + 1,
        p(-26),
        0x8000_0000,
    ] {
        check_f32(x);
    }
}

// ----- sweeps -----------------------------------------------------------------------

#[test]
fn f32_random_sample_matches_the_references() {
    let mut rng = Rng::new(11);
    let n = if cfg!(debug_assertions) {
        20_000
    } else {
        1_000_000
    };
    for _ in 0..n {
        check_f32(rng.u64() as u32);
    }
}

/// Every mantissa (every 13th in debug builds) of the exponents where the
/// rounding changes character: f16 subnormal results, the smallest f16
/// normals, the f16 overflow edge, f32 subnormals (bf16 subnormal results),
/// the largest finite f32s, and 1.0. Each value goes through the bulk path
/// and the scalar function and is compared with `half` (whose rounding of
/// non-NaN values is an independent implementation); every 61st also with
/// the f64 midpoint reference.
#[test]
fn f32_selected_exponents_match_the_references() {
    let (exps, stride): (&[u32], usize) = if cfg!(debug_assertions) {
        (&[0, 101, 102, 112, 113, 142, 254], 13)
    } else {
        (&[0, 1, 101, 102, 112, 113, 127, 142, 143, 254], 1)
    };
    let mantissas: Vec<u32> = (0..1u32 << 23)
        .step_by(stride)
        .chain([0x7f_ffff, 0x1000, 0x0fff, 0x1001, 0x8000])
        .collect();
    for &exp in exps {
        for sign in [0, 0x8000_0000] {
            let xs: Vec<u32> = mantissas.iter().map(|m| sign | exp << 23 | m).collect();
            let src: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut b = vec![0u8; 2 * xs.len()];
            let mut h = vec![0u8; 2 * xs.len()];
            convert::convert_bytes(DType::F32, &src, DType::BF16, &mut b).unwrap();
            convert::convert_bytes(DType::F32, &src, DType::F16, &mut h).unwrap();
            let (b, _) = b.as_chunks::<2>();
            let (h, _) = h.as_chunks::<2>();
            for (k, ((&x, bb), hh)) in xs.iter().zip(b).zip(h).enumerate() {
                let f = f32::from_bits(x);
                let (bb, hh) = (u16::from_le_bytes(*bb), u16::from_le_bytes(*hh));
                assert_eq!(bb, scalar::f32_to_bf16(x));
                assert_eq!(hh, scalar::f32_to_f16(x));
                if f.is_nan() {
                    check_nan_bf16(x, bb);
                    check_nan_f16(x, hh);
                } else {
                    assert_eq!(bb, half::bf16::from_f32(f).to_bits(), "{x:#x}");
                    assert_eq!(hh, half::f16::from_f32(f).to_bits(), "{x:#x}");
                }
                if k % 61 == 0 {
                    check_f32(x);
                }
            }
        }
    }
}

fn check_f64(x: u64) {
    let f = f64::from_bits(x);
    let r32 = scalar::f64_to_f32(x);
    let rb = scalar::f64_to_bf16(x);
    let rh = scalar::f64_to_f16(x);
    assert_eq!(bulk1(DType::F64, x, DType::F32), r32 as u64);
    assert_eq!(bulk1(DType::F64, x, DType::BF16), rb as u64);
    assert_eq!(bulk1(DType::F64, x, DType::F16), rh as u64);
    // Through f32, as PyTorch does.
    assert_eq!(rb, scalar::f32_to_bf16(r32));
    assert_eq!(rh, scalar::f32_to_f16(r32));
    if f.is_nan() {
        let g = f32::from_bits(r32);
        assert!(g.is_nan());
        assert_eq!(g.is_sign_negative(), f.is_sign_negative());
        assert_ne!(r32 & 0x0040_0000, 0, "quiet bit");
        assert_eq!(r32 & 0x3f_ffff, (x >> 29) as u32 & 0x3f_ffff, "payload");
    } else {
        assert_eq!(r32, (f as f32).to_bits(), "f64 {x:#018x} ({f:e})");
        assert_eq!(rb, ref_bf16(f32_of(r32)));
        assert_eq!(rh, ref_f16(f32_of(r32)));
    }
}

#[test]
fn f64_edges_and_samples_match_the_references() {
    let p = |e: i32| 2f64.powi(e);
    let named = [
        0.0,
        -0.0,
        1.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::MAX,
        f64::MIN_POSITIVE,
        5e-324,
        f32::MAX as f64,
        f32::MAX as f64 * (1.0 + p(-25)), // below max + half ulp
        f32::MAX as f64 + p(103),         // max + half ulp: tie, odd -> inf
        p(-149),                          // smallest f32 subnormal
        p(-150),                          // tie -> 0
        p(-150) * (1.0 + p(-52)),         // just above the tie -> min subnormal
        p(-151),
        1.5 * p(-149), // tie -> 2 ulps
        1.0 + p(-24),  // tie at 1.0 -> 1.0
        1.0 + 3.0 * p(-24),
        65520.0,
        65519.99,
    ];
    for f in named {
        check_f64(f.to_bits());
        check_f64((-f).to_bits());
    }
    for nan in [
        0x7ff8_0000_0000_0000u64,
        0x7ff0_0000_0000_0001,
        0xfff4_0000_0000_0000,
    ] {
        check_f64(nan);
    }
    assert_eq!(scalar::f64_to_f32(p(-150).to_bits()), 0);
    assert_eq!(scalar::f64_to_f32((1.5 * p(-149)).to_bits()), 2);
    assert_eq!(
        scalar::f64_to_f32((f32::MAX as f64 + p(103)).to_bits()),
        0x7f80_0000
    );
    assert_eq!(scalar::f64_to_f32(0x7ff0_0000_0000_0001), 0x7fc0_0000);

    let mut rng = Rng::new(12);
    let n = if cfg!(debug_assertions) {
        20_000
    } else {
        500_000
    };
    for _ in 0..n {
        let r = rng.u64();
        check_f64(r);
        // Exponents in and around f32's range, where the rounding happens.
        let e = 1023 - 160 + (r >> 52) % 300;
        check_f64((r & 0x800f_ffff_ffff_ffff) | e << 52);
    }
}

#[test]
fn double_rounding_through_f32_is_what_pytorch_does() {
    // 1 + 2^-8 + 2^-30: to bf16 directly it would round up (above the
    // tie); through f32 it first becomes the exact tie 1 + 2^-8, which
    // rounds to even (down).
    let x = 1.0 + 2f64.powi(-8) + 2f64.powi(-30);
    assert_eq!(
        scalar::f64_to_f32(x.to_bits()),
        (1.0f32 + 2f32.powi(-8)).to_bits()
    );
    assert_eq!(scalar::f64_to_bf16(x.to_bits()), 0x3f80);
    assert_eq!(ref_bf16(x), 0x3f81);
    check_f64(x.to_bits());
}
