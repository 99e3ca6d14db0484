//! The launch descriptions' parameter lists and grids, checked.

use super::*;
use crate::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
use crate::device::kernels::KernelModule;
use std::ffi::c_void;

fn read_u64(p: *mut c_void) -> u64 {
    // SAFETY: the test reads back pointers `arg_ptrs` made to u64s.
    unsafe { *p.cast::<u64>() }
}

#[test]
fn conv3d_calls_size_their_grid_and_args() {
    let x = vec![0f32; 2 * 6 * 7 * 9 * 11];
    let w = vec![0f32; 16 * 6 * 27];
    let p = Conv3dProblem::new(
        Conv3dParams::default()
            .with_stride([2; 3])
            .with_padding([2; 3]),
        Conv3dData::F32(&x),
        &[2, 6, 7, 9, 11],
        Conv3dData::F32(&w),
        &[16, 6, 3, 3, 3],
        None,
    )
    .unwrap();
    let g = p.geometry;
    let a = Conv3dLaunch {
        geometry: g,
        dtype: DType::BF16,
        input: DevicePtr(256),
        weight: DevicePtr(512),
        bias: None,
        output: DevicePtr(1024),
        output_dtype: DType::F32,
        gate: None,
    };
    let mut c = KernelCall::conv3d(Conv3dKernel::Tiled, &a).unwrap();
    assert_eq!(c.kernel, Kernel::Conv3dTiledBf16);
    let points = 2 * g.output.iter().product::<usize>();
    assert_eq!(c.grid, [points.div_ceil(128) as u32, 1, 1]);
    assert_eq!(&c.args[5..], &[KernelArg::U64(0), KernelArg::U64(0)]);
    // A gated launch over a bf16 output: the tiled kernels take both,
    // the naive kernel neither.
    let gated = Conv3dLaunch {
        output_dtype: DType::BF16,
        gate: Some(DevicePtr(2048)),
        ..a
    };
    let gc = KernelCall::conv3d(Conv3dKernel::Tiled, &gated).unwrap();
    assert_eq!(&gc.args[5..], &[KernelArg::U64(2048), KernelArg::U64(1)]);
    assert!(KernelCall::conv3d(Conv3dKernel::Naive, &gated).is_err());
    assert!(KernelCall::conv3d(
        Conv3dKernel::Tiled,
        &Conv3dLaunch {
            output_dtype: DType::F16,
            ..a
        }
    )
    .is_err());
    let ptrs = c.arg_ptrs();
    assert_eq!(ptrs.len(), 7);
    assert_eq!(
        ptrs[..4].iter().map(|&q| read_u64(q)).collect::<Vec<_>>(),
        [256, 512, 0, 1024]
    );
    // SAFETY: the fifth argument is the args struct.
    let args = unsafe { *ptrs[4].cast::<Conv3dArgs>() };
    assert_eq!((args.n, args.c, args.k, args.has_bias), (2, 6, 16, 0));
    assert_eq!(
        (args.od, args.sd, args.pd, args.groups),
        (g.output[0] as u64, 2, 2, 1)
    );
    let naive = KernelCall::conv3d(
        Conv3dKernel::Naive,
        &Conv3dLaunch {
            dtype: DType::F32,
            bias: Some(DevicePtr(8)),
            ..a
        },
    )
    .unwrap();
    assert_eq!(naive.kernel, Kernel::Conv3dNaiveF32);
    assert_eq!(naive.args[2], KernelArg::U64(8));
    assert_eq!(naive.grid, [g.output_len().div_ceil(256) as u32, 1, 1]);
    assert!(KernelCall::conv3d(
        Conv3dKernel::Naive,
        &Conv3dLaunch {
            dtype: DType::F16,
            ..a
        }
    )
    .is_err());
    let w = KernelCall::conv3d_widen_bias(&a, DevicePtr(4096), 4);
    assert_eq!(w.args.len(), 7);
    assert_eq!(w.args[6], KernelArg::U64(0));
    let b = KernelCall::conv3d_bias(&a, DevicePtr(8), 4);
    assert_eq!(b.args[4], KernelArg::U64(16));
    // The tensor-core kernel: packed weights, grid y = rows / 128.
    let Some(super::super::Conv3dWeightLayout::TiledPacked { rows, cols }) =
        super::super::Conv3dWeightLayout::packed_for(&g)
    else {
        panic!("the packed layout takes this geometry");
    };
    assert_eq!((rows, cols), (128, (6 * 27usize).next_multiple_of(32)));
    let m = KernelCall::conv3d_tiled_mma(&a, rows, cols).unwrap();
    assert_eq!(m.kernel, Kernel::Conv3dTiledBf16Mma);
    assert_eq!(m.grid, [points.div_ceil(128) as u32, 1, 1]);
    assert_eq!(m.args.len(), 9);
    assert_eq!(
        &m.args[5..],
        &[
            KernelArg::U64(cols as u64),
            KernelArg::U64(128),
            KernelArg::U64(0),
            KernelArg::U64(0)
        ]
    );
    assert!(KernelCall::conv3d_tiled_mma(&a, rows, cols + 32).is_err());
    assert!(KernelCall::conv3d_tiled_mma(
        &Conv3dLaunch {
            dtype: DType::F32,
            ..a
        },
        rows,
        cols
    )
    .is_err());
    assert!(!Kernel::all().contains(&Kernel::Conv3dTiledBf16Mma));
}

#[test]
fn backward_calls_carry_their_parameter_lists_and_grids() {
    let params = Conv3dParams::default().with_stride([2; 3]).with_groups(2);
    let g =
        crate::conv3d::Conv3dGeometry::new(params, &[2, 4, 7, 9, 11], &[6, 2, 3, 3, 3]).unwrap();
    let a = Conv3dBackwardLaunch {
        op: Conv3dBackwardOp::Data,
        geometry: g,
        dtype: DType::F32,
        grad_output: DevicePtr(256),
        other: Some(DevicePtr(512)),
        bias: Some(DevicePtr(768)),
        output: DevicePtr(1024),
    };
    let mut c = KernelCall::conv3d_backward(&a).unwrap();
    assert_eq!(c.kernel, Kernel::Conv3dBwdDataF32);
    let dx = 2 * 4 * 7 * 9 * 11;
    assert_eq!(c.grid, [(dx as u32).div_ceil(256), 1, 1]);
    let ptrs = c.arg_ptrs();
    assert_eq!(
        ptrs[..4].iter().map(|&q| read_u64(q)).collect::<Vec<_>>(),
        [256, 512, 768, 1024]
    );
    // SAFETY: the fifth argument is the args struct.
    let args = unsafe { *ptrs[4].cast::<Conv3dArgs>() };
    assert_eq!((args.c, args.k, args.groups, args.has_bias), (4, 6, 2, 1));
    // Weight: (x, dy, dw), one block per dw element; no bias flag.
    let w = Conv3dBackwardLaunch {
        op: Conv3dBackwardOp::Weight,
        dtype: DType::BF16,
        ..a
    };
    let c = KernelCall::conv3d_backward(&w).unwrap();
    assert_eq!(c.kernel, Kernel::Conv3dBwdWeightBf16);
    assert_eq!(c.grid, [6 * 2 * 27, 1, 1]);
    assert_eq!(
        &c.args[..3],
        &[
            KernelArg::U64(512),
            KernelArg::U64(256),
            KernelArg::U64(1024)
        ]
    );
    assert!(matches!(c.args[3], KernelArg::Conv3d(x) if x.has_bias == 0));
    let b = Conv3dBackwardLaunch {
        op: Conv3dBackwardOp::Bias,
        other: None,
        bias: None,
        ..a
    };
    let c = KernelCall::conv3d_backward(&b).unwrap();
    assert_eq!(
        (c.kernel, c.grid, c.args.len()),
        (Kernel::Conv3dBwdBiasF32, [6, 1, 1], 3)
    );
    // A missing operand and another dtype are refused.
    assert!(KernelCall::conv3d_backward(&Conv3dBackwardLaunch { other: None, ..a }).is_err());
    assert!(KernelCall::conv3d_backward(&Conv3dBackwardLaunch {
        dtype: DType::F16,
        ..a
    })
    .is_err());
    // The check: locate then check, or the check alone.
    let chk = Conv3dBackwardCheckLaunch {
        conv: w,
        bias_dtype: DType::F32,
        samples: 5,
        seed: 9,
        locate: Some(DevicePtr(64)),
        results: DevicePtr(4096),
    };
    let calls = KernelCall::conv3d_backward_check(&chk, 4).unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].kernel, Kernel::Conv3dLocateNonfiniteF32);
    assert_eq!(calls[1].kernel, Kernel::Conv3dBwdCheckBf16);
    assert_eq!(calls[1].grid, [5, 1, 1]);
    assert_eq!(calls[1].args.len(), 11);
    assert_eq!(calls[1].args[7], KernelArg::U64(1));
    assert_eq!(calls[1].args[10], KernelArg::U64(64));
    let none = Conv3dBackwardCheckLaunch {
        locate: None,
        samples: 0,
        ..chk
    };
    assert!(KernelCall::conv3d_backward_check(&none, 4).is_err());
    for k in [Kernel::Conv3dBwdDataF32, Kernel::Conv3dBwdCheckBf16] {
        assert!(Kernel::all().contains(&k));
        assert_eq!(k.module(), KernelModule::Conv3d);
    }
}

#[test]
fn flip_calls_carry_the_channels_per_group_and_kernel() {
    let params = Conv3dParams::default().with_groups(2);
    let g = crate::conv3d::Conv3dGeometry::new(params, &[1, 4, 5, 6, 7], &[6, 2, 3, 2, 1]).unwrap();
    let a = Conv3dFlipLaunch {
        geometry: g,
        dtype: DType::BF16,
        src: DevicePtr(256),
        dst: DevicePtr(512),
    };
    let c = KernelCall::conv3d_flip_weight(&a, 4).unwrap();
    assert_eq!(c.kernel, Kernel::Conv3dFlipWeightU16);
    assert_eq!(c.kernel.symbol(), "conv3d_flip_weight_u16");
    assert_eq!(c.grid, [(6 * 2 * 6u32).div_ceil(256), 1, 1]);
    let want = [256, 512, 6 * 2 * 6, 2, 3, 3, 2, 1].map(KernelArg::U64);
    assert_eq!(c.args, want);
    let f = KernelCall::conv3d_flip_weight(
        &Conv3dFlipLaunch {
            dtype: DType::F32,
            ..a
        },
        4,
    )
    .unwrap();
    assert_eq!(f.kernel, Kernel::Conv3dFlipWeightU32);
    let bad = Conv3dFlipLaunch {
        dtype: DType::F16,
        ..a
    };
    assert!(KernelCall::conv3d_flip_weight(&bad, 4).is_err());
    for k in [Kernel::Conv3dFlipWeightU32, Kernel::Conv3dFlipWeightU16] {
        assert!(Kernel::all().contains(&k));
        assert_eq!(k.module(), KernelModule::Conv3d);
    }
}

#[test]
fn zero_insert_calls_carry_both_sizes_and_the_stride() {
    let params = Conv3dParams::default().with_stride([2, 1, 3]);
    let g =
        crate::conv3d::Conv3dGeometry::new(params, &[2, 4, 7, 6, 10], &[5, 4, 3, 3, 3]).unwrap();
    assert_eq!(g.output, [3, 4, 3]);
    let a = Conv3dZeroInsertLaunch {
        geometry: g,
        expanded: [5, 4, 8],
        dtype: DType::F32,
        src: DevicePtr(256),
        dst: DevicePtr(512),
    };
    let total = 2 * 5 * 5 * 4 * 8;
    assert_eq!(a.len(), total);
    let c = KernelCall::conv3d_zero_insert(&a, 4).unwrap();
    assert_eq!(c.kernel, Kernel::Conv3dZeroInsertU32);
    assert_eq!(c.kernel.symbol(), "conv3d_zero_insert_u32");
    assert_eq!(c.grid, [(total as u32).div_ceil(256), 1, 1]);
    let want = [256, 512, total as u64, 3, 4, 3, 5, 4, 8, 2, 1, 3].map(KernelArg::U64);
    assert_eq!(c.args, want);
    let b = Conv3dZeroInsertLaunch {
        dtype: DType::BF16,
        ..a
    };
    assert_eq!(
        KernelCall::conv3d_zero_insert(&b, 4).unwrap().kernel,
        Kernel::Conv3dZeroInsertU16
    );
    let bad = Conv3dZeroInsertLaunch {
        dtype: DType::I8,
        ..a
    };
    assert!(KernelCall::conv3d_zero_insert(&bad, 4).is_err());
    for k in [Kernel::Conv3dZeroInsertU32, Kernel::Conv3dZeroInsertU16] {
        assert!(Kernel::all().contains(&k));
        assert_eq!(k.module(), KernelModule::Conv3d);
    }
}

#[test]
fn the_launch_takes_the_weight_gradient_only() {
    use crate::conv3d::Conv3dGeometry;
    let geom = |x: [usize; 5], w: [usize; 5], p| Conv3dGeometry::new(p, &x, &w).unwrap();
    let p = Conv3dParams::default().with_padding([1; 3]).with_groups(2);
    let g = geom([2, 16, 4, 5, 6], [16, 8, 3, 3, 3], p);
    let mut a = Conv3dBackwardLaunch {
        op: Conv3dBackwardOp::Weight,
        geometry: g,
        dtype: DType::BF16,
        grad_output: DevicePtr(0x1000),
        other: Some(DevicePtr(0x2000)),
        bias: None,
        output: DevicePtr(0x3000),
    };
    let call = KernelCall::conv3d_bwd_weight_tiled(&a, 8).unwrap();
    let split = tiled_wgrad_split(&g, 8).unwrap();
    assert_eq!(call.kernel, Kernel::Conv3dBwdWeightTiledBf16);
    assert_eq!(call.grid, split.grid);
    // 8 * 27 columns: 4 tiles; one row tile per group.
    assert_eq!(&call.grid[..2], &[4, 2]);
    assert_eq!(call.args.len(), 5);
    assert!(matches!(call.args[0], KernelArg::U64(0x2000)));
    assert!(matches!(call.args[1], KernelArg::U64(0x1000)));
    assert!(matches!(call.args[2], KernelArg::U64(0x3000)));
    assert!(matches!(call.args[4], KernelArg::U64(c) if c == split.chunk));
    a.dtype = DType::F32;
    let call = KernelCall::conv3d_bwd_weight_tiled(&a, 8).unwrap();
    assert_eq!(call.kernel, Kernel::Conv3dBwdWeightTiledF32);
    a.op = Conv3dBackwardOp::Data;
    assert!(KernelCall::conv3d_bwd_weight_tiled(&a, 8).is_err());
    a.op = Conv3dBackwardOp::Weight;
    a.dtype = DType::F16;
    assert!(KernelCall::conv3d_bwd_weight_tiled(&a, 8).is_err());
}
