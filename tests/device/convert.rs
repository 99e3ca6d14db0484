//! Device conversions, fingerprints, copies and the verified conversion API,
//! on every backend: `host::*` always, `cuda::*` / `hip::*` with
//! `--features cuda|hip -- --ignored` on a machine with that GPU.

use crate::common;

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use half::{bf16, f16};
use rocm_safe::convert::{self, fingerprint_bytes, scalar};
use rocm_safe::device::{Device, NonFinite};
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::verify::{self, Policy, VerifyOptions};
use rocm_safe::{DType, Error};

use common::tamper::{mode, Tamper};
use common::{Open, Rng};

per_device!(
    widening_all_patterns_bit_exact,
    narrowing_tricky_and_random_bit_exact,
    sizes_and_unaligned_offsets,
    fingerprint_matches_cpu,
    fused_convert_fingerprint_matches_cpu,
    corruption_after_kernel_is_detected,
    verified_policies_serve_device,
    verified_mismatch_falls_back_or_fails,
    untrusted_kernel_goes_to_cpu,
    untrusted_fingerprint_kernel_reads_back,
    self_test_passes,
    copies_and_length_errors,
    pinned_async_round_trip,
    nonfinite_counts_and_clamps,
    nonfinite_counts_at_every_position_and_offset,
);

fn as_bf16(v: &[u16]) -> Vec<bf16> {
    v.iter().map(|&b| bf16::from_bits(b)).collect()
}
fn as_f16(v: &[u16]) -> Vec<f16> {
    v.iter().map(|&b| f16::from_bits(b)).collect()
}
fn bits32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn widening_all_patterns_bit_exact(dev: &Device) {
    let s = dev.stream().unwrap();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let src = s.clone_htod(&as_bf16(&all)).unwrap();
    let mut out = s.alloc::<f32>(all.len()).unwrap();
    s.convert(&src.view(), &mut out.view_mut()).unwrap();
    let got = bits32(&out.to_vec().unwrap());
    for (h, g) in all.iter().zip(&got) {
        assert_eq!(*g, scalar::bf16_to_f32(*h), "bf16 {h:#06x}");
    }
    let src = s.clone_htod(&as_f16(&all)).unwrap();
    s.convert(&src.view(), &mut out.view_mut()).unwrap();
    let got = bits32(&out.to_vec().unwrap());
    for (h, g) in all.iter().zip(&got) {
        assert_eq!(*g, scalar::f16_to_f32(*h), "f16 {h:#06x}");
    }
}

fn narrowing_tricky_and_random_bit_exact(dev: &Device) {
    let s = dev.stream().unwrap();
    let mut rng = Rng::new(7);
    let mut inputs: Vec<u32> = (0..=0xffffu32)
        .flat_map(|hi| {
            [
                0u32, 1, 0x0fff, 0x1000, 0x1001, 0x7fff, 0x8000, 0x8001, 0xffff,
            ]
            .map(move |lo| (hi << 16) | lo)
        })
        .collect();
    inputs.extend(rng.u32s(1 << 20));
    let xs: Vec<f32> = inputs.iter().map(|&b| f32::from_bits(b)).collect();
    let src = s.clone_htod(&xs).unwrap();
    let mut ob = s.alloc::<bf16>(xs.len()).unwrap();
    let mut oh = s.alloc::<f16>(xs.len()).unwrap();
    s.convert(&src.view(), &mut ob.view_mut()).unwrap();
    s.convert(&src.view(), &mut oh.view_mut()).unwrap();
    let gb = ob.to_vec().unwrap();
    let gh = oh.to_vec().unwrap();
    for ((x, b), h) in inputs.iter().zip(&gb).zip(&gh) {
        assert_eq!(b.to_bits(), scalar::f32_to_bf16(*x), "f32->bf16 {x:#010x}");
        assert_eq!(h.to_bits(), scalar::f32_to_f16(*x), "f32->f16 {x:#010x}");
    }
}

/// Every op at sizes around the vector width, with the source and the
/// destination each starting at element offsets 0..8 (so 16-byte alignment
/// of either side varies independently).
fn sizes_and_unaligned_offsets(dev: &Device) {
    let s = dev.stream().unwrap();
    let mut rng = Rng::new(11);
    const MAX: usize = 100_003;
    let h16 = rng.u16s(MAX + 16);
    let h32 = rng.f32_patterns(MAX + 16);
    let d_bf = s.clone_htod(&as_bf16(&h16)).unwrap();
    let d_f16 = s.clone_htod(&as_f16(&h16)).unwrap();
    let d32 = s.clone_htod(&h32).unwrap();
    let mut o32 = s.alloc::<f32>(MAX + 16).unwrap();
    let mut obf = s.alloc::<bf16>(MAX + 16).unwrap();
    let mut of16 = s.alloc::<f16>(MAX + 16).unwrap();
    for n in [
        0usize, 1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 255, 256, 257, 1023, 4097, MAX,
    ] {
        for (so, doff) in [
            (0, 0),
            (1, 0),
            (0, 1),
            (3, 5),
            (4, 0),
            (0, 4),
            (7, 7),
            (2, 6),
        ] {
            let want: Vec<u32> = h16[so..so + n]
                .iter()
                .map(|&h| scalar::bf16_to_f32(h))
                .collect();
            let src = d_bf.slice(so..so + n).unwrap();
            let mut dst = o32.slice_mut(doff..doff + n).unwrap();
            s.convert(&src, &mut dst).unwrap();
            let mut got = vec![0f32; n];
            dst.as_view().copy_dtoh(&s, &mut got).unwrap();
            assert_eq!(bits32(&got), want, "bf16->f32 n={n} so={so} do={doff}");

            let want: Vec<u32> = h16[so..so + n]
                .iter()
                .map(|&h| scalar::f16_to_f32(h))
                .collect();
            let src = d_f16.slice(so..so + n).unwrap();
            let mut dst = o32.slice_mut(doff..doff + n).unwrap();
            s.convert(&src, &mut dst).unwrap();
            let mut got = vec![0f32; n];
            dst.as_view().copy_dtoh(&s, &mut got).unwrap();
            assert_eq!(bits32(&got), want, "f16->f32 n={n} so={so} do={doff}");

            let src = d32.slice(so..so + n).unwrap();
            let mut dst = obf.slice_mut(doff..doff + n).unwrap();
            s.convert(&src, &mut dst).unwrap();
            let mut got = vec![bf16::ZERO; n];
            dst.as_view().copy_dtoh(&s, &mut got).unwrap();
            for (x, g) in h32[so..so + n].iter().zip(&got) {
                assert_eq!(
                    g.to_bits(),
                    scalar::f32_to_bf16(x.to_bits()),
                    "f32->bf16 n={n} so={so} do={doff}"
                );
            }
            let mut dst = of16.slice_mut(doff..doff + n).unwrap();
            s.convert(&src, &mut dst).unwrap();
            let mut got = vec![f16::ZERO; n];
            dst.as_view().copy_dtoh(&s, &mut got).unwrap();
            for (x, g) in h32[so..so + n].iter().zip(&got) {
                assert_eq!(
                    g.to_bits(),
                    scalar::f32_to_f16(x.to_bits()),
                    "f32->f16 n={n} so={so} do={doff}"
                );
            }
        }
    }
}

fn fingerprint_matches_cpu(dev: &Device) {
    let s = dev.stream().unwrap();
    let mut rng = Rng::new(3);
    let data = rng.bytes(300_000);
    let d = s.clone_htod(&data).unwrap();
    for start in 0..9 {
        for len in [
            0usize,
            1,
            2,
            3,
            4,
            5,
            15,
            16,
            17,
            1023,
            1024,
            1025,
            4096 * 3 + 7,
            299_000,
        ] {
            let v = d.slice(start..start + len).unwrap();
            assert_eq!(
                s.fingerprint(&v).unwrap(),
                fingerprint_bytes(&data[start..start + len]),
                "start {start} len {len}"
            );
        }
    }
    // Accumulating over two halves gives the whole (order-independent S).
    let mut acc = s.alloc_zeros::<u64>(1).unwrap();
    let v = d.view();
    s.fingerprint_sum_into(&v, &mut acc.view_mut()).unwrap();
    let whole = acc.to_vec().unwrap()[0];
    let cpu = convert::fingerprint::finish(whole, data.len() as u64);
    assert_eq!(cpu, fingerprint_bytes(&data));
}

fn fused_convert_fingerprint_matches_cpu(dev: &Device) {
    let s = dev.stream().unwrap();
    let mut rng = Rng::new(5);
    for n in [1usize, 7, 8, 9, 255, 256, 257, 4099, 1 << 20] {
        for so in [0usize, 1, 3] {
            let h = rng.u16s(n + so);
            let d = s.clone_htod(&as_bf16(&h)).unwrap();
            let mut out = s.alloc::<f32>(n).unwrap();
            let mut acc = s.alloc_zeros::<u64>(1).unwrap();
            s.convert_fingerprint_into(
                &d.slice(so..).unwrap(),
                &mut out.view_mut(),
                &mut acc.view_mut(),
            )
            .unwrap();
            let got = bits32(&out.to_vec().unwrap());
            let want: Vec<u32> = h[so..].iter().map(|&x| scalar::bf16_to_f32(x)).collect();
            assert_eq!(got, want, "n {n} so {so}");
            let fp = convert::fingerprint::finish(acc.to_vec().unwrap()[0], 4 * n as u64);
            assert_eq!(fp, convert::fingerprint_words(&want), "n {n} so {so}");
        }
    }
}

/// Convert, then overwrite one output element (between the kernel and the
/// check): the device fingerprint differs from the host's expectation.
fn corruption_after_kernel_is_detected(dev: &Device) {
    let s = dev.stream().unwrap();
    let mut rng = Rng::new(9);
    let h = as_bf16(&rng.u16s(123_457));
    let d = s.clone_htod(&h).unwrap();
    let mut out = s.alloc::<f32>(h.len()).unwrap();
    s.convert(&d.view(), &mut out.view_mut()).unwrap();
    let expected =
        verify::expected_fingerprint(DType::BF16, bytemuck::cast_slice(&h), DType::F32).unwrap();
    assert_eq!(s.fingerprint(&out.view()).unwrap(), expected);
    for idx in [0usize, 1, 4095, 123_456] {
        let mut one = out.slice_mut(idx..idx + 1).unwrap();
        let mut old = [0f32];
        one.as_view().copy_dtoh(&s, &mut old).unwrap();
        one.copy_htod(&s, &[f32::from_bits(old[0].to_bits() ^ 1)])
            .unwrap();
        assert_ne!(
            s.fingerprint(&out.view()).unwrap(),
            expected,
            "flip at {idx}"
        );
        let mut one = out.slice_mut(idx..idx + 1).unwrap();
        one.copy_htod(&s, &old).unwrap();
        assert_eq!(s.fingerprint(&out.view()).unwrap(), expected);
    }
    // Zeros landing instead of data are detected too.
    out.memset_zero().unwrap();
    assert_ne!(s.fingerprint(&out.view()).unwrap(), expected);
}

fn tampering(open: Open<'_>) -> (Device, Arc<AtomicU8>) {
    // Wrap a fresh backend (the tamper device gets its own self-test
    // cache).
    let mode = Arc::new(AtomicU8::new(mode::OFF));
    let t = Device::from_backend(Box::new(Tamper {
        inner: open(),
        mode: Arc::clone(&mode),
    }));
    (t, mode)
}

fn verified_policies_serve_device(dev: &Device) {
    let s = dev.stream().unwrap();
    let mut rng = Rng::new(13);
    let h = as_bf16(&rng.u16s(200_001));
    let hf = rng.f32_patterns(50_001);
    for policy in [
        Policy::Off,
        Policy::Fingerprint,
        Policy::FusedFingerprint,
        Policy::ReadBack,
    ] {
        let opts = VerifyOptions::default().with_policy(policy);
        let mut out = s.alloc::<f32>(h.len()).unwrap();
        let r = verify::upload_convert(&s, &h, &mut out.view_mut(), &opts).unwrap();
        assert!(matches!(r.outcome, Outcome::Served), "{policy:?}");
        assert_eq!(r.elements, h.len() as u64);
        let shown = r.to_string();
        assert!(
            shown.starts_with("convert bf16->f32 of 200001 elements on ")
                && shown.contains(&format!("({policy:?}): served by the device"))
                && shown.contains(" ms"),
            "{shown}"
        );
        assert_eq!(
            shown.contains("fingerprints "),
            policy != Policy::Off,
            "{shown}"
        );
        if policy != Policy::Off {
            assert!(
                r.expected.is_some() && r.expected == r.actual,
                "{policy:?}: {r:?}"
            );
        }
        let mut want = vec![0f32; h.len()];
        convert::convert_slice(&h, &mut want).unwrap();
        assert_eq!(bits32(&out.to_vec().unwrap()), bits32(&want));

        let mut ob = s.alloc::<bf16>(hf.len()).unwrap();
        let r = verify::upload_convert(&s, &hf, &mut ob.view_mut(), &opts).unwrap();
        assert!(matches!(r.outcome, Outcome::Served));
        let mut want = vec![bf16::ZERO; hf.len()];
        convert::convert_slice(&hf, &mut want).unwrap();
        let got: Vec<u16> = ob.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();
        let want: Vec<u16> = want.iter().map(|x| x.to_bits()).collect();
        assert!(got == want, "{policy:?}");
    }
    // Zero elements: nothing to do, still a report.
    let mut empty = s.alloc::<f32>(0).unwrap();
    let r = verify::upload_convert::<bf16, f32>(
        &s,
        &[],
        &mut empty.view_mut(),
        &VerifyOptions::default(),
    )
    .unwrap();
    assert!(matches!(r.outcome, Outcome::Served));
    assert_eq!(r.elements, 0);
}

fn verified_mismatch_falls_back_or_fails(open: Open<'_>) {
    let (t, m) = tampering(open);
    let s = t.stream().unwrap();
    verify::self_test(&s).unwrap(); // passes: nothing armed yet
    m.store(mode::CORRUPT_OUTPUT, Ordering::SeqCst);
    let mut rng = Rng::new(17);
    let h = as_bf16(&rng.u16s(10_007));
    let mut want = vec![0f32; h.len()];
    convert::convert_slice(&h, &mut want).unwrap();
    for policy in [Policy::Fingerprint, Policy::ReadBack] {
        let mut out = s.alloc::<f32>(h.len()).unwrap();
        let opts = VerifyOptions::default().with_policy(policy);
        let r = verify::upload_convert(&s, &h, &mut out.view_mut(), &opts).unwrap();
        match r.outcome {
            Outcome::Failed(Failure::FingerprintMismatch {
                expected, actual, ..
            }) => assert_ne!(expected, actual),
            other => panic!("{policy:?}: served {other:?}"),
        }
        assert!(
            r.to_string()
                .contains("served by the CPU after a mismatch (expected "),
            "{r}"
        );
        // The CPU result replaced the corrupted one.
        assert_eq!(bits32(&out.to_vec().unwrap()), bits32(&want), "{policy:?}");

        let opts = opts.with_cpu_fallback(false);
        let e = verify::upload_convert(&s, &h, &mut out.view_mut(), &opts).unwrap_err();
        assert!(
            matches!(e, Error::VerificationFailed { .. }),
            "{policy:?}: {e}"
        );
    }
    // Policy::Off does not look, and the fused fingerprint checks the values
    // the kernel computed, not memory written after it: the corruption goes
    // through (documented limits of those policies).
    for policy in [Policy::Off, Policy::FusedFingerprint] {
        let mut out = s.alloc::<f32>(h.len()).unwrap();
        let opts = VerifyOptions::default().with_policy(policy);
        let r = verify::upload_convert(&s, &h, &mut out.view_mut(), &opts).unwrap();
        assert!(matches!(r.outcome, Outcome::Served), "{policy:?}");
        assert_ne!(bits32(&out.to_vec().unwrap()), bits32(&want), "{policy:?}");
    }
}

/// The staged check's one rule: with a fingerprint kernel that failed its
/// self-test, a fingerprint policy is applied as a read-back (decided up
/// front), which serves a good output and catches a bad one.
fn untrusted_fingerprint_kernel_reads_back(open: Open<'_>) {
    let (t, m) = tampering(open);
    m.store(mode::WRONG_FINGERPRINT, Ordering::SeqCst); // before the self-test
    let s = t.stream().unwrap();
    let st = verify::self_test(&s).unwrap();
    assert!(!st.fingerprint_trusted());
    // Every conversion kernel was cleared by value.
    assert!(st
        .kernels
        .iter()
        .filter(|k| k.kernel.starts_with("convert"))
        .all(|k| k.mismatches == 0));
    let h = as_bf16(&[1, 2, 3, 0x7fc1]);
    for policy in [Policy::Fingerprint, Policy::FusedFingerprint] {
        let opts = VerifyOptions::default().with_policy(policy);
        let mut out = s.alloc::<f32>(4).unwrap();
        let r = verify::upload_convert(&s, &h, &mut out.view_mut(), &opts).unwrap();
        assert_eq!(r.policy, Policy::ReadBack, "{policy:?}");
        assert!(matches!(r.outcome, Outcome::Served), "{r}");
        assert!(
            r.to_string().contains("(ReadBack): served by the device"),
            "{r}"
        );
        m.store(
            mode::WRONG_FINGERPRINT | mode::CORRUPT_OUTPUT,
            Ordering::SeqCst,
        );
        let r = verify::upload_convert(&s, &h, &mut out.view_mut(), &opts).unwrap();
        assert!(
            matches!(
                r.outcome,
                Outcome::Failed(Failure::FingerprintMismatch { .. })
            ),
            "{r}"
        );
        assert_eq!(
            bits32(&out.to_vec().unwrap()),
            vec![1 << 16, 2 << 16, 3 << 16, 0x7fc1 << 16]
        );
        m.store(mode::WRONG_FINGERPRINT, Ordering::SeqCst);
    }
}

fn untrusted_kernel_goes_to_cpu(open: Open<'_>) {
    let (t, m) = tampering(open);
    m.store(mode::CORRUPT_OUTPUT, Ordering::SeqCst); // armed before the self-test
    let s = t.stream().unwrap();
    let st = verify::self_test(&s).unwrap();
    assert!(!st.all_passed());
    let op = rocm_safe::device::ConvertOp {
        from: DType::BF16,
        to: DType::F32,
    };
    assert!(!st.trusted(op));
    let k = st
        .kernels
        .iter()
        .find(|k| k.kernel == "convert bf16->f32")
        .unwrap();
    assert_eq!(k.mismatches, 1);
    assert_eq!(k.first_mismatch.map(|m| m.0), Some(1));
    let h = as_bf16(&[1, 2, 3, 0x7fc1]);
    let mut out = s.alloc::<f32>(4).unwrap();
    let r = verify::upload_convert(&s, &h, &mut out.view_mut(), &VerifyOptions::default()).unwrap();
    assert!(matches!(
        r.outcome,
        Outcome::Failed(Failure::NoTrustedKernel { .. })
    ));
    assert_eq!(
        bits32(&out.to_vec().unwrap()),
        vec![1 << 16, 2 << 16, 3 << 16, 0x7fc1 << 16]
    );
    let opts = VerifyOptions::default().with_cpu_fallback(false);
    let e = verify::upload_convert(&s, &h, &mut out.view_mut(), &opts).unwrap_err();
    assert!(
        matches!(e, Error::KernelUntrusted { mismatches: 1, .. }),
        "{e}"
    );
}

fn self_test_passes(dev: &Device) {
    let s = dev.stream().unwrap();
    let r = verify::self_test(&s).unwrap();
    assert!(r.all_passed(), "{r:#?}");
    let names: Vec<&str> = r.kernels.iter().map(|k| k.kernel.as_str()).collect();
    // One test per kernel of every device row of the conversion table,
    // then the fingerprint kernel.
    assert_eq!(
        names,
        [
            "convert bf16->f32",
            "fused bf16->f32",
            "convert f16->f32",
            "fused f16->f32",
            "convert f32->bf16",
            "convert f32->f16",
            "convert f8_e4m3->f32",
            "convert f8_e5m2->f32",
            "fingerprint",
        ]
    );
    let tested = |name: &str| r.kernels.iter().find(|k| k.kernel == name).unwrap().tested;
    assert_eq!(tested("convert bf16->f32"), 65_536);
    assert_eq!(tested("convert f32->f16"), 65_536 * 12);
    assert_eq!(tested("convert f8_e4m3->f32"), 256);
    assert_eq!(tested("convert f8_e5m2->f32"), 256);
    // Cached: the second call returns the same report.
    let again = verify::self_test(&s).unwrap();
    assert!(Arc::ptr_eq(&r, &again));
}

fn copies_and_length_errors(dev: &Device) {
    let s = dev.stream().unwrap();
    let mut b = s.alloc::<u32>(10).unwrap();
    let e = b.copy_htod(&[1, 2, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "copy_htod",
                expected: 10,
                actual: 3,
                tensor: None,
            }
        ),
        "{e}"
    );
    let mut out = [0u32; 9];
    let e = b.copy_dtoh(&mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "copy_dtoh",
                ..
            }
        ),
        "{e}"
    );
    let c = s.clone_htod(&[7u32; 4]).unwrap();
    let e = b.copy_dtod(&c.view()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "copy_dtod",
                ..
            }
        ),
        "{e}"
    );
    let e = b.slice(3..11).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfBounds {
                start: 3,
                end: 11,
                len: 10,
                ..
            }
        ),
        "{e}"
    );
    // dtod into a slice, and a round trip.
    b.copy_htod(&(0..10).collect::<Vec<u32>>()).unwrap();
    let mut part = b.slice_mut(2..6).unwrap();
    part.copy_dtod(&s, &c.view()).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![0, 1, 7, 7, 7, 7, 6, 7, 8, 9]);
    // Conversion errors: unsupported pair and length mismatch.
    let f = s.alloc::<f32>(4).unwrap();
    let mut g = s.alloc::<f32>(4).unwrap();
    let e = s.convert(&f.view(), &mut g.view_mut()).unwrap_err();
    assert!(matches!(e, Error::UnsupportedConversion { .. }), "{e}");
    let h = s.alloc::<bf16>(5).unwrap();
    let e = s.convert(&h.view(), &mut g.view_mut()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "convert",
                expected: 5,
                actual: 4,
                tensor: None,
            }
        ),
        "{e}"
    );
    // Buffers of another device are refused.
    let other = Device::host();
    let os = other.stream().unwrap();
    let e = os.convert(&h.view(), &mut g.view_mut()).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    // Zero-length work never reaches the backend and succeeds.
    let mut z = s.alloc::<f32>(0).unwrap();
    z.copy_htod(&[]).unwrap();
    z.memset_zero().unwrap();
    let zb = s.alloc::<bf16>(0).unwrap();
    s.convert(&zb.view(), &mut z.view_mut()).unwrap();
    assert_eq!(s.fingerprint(&z.view()).unwrap(), fingerprint_bytes(&[]));
    // Splitting past the end.
    let mut sp = s.alloc::<u32>(4).unwrap();
    let e = sp.view_mut().split_at_mut(5).unwrap_err();
    assert!(
        matches!(
            e,
            Error::OutOfBounds {
                op: "split_at_mut",
                ..
            }
        ),
        "{e}"
    );
    let (a, b) = sp.view_mut().split_at_mut(1).unwrap();
    assert_eq!((a.len(), b.len()), (1, 3));
    // Misaligned cast.
    let bytes = s.alloc::<u8>(9).unwrap();
    let e = bytes.slice(1..9).unwrap().cast::<u32>().unwrap_err();
    assert!(matches!(e, Error::Misaligned { .. }), "{e}");
    let e = bytes.slice(0..7).unwrap().cast::<u32>().unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    assert!(dev.take_errors().is_empty());
}

fn pinned_async_round_trip(dev: &Device) {
    let copy = dev.stream().unwrap();
    let compute = dev.stream().unwrap();
    let mut rng = Rng::new(21);
    let n = 1 << 20;
    let h = as_bf16(&rng.u16s(n));
    let mut pin = dev.alloc_pinned::<bf16>(n).unwrap();
    pin.as_mut_slice().unwrap().copy_from_slice(&h);
    let mut d = copy.alloc::<bf16>(n).unwrap();
    d.view_mut().copy_htod_async(&copy, &mut pin).unwrap();
    let ev = dev.event().unwrap();
    copy.record(&ev).unwrap();
    compute.wait(&ev).unwrap();
    let mut out = compute.alloc::<f32>(n).unwrap();
    compute.convert(&d.view(), &mut out.view_mut()).unwrap();
    let mut back = dev.alloc_pinned::<f32>(n).unwrap();
    out.view_mut().copy_dtoh_async(&compute, &mut back).unwrap();
    let got = bits32(back.as_slice().unwrap());
    let want: Vec<u32> = h.iter().map(|x| scalar::bf16_to_f32(x.to_bits())).collect();
    assert_eq!(got, want);
    // Event timing works on recorded events: an event recorded after more
    // work is not earlier, and the work took some time. It fails on
    // unrecorded events and on events of another device.
    let e0 = dev.event().unwrap();
    let e1 = dev.event().unwrap();
    let e2 = dev.event().unwrap();
    compute.record(&e0).unwrap();
    compute.record(&e1).unwrap();
    for _ in 0..4 {
        compute.convert(&d.view(), &mut out.view_mut()).unwrap();
    }
    compute.record(&e2).unwrap();
    compute.synchronize().unwrap();
    let (t01, t02) = (e0.elapsed_ms(&e1).unwrap(), e0.elapsed_ms(&e2).unwrap());
    assert!(t01.is_finite() && t02.is_finite(), "{t01} {t02}");
    assert!(t02 >= t01 && t02 > 0.0, "{t01} ms, then {t02} ms");
    let never = dev.event().unwrap();
    assert!(never.elapsed_ms(&e1).is_err());
    let elsewhere = Device::host().event().unwrap();
    assert!(matches!(
        e0.elapsed_ms(&elsewhere),
        Err(Error::DeviceMismatch { .. })
    ));
    let e = d
        .view_mut()
        .copy_htod_async(&copy, &mut dev.alloc_pinned::<bf16>(3).unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
}

fn nonfinite_counts_and_clamps(dev: &Device) {
    let s = dev.stream().unwrap();
    let xs = [
        1.0f32,
        f32::NAN,
        f32::INFINITY,
        -f32::INFINITY,
        -2.5,
        f32::from_bits(0xff80_0001),
        0.0,
    ];
    let mut d = s.clone_htod(&xs).unwrap();
    let c = s.count_nonfinite(&d.view()).unwrap();
    assert_eq!(c, NonFinite { nan: 2, inf: 2 });
    // Counting changes nothing.
    assert_eq!(bits32(&d.to_vec().unwrap()), bits32(&xs));
    let c = s.clamp_nonfinite(&mut d.view_mut()).unwrap();
    assert_eq!(c, NonFinite { nan: 2, inf: 2 });
    let got = d.to_vec().unwrap();
    assert_eq!(
        bits32(&got),
        bits32(&[1.0, 0.0, f32::MAX, -f32::MAX, -2.5, 0.0, 0.0])
    );
    assert_eq!(s.count_nonfinite(&d.view()).unwrap(), NonFinite::default());

    let hb = as_bf16(&[0x7f80, 0xff80, 0x7fc0, 0x3f80, 0xffff]);
    let mut db = s.clone_htod(&hb).unwrap();
    assert_eq!(
        s.clamp_nonfinite(&mut db.view_mut()).unwrap(),
        NonFinite { nan: 2, inf: 2 }
    );
    let got: Vec<u16> = db.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, [0x7f7f, 0xff7f, 0, 0x3f80, 0]);

    let hh = as_f16(&[0x7c00, 0xfc00, 0x7e00, 0x3c00, 0x7c01]);
    let mut dh = s.clone_htod(&hh).unwrap();
    assert_eq!(
        s.clamp_nonfinite(&mut dh.view_mut()).unwrap(),
        NonFinite { nan: 2, inf: 2 }
    );
    let got: Vec<u16> = dh.to_vec().unwrap().iter().map(|x| x.to_bits()).collect();
    assert_eq!(got, [0x7bff, 0xfbff, 0, 0x3c00, 0]);

    let dd = s.clone_htod(&[1.0f64]).unwrap();
    assert!(matches!(
        s.count_nonfinite(&dd.view()),
        Err(Error::UnsupportedConversion { .. })
    ));
}

/// The count-only scan reads 16-byte vectors where the buffer is aligned
/// and single elements elsewhere: a NaN or infinity at every position of a
/// vector and of the tail, in views that start aligned and not, is counted
/// once, for each dtype.
fn nonfinite_counts_at_every_position_and_offset(dev: &Device) {
    let s = dev.stream().unwrap();
    let n = 37;
    for at in 0..n {
        let mut xs = vec![1.5f32; n];
        xs[at] = if at % 2 == 0 {
            f32::NAN
        } else {
            -f32::INFINITY
        };
        let hb: Vec<bf16> = xs.iter().map(|&x| bf16::from_f32(x)).collect();
        let hh: Vec<f16> = xs.iter().map(|&x| f16::from_f32(x)).collect();
        let (d, db, dh) = (
            s.clone_htod(&xs).unwrap(),
            s.clone_htod(&hb).unwrap(),
            s.clone_htod(&hh).unwrap(),
        );
        for from in [0, 1, 3] {
            let want = if at < from {
                NonFinite::default()
            } else if at % 2 == 0 {
                NonFinite { nan: 1, inf: 0 }
            } else {
                NonFinite { nan: 0, inf: 1 }
            };
            let got = [
                s.count_nonfinite(&d.slice(from..).unwrap()).unwrap(),
                s.count_nonfinite(&db.slice(from..).unwrap()).unwrap(),
                s.count_nonfinite(&dh.slice(from..).unwrap()).unwrap(),
            ];
            assert_eq!(got, [want; 3], "value at {at}, view from {from}");
        }
    }
}

/// The host half of a verification must equal the fingerprint of the
/// element-by-element reference output (independent of the fused fast path).
#[test]
fn expected_fingerprint_equals_reference() {
    let mut rng = Rng::new(99);
    for (from, to, n) in [
        (DType::BF16, DType::F32, 5000usize),
        (DType::F16, DType::F32, 777),
        (DType::F32, DType::BF16, 1025),
        (DType::F32, DType::F16, 513),
        (DType::F64, DType::F16, 301),
        (DType::BF16, DType::F16, 3),
        (DType::F32, DType::F32, 0),
    ] {
        let src = rng.bytes(n * from.size().unwrap());
        let mut out = vec![0u8; n * to.size().unwrap()];
        convert::scalar::convert_bytes_reference(from, &src, to, &mut out).unwrap();
        assert_eq!(
            verify::expected_fingerprint(from, &src, to).unwrap(),
            convert::fingerprint_bytes(&out),
            "{from}->{to} n={n}"
        );
    }
    assert!(verify::expected_fingerprint(DType::I32, &[0; 4], DType::F32).is_err());
    assert!(matches!(
        verify::expected_fingerprint(DType::F32, &[0; 5], DType::BF16),
        Err(Error::LengthMismatch { .. })
    ));
}

#[test]
fn backends_not_built_or_absent_are_typed_errors() {
    use rocm_safe::device::BackendKind;
    for kind in [BackendKind::Hip, BackendKind::Cuda] {
        if !kind.is_built() {
            let e = Device::open(kind, 0).unwrap_err();
            assert!(matches!(e, Error::BackendNotBuilt { .. }), "{e}");
            let e = Device::list(kind).unwrap_err();
            assert!(matches!(e, Error::BackendNotBuilt { .. }), "{e}");
        }
    }
    let e = Device::open(BackendKind::Host, 1).unwrap_err();
    assert!(
        matches!(
            e,
            Error::NoDevice {
                ordinal: Some(1),
                count: 1,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(Device::list(BackendKind::Host).unwrap().len(), 1);
}
