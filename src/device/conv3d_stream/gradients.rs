//! The backward ops on a stream: the gradients of a conv3d and the transposed convolution, by kernel and by the vendor library.

use super::Conv3dOps;
#[cfg(doc)]
use crate::conv3d::sample_index;
use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
use crate::convert::Element;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::raw::backend::KernelOp;
use crate::device::raw::conv3d::check_len;
use crate::device::raw::conv3d::CHECK_MAX_SAMPLES;
use crate::device::raw::conv3d::CHECK_WORDS;
use crate::device::raw::conv3d::*;
use crate::device::raw::conv3d::{bias_refused, operand_name};
use crate::dtype::DType;
use crate::error::{Error, Result};

impl Conv3dOps<'_> {
    /// Checks a backward call's operands (`dy`, the other operand, the bias
    /// of any element type) and result, and builds its launch (`tier`
    /// names the refusal of a zero-size call).
    pub(super) fn conv3d_backward_launch<T: Element, B: Element>(
        &self,
        (op, tier): (Conv3dBackwardOp, &'static str),
        g: &Conv3dGeometry,
        (dy, other): (&DeviceView<'_, T>, Option<&DeviceView<'_, T>>),
        bias: Option<&DeviceView<'_, B>>,
        out: &DeviceView<'_, f32>,
    ) -> Result<Conv3dBackwardLaunch> {
        const OP: &str = "conv3d_backward";
        for (tensor, dtype) in [("grad_output", T::DTYPE), ("bias", B::DTYPE)] {
            if !matches!(dtype, DType::F32 | DType::BF16) {
                return Err(Error::Conv3dDType {
                    tensor,
                    dtype,
                    expected: DType::F32,
                });
            }
        }
        self.check_device(OP, dy.device())?;
        self.check_device(OP, out.device())?;
        check_len("conv3d backward grad_output", g.output_len(), dy.len())?;
        match (op.other_len(g), other) {
            (Some(n), Some(o)) => {
                self.check_device(OP, o.device())?;
                check_len(operand_name(op), n, o.len())?;
            }
            (None, None) => {}
            _ => {
                return Err(Error::Conv3dParam {
                    param: "backward operands",
                    value: vec![usize::from(other.is_some())],
                    reason: "data and weight take a second operand, bias none",
                })
            }
        }
        if let Some(b) = bias {
            if op != Conv3dBackwardOp::Data {
                return Err(bias_refused());
            }
            self.check_device(OP, b.device())?;
            check_len("conv3d backward bias", g.in_channels, b.len())?;
        }
        check_len("conv3d backward output", op.output_len(g), out.len())?;
        if let Some(reason) = op.unsupported(g) {
            return Err(Error::Conv3dTier { tier, reason });
        }
        Ok(Conv3dBackwardLaunch {
            op,
            geometry: *g,
            dtype: T::DTYPE,
            grad_output: dy.device_ptr(),
            other: other.map(|o| o.device_ptr()),
            bias: bias.map(|b| b.device_ptr()),
            output: out.device_ptr(),
        })
    }

    /// The backward op `op` by the naive kernels, or with `vendor` by the
    /// vendor library ([`KernelOp::Conv3dBackwardVendor`]).
    fn conv3d_backward<T: Element>(
        &self,
        (op, vendor): (Conv3dBackwardOp, bool),
        g: &Conv3dGeometry,
        operands: (&DeviceView<'_, T>, Option<&DeviceView<'_, T>>),
        bias: Option<DeviceView<'_, f32>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let tier = if vendor { "vendor" } else { "naive" };
        let launch =
            self.conv3d_backward_launch((op, tier), g, operands, bias.as_ref(), &out.as_view())?;
        let args = &launch;
        let op = if vendor {
            KernelOp::Conv3dBackwardVendor { args }
        } else {
            KernelOp::Conv3dBackward { args }
        };
        // SAFETY: every view is a live range of this stream's device with
        // exactly its shape's length (checked above), aligned to its
        // element; `out` is borrowed mutably (nothing else writes it); the
        // call is not zero-sized.
        unsafe { self.backend().run(&op, self.raw()) }
    }

    /// Queues the input gradient of the forward convolution `g` on this
    /// stream (`conv3d_bwd_data_*`): `grad_input` `[N, C, D, H, W]` from
    /// `grad_output` `[N, K, OD, OH, OW]` and `weight` (standard layout),
    /// plus `bias` (`C` f32, the transposed convolution's) when given. With
    /// [`Conv3dGeometry::transposed`] this is `conv_transpose3d`.
    ///
    /// Errors: [`Error::Conv3dDType`] for a `T` other than f32 and bf16;
    /// [`Error::DeviceMismatch`]; [`Error::LengthMismatch`] for a view
    /// whose length is not its shape's; [`Error::Conv3dTier`] for a
    /// zero-size call; the backend's launch error.
    pub fn backward_data<T: Element>(
        &self,
        g: &Conv3dGeometry,
        grad_output: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: Option<DeviceView<'_, f32>>,
        grad_input: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let ops = (grad_output, Some(weight));
        self.conv3d_backward((Conv3dBackwardOp::Data, false), g, ops, bias, grad_input)
    }

    /// [`Conv3dOps::backward_data`](crate::device::Conv3dOps::backward_data) by the vendor library (cuDNN's
    /// `cudnnConvolutionBackwardData`, MIOpen's
    /// `miopenConvolutionBackwardData`): bf16 operands are widened to f32
    /// on the device first and the library computes in f32 (its bf16 call
    /// would write a bf16 result), then `bias` is added
    /// (`conv3d_bias_f32`). The backend may wait for the stream before
    /// returning (it keeps or frees its workspace).
    ///
    /// Errors: as [`Conv3dOps::backward_data`](crate::device::Conv3dOps::backward_data) (a zero-size call is
    /// [`Error::Conv3dTier`] `"vendor"`); [`Error::VendorUnavailable`]
    /// when the backend has no vendor library, or one without its backward
    /// calls; the library's own error (`Error::Conv3dCudnn`,
    /// [`Error::Conv3dMiopen`]) when it refuses the call.
    pub fn backward_data_vendor<T: Element>(
        &self,
        g: &Conv3dGeometry,
        grad_output: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: Option<DeviceView<'_, f32>>,
        grad_input: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let ops = (grad_output, Some(weight));
        self.conv3d_backward((Conv3dBackwardOp::Data, true), g, ops, bias, grad_input)
    }

    /// [`Conv3dOps::backward_weight`](crate::device::Conv3dOps::backward_weight) by the vendor library (cuDNN's
    /// `cudnnConvolutionBackwardFilter`, MIOpen's
    /// `miopenConvolutionBackwardWeights`), in f32 as
    /// [`Conv3dOps::backward_data_vendor`](crate::device::Conv3dOps::backward_data_vendor). Errors as that.
    pub fn backward_weight_vendor<T: Element>(
        &self,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        grad_output: &DeviceView<'_, T>,
        grad_weight: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let ops = (grad_output, Some(input));
        self.conv3d_backward((Conv3dBackwardOp::Weight, true), g, ops, None, grad_weight)
    }

    /// Queues the weight gradient `[K, C/G, KD, KH, KW]` of the forward
    /// convolution `g` from its `input` and `grad_output`
    /// (`conv3d_bwd_weight_*`). Errors as [`Conv3dOps::backward_data`](crate::device::Conv3dOps::backward_data).
    pub fn backward_weight<T: Element>(
        &self,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        grad_output: &DeviceView<'_, T>,
        grad_weight: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let ops = (grad_output, Some(input));
        self.conv3d_backward((Conv3dBackwardOp::Weight, false), g, ops, None, grad_weight)
    }

    /// Queues the bias gradient `[K]` of `grad_output` (`conv3d_bwd_bias_*`;
    /// `g` as [`Conv3dGeometry::for_bias_grad`] or any geometry of that
    /// output). Errors as [`Conv3dOps::backward_data`](crate::device::Conv3dOps::backward_data).
    pub fn backward_bias<T: Element>(
        &self,
        g: &Conv3dGeometry,
        grad_output: &DeviceView<'_, T>,
        grad_bias: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let ops = (grad_output, None);
        self.conv3d_backward((Conv3dBackwardOp::Bias, false), g, ops, None, grad_bias)
    }

    /// Queues the device check of a backward result `output` (f32) on this
    /// stream: `samples` points of [`sample_index`]`(result_len, seed, j)`,
    /// or with `locate` (one `u64`, zeroed here) the first non-finite
    /// element; `bias` (Data only) as the caller gave it, f32 or bf16.
    /// `results` holds [`CHECK_WORDS`] words per point (decode with
    /// [`crate::device::raw::CheckedPoint::decode`]).
    ///
    /// Errors: as [`Conv3dOps::backward_data`](crate::device::Conv3dOps::backward_data); a `bias` of another
    /// dtype than f32 / bf16; [`Error::LengthMismatch`] for a short
    /// `results`, a `locate` slot that is not one element or `samples` not
    /// 1 with it; [`Error::Conv3dTier`] for more than
    /// [`CHECK_MAX_SAMPLES`] points.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_check<T: Element, B: Element>(
        &self,
        op: Conv3dBackwardOp,
        g: &Conv3dGeometry,
        operands: (&DeviceView<'_, T>, Option<&DeviceView<'_, T>>),
        bias: Option<&DeviceView<'_, B>>,
        output: &DeviceView<'_, f32>,
        (samples, seed): (usize, u64),
        locate: Option<&mut DeviceViewMut<'_, u64>>,
        results: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        const OP: &str = "conv3d_backward_check";
        let launch = self.conv3d_backward_launch((op, "check"), g, operands, bias, output)?;
        self.check_device(OP, results.device())?;
        if samples > CHECK_MAX_SAMPLES {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason: "more sampled points than one check launch takes",
            });
        }
        let slot = match locate {
            Some(slot) => {
                self.check_device(OP, slot.device())?;
                check_len("conv3d backward check locate slot", 1, slot.len())?;
                check_len("conv3d backward check located samples", 1, samples)?;
                slot.memset_zero(self)?;
                Some(slot.device_ptr())
            }
            None => None,
        };
        if samples == 0 {
            return Ok(());
        }
        if results.len() < samples * CHECK_WORDS {
            return Err(Error::LengthMismatch {
                op: "conv3d backward check results",
                expected: samples * CHECK_WORDS,
                actual: results.len(),
                tensor: None,
            });
        }
        let check = Conv3dBackwardCheckLaunch {
            conv: launch,
            bias_dtype: B::DTYPE,
            samples,
            seed,
            locate: slot,
            results: results.device_ptr(),
        };
        // SAFETY: every view is a live range of this stream's device with
        // its shape's length (checked above), aligned to its element;
        // `results` and the slot are borrowed mutably; the operands and
        // the output are only read; the call is not zero-sized.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dBackwardCheck { args: &check }, self.raw())
        }
    }
}
