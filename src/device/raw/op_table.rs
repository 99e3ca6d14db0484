//! The kernel operations' table: for each [`KernelOp`] variant, its name
//! and the faults the fault injector (`device::faults`, feature `testing`)
//! applies to it, in one match ([`KernelOp::entry`]). Adding an op is one
//! arm here plus its implementations (the host backend's `run` and the GPU
//! body's `LaunchPlan::of`, which the compiler asks for: their matches are
//! exhaustive; ARCHITECTURE.md, "Adding a kernel op").

use crate::device::info::{ConvertOp, DevicePtr};
use crate::device::raw::backend::KernelOp;
use crate::device::raw::conv3d::{Conv3dBackwardLaunch, Conv3dLaunch};
use crate::dtype::DType;

/// One kernel operation's row: its name and its fault class.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OpEntry<'a> {
    /// The name in errors and fault logs ([`KernelOp::name`]).
    pub(crate) name: &'static str,
    /// Which injected faults it takes, with the operands they act on.
    // Read only by the fault injector (feature `testing`).
    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub(crate) faults: FaultClass<'a>,
}

/// Which injected faults an operation takes, with the operands they act
/// on. Every class also takes the sticky errors.
// Read only by the fault injector (feature `testing`).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
#[derive(Debug, Clone, Copy)]
pub(crate) enum FaultClass<'a> {
    /// A launch failure only.
    Launch,
    /// A launch failure, or `n` elements of `op.to` at `dst` written as
    /// zeros (`ConvertWritesZeros`); `acc`: the fused fingerprint's
    /// accumulator, which then sums the zeros.
    Convert {
        /// The dtypes.
        op: ConvertOp,
        /// The output.
        dst: DevicePtr,
        /// Elements.
        n: u64,
        /// The fused op's accumulator.
        acc: Option<DevicePtr>,
    },
    /// The forward conv3d's faults; `vendor`: `VendorNoAlgorithm` first.
    Conv3d {
        /// The launch.
        args: &'a Conv3dLaunch,
        /// The vendor library's op.
        vendor: bool,
    },
    /// The backward conv3d's faults; `vendor`: `VendorNoAlgorithm` first.
    Conv3dBackward {
        /// The launch.
        args: &'a Conv3dBackwardLaunch,
        /// The vendor library's op.
        vendor: bool,
    },
    /// The tiled backward's arrangement kernels (weight flip, zero
    /// insertion): the backward kernels' output faults over `n` elements
    /// of `dtype` at `dst`.
    TiledBackward {
        /// The output.
        dst: DevicePtr,
        /// Elements.
        n: usize,
        /// Their dtype.
        dtype: DType,
    },
    /// A check kernel: a launch failure or `Conv3dCheckFailure`.
    Check,
}

impl<'a> KernelOp<'a> {
    /// The operation's row of the table.
    pub(crate) fn entry(&self) -> OpEntry<'a> {
        use FaultClass as F;
        let (name, faults) = match *self {
            KernelOp::Convert { op, dst, n, .. } => (
                "convert",
                F::Convert {
                    op,
                    dst,
                    n,
                    acc: None,
                },
            ),
            KernelOp::FingerprintSum { .. } => ("fingerprint_sum", F::Launch),
            KernelOp::ConvertFingerprint {
                op, dst, n, acc, ..
            } => (
                "convert_fingerprint",
                F::Convert {
                    op,
                    dst,
                    n,
                    acc: Some(acc),
                },
            ),
            KernelOp::WidenCheck { .. } => ("widen_check", F::Launch),
            KernelOp::CountNonFinite { .. } => ("count_nonfinite", F::Launch),
            KernelOp::Conv3dGuardDecide { .. } => ("conv3d_guard_decide", F::Check),
            KernelOp::Conv3dGuardCheck { .. } => ("conv3d_guard_check", F::Check),
            KernelOp::ClampNonFinite { .. } => ("clamp_nonfinite", F::Launch),
            KernelOp::Conv3d { args, .. } => (
                "conv3d",
                F::Conv3d {
                    args,
                    vendor: false,
                },
            ),
            KernelOp::Conv3dVendor { args } => ("conv3d_vendor", F::Conv3d { args, vendor: true }),
            KernelOp::Conv3dCheck { .. } => ("conv3d_check", F::Check),
            KernelOp::Conv3dLayout { .. } => ("conv3d_layout", F::Launch),
            KernelOp::Conv3dBackward { args } => (
                "conv3d_backward",
                F::Conv3dBackward {
                    args,
                    vendor: false,
                },
            ),
            KernelOp::Conv3dBackwardCheck { .. } => ("conv3d_backward_check", F::Check),
            KernelOp::Conv3dBackwardVendor { args } => (
                "conv3d_backward_vendor",
                F::Conv3dBackward { args, vendor: true },
            ),
            KernelOp::Conv3dBackwardWeightTiled { args } => (
                "conv3d_backward_weight_tiled",
                F::Conv3dBackward {
                    args,
                    vendor: false,
                },
            ),
            KernelOp::Conv3dFlipWeight { args } => (
                "conv3d_flip_weight",
                F::TiledBackward {
                    dst: args.dst,
                    n: args.len(),
                    dtype: args.dtype,
                },
            ),
            KernelOp::Conv3dZeroInsert { args } => (
                "conv3d_zero_insert",
                F::TiledBackward {
                    dst: args.dst,
                    n: args.len(),
                    dtype: args.dtype,
                },
            ),
        };
        OpEntry { name, faults }
    }
}
