//! Unit tests of the definition's internals and of every compiled loop.

use super::blocks::{sum_blocks, sum_blocks_portable};
use super::spec::{lane_key, BLOCK_WORDS, LANE_ADD, LANE_MUL};
use super::widened::{fused_blocks_portable, RawAndWidened};
use super::*;

/// The definition, word by word, straight from the documented formula.
fn reference_sum(start_word: u64, bytes: &[u8]) -> u64 {
    bytes.chunks(4).enumerate().fold(0u64, |s, (k, c)| {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        s.wrapping_add(term(start_word + k as u64, u32::from_le_bytes(w)))
    })
}

#[test]
fn term_and_tables_are_the_documented_formula() {
    for (i, w) in [
        (0u64, 0u32),
        (1, 7),
        (255, u32::MAX),
        (256, 12345),
        (1 << 40, 0xdead_beef),
    ] {
        let l = mix64((i % 256).wrapping_add(0x6A09_E667_F3BC_C908));
        let b = mix64((i / 256).wrapping_add(0xBB67_AE85_84CA_A73B));
        let add = (l as u32) ^ (b as u32);
        let mul = (((l >> 32) as u32) ^ ((b >> 32) as u32)) | 1;
        assert_eq!(term(i, w), (w.wrapping_add(add) as u64) * mul as u64);
    }
    // splitmix64 of 0 (a published constant of the finaliser).
    assert_eq!(mix64(0x9E37_79B9_7F4A_7C15), 0xE220_A839_7B1D_CDAF);
    for j in 0..256u64 {
        let l = lane_key(j);
        assert_eq!(LANE_ADD[j as usize], l as u32);
        assert_eq!(LANE_MUL[j as usize], (l >> 32) as u32 | 1);
    }
    assert_eq!(BLOCK_WORDS, 256);
}

#[test]
fn word_sums_equal_byte_sums_serial_and_parallel() {
    // Above the parallel threshold, the first word off a block boundary.
    let mut s = 2u64;
    let words: Vec<u32> = (0..(PAR_MIN_BYTES / 4) * 3 + 1000)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix64(s) as u32
        })
        .collect();
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let want = reference_sum(77, &bytes);
    assert_eq!(sum_words(77, &words), want);
    assert_eq!(par_sum_words(77, &words), want);
    assert_eq!(sum_words(77, &words[..5]), reference_sum(77, &bytes[..20]));
}

/// `sum_raw_and_widened` of bf16 against the sums of the bytes and of their
/// widening (the documented relation).
#[test]
fn raw_and_widened_are_the_sums_of_bytes_and_widening() {
    use crate::dtype::DType;
    let bf16: Vec<u8> = (0..4096u32).map(|i| (i * 37) as u8).collect();
    let f32: Vec<u8> = bf16
        .chunks_exact(2)
        .flat_map(|h| [0, 0, h[0], h[1]])
        .collect();
    let s = sum_raw_and_widened(DType::BF16, 256, &bf16).unwrap();
    assert_eq!(s.raw, sum_bytes(256, &bf16));
    assert_eq!(s.widened, sum_bytes(512, &f32));
}

/// Both builds of the block loop (the tests elsewhere only reach the
/// one the CPU selects) against the one-word definition.
#[test]
fn portable_and_simd_block_sums_equal_the_definition() {
    let mut s = 5u64;
    let bytes: Vec<u8> = (0..4 * 1024 + 3)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix64(s) as u8
        })
        .collect();
    let (blocks, _) = bytes.as_chunks::<1024>();
    for first in [0u64, 1, 1 << 40] {
        let want = bytes[..4 * 1024]
            .chunks_exact(4)
            .enumerate()
            .fold(0u64, |acc, (k, w)| {
                let w = u32::from_le_bytes(w.try_into().unwrap());
                acc.wrapping_add(term(first * BLOCK_WORDS + k as u64, w))
            });
        assert_eq!(sum_blocks_portable(first, blocks), want);
        assert_eq!(sum_blocks(first, blocks), want);
        #[cfg(target_arch = "x86_64")]
        if crate::convert::kernels::has_avx2() {
            // SAFETY: AVX2 was just detected.
            assert_eq!(unsafe { x86::sum_blocks_avx2(first, blocks) }, want);
        }
    }
}

/// The fused bf16 -> f32 block sums (both builds) equal the sum of the
/// widened words.
#[test]
fn fused_bf16_block_sums_equal_the_definition() {
    let mut s = 6u64;
    let src: Vec<u8> = (0..3 * 512)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix64(s) as u8
        })
        .collect();
    let (blocks, _) = src.as_chunks::<512>();
    for first in [0u64, 5, 1 << 40] {
        let want = src.chunks_exact(2).enumerate().fold(0u64, |acc, (k, h)| {
            let w = (u16::from_le_bytes(h.try_into().unwrap()) as u32) << 16;
            acc.wrapping_add(term(first * BLOCK_WORDS + k as u64, w))
        });
        assert_eq!(sum_bf16_as_f32_blocks(first, blocks), want);
        #[cfg(target_arch = "x86_64")]
        if crate::convert::kernels::has_avx2() {
            // SAFETY: AVX2 was just detected.
            let fused = unsafe { x86::sum_bf16_as_f32_blocks_avx2(first, blocks) };
            assert_eq!(fused, want);
        }
    }
}

/// Deterministic pseudo-random bytes.
fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            mix64(s) as u8
        })
        .collect()
}

/// Mostly normal f16 values (as in real tensors) with zeros, both
/// infinities, NaNs (quiet and signalling) and subnormals planted at
/// varying positions; as bf16 the same bits are ordinary values.
fn mostly_normal_f16(n: usize, seed: u64) -> Vec<u8> {
    const SPECIAL: [u16; 10] = [
        0x0000, 0x8000, 0x0001, 0x83ff, 0x03ff, 0x7c00, 0xfc00, 0x7e01, 0x7c01, 0xffff,
    ];
    let mut s = seed;
    (0..n)
        .flat_map(|i| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let r = mix64(s);
            let h = if i % 97 == 13 {
                SPECIAL[(r >> 40) as usize % SPECIAL.len()]
            } else {
                (r as u16 & 0x83ff) | ((1 + (r >> 16) as u16 % 30) << 10)
            };
            h.to_le_bytes()
        })
        .collect()
}

/// The definition: `(raw, widened)` of `bytes` at word `start` as sums
/// of [`term`] over the words and over the widened elements.
fn fused_by_definition(f16: bool, start: u64, bytes: &[u8]) -> RawAndWidened {
    let raw = bytes.chunks(4).enumerate().fold(0u64, |acc, (k, w)| {
        let mut b = [0u8; 4];
        b[..w.len()].copy_from_slice(w);
        acc.wrapping_add(term(start + k as u64, u32::from_le_bytes(b)))
    });
    let widened = bytes.chunks_exact(2).enumerate().fold(0u64, |acc, (k, h)| {
        let h = u16::from_le_bytes([h[0], h[1]]);
        let w = if f16 {
            crate::convert::scalar::f16_to_f32(h)
        } else {
            crate::convert::scalar::bf16_to_f32(h)
        };
        acc.wrapping_add(term(2 * start + k as u64, w))
    });
    RawAndWidened { raw, widened }
}

/// The two separate existing sums: [`sum_bytes`] of the bytes and
/// [`sum_bytes`] of the output of `convert_bytes`.
fn fused_by_separate_sums(f16: bool, start: u64, bytes: &[u8]) -> RawAndWidened {
    use crate::dtype::DType;
    let from = if f16 { DType::F16 } else { DType::BF16 };
    let whole = &bytes[..bytes.len() / 2 * 2];
    let mut out = vec![0u8; 2 * whole.len()];
    crate::convert::convert_bytes(from, whole, DType::F32, &mut out).unwrap();
    RawAndWidened {
        raw: sum_bytes(start, bytes),
        widened: sum_bytes(2 * start, &out),
    }
}

/// Every build of the fused block loop (portable, AVX2, AVX-512 where
/// the CPU has them) against the definition, for bf16 and f16 over
/// every 16-bit pattern in both halves of a word, random words, and
/// mostly normal data with planted special values.
#[test]
fn fused_block_builds_equal_the_definition() {
    let every: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
    let every_swapped: Vec<u8> = (0..=u16::MAX).flat_map(|h| (h ^ 1).to_le_bytes()).collect();
    let inputs = [
        every,
        every_swapped,
        random_bytes(37 * 1024, 7),
        mostly_normal_f16(40 * 512, 8),
    ];
    for bytes in &inputs {
        let (blocks, _) = bytes.as_chunks::<1024>();
        let whole = blocks.as_flattened();
        for first in [0u64, 3, 1 << 40] {
            for f16 in [false, true] {
                let want = fused_by_definition(f16, first * BLOCK_WORDS, whole);
                let mut got = vec![(
                    "portable",
                    if f16 {
                        fused_blocks_portable::<true>(first, 2 * first, blocks)
                    } else {
                        fused_blocks_portable::<false>(first, 2 * first, blocks)
                    },
                )];
                #[cfg(target_arch = "x86_64")]
                {
                    if crate::convert::kernels::has_avx2() {
                        // SAFETY: AVX2 was just detected.
                        let s = unsafe {
                            if f16 {
                                x86::fused_blocks_avx2::<true>(first, 2 * first, blocks)
                            } else {
                                x86::fused_blocks_avx2::<false>(first, 2 * first, blocks)
                            }
                        };
                        got.push(("avx2", s));
                    }
                    if x86::has_avx512() {
                        // SAFETY: AVX-512F and AVX-512BW were just detected.
                        let s = unsafe {
                            if f16 {
                                x86::fused_blocks_avx512::<true>(first, 2 * first, blocks)
                            } else {
                                x86::fused_blocks_avx512::<false>(first, 2 * first, blocks)
                            }
                        };
                        got.push(("avx512", s));
                    }
                }
                for (name, s) in got {
                    assert_eq!(s, want, "{name} f16={f16} first block {first}");
                }
            }
        }
    }
}

/// Which builds the machine running the tests exercised (so a run on a
/// CPU without AVX-512 is visible in the log, not silently passing).
#[test]
fn report_fused_builds_tested() {
    #[cfg(target_arch = "x86_64")]
    println!(
        "fused sums: avx2 {}, avx512 {}",
        crate::convert::kernels::has_avx2(),
        x86::has_avx512()
    );
    let s = sum_raw_and_widened(crate::dtype::DType::BF16, 0, &[1, 2, 3, 4]).unwrap();
    assert_eq!(s, fused_by_definition(false, 0, &[1, 2, 3, 4]));
}

/// [`sum_raw_and_widened`] equals both the separate existing sums and
/// the definition at every start position the loader uses (multiples
/// of 64 KiB), at misaligned starts (head before the first block), with
/// lengths that are not a multiple of the block, odd word tails and a
/// trailing odd byte.
#[test]
fn fused_sums_equal_the_separate_sums() {
    use crate::dtype::DType;
    let starts = [
        0u64,
        1,
        2,
        127,
        128,
        255,
        256,
        257,
        16 * 1024,
        3 * 16 * 1024,
        1 << 40,
    ];
    let lens = [
        0usize,
        1,
        2,
        3,
        4,
        5,
        6,
        1018,
        1020,
        1022,
        1023,
        1024,
        1026,
        2048,
        4 * 1024 + 6,
        9 * 1024 + 2,
        20_000,
        65_536 + 1,
    ];
    let data = [random_bytes(70_000, 11), mostly_normal_f16(35_000, 12)];
    for bytes in &data {
        for &start in &starts {
            for &len in &lens {
                let b = &bytes[..len];
                for (from, f16) in [(DType::BF16, false), (DType::F16, true)] {
                    let got = sum_raw_and_widened(from, start, b).unwrap();
                    let want = fused_by_separate_sums(f16, start, b);
                    assert_eq!(got, want, "{from:?} start {start} len {len}");
                    if len <= 4 * 1024 + 6 {
                        assert_eq!(got, fused_by_definition(f16, start, b));
                    }
                }
            }
        }
    }
    // The same at every alignment of the bytes in memory.
    for shift in 1..8 {
        let b = &data[0][shift..shift + 5000];
        for (from, f16) in [(DType::BF16, false), (DType::F16, true)] {
            assert_eq!(
                sum_raw_and_widened(from, 256, b).unwrap(),
                fused_by_separate_sums(f16, 256, b)
            );
        }
    }
}

/// Pieces add up: the sums of consecutive word-aligned pieces equal
/// those of the whole (as the loader adds its 1 MiB parts).
#[test]
fn fused_sums_of_pieces_add_up() {
    use crate::dtype::DType;
    let bytes = random_bytes(3 * 65_536 + 10, 13);
    let whole = sum_raw_and_widened(DType::F16, 0, &bytes).unwrap();
    let mut acc = RawAndWidened::default();
    for (k, piece) in bytes.chunks(65_536).enumerate() {
        let s = sum_raw_and_widened(DType::F16, (k * 16_384) as u64, piece).unwrap();
        acc = acc.add(s);
    }
    assert_eq!(acc, whole);
    assert_eq!(whole.raw, sum_bytes(0, &bytes));
}

/// Only bf16 and f16 widen to f32 here: any other dtype is `None`.
#[test]
fn fused_sums_of_other_dtypes_are_none() {
    use crate::dtype::DType;
    for d in DType::ALL {
        let got = sum_raw_and_widened(d, 0, &[0u8; 8]);
        assert_eq!(
            got.is_some(),
            matches!(d, DType::BF16 | DType::F16),
            "{d:?}"
        );
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..Default::default() })]
    /// Random pieces at random starts, for both dtypes.
    #[test]
    fn fused_sums_match_separate_sums(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..6000),
        start in 0u64..5000,
        f16 in proptest::prelude::any::<bool>(),
    ) {
        use crate::dtype::DType;
        let from = if f16 { DType::F16 } else { DType::BF16 };
        let got = sum_raw_and_widened(from, start, &bytes).unwrap();
        proptest::prop_assert_eq!(got, fused_by_separate_sums(f16, start, &bytes));
    }
}

/// The one-pass staging copy: the same sum as `sum_bytes` and a faithful
/// copy, at block starts (the fused loop, aligned and misaligned `dst`)
/// and elsewhere (copy then sum), with partial blocks and words.
#[test]
fn copy_and_sum_copies_and_sums_like_sum_bytes() {
    let src: Vec<u8> = (0..9000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let mut backing = vec![0u8; 9100];
    for start in [0u64, 256, 512 * 7, 3, 255] {
        for len in [0usize, 1, 1023, 1024, 1025, 4096, 9000] {
            for shift in [0usize, 1, 32, 33] {
                let dst = &mut backing[shift..shift + len];
                dst.fill(0xAB);
                let s = copy_and_sum(start, &src[..len], dst);
                assert_eq!(
                    s,
                    sum_bytes(start, &src[..len]),
                    "start {start} len {len} shift {shift}"
                );
                assert_eq!(s, reference_sum(start, &src[..len]));
                assert_eq!(&backing[shift..shift + len], &src[..len]);
            }
        }
    }
}
