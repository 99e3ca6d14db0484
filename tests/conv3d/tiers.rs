//! Every conv3d tier against the float64 reference over a table of cases
//! (strides, paddings, dilations, groups, depthwise, kernel sizes 1 and
//! asymmetric, batch > 1, bias or not, tiny and empty outputs), in f32 and
//! bf16: the CPU tier, and the GPU tiers of the host device (the CPU code
//! behind the device interface) here, of a CUDA or HIP device with
//! `--ignored` where there is one; plus the device entry points' errors.

use crate::common;

use common::conv3d::{assert_close, cases, Data};
use rocm_safe::conv3d::{conv3d_cpu, conv3d_cpu_with, CpuKernel};
use rocm_safe::conv3d_chain::{
    Conv3dTier, CpuTier, NaiveTier, Support, TierKind, TiledTier, VendorTier,
};
use rocm_safe::device::{BackendKind, Conv3dKernel, Device};
use rocm_safe::Error;

per_device!(
    device_tiers_match_reference_on_every_case,
    device_errors_are_typed;
    gpu_only: default_chain_is_served_on_the_gpu,
);

/// Runs `tier` over every case it supports, in both dtypes, and compares
/// within `rel` (f32) / `rel_bf16` of each point's magnitude. Returns how
/// many (case, dtype) pairs it ran, so callers can insist the tier was
/// actually exercised.
fn check_tier_tol(tier: &dyn Conv3dTier, rel: f64, rel_bf16: f64) -> usize {
    let mut ran = 0;
    for case in cases() {
        let data = Data::new(&case);
        for bf16 in [false, true] {
            let p = data.problem(&case, bf16);
            if let Support::Yes = tier.support(&p) {
                let mut out = vec![f32::NAN; p.geometry.output_len()];
                tier.run(&p, &mut out)
                    .unwrap_or_else(|e| panic!("{} {} bf16={bf16}: {e}", tier.name(), case.name));
                let what = format!("{} {} bf16={bf16}", tier.name(), case.name);
                assert_close(&what, &p, &out, if bf16 { rel_bf16 } else { rel });
                ran += 1;
            }
        }
    }
    ran
}

fn check_tier(tier: &dyn Conv3dTier) -> usize {
    check_tier_tol(tier, 1e-5, 1e-5)
}

#[test]
fn cpu_tier_matches_reference_on_every_case() {
    let ran = check_tier(&CpuTier);
    assert_eq!(ran, 2 * cases().len(), "the cpu tier supports every case");
    assert_eq!(CpuTier.kind(), TierKind::Cpu);
}

#[test]
fn cpu_output_length_is_checked() {
    let case = &cases()[0];
    let data = Data::new(case);
    let p = data.problem(case, false);
    let mut out = vec![0f32; p.geometry.output_len() + 1];
    let e = conv3d_cpu(&p, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            rocm_safe::Error::LengthMismatch {
                op: "conv3d cpu output",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn cpu_propagates_nan_and_widens_bf16_exactly() {
    // bf16 values whose f32 widening is exact; a signalling-NaN pattern in
    // the input must come out as NaN (not be turned into a number).
    let xb: Vec<half::bf16> = [1.5f32, -2.0, 0.25, 3.0]
        .iter()
        .map(|&v| half::bf16::from_f32(v))
        .chain([half::bf16::from_bits(0x7f81)])
        .collect();
    let wb = vec![half::bf16::from_f32(1.0); 1];
    let p = rocm_safe::conv3d::Conv3dProblem::new(
        Default::default(),
        rocm_safe::conv3d::Conv3dData::BF16(&xb),
        &[1, 1, 1, 1, 5],
        rocm_safe::conv3d::Conv3dData::BF16(&wb),
        &[1, 1, 1, 1, 1],
        None,
    )
    .unwrap();
    let mut out = vec![0f32; 5];
    conv3d_cpu(&p, &mut out).unwrap();
    assert_eq!(&out[..4], &[1.5, -2.0, 0.25, 3.0]);
    assert!(out[4].is_nan());
}

#[test]
fn every_cpu_kernel_matches_reference() {
    let kernels = CpuKernel::available();
    assert_eq!(kernels[0], CpuKernel::Portable);
    for kernel in kernels {
        for case in cases() {
            let data = Data::new(&case);
            for bf16 in [false, true] {
                let p = data.problem(&case, bf16);
                let mut out = vec![f32::NAN; p.geometry.output_len()];
                conv3d_cpu_with(&p, &mut out, kernel).unwrap();
                assert_close(
                    &format!("{kernel:?} {} bf16={bf16}", case.name),
                    &p,
                    &out,
                    1e-5,
                );
            }
        }
    }
}

/// The GPU tiers of one device against the reference over the case table.
/// `vendor_tol` is `None` when the device has no vendor library (it must
/// then be skipped as unavailable on every case).
fn device_tiers_match_reference(dev: Device, vendor_tol: Option<(f64, f64)>) {
    // Every case but the zero-size ones (they stay on the CPU).
    let nonzero = 2 * (cases().len() - 3);
    assert_eq!(check_tier(&NaiveTier::new(dev.clone())), nonzero);
    let tiled = check_tier(&TiledTier::new(dev.clone()));
    assert!(tiled >= 2 * 6, "the tiled tier ran only {tiled} cases");
    let vendor = VendorTier::new(dev.clone());
    match vendor_tol {
        // bf16: the library writes bf16 (rounding 2^-9 of the value).
        Some((f32_tol, bf16_tol)) => {
            let ran = check_tier_tol(&vendor, f32_tol, bf16_tol);
            assert!(ran >= 2 * 10, "the vendor tier ran only {ran} cases");
        }
        None => {
            assert_eq!(check_tier(&vendor), 0);
            let case = &cases()[0];
            let data = Data::new(case);
            assert!(matches!(
                vendor.support(&data.problem(case, false)),
                Support::Unavailable(_)
            ));
        }
    }
    assert!(dev.take_errors().is_empty());
}

/// Every GPU tier of the device (the vendor one only where its library
/// is: never on the host backend).
fn device_tiers_match_reference_on_every_case(dev: &Device) {
    let tol = dev
        .backend()
        .conv3d_vendor_available()
        .is_ok()
        .then_some((1e-4, 4e-3));
    device_tiers_match_reference(dev.clone(), tol);
    // Named after the library the backend declares (cudnn, miopen).
    let want = match dev.kind() {
        BackendKind::Cuda => "cudnn",
        BackendKind::Hip => "miopen",
        BackendKind::Host => "vendor",
        other => panic!("no vendor library known for {other}"),
    };
    assert_eq!(VendorTier::new(dev.clone()).name(), want);
    assert_eq!(TiledTier::new(dev.clone()).kind(), TierKind::Tiled);
    assert_eq!(NaiveTier::new(dev.clone()).kind(), TierKind::Naive);
}

/// The safe device entry points check their operands before any backend
/// call: lengths, devices, sizes the kernel refuses, zero-size calls, and
/// a backend without a vendor library.
fn device_errors_are_typed(dev: &Device) {
    let s = dev.stream().unwrap();
    let case = &cases()[0];
    let data = Data::new(case);
    let g = data.problem(case, false).geometry;
    let x = s.clone_htod(&data.x).unwrap();
    let w = s.clone_htod(&data.w).unwrap();
    let b = s.clone_htod(&data.b).unwrap();
    let mut y = s.alloc_zeros::<f32>(g.output_len()).unwrap();
    let mut short = s.alloc_zeros::<f32>(3).unwrap();
    let e = s
        .conv3d_ops()
        .forward(
            Conv3dKernel::Naive,
            &g,
            &x.view(),
            &w.view(),
            Some(b.view()),
            &mut short.view_mut(),
        )
        .unwrap_err();
    assert!(
        matches!(e, Error::LengthMismatch { op: "conv3d device output", expected, actual: 3, tensor: None } if expected == g.output_len()),
        "{e}"
    );
    let e = s
        .conv3d_ops()
        .forward(
            Conv3dKernel::Naive,
            &g,
            &x.view(),
            &w.slice(1..).unwrap(),
            None,
            &mut y.view_mut(),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d device weight",
                ..
            }
        ),
        "{e}"
    );
    let e = s
        .conv3d_ops()
        .forward(
            Conv3dKernel::Naive,
            &g,
            &x.view(),
            &w.view(),
            Some(b.slice(..2).unwrap()),
            &mut y.view_mut(),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d device bias",
                ..
            }
        ),
        "{e}"
    );
    let e = s
        .conv3d_ops()
        .forward(
            Conv3dKernel::Naive,
            &g,
            &x.slice(..5).unwrap(),
            &w.view(),
            None,
            &mut y.view_mut(),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d device input",
                ..
            }
        ),
        "{e}"
    );
    // Views of another device.
    let other = Device::host();
    let os = other.stream().unwrap();
    let ox = os.clone_htod(&data.x).unwrap();
    let e = s
        .conv3d_ops()
        .forward(
            Conv3dKernel::Naive,
            &g,
            &ox.view(),
            &w.view(),
            None,
            &mut y.view_mut(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { op: "conv3d" }), "{e}");
    // 3 output channels: the chain gives it to the naive kernel (fewer
    // than 8 per group), but asked directly the tiled kernel computes it,
    // as the naive one does.
    assert!(Conv3dKernel::Tiled.unsupported(&g).is_some());
    assert!(Conv3dKernel::Tiled.cannot_take(&g).is_none());
    let mut y2 = s.alloc_zeros::<f32>(y.len()).unwrap();
    // The tiled kernel reads the weight in its own layout.
    let layout =
        s.conv3d_ops()
            .weight_layout(Conv3dKernel::Tiled, rocm_safe::dtype::DType::F32, &g);
    let mut wt = s.alloc_zeros::<f32>(layout.len(&g)).unwrap();
    s.conv3d_ops()
        .arrange_weight(layout, &g, &w.view(), &mut wt.view_mut())
        .unwrap();
    s.conv3d_ops()
        .forward(
            Conv3dKernel::Tiled,
            &g,
            &x.view(),
            &wt.view(),
            None,
            &mut y.view_mut(),
        )
        .unwrap();
    s.conv3d_ops()
        .forward(
            Conv3dKernel::Naive,
            &g,
            &x.view(),
            &w.view(),
            None,
            &mut y2.view_mut(),
        )
        .unwrap();
    let (mut ha, mut hb) = (vec![0f32; y.len()], vec![0f32; y.len()]);
    y.view().copy_dtoh(&s, &mut ha).unwrap();
    y2.view().copy_dtoh(&s, &mut hb).unwrap();
    let scale = hb.iter().fold(1e-30f32, |m, v| m.max(v.abs()));
    for (i, (p, q)) in ha.iter().zip(&hb).enumerate() {
        assert!((p - q).abs() <= 1e-5 * scale, "{i}: tiled {p} naive {q}");
    }
    // Zero-size calls never reach the backend.
    let empty = cases()
        .into_iter()
        .find(|c| c.name == "empty batch")
        .unwrap();
    let ed = Data::new(&empty);
    let eg = ed.problem(&empty, false).geometry;
    let ex = s.alloc_zeros::<f32>(0).unwrap();
    let ew = s.clone_htod(&ed.w).unwrap();
    let mut ey = s.alloc_zeros::<f32>(0).unwrap();
    let e = s
        .conv3d_ops()
        .forward(
            Conv3dKernel::Naive,
            &eg,
            &ex.view(),
            &ew.view(),
            None,
            &mut ey.view_mut(),
        )
        .unwrap_err();
    assert!(matches!(e, Error::Conv3dTier { tier: "naive", .. }), "{e}");
    let e = s
        .conv3d_ops()
        .vendor(&eg, &ex.view(), &ew.view(), None, &mut ey.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::Conv3dTier { tier: "vendor", .. }), "{e}");
    // A correct call works, and equals the CPU tier.
    s.conv3d_ops()
        .forward(
            Conv3dKernel::Naive,
            &g,
            &x.view(),
            &w.view(),
            Some(b.view()),
            &mut y.view_mut(),
        )
        .unwrap();
    let got = y.to_vec().unwrap();
    let p = data.problem(case, false);
    let mut want = vec![0f32; g.output_len()];
    conv3d_cpu(&p, &mut want).unwrap();
    assert_close("device naive", &p, &got, 1e-5);
    // Without a vendor library (the host backend has none) the vendor
    // call is a typed error.
    let available = dev.backend().conv3d_vendor_available();
    assert!(dev.kind() != BackendKind::Host || available.is_err());
    if available.is_err() {
        let e = s
            .conv3d_ops()
            .vendor(&g, &x.view(), &w.view(), None, &mut y.view_mut())
            .unwrap_err();
        assert!(
            matches!(e, Error::VendorUnavailable { backend, .. } if backend == dev.kind().name()),
            "{e}"
        );
    }
}

/// On a GPU the default chain (of the first available device) and the
/// device's own chain are served there (not by the CPU), and a depthwise
/// call skips the tiled tier as unsupported.
fn default_chain_is_served_on_the_gpu(dev: &Device) {
    use rocm_safe::conv3d_chain::Conv3dChain;
    use rocm_safe::fallback::Outcome;
    let case = &cases()[0];
    let data = Data::new(case);
    for chain in [Conv3dChain::first_gpu(), Conv3dChain::for_device(dev)] {
        for bf16 in [false, true] {
            let p = data.problem(case, bf16);
            let (out, report) = chain.run(&p).unwrap();
            assert_close("chain on gpu", &p, &out, 4e-3);
            assert_ne!(report.served_by(), Some(TierKind::Cpu), "{report}");
            println!("bf16={bf16}: {report}");
        }
    }
    let case = cases().into_iter().find(|c| c.name == "depthwise").unwrap();
    let data = Data::new(&case);
    let mut chain = Conv3dChain::for_device(dev);
    chain.options_mut().forbid = vec![TierKind::Vendor];
    let (out, report) = chain.run(&data.problem(&case, false)).unwrap();
    assert_close("depthwise on gpu", &data.problem(&case, false), &out, 1e-5);
    assert!(
        matches!(&report.attempts[1].outcome, Outcome::Skipped(w) if w.starts_with("unsupported")),
        "{report}"
    );
    assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
}

#[test]
fn cpu_takes_extreme_strides_without_overflow() {
    // One output column per row; a width stride near usize::MAX must not
    // overflow any index (debug builds check arithmetic).
    let case = common::conv3d::Case {
        name: "huge width stride",
        input: [1, 2, 3, 2, 7],
        weight: [3, 2, 2, 1, 2],
        params: rocm_safe::conv3d::Conv3dParams::default()
            .with_stride([1, 1, usize::MAX / 4])
            .with_dilation([1, 1, 3])
            .with_padding([0, 0, 1]),
        bias: true,
    };
    let data = Data::new(&case);
    for kernel in CpuKernel::available() {
        for bf16 in [false, true] {
            let p = data.problem(&case, bf16);
            assert_eq!(p.geometry.output, [2, 2, 1]);
            let mut out = vec![f32::NAN; p.geometry.output_len()];
            conv3d_cpu_with(&p, &mut out, kernel).unwrap();
            assert_close(&format!("{kernel:?} huge stride"), &p, &out, 1e-5);
        }
    }
}
