//! Shared by the tests of conv3d gradients and `conv_transpose3d`
//! (`tests/conv3d/backward.rs`, `tests/conv3d/transpose.rs`,
//! `tests/conv3d/vendor_backward.rs`): bf16 operands, the operands of a
//! case ([`Grads`]), the comparison with the f64 backward reference, the
//! chain of a device, operands uploaded as f32 or bf16, and a problem run
//! through the chain's device entry points.

use super::conv3d::{values, Case};
use half::bf16;
use rocm_safe::conv3d::{
    backward_reference_point, Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dData, Conv3dGeometry,
};
use rocm_safe::conv3d_chain::{
    BackwardInputs, Conv3dChain, Conv3dReport, DeviceConv3dData, TierKind,
};
use rocm_safe::device::{Device, DeviceBuffer, Stream};
use rocm_safe::Result;

pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// Asserts `out` equals the f64 reference of `p` within `rel` of each
/// element's magnitude, everywhere.
pub fn assert_backward_close(what: &str, p: &Conv3dBackwardProblem<'_>, out: &[f32], rel: f64) {
    assert_eq!(out.len(), p.output_len(), "{what}: result length");
    for (i, &got) in out.iter().enumerate() {
        let r = backward_reference_point(p, i).unwrap();
        let tol = rel * r.magnitude + 1e-30;
        assert!(
            (f64::from(got) - r.value).abs() <= tol,
            "{what}: {} index {i} of {:?}: got {got}, expected {} (tolerance {tol:e})",
            p.op,
            p.output_shape(),
            r.value
        );
    }
}

/// The chain of `dev` without its vendor tier (forbidden: these tests are
/// of the naive kernels and the CPU; `tests/conv3d/vendor_backward.rs` and
/// the vendor tests of `tests/conv3d/transpose.rs` are the vendor tier's).
pub fn chain(dev: &Device) -> Conv3dChain {
    let mut c = Conv3dChain::for_device(dev);
    c.options_mut().forbid = vec![TierKind::Vendor];
    c
}

pub enum Buf {
    F32(DeviceBuffer<f32>),
    BF16(DeviceBuffer<bf16>),
}

impl Buf {
    pub fn up(s: &Stream, d: Conv3dData<'_>) -> Buf {
        match d {
            Conv3dData::F32(v) => Buf::F32(s.clone_htod(v).unwrap()),
            Conv3dData::BF16(v) => Buf::BF16(s.clone_htod(v).unwrap()),
            other => panic!("no buffer for {other:?}"),
        }
    }
    pub fn data(&self) -> DeviceConv3dData<'_> {
        match self {
            Buf::F32(b) => DeviceConv3dData::F32(b.view()),
            Buf::BF16(b) => DeviceConv3dData::BF16(b.view()),
        }
    }
}

/// Operands of one backward test: x, w, dy (f32 and bf16).
pub struct Grads {
    pub x: Vec<f32>,
    pub w: Vec<f32>,
    pub dy: Vec<f32>,
    pub xb: Vec<bf16>,
    pub wb: Vec<bf16>,
    pub dyb: Vec<bf16>,
    pub g: Conv3dGeometry,
}
impl Grads {
    pub fn new(case: &Case) -> Grads {
        let g = Conv3dGeometry::new(case.params, &case.input, &case.weight).unwrap();
        let x = values(case.input.iter().product(), 11);
        let w = values(case.weight.iter().product(), 12);
        let dy = values(g.output_len(), 13);
        Grads {
            xb: to_bf16(&x),
            wb: to_bf16(&w),
            dyb: to_bf16(&dy),
            x,
            w,
            dy,
            g,
        }
    }

    pub fn problem<'a>(&'a self, op: Conv3dBackwardOp, bf: bool) -> Conv3dBackwardProblem<'a> {
        let choose = |v: &'a [f32], b: &'a [bf16]| {
            if bf {
                Conv3dData::BF16(b)
            } else {
                Conv3dData::F32(v)
            }
        };
        let dy = choose(&self.dy, &self.dyb);
        let other = match op {
            Conv3dBackwardOp::Data => Some(choose(&self.w, &self.wb)),
            Conv3dBackwardOp::Weight => Some(choose(&self.x, &self.xb)),
            Conv3dBackwardOp::Bias => None,
            other => panic!("no operands for {other:?}"),
        };
        let g = match op {
            Conv3dBackwardOp::Bias => {
                Conv3dGeometry::for_bias_grad(&self.g.output_shape()).unwrap()
            }
            _ => self.g,
        };
        Conv3dBackwardProblem::new(op, g, dy, other, None).unwrap()
    }
}

/// `p` through the device entry points of `chain` on a new stream of
/// `dev`: the report or error, and the result read back.
pub fn run_on_device(
    chain: &Conv3dChain,
    dev: &Device,
    p: &Conv3dBackwardProblem<'_>,
) -> (Result<Conv3dReport>, Vec<f32>) {
    let s = dev.stream().unwrap();
    let g = p.geometry;
    let dy = Buf::up(&s, p.grad_output);
    let other = p.other.map(|o| Buf::up(&s, o));
    let mut out = s.alloc_zeros::<f32>(p.output_len().max(1)).unwrap();
    let mut all = out.view_mut();
    let mut view = all.slice_mut(..p.output_len()).unwrap();
    let r = match (p.op, &other) {
        (Conv3dBackwardOp::Data, Some(w)) => chain.backward_device(
            &s,
            g.params,
            &g.input_shape(),
            &g.weight_shape(),
            BackwardInputs::Data {
                grad_output: dy.data(),
                weight: w.data(),
            },
            &mut view,
        ),
        (Conv3dBackwardOp::Weight, Some(x)) => chain.backward_device(
            &s,
            g.params,
            &g.input_shape(),
            &g.weight_shape(),
            BackwardInputs::Weight {
                input: x.data(),
                grad_output: dy.data(),
            },
            &mut view,
        ),
        _ => chain.backward_bias_device(&s, dy.data(), &g.output_shape(), &mut view),
    };
    let mut host = out.to_vec().unwrap();
    host.truncate(p.output_len());
    (r, host)
}

/// The chain run of one backward problem on a device: the report or error
/// and the result read back.
pub type DeviceRun<'f> = &'f dyn Fn(
    &Conv3dChain,
    &Device,
    &Conv3dBackwardProblem<'_>,
) -> (Result<Conv3dReport>, Vec<f32>);

/// One fault of `kind` on the first operation it applies to, under the
/// tiled tier: the tiled tier fails as `check` says and the naive tier
/// serves the right result, for f32 and bf16 operands (`problem(bf16)`) and
/// on the host and device paths (`on_device`).
pub fn tiled_fault_falls_to_naive<'a>(
    open: super::Open<'_>,
    kind: rocm_safe::device::faults::FaultKind,
    check: &dyn Fn(&rocm_safe::fallback::Failure) -> bool,
    problem: &dyn Fn(bool) -> Conv3dBackwardProblem<'a>,
    on_device: DeviceRun<'_>,
) {
    use rocm_safe::device::faults::{FaultPlan, FaultRule, Faults, When};
    for bf in [false, true] {
        for device_path in [false, true] {
            let plan = FaultPlan {
                seed: 7,
                rules: vec![FaultRule {
                    kind,
                    when: When::Nth(0),
                }],
            };
            let (f, h) = Faults::new(open(), plan);
            let dev = Device::from_backend(Box::new(f));
            let chain = chain(&dev);
            let p = problem(bf);
            let (report, out) = if device_path {
                let (r, out) = on_device(&chain, &dev, &p);
                (r.unwrap(), out)
            } else {
                let (out, r) = chain.run_backward(&p).unwrap();
                (r, out)
            };
            let what = format!("{kind} bf16={bf} device path {device_path}");
            assert_eq!(
                report.served_by(),
                Some(TierKind::Naive),
                "{what}: {report}"
            );
            let failures: Vec<_> = report.failures().collect();
            assert_eq!(failures.len(), 1, "{what}: {report}");
            assert_eq!(failures[0].0.kind, TierKind::Tiled, "{what}");
            assert!(check(failures[0].1), "{what}: {report}");
            assert_backward_close(&what, &p, &out, 1e-5);
            assert_eq!(h.injected().len(), 1, "{what}");
        }
    }
}

/// The failure of a backward launch of `op` that `Faults` made fail.
pub fn launch_failed(op: &'static str) -> impl Fn(&rocm_safe::fallback::Failure) -> bool {
    use rocm_safe::device::faults::FaultKind;
    use rocm_safe::fallback::Failure;
    move |f| {
        matches!(
            f,
            Failure::Error(rocm_safe::Error::InjectedFault {
                fault: FaultKind::Conv3dBackwardLaunchFailure,
                op: o
            }) if *o == op
        )
    }
}

/// A sampled point off its reference (garbage caught by the check).
pub fn mismatched(f: &rocm_safe::fallback::Failure) -> bool {
    matches!(f, rocm_safe::fallback::Failure::ValueMismatch { .. })
}

/// A NaN caught by the scan.
pub fn nan_caught(f: &rocm_safe::fallback::Failure) -> bool {
    matches!(f, rocm_safe::fallback::Failure::NonFinite { value, .. } if value.is_nan())
}
