//! The fingerprint: its defining formula (from the docs), partial sums, parallel
//! and streaming forms, and the changes it must detect.

use crate::common;

use common::Rng;
use proptest::prelude::*;
use rocm_safe::convert::fingerprint::{
    fingerprint_bytes, fingerprint_words, finish, par_sum_bytes, sum_bytes, Fingerprint,
    Fingerprinter,
};
use rocm_safe::convert::{self, expected_fingerprint};
use rocm_safe::DType;

/// The splitmix64 finaliser of the documented definition.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The term `t_i` of word `w` at position `i`, from the documented formula
/// (the crate's own is tested against the same formula in its unit tests).
fn term(i: u64, w: u32) -> u64 {
    let l = mix64((i % 256).wrapping_add(0x6A09_E667_F3BC_C908));
    let b = mix64((i / 256).wrapping_add(0xBB67_AE85_84CA_A73B));
    let add = (l as u32) ^ (b as u32);
    let mul = (((l >> 32) as u32) ^ ((b >> 32) as u32)) | 1;
    (w.wrapping_add(add) as u64) * mul as u64
}

fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    Rng::new(seed).bytes(len)
}

/// The definition, word by word, straight from the documented formula.
fn reference_sum(start_word: u64, bytes: &[u8]) -> u64 {
    bytes.chunks(4).enumerate().fold(0u64, |s, (k, c)| {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        s.wrapping_add(term(start_word + k as u64, u32::from_le_bytes(w)))
    })
}

fn reference(bytes: &[u8]) -> Fingerprint {
    finish(reference_sum(0, bytes), bytes.len() as u64)
}

#[test]
fn finish_and_display_are_the_documented_formula() {
    assert_eq!(
        finish(5, 9),
        Fingerprint(mix64(5 ^ mix64(9u64.wrapping_add(0x3C6E_F372_FE94_F82B))))
    );
    assert_eq!(format!("{}", Fingerprint(0xab)), "00000000000000ab");
    // One word at position 300 (block 1, lane 44), through the public sums.
    assert_eq!(
        sum_bytes(300, &0xdead_beef_u32.to_le_bytes()),
        term(300, 0xdead_beef)
    );
}

#[test]
fn fast_sums_equal_the_reference_at_every_length_and_offset() {
    let data = random_bytes(1, 5000);
    // Lengths around block edges and odd tails; start words on and off
    // block boundaries.
    for len in [
        0usize, 1, 2, 3, 4, 5, 7, 8, 1020, 1023, 1024, 1025, 1028, 2047, 2048, 4999,
    ] {
        for start in [0u64, 1, 7, 255, 256, 257, 1000, (1 << 33) + 3] {
            let b = &data[..len];
            let want = reference_sum(start, b);
            assert_eq!(sum_bytes(start, b), want, "len {len} start {start}");
            assert_eq!(par_sum_bytes(start, b), want, "len {len} start {start}");
            // Unaligned source.
            let u = &data[1..len + 1];
            assert_eq!(sum_bytes(start, u), reference_sum(start, u));
        }
        assert_eq!(fingerprint_bytes(&data[..len]), reference(&data[..len]));
    }
}

#[test]
fn parallel_serial_words_and_bytes_agree_on_large_buffers() {
    // Several MiB: above the parallel threshold, with a trailing partial
    // word and a start word that is not on a block boundary.
    let data = random_bytes(2, (3 << 20) + 4 * 1000 + 3);
    let want = reference_sum(77, &data);
    let serial = sum_bytes(77, &data);
    let parallel = par_sum_bytes(77, &data);
    assert_eq!(serial, want);
    assert_eq!(parallel, want);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    assert_eq!(one.install(|| par_sum_bytes(77, &data)), want);
    assert_eq!(fingerprint_bytes(&data), reference(&data));

    let whole = &data[..data.len() / 4 * 4];
    let words: Vec<u32> = whole
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(fingerprint_words(&words), fingerprint_bytes(whole));
    assert_eq!(
        fingerprint_words(&words[..5]),
        fingerprint_bytes(&whole[..20])
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(debug_assertions) { 64 } else { 512 }))]

    /// Any partition into word-aligned pieces sums to the whole.
    #[test]
    fn partial_sums_of_any_partition_add_up(
        seed in any::<u64>(),
        len in 0usize..20_000,
        mut cuts in proptest::collection::vec(0usize..5_000, 0..6),
    ) {
        let data = random_bytes(seed, len);
        let words = len.div_ceil(4);
        cuts.push(0);
        cuts.push(words);
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(words)).collect();
        cuts.sort();
        let mut sum = 0u64;
        for w in cuts.windows(2) {
            let piece = &data[(4 * w[0]).min(len)..(4 * w[1]).min(len)];
            sum = sum.wrapping_add(sum_bytes(w[0] as u64, piece));
        }
        prop_assert_eq!(finish(sum, len as u64), fingerprint_bytes(&data));
        prop_assert_eq!(fingerprint_bytes(&data), reference(&data));
    }

    /// The streaming form equals the one-shot form for pieces of any
    /// length, words split across pieces included.
    #[test]
    fn streaming_equals_one_shot(
        seed in any::<u64>(),
        len in 0usize..10_000,
        sizes in proptest::collection::vec(0usize..3_000, 1..8),
    ) {
        let data = random_bytes(seed, len);
        let mut f = Fingerprinter::new();
        assert!(f.is_empty());
        let mut at = 0;
        for s in sizes.iter().cycle() {
            if at >= len {
                break;
            }
            let end = (at + s.max(&1)).min(len);
            f.update(&data[at..end]);
            at = end;
            prop_assert_eq!(f.len(), at as u64);
        }
        prop_assert_eq!(f.finish(), fingerprint_bytes(&data));
    }
}

#[test]
fn streaming_handles_one_byte_pieces_and_large_pieces() {
    let data = random_bytes(3, 2 << 20);
    let mut f = Fingerprinter::new();
    for b in &data[..13] {
        f.update(std::slice::from_ref(b));
    }
    f.update(&data[13..]);
    assert_eq!(f.finish(), fingerprint_bytes(&data));
    assert_eq!(Fingerprinter::default().finish(), fingerprint_bytes(&[]));
}

#[test]
fn all_zeros_differs_from_data_and_lengths_are_keyed() {
    let data = random_bytes(4, 1 << 16);
    let zeros = vec![0u8; data.len()];
    assert_ne!(fingerprint_bytes(&zeros), fingerprint_bytes(&data));
    // A zero-filled buffer of another length hashes differently too (the
    // length is part of the fingerprint), even when the words agree.
    assert_ne!(
        fingerprint_bytes(&zeros[..8]),
        fingerprint_bytes(&zeros[..7])
    );
    assert_ne!(
        fingerprint_bytes(&zeros[..8]),
        fingerprint_bytes(&zeros[..12])
    );
    assert_ne!(fingerprint_bytes(&[]), fingerprint_bytes(&[0]));
}

#[test]
fn a_swapped_or_shifted_chunk_changes_it() {
    let data = random_bytes(5, 1 << 16);
    let fp = fingerprint_bytes(&data);
    // Swap two 4 KiB chunks.
    let mut s = data.clone();
    let (a, b) = s.split_at_mut(8192);
    a[..4096].swap_with_slice(&mut b[..4096]);
    assert_ne!(fingerprint_bytes(&s), fp);
    // Swap two words inside one block, and two whole blocks.
    let mut s = data.clone();
    s.swap(0, 4);
    s.swap(1, 5);
    s.swap(2, 6);
    s.swap(3, 7);
    assert_ne!(fingerprint_bytes(&s), fp);
    let mut s = data.clone();
    let (a, b) = s.split_at_mut(1024);
    a.swap_with_slice(&mut b[..1024]);
    assert_ne!(fingerprint_bytes(&s), fp);
    // The same chunk landing one word late (a stale/shifted copy).
    let mut s = data.clone();
    s.copy_within(0..4096, 4);
    assert_ne!(fingerprint_bytes(&s), fp);
}

#[test]
fn every_single_bit_flip_changes_it() {
    let data = random_bytes(6, 3000);
    let fp = fingerprint_bytes(&data);
    // Every bit of a word in the first block, one on a block edge, one in
    // the middle and the trailing partial word.
    for byte0 in [0usize, 1020, 1024, 1500, 2996] {
        for bit in 0..32 {
            let mut s = data.clone();
            let at = byte0 + bit / 8;
            if at >= s.len() {
                continue;
            }
            s[at] ^= 1 << (bit % 8);
            assert_ne!(fingerprint_bytes(&s), fp, "byte {at} bit {}", bit % 8);
        }
    }
    // And every single-byte change of one word to every other value.
    for v in 0..=255u8 {
        let mut s = data.clone();
        if s[2048] == v {
            continue;
        }
        s[2048] = v;
        assert_ne!(fingerprint_bytes(&s), fp);
    }
}

#[test]
fn expected_fingerprint_equals_the_fingerprint_of_the_output() {
    // Odd element counts (a partial last word for 16-bit targets), counts
    // around the piece (4096) and parallel (128 Ki) sizes.
    let src = random_bytes(7, 8 * 140_000);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for from in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        for to in [DType::F32, DType::F16, DType::BF16] {
            let ss = from.size().unwrap();
            let ds = to.size().unwrap();
            for n in [0usize, 1, 3, 4095, 4096, 4097, 140_000 - 1] {
                let s = &src[..n * ss];
                let mut out = vec![0u8; n * ds];
                convert::convert_bytes(from, s, to, &mut out).unwrap();
                let fp = fingerprint_bytes(&out);
                assert_eq!(
                    expected_fingerprint(from, s, to).unwrap(),
                    fp,
                    "{from:?}->{to:?} {n}"
                );
                assert_eq!(
                    one.install(|| expected_fingerprint(from, s, to).unwrap()),
                    fp
                );
                assert_eq!(reference(&out), fp);
            }
        }
    }
}
