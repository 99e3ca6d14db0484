//! Issue 21: the chain over device memory checks on the device.
//!
//! `Conv3dChain::run_device` copies no operand or output to the host while
//! a GPU tier of the stream's device serves: the sampled f64 points and the
//! non-finite scan run on the device and come back in one small copy. These
//! tests make every failure path of those checks happen (wrong finite
//! values, NaN from finite inputs, overflow, non-finite inputs, a check
//! that cannot run), check the check and layout kernels themselves against
//! the host's f64 reference, and count the copies. Each runs on the host
//! backend here and, with `--include-ignored`, on a CUDA or HIP device.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::conv3d::{assert_close, cases, Case, Data};
use common::Open;
use half::bf16;
use rocm_safe::conv3d::{reference_point, sample_index, Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::conv3d_chain::{Conv3dChain, Conv3dReport, DeviceConv3dData, TierKind};
use rocm_safe::device::faults::{FaultHandle, FaultKind, FaultPlan, FaultRule, Faults, When};
use rocm_safe::device::{
    Backend, CheckedPoint, Conv3dKernel, Conv3dWeightLayout, CopyOp, Device, Driver, RawStream,
    Stream, Wrap, CHECK_WORDS,
};
use rocm_safe::fallback::Failure;
use rocm_safe::{Error, Result};

fn faulty(open: Open<'_>, rules: &[(FaultKind, When)]) -> (Device, FaultHandle) {
    let plan = FaultPlan {
        seed: 7,
        rules: rules
            .iter()
            .map(|&(kind, when)| FaultRule { kind, when })
            .collect(),
    };
    let (f, h) = Faults::new(open(), plan);
    (Device::from_backend(Box::new(f)), h)
}

/// A case the tiled kernel takes (16 output channels, stride, dilation).
fn tiled_case() -> (Case, Data) {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "tiled: stride 2, dilation, 16 out")
        .unwrap();
    let data = Data::new(&case);
    (case, data)
}

/// The chain of `dev` without its vendor tier (so the tiled kernel runs
/// first on every backend).
fn chain(dev: &Device) -> Conv3dChain {
    let mut c = Conv3dChain::for_device(dev);
    c.options_mut().forbid = vec![TierKind::Vendor];
    c
}

/// The operands of one call uploaded to `s` (bias as f32 or bf16).
struct Uploaded {
    x: DeviceData,
    w: DeviceData,
    b: Option<DeviceData>,
}

enum DeviceData {
    F32(rocm_safe::device::DeviceBuffer<f32>),
    BF16(rocm_safe::device::DeviceBuffer<bf16>),
}

impl DeviceData {
    fn f32(s: &Stream, v: &[f32]) -> DeviceData {
        DeviceData::F32(s.clone_htod(v).unwrap())
    }
    fn bf16(s: &Stream, v: &[bf16]) -> DeviceData {
        DeviceData::BF16(s.clone_htod(v).unwrap())
    }
    fn data(&self) -> DeviceConv3dData<'_> {
        match self {
            DeviceData::F32(b) => DeviceConv3dData::F32(b.view()),
            DeviceData::BF16(b) => DeviceConv3dData::BF16(b.view()),
        }
    }
}

fn upload(s: &Stream, p: &Conv3dProblem<'_>, bias_bf16: bool) -> Uploaded {
    let up = |d: Conv3dData<'_>| match d {
        Conv3dData::F32(v) => DeviceData::f32(s, v),
        Conv3dData::BF16(v) => DeviceData::bf16(s, v),
        other => panic!("no upload for {other:?}"),
    };
    let b = p.bias.map(|b| match b {
        Conv3dData::F32(v) if bias_bf16 => {
            let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            DeviceData::bf16(s, &h)
        }
        other => up(other),
    });
    Uploaded {
        x: up(p.input),
        w: up(p.weight),
        b,
    }
}

/// `run_device` of `p` on a new stream of `dev`: the report or error and
/// the output read back.
fn run_device(
    chain: &Conv3dChain,
    dev: &Device,
    p: &Conv3dProblem<'_>,
    u: &Uploaded,
) -> (Result<Conv3dReport>, Vec<f32>) {
    let s = dev.stream().unwrap();
    let g = p.geometry;
    let mut out = s.alloc_zeros::<f32>(g.output_len()).unwrap();
    let r = chain.run_device(
        &s,
        g.params,
        u.x.data(),
        &g.input_shape(),
        u.w.data(),
        &g.weight_shape(),
        u.b.as_ref().map(DeviceData::data),
        &mut out.view_mut(),
    );
    (r, out.to_vec().unwrap())
}

/// The problem with its bias rounded to bf16 (what a bf16 bias holds).
fn with_bf16_bias<'a>(p: &Conv3dProblem<'a>, b: &'a [bf16]) -> Conv3dProblem<'a> {
    Conv3dProblem {
        bias: Some(Conv3dData::BF16(b)),
        ..*p
    }
}

/// Every dtype and bias kind through the device chain: the tiled kernel
/// serves, the output is the f64 reference's within f32 accumulation.
fn device_chain_serves_every_dtype_and_bias(dev: &Device) {
    let (case, data) = tiled_case();
    let chain = chain(dev);
    let hb: Vec<bf16> = data.b.iter().map(|&v| bf16::from_f32(v)).collect();
    for bf16_in in [false, true] {
        for bias_bf16 in [false, true] {
            let p = data.problem(&case, bf16_in);
            let s = dev.stream().unwrap();
            let u = upload(&s, &p, bias_bf16);
            let (r, out) = run_device(&chain, dev, &p, &u);
            let report = r.unwrap();
            assert_eq!(report.served_by(), Some(TierKind::Tiled), "{report}");
            assert_eq!(report.failures().count(), 0, "{report}");
            let expect = if bias_bf16 {
                with_bf16_bias(&p, &hb)
            } else {
                p
            };
            assert_close("device chain", &expect, &out, 1e-5);
        }
    }
}

/// A tier that returns finite but wrong values is caught by the sampled
/// points (ValueMismatch), and the next tier serves.
fn wrong_finite_values_fail_the_tier(open: Open<'_>) {
    for kind in [FaultKind::Conv3dWritesGarbage, FaultKind::Conv3dWritesZeros] {
        let (case, data) = tiled_case();
        let (dev, h) = faulty(open, &[(kind, When::Nth(0))]);
        let chain = chain(&dev);
        let p = data.problem(&case, false);
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, false);
        let (r, out) = run_device(&chain, &dev, &p, &u);
        let report = r.unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
        let failures: Vec<_> = report.failures().collect();
        assert_eq!(failures.len(), 1, "{report}");
        assert_eq!(failures[0].0.kind, TierKind::Tiled);
        assert!(
            matches!(failures[0].1, Failure::ValueMismatch { got, expected, tolerance, .. }
                if got.is_finite() && (f64::from(*got) - expected).abs() > *tolerance),
            "{kind}: {report}"
        );
        assert_eq!(h.injected().len(), 1);
        assert_close("naive after a wrong tiled output", &p, &out, 1e-5);
        let stats = chain.stats();
        assert_eq!((stats[1].mismatches, stats[2].successes), (1, 1));
    }
}

/// A NaN written from finite inputs fails the tier (NonFinite, at the
/// NaN's index), and the next tier serves.
fn nan_from_finite_inputs_fails_the_tier(open: Open<'_>) {
    let (case, data) = tiled_case();
    for bf16_in in [false, true] {
        let (dev, h) = faulty(open, &[(FaultKind::Conv3dWritesNonFinite, When::Nth(0))]);
        let chain = chain(&dev);
        let p = data.problem(&case, bf16_in);
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, true);
        let (r, out) = run_device(&chain, &dev, &p, &u);
        let report = r.unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
        let failures: Vec<_> = report.failures().collect();
        assert_eq!(failures.len(), 1, "{report}");
        assert!(
            matches!(failures[0].1, Failure::NonFinite { index, value }
                if value.is_nan() && *index < p.geometry.output_len()),
            "{report}"
        );
        assert_eq!(h.injected().len(), 1);
        assert_eq!(chain.stats()[1].non_finite, 1);
        assert!(out.iter().all(|v| v.is_finite()));
    }
}

/// Finite inputs whose exact result is beyond f32: the infinity is the
/// correctly rounded result, so the call ends with Conv3dOverflow (no
/// other tier would do better), naming the tier and the first index.
fn overflow_is_reported_not_retried(dev: &Device) {
    let x = vec![3.0e38f32; 2 * 2 * 2 * 2];
    let w = vec![2.0f32; 8 * 2];
    let (xs, ws) = ([1usize, 2, 2, 2, 2], [8usize, 2, 1, 1, 1]);
    let p = Conv3dProblem::new(
        Conv3dParams::default(),
        Conv3dData::F32(&x),
        &xs,
        Conv3dData::F32(&w),
        &ws,
        None,
    )
    .unwrap();
    let chain = chain(dev);
    let s = dev.stream().unwrap();
    let u = upload(&s, &p, false);
    let (r, out) = run_device(&chain, dev, &p, &u);
    match r {
        Err(Error::Conv3dOverflow {
            index,
            reference,
            value,
            tier,
        }) => {
            assert_eq!(index, 0);
            assert_eq!(reference, 4.0 * f64::from(3.0e38f32));
            assert!(value.is_infinite());
            assert_eq!(tier, "tiled");
        }
        other => panic!("{other:?}"),
    }
    assert!(out.iter().all(|v| v.is_infinite()));
    assert_eq!(chain.stats()[1].successes, 1);
    assert_eq!(chain.stats()[2].attempts, 0, "no other tier was tried");
}

/// A NaN or infinity in the input or bias makes non-finite output points
/// that are no tier's fault: the call is served, nothing fails.
fn non_finite_inputs_are_no_failure(dev: &Device) {
    let (case, data) = tiled_case();
    let chain = chain(dev);
    for which in 0..3 {
        let (mut x, w, mut b) = (data.x.clone(), data.w.clone(), data.b.clone());
        match which {
            0 => x[5] = f32::NAN,
            1 => x[9] = f32::INFINITY,
            _ => b[1] = f32::NAN,
        }
        let p = Conv3dProblem::new(
            case.params,
            Conv3dData::F32(&x),
            &case.input,
            Conv3dData::F32(&w),
            &case.weight,
            Some(Conv3dData::F32(&b)),
        )
        .unwrap();
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, false);
        let (r, out) = run_device(&chain, dev, &p, &u);
        let report = r.unwrap();
        assert_eq!(
            report.served_by(),
            Some(TierKind::Tiled),
            "{which}: {report}"
        );
        assert_eq!(report.failures().count(), 0, "{which}: {report}");
        assert!(out.iter().any(|v| !v.is_finite()), "{which}");
    }
}

/// A check that cannot run fails the tier it was checking: the output is
/// not trusted unchecked, and the next tier (checked) serves.
fn a_failed_check_fails_its_tier(open: Open<'_>) {
    let (case, data) = tiled_case();
    let (dev, h) = faulty(open, &[(FaultKind::Conv3dCheckFailure, When::Nth(0))]);
    let chain = chain(&dev);
    let p = data.problem(&case, false);
    let s = dev.stream().unwrap();
    let u = upload(&s, &p, false);
    let (r, out) = run_device(&chain, &dev, &p, &u);
    let report = r.unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
    let failures: Vec<_> = report.failures().collect();
    assert!(
        matches!(
            failures[..],
            [(
                a,
                Failure::Error(Error::InjectedFault {
                    fault: FaultKind::Conv3dCheckFailure,
                    op: "conv3d_check"
                })
            )] if a.kind == TierKind::Tiled
        ),
        "{report}"
    );
    assert_eq!(h.injected().len(), 1);
    assert_close("naive after a failed check", &p, &out, 1e-5);
}

/// Both kernels failing: the CPU tier copies the operands to the host
/// (only then), and its output is checked on the device like any other.
fn cpu_tier_serves_device_calls(open: Open<'_>) {
    let (case, data) = tiled_case();
    let (dev, _h) = faulty(open, &[(FaultKind::Conv3dLaunchFailure, When::Always)]);
    let chain = chain(&dev);
    let p = data.problem(&case, true);
    let s = dev.stream().unwrap();
    let u = upload(&s, &p, false);
    let (r, out) = run_device(&chain, &dev, &p, &u);
    let report = r.unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Cpu), "{report}");
    assert_close("cpu tier on a device call", &p, &out, 1e-5);
}

/// A weight changed in place between two calls (same address, shape and
/// dtype) is laid out again: the second output is the new weight's.
fn a_changed_weight_never_meets_a_stale_layout(dev: &Device) {
    let (case, data) = tiled_case();
    let chain = chain(dev);
    let s = dev.stream().unwrap();
    let p = data.problem(&case, false);
    let u = upload(&s, &p, false);
    let (r, _) = run_device(&chain, dev, &p, &u);
    assert_eq!(r.unwrap().served_by(), Some(TierKind::Tiled));
    let w2: Vec<f32> = data.w.iter().map(|v| -2.0 * v + 0.125).collect();
    let DeviceData::F32(mut wd) = u.w else {
        panic!("f32 weight")
    };
    wd.copy_htod(&w2).unwrap();
    let u = Uploaded {
        w: DeviceData::F32(wd),
        ..u
    };
    let p2 = Conv3dProblem::new(
        case.params,
        Conv3dData::F32(&data.x),
        &case.input,
        Conv3dData::F32(&w2),
        &case.weight,
        Some(Conv3dData::F32(&data.b)),
    )
    .unwrap();
    let (r, out) = run_device(&chain, dev, &p2, &u);
    let report = r.unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Tiled), "{report}");
    assert_close("after the weight changed", &p2, &out, 1e-5);
}

/// The check kernel against the host's f64 reference: every sampled
/// point's index, value, reference and magnitude, for f32 and bf16 inputs,
/// f32 and bf16 biases, and the located first non-finite point.
fn check_kernel_matches_the_host_reference(dev: &Device) {
    let s = dev.stream().unwrap();
    for case in cases().iter().filter(|c| c.bias) {
        let data = Data::new(case);
        let hb: Vec<bf16> = data.b.iter().map(|&v| bf16::from_f32(v)).collect();
        for (bf16_in, bias_bf16) in [(false, false), (true, false), (false, true), (true, true)] {
            let p0 = data.problem(case, bf16_in);
            let p = if bias_bf16 {
                with_bf16_bias(&p0, &hb)
            } else {
                p0
            };
            let g = p.geometry;
            if Conv3dKernel::Naive.unsupported(&g).is_some() {
                continue; // zero-size: never sent to a device
            }
            let u = upload(&s, &p0, bias_bf16);
            // A plausible output: the reference rounded to f32, with one
            // point off and one NaN planted.
            let mut y: Vec<f32> = (0..g.output_len())
                .map(|i| reference_point(&p, i).unwrap().value as f32)
                .collect();
            let nan_at = g.output_len() / 2;
            y[nan_at] = f32::NAN;
            let yd = s.clone_htod(&y).unwrap();
            let samples = 12.min(g.output_len());
            let mut res = s.alloc_zeros::<u64>(CHECK_WORDS * samples).unwrap();
            let mut slot = s.alloc_zeros::<u64>(1).unwrap();
            let run =
                |res: &mut rocm_safe::device::DeviceBuffer<u64>,
                 n: usize,
                 locate: Option<&mut rocm_safe::device::DeviceBuffer<u64>>| {
                    let mut lv = locate.map(|l| l.view_mut());
                    let (seed, rv) = (99u64, &mut res.slice_mut(..CHECK_WORDS * n).unwrap());
                    let yv = yd.view();
                    match (&u.x, &u.w, &u.b) {
                        (DeviceData::F32(x), DeviceData::F32(w), Some(DeviceData::F32(b))) => s
                            .conv3d_check(
                                &g,
                                &x.view(),
                                &w.view(),
                                Some(&b.view()),
                                &yv,
                                (n, seed),
                                lv.as_mut(),
                                rv,
                            ),
                        (DeviceData::F32(x), DeviceData::F32(w), Some(DeviceData::BF16(b))) => s
                            .conv3d_check(
                                &g,
                                &x.view(),
                                &w.view(),
                                Some(&b.view()),
                                &yv,
                                (n, seed),
                                lv.as_mut(),
                                rv,
                            ),
                        (DeviceData::BF16(x), DeviceData::BF16(w), Some(DeviceData::F32(b))) => s
                            .conv3d_check(
                                &g,
                                &x.view(),
                                &w.view(),
                                Some(&b.view()),
                                &yv,
                                (n, seed),
                                lv.as_mut(),
                                rv,
                            ),
                        (DeviceData::BF16(x), DeviceData::BF16(w), Some(DeviceData::BF16(b))) => s
                            .conv3d_check(
                                &g,
                                &x.view(),
                                &w.view(),
                                Some(&b.view()),
                                &yv,
                                (n, seed),
                                lv.as_mut(),
                                rv,
                            ),
                        _ => panic!("operands"),
                    }
                    .unwrap();
                    CheckedPoint::decode(&res.to_vec().unwrap()[..CHECK_WORDS * n])
                };
            let points = run(&mut res, samples, None);
            assert_eq!(points.len(), samples);
            for (j, pt) in points.iter().enumerate() {
                let i = sample_index(g.output_len(), 99, j).unwrap();
                assert_eq!(pt.index, Some(i), "{}: sample {j}", case.name);
                let r = reference_point(&p, i).unwrap();
                let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * (1.0 + b.abs());
                assert!(
                    close(pt.reference, r.value),
                    "{}: {pt:?} vs {r:?}",
                    case.name
                );
                assert!(
                    close(pt.magnitude, r.magnitude),
                    "{}: {pt:?} vs {r:?}",
                    case.name
                );
                assert!(
                    pt.value.to_bits() == y[i].to_bits(),
                    "{}: value at {i}: {} vs {}",
                    case.name,
                    pt.value,
                    y[i]
                );
            }
            // The first non-finite point, located on the device.
            let located = run(&mut res, 1, Some(&mut slot));
            assert_eq!(located[0].index, Some(nan_at), "{}", case.name);
            assert!(located[0].value.is_nan());
            let r = reference_point(&p, nan_at).unwrap();
            assert!((located[0].reference - r.value).abs() <= 1e-12 * (1.0 + r.value.abs()));
        }
    }
}

/// With nothing to locate the located point says so (index None).
fn locate_without_a_non_finite_value_finds_nothing(dev: &Device) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let g = p.geometry;
    let s = dev.stream().unwrap();
    let (x, w) = (
        s.clone_htod(&data.x).unwrap(),
        s.clone_htod(&data.w).unwrap(),
    );
    let y = s.alloc_zeros::<f32>(g.output_len()).unwrap();
    let mut res = s.alloc_zeros::<u64>(CHECK_WORDS).unwrap();
    let mut slot = s.alloc_zeros::<u64>(1).unwrap();
    s.conv3d_check::<f32, f32, f32>(
        &g,
        &x.view(),
        &w.view(),
        None,
        &y.view(),
        (1, 0),
        Some(&mut slot.view_mut()),
        &mut res.view_mut(),
    )
    .unwrap();
    let pt = CheckedPoint::decode(&res.to_vec().unwrap())[0];
    assert_eq!(pt.index, None);
    assert!(pt.reference.is_nan());
    // Misuse is refused before the device sees it.
    let e = s
        .conv3d_check::<f32, f32, f32>(
            &g,
            &x.view(),
            &w.view(),
            None,
            &y.view(),
            (2, 0),
            None,
            &mut res.view_mut(),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d check results",
                ..
            }
        ),
        "{e}"
    );
    let e = s
        .conv3d_check::<f32, f32, f32>(
            &g,
            &x.view(),
            &w.view(),
            None,
            &y.view(),
            (2, 0),
            Some(&mut slot.view_mut()),
            &mut res.view_mut(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
}

/// The layout kernels against the host's layouts: transposed (f32,
/// bf16) and packed (bf16), groups included.
fn layout_kernels_match_the_host_layouts(dev: &Device) {
    let s = dev.stream().unwrap();
    for case in cases() {
        let data = Data::new(&case);
        let g = data.problem(&case, false).geometry;
        if Conv3dKernel::Naive.unsupported(&g).is_some() {
            continue; // zero-size: never sent to a device
        }
        let mut layouts = vec![Conv3dWeightLayout::TiledTransposed];
        layouts.extend(Conv3dWeightLayout::packed_for(&g));
        for layout in layouts {
            if layout != Conv3dWeightLayout::TiledTransposed {
                let src = s.clone_htod(&data.wb).unwrap();
                let mut dst = s.alloc_zeros::<bf16>(layout.len(&g)).unwrap();
                s.conv3d_arrange_weight(layout, &g, &src.view(), &mut dst.view_mut())
                    .unwrap();
                assert_eq!(
                    dst.to_vec().unwrap(),
                    layout.arrange(&g, &data.wb).unwrap().to_vec(),
                    "{}: {layout:?}",
                    case.name
                );
                continue;
            }
            let src = s.clone_htod(&data.w).unwrap();
            let mut dst = s.alloc_zeros::<f32>(layout.len(&g)).unwrap();
            s.conv3d_arrange_weight(layout, &g, &src.view(), &mut dst.view_mut())
                .unwrap();
            assert_eq!(
                dst.to_vec().unwrap(),
                layout.arrange(&g, &data.w).unwrap().to_vec(),
                "{}",
                case.name
            );
            let src = s.clone_htod(&data.wb).unwrap();
            let mut dst = s.alloc_zeros::<bf16>(layout.len(&g)).unwrap();
            s.conv3d_arrange_weight(layout, &g, &src.view(), &mut dst.view_mut())
                .unwrap();
            assert_eq!(
                dst.to_vec().unwrap(),
                layout.arrange(&g, &data.wb).unwrap().to_vec(),
                "{}",
                case.name
            );
        }
        // A packed layout of f32 is no layout any kernel reads.
        if let Some(packed) = Conv3dWeightLayout::packed_for(&g) {
            let src = s.clone_htod(&data.w).unwrap();
            let mut dst = s.alloc_zeros::<f32>(packed.len(&g)).unwrap();
            assert!(matches!(
                s.conv3d_arrange_weight(packed, &g, &src.view(), &mut dst.view_mut()),
                Err(Error::Conv3dDType { .. })
            ));
        }
    }
}

/// `verify_device` on an output something else computed: the reference
/// rounded to f32 or bf16 passes; slightly wrong finite values (twice the
/// tolerance off) and a NaN at a sampled point are mismatches.
fn verify_device_catches_slightly_wrong_outputs(dev: &Device) {
    let (case, data) = tiled_case();
    let chain = chain(dev);
    for bf16_in in [false, true] {
        let p = data.problem(&case, bf16_in);
        let g = p.geometry;
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, false);
        let exact: Vec<f32> = (0..g.output_len())
            .map(|i| reference_point(&p, i).unwrap().value as f32)
            .collect();
        let verify = |y: DeviceConv3dData<'_>| {
            chain
                .verify_device(
                    &s,
                    g.params,
                    u.x.data(),
                    &g.input_shape(),
                    u.w.data(),
                    &g.weight_shape(),
                    u.b.as_ref().map(DeviceData::data),
                    y,
                )
                .unwrap()
        };
        let yd = s.clone_htod(&exact).unwrap();
        let r = verify(DeviceConv3dData::F32(yd.view()));
        assert!(r.is_ok(), "{r:?}");
        let yb: Vec<bf16> = exact.iter().map(|&v| bf16::from_f32(v)).collect();
        let ybd = s.clone_htod(&yb).unwrap();
        if bf16_in {
            let r = verify(DeviceConv3dData::BF16(ybd.view()));
            assert!(r.is_ok(), "{r:?}");
        }
        // Off by twice the tolerance of the dtype (1e-4 or 1e-2 of each
        // point's magnitude): finite, plausible, wrong.
        let rel = if bf16_in { 2e-2 } else { 2e-4 };
        let off: Vec<f32> = (0..g.output_len())
            .map(|i| {
                let r = reference_point(&p, i).unwrap();
                (r.value + rel * r.magnitude) as f32
            })
            .collect();
        let od = s.clone_htod(&off).unwrap();
        assert!(
            matches!(verify(DeviceConv3dData::F32(od.view())), Err(Failure::ValueMismatch { got, .. }) if got.is_finite()),
            "bf16 {bf16_in}"
        );
        // Within a looser tolerance given for the call (an output computed
        // with TF32), the same values pass; beyond it they still fail.
        let within = |rel_tol: f64| {
            chain
                .verify_device_within(
                    &s,
                    g.params,
                    (u.x.data(), &g.input_shape()[..]),
                    (u.w.data(), &g.weight_shape()[..]),
                    u.b.as_ref().map(DeviceData::data),
                    DeviceConv3dData::F32(od.view()),
                    rel_tol,
                )
                .unwrap()
        };
        assert!(within(rel * 4.0).is_ok(), "bf16 {bf16_in}");
        assert!(within(rel / 4.0).is_err(), "bf16 {bf16_in}");
        let mut nan = exact.clone();
        nan[0] = f32::NAN; // sample 0 is always index 0
        let nd = s.clone_htod(&nan).unwrap();
        assert!(matches!(
            verify(DeviceConv3dData::F32(nd.view())),
            Err(Failure::ValueMismatch { index: 0, .. })
        ));
        // A wrong output length is an error, not a verdict.
        let short = s.clone_htod(&exact[1..]).unwrap();
        assert!(chain
            .verify_device(
                &s,
                g.params,
                u.x.data(),
                &g.input_shape(),
                u.w.data(),
                &g.weight_shape(),
                None,
                DeviceConv3dData::F32(short.view()),
            )
            .is_err());
    }
}

per_device!(
    device_chain_serves_every_dtype_and_bias,
    wrong_finite_values_fail_the_tier,
    nan_from_finite_inputs_fails_the_tier,
    overflow_is_reported_not_retried,
    non_finite_inputs_are_no_failure,
    a_failed_check_fails_its_tier,
    cpu_tier_serves_device_calls,
    a_changed_weight_never_meets_a_stale_layout,
    check_kernel_matches_the_host_reference,
    locate_without_a_non_finite_value_finds_nothing,
    layout_kernels_match_the_host_layouts,
    verify_device_catches_slightly_wrong_outputs,
);

/// A backend that counts host<->device copies and their bytes.
#[derive(Debug)]
struct CountCopies {
    inner: Box<dyn Backend>,
    htod: Arc<AtomicUsize>,
    dtoh: Arc<AtomicUsize>,
    dtoh_bytes: Arc<AtomicUsize>,
}

impl Wrap for CountCopies {
    type Inner = dyn Backend;
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
}

// SAFETY: forwards every call unchanged to a correct backend.
unsafe impl Driver for CountCopies {
    rocm_safe::forward_driver!(
        info,
        alloc,
        free,
        alloc_pinned,
        free_pinned,
        stream_create,
        stream_destroy,
        stream_synchronize,
        synchronize,
        event_create,
        event_destroy,
        event_record,
        event_synchronize,
        stream_wait_event,
        event_elapsed_ms,
        memset_zero,
        mem_info,
    );
    unsafe fn copy(&self, op: CopyOp, bytes: usize, s: RawStream) -> Result<()> {
        match op {
            CopyOp::HtoD { .. } => {
                self.htod.fetch_add(1, Ordering::SeqCst);
            }
            CopyOp::DtoH { .. } => {
                self.dtoh.fetch_add(1, Ordering::SeqCst);
                self.dtoh_bytes.fetch_add(bytes, Ordering::SeqCst);
            }
            _ => {}
        }
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { self.inner.copy(op, bytes, s) }
    }
}

// SAFETY: as above.
unsafe impl Backend for CountCopies {
    rocm_safe::forward_backend!(all);
}

/// The point of the issue: a served call copies no operand to the device
/// or the host and reads back one small buffer (the checks' results),
/// whatever the dtype or bias; a bad output costs one more small read.
#[test]
fn a_served_device_call_reads_back_one_small_buffer() {
    let (htod, dtoh, bytes) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let counting = CountCopies {
        inner: Box::new(rocm_safe::device::host::HostBackend::new()),
        htod: htod.clone(),
        dtoh: dtoh.clone(),
        dtoh_bytes: bytes.clone(),
    };
    let dev = Device::from_backend(Box::new(counting));
    let (case, data) = tiled_case();
    let chain = chain(&dev);
    for (bf16_in, bias_bf16) in [(false, false), (true, true)] {
        let p = data.problem(&case, bf16_in);
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, bias_bf16);
        let g = p.geometry;
        let mut out = s.alloc_zeros::<f32>(g.output_len()).unwrap();
        let before = (htod.load(Ordering::SeqCst), dtoh.load(Ordering::SeqCst));
        let bytes0 = bytes.load(Ordering::SeqCst);
        let report = chain
            .run_device(
                &s,
                g.params,
                u.x.data(),
                &g.input_shape(),
                u.w.data(),
                &g.weight_shape(),
                u.b.as_ref().map(DeviceData::data),
                &mut out.view_mut(),
            )
            .unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Tiled), "{report}");
        assert_eq!(htod.load(Ordering::SeqCst), before.0, "no upload");
        assert_eq!(dtoh.load(Ordering::SeqCst), before.1 + 1, "one read-back");
        let read = bytes.load(Ordering::SeqCst) - bytes0;
        assert!(read <= 8 * (16 + 4 * 16), "{read} bytes read back");
    }
}
