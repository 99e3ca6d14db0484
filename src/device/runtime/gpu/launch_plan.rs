//! The GPU body's one encoding entry: every kernel operation as a
//! [`LaunchPlan`], in one exhaustive match ([`LaunchPlan::of`]): the
//! kernel calls it queues (built by `KernelCall`'s constructors: the
//! elementwise ones in `device/kernels.rs`, the conv3d ones in
//! `conv3d_launch.rs`), a zeroing before a kernel that adds into its
//! result, or a vendor library call. `Gpu::run` is this match plus its
//! executor, so an op's GPU side is one arm here.
// Without a GPU backend in the build nothing launches kernels.
#![cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]

use crate::conv3d::Conv3dGeometry;
use crate::device::info::DevicePtr;
use crate::device::kernels::KernelCall;
use crate::device::raw::backend::KernelOp;
use crate::device::raw::conv3d::{
    Conv3dBackwardLaunch, Conv3dKernel, Conv3dLaunch, Conv3dWeightLayout,
};
use crate::dtype::DType;
use crate::error::Result;

/// What the GPU body does for one kernel operation, on the caller's stream.
#[derive(Debug)]
pub(crate) enum LaunchPlan<'a> {
    /// Kernel launches, in order (one; or a locate, then the check that
    /// reads its slot).
    Kernels(Vec<KernelCall>),
    /// Zero `bytes` at `dst`, then launch `call`, which adds into them (the
    /// tiled weight gradient's split-K partial sums).
    ZeroThen {
        /// The result zeroed.
        dst: DevicePtr,
        /// Its length in bytes.
        bytes: usize,
        /// The launch that adds into it.
        call: KernelCall,
    },
    /// The vendor library's forward convolution (and its epilogues).
    Vendor(&'a Conv3dLaunch),
    /// The vendor library's backward op (and its widenings and epilogue).
    VendorBackward(&'a Conv3dBackwardLaunch),
}

/// The weight layout the backend chose for a forward call (the conv3d
/// launch reads its weight in it): `Backend::conv3d_weight_layout`.
pub(crate) type LayoutOf<'f> =
    &'f dyn Fn(Conv3dKernel, DType, &Conv3dGeometry) -> Conv3dWeightLayout;

impl<'a> LaunchPlan<'a> {
    /// The plan of `op` on a device of `mps` multiprocessors, or the
    /// encoding's refusal (a dtype or size the kernel does not take).
    pub(crate) fn of(op: &KernelOp<'a>, mps: u32, layout: LayoutOf<'_>) -> Result<LaunchPlan<'a>> {
        let one = |call: KernelCall| LaunchPlan::Kernels(vec![call]);
        Ok(match *op {
            KernelOp::Convert { .. }
            | KernelOp::FingerprintSum { .. }
            | KernelOp::ConvertFingerprint { .. }
            | KernelOp::WidenCheck { .. }
            | KernelOp::CountNonFinite { .. }
            | KernelOp::ClampNonFinite { .. } => one(KernelCall::for_op(op, mps)?),
            // The caller arranged the weight in this (deterministic) layout.
            KernelOp::Conv3d { kernel, args } => {
                one(match layout(kernel, args.dtype, &args.geometry) {
                    Conv3dWeightLayout::TiledPacked { rows, cols } => {
                        KernelCall::conv3d_tiled_mma(args, rows, cols)?
                    }
                    _ => KernelCall::conv3d(kernel, args)?,
                })
            }
            KernelOp::Conv3dVendor { args } => LaunchPlan::Vendor(args),
            KernelOp::Conv3dBackwardVendor { args } => LaunchPlan::VendorBackward(args),
            KernelOp::Conv3dCheck { args } => {
                LaunchPlan::Kernels(KernelCall::conv3d_check(args, mps)?)
            }
            KernelOp::Conv3dLayout { args } => one(KernelCall::conv3d_layout(args, mps)?),
            KernelOp::Conv3dBackward { args } => one(KernelCall::conv3d_backward(args)?),
            KernelOp::Conv3dGuardDecide { args } => one(KernelCall::conv3d_guard_decide(args)?),
            KernelOp::Conv3dGuardCheck { args } => one(KernelCall::conv3d_guard_check(args, mps)?),
            KernelOp::Conv3dBackwardCheck { args } => {
                LaunchPlan::Kernels(KernelCall::conv3d_backward_check(args, mps)?)
            }
            KernelOp::Conv3dBackwardWeightTiled { args } => LaunchPlan::ZeroThen {
                dst: args.output,
                bytes: args.output_len() * std::mem::size_of::<f32>(),
                call: KernelCall::conv3d_bwd_weight_tiled(args, mps)?,
            },
            KernelOp::Conv3dFlipWeight { args } => one(KernelCall::conv3d_flip_weight(args, mps)?),
            KernelOp::Conv3dZeroInsert { args } => one(KernelCall::conv3d_zero_insert(args, mps)?),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d::{Conv3dBackwardOp, Conv3dParams};
    use crate::device::kernels::Kernel;

    #[test]
    fn each_op_has_its_plan() {
        let params = Conv3dParams::default().with_padding([1; 3]);
        let g = Conv3dGeometry::new(params, &[1, 8, 4, 4, 4], &[8, 8, 3, 3, 3]).unwrap();
        let standard = |_: Conv3dKernel, _: DType, _: &Conv3dGeometry| Conv3dWeightLayout::Standard;
        let fwd = Conv3dLaunch {
            geometry: g,
            dtype: DType::F32,
            input: DevicePtr(0x100),
            weight: DevicePtr(0x200),
            bias: None,
            output: DevicePtr(0x300),
            output_dtype: DType::F32,
            gate: None,
        };
        let vendor = LaunchPlan::of(&KernelOp::Conv3dVendor { args: &fwd }, 4, &standard).unwrap();
        assert!(matches!(vendor, LaunchPlan::Vendor(a) if std::ptr::eq(a, &fwd)));
        let naive = KernelOp::Conv3d {
            kernel: Conv3dKernel::Naive,
            args: &fwd,
        };
        let plan = LaunchPlan::of(&naive, 4, &standard).unwrap();
        assert!(
            matches!(plan, LaunchPlan::Kernels(ref c) if c.len() == 1 && c[0].kernel == Kernel::Conv3dNaiveF32),
            "{plan:?}"
        );
        // The tiled call reads its weight in the layout the backend chose.
        let packed = |_: Conv3dKernel, _: DType, g: &Conv3dGeometry| {
            Conv3dWeightLayout::packed_for(g).unwrap_or(Conv3dWeightLayout::TiledTransposed)
        };
        let bf16 = Conv3dLaunch {
            dtype: DType::BF16,
            ..fwd
        };
        let tiled = KernelOp::Conv3d {
            kernel: Conv3dKernel::Tiled,
            args: &bf16,
        };
        let plan = LaunchPlan::of(&tiled, 4, &packed).unwrap();
        assert!(
            matches!(plan, LaunchPlan::Kernels(ref c) if c[0].kernel == Kernel::Conv3dTiledBf16Mma),
            "{plan:?}"
        );
        // The tiled weight gradient adds into its zeroed result.
        let bwd = Conv3dBackwardLaunch {
            op: Conv3dBackwardOp::Weight,
            geometry: g,
            dtype: DType::F32,
            grad_output: DevicePtr(0x400),
            other: Some(DevicePtr(0x100)),
            bias: None,
            output: DevicePtr(0x500),
        };
        let wgrad = KernelOp::Conv3dBackwardWeightTiled { args: &bwd };
        match LaunchPlan::of(&wgrad, 4, &standard).unwrap() {
            LaunchPlan::ZeroThen { dst, bytes, call } => {
                assert_eq!((dst, bytes), (DevicePtr(0x500), 8 * 8 * 27 * 4));
                assert_eq!(call.kernel, Kernel::Conv3dBwdWeightTiledF32);
            }
            other => panic!("{other:?}"),
        }
        // An encoding's refusal is the plan's.
        let f16 = Conv3dLaunch {
            dtype: DType::F16,
            ..fwd
        };
        let bad = KernelOp::Conv3d {
            kernel: Conv3dKernel::Naive,
            args: &f16,
        };
        assert!(LaunchPlan::of(&bad, 4, &standard).is_err());
    }
}
