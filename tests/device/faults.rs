//! The fault-injection backend over every backend, and what the verified
//! conversion API makes of each fault.

use crate::common;
use crate::common::faults::faulty;

use half::bf16;
use rocm_safe::convert;
use rocm_safe::device::faults::{FaultHandle, FaultKind, FaultPlan, FaultRule, When};
use rocm_safe::device::Device;
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::verify::{self, Policy, VerifyOptions};
use rocm_safe::Error;

use common::{Open, Rng};

per_device!(
    copy_lands_zeros_is_caught_and_fallback_upload_checked,
    copy_lands_stale_keeps_old_data,
    invalid_value_on_copy_is_an_error,
    out_of_memory_on_alloc,
    convert_writes_zeros_is_caught_by_both_fingerprints,
    launch_failure_is_an_error,
    random_faults_are_reproducible,
    teardown_errors_are_recorded_not_panicked,
);
fn data(n: usize) -> Vec<bf16> {
    Rng::new(42)
        .u16s(n)
        .into_iter()
        .map(bf16::from_bits)
        .collect()
}

fn reference(h: &[bf16]) -> Vec<u32> {
    let mut want = vec![0f32; h.len()];
    convert::convert_slice(h, &mut want).unwrap();
    want.iter().map(|x| x.to_bits()).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Self-test with injection off, so the plan hits only what follows.
fn trusted(d: &Device, h: &FaultHandle) {
    h.set_enabled(false);
    let s = d.stream().unwrap();
    assert!(verify::self_test(&s).unwrap().all_passed());
    h.set_enabled(true);
}

fn copy_lands_zeros_is_caught_and_fallback_upload_checked(open: Open<'_>) {
    // Only the first upload after the self-test lands zeros: the check sees
    // it and the CPU fallback (whose own upload is checked) serves.
    let (d, h) = faulty(
        open,
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Nth(0)),
    );
    trusted(&d, &h);
    let s = d.stream().unwrap();
    let src = data(4099);
    let mut out = s.alloc::<f32>(src.len()).unwrap();
    let r =
        verify::upload_convert(&s, &src, &mut out.view_mut(), &VerifyOptions::default()).unwrap();
    assert!(
        matches!(
            r.outcome,
            Outcome::Failed(Failure::FingerprintMismatch { .. })
        ),
        "{r:?}"
    );
    assert_eq!(bits(&out.to_vec().unwrap()), reference(&src));
    assert_eq!(h.injected().len(), 1);
    assert_eq!(h.injected()[0].op, "copy_htod");

    // Every upload lands zeros: the fallback's upload fails its check too,
    // and the call fails instead of returning zeros.
    let (d, h) = faulty(
        open,
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Always),
    );
    trusted(&d, &h);
    let s = d.stream().unwrap();
    let mut out = s.alloc::<f32>(src.len()).unwrap();
    let e = verify::upload_convert(&s, &src, &mut out.view_mut(), &VerifyOptions::default())
        .unwrap_err();
    assert!(matches!(e, Error::VerificationFailed { .. }), "{e}");
    assert!(h.injected().len() >= 2);
}

fn copy_lands_stale_keeps_old_data(open: Open<'_>) {
    let (d, h) = faulty(
        open,
        FaultPlan::one(FaultKind::CopyLandsStale, When::Nth(1)),
    );
    let s = d.stream().unwrap();
    let mut b = s.alloc::<u32>(5).unwrap();
    b.copy_htod(&[1, 2, 3, 4, 5]).unwrap();
    b.copy_htod(&[9, 9, 9, 9, 9]).unwrap(); // lost
    assert_eq!(b.to_vec().unwrap(), [1, 2, 3, 4, 5]);
    b.copy_htod(&[7, 7, 7, 7, 7]).unwrap();
    assert_eq!(b.to_vec().unwrap(), [7; 5]);
    let log = h.injected();
    assert_eq!(log.len(), 1);
    assert_eq!((log[0].kind, log[0].index), (FaultKind::CopyLandsStale, 1));
}

fn invalid_value_on_copy_is_an_error(open: Open<'_>) {
    let (d, _h) = faulty(
        open,
        FaultPlan::one(FaultKind::InvalidValueOnCopy, When::Always),
    );
    let s = d.stream().unwrap();
    let mut b = s.alloc::<u32>(3).unwrap();
    let e = b.copy_htod(&[1, 2, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InjectedFault {
                fault: FaultKind::InvalidValueOnCopy,
                op: "copy_htod"
            }
        ),
        "{e}"
    );
    // Zero-length copies never reach the backend, so nothing is injected.
    let mut z = s.alloc::<u32>(0).unwrap();
    z.copy_htod(&[]).unwrap();
}

fn out_of_memory_on_alloc(open: Open<'_>) {
    let (d, h) = faulty(
        open,
        FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Nth(0)),
    );
    let s = d.stream().unwrap();
    let e = s.alloc::<f32>(1 << 20).unwrap_err();
    assert!(
        matches!(e, Error::OutOfMemory { bytes: 4194304, .. }),
        "{e}"
    );
    // Retry succeeds (the next allocation is not hit).
    let b = s.alloc::<f32>(1 << 20).unwrap();
    assert_eq!(b.len(), 1 << 20);
    assert_eq!(h.injected().len(), 1);
}

fn convert_writes_zeros_is_caught_by_both_fingerprints(open: Open<'_>) {
    let src = data(10_001);
    for policy in [
        Policy::Fingerprint,
        Policy::FusedFingerprint,
        Policy::ReadBack,
    ] {
        let (d, h) = faulty(
            open,
            FaultPlan::one(FaultKind::ConvertWritesZeros, When::Always),
        );
        trusted(&d, &h);
        let s = d.stream().unwrap();
        let mut out = s.alloc::<f32>(src.len()).unwrap();
        let opts = VerifyOptions::default().with_policy(policy);
        let r = verify::upload_convert(&s, &src, &mut out.view_mut(), &opts).unwrap();
        assert!(
            matches!(
                r.outcome,
                Outcome::Failed(Failure::FingerprintMismatch { .. })
            ),
            "{policy:?}: {r:?}"
        );
        assert_eq!(bits(&out.to_vec().unwrap()), reference(&src), "{policy:?}");
        assert_eq!(h.injected().len(), 1, "{policy:?}");
    }
    // The self-test marks a kernel that writes zeros untrusted.
    let (d, _h) = faulty(
        open,
        FaultPlan::one(FaultKind::ConvertWritesZeros, When::Always),
    );
    let s = d.stream().unwrap();
    let st = verify::self_test(&s).unwrap();
    assert!(st
        .kernels
        .iter()
        .filter(|k| k.kernel.starts_with("convert"))
        .all(|k| k.mismatches > 0));
    assert!(st.fingerprint_trusted());
    let mut out = s.alloc::<f32>(src.len()).unwrap();
    let r =
        verify::upload_convert(&s, &src, &mut out.view_mut(), &VerifyOptions::default()).unwrap();
    assert!(matches!(
        r.outcome,
        Outcome::Failed(Failure::NoTrustedKernel { .. })
    ));
    assert_eq!(bits(&out.to_vec().unwrap()), reference(&src));
}

fn launch_failure_is_an_error(open: Open<'_>) {
    let (d, _h) = faulty(open, FaultPlan::one(FaultKind::LaunchFailure, When::Always));
    let s = d.stream().unwrap();
    let src = s.clone_htod(&data(100)).unwrap();
    let mut out = s.alloc::<f32>(100).unwrap();
    let e = s.convert(&src.view(), &mut out.view_mut()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InjectedFault {
                fault: FaultKind::LaunchFailure,
                op: "convert"
            }
        ),
        "{e}"
    );
    let e = s.fingerprint(&out.view()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InjectedFault {
                op: "fingerprint_sum",
                ..
            }
        ),
        "{e}"
    );
    let e = verify::self_test(&s).unwrap_err();
    assert!(matches!(e, Error::InjectedFault { .. }), "{e}");
}

fn random_faults_are_reproducible(open: Open<'_>) {
    let run = |seed: u64| {
        let plan = FaultPlan {
            seed,
            rules: vec![FaultRule {
                kind: FaultKind::CopyLandsStale,
                when: When::Random {
                    per_million: 500_000,
                },
            }],
        };
        let (d, h) = faulty(open, plan);
        let s = d.stream().unwrap();
        let mut b = s.alloc::<u32>(1).unwrap();
        for i in 0..200u32 {
            b.copy_htod(&[i]).unwrap();
        }
        h.injected()
            .into_iter()
            .map(|f| f.index)
            .collect::<Vec<_>>()
    };
    let a = run(1);
    assert_eq!(a, run(1));
    assert_ne!(a, run(2));
    assert!((50..150).contains(&a.len()), "{}", a.len());
    // Every-nth and disabled.
    let (d, h) = faulty(
        open,
        FaultPlan::one(FaultKind::CopyLandsStale, When::EveryNth(3)),
    );
    let s = d.stream().unwrap();
    let mut b = s.alloc::<u32>(1).unwrap();
    for i in 0..9u32 {
        b.copy_htod(&[i]).unwrap();
    }
    let idx: Vec<u64> = h.injected().iter().map(|f| f.index).collect();
    assert_eq!(idx, [2, 5, 8]);
    h.set_enabled(false);
    b.copy_htod(&[100]).unwrap();
    assert_eq!(b.to_vec().unwrap(), [100]);
    assert_eq!(h.injected().len(), 3);
}

/// Errors in `Drop` (buffer, pinned buffer, stream, event) are recorded on
/// the device and read with `take_errors`; nothing panics or prints.
fn teardown_errors_are_recorded_not_panicked(open: Open<'_>) {
    let (d, h) = faulty(
        open,
        FaultPlan::one(FaultKind::TeardownFailure, When::Always),
    );
    h.set_enabled(false);
    let s = d.stream().unwrap();
    let b = s.alloc::<u32>(16).unwrap();
    let p = d.alloc_pinned::<u32>(16).unwrap();
    let e = d.event().unwrap();
    let s2 = d.stream().unwrap();
    h.set_enabled(true);
    drop(b);
    drop(p);
    drop(e);
    drop(s2);
    let errs = d.take_errors();
    let ops: Vec<&str> = errs
        .iter()
        .map(|e| match e {
            Error::InjectedFault {
                fault: FaultKind::TeardownFailure,
                op,
            } => *op,
            other => panic!("unexpected {other}"),
        })
        .collect();
    // The buffer's free waits for the next sync point (`take_errors` is
    // one): it comes last.
    assert_eq!(
        ops,
        ["free_pinned", "event_destroy", "stream_destroy", "free"]
    );
    assert!(d.take_errors().is_empty(), "take_errors clears");
    h.set_enabled(false);
}
