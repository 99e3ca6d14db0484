//! The vendor tier's backward ops: the data and weight gradients through
//! cuDNN (`cudnnConvolutionBackwardData/Filter`) or MIOpen
//! (`miopenConvolutionBackwardData/Weights`), f32 and bf16 operands (bf16
//! widened to f32 on the device, f32 results), on the host path
//! (`run_backward`) and on device memory (`backward_device`), against the
//! f64 references; the bias gradient left to the naive tier; and every
//! failure of the vendor call (launch failure, no algorithm, garbage, NaN,
//! a check that cannot run) falling to the naive tier. `conv_transpose3d`
//! through the vendor tier: `tests/conv3d/transpose.rs`.
//!
//! On the host backend (CI) the vendor tier is unavailable for the backward
//! ops (no library), which one test checks; the others run there over the
//! stand-in library of `common/vendor_standin.rs` (the host backend's
//! backward kernels behind the vendor call), and with `--include-ignored`
//! on a CUDA or HIP device over the real library, which they require.

use crate::common;
use common::conv3d::{cases, Case};
use common::conv3d_backward::{assert_backward_close, run_on_device, Grads};
use common::vendor_standin::{vendor_served, with_vendor_backward, STANDIN};
use common::Open;
use rocm_safe::conv3d::{Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dData};
use rocm_safe::conv3d_chain::{Conv3dChain, TierKind};
use rocm_safe::device::faults::{FaultHandle, FaultKind, FaultPlan, FaultRule, Faults, When};
use rocm_safe::device::{raw::Backend, BackendKind, Device};
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::Error;

/// The ops the vendor tier takes.
const OPS: [Conv3dBackwardOp; 2] = [Conv3dBackwardOp::Data, Conv3dBackwardOp::Weight];

/// The libraries' algorithms (implicit GEMM, FFT, Winograd) sum in other
/// orders than a direct loop: the chain's own f32 tolerance.
const TOL: f64 = 1e-4;

/// The vendor backend of `open` (the real library on a GPU, which it
/// requires there; the stand-in on the host), as a device, with the name
/// its vendor tier reports.
fn vendor_device(open: Open<'_>, plan: Option<FaultPlan>) -> (Device, String, Option<FaultHandle>) {
    let (b, name) = with_vendor_backward(open);
    assert_eq!(b.info().kind == BackendKind::Host, name == STANDIN);
    match plan {
        Some(plan) => {
            let (f, h) = Faults::new(b, plan);
            (Device::from_backend(Box::new(f)), name, Some(h))
        }
        None => (Device::from_backend(b), name, None),
    }
}

/// Whether the vendor tier takes `op` on `p`'s geometry.
fn vendor_takes(op: Conv3dBackwardOp, p: &Conv3dBackwardProblem<'_>) -> bool {
    op.unsupported(&p.geometry).is_none()
}

/// Data and Weight over the case table (stride 1 and 2, padding, dilation,
/// groups, depthwise), f32 and bf16, host and device entry points: served
/// by the vendor tier (the CPU for zero-size calls; the naive tier where
/// the library refuses a call, printed, never for a wrong result), equal
/// to the f64 reference; a Data op with a bias too (host path: the bias
/// epilogue).
fn vendor_serves_data_and_weight(open: Open<'_>) {
    let (dev, name, _) = vendor_device(open, None);
    let chain = Conv3dChain::for_device(&dev);
    let (mut served, mut refused) = (0, 0);
    let mut count = |ok: bool| {
        if ok {
            served += 1;
        } else {
            refused += 1;
        }
    };
    for case in cases() {
        let gr = Grads::new(&case);
        for op in OPS {
            for bf in [false, true] {
                let p = gr.problem(op, bf);
                let what = format!("{} {op} bf16={bf}", case.name);
                let (out, report) = chain.run_backward(&p).unwrap();
                assert_backward_close(&what, &p, &out, TOL);
                let (r, got) = run_on_device(&chain, &dev, &p);
                let dreport = r.unwrap();
                assert_backward_close(&format!("{what} (device)"), &p, &got, TOL);
                if vendor_takes(op, &p) {
                    count(vendor_served(&what, &report, &name));
                    count(vendor_served(&format!("{what} (device)"), &dreport, &name));
                } else {
                    assert_eq!(report.served_by(), Some(TierKind::Cpu), "{what}");
                    assert_eq!(dreport.served_by(), Some(TierKind::Cpu), "{what}");
                }
            }
        }
        // The transposed convolution's bias: added after the library's call.
        let b: Vec<f32> = (0..gr.g.in_channels)
            .map(|c| c as f32 * 0.25 - 1.0)
            .collect();
        let p = Conv3dBackwardProblem::new(
            Conv3dBackwardOp::Data,
            gr.g,
            Conv3dData::F32(&gr.dy),
            Some(Conv3dData::F32(&gr.w)),
            Some(Conv3dData::F32(&b)),
        )
        .unwrap();
        let (out, report) = chain.run_backward(&p).unwrap();
        assert_backward_close(&format!("{} data + bias", case.name), &p, &out, TOL);
        if vendor_takes(Conv3dBackwardOp::Data, &p) {
            count(vendor_served(case.name, &report, &name));
        }
    }
    // 23 cases of non-zero size: 8 calls each, and one with a bias.
    eprintln!("{name}: served {served} calls, refused {refused}");
    assert!(
        served >= 9 * 23 * 3 / 4,
        "{name} served only {served} calls ({refused} refused)"
    );
    let stats = chain.stats();
    assert_eq!(stats[0].mismatches, 0);
    assert_eq!(stats[0].errors, refused);
    assert!(dev.take_errors().is_empty());
}

/// The bias gradient is no vendor call: skipped as unsupported, the naive
/// tier serves.
fn vendor_skips_the_bias_gradient(open: Open<'_>) {
    let (dev, _, _) = vendor_device(open, None);
    let chain = Conv3dChain::for_device(&dev);
    let gr = Grads::new(&fault_case());
    for bf in [false, true] {
        let p = gr.problem(Conv3dBackwardOp::Bias, bf);
        let (out, report) = chain.run_backward(&p).unwrap();
        assert_backward_close("bias", &p, &out, 1e-5);
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
        assert!(
            matches!(&report.attempts[0].outcome, Outcome::Skipped(w) if w.contains("unsupported: the bias gradient")),
            "{report}"
        );
        let (r, _) = run_on_device(&chain, &dev, &p);
        assert_eq!(r.unwrap().served_by(), Some(TierKind::Naive));
    }
}

/// A plain case every library takes (stride 2, padding 1, batch 2), so
/// that the faults, not a refusal, decide what happens.
fn fault_case() -> Case {
    cases().into_iter().find(|c| c.name == "stride 2").unwrap()
}

/// One fault on the first vendor backward call: the vendor tier fails as
/// `check` says, the naive tier serves the right result; on the host path
/// and on the device path, for both ops and dtypes.
fn vendor_fault_falls_to_naive(open: Open<'_>, kind: FaultKind, check: fn(&Failure) -> bool) {
    let gr = Grads::new(&fault_case());
    for op in OPS {
        for (bf, device_path) in [(false, false), (false, true), (true, true)] {
            let plan = FaultPlan {
                seed: 7,
                rules: vec![FaultRule {
                    kind,
                    when: When::Nth(0),
                }],
            };
            let (dev, _, h) = vendor_device(open, Some(plan));
            let chain = Conv3dChain::for_device(&dev);
            let p = gr.problem(op, bf);
            let (report, out) = if device_path {
                let (r, out) = run_on_device(&chain, &dev, &p);
                (r.unwrap(), out)
            } else {
                let (out, r) = chain.run_backward(&p).unwrap();
                (r, out)
            };
            let what = format!("{kind} on {op} bf16={bf} (device path {device_path})");
            assert_eq!(
                report.served_by(),
                Some(TierKind::Naive),
                "{what}: {report}"
            );
            let failures: Vec<_> = report.failures().collect();
            assert_eq!(failures.len(), 1, "{what}: {report}");
            assert_eq!(failures[0].0.kind, TierKind::Vendor, "{what}");
            assert!(check(failures[0].1), "{what}: {report}");
            assert_backward_close(&what, &p, &out, 1e-5);
            let injected = h.map(|h| h.injected()).unwrap_or_default();
            assert_eq!(injected.len(), 1, "{what}");
            let stats = chain.stats();
            assert_eq!((stats[0].attempts, stats[0].successes), (1, 0), "{what}");
            assert_eq!((stats[2].attempts, stats[2].successes), (1, 1), "{what}");
        }
    }
}

fn vendor_launch_failure_falls_to_naive(open: Open<'_>) {
    vendor_fault_falls_to_naive(open, FaultKind::Conv3dBackwardLaunchFailure, |f| {
        matches!(
            f,
            Failure::Error(Error::InjectedFault {
                fault: FaultKind::Conv3dBackwardLaunchFailure,
                op: "conv3d_backward_vendor"
            })
        )
    });
}

fn vendor_no_algorithm_falls_to_naive(open: Open<'_>) {
    vendor_fault_falls_to_naive(open, FaultKind::VendorNoAlgorithm, |f| {
        matches!(
            f,
            Failure::Error(Error::InjectedFault {
                fault: FaultKind::VendorNoAlgorithm,
                op: "conv3d_backward_vendor"
            })
        )
    });
}

fn vendor_garbage_is_a_mismatch(open: Open<'_>) {
    vendor_fault_falls_to_naive(open, FaultKind::Conv3dBackwardWritesGarbage, |f| {
        matches!(f, Failure::ValueMismatch { .. })
    });
}

fn vendor_nan_is_caught(open: Open<'_>) {
    vendor_fault_falls_to_naive(
        open,
        FaultKind::Conv3dBackwardWritesNonFinite,
        |f| matches!(f, Failure::NonFinite { value, .. } if value.is_nan()),
    );
}

per_device!(
    vendor_serves_data_and_weight,
    vendor_skips_the_bias_gradient,
    vendor_launch_failure_falls_to_naive,
    vendor_no_algorithm_falls_to_naive,
    vendor_garbage_is_a_mismatch,
    vendor_nan_is_caught,
    vendor_check_failure_falls_to_naive,
);

/// The host backend has no vendor library: the vendor tier is skipped as
/// unavailable for every backward op (not failed), nothing is injected
/// into a call that never happens, and the naive tier serves.
#[test]
fn host_backend_skips_the_vendor_tier_for_backward_ops() {
    let host = rocm_safe::device::host::HostBackend::new();
    assert!(matches!(
        host.conv3d_vendor_backward_available(),
        Err(Error::VendorUnavailable {
            backend: "host",
            ..
        })
    ));
    let plan = FaultPlan::one(FaultKind::VendorNoAlgorithm, When::Always);
    let (f, h) = Faults::new(host, plan);
    let dev = Device::from_backend(Box::new(f));
    let chain = Conv3dChain::for_device(&dev);
    let gr = Grads::new(&fault_case());
    for op in [
        Conv3dBackwardOp::Data,
        Conv3dBackwardOp::Weight,
        Conv3dBackwardOp::Bias,
    ] {
        let p = gr.problem(op, false);
        let (out, report) = chain.run_backward(&p).unwrap();
        assert_backward_close("host", &p, &out, 1e-5);
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
        assert!(
            matches!(&report.attempts[0].outcome, Outcome::Skipped(w) if w.starts_with("unavailable: ") && w.contains("vendor")),
            "{report}"
        );
        let (r, _) = run_on_device(&chain, &dev, &p);
        assert_eq!(r.unwrap().served_by(), Some(TierKind::Naive));
    }
    assert!(h.injected().is_empty());
    let stats = chain.stats();
    assert_eq!((stats[0].skips, stats[0].attempts), (6, 0));
    // The call itself, made directly: refused by the host backend.
    let s = dev.stream().unwrap();
    let g = gr.g;
    let dy = s.clone_htod(&gr.dy).unwrap();
    let w = s.clone_htod(&gr.w).unwrap();
    let mut dx = s
        .alloc_zeros::<f32>(g.input_shape().iter().product())
        .unwrap();
    let e = s
        .conv3d_ops()
        .backward_data_vendor(&g, &dy.view(), &w.view(), None, &mut dx.view_mut())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InjectedFault {
                fault: FaultKind::VendorNoAlgorithm,
                op: "conv3d_backward_vendor"
            }
        ),
        "{e}"
    );
    h.set_enabled(false);
    let e = s
        .conv3d_ops()
        .backward_data_vendor(&g, &dy.view(), &w.view(), None, &mut dx.view_mut())
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
}

/// A device check that cannot run fails the vendor tier it was checking
/// (the device path only: the host path checks on the host).
fn vendor_check_failure_falls_to_naive(open: Open<'_>) {
    let gr = Grads::new(&fault_case());
    for op in OPS {
        let plan = FaultPlan::one(FaultKind::Conv3dCheckFailure, When::Nth(0));
        let (dev, _, h) = vendor_device(open, Some(plan));
        let chain = Conv3dChain::for_device(&dev);
        let p = gr.problem(op, true);
        let (r, out) = run_on_device(&chain, &dev, &p);
        let report = r.unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
        let failures: Vec<_> = report.failures().collect();
        assert!(
            matches!(
                failures[..],
                [(a, Failure::Error(Error::InjectedFault { fault: FaultKind::Conv3dCheckFailure, op: "conv3d_backward_check" }))]
                    if a.kind == TierKind::Vendor
            ),
            "{report}"
        );
        assert_backward_close("after a check failure", &p, &out, 1e-5);
        assert_eq!(h.map(|h| h.injected().len()), Some(1));
    }
}
