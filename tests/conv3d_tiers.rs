//! Every conv3d tier against the float64 reference over a table of cases
//! (strides, paddings, dilations, groups, depthwise, kernel sizes 1 and
//! asymmetric, batch > 1, bias or not, tiny and empty outputs), in f32 and
//! bf16.

mod conv3d_common;

use conv3d_common::{assert_close, cases, Data};
use rocm_safe::conv3d::{
    conv3d_cpu, conv3d_cpu_with, Conv3dTier, CpuKernel, CpuTier, Support, TierKind,
};

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

#[cfg(feature = "cuda")]
mod cuda {
    use super::*;
    use rocm_safe::conv3d::cuda::{CudaNaiveTier, CudaTiledTier, CudnnTier, SharedEngine};
    use rocm_safe::conv3d::{Conv3dChain, Outcome};

    fn engine() -> SharedEngine {
        let e = SharedEngine::new(0);
        if let Err(why) = e.get() {
            panic!("no cuda engine: {why}");
        }
        e
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn naive_kernel_matches_reference_on_every_case() {
        let ran = check_tier(&CudaNaiveTier(engine()));
        // Every case but the zero-size ones (they stay on the CPU).
        assert_eq!(ran, 2 * (cases().len() - 3));
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn tiled_kernel_matches_reference_on_every_case() {
        let ran = check_tier(&CudaTiledTier(engine()));
        assert!(ran >= 2 * 6, "the tiled tier ran only {ran} cases");
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn cudnn_matches_reference_on_every_case() {
        // bf16: cuDNN writes bf16 (rounding 2^-9 of the value).
        let ran = check_tier_tol(&CudnnTier(engine()), 1e-4, 4e-3);
        assert!(
            ran >= 2 * 10,
            "the cudnn tier ran only {ran} cases (is libcudnn on LD_LIBRARY_PATH?)"
        );
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn device_length_and_size_errors_are_typed() {
        use rocm_safe::conv3d::cuda::{CudaConv3d, GpuKernel};
        let engine = CudaConv3d::open(0).unwrap();
        let case = &cases()[0];
        let data = Data::new(case);
        let p = data.problem(case, false);
        let dp = engine.upload(&p).unwrap();
        let mut short = engine.stream().alloc_zeros::<f32>(3).unwrap();
        let e = engine
            .forward(GpuKernel::Naive, &dp, &mut short)
            .unwrap_err();
        assert!(
            matches!(
                e,
                rocm_safe::Error::LengthMismatch {
                    op: "conv3d cuda output",
                    ..
                }
            ),
            "{e}"
        );
        let y = engine.alloc_output(&dp).unwrap();
        let e = engine.download(&y, &mut [0f32; 2]).unwrap_err();
        assert!(
            matches!(
                e,
                rocm_safe::Error::LengthMismatch {
                    op: "conv3d cuda download",
                    ..
                }
            ),
            "{e}"
        );
        // The tiled kernel refuses what its grid or tile layout cannot take.
        let dw = cases().into_iter().find(|c| c.name == "depthwise").unwrap();
        let dwd = Data::new(&dw);
        let dwp = engine.upload(&dwd.problem(&dw, false)).unwrap();
        let mut out = engine.alloc_output(&dwp).unwrap();
        let e = engine
            .forward(GpuKernel::Tiled, &dwp, &mut out)
            .unwrap_err();
        assert!(
            matches!(e, rocm_safe::Error::Conv3dTier { tier: "tiled", .. }),
            "{e}"
        );
        // Zero-size problems are not sent to the device.
        let empty = cases()
            .into_iter()
            .find(|c| c.name == "empty batch")
            .unwrap();
        let ed = Data::new(&empty);
        let e = engine.upload(&ed.problem(&empty, false)).unwrap_err();
        assert!(
            matches!(e, rocm_safe::Error::Conv3dTier { tier: "cuda", .. }),
            "{e}"
        );
    }

    #[test]
    #[ignore = "needs a GPU"]
    fn default_chain_is_served_on_the_gpu() {
        let case = &cases()[0];
        let data = Data::new(case);
        let chain = Conv3dChain::new();
        for bf16 in [false, true] {
            let p = data.problem(case, bf16);
            let (out, report) = chain.run(&p).unwrap();
            assert_close("chain on gpu", &p, &out, 4e-3);
            assert_ne!(report.served_by(), Some(TierKind::Cpu), "{report}");
            println!("bf16={bf16}: {report}");
        }
        // A depthwise case: the tiled tier declines, cuDNN or naive serve.
        let case = cases().into_iter().find(|c| c.name == "depthwise").unwrap();
        let data = Data::new(&case);
        let mut chain = Conv3dChain::new();
        chain.options_mut().forbid = vec![TierKind::Vendor];
        let (out, report) = chain.run(&data.problem(&case, false)).unwrap();
        assert_close("depthwise on gpu", &data.problem(&case, false), &out, 1e-5);
        assert!(
            matches!(&report.attempts[1].outcome, Outcome::Skipped(w) if w.starts_with("unsupported")),
            "{report}"
        );
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
    }
}

#[test]
fn cpu_takes_extreme_strides_without_overflow() {
    // One output column per row; a width stride near usize::MAX must not
    // overflow any index (debug builds check arithmetic).
    let case = conv3d_common::Case {
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
