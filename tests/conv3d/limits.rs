//! conv3d against hostile sizes and values: a padding whose buffers exceed
//! memory is a typed error before any allocation; an exact result beyond
//! f32 is `Conv3dOverflow` (a fact), told apart from a corrupt tier.

use rocm_safe::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::conv3d_chain::{Conv3dChain, Conv3dOptions, CpuTier};
use rocm_safe::Error;

const ONE: [usize; 5] = [1; 5];

#[test]
fn a_huge_padding_is_refused_before_allocating() {
    let (x, w) = ([1.0f32], [1.0f32]);
    for padding in [[100_000; 3], [0, 0, 1 << 40], [usize::MAX / 4, 1, 1]] {
        let r = Conv3dProblem::new(
            Conv3dParams::default().with_padding(padding),
            Conv3dData::F32(&x),
            &ONE,
            Conv3dData::F32(&w),
            &ONE,
            None,
        );
        match r {
            Err(Error::Conv3dTooLarge { bytes, limit, .. }) => assert!(bytes > limit),
            Err(Error::Conv3dShape { reason, .. }) => assert!(reason.contains("overflow")),
            other => panic!("{padding:?}: {other:?}"),
        }
    }
    // A small padding is fine.
    let p = Conv3dProblem::new(
        Conv3dParams::default().with_padding([2; 3]),
        Conv3dData::F32(&x),
        &ONE,
        Conv3dData::F32(&w),
        &ONE,
        None,
    )
    .unwrap();
    assert_eq!(p.geometry.output_shape(), [1, 1, 5, 5, 5]);
}

fn cpu_chain() -> Conv3dChain {
    Conv3dChain::with_tiers(vec![Box::new(CpuTier)], Conv3dOptions::default())
}

#[test]
fn an_exact_result_beyond_f32_is_an_overflow_not_a_tier_failure() {
    for (xv, wv, sign) in [(3.0e38f32, 2.0f32, 1.0f64), (-3.0e38, 1.5, -1.0)] {
        let (x, w) = ([xv], [wv]);
        let p = Conv3dProblem::new(
            Conv3dParams::default(),
            Conv3dData::F32(&x),
            &ONE,
            Conv3dData::F32(&w),
            &ONE,
            None,
        )
        .unwrap();
        let chain = cpu_chain();
        match chain.run(&p) {
            Err(Error::Conv3dOverflow {
                index,
                reference,
                value,
                tier,
            }) => {
                assert_eq!(index, 0);
                assert_eq!(reference, f64::from(xv) * f64::from(wv));
                assert!(reference * sign > f64::from(f32::MAX));
                assert!(value.is_infinite() && f64::from(value) * sign > 0.0);
                assert_eq!(tier, "cpu");
            }
            other => panic!("{other:?}"),
        }
        let stats = chain.stats();
        assert_eq!((stats[0].attempts, stats[0].successes), (1, 1));
        assert_eq!(stats[0].non_finite, 0);
    }
    // Near the edge but representable: served.
    let (x, w) = ([3.0e38f32], [1.0f32]);
    let p = Conv3dProblem::new(
        Conv3dParams::default(),
        Conv3dData::F32(&x),
        &ONE,
        Conv3dData::F32(&w),
        &ONE,
        None,
    )
    .unwrap();
    let (out, _) = cpu_chain().run(&p).unwrap();
    assert_eq!(out, vec![3.0e38]);
}

#[test]
fn shapes_pass_from_reader_types_without_conversion_and_negatives_are_refused() {
    let x = vec![1f32; 2 * 3 * 3 * 3];
    let w = vec![1f32; 4 * 2 * 27];
    // u64, as `TensorInfo::shape` and `LoadedTensor::shape` give them.
    let xs: Vec<u64> = vec![1, 2, 3, 3, 3];
    let ws: Vec<u64> = vec![4, 2, 3, 3, 3];
    let p = Conv3dProblem::new(
        Conv3dParams::default().with_padding([1; 3]),
        Conv3dData::F32(&x),
        &xs,
        Conv3dData::F32(&w),
        &ws,
        None,
    )
    .unwrap();
    assert_eq!(p.geometry.output_shape(), [1, 4, 3, 3, 3]);
    // i64, as DLPack and PyTorch give them: a negative size is an error.
    let e = Conv3dProblem::new(
        Conv3dParams::default(),
        Conv3dData::F32(&x),
        &[1i64, 2, -3, 3, 3],
        Conv3dData::F32(&w),
        &[4i64, 2, 3, 3, 3],
        None,
    )
    .unwrap_err();
    assert!(matches!(e, Error::Conv3dShape { .. }), "{e}");
}
