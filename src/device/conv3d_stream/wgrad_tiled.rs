//! The tiled weight gradient on a stream.

use super::Conv3dOps;
use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
use crate::convert::Element;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::raw::backend::KernelOp;
use crate::device::raw::conv3d::*;
use crate::error::{Error, Result};

impl Conv3dOps<'_> {
    /// Queues the weight gradient `[K, C/G, KD, KH, KW]` of the forward
    /// convolution `g` from its `input` and `grad_output` by the tiled
    /// split-K kernel (`conv3d_bwd_weight_tiled_*`): `grad_weight` is
    /// zeroed on this stream, then each block adds its partial 64 x 64 tile
    /// (one chunk of the reduction over the batch and the output volume,
    /// [`tiled_wgrad_split`]) with float `atomicAdd`. f32 or bf16 operands
    /// (widened exactly), f32 accumulation and result.
    ///
    /// The chunks' sums arrive in any order, so the result is **not
    /// bit-reproducible** run to run (it differs from
    /// [`Conv3dOps::backward_weight`](crate::device::Conv3dOps::backward_weight) and from itself in the last bits);
    /// the conv3d chain's sampled f64 check applies to it as to every tier.
    ///
    /// Errors: as [`Conv3dOps::backward_weight`](crate::device::Conv3dOps::backward_weight) (the zero-size refusal
    /// as [`Error::Conv3dTier`] `"tiled"`); [`Error::Conv3dTier`] for what
    /// [`tiled_wgrad_unsupported`] names.
    pub fn backward_weight_tiled<T: Element>(
        &self,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        grad_output: &DeviceView<'_, T>,
        grad_weight: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let launch = self.conv3d_backward_launch::<T, f32>(
            (Conv3dBackwardOp::Weight, "tiled"),
            g,
            (grad_output, Some(input)),
            None,
            &grad_weight.as_view(),
        )?;
        if let Some(reason) = tiled_wgrad_unsupported(g) {
            return Err(Error::Conv3dTier {
                tier: "tiled",
                reason,
            });
        }
        let op = KernelOp::Conv3dBackwardWeightTiled { args: &launch };
        // SAFETY: `input` and `grad_output` are live ranges of this
        // stream's device of their shapes' lengths, `grad_weight` of the
        // weight's (checked above), each aligned to its element;
        // `grad_weight` is borrowed mutably (nothing else writes it); the
        // call is not zero-sized.
        unsafe { self.backend().run(&op, self.raw()) }
    }
}
