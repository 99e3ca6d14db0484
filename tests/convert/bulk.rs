//! Bulk conversions against the element-by-element reference: every pair,
//! serial and parallel, unaligned offsets, random lengths; typed APIs; and
//! every error path.

use crate::common;

use common::Rng;
use proptest::prelude::*;
use rocm_safe::convert::{self, scalar, Element};
use rocm_safe::{DType, Error};

const FROM: [DType; 6] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8_E4M3,
    DType::F8_E5M2,
];
const TO: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn one_thread() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
}

/// Converts `n` elements from `buf[src_off..]` into a buffer at
/// `dst_off`, in parallel and on one thread, and compares with the
/// reference.
fn check(from: DType, to: DType, buf: &[u8], src_off: usize, dst_off: usize, n: usize) {
    let (ss, ds) = (from.size().unwrap(), to.size().unwrap());
    let src = &buf[src_off..src_off + ss * n];
    let mut want = vec![0u8; ds * n];
    scalar::convert_bytes_reference(from, src, to, &mut want).unwrap();
    let mut out = vec![0x5au8; dst_off + ds * n + 3];
    convert::convert_bytes(from, src, to, &mut out[dst_off..dst_off + ds * n]).unwrap();
    assert_eq!(
        &out[dst_off..dst_off + ds * n],
        &want[..],
        "{from:?}->{to:?} n={n}"
    );
    assert!(
        out[..dst_off].iter().all(|&b| b == 0x5a),
        "wrote before dst"
    );
    assert!(
        out[dst_off + ds * n..].iter().all(|&b| b == 0x5a),
        "wrote past dst"
    );
    let mut serial = vec![0u8; ds * n];
    one_thread().install(|| convert::convert_bytes(from, src, to, &mut serial).unwrap());
    assert_eq!(serial, want);
    let fp = convert::expected_fingerprint(from, src, to).unwrap();
    assert_eq!(
        fp,
        convert::fingerprint_bytes(&want),
        "expected_fingerprint"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(debug_assertions) { 48 } else { 512 }))]

    /// Small and odd lengths (including 0) at every alignment.
    #[test]
    fn small_buffers_match_the_reference(
        seed in any::<u64>(),
        n in 0usize..300,
        src_off in 0usize..8,
        dst_off in 0usize..8,
        pair in 0usize..18,
    ) {
        let (from, to) = (FROM[pair / 3], TO[pair % 3]);
        let buf = random_bytes(seed, src_off + 8 * n);
        check(from, to, &buf, src_off, dst_off, n);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(debug_assertions) { 6 } else { 48 }))]

    /// Lengths around and above the parallel threshold (128 Ki elements),
    /// so the rayon split and its chunk boundaries are exercised.
    #[test]
    fn large_buffers_match_the_reference(
        seed in any::<u64>(),
        n in (128usize << 10) - 3..(200usize << 10),
        src_off in 0usize..8,
        dst_off in 0usize..8,
        pair in 0usize..18,
    ) {
        let (from, to) = (FROM[pair / 3], TO[pair % 3]);
        let buf = random_bytes(seed, src_off + 8 * n);
        check(from, to, &buf, src_off, dst_off, n);
    }
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

#[test]
fn every_pair_at_several_fixed_lengths() {
    let buf = random_bytes(7, 8 * 70_000 + 16);
    for from in FROM {
        for to in TO {
            for n in [0, 1, 2, 3, 7, 31, 33, 255, 256, 257, 4095, 4097, 65_537] {
                check(from, to, &buf, 1, 3, n);
            }
        }
    }
}

fn typed_roundtrip<S: Element, D: Element>(src: &[S]) {
    let mut a = vec![D::zeroed(); src.len()];
    convert::convert_slice(src, &mut a).unwrap();
    let mut b = vec![D::zeroed(); src.len()];
    convert::convert_bytes_into(S::DTYPE, bytemuck::cast_slice(src), &mut b).unwrap();
    let mut want = vec![0u8; src.len() * std::mem::size_of::<D>()];
    scalar::convert_bytes_reference(S::DTYPE, bytemuck::cast_slice(src), D::DTYPE, &mut want)
        .unwrap();
    assert_eq!(bytemuck::cast_slice::<D, u8>(&a), &want[..]);
    // Bit patterns, not values: NaN != NaN.
    assert_eq!(bytemuck::cast_slice::<D, u8>(&b), &want[..]);
}

#[test]
fn typed_slices_match_the_byte_path() {
    let bytes = random_bytes(9, 8 * 1000);
    let f64s: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let f32s: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let u16s: Vec<u16> = bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let f16s: Vec<half::f16> = u16s.iter().map(|&b| half::f16::from_bits(b)).collect();
    let bf16s: Vec<half::bf16> = u16s.iter().map(|&b| half::bf16::from_bits(b)).collect();
    typed_roundtrip::<f64, f32>(&f64s);
    typed_roundtrip::<f64, half::f16>(&f64s);
    typed_roundtrip::<f64, half::bf16>(&f64s);
    typed_roundtrip::<f32, f32>(&f32s);
    typed_roundtrip::<f32, half::f16>(&f32s);
    typed_roundtrip::<f32, half::bf16>(&f32s);
    typed_roundtrip::<half::f16, f32>(&f16s);
    typed_roundtrip::<half::f16, half::f16>(&f16s);
    typed_roundtrip::<half::f16, half::bf16>(&f16s);
    typed_roundtrip::<half::bf16, f32>(&bf16s);
    typed_roundtrip::<half::bf16, half::f16>(&bf16s);
    typed_roundtrip::<half::bf16, half::bf16>(&bf16s);
    assert_eq!(<half::bf16 as Element>::DTYPE, DType::BF16);
    assert_eq!(<f64 as Element>::DTYPE, DType::F64);
}

// ----- error paths -----------------------------------------------------------------

#[test]
fn unsupported_pairs_are_rejected() {
    let mut n = 0;
    for from in DType::ALL {
        for to in DType::ALL {
            if convert::supported(from, to) {
                assert!(FROM.contains(&from) && TO.contains(&to));
                continue;
            }
            n += 1;
            let mut dst = [0u8; 64];
            let e = convert::convert_bytes(from, &[0u8; 16], to, &mut dst).unwrap_err();
            assert!(
                matches!(e, Error::UnsupportedConversion { op: "convert_bytes", from: f, to: t, tensor: None } if f == from && t == to),
                "{e}"
            );
            assert!(e.to_string().contains("cannot convert"));
            let e = convert::expected_fingerprint(from, &[0u8; 16], to).unwrap_err();
            assert!(matches!(
                e,
                Error::UnsupportedConversion {
                    op: "expected_fingerprint",
                    ..
                }
            ));
            let e = scalar::convert_bytes_reference(from, &[0u8; 16], to, &mut dst).unwrap_err();
            assert!(matches!(e, Error::UnsupportedConversion { .. }));
            assert_eq!(scalar::convert_bits(from, to, 0), None);
        }
    }
    // F64 and FP8 are sources only; integers and the FNUZ/MX FP8 types are
    // never converted.
    assert!(!convert::supported(DType::F32, DType::F64));
    assert!(!convert::supported(DType::F32, DType::F8_E4M3));
    assert!(!convert::supported(DType::I32, DType::F32));
    assert!(!convert::supported(DType::F8_E4M3FNUZ, DType::F32));
    assert_eq!(n, 22 * 22 - 18);
    // The typed API reaches the same check.
    let mut d = [0f64; 2];
    assert!(matches!(
        convert::convert_slice(&[1f32, 2.0], &mut d),
        Err(Error::UnsupportedConversion { .. })
    ));
}

#[test]
fn a_source_that_is_not_whole_elements_is_rejected() {
    let mut dst = [0u8; 64];
    for (from, len) in [
        (DType::BF16, 3usize),
        (DType::F32, 6),
        (DType::F64, 12),
        (DType::F16, 1),
    ] {
        let e =
            convert::convert_bytes(from, &vec![0u8; len], DType::F32, &mut dst[..0]).unwrap_err();
        let ss = from.size().unwrap();
        match e {
            Error::LengthMismatch {
                op,
                expected,
                actual,
                tensor: None,
            } => {
                assert_eq!(op, "convert_bytes");
                assert_eq!(actual, len);
                assert_eq!(expected, len / ss * ss);
            }
            other => panic!("{other}"),
        }
        let e = convert::expected_fingerprint(from, &vec![0u8; len], DType::F16).unwrap_err();
        assert!(matches!(
            e,
            Error::LengthMismatch {
                op: "expected_fingerprint",
                ..
            }
        ));
        let e = convert::convert_bytes_into::<f32>(from, &vec![0u8; len], &mut []).unwrap_err();
        assert!(matches!(e, Error::LengthMismatch { .. }));
    }
}

#[test]
fn a_destination_of_the_wrong_length_is_rejected_and_left_untouched() {
    let src = [0x3fu8; 8]; // 4 bf16
    for len in [0usize, 15, 17, 32] {
        let mut dst = vec![0xeeu8; len];
        let e = convert::convert_bytes(DType::BF16, &src, DType::F32, &mut dst).unwrap_err();
        match e {
            Error::LengthMismatch {
                op,
                expected,
                actual,
                tensor: None,
            } => {
                assert_eq!(op, "convert_bytes");
                assert_eq!((expected, actual), (16, len));
            }
            other => panic!("{other}"),
        }
        assert!(dst.iter().all(|&b| b == 0xee));
        let mut dst = vec![0u8; len];
        assert!(scalar::convert_bytes_reference(DType::BF16, &src, DType::F32, &mut dst).is_err());
    }
    // Typed APIs: element counts differ.
    let mut d = [0f32; 3];
    let e = convert::convert_slice(&[half::bf16::ONE; 4], &mut d).unwrap_err();
    match e {
        Error::LengthMismatch {
            op,
            expected,
            actual,
            tensor: None,
        } => {
            assert_eq!((op, expected, actual), ("convert_slice", 4, 3));
        }
        other => panic!("{other}"),
    }
    let e = convert::convert_bytes_into(DType::BF16, &src, &mut d).unwrap_err();
    assert!(matches!(
        e,
        Error::LengthMismatch {
            expected: 16,
            actual: 12,
            ..
        }
    ));
    assert!(e.to_string().contains("length mismatch"));
}

/// Outputs of 8 MiB and more take the streaming-store path.
#[test]
fn outputs_larger_than_the_caches_match_the_reference() {
    let buf = random_bytes(8, 8 * ((4 << 20) + 8));
    let cases = [
        (DType::BF16, DType::F32, (2 << 20) + 5),
        (DType::F32, DType::F16, (4 << 20) + 3),
        (DType::F64, DType::BF16, (4 << 20) + 1),
    ];
    // Unoptimised builds check one case (the kernels' own tests cover the
    // streaming loop of every pair).
    let cases = if cfg!(debug_assertions) {
        &cases[..1]
    } else {
        &cases[..]
    };
    for &(from, to, n) in cases {
        check(from, to, &buf, 3, 5, n);
    }
}
