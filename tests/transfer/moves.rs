//! Verified moves (`rocm_safe::moves`) on the host backend and on
//! `Faults<backend>`, and on a GPU where one is built and present: uploads
//! (one buffer, packed, owned), downloads (with and without a conversion
//! on arrival), casts (widening checked exactly, narrowing at samples);
//! every injected fault of the reported ROCm failures is caught and served
//! by the next rung with bit-exact data, or refused with an error.

use crate::common;
use crate::common::faults::faulty;

use rocm_safe::device::faults::{FaultKind, When};
use rocm_safe::device::{Device, Stream};
use rocm_safe::fallback::{Check, Failure};
use rocm_safe::moves::{packed_layout, MoveCheck, MoveOptions, MoveRung, Mover, Uploaded};
use rocm_safe::{DType, Error};

use common::{Open, Rng};

per_device!(
    uploads_packed_and_single_land_exactly,
    downloads_land_exactly_and_convert_on_arrival,
    casts_are_exact_and_checked,
    every_move_fault_is_caught_and_served,
    dropped_odd_small_copies_of_a_batch_are_caught,
    truncated_downloads_are_caught,
    large_copies_refused_go_down_to_pageable,
    a_refused_registration_and_its_sticky_error_are_survived,
    a_cast_kernel_writing_zeros_is_caught_by_the_exact_check,
    fail_fast_and_exhausted_ladders_are_errors,
);

/// Small staging so that a few hundred KiB cross several chunks.
fn opts() -> MoveOptions {
    MoveOptions::default()
        .with_chunk_bytes(64 << 10)
        .with_small_chunk_bytes(16 << 10)
}

fn bytes(rng: &mut Rng, n: usize) -> Vec<u8> {
    rng.bytes(n)
}
fn upload(
    mover: &mut Mover,
    stream: &Stream,
    src: &[u8],
) -> (Vec<u8>, rocm_safe::moves::MoveReport) {
    let mut dst = stream.alloc::<u8>(src.len()).unwrap();
    let r = mover.upload_into(stream, src, &mut dst.view_mut()).unwrap();
    (dst.to_vec().unwrap(), r)
}

fn uploads_packed_and_single_land_exactly(open: Open<'_>) {
    let dev = Device::from_backend(open());
    let stream = dev.stream().unwrap();
    let mut mover = Mover::new(&dev, opts()).unwrap();
    let mut rng = Rng::new(1);
    // One buffer across chunk boundaries, odd lengths included.
    for n in [0usize, 1, 3, 4096, (64 << 10) + 5, 300_001] {
        let src = bytes(&mut rng, n);
        let (got, r) = upload(&mut mover, &stream, &src);
        assert_eq!(got, src, "{n} bytes");
        assert_eq!(
            (r.rung, r.check),
            (MoveRung::Staged, MoveCheck::Fingerprint)
        );
        assert!(r.clean() && r.bytes == n as u64, "{r}");
    }
    // A batch: 20 small buffers in one span (gaps zeroed), one check.
    let parts: Vec<Vec<u8>> = (0..20).map(|i| bytes(&mut rng, 1 + i * 37)).collect();
    let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
    let (offs, total) = packed_layout(&lens, 256);
    assert!(offs.iter().all(|o| o % 256 == 0));
    let mut dst = stream.alloc::<u8>(total).unwrap();
    // Garbage first: the gaps must come back zeroed.
    dst.copy_htod(&vec![0xEE; total]).unwrap();
    let srcs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let r = mover
        .upload_packed(&stream, &srcs, &offs, &mut dst.view_mut())
        .unwrap();
    assert_eq!((r.pieces, r.rung), (20, MoveRung::Staged));
    let got = dst.to_vec().unwrap();
    let mut want = vec![0u8; total];
    for (p, &o) in parts.iter().zip(&offs) {
        want[o..o + p.len()].copy_from_slice(p);
    }
    assert_eq!(got, want);
    // Owned upload.
    let src = bytes(&mut rng, 1000);
    match mover.upload(&stream, &src).unwrap() {
        (Uploaded::Device(b), r) => {
            assert_eq!(b.to_vec().unwrap(), src);
            assert_eq!(r.rung, MoveRung::Staged);
        }
        (other, r) => panic!("not on the device: {other:?} {r}"),
    }
    // Overlapping placements and wrong lengths are refused.
    let a = [1u8; 8];
    let mut d = stream.alloc::<u8>(16).unwrap();
    let e = mover
        .upload_packed(&stream, &[&a, &a], &[0, 4], &mut d.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::OutOfBounds { .. }), "{e}");
    let e = mover
        .upload_into(&stream, &a, &mut d.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
}

fn downloads_land_exactly_and_convert_on_arrival(open: Open<'_>) {
    let dev = Device::from_backend(open());
    let stream = dev.stream().unwrap();
    let mut mover = Mover::new(&dev, opts()).unwrap();
    let mut rng = Rng::new(2);
    for n in [0usize, 2, 4096, 200_002] {
        let src = bytes(&mut rng, n);
        let buf = stream.clone_htod(&src).unwrap();
        let mut out = vec![0u8; n];
        let r = mover
            .download_into(&stream, &buf.view(), DType::U8, &mut out, DType::U8)
            .unwrap();
        assert_eq!(out, src);
        assert_eq!(
            (r.rung, r.check),
            (MoveRung::Staged, MoveCheck::Fingerprint)
        );
    }
    // bf16 latents to f32 on arrival: every pattern, exactly (bits << 16).
    let pats: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    let buf = stream.clone_htod(&pats).unwrap();
    let mut out = vec![0u8; pats.len() * 2];
    mover
        .download_into(&stream, &buf.view(), DType::BF16, &mut out, DType::F32)
        .unwrap();
    for (i, w) in out.chunks_exact(4).enumerate() {
        assert_eq!(u32::from_le_bytes(w.try_into().unwrap()), (i as u32) << 16);
    }
    // A pair the crate does not convert, and a wrong length.
    let mut small = vec![0u8; 8];
    let e = mover
        .download_into(&stream, &buf.view(), DType::I32, &mut small, DType::F32)
        .unwrap_err();
    assert!(matches!(e, Error::UnsupportedConversion { .. }), "{e}");
    let e = mover
        .download_into(&stream, &buf.view(), DType::BF16, &mut small, DType::F32)
        .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
}

fn cast_into(
    mover: &mut Mover,
    stream: &Stream,
    src: &[u8],
    from: DType,
    to: DType,
) -> (Vec<u8>, rocm_safe::moves::MoveReport) {
    let s = stream.clone_htod(src).unwrap();
    let n = src.len() / from.size().unwrap();
    let mut d = stream.alloc::<u8>(n * to.size().unwrap()).unwrap();
    let r = mover
        .cast(stream, &s.view(), from, &mut d.view_mut(), to)
        .unwrap();
    (d.to_vec().unwrap(), r)
}

fn reference(src: &[u8], from: DType, to: DType) -> Vec<u8> {
    let n = src.len() / from.size().unwrap();
    let mut out = vec![0u8; n * to.size().unwrap()];
    rocm_safe::convert::convert_bytes(from, src, to, &mut out).unwrap();
    out
}

fn casts_are_exact_and_checked(open: Open<'_>) {
    let dev = Device::from_backend(open());
    let stream = dev.stream().unwrap();
    let mut mover = Mover::new(&dev, opts()).unwrap();
    let mut rng = Rng::new(3);
    let all16: Vec<u8> = (0..=u16::MAX).flat_map(|b| b.to_le_bytes()).collect();
    let all8: Vec<u8> = (0..=u8::MAX).collect();
    for (src, from) in [
        (&all16, DType::BF16),
        (&all16, DType::F16),
        (&all8, DType::F8_E4M3),
        (&all8, DType::F8_E5M2),
    ] {
        let (got, r) = cast_into(&mut mover, &stream, src, from, DType::F32);
        assert_eq!(got, reference(src, from, DType::F32), "{from}");
        assert_eq!(
            (r.rung, r.check),
            (MoveRung::Device, MoveCheck::Exact),
            "{r}"
        );
    }
    let f32s = bytes(&mut rng, 4 * 50_000);
    for to in [DType::BF16, DType::F16] {
        let (got, r) = cast_into(&mut mover, &stream, &f32s, DType::F32, to);
        assert_eq!(got, reference(&f32s, DType::F32, to), "{to}");
        assert_eq!(
            (r.rung, r.check),
            (MoveRung::Device, MoveCheck::Sampled),
            "{r}"
        );
    }
    // No device kernel for f64 -> f32: served through the host, verified.
    let f64s = bytes(&mut rng, 8 * 1000);
    let (got, r) = cast_into(&mut mover, &stream, &f64s, DType::F64, DType::F32);
    assert_eq!(got, reference(&f64s, DType::F64, DType::F32));
    assert_eq!(
        (r.rung, r.check),
        (MoveRung::ViaHost, MoveCheck::Fingerprint)
    );
    let s = stream.clone_htod(&f64s).unwrap();
    let mut d = stream.alloc::<u8>(8).unwrap();
    let e = mover
        .cast(
            &stream,
            &s.view(),
            DType::I64,
            &mut d.view_mut(),
            DType::F32,
        )
        .unwrap_err();
    assert!(matches!(e, Error::UnsupportedConversion { .. }), "{e}");
}

/// Each copy fault once, on an upload and on a download: caught by the
/// fingerprints and served exactly by the next rung.
fn every_move_fault_is_caught_and_served(open: Open<'_>) {
    let mut rng = Rng::new(4);
    for kind in [
        FaultKind::CopyLandsZeros,
        FaultKind::CopyLandsStale,
        FaultKind::CopyLandsGarbage,
        FaultKind::CopyZeroedRange,
        FaultKind::InvalidValueOnCopy,
    ] {
        // New bytes for each kind: a GPU's allocator can hand back the
        // previous round's memory, where a lost ("stale") copy would find
        // the very bytes it was to write (seen on an H200).
        let src = bytes(&mut rng, 150_000);
        let dev = faulty(open, &[(kind, When::Nth(1))]).0;
        let stream = dev.stream().unwrap();
        let mut mover = Mover::new(&dev, opts()).unwrap();
        let (got, r) = upload(&mut mover, &stream, &src);
        assert_eq!(got, src, "{kind:?}");
        assert_eq!(r.rung, MoveRung::SmallChunks, "{kind:?}: {r}");
        assert_eq!(r.attempts.len(), 1, "{r}");
        let want_mismatch = kind != FaultKind::InvalidValueOnCopy;
        assert_eq!(
            matches!(
                r.attempts[0].failure,
                Failure::FingerprintMismatch {
                    check: Check::Copy,
                    ..
                }
            ),
            want_mismatch,
            "{kind:?}: {r}"
        );
    }
}

/// The gfx11 staging failure: every odd-numbered small copy is lost. A
/// batch of small tensors sent one by one would lose half of them; the
/// packed batch is one copy, and where that copy is hit the check sees it.
fn dropped_odd_small_copies_of_a_batch_are_caught(open: Open<'_>) {
    let dev = faulty(open, &[(FaultKind::SmallCopyLost, When::EveryNth(2))]).0;
    let stream = dev.stream().unwrap();
    let mut mover = Mover::new(&dev, opts()).unwrap();
    let mut rng = Rng::new(5);
    let parts: Vec<Vec<u8>> = (0..20).map(|i| bytes(&mut rng, 4 + i * 8)).collect();
    let srcs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    let lens: Vec<usize> = parts.iter().map(Vec::len).collect();
    let (offs, total) = packed_layout(&lens, 256);
    let mut caught = 0;
    for _ in 0..4 {
        let mut dst = stream.alloc::<u8>(total).unwrap();
        let r = mover
            .upload_packed(&stream, &srcs, &offs, &mut dst.view_mut())
            .unwrap();
        let got = dst.to_vec().unwrap();
        for (p, &o) in parts.iter().zip(&offs) {
            assert_eq!(&got[o..o + p.len()], &p[..]);
        }
        caught += r.attempts.len();
    }
    assert!(caught >= 1, "no lost copy was caught");
    // One by one, each small copy checked: still exact.
    for p in &parts {
        let (got, _) = upload(&mut mover, &stream, p);
        assert_eq!(&got, p);
    }
}

fn truncated_downloads_are_caught(open: Open<'_>) {
    let dev = faulty(open, &[(FaultKind::DownloadTruncated, When::Nth(0))]).0;
    let stream = dev.stream().unwrap();
    let mut mover = Mover::new(&dev, opts()).unwrap();
    let mut rng = Rng::new(6);
    let src = bytes(&mut rng, 100_000);
    let buf = stream.clone_htod(&src).unwrap();
    let mut out = vec![0u8; src.len()];
    let r = mover
        .download_into(&stream, &buf.view(), DType::U8, &mut out, DType::U8)
        .unwrap();
    assert_eq!(out, src);
    assert_eq!(r.rung, MoveRung::SmallChunks, "{r}");
    assert!(matches!(
        r.attempts[0].failure,
        Failure::FingerprintMismatch { .. }
    ));
}

fn large_copies_refused_go_down_to_pageable(open: Open<'_>) {
    // Every copy of more than 1 MiB is refused. With 2 MiB staging and 2
    // MiB small chunks, every rung copies more than that at once.
    let dev = faulty(open, &[(FaultKind::InvalidValueOnLargeCopy, When::Always)]).0;
    let stream = dev.stream().unwrap();
    let o = MoveOptions::default()
        .with_chunk_bytes(2 << 20)
        .with_small_chunk_bytes(2 << 20);
    let mut mover = Mover::new(&dev, o).unwrap();
    let mut rng = Rng::new(8);
    // 12 MiB: the staged rung copies it in 2 MiB pieces (its staging
    // buffers), each refused.
    let src = bytes(&mut rng, 12 << 20);
    let mut dst = stream.alloc::<u8>(src.len()).unwrap();
    let e = mover
        .upload_into(&stream, &src, &mut dst.view_mut())
        .unwrap_err();
    // Pageable copies are one large copy too: every rung failed, an error.
    assert!(matches!(e, Error::TransferFailed { .. }), "{e}");
    assert!(e.to_string().contains("invalid value"), "{e}");
    // With 1 MiB small chunks the second rung serves.
    let mut mover = Mover::new(
        &dev,
        opts()
            .with_chunk_bytes(2 << 20)
            .with_small_chunk_bytes(1 << 20),
    )
    .unwrap();
    let r = mover
        .upload_into(&stream, &src, &mut dst.view_mut())
        .unwrap();
    assert_eq!(r.rung, MoveRung::SmallChunks, "{r}");
    // Read back in pieces of 512 KiB (large copies are refused).
    let mut got = Vec::new();
    for start in (0..src.len()).step_by(512 << 10) {
        let end = (start + (512 << 10)).min(src.len());
        got.extend(dst.slice(start..end).unwrap().to_vec(&stream).unwrap());
    }
    assert_eq!(got, src);
}

fn a_refused_registration_and_its_sticky_error_are_survived(open: Open<'_>) {
    let dev = faulty(open, &[(FaultKind::PinnedRefusedSticky, When::Nth(0))]).0;
    let stream = dev.stream().unwrap();
    let mut mover = Mover::new(&dev, opts()).unwrap();
    let mut rng = Rng::new(9);
    let src = bytes(&mut rng, 100_000);
    let (got, r) = upload(&mut mover, &stream, &src);
    assert_eq!(got, src);
    assert!(!r.attempts.is_empty(), "{r}");
    assert!(r.to_string().contains("sticky"), "{r}");
    // Nothing is left behind: the next move is clean.
    let (got, r) = upload(&mut mover, &stream, &src);
    assert_eq!(got, src);
    assert!(r.clean(), "{r}");
}

fn a_cast_kernel_writing_zeros_is_caught_by_the_exact_check(open: Open<'_>) {
    let dev = faulty(open, &[(FaultKind::ConvertWritesZeros, When::Nth(0))]).0;
    let stream = dev.stream().unwrap();
    let mut mover = Mover::new(&dev, opts()).unwrap();
    let src: Vec<u8> = (1..=4000u16).flat_map(|b| b.to_le_bytes()).collect();
    let (got, r) = cast_into(&mut mover, &stream, &src, DType::BF16, DType::F32);
    assert_eq!(got, reference(&src, DType::BF16, DType::F32));
    assert_eq!(r.rung, MoveRung::ViaHost, "{r}");
    assert!(
        r.attempts[0]
            .failure
            .to_string()
            .contains("differ from the exact widening"),
        "{r}"
    );
    // Narrowing: the zeros are caught at the samples.
    let dev = faulty(open, &[(FaultKind::ConvertWritesZeros, When::Nth(0))]).0;
    let stream = dev.stream().unwrap();
    let mut mover = Mover::new(&dev, opts()).unwrap();
    let f: Vec<u8> = (1..=4000u32)
        .flat_map(|i| (i as f32).to_bits().to_le_bytes())
        .collect();
    let (got, r) = cast_into(&mut mover, &stream, &f, DType::F32, DType::BF16);
    assert_eq!(got, reference(&f, DType::F32, DType::BF16));
    assert_eq!(r.rung, MoveRung::ViaHost, "{r}");
}

fn fail_fast_and_exhausted_ladders_are_errors(open: Open<'_>) {
    let dev = faulty(open, &[(FaultKind::CopyLandsZeros, When::Always)]).0;
    let stream = dev.stream().unwrap();
    let src = vec![5u8; 10_000];
    let mut dst = stream.alloc::<u8>(src.len()).unwrap();
    let mut fast = Mover::new(&dev, opts().with_ladder(false)).unwrap();
    let e = fast
        .upload_into(&stream, &src, &mut dst.view_mut())
        .unwrap_err();
    assert!(
        matches!(e, Error::TransferFailed { rung: "staged", .. }),
        "{e}"
    );
    // Every rung lands zeros: an error naming them, never zeros returned.
    let mut m = Mover::new(&dev, opts()).unwrap();
    let e = m
        .upload_into(&stream, &src, &mut dst.view_mut())
        .unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("staged") && msg.contains("small chunks"),
        "{msg}"
    );
    // The owned upload keeps the data on the host instead.
    match m.upload(&stream, &src).unwrap() {
        (Uploaded::Host(h), r) => {
            assert_eq!(h, src);
            assert_eq!(r.rung, MoveRung::KeptOnHost);
        }
        (other, r) => panic!("{other:?} {r}"),
    }
    // Options out of range.
    for o in [
        MoveOptions::default().with_chunk_bytes(1000),
        MoveOptions::default().with_small_chunk_bytes(0),
        MoveOptions::default().with_samples(1),
    ] {
        assert!(matches!(
            Mover::new(&dev, o),
            Err(Error::InvalidLoadOptions { .. })
        ));
    }
}
