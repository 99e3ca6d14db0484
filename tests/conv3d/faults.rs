//! Issue 5: "a forced failure of each tier (Faults) falls through to the
//! next". The real GPU tiers of a device wrapped in `Faults`: a failed
//! launch, zeros, garbage or a NaN written by the tiled kernel move the
//! call to the naive kernel; both failing moves it to the CPU; a vendor
//! library that is not there is skipped, not failed. Each test runs on the
//! host backend here and, with `--ignored`, on a CUDA or HIP device.

use crate::common;
use crate::common::faults::faulty;

use common::conv3d::{assert_close, cases, Case, Data};
use common::Open;
use rocm_safe::conv3d_chain::{Conv3dChain, Conv3dOptions, TierKind};
use rocm_safe::device::faults::{FaultKind, When};
use rocm_safe::device::{raw::Backend, Device};
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::Error;
/// A case the tiled kernel takes (16 output channels).
fn tiled_case() -> (Case, Data) {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "tiled: stride 2, dilation, 16 out")
        .unwrap();
    let data = Data::new(&case);
    (case, data)
}

/// The chain of `dev` with the vendor tier forbidden, so that the tiled
/// kernel is the first conv3d call on every backend.
fn chain(dev: &Device) -> Conv3dChain {
    let mut c = Conv3dChain::for_device(dev);
    c.options_mut().forbid = vec![TierKind::Vendor];
    c
}

/// Runs one call per dtype; the tiled tier fails with `check`, the naive
/// tier serves, and the statistics count it.
fn tiled_fails_naive_serves(open: Open<'_>, kind: FaultKind, check: fn(&Failure) -> bool) {
    let (case, data) = tiled_case();
    for bf16 in [false, true] {
        let (dev, h) = faulty(open, &[(kind, When::Nth(0))]);
        let chain = chain(&dev);
        let p = data.problem(&case, bf16);
        let (out, report) = chain.run(&p).unwrap();
        assert_close("naive after a tiled fault", &p, &out, 1e-5);
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
        let failures: Vec<_> = report.failures().collect();
        assert_eq!(failures.len(), 1, "{report}");
        assert_eq!(failures[0].0.kind, TierKind::Tiled);
        assert!(check(failures[0].1), "{kind}: {report}");
        let injected = h.injected();
        assert_eq!(injected.len(), 1);
        assert_eq!((injected[0].kind, injected[0].op), (kind, "conv3d"));
        let stats = chain.stats();
        assert_eq!((stats[1].attempts, stats[1].successes), (1, 0));
        assert_eq!((stats[2].attempts, stats[2].successes), (1, 1));
        assert_eq!(stats[3].attempts, 0, "the cpu tier was not needed");
    }
}

fn launch_failure_of_tiled_falls_to_naive(open: Open<'_>) {
    tiled_fails_naive_serves(open, FaultKind::Conv3dLaunchFailure, |f| {
        matches!(
            f,
            Failure::Error(Error::InjectedFault {
                fault: FaultKind::Conv3dLaunchFailure,
                op: "conv3d"
            })
        )
    });
}

fn zeros_from_tiled_are_caught(open: Open<'_>) {
    tiled_fails_naive_serves(
        open,
        FaultKind::Conv3dWritesZeros,
        |f| matches!(f, Failure::ValueMismatch { got, .. } if *got == 0.0),
    );
}

fn garbage_from_tiled_is_caught(open: Open<'_>) {
    tiled_fails_naive_serves(
        open,
        FaultKind::Conv3dWritesGarbage,
        |f| matches!(f, Failure::ValueMismatch { got, .. } if got.is_finite()),
    );
}

fn nan_from_tiled_is_caught(open: Open<'_>) {
    tiled_fails_naive_serves(
        open,
        FaultKind::Conv3dWritesNonFinite,
        |f| matches!(f, Failure::NonFinite { value, .. } if value.is_nan()),
    );
}

fn both_kernels_failing_fall_to_the_cpu(open: Open<'_>) {
    let (case, data) = tiled_case();
    let (dev, h) = faulty(open, &[(FaultKind::Conv3dLaunchFailure, When::Always)]);
    let chain = chain(&dev);
    let p = data.problem(&case, false);
    let (out, report) = chain.run(&p).unwrap();
    assert_close("cpu after both kernels failed", &p, &out, 1e-5);
    assert_eq!(report.served_by(), Some(TierKind::Cpu), "{report}");
    let failed: Vec<TierKind> = report.failures().map(|(a, _)| a.kind).collect();
    assert_eq!(failed, [TierKind::Tiled, TierKind::Naive], "{report}");
    assert_eq!(h.injected().len(), 2);
    let stats = chain.stats();
    assert_eq!((stats[1].errors, stats[2].errors), (1, 1));
    assert_eq!(stats[3].successes, 1);
    // Forcing the naive tier fails fast instead.
    let mut forced = Conv3dChain::for_device(&dev);
    forced.options_mut().force = Some(TierKind::Naive);
    let e = forced.run(&p).unwrap_err();
    assert!(
        e.to_string()
            .contains("naive: failed (error: conv3d: injected fault: conv3d launch failure)"),
        "{e}"
    );
}

/// Garbage is reproducible by seed: with the checks off the corrupt tiled
/// output is served, the same for the same seed, different for another.
fn garbage_is_deterministic_by_seed(open: Open<'_>) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let run = |seed| {
        let (dev, _) = faulty(
            open,
            (seed, &[(FaultKind::Conv3dWritesGarbage, When::Always)]),
        );
        let mut c = chain(&dev);
        c.options_mut().verify_samples = 0;
        let (out, report) = c.run(&p).unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Tiled));
        out
    };
    let (a, b, c) = (run(1), run(1), run(2));
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(a.iter().all(|v| v.is_finite() && v.abs() <= 1e4));
}

/// The vendor tier: skipped (not failed) where the library is absent (the
/// host backend has none); where it is present, an injected "no suitable
/// algorithm" falls through to the tiled kernel.
fn vendor_is_skipped_or_falls_through(open: Open<'_>) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let (dev, h) = faulty(open, &[(FaultKind::VendorNoAlgorithm, When::Always)]);
    let chain = Conv3dChain::for_device(&dev);
    let (out, report) = chain.run(&p).unwrap();
    assert_close("after the vendor tier", &p, &out, 1e-5);
    assert_eq!(report.served_by(), Some(TierKind::Tiled), "{report}");
    let stats = chain.stats();
    match dev.backend().conv3d_vendor_available() {
        Err(e) => {
            assert!(matches!(e, Error::VendorUnavailable { .. }), "{e}");
            assert!(
                matches!(&report.attempts[0].outcome, Outcome::Skipped(w) if w.starts_with("unavailable: ") && w.contains("vendor library")),
                "{report}"
            );
            assert_eq!(report.failures().count(), 0);
            assert_eq!((stats[0].skips, stats[0].attempts), (1, 0));
            assert!(h.injected().is_empty());
        }
        Ok(()) => {
            assert!(
                matches!(
                    report.failures().next(),
                    Some((a, Failure::Error(Error::InjectedFault { fault: FaultKind::VendorNoAlgorithm, .. }))) if a.kind == TierKind::Vendor
                ),
                "{report}"
            );
            assert_eq!((stats[0].errors, stats[0].attempts), (1, 1));
        }
    }
}

/// Every check is needed: with the sampled check and the scan off, the
/// zeros of the tiled kernel would be served.
fn checks_are_what_catch_corruption(open: Open<'_>) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let (dev, _) = faulty(open, &[(FaultKind::Conv3dWritesZeros, When::Always)]);
    let options = Conv3dOptions::default()
        .with_verify_samples(0)
        .with_scan_non_finite(false)
        .with_forbid(TierKind::Vendor);
    let c = Conv3dChain::with_tiers(rocm_safe::conv3d_chain::device_tiers(&dev), options);
    let (out, report) = c.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Tiled));
    assert!(out.iter().all(|&v| v == 0.0));
}

per_device!(
    launch_failure_of_tiled_falls_to_naive,
    zeros_from_tiled_are_caught,
    garbage_from_tiled_is_caught,
    nan_from_tiled_is_caught,
    both_kernels_failing_fall_to_the_cpu,
    garbage_is_deterministic_by_seed,
    vendor_is_skipped_or_falls_through,
    checks_are_what_catch_corruption,
);

/// The vendor faults reach the vendor call itself (on the host backend,
/// where no chain would call it): "no suitable algorithm" first, then the
/// backend's own "unavailable".
#[test]
fn vendor_no_algorithm_is_injected_into_the_vendor_call() {
    let (case, data) = tiled_case();
    let g = data.problem(&case, false).geometry;
    let open = || -> Box<dyn Backend> { Box::new(rocm_safe::device::host::HostBackend::new()) };
    let (dev, h) = faulty(&open, &[(FaultKind::VendorNoAlgorithm, When::Nth(0))]);
    let s = dev.stream().unwrap();
    let x = s.clone_htod(&data.x).unwrap();
    let w = s.clone_htod(&data.w).unwrap();
    let mut y = s.alloc_zeros::<f32>(g.output_len()).unwrap();
    let e = s
        .conv3d_ops()
        .vendor(&g, &x.view(), &w.view(), None, &mut y.view_mut())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InjectedFault {
                fault: FaultKind::VendorNoAlgorithm,
                op: "conv3d_vendor"
            }
        ),
        "{e}"
    );
    let e = s
        .conv3d_ops()
        .vendor(&g, &x.view(), &w.view(), None, &mut y.view_mut())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::VendorUnavailable {
                backend: "host",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(h.injected().len(), 1);
}
