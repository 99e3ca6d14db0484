//! Issue 21, item 4: the gradients of a conv3d (input, weight, bias)
//! through the chain (`conv_transpose3d`: `tests/conv3d/transpose.rs`),
//! the vendor tier forbidden (its tests: `tests/conv3d/vendor_backward.rs`).
//!
//! The f64 references are tested against the forward reference (each
//! gradient is the adjoint of the forward convolution: `<conv(x, w), dy> =
//! <x, dx> = <w, dw>`); every tier's result (the naive GPU kernels, the
//! CPU) against the references, on the host (`run_backward`) and on device
//! memory (`backward_device`), with groups, stride, dilation and padding;
//! and every failure path (a backward kernel that fails, writes garbage or
//! a NaN, a check that cannot run, an overflow, refused shapes). Each
//! device test runs on the host backend here and, with
//! `--include-ignored`, on a CUDA or HIP device.

use crate::common;
use crate::common::faults::faulty;
use common::conv3d::{cases, Case};
use common::conv3d_backward::{assert_backward_close, chain, run_on_device, to_bf16, Grads};
use common::Open;
use rocm_safe::conv3d::{
    backward_reference, reference, Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dData,
    Conv3dGeometry, Conv3dParams, Conv3dProblem,
};
use rocm_safe::conv3d_chain::{
    BackwardInputs, Conv3dChain, Conv3dOptions, Conv3dReport, Conv3dTier, CpuTier,
    DeviceConv3dData, TierKind,
};
use rocm_safe::device::faults::{FaultKind, When};
use rocm_safe::device::Device;
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::Error;

const OPS: [Conv3dBackwardOp; 3] = [
    Conv3dBackwardOp::Data,
    Conv3dBackwardOp::Weight,
    Conv3dBackwardOp::Bias,
];
fn dot(a: &[f64], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * f64::from(*y)).sum()
}

/// The gradients are the adjoints of the forward convolution (the forward
/// reference is tested elsewhere against every tier and torch):
/// `<conv(x, w), dy> = <x, dx> = <w, dw>`, and `db` sums `dy`.
#[test]
fn references_are_the_adjoints_of_the_forward_reference() {
    for case in cases() {
        let gr = Grads::new(&case);
        let fwd = Conv3dProblem::new(
            case.params,
            Conv3dData::F32(&gr.x),
            &case.input,
            Conv3dData::F32(&gr.w),
            &case.weight,
            None,
        )
        .unwrap();
        let y = reference(&fwd);
        let lhs = dot(&y, &gr.dy);
        let dx = backward_reference(&gr.problem(Conv3dBackwardOp::Data, false));
        let dw = backward_reference(&gr.problem(Conv3dBackwardOp::Weight, false));
        let db = backward_reference(&gr.problem(Conv3dBackwardOp::Bias, false));
        let scale = 1.0 + y.iter().map(|v| v.abs()).sum::<f64>();
        let (via_x, via_w) = (dot(&dx, &gr.x), dot(&dw, &gr.w));
        assert!(
            (lhs - via_x).abs() <= 1e-9 * scale,
            "{}: <y,dy> {lhs} vs <x,dx> {via_x}",
            case.name
        );
        assert!(
            (lhs - via_w).abs() <= 1e-9 * scale,
            "{}: <y,dy> {lhs} vs <w,dw> {via_w}",
            case.name
        );
        let g = gr.g;
        let spatial: usize = g.output.iter().product();
        for (k, &v) in db.iter().enumerate() {
            let sum: f64 = (0..g.batch)
                .flat_map(|n| {
                    let start = (n * g.out_channels + k) * spatial;
                    gr.dy[start..start + spatial].iter().map(|&x| f64::from(x))
                })
                .sum();
            assert!(
                (v - sum).abs() <= 1e-12 * (1.0 + sum.abs()),
                "{}: db[{k}]",
                case.name
            );
        }
    }
}
/// Whether the tiled tier takes backward `op` of `g` (written out here, not
/// asked of the tier): the input gradient with a stride product of at most
/// 8, a padding within `dilation * (k - 1)`, at least 8 input channels per
/// group; the weight gradient with at least 8 output channels per group;
/// no zero size (`tests/conv3d/tiled_backward.rs` and
/// `tests/conv3d/tiled_wgrad.rs` test that tier).
fn tiled_takes(op: Conv3dBackwardOp, g: &Conv3dGeometry) -> bool {
    let p = &g.params;
    if op.unsupported(g).is_some() {
        return false;
    }
    match op {
        Conv3dBackwardOp::Data => {
            p.stride.iter().product::<usize>() <= 8
                && (0..3).all(|a| p.padding[a] <= p.dilation[a] * (g.kernel[a] - 1))
                && g.in_per_group() >= 8
        }
        Conv3dBackwardOp::Weight => g.out_per_group() >= 8,
        _ => false,
    }
}

/// The common chain without the tiled tier: the naive tier's faults.
fn naive_chain(dev: &Device) -> Conv3dChain {
    let mut c = chain(dev);
    c.options_mut().forbid.push(TierKind::Tiled);
    c
}

/// The report's skips before the serving tier: vendor forbidden (the
/// common chain's option: its tests are `tests/conv3d/vendor_backward.rs`),
/// tiled unsupported (bias gradients, too few channels, ...) unless
/// it served.
fn assert_gpu_skips(report: &Conv3dReport) {
    let vendor = &report.attempts[0];
    assert!(
        matches!(&vendor.outcome, Outcome::Skipped(why) if why.starts_with("forbidden")),
        "{report}"
    );
    let tiled = &report.attempts[1];
    assert!(
        matches!(&tiled.outcome, Outcome::Skipped(why) if why.contains("naive tier") || why.contains("zero-size"))
            || matches!(tiled.outcome, Outcome::Served),
        "{report}"
    );
}
/// Every op, every case, f32 and bf16, host and device entry points:
/// served by the naive kernels (the tiled tier for the input gradients it
/// takes, the CPU where a call is zero-sized), equal to the f64 reference
/// at f32 accuracy.
fn backward_ops_match_the_reference(dev: &Device) {
    let chain = chain(dev);
    for case in cases() {
        let gr = Grads::new(&case);
        for op in OPS {
            for bf in [false, true] {
                let p = gr.problem(op, bf);
                let what = format!("{} {op} bf16={bf}", case.name);
                let (out, report) = chain.run_backward(&p).unwrap();
                assert_backward_close(&what, &p, &out, 1e-5);
                let zero = op.unsupported(&p.geometry).is_some();
                let tier = if zero {
                    TierKind::Cpu
                } else if tiled_takes(op, &p.geometry) {
                    TierKind::Tiled
                } else {
                    TierKind::Naive
                };
                assert_eq!(report.served_by(), Some(tier), "{what}: {report}");
                assert_gpu_skips(&report);
                let (r, got) = run_on_device(&chain, dev, &p);
                let report = r.unwrap();
                assert_eq!(report.served_by(), Some(tier), "{what} (device): {report}");
                assert_backward_close(&format!("{what} (device)"), &p, &got, 1e-5);
            }
        }
    }
    let stats = chain.stats();
    assert!(stats[2].successes > 0 && stats[2].errors + stats[2].mismatches == 0);
    assert!(stats[1].successes > 0 && stats[1].errors + stats[1].mismatches == 0);
    assert_eq!(stats[0].attempts, 0, "vendor never runs");
}

/// A case with stride, dilation and padding.
fn fault_case() -> Case {
    cases()
        .into_iter()
        .find(|c| c.name == "tiled: stride 2, dilation, 16 out")
        .unwrap()
}

/// One fault on the first backward op: the naive tier fails as `check`
/// says, the CPU serves the right result; on the host path and on the
/// device path, for every op (the tiled tier forbidden: its faults are
/// `tests/conv3d/tiled_backward.rs`'s and `tests/conv3d/tiled_wgrad.rs`'s).
fn naive_fault_falls_to_the_cpu(open: Open<'_>, kind: FaultKind, check: fn(&Failure) -> bool) {
    let gr = Grads::new(&fault_case());
    for op in OPS {
        for device_path in [false, true] {
            let (dev, h) = faulty(open, &[(kind, When::Nth(0))]);
            let chain = naive_chain(&dev);
            let p = gr.problem(op, false);
            let (report, out) = if device_path {
                let (r, out) = run_on_device(&chain, &dev, &p);
                (r.unwrap(), out)
            } else {
                let (out, r) = chain.run_backward(&p).unwrap();
                (r, out)
            };
            let what = format!("{kind} on {op} (device path {device_path})");
            assert_eq!(report.served_by(), Some(TierKind::Cpu), "{what}: {report}");
            let failures: Vec<_> = report.failures().collect();
            assert_eq!(failures.len(), 1, "{what}: {report}");
            assert_eq!(failures[0].0.kind, TierKind::Naive, "{what}");
            assert!(check(failures[0].1), "{what}: {report}");
            assert_backward_close(&what, &p, &out, 1e-5);
            assert_eq!(h.injected().len(), 1, "{what}");
            let stats = chain.stats();
            assert_eq!((stats[2].attempts, stats[2].successes), (1, 0), "{what}");
            assert_eq!((stats[3].attempts, stats[3].successes), (1, 1), "{what}");
        }
    }
}

fn backward_launch_failure_falls_to_the_cpu(open: Open<'_>) {
    naive_fault_falls_to_the_cpu(open, FaultKind::Conv3dBackwardLaunchFailure, |f| {
        matches!(
            f,
            Failure::Error(Error::InjectedFault {
                fault: FaultKind::Conv3dBackwardLaunchFailure,
                op: "conv3d_backward"
            })
        )
    });
}

fn backward_garbage_is_a_mismatch(open: Open<'_>) {
    naive_fault_falls_to_the_cpu(open, FaultKind::Conv3dBackwardWritesGarbage, |f| {
        matches!(f, Failure::ValueMismatch { .. })
    });
}

fn backward_nan_is_caught(open: Open<'_>) {
    naive_fault_falls_to_the_cpu(
        open,
        FaultKind::Conv3dBackwardWritesNonFinite,
        |f| matches!(f, Failure::NonFinite { value, .. } if value.is_nan()),
    );
}

/// A backward check that cannot run (device path only: the host path
/// checks on the host) fails the tier it was checking.
fn backward_check_failure_fails_the_tier(open: Open<'_>) {
    let gr = Grads::new(&fault_case());
    for op in OPS {
        let (dev, h) = faulty(open, &[(FaultKind::Conv3dCheckFailure, When::Nth(0))]);
        let chain = naive_chain(&dev);
        let p = gr.problem(op, true);
        let (r, out) = run_on_device(&chain, &dev, &p);
        let report = r.unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Cpu), "{report}");
        let failures: Vec<_> = report.failures().collect();
        assert!(
            matches!(
                failures[..],
                [(a, Failure::Error(Error::InjectedFault { fault: FaultKind::Conv3dCheckFailure, op: "conv3d_backward_check" }))]
                    if a.kind == TierKind::Naive
            ),
            "{report}"
        );
        assert_backward_close("after a check failure", &p, &out, 1e-5);
        assert_eq!(h.injected().len(), 1);
    }
}

/// Garbage from every tier: the call fails with the report, each tier's
/// mismatch in it (nothing unchecked is returned).
fn every_tier_wrong_is_no_tier(open: Open<'_>) {
    let gr = Grads::new(&fault_case());
    let (dev, _h) = faulty(
        open,
        &[(FaultKind::Conv3dBackwardWritesGarbage, When::Always)],
    );
    // The tiled and naive tiers only (the CPU has no device kernel to
    // corrupt; the vendor tier's own tests are conv3d_vendor_backward.rs).
    let mut c = chain(&dev);
    c.options_mut().forbid = vec![TierKind::Vendor, TierKind::Cpu];
    let p = gr.problem(Conv3dBackwardOp::Weight, false);
    let e = c.run_backward(&p).unwrap_err();
    let Some(report) = Conv3dReport::of(&e) else {
        panic!("{e}")
    };
    let failures: Vec<_> = report.failures().collect();
    let kinds: Vec<_> = failures.iter().map(|f| f.0.kind).collect();
    assert_eq!(kinds, [TierKind::Tiled, TierKind::Naive], "{report}");
    assert!(
        failures
            .iter()
            .all(|f| matches!(f.1, Failure::ValueMismatch { .. })),
        "{report}"
    );
    let (r, _) = run_on_device(&c, &dev, &p);
    assert!(matches!(r, Err(Error::Conv3dNoTier { .. })));
}

/// A gradient whose exact value is beyond the f32 range: the infinity is
/// the right answer, reported as an overflow (no other tier would do
/// better); NaN or Inf in `dy` passes (nothing to blame the tier for).
fn overflow_and_non_finite_inputs(dev: &Device) {
    let chain = chain(dev);
    let case = fault_case();
    let mut gr = Grads::new(&case);
    for v in gr.dy.iter_mut() {
        *v = 3e38;
    }
    gr.dyb = to_bf16(&gr.dy);
    let p = gr.problem(Conv3dBackwardOp::Bias, false);
    let e = chain.run_backward(&p).unwrap_err();
    assert!(matches!(e, Error::Conv3dOverflow { .. }), "{e}");
    let (r, _) = run_on_device(&chain, dev, &p);
    assert!(matches!(r, Err(Error::Conv3dOverflow { .. })), "{r:?}");
    let mut gr = Grads::new(&case);
    gr.dy[5] = f32::NAN;
    let p = gr.problem(Conv3dBackwardOp::Data, false);
    let (out, report) = chain.run_backward(&p).unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
    assert!(out.iter().any(|v| v.is_nan()));
    let (r, out) = run_on_device(&chain, dev, &p);
    assert_eq!(r.unwrap().served_by(), Some(TierKind::Naive));
    assert!(out.iter().any(|v| v.is_nan()));
}
per_device!(
    backward_ops_match_the_reference,
    backward_launch_failure_falls_to_the_cpu,
    backward_garbage_is_a_mismatch,
    backward_nan_is_caught,
    backward_check_failure_fails_the_tier,
    every_tier_wrong_is_no_tier,
    overflow_and_non_finite_inputs,
);

/// A chain of the CPU tier alone (a machine without a GPU) serves every
/// backward op and the transposed convolution.
#[test]
fn cpu_tier_serves_backward_ops() {
    let c = Conv3dChain::with_tiers(
        vec![Box::new(CpuTier) as Box<dyn Conv3dTier>],
        Conv3dOptions::default(),
    );
    let gr = Grads::new(&fault_case());
    for op in OPS {
        let p = gr.problem(op, true);
        let (out, report) = c.run_backward(&p).unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Cpu));
        assert_backward_close("cpu", &p, &out, 1e-5);
    }
}

/// Shapes and parameters the transposed convolution refuses, with the
/// errors that name them; lengths and dtypes of backward problems.
#[test]
fn refused_shapes_and_operands() {
    let p = Conv3dParams::default().with_stride([2; 3]);
    let t = |params, op: [usize; 3], input: [usize; 5], weight: [usize; 5]| {
        Conv3dGeometry::transposed(params, op, &input, &weight)
    };
    let e = t(p, [2, 0, 0], [1, 2, 3, 3, 3], [2, 2, 3, 3, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dParam {
                param: "output_padding",
                ..
            }
        ),
        "{e}"
    );
    let e = t(p, [0; 3], [1, 2, 3, 3, 3], [3, 2, 3, 3, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dShape {
                tensor: "weight",
                ..
            }
        ),
        "{e}"
    );
    let e = t(p.with_groups(2), [0; 3], [1, 3, 3, 3, 3], [3, 2, 3, 3, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dShape {
                tensor: "input",
                ..
            }
        ),
        "{e}"
    );
    let e = t(
        Conv3dParams::default().with_padding([2; 3]),
        [0; 3],
        [1, 1, 1, 1, 1],
        [1, 1, 1, 1, 1],
    )
    .unwrap_err();
    assert!(
        matches!(e, Error::Conv3dShape { reason, .. } if reason.contains("below 1")),
        "{e}"
    );
    let e = t(p, [0; 3], [1, 2, 0, 3, 3], [2, 2, 3, 3, 3]).unwrap_err();
    assert!(matches!(e, Error::Conv3dShape { .. }), "{e}");
    let e = t(
        p.with_stride([0, 1, 1]),
        [0; 3],
        [1, 2, 3, 3, 3],
        [2, 2, 3, 3, 3],
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dParam {
                param: "stride",
                ..
            }
        ),
        "{e}"
    );
    let e = Conv3dGeometry::transposed(p, [0; 3], &[1, 2, 3, 3], &[2, 2, 3, 3, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dShape {
                tensor: "input",
                ..
            }
        ),
        "{e}"
    );
    // output_padding >= stride is allowed below the dilation.
    let g = t(
        Conv3dParams::default().with_dilation([3; 3]),
        [2; 3],
        [1, 2, 3, 3, 3],
        [2, 2, 2, 2, 2],
    )
    .unwrap();
    assert_eq!(g.output, [3, 3, 3]);
    assert_eq!(g.input, [8, 8, 8]);

    let gr = Grads::new(&fault_case());
    let g = gr.g;
    let short = &gr.dy[1..];
    let e = Conv3dBackwardProblem::new(
        Conv3dBackwardOp::Data,
        g,
        Conv3dData::F32(short),
        Some(Conv3dData::F32(&gr.w)),
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d backward grad_output",
                ..
            }
        ),
        "{e}"
    );
    let e = Conv3dBackwardProblem::new(
        Conv3dBackwardOp::Data,
        g,
        Conv3dData::F32(&gr.dy),
        Some(Conv3dData::BF16(&gr.wb)),
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dDType {
                tensor: "weight",
                ..
            }
        ),
        "{e}"
    );
    let e = Conv3dBackwardProblem::new(
        Conv3dBackwardOp::Weight,
        g,
        Conv3dData::F32(&gr.dy),
        None,
        None,
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dParam {
                param: "backward operands",
                ..
            }
        ),
        "{e}"
    );
    let e = Conv3dBackwardProblem::new(
        Conv3dBackwardOp::Weight,
        g,
        Conv3dData::F32(&gr.dy),
        Some(Conv3dData::F32(&gr.x)),
        Some(Conv3dData::F32(&gr.x[..6])),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dParam {
                param: "backward operands",
                ..
            }
        ),
        "{e}"
    );
    // The device entry point refuses a wrong output length before any tier.
    let dev = Device::host();
    let s = dev.stream().unwrap();
    let dy = s.clone_htod(&gr.dy).unwrap();
    let w = s.clone_htod(&gr.w).unwrap();
    let mut out = s.alloc_zeros::<f32>(3).unwrap();
    let e = chain(&dev)
        .backward_device(
            &s,
            g.params,
            &g.input_shape(),
            &g.weight_shape(),
            BackwardInputs::Data {
                grad_output: DeviceConv3dData::F32(dy.view()),
                weight: DeviceConv3dData::F32(w.view()),
            },
            &mut out.view_mut(),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d backward device output",
                ..
            }
        ),
        "{e}"
    );
}
