//! The chain's device check of a conv3d output and the weight layouts made on the device.

use super::Conv3dOps;
#[cfg(doc)]
use crate::conv3d::sample_index;
use crate::conv3d::Conv3dGeometry;
use crate::convert::Element;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::raw::backend::KernelOp;
use crate::device::raw::conv3d::check_len;
use crate::device::raw::conv3d::*;
use crate::device::raw::conv3d::{Conv3dLaunch, Conv3dWeightLayout};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The bias of a check, as the caller holds it (f32 or bf16).
pub type CheckBias<'r, 'v, B> = Option<&'r DeviceView<'v, B>>;

/// A check's operands and the output checked: input, weight, bias,
/// output (the input's and weight's dtype `T`, the bias's `B`, the
/// output's `Y`).
pub type CheckOperands<'r, 'v, T, B, Y> = (
    &'r DeviceView<'v, T>,
    &'r DeviceView<'v, T>,
    CheckBias<'r, 'v, B>,
    &'r DeviceView<'v, Y>,
);

impl Conv3dOps<'_> {
    /// Queues the device check of a conv3d's output on this stream (no
    /// synchronisation; read `results` back after it): `samples` points
    /// of [`sample_index`]`(output_len, seed, j)`, or with `locate` (one
    /// `u64`, zeroed here) the first non-finite output point. `weight` is
    /// in the standard layout; `bias` (f32 or bf16) as given; `output` f32,
    /// or bf16 (an output another library computed; not with `locate`).
    /// `results`
    /// holds [`CHECK_WORDS`] words per point (see [`Conv3dCheckLaunch`];
    /// decode with [`CheckedPoint::decode`]).
    ///
    /// Errors: [`Error::Conv3dDType`] for operands, a bias or an output
    /// other than f32 / bf16, or a bf16 output with `locate`;
    /// [`Error::DeviceMismatch`];
    /// [`Error::LengthMismatch`] for a view whose length is not its
    /// shape's, a `results` shorter than the points need, a `locate` slot
    /// that is not one element, or `samples` not 1 with `locate`;
    /// [`Error::Conv3dTier`] for zero-size calls or more than
    /// [`CHECK_MAX_SAMPLES`] points; the backend's launch error.
    #[allow(clippy::too_many_arguments)]
    pub fn check<T: Element, B: Element, Y: Element>(
        &self,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: CheckBias<'_, '_, B>,
        output: &DeviceView<'_, Y>,
        sampling: (usize, u64),
        locate: Option<&mut DeviceViewMut<'_, u64>>,
        results: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        let operands = (input, weight, bias, output);
        self.check_gated(g, operands, sampling, locate, results, None)
    }

    /// [`Conv3dOps::check`](crate::device::Conv3dOps::check) with a `gate` (one `u64` of this device):
    /// the check runs only when the gate is non-zero as it starts (the
    /// guarded fallback's check of work it may skip; `None` runs always).
    /// Operands: input, weight, bias, output.
    ///
    /// Errors: as [`Conv3dOps::check`](crate::device::Conv3dOps::check), and [`Error::LengthMismatch`]
    /// for a gate that is not one element.
    pub fn check_gated<T: Element, B: Element, Y: Element>(
        &self,
        g: &Conv3dGeometry,
        (input, weight, bias, output): CheckOperands<'_, '_, T, B, Y>,
        (samples, seed): (usize, u64),
        locate: Option<&mut DeviceViewMut<'_, u64>>,
        results: &mut DeviceViewMut<'_, u64>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "conv3d_check";
        let mut launch = self.check_launch(
            g,
            (input, weight, bias, output),
            (samples, seed),
            results,
            gate,
        )?;
        let slot = match locate {
            Some(_) if Y::DTYPE != DType::F32 => {
                return Err(Error::Conv3dDType {
                    tensor: "output",
                    dtype: Y::DTYPE,
                    expected: DType::F32,
                })
            }
            Some(slot) => {
                self.check_device(OP, slot.device())?;
                check_len("conv3d check locate slot", 1, slot.len())?;
                check_len("conv3d check located samples", 1, samples)?;
                slot.memset_zero(self)?;
                Some(slot.device_ptr())
            }
            None => None,
        };
        if samples == 0 {
            return Ok(());
        }
        launch.locate = slot;
        // SAFETY: every view is a live range of this stream's device with
        // its shape's length (checked above), aligned to its element;
        // `results` (at least `CHECK_WORDS * samples` words) and the slot
        // are borrowed mutably, so nothing else accesses them; the operands
        // and the output are only read; the call is not zero-sized.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dCheck { args: &launch }, self.raw())
        }
    }

    /// The launch of a check of `samples` points of the call `g` into
    /// `results` (no located point), every range validated as
    /// [`Conv3dOps::check_gated`](crate::device::Conv3dOps::check_gated) documents; `samples` may be 0.
    pub(super) fn check_launch<T: Element, B: Element, Y: Element>(
        &self,
        g: &Conv3dGeometry,
        (input, weight, bias, output): CheckOperands<'_, '_, T, B, Y>,
        (samples, seed): (usize, u64),
        results: &DeviceViewMut<'_, u64>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<Conv3dCheckLaunch> {
        const OP: &str = "conv3d_check";
        let gate = self.gate_ptr((OP, "conv3d check gate"), gate)?;
        let checked = [
            ("input", T::DTYPE),
            ("bias", B::DTYPE),
            ("output", Y::DTYPE),
        ];
        for (tensor, dtype) in checked {
            if !matches!(dtype, DType::F32 | DType::BF16) {
                return Err(Error::Conv3dDType {
                    tensor,
                    dtype,
                    expected: DType::F32,
                });
            }
        }
        for d in [input.device(), weight.device(), output.device()] {
            self.check_device(OP, d)?;
        }
        self.check_device(OP, results.device())?;
        if let Some(b) = bias {
            self.check_device(OP, b.device())?;
            check_len("conv3d check bias", g.out_channels, b.len())?;
        }
        let product = |s: [usize; 5]| s.iter().product::<usize>();
        check_len("conv3d check input", product(g.input_shape()), input.len())?;
        check_len(
            "conv3d check weight",
            product(g.weight_shape()),
            weight.len(),
        )?;
        check_len("conv3d check output", g.output_len(), output.len())?;
        if let Some(reason) = crate::device::raw::conv3d::Conv3dKernel::Naive.unsupported(g) {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason,
            });
        }
        if samples > CHECK_MAX_SAMPLES {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason: "more sampled points than one check launch takes",
            });
        }
        if results.len() < samples * CHECK_WORDS {
            return Err(Error::LengthMismatch {
                op: "conv3d check results",
                expected: samples * CHECK_WORDS,
                actual: results.len(),
                tensor: None,
            });
        }
        Ok(Conv3dCheckLaunch {
            conv: Conv3dLaunch {
                geometry: *g,
                dtype: T::DTYPE,
                input: input.device_ptr(),
                weight: weight.device_ptr(),
                bias: bias.map(|b| b.device_ptr()),
                output: output.device_ptr(),
                output_dtype: Y::DTYPE,
                gate,
            },
            bias_dtype: B::DTYPE,
            output_dtype: Y::DTYPE,
            samples,
            seed,
            locate: None,
            results: results.device_ptr(),
        })
    }

    /// Queues the rearrangement of `src` (a standard-layout weight of the
    /// call `g`) into `layout` at `dst` on this stream: the layout a tiled
    /// kernel reads ([`Conv3dOps::weight_layout`](crate::device::Conv3dOps::weight_layout)), made on the device.
    /// [`Conv3dWeightLayout::Standard`] is a device-to-device copy.
    ///
    /// Errors: [`Error::Conv3dDType`] for a `T` other than f32 and bf16, or
    /// a packed layout of f32; [`Error::DeviceMismatch`];
    /// [`Error::LengthMismatch`] for a `src` that is not the weight's length
    /// or a `dst` that is not the layout's; [`Error::Conv3dTier`] for a
    /// zero-size weight; the backend's launch error.
    pub fn arrange_weight<T: Element>(
        &self,
        layout: Conv3dWeightLayout,
        g: &Conv3dGeometry,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        self.arrange_weight_gated(layout, g, src, dst, None)
    }

    /// [`Conv3dOps::arrange_weight`](crate::device::Conv3dOps::arrange_weight) behind a `gate` (one `u64` of this
    /// device: the layout is made only when it is non-zero as the kernel
    /// starts; the guarded fallback's repair). The standard layout (a
    /// copy) takes no gate.
    ///
    /// Errors: as [`Conv3dOps::arrange_weight`](crate::device::Conv3dOps::arrange_weight);
    /// [`Error::LengthMismatch`] for a gate that is not one element;
    /// [`Error::Conv3dTier`] for a gate on the standard layout.
    pub fn arrange_weight_gated<T: Element>(
        &self,
        layout: Conv3dWeightLayout,
        g: &Conv3dGeometry,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "conv3d_layout";
        let gate = self.gate_ptr((OP, "conv3d layout gate"), gate)?;
        if gate.is_some() && layout == Conv3dWeightLayout::Standard {
            return Err(Error::Conv3dTier {
                tier: "layout",
                reason: "the standard layout is a copy and takes no gate",
            });
        }
        let packed = matches!(layout, Conv3dWeightLayout::TiledPacked { .. });
        if !matches!(T::DTYPE, DType::F32 | DType::BF16) || (packed && T::DTYPE != DType::BF16) {
            return Err(Error::Conv3dDType {
                tensor: "weight",
                dtype: T::DTYPE,
                expected: if packed { DType::BF16 } else { DType::F32 },
            });
        }
        self.check_device(OP, src.device())?;
        self.check_device(OP, dst.device())?;
        check_len(
            "conv3d layout source",
            g.weight_shape().iter().product(),
            src.len(),
        )?;
        check_len("conv3d layout destination", layout.len(g), dst.len())?;
        if src.is_empty() || dst.is_empty() {
            return Err(Error::Conv3dTier {
                tier: "layout",
                reason: "zero-size tensors are not sent to a device",
            });
        }
        if layout == Conv3dWeightLayout::Standard {
            return dst.copy_dtod(self, src);
        }
        let launch = Conv3dLayoutLaunch {
            geometry: *g,
            dtype: T::DTYPE,
            layout,
            src: src.device_ptr(),
            dst: dst.device_ptr(),
            gate,
        };
        // SAFETY: `src` and `dst` are live ranges of this stream's device
        // of the weight's and the layout's lengths (checked), aligned to
        // their element; `dst` is borrowed mutably; the op is not empty.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dLayout { args: &launch }, self.raw())
        }
    }
}
