//! Every kernel build against the scalar reference.

use super::*;
use crate::convert::scalar;

const FROM: [DType; 6] = [
    DType::F64,
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F8_E4M3,
    DType::F8_E5M2,
];
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
    // And every 8-bit code of the f8 sources (each used 256 times, so the
    // streaming build's blocks and tails see all of them).
    let f8: Vec<u64> = (0..4096u64).map(|i| i & 0xff).collect();
    for from in [DType::F8_E4M3, DType::F8_E5M2] {
        for to in TO {
            check_pair(from, to, &f8);
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
        0u32, 1, 2, 0xfff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x3000, 0x7fff, 0x8000, 0x8001, 0xffff,
        0x1_0000, 0x1_8000, 0x40_0000, 0x40_0001, 0x7f_e000, 0x7f_efff, 0x7f_f000, 0x7f_f001,
        0x7f_ffff,
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
            assert_eq!(
                kernel(from, to).is_some(),
                FROM.contains(&from) && TO.contains(&to),
                "{from}->{to}"
            );
            if let Some(k) = kernel(from, to) {
                assert_eq!(Some(k.src_size), from.size());
                assert_eq!(Some(k.dst_size), to.size());
            }
        }
    }
    assert_eq!(
        FROM.len() * TO.len(),
        crate::convert::table::CONVERSIONS.len()
    );
}
