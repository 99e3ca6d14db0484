//! The tiled tier's input gradient and `conv_transpose3d`: the forward
//! convolution of `dy` (spread by the stride where there is one,
//! `conv3d_zero_insert_*`) with the flipped weight
//! (`Conv3dGeometry::data_grad_as_forward`, `conv3d_flip_weight_*`), run by
//! the tiled kernels.
//!
//! The flip and zero-insertion kernels against their index formulas; the
//! tiled tier serving the input gradient and the transposed convolution
//! (f32 and bf16, groups, dilation, padding, strides, output_padding, the
//! transposed convolution's bias in f32 and bf16) equal to the f64
//! reference, on the host (`run_backward`) and on device memory; what it
//! refuses (the bias gradient, a stride product above 8, a padding
//! beyond the kernel's reach, too few channels per group) going to the
//! naive tier with the reason in the report; and faults in its kernels
//! (the flip or the zero insertion failing, writing garbage or a NaN; the
//! tiled kernel failing) falling to the naive tier. Each runs on the host
//! backend here and, with `--include-ignored`, on a CUDA or HIP device; the
//! Wan-VAE-sized shapes run on a GPU only.

use crate::common;
use common::conv3d::values;
use common::conv3d_backward::{
    assert_backward_close, chain, launch_failed, mismatched, nan_caught, to_bf16, Buf,
};
use common::Open;
use half::bf16;
use rocm_safe::conv3d::{
    backward_reference_point, sample_index, Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dData,
    Conv3dGeometry, Conv3dParams,
};
use rocm_safe::conv3d_chain::{BackwardInputs, Conv3dChain, Conv3dReport, TierKind};
use rocm_safe::device::faults::FaultKind;
use rocm_safe::device::Device;
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::{Error, Result};

/// A backward test's operands: f32 and bf16 copies of `dy`, the other
/// operand and the bias (Data only).
struct Operands {
    op: Conv3dBackwardOp,
    g: Conv3dGeometry,
    dy: Vec<f32>,
    other: Vec<f32>,
    bias: Option<Vec<f32>>,
    /// The transposed convolution's output_padding (with a bias).
    out_pad: [usize; 3],
    dyb: Vec<bf16>,
    otherb: Vec<bf16>,
}

impl Operands {
    fn new(op: Conv3dBackwardOp, g: Conv3dGeometry, bias: bool, salt: u64) -> Operands {
        let dy = values(g.output_len(), salt);
        let n = match op {
            Conv3dBackwardOp::Data => g.weight_shape().iter().product(),
            _ => g.input_shape().iter().product(),
        };
        let other = values(n, salt + 1);
        let bias = bias.then(|| values(g.in_channels, salt + 2));
        Operands {
            op,
            g,
            dyb: to_bf16(&dy),
            otherb: to_bf16(&other),
            dy,
            other,
            bias,
            out_pad: [0; 3],
        }
    }

    /// The input gradient of the forward convolution `params` of
    /// `input` with `weight`.
    fn grad(params: Conv3dParams, input: [usize; 5], weight: [usize; 5]) -> Operands {
        let g = Conv3dGeometry::new(params, &input, &weight).unwrap();
        Operands::new(Conv3dBackwardOp::Data, g, false, 31)
    }

    /// `conv_transpose3d` of an input `input` with `weight` `[Cin, Cout/G,
    /// ...]`, with a bias.
    fn transpose(
        params: Conv3dParams,
        out_pad: [usize; 3],
        input: [usize; 5],
        weight: [usize; 5],
    ) -> Operands {
        let g = Conv3dGeometry::transposed(params, out_pad, &input, &weight).unwrap();
        Operands {
            out_pad,
            ..Operands::new(Conv3dBackwardOp::Data, g, true, 41)
        }
    }

    fn problem(&self, bf: bool) -> Conv3dBackwardProblem<'_> {
        let (dy, other) = if bf {
            (Conv3dData::BF16(&self.dyb), Conv3dData::BF16(&self.otherb))
        } else {
            (Conv3dData::F32(&self.dy), Conv3dData::F32(&self.other))
        };
        let (g, other) = match self.op {
            Conv3dBackwardOp::Bias => (
                Conv3dGeometry::for_bias_grad(&self.g.output_shape()).unwrap(),
                None,
            ),
            _ => (self.g, Some(other)),
        };
        let bias = self.bias.as_deref().map(Conv3dData::F32);
        Conv3dBackwardProblem::new(self.op, g, dy, other, bias).unwrap()
    }
}

/// `p` (Data or Weight, bias as f32 or bf16) through the device entry
/// points of `chain` on a new stream of `dev`: the report or error and the
/// result read back. With a bias, `conv_transpose3d_device` with
/// `out_pad` (the geometry is the transposed convolution's; its input and
/// weight shapes derived).
fn on_device(
    chain: &Conv3dChain,
    dev: &Device,
    (p, out_pad): (&Conv3dBackwardProblem<'_>, [usize; 3]),
    bias_bf16: bool,
) -> (Result<Conv3dReport>, Vec<f32>) {
    let s = dev.stream().unwrap();
    let g = p.geometry;
    let dy = Buf::up(&s, p.grad_output);
    let other = Buf::up(&s, p.other.unwrap());
    let mut out = s.alloc_zeros::<f32>(p.output_len()).unwrap();
    let r = match (p.op, p.bias) {
        (Conv3dBackwardOp::Data, Some(Conv3dData::F32(b))) => {
            let bb = to_bf16(b);
            let bd = if bias_bf16 {
                Buf::up(&s, Conv3dData::BF16(&bb))
            } else {
                Buf::up(&s, Conv3dData::F32(b))
            };
            // The transposed convolution's own input and weight shapes.
            let [n, k, od, oh, ow] = g.output_shape();
            let input = [n, k, od, oh, ow];
            let [kk, cg, kd, kh, kw] = g.weight_shape();
            let weight = [kk, cg, kd, kh, kw];
            chain.conv_transpose3d_device(
                &s,
                g.params,
                out_pad,
                dy.data(),
                &input,
                other.data(),
                &weight,
                Some(bd.data()),
                &mut out.view_mut(),
            )
        }
        (Conv3dBackwardOp::Data, _) => chain.backward_device(
            &s,
            g.params,
            &g.input_shape(),
            &g.weight_shape(),
            BackwardInputs::Data {
                grad_output: dy.data(),
                weight: other.data(),
            },
            &mut out.view_mut(),
        ),
        _ => chain.backward_device(
            &s,
            g.params,
            &g.input_shape(),
            &g.weight_shape(),
            BackwardInputs::Weight {
                input: other.data(),
                grad_output: dy.data(),
            },
            &mut out.view_mut(),
        ),
    };
    (r, out.to_vec().unwrap())
}

fn params(padding: [usize; 3], dilation: [usize; 3], groups: usize) -> Conv3dParams {
    Conv3dParams::default()
        .with_padding(padding)
        .with_dilation(dilation)
        .with_groups(groups)
}

/// Cases the tiled tier serves: input gradients and transposed
/// convolutions, at least 8 result channels per group.
fn served_cases() -> Vec<(&'static str, Operands)> {
    vec![
        (
            "grad k3 p1",
            Operands::grad(params([1; 3], [1; 3], 1), [1, 8, 4, 5, 6], [12, 8, 3, 3, 3]),
        ),
        (
            "grad groups 2, dilation and padding per axis",
            Operands::grad(
                params([1, 0, 2], [1, 2, 1], 2),
                [2, 16, 5, 6, 7],
                [6, 8, 3, 2, 3],
            ),
        ),
        (
            "grad kernel 1, batch 2",
            Operands::grad(params([0; 3], [1; 3], 1), [2, 9, 3, 4, 5], [10, 9, 1, 1, 1]),
        ),
        (
            "grad k3 no padding (flipped padding 2)",
            Operands::grad(params([0; 3], [1; 3], 1), [1, 8, 5, 5, 5], [8, 8, 3, 3, 3]),
        ),
        (
            "transpose k3 p1, bias",
            Operands::transpose(
                params([1; 3], [1; 3], 1),
                [0; 3],
                [1, 6, 3, 4, 5],
                [6, 8, 3, 3, 3],
            ),
        ),
        (
            "grad stride 2, padding 1",
            Operands::grad(
                params([1; 3], [1; 3], 1).with_stride([2; 3]),
                [1, 8, 7, 8, 9],
                [8, 8, 3, 3, 3],
            ),
        ),
        (
            "grad stride per axis, dilation, groups 2, rounded-down output",
            Operands::grad(
                params([0, 1, 2], [1, 2, 1], 2).with_stride([1, 2, 3]),
                [2, 16, 5, 8, 10],
                [4, 8, 2, 3, 3],
            ),
        ),
        (
            // HunyuanVideo's causal downsampler: padded outside, k3 s2,
            // the last input row of each axis read by no output point.
            "grad stride 2, no padding, unread last rows (HunyuanVideo)",
            Operands::grad(
                params([0; 3], [1; 3], 1).with_stride([2; 3]),
                [1, 8, 11, 10, 10],
                [8, 8, 3, 3, 3],
            ),
        ),
        (
            "grad stride 1 x 2 x 2, no padding (HunyuanVideo)",
            Operands::grad(
                params([0; 3], [1; 3], 1).with_stride([1, 2, 2]),
                [1, 8, 5, 10, 10],
                [8, 8, 3, 3, 3],
            ),
        ),
        (
            "transpose stride 2, output_padding 1, bias",
            Operands::transpose(
                params([1; 3], [1; 3], 1).with_stride([2; 3]),
                [1, 0, 1],
                [1, 6, 3, 4, 3],
                [6, 8, 3, 3, 3],
            ),
        ),
        (
            "transpose stride 1, output_padding 1 (dilation 2), bias",
            Operands::transpose(
                params([1; 3], [2; 3], 1),
                [1, 0, 1],
                [1, 6, 3, 4, 5],
                [6, 8, 3, 3, 3],
            ),
        ),
        (
            "transpose groups 2, dilation, bias",
            Operands::transpose(
                params([1, 1, 2], [1, 1, 2], 2),
                [0; 3],
                [1, 4, 3, 4, 4],
                [4, 8, 2, 3, 3],
            ),
        ),
    ]
}

/// The tiled tier serves every case (host and device entry points; f32
/// and bf16 operands; f32 and bf16 biases on the device), equal to the f64
/// reference; the vendor tier was skipped, nothing failed.
fn tiled_serves_data_and_transpose(dev: &Device) {
    let chain = chain(dev);
    for (name, ops) in served_cases() {
        for bf in [false, true] {
            let p = ops.problem(bf);
            let what = format!("{name} bf16={bf}");
            let (out, report) = chain.run_backward(&p).unwrap();
            assert_eq!(
                report.served_by(),
                Some(TierKind::Tiled),
                "{what}: {report}"
            );
            assert_eq!(report.failures().count(), 0, "{what}: {report}");
            assert_backward_close(&what, &p, &out, 1e-5);
            for bias_bf16 in [false, true] {
                if bias_bf16 && p.bias.is_none() {
                    continue;
                }
                let (r, got) = on_device(&chain, dev, (&p, ops.out_pad), bias_bf16);
                let report = r.unwrap();
                let what = format!("{what} device bias_bf16={bias_bf16}");
                assert_eq!(
                    report.served_by(),
                    Some(TierKind::Tiled),
                    "{what}: {report}"
                );
                if bias_bf16 {
                    // The reference with the bias rounded to bf16.
                    let b: Vec<f32> = to_bf16(ops.bias.as_deref().unwrap())
                        .iter()
                        .map(|v| v.to_f32())
                        .collect();
                    let q = Conv3dBackwardProblem::new(
                        p.op,
                        p.geometry,
                        p.grad_output,
                        p.other,
                        Some(Conv3dData::F32(&b)),
                    )
                    .unwrap();
                    assert_backward_close(&what, &q, &got, 1e-5);
                } else {
                    assert_backward_close(&what, &p, &got, 1e-5);
                }
            }
        }
    }
    let stats = chain.stats();
    assert!(stats[1].successes > 0, "{stats:?}");
    assert_eq!(
        stats[1].errors + stats[1].mismatches + stats[1].non_finite,
        0
    );
    assert_eq!(stats[2].attempts, 0, "the naive tier never ran: {stats:?}");
}

/// The tiled tier's attempt of a report: skipped with a reason holding
/// `why`.
fn assert_tiled_skipped(what: &str, report: &Conv3dReport, why: &str) {
    let tiled = &report.attempts[1];
    assert_eq!(tiled.kind, TierKind::Tiled, "{what}: {report}");
    assert!(
        matches!(&tiled.outcome, Outcome::Skipped(r) if r.contains(why)),
        "{what}: expected a skip for {why:?}: {report}"
    );
}

/// What the tiled tier refuses goes to the naive tier, the reason in the
/// report: the bias gradient, a weight gradient of fewer than 8 output
/// channels per group, a stride product above 8, a padding beyond
/// `dilation * (k - 1)`, fewer than 8 input channels per group.
fn refused_calls_go_to_the_naive_tier(dev: &Device) {
    let chain = chain(dev);
    let base = Operands::grad(params([1; 3], [1; 3], 1), [1, 8, 4, 5, 6], [12, 8, 3, 3, 3]);
    let with_op = |op| Operands::new(op, base.g, false, 51);
    let stride3 = {
        let g = Conv3dGeometry::new(
            params([1; 3], [1; 3], 1).with_stride([3, 3, 1]),
            &[1, 8, 4, 5, 6],
            &[12, 8, 3, 3, 3],
        )
        .unwrap();
        Operands::new(Conv3dBackwardOp::Data, g, false, 52)
    };
    let few_out = {
        let g = Conv3dGeometry::new(
            params([1; 3], [1; 3], 1),
            &[1, 8, 4, 5, 6],
            &[4, 8, 3, 3, 3],
        )
        .unwrap();
        Operands::new(Conv3dBackwardOp::Weight, g, false, 53)
    };
    let cases = [
        (
            "weight gradient of 4 output channels",
            few_out,
            "the tiled weight gradient: fewer than 8 output channels per group",
        ),
        (
            "bias gradient",
            with_op(Conv3dBackwardOp::Bias),
            "the bias gradient is a reduction of dy",
        ),
        ("stride 3 x 3 x 1", stride3, "a stride product above 8"),
        (
            "padding beyond the kernel's reach",
            Operands::grad(params([1; 3], [1; 3], 1), [1, 8, 4, 4, 4], [8, 8, 1, 1, 1]),
            "padding above",
        ),
        (
            "4 input channels per group",
            Operands::grad(params([1; 3], [1; 3], 2), [1, 8, 4, 4, 4], [8, 4, 3, 3, 3]),
            "fewer than 8 output channels per group",
        ),
    ];
    for (name, ops, why) in cases {
        for bf in [false, true] {
            let p = ops.problem(bf);
            let what = format!("{name} bf16={bf}");
            let (out, report) = chain.run_backward(&p).unwrap();
            assert_eq!(
                report.served_by(),
                Some(TierKind::Naive),
                "{what}: {report}"
            );
            assert_tiled_skipped(&what, &report, why);
            assert_backward_close(&what, &p, &out, 1e-5);
            if p.op == Conv3dBackwardOp::Bias {
                continue;
            }
            let (r, got) = on_device(&chain, dev, (&p, ops.out_pad), false);
            let report = r.unwrap();
            assert_eq!(
                report.served_by(),
                Some(TierKind::Naive),
                "{what}: {report}"
            );
            assert_tiled_skipped(&what, &report, why);
            assert_backward_close(&format!("{what} (device)"), &p, &got, 1e-5);
        }
    }
    assert_eq!(chain.stats()[1].attempts, 0);
}

/// One fault (`kind`, on its first operation) in the tiled tier's path:
/// the tiled tier fails as `check` says, the naive tier serves the right
/// result; host and device paths, f32 and bf16.
fn tiled_fault_falls_to_naive(open: Open<'_>, kind: FaultKind, check: &dyn Fn(&Failure) -> bool) {
    let ops = Operands::transpose(
        params([1; 3], [1; 3], 1),
        [0; 3],
        [1, 6, 3, 4, 5],
        [6, 8, 3, 3, 3],
    );
    tiled_fault_falls_to_naive_on(open, &ops, kind, check);
}

/// [`tiled_fault_falls_to_naive`] on `ops`.
fn tiled_fault_falls_to_naive_on(
    open: Open<'_>,
    ops: &Operands,
    kind: FaultKind,
    check: &dyn Fn(&Failure) -> bool,
) {
    common::conv3d_backward::tiled_fault_falls_to_naive(
        open,
        kind,
        check,
        &|bf| ops.problem(bf),
        &|chain, dev, p| on_device(chain, dev, (p, ops.out_pad), false),
    );
}

fn flip_launch_failure_falls_to_naive(open: Open<'_>) {
    let kind = FaultKind::Conv3dBackwardLaunchFailure;
    tiled_fault_falls_to_naive(open, kind, &launch_failed("conv3d_flip_weight"));
}

fn flip_garbage_is_a_mismatch(open: Open<'_>) {
    tiled_fault_falls_to_naive(open, FaultKind::Conv3dBackwardWritesGarbage, &mismatched);
}

fn flip_nan_is_caught(open: Open<'_>) {
    tiled_fault_falls_to_naive(open, FaultKind::Conv3dBackwardWritesNonFinite, &nan_caught);
}

/// The zero insertion failing, or writing garbage (a strided transposed
/// convolution: the insertion is its first backward kernel).
fn zero_insert_faults_fall_to_naive(open: Open<'_>) {
    let ops = Operands::transpose(
        params([1; 3], [1; 3], 1).with_stride([2; 3]),
        [1, 0, 1],
        [1, 6, 3, 4, 3],
        [6, 8, 3, 3, 3],
    );
    let kind = FaultKind::Conv3dBackwardLaunchFailure;
    tiled_fault_falls_to_naive_on(open, &ops, kind, &|f| {
        matches!(
            f,
            Failure::Error(Error::InjectedFault {
                fault: FaultKind::Conv3dBackwardLaunchFailure,
                op: "conv3d_zero_insert"
            })
        )
    });
    let kind = FaultKind::Conv3dBackwardWritesGarbage;
    tiled_fault_falls_to_naive_on(open, &ops, kind, &|f| {
        matches!(f, Failure::ValueMismatch { .. })
    });
}

/// The tiled kernel itself failing in the backward path.
fn tiled_kernel_failure_falls_to_naive(open: Open<'_>) {
    let kind = FaultKind::Conv3dLaunchFailure;
    tiled_fault_falls_to_naive(open, kind, &|f| {
        matches!(
            f,
            Failure::Error(Error::InjectedFault {
                fault: FaultKind::Conv3dLaunchFailure,
                op: "conv3d"
            })
        )
    });
}

/// `Conv3dOps::flip_weight` (f32 and bf16) writes
/// `W'[g*Cg + c, k, a, b, e] = W[g*Kg + k, c, KD-1-a, KH-1-b, KW-1-e]`,
/// computed here index by index; refuses wrong lengths.
fn flip_kernel_matches_the_index_formula(dev: &Device) {
    let (gr, cg, kg, [kd, kh, kw]) = (3, 2, 4, [3, 2, 4]);
    let g = Conv3dGeometry::new(
        Conv3dParams::default().with_groups(gr),
        &[1, gr * cg, 5, 5, 5],
        &[gr * kg, cg, kd, kh, kw],
    )
    .unwrap();
    let n: usize = g.weight_shape().iter().product();
    let w = values(n, 61);
    let mut want = vec![0f32; n];
    for grp in 0..gr {
        for c in 0..cg {
            for k in 0..kg {
                for a in 0..kd {
                    for b in 0..kh {
                        for e in 0..kw {
                            let dst = (((((grp * cg + c) * kg + k) * kd + a) * kh) + b) * kw + e;
                            let src = (((((grp * kg + k) * cg + c) * kd + (kd - 1 - a)) * kh)
                                + (kh - 1 - b))
                                * kw
                                + (kw - 1 - e);
                            want[dst] = w[src];
                        }
                    }
                }
            }
        }
    }
    let s = dev.stream().unwrap();
    let wd = s.clone_htod(&w).unwrap();
    let mut out = s.alloc_zeros::<f32>(n).unwrap();
    s.conv3d_ops()
        .flip_weight(&g, &wd.view(), &mut out.view_mut())
        .unwrap();
    assert_eq!(out.to_vec().unwrap(), want);
    let wb = to_bf16(&w);
    let wbd = s.clone_htod(&wb).unwrap();
    let mut outb = s.alloc_zeros::<bf16>(n).unwrap();
    s.conv3d_ops()
        .flip_weight(&g, &wbd.view(), &mut outb.view_mut())
        .unwrap();
    assert_eq!(outb.to_vec().unwrap(), to_bf16(&want));
    let mut short = s.alloc_zeros::<f32>(n - 1).unwrap();
    let e = s
        .conv3d_ops()
        .flip_weight(&g, &wd.view(), &mut short.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
}

/// `Conv3dOps::zero_insert` (f32 and bf16) writes `dy[n, k, z/sd,
/// y/sh, x/sw]` at multiples of the stride inside `dy`, zero elsewhere,
/// computed here index by index; refuses a destination too small for the
/// stride.
fn zero_insert_kernel_matches_the_index_formula(dev: &Device) {
    let g = Conv3dGeometry::new(
        params([1, 0, 1], [1; 3], 1).with_stride([2, 3, 1]),
        &[2, 3, 7, 8, 5],
        &[4, 3, 3, 2, 3],
    )
    .unwrap();
    let [od, oh, ow] = g.output;
    let expanded = [(od - 1) * 2 + 2, (oh - 1) * 3 + 1, ow + 1];
    let planes = g.batch * g.out_channels;
    let zvol: usize = expanded.iter().product();
    let dy = values(g.output_len(), 71);
    let mut want = vec![0f32; planes * zvol];
    for nk in 0..planes {
        for z in 0..expanded[0] {
            for y in 0..expanded[1] {
                for x in 0..expanded[2] {
                    let hit = z % 2 == 0 && y % 3 == 0 && z / 2 < od && y / 3 < oh && x < ow;
                    if hit {
                        let at = ((nk * expanded[0] + z) * expanded[1] + y) * expanded[2] + x;
                        want[at] = dy[((nk * od + z / 2) * oh + y / 3) * ow + x];
                    }
                }
            }
        }
    }
    let s = dev.stream().unwrap();
    let dyd = s.clone_htod(&dy).unwrap();
    // Filled with garbage first: every element is written.
    let mut out = s.clone_htod(&vec![7f32; want.len()]).unwrap();
    s.conv3d_ops()
        .zero_insert(&g, expanded, &dyd.view(), &mut out.view_mut())
        .unwrap();
    assert_eq!(out.to_vec().unwrap(), want);
    let dyb = to_bf16(&dy);
    let dybd = s.clone_htod(&dyb).unwrap();
    let mut outb = s.clone_htod(&vec![bf16::ONE; want.len()]).unwrap();
    s.conv3d_ops()
        .zero_insert(&g, expanded, &dybd.view(), &mut outb.view_mut())
        .unwrap();
    assert_eq!(outb.to_vec().unwrap(), to_bf16(&want));
    let small = [(od - 1) * 2, expanded[1], expanded[2]];
    let mut o2 = s
        .alloc_zeros::<f32>(planes * small.iter().product::<usize>())
        .unwrap();
    let e = s
        .conv3d_ops()
        .zero_insert(&g, small, &dyd.view(), &mut o2.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::Conv3dParam { .. }), "{e}");
}

/// Wan 2.1 VAE-sized calls on a GPU: the input gradient of a 96 -> 96
/// k3 p1 convolution of a 1x96x5x40x52 input, the transposed convolution
/// of that shape with a bias, and a stride-2 transposed convolution (96
/// channels, 1x96x3x20x26 to 1x96x6x40x52, output_padding 1: zero
/// insertion), f32 and bf16, host and device entry points: served by the tiled tier, equal to the f64 reference at
/// 4096 sampled points. Prints the device path's time next to the naive
/// tier's (informational).
fn wan_vae_like_data_and_transpose(dev: &Device) {
    let tiled = chain(dev);
    let mut naive = chain(dev);
    naive.options_mut().forbid = vec![TierKind::Tiled];
    let shape = [1, 96, 5, 40, 52];
    let w = [96, 96, 3, 3, 3];
    let cases = [
        (
            "wan grad",
            Operands::grad(params([1; 3], [1; 3], 1), shape, w),
        ),
        (
            "wan transpose",
            Operands::transpose(params([1; 3], [1; 3], 1), [0; 3], shape, w),
        ),
        (
            "wan transpose stride 2",
            Operands::transpose(
                params([1; 3], [1; 3], 1).with_stride([2; 3]),
                [1; 3],
                [1, 96, 3, 20, 26],
                w,
            ),
        ),
    ];
    for (name, ops) in cases {
        for bf in [false, true] {
            let p = ops.problem(bf);
            let what = format!("{name} bf16={bf}");
            let (out, report) = tiled.run_backward(&p).unwrap();
            assert_eq!(
                report.served_by(),
                Some(TierKind::Tiled),
                "{what}: {report}"
            );
            assert_sampled_close(&what, &p, &out);
            let (r, got) = on_device(&tiled, dev, (&p, ops.out_pad), false);
            let report = r.unwrap();
            assert_eq!(
                report.served_by(),
                Some(TierKind::Tiled),
                "{what}: {report}"
            );
            assert_sampled_close(&format!("{what} (device)"), &p, &got);
            let time = |c: &Conv3dChain| {
                let t = std::time::Instant::now();
                let (r, _) = on_device(c, dev, (&p, ops.out_pad), false);
                r.unwrap();
                t.elapsed()
            };
            let (t_tiled, t_naive) = (time(&tiled), time(&naive));
            eprintln!("{what}: tiled tier {t_tiled:?}, naive tier {t_naive:?} (device path, with checks and copies)");
        }
    }
}

/// `out` equals the f64 reference of `p` at 4096 seeded points, within
/// 1e-4 of each point's magnitude.
fn assert_sampled_close(what: &str, p: &Conv3dBackwardProblem<'_>, out: &[f32]) {
    assert_eq!(out.len(), p.output_len(), "{what}");
    for j in 0..4096 {
        let Some(i) = sample_index(out.len(), 99, j) else {
            continue;
        };
        let r = backward_reference_point(p, i).unwrap();
        let tol = 1e-4 * r.magnitude + 1e-30;
        assert!(
            (f64::from(out[i]) - r.value).abs() <= tol,
            "{what}: index {i}: got {}, expected {} (tolerance {tol:e})",
            out[i],
            r.value
        );
    }
}

per_device!(
    tiled_serves_data_and_transpose,
    refused_calls_go_to_the_naive_tier,
    flip_launch_failure_falls_to_naive,
    flip_garbage_is_a_mismatch,
    flip_nan_is_caught,
    tiled_kernel_failure_falls_to_naive,
    zero_insert_faults_fall_to_naive,
    flip_kernel_matches_the_index_formula,
    zero_insert_kernel_matches_the_index_formula;
    gpu_only: wan_vae_like_data_and_transpose,
);
