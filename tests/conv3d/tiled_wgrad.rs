//! The tiled tier's weight gradient: `conv3d_bwd_weight_tiled_*`, an
//! implicit GEMM per group on 64 x 64 tiles of `dw` with the reduction over
//! the batch and the output volume split into chunks whose partial tiles
//! are added into the zeroed result with float atomics
//! (`Conv3dOps::backward_weight_tiled`).
//!
//! The kernel called directly (its result overwrites whatever the buffer
//! held: the zeroing is part of the call) against the f64 reference and
//! the naive kernel, and its refusals; the chain's tiled tier serving the
//! weight gradient (f32 and bf16, groups, strides, dilation, padding, a
//! padding beyond the kernel's reach, output channels not a multiple of
//! 64), on the host (`run_backward`) and on device memory, equal to the
//! f64 reference; what it refuses (fewer than 8 output channels per group)
//! going to the naive tier with the reason in the report; faults in the
//! kernel (launch failure, garbage, a NaN) falling to the naive tier. Each
//! runs on the host backend here (whose "kernel" is the CPU's) and, with
//! `--include-ignored`, on a CUDA or HIP device; the Wan-VAE-sized shape
//! and a long split reduction run on a GPU only.

use crate::common;
use common::conv3d::values;
use common::conv3d_backward::{
    assert_backward_close, chain, launch_failed, mismatched, nan_caught, run_on_device, to_bf16,
};
use common::Open;
use half::bf16;
use rocm_safe::conv3d::{
    backward_reference_point, sample_index, Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dData,
    Conv3dGeometry, Conv3dParams,
};
use rocm_safe::conv3d_chain::{Conv3dChain, Conv3dReport, TierKind};
use rocm_safe::device::faults::FaultKind;
use rocm_safe::device::{raw::tiled_wgrad_split, Device};
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::Error;

/// The operands of a weight gradient: the forward input and `dy`, f32 and
/// bf16.
struct Wgrad {
    g: Conv3dGeometry,
    x: Vec<f32>,
    dy: Vec<f32>,
    xb: Vec<bf16>,
    dyb: Vec<bf16>,
}

impl Wgrad {
    fn new(params: Conv3dParams, input: [usize; 5], weight: [usize; 5], salt: u64) -> Wgrad {
        let g = Conv3dGeometry::new(params, &input, &weight).unwrap();
        let x = values(input.iter().product(), salt);
        let dy = values(g.output_len(), salt + 1);
        Wgrad {
            g,
            xb: to_bf16(&x),
            dyb: to_bf16(&dy),
            x,
            dy,
        }
    }

    fn problem(&self, bf: bool) -> Conv3dBackwardProblem<'_> {
        let (dy, x) = if bf {
            (Conv3dData::BF16(&self.dyb), Conv3dData::BF16(&self.xb))
        } else {
            (Conv3dData::F32(&self.dy), Conv3dData::F32(&self.x))
        };
        Conv3dBackwardProblem::new(Conv3dBackwardOp::Weight, self.g, dy, Some(x), None).unwrap()
    }
}

fn params(stride: [usize; 3], dilation: [usize; 3], padding: [usize; 3]) -> Conv3dParams {
    Conv3dParams::default()
        .with_stride(stride)
        .with_dilation(dilation)
        .with_padding(padding)
}

/// Weight gradients the tiled tier takes: padding, groups with strides
/// and dilation, output channels not a multiple of 64 (two row tiles),
/// a 1x1x1 kernel with stride 3, a padding beyond the kernel's reach,
/// a batch of 3 (the reduction crosses samples).
fn cases() -> Vec<(&'static str, Wgrad)> {
    vec![
        (
            "k3 pad 1",
            Wgrad::new(
                params([1; 3], [1; 3], [1; 3]),
                [2, 8, 4, 5, 6],
                [8, 8, 3, 3, 3],
                1,
            ),
        ),
        (
            "groups 2, stride, dilation",
            Wgrad::new(
                params([2, 1, 2], [1, 2, 1], [1, 1, 0]).with_groups(2),
                [1, 16, 6, 7, 8],
                [16, 8, 3, 2, 3],
                3,
            ),
        ),
        (
            "70 output channels, uneven padding",
            Wgrad::new(
                params([1; 3], [1; 3], [1, 0, 2]),
                [2, 12, 5, 9, 11],
                [70, 12, 3, 3, 3],
                5,
            ),
        ),
        (
            "1x1x1 stride 3, batch 3",
            Wgrad::new(
                params([3; 3], [1; 3], [0; 3]),
                [3, 9, 7, 7, 7],
                [10, 9, 1, 1, 1],
                7,
            ),
        ),
        (
            "padding beyond the kernel",
            Wgrad::new(
                params([1; 3], [1; 3], [1; 3]),
                [1, 8, 3, 4, 4],
                [8, 8, 1, 1, 1],
                9,
            ),
        ),
    ]
}

/// The chain serves every case by its tiled tier, host and device paths,
/// f32 and bf16, equal to the f64 reference everywhere.
fn tiled_serves_the_weight_gradient(dev: &Device) {
    let chain = chain(dev);
    for (name, w) in cases() {
        for bf in [false, true] {
            let p = w.problem(bf);
            let what = format!("{name} bf16={bf}");
            let (out, report) = chain.run_backward(&p).unwrap();
            assert_eq!(
                report.served_by(),
                Some(TierKind::Tiled),
                "{what}: {report}"
            );
            assert_backward_close(&what, &p, &out, 1e-5);
            let (r, got) = run_on_device(&chain, dev, &p);
            let report = r.unwrap();
            assert_eq!(
                report.served_by(),
                Some(TierKind::Tiled),
                "{what} (device): {report}"
            );
            assert_backward_close(&format!("{what} (device)"), &p, &got, 1e-5);
        }
    }
    let stats = chain.stats();
    assert!(stats[1].successes > 0 && stats[1].errors + stats[1].mismatches == 0);
    assert_eq!(stats[2].attempts, 0, "the naive tier never runs");
}

/// `Conv3dOps::backward_weight_tiled` on a buffer full of garbage:
/// the result is the f64 reference's (the call zeroes it first) and the
/// naive kernel's within f32 rounding; refusals: too few output channels
/// per group, a result of the wrong length.
fn direct_kernel_matches_the_reference(dev: &Device) {
    let s = dev.stream().unwrap();
    for (name, w) in cases() {
        for bf in [false, true] {
            let p = w.problem(bf);
            let what = format!("{name} bf16={bf}");
            let n = p.output_len();
            let mut dw = s.clone_htod(&vec![7f32; n]).unwrap();
            let mut naive = s.alloc_zeros::<f32>(n).unwrap();
            if bf {
                let x = s.clone_htod(&w.xb).unwrap();
                let dy = s.clone_htod(&w.dyb).unwrap();
                s.conv3d_ops()
                    .backward_weight_tiled(&w.g, &x.view(), &dy.view(), &mut dw.view_mut())
                    .unwrap();
                s.conv3d_ops()
                    .backward_weight(&w.g, &x.view(), &dy.view(), &mut naive.view_mut())
                    .unwrap();
            } else {
                let x = s.clone_htod(&w.x).unwrap();
                let dy = s.clone_htod(&w.dy).unwrap();
                s.conv3d_ops()
                    .backward_weight_tiled(&w.g, &x.view(), &dy.view(), &mut dw.view_mut())
                    .unwrap();
                s.conv3d_ops()
                    .backward_weight(&w.g, &x.view(), &dy.view(), &mut naive.view_mut())
                    .unwrap();
            }
            let (got, naive) = (dw.to_vec().unwrap(), naive.to_vec().unwrap());
            assert_backward_close(&what, &p, &got, 1e-5);
            for (i, (a, b)) in got.iter().zip(&naive).enumerate() {
                let tol = 2e-5 * backward_reference_point(&p, i).unwrap().magnitude + 1e-30;
                assert!(
                    f64::from((a - b).abs()) <= tol,
                    "{what}: index {i}: tiled {a}, naive {b}"
                );
            }
        }
    }
    // Depthwise: one output channel per group.
    let w = Wgrad::new(
        params([1; 3], [1; 3], [1; 3]).with_groups(8),
        [1, 8, 3, 4, 5],
        [8, 1, 3, 3, 3],
        11,
    );
    let x = s.clone_htod(&w.x).unwrap();
    let dy = s.clone_htod(&w.dy).unwrap();
    let mut dw = s.alloc_zeros::<f32>(8 * 27).unwrap();
    let e = s
        .conv3d_ops()
        .backward_weight_tiled(&w.g, &x.view(), &dy.view(), &mut dw.view_mut())
        .unwrap_err();
    assert!(
        matches!(e, Error::Conv3dTier { tier: "tiled", reason } if reason.contains("fewer than 8 output channels")),
        "{e}"
    );
    assert!(tiled_wgrad_split(&w.g, 1).is_err());
    let w = &cases()[0].1;
    let x = s.clone_htod(&w.x).unwrap();
    let dy = s.clone_htod(&w.dy).unwrap();
    let mut short = s.alloc_zeros::<f32>(5).unwrap();
    let e = s
        .conv3d_ops()
        .backward_weight_tiled(&w.g, &x.view(), &dy.view(), &mut short.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
}

/// A weight gradient of fewer than 8 output channels per group goes to the
/// naive tier, the reason in the report; host and device paths.
fn refused_weight_gradients_go_to_naive(dev: &Device) {
    let chain = chain(dev);
    let cases = [
        (
            "depthwise",
            Wgrad::new(
                params([1; 3], [1; 3], [1; 3]).with_groups(8),
                [1, 8, 3, 4, 5],
                [8, 1, 3, 3, 3],
                13,
            ),
        ),
        (
            "4 output channels",
            Wgrad::new(
                params([1; 3], [1; 3], [0; 3]),
                [1, 16, 3, 4, 5],
                [4, 16, 2, 2, 2],
                15,
            ),
        ),
    ];
    for (name, w) in cases {
        for bf in [false, true] {
            let p = w.problem(bf);
            let what = format!("{name} bf16={bf}");
            let (out, report) = chain.run_backward(&p).unwrap();
            assert_naive_after_tiled_skip(&what, &report);
            assert_backward_close(&what, &p, &out, 1e-5);
            let (r, got) = run_on_device(&chain, dev, &p);
            assert_naive_after_tiled_skip(&format!("{what} (device)"), &r.unwrap());
            assert_backward_close(&format!("{what} (device)"), &p, &got, 1e-5);
        }
    }
    assert_eq!(chain.stats()[1].attempts, 0);
}

fn assert_naive_after_tiled_skip(what: &str, report: &Conv3dReport) {
    assert_eq!(
        report.served_by(),
        Some(TierKind::Naive),
        "{what}: {report}"
    );
    let tiled = &report.attempts[1];
    assert_eq!(tiled.kind, TierKind::Tiled, "{what}: {report}");
    assert!(
        matches!(&tiled.outcome, Outcome::Skipped(r)
            if r.contains("the tiled weight gradient: fewer than 8 output channels per group")
                && r.contains("naive tier serves")),
        "{what}: {report}"
    );
}

/// One fault (`kind`, on the first backward kernel: the tiled one) fails
/// the tiled tier as `check` says; the naive tier serves the right result.
/// Host and device paths, f32 and bf16.
fn wgrad_fault_falls_to_naive(open: Open<'_>, kind: FaultKind, check: &dyn Fn(&Failure) -> bool) {
    let w = &cases()[1].1;
    common::conv3d_backward::tiled_fault_falls_to_naive(
        open,
        kind,
        check,
        &|bf| w.problem(bf),
        &|chain, dev, p| run_on_device(chain, dev, p),
    );
}

fn wgrad_launch_failure_falls_to_naive(open: Open<'_>) {
    let kind = FaultKind::Conv3dBackwardLaunchFailure;
    wgrad_fault_falls_to_naive(open, kind, &launch_failed("conv3d_backward_weight_tiled"));
}

fn wgrad_garbage_is_a_mismatch(open: Open<'_>) {
    wgrad_fault_falls_to_naive(open, FaultKind::Conv3dBackwardWritesGarbage, &mismatched);
}

fn wgrad_nan_is_caught(open: Open<'_>) {
    wgrad_fault_falls_to_naive(open, FaultKind::Conv3dBackwardWritesNonFinite, &nan_caught);
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

/// The tiled and the naive weight-gradient kernels on `w`'s operands on the
/// device, each the median of 5 timed runs after a warm-up (stream
/// synchronized around each): printed, informational.
fn time_kernels(what: &str, dev: &Device, w: &Wgrad, bf: bool) {
    let s = dev.stream().unwrap();
    let n: usize = w.g.weight_shape().iter().product();
    let mut dw = s.alloc_zeros::<f32>(n).unwrap();
    let (xf, dyf) = (s.clone_htod(&w.x).unwrap(), s.clone_htod(&w.dy).unwrap());
    let (xb, dyb) = (s.clone_htod(&w.xb).unwrap(), s.clone_htod(&w.dyb).unwrap());
    let mut run = |tiled: bool| {
        let mut out = dw.view_mut();
        let r = match (bf, tiled) {
            (false, true) => {
                s.conv3d_ops()
                    .backward_weight_tiled(&w.g, &xf.view(), &dyf.view(), &mut out)
            }
            (false, false) => {
                s.conv3d_ops()
                    .backward_weight(&w.g, &xf.view(), &dyf.view(), &mut out)
            }
            (true, true) => {
                s.conv3d_ops()
                    .backward_weight_tiled(&w.g, &xb.view(), &dyb.view(), &mut out)
            }
            (true, false) => {
                s.conv3d_ops()
                    .backward_weight(&w.g, &xb.view(), &dyb.view(), &mut out)
            }
        };
        r.unwrap();
        s.synchronize().unwrap();
    };
    let mut median = |tiled: bool| {
        run(tiled);
        let mut t: Vec<_> = (0..5)
            .map(|_| {
                let t0 = std::time::Instant::now();
                run(tiled);
                t0.elapsed()
            })
            .collect();
        t.sort();
        t[2]
    };
    let (t_tiled, t_naive) = (median(true), median(false));
    let split = tiled_wgrad_split(&w.g, dev.info().multiprocessors).unwrap();
    eprintln!(
        "{what}: tiled kernel {t_tiled:?} (grid {:?}, chunk {}), naive kernel {t_naive:?}",
        split.grid, split.chunk
    );
}

/// A Wan 2.1 VAE-sized weight gradient on a GPU: `x` 1x96x5x40x52, `dy`
/// of a 96 -> 96 k3 pad 1 convolution, f32 and bf16, host and device entry
/// points: served by the tiled tier, equal to the f64 reference at 4096
/// sampled points; two runs agree within f32 rounding (not bit for bit:
/// split-K atomics). Prints the tiled and naive kernel times and the
/// chain's device-path times (informational).
fn wan_vae_like_weight_gradient(dev: &Device) {
    let tiled = chain(dev);
    let mut naive = chain(dev);
    naive.options_mut().forbid = vec![TierKind::Vendor, TierKind::Tiled];
    let w = Wgrad::new(
        params([1; 3], [1; 3], [1; 3]),
        [1, 96, 5, 40, 52],
        [96, 96, 3, 3, 3],
        21,
    );
    wgrad_on_gpu("wan wgrad", dev, (&tiled, &naive), &w);
}

/// A long reduction split into many chunks on a GPU (batch 4 of 32 x 8 x
/// 24 x 24, 32 -> 16 channels in 2 groups: few tiles, so the split count
/// is high and chunks cross samples), as [`wan_vae_like_weight_gradient`].
fn long_reduction_many_chunks(dev: &Device) {
    let tiled = chain(dev);
    let mut naive = chain(dev);
    naive.options_mut().forbid = vec![TierKind::Vendor, TierKind::Tiled];
    let w = Wgrad::new(
        params([1; 3], [1; 3], [1; 3]).with_groups(2),
        [4, 32, 8, 24, 24],
        [16, 16, 3, 3, 3],
        23,
    );
    let mps = dev.info().multiprocessors;
    let split = tiled_wgrad_split(&w.g, mps).unwrap();
    let blocks: u64 = split.grid.iter().map(|&v| u64::from(v)).product();
    assert!(
        split.grid[2] > 1 && blocks >= 4 * u64::from(mps),
        "{split:?} on {mps} multiprocessors"
    );
    wgrad_on_gpu("long reduction", dev, (&tiled, &naive), &w);
}

fn wgrad_on_gpu(name: &str, dev: &Device, (tiled, naive): (&Conv3dChain, &Conv3dChain), w: &Wgrad) {
    for bf in [false, true] {
        let p = w.problem(bf);
        let what = format!("{name} bf16={bf}");
        let (out, report) = tiled.run_backward(&p).unwrap();
        assert_eq!(
            report.served_by(),
            Some(TierKind::Tiled),
            "{what}: {report}"
        );
        assert_sampled_close(&what, &p, &out);
        let (r, got) = run_on_device(tiled, dev, &p);
        let report = r.unwrap();
        assert_eq!(
            report.served_by(),
            Some(TierKind::Tiled),
            "{what} (device): {report}"
        );
        assert_sampled_close(&format!("{what} (device)"), &p, &got);
        for j in 0..4096 {
            if let Some(i) = sample_index(out.len(), 5, j) {
                let m = backward_reference_point(&p, i).unwrap().magnitude;
                assert!(
                    f64::from((out[i] - got[i]).abs()) <= 1e-5 * m + 1e-30,
                    "{what}: two runs differ at {i}: {} vs {}",
                    out[i],
                    got[i]
                );
            }
        }
        let time = |c: &Conv3dChain| {
            let t = std::time::Instant::now();
            let (r, _) = run_on_device(c, dev, &p);
            let report = r.unwrap();
            (t.elapsed(), report.served_by())
        };
        let (t_tiled, by_tiled) = time(tiled);
        let (t_naive, by_naive) = time(naive);
        assert_eq!(by_tiled, Some(TierKind::Tiled));
        assert_eq!(by_naive, Some(TierKind::Naive));
        eprintln!(
            "{what}: tiled tier {t_tiled:?}, naive tier {t_naive:?} (device path, with checks and copies)"
        );
        time_kernels(&what, dev, w, bf);
    }
}

per_device!(
    tiled_serves_the_weight_gradient,
    direct_kernel_matches_the_reference,
    refused_weight_gradients_go_to_naive,
    wgrad_launch_failure_falls_to_naive,
    wgrad_garbage_is_a_mismatch,
    wgrad_nan_is_caught;
    gpu_only: wan_vae_like_weight_gradient,
    long_reduction_many_chunks,
);
