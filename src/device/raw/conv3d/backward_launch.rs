//! The backward ops of a conv3d on a device ([`Conv3dBackwardLaunch`]:
//! the input's gradient, which is also the transposed convolution, the
//! weight's and the bias's; the first two also by the vendor library),
//! their sampled-point check
//! ([`Conv3dBackwardCheckLaunch`]); the safe entry points are on
//! [`Conv3dOps`](crate::device::Conv3dOps).

#[cfg(doc)]
use super::{CHECK_MAX_SAMPLES, CHECK_WORDS};
#[cfg(doc)]
use crate::conv3d::sample_index;
use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
use crate::device::info::DevicePtr;
use crate::dtype::DType;
use crate::error::Error;

/// One backward call as a backend takes it (`conv3d_bwd_*` kernels), for
/// the forward convolution `geometry` (see [`crate::conv3d`]'s backward
/// docs for what each op computes):
///
/// - `grad_output`: `dy`, `geometry.output_len()` elements of `dtype`;
/// - `other`: the weight (standard layout) for [`Conv3dBackwardOp::Data`],
///   the forward input for [`Conv3dBackwardOp::Weight`], `None` for
///   [`Conv3dBackwardOp::Bias`], of `dtype`;
/// - `bias`: Data only, `in_channels` f32 added to the result (the
///   transposed convolution's bias), or `None`;
/// - `output`: `op.output_len(geometry)` f32, every element written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dBackwardLaunch {
    /// Which gradient.
    pub op: Conv3dBackwardOp,
    /// The forward convolution's sizes.
    pub geometry: Conv3dGeometry,
    /// The operands' dtype: F32 or BF16.
    pub dtype: DType,
    /// `dy`.
    pub grad_output: DevicePtr,
    /// The weight (Data) or the input (Weight).
    pub other: Option<DevicePtr>,
    /// Data only: the f32 bias.
    pub bias: Option<DevicePtr>,
    /// The f32 result.
    pub output: DevicePtr,
}

impl Conv3dBackwardLaunch {
    /// Elements of the f32 result.
    pub fn output_len(&self) -> usize {
        self.op.output_len(&self.geometry)
    }
}

/// One launch of the backward check ([`KernelOp::Conv3dBackwardCheck`](crate::device::raw::KernelOp::Conv3dBackwardCheck)):
/// as [`super::Conv3dCheckLaunch`], for the result of `conv` (its `bias`
/// as the caller gave it, of `bias_dtype`). Sample `j` is the flat result
/// index [`sample_index`]`(result_len, seed, j)`, or with `locate` the
/// first non-finite result element; `results[4j..4j + 4]` receives
/// `(index, value, reference, magnitude)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dBackwardCheckLaunch {
    /// The backward call checked (its `output` is the result read).
    pub conv: Conv3dBackwardLaunch,
    /// The bias's dtype (F32 or BF16; ignored without a bias).
    pub bias_dtype: DType,
    /// Sampled points (`1` with `locate`), at most [`CHECK_MAX_SAMPLES`].
    pub samples: usize,
    /// The seed of the sampled points.
    pub seed: u64,
    /// `Some(slot)`: one zeroed `u64` where the device first stores
    /// `result_len - i` for the first non-finite result element `i`.
    pub locate: Option<DevicePtr>,
    /// `CHECK_WORDS * samples` `u64`s, written.
    pub results: DevicePtr,
}

/// The name of a backward op's second operand in errors.
pub(crate) fn operand_name(op: Conv3dBackwardOp) -> &'static str {
    match op {
        Conv3dBackwardOp::Data => "conv3d backward weight",
        _ => "conv3d backward input",
    }
}

/// The error for a bias given to an op that takes none.
pub(crate) fn bias_refused() -> Error {
    Error::Conv3dParam {
        param: "backward bias",
        value: vec![1],
        reason: "only the data op (the transposed convolution) takes a bias",
    }
}
