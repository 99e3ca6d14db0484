//! Every bf16 and every f16 bit pattern, through the scalar functions and the
//! bulk paths (bytes, typed slices, serial and parallel), against
//! independent references.

use rocm_safe::convert::{self, scalar};
use rocm_safe::DType;

fn all_patterns_bytes() -> Vec<u8> {
    (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect()
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn halves(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Converts through the bulk byte API, both on the calling thread's pool
/// (parallel above the threshold, which one repetition of 65 536 elements
/// does not reach: 4 repetitions do) and in a 1-thread pool.
fn bulk(from: DType, src: &[u8], to: DType) -> Vec<u8> {
    let ds = to.size().unwrap();
    let n = src.len() / from.size().unwrap();
    let big: Vec<u8> = src.repeat(4);
    let mut out_par = vec![0u8; 4 * n * ds];
    convert::convert_bytes(from, &big, to, &mut out_par).unwrap();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let mut out = vec![0u8; n * ds];
    pool.install(|| convert::convert_bytes(from, src, to, &mut out).unwrap());
    for rep in out_par.chunks_exact(n * ds) {
        assert_eq!(rep, &out[..], "parallel and serial bulk paths differ");
    }
    out
}

#[test]
fn bf16_to_f32_is_the_bit_pattern_shifted_left_by_16() {
    let out = words(&bulk(DType::BF16, &all_patterns_bytes(), DType::F32));
    for (h, w) in (0..=u16::MAX).zip(&out) {
        let want = (h as u32) << 16;
        assert_eq!(*w, want, "bulk bf16 {h:#06x}");
        assert_eq!(scalar::bf16_to_f32(h), want, "scalar bf16 {h:#06x}");
    }
    // Typed slice API, and the signalling NaNs `half` would quiet.
    let src: Vec<half::bf16> = (0..=u16::MAX).map(half::bf16::from_bits).collect();
    let mut dst = vec![0f32; src.len()];
    convert::convert_slice(&src, &mut dst).unwrap();
    for (h, f) in src.iter().zip(&dst) {
        assert_eq!(f.to_bits(), (h.to_bits() as u32) << 16);
    }
    assert_eq!(dst[0x7f81].to_bits(), 0x7f81_0000, "signalling NaN kept");
    assert!(dst[0x7f81].is_nan());
}

#[test]
fn f16_to_f32_is_the_exact_widening() {
    let out = words(&bulk(DType::F16, &all_patterns_bytes(), DType::F32));
    let mut nans = 0;
    for (h, w) in (0..=u16::MAX).zip(&out) {
        assert_eq!(scalar::f16_to_f32(h), *w, "scalar vs bulk {h:#06x}");
        let f = half::f16::from_bits(h);
        if f.is_nan() {
            nans += 1;
            // Sign, quiet bit and payload are kept: shifted into the top of
            // the f32 mantissa.
            let sign = ((h as u32) & 0x8000) << 16;
            assert_eq!(*w, sign | 0x7f80_0000 | (((h & 0x3ff) as u32) << 13));
            assert!(f32::from_bits(*w).is_nan());
        } else {
            assert_eq!(*w, f.to_f32().to_bits(), "f16 {h:#06x}");
            // And by arithmetic in f64, independently of `half`.
            let e = ((h >> 10) & 0x1f) as i32;
            let m = (h & 0x3ff) as f64;
            let mag = match e {
                0 => m * 2f64.powi(-24),
                31 => f64::INFINITY,
                _ => (1.0 + m / 1024.0) * 2f64.powi(e - 15),
            };
            let v = if h & 0x8000 != 0 { -mag } else { mag };
            assert_eq!(f32::from_bits(*w) as f64, v, "f16 {h:#06x}");
            assert_eq!(f32::from_bits(*w).is_sign_negative(), h & 0x8000 != 0);
        }
    }
    assert_eq!(nans, 2 * 1023);
}

#[test]
fn sixteen_bit_cross_conversions_go_through_f32() {
    let src = all_patterns_bytes();
    let b2h = halves(&bulk(DType::BF16, &src, DType::F16));
    let h2b = halves(&bulk(DType::F16, &src, DType::BF16));
    for h in 0..=u16::MAX {
        let i = h as usize;
        assert_eq!(b2h[i], scalar::f32_to_f16(scalar::bf16_to_f32(h)));
        assert_eq!(b2h[i], scalar::bf16_to_f16(h));
        assert_eq!(h2b[i], scalar::f32_to_bf16(scalar::f16_to_f32(h)));
        assert_eq!(h2b[i], scalar::f16_to_bf16(h));
        // f16 -> bf16 -> f16 is not the identity in general, but every
        // non-NaN f16 within bf16 precision comes back.
        if !half::f16::from_bits(h).is_nan() {
            let back = scalar::f16_to_f32(h);
            assert_eq!(
                f32::from_bits(scalar::bf16_to_f32(h2b[i])) == f32::from_bits(back),
                back & 0xffff == 0,
                "{h:#06x}"
            );
        }
    }
    // Identity pairs copy.
    assert_eq!(bulk(DType::F16, &src, DType::F16), src);
    assert_eq!(bulk(DType::BF16, &src, DType::BF16), src);
}

#[test]
fn sixteen_bit_to_f32_round_trips_through_the_narrowing() {
    // f32 -> 16 bit of an exactly representable value is the identity (NaN
    // excepted: signalling NaNs are quieted).
    for h in 0..=u16::MAX {
        let b = scalar::bf16_to_f32(h);
        let f = scalar::f16_to_f32(h);
        if f32::from_bits(b).is_nan() {
            assert_eq!(scalar::f32_to_bf16(b), h | 0x0040);
        } else {
            assert_eq!(scalar::f32_to_bf16(b), h);
        }
        if f32::from_bits(f).is_nan() {
            assert_eq!(scalar::f32_to_f16(f), h | 0x0200);
        } else {
            assert_eq!(scalar::f32_to_f16(f), h);
        }
    }
}
