//! Issue 21: the kernels behind the device chain's checks, against the
//! host. The check kernel's sampled f64 points and located non-finite
//! point, the weight layout kernels, and `verify_device` on an output
//! something else computed (the chain itself:
//! `tests/conv3d/device_checks.rs`). Each runs on the host backend here
//! and, with `--include-ignored`, on a CUDA or HIP device.

use crate::common;

use common::conv3d::{cases, Data};
use common::conv3d_device::{chain, tiled_case, upload, with_bf16_bias, DeviceData};
use half::bf16;
use rocm_safe::conv3d::{reference_point, sample_index};
use rocm_safe::conv3d_chain::DeviceConv3dData;
use rocm_safe::device::{
    raw::{CheckedPoint, Conv3dWeightLayout, CHECK_WORDS},
    Conv3dKernel, Device,
};
use rocm_safe::fallback::Failure;
use rocm_safe::Error;

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
                        (DeviceData::F32(x), DeviceData::F32(w), Some(DeviceData::F32(b))) => {
                            s.conv3d_ops().check(
                                &g,
                                &x.view(),
                                &w.view(),
                                Some(&b.view()),
                                &yv,
                                (n, seed),
                                lv.as_mut(),
                                rv,
                            )
                        }
                        (DeviceData::F32(x), DeviceData::F32(w), Some(DeviceData::BF16(b))) => {
                            s.conv3d_ops().check(
                                &g,
                                &x.view(),
                                &w.view(),
                                Some(&b.view()),
                                &yv,
                                (n, seed),
                                lv.as_mut(),
                                rv,
                            )
                        }
                        (DeviceData::BF16(x), DeviceData::BF16(w), Some(DeviceData::F32(b))) => {
                            s.conv3d_ops().check(
                                &g,
                                &x.view(),
                                &w.view(),
                                Some(&b.view()),
                                &yv,
                                (n, seed),
                                lv.as_mut(),
                                rv,
                            )
                        }
                        (DeviceData::BF16(x), DeviceData::BF16(w), Some(DeviceData::BF16(b))) => {
                            s.conv3d_ops().check(
                                &g,
                                &x.view(),
                                &w.view(),
                                Some(&b.view()),
                                &yv,
                                (n, seed),
                                lv.as_mut(),
                                rv,
                            )
                        }
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
    s.conv3d_ops()
        .check::<f32, f32, f32>(
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
        .conv3d_ops()
        .check::<f32, f32, f32>(
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
        .conv3d_ops()
        .check::<f32, f32, f32>(
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
                s.conv3d_ops()
                    .arrange_weight(layout, &g, &src.view(), &mut dst.view_mut())
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
            s.conv3d_ops()
                .arrange_weight(layout, &g, &src.view(), &mut dst.view_mut())
                .unwrap();
            assert_eq!(
                dst.to_vec().unwrap(),
                layout.arrange(&g, &data.w).unwrap().to_vec(),
                "{}",
                case.name
            );
            let src = s.clone_htod(&data.wb).unwrap();
            let mut dst = s.alloc_zeros::<bf16>(layout.len(&g)).unwrap();
            s.conv3d_ops()
                .arrange_weight(layout, &g, &src.view(), &mut dst.view_mut())
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
                s.conv3d_ops()
                    .arrange_weight(packed, &g, &src.view(), &mut dst.view_mut()),
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
    check_kernel_matches_the_host_reference,
    locate_without_a_non_finite_value_finds_nothing,
    layout_kernels_match_the_host_layouts,
    verify_device_catches_slightly_wrong_outputs,
);
