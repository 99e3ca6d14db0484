//! The tiled input gradient's operands made on the device: the flipped weight and the zero-inserted `dy`.

use super::Conv3dOps;
use crate::conv3d::Conv3dGeometry;
#[cfg(doc)]
use crate::conv3d::{flip_weight, zero_insert};
use crate::convert::Element;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::raw::backend::KernelOp;
use crate::device::raw::conv3d::check_len;
use crate::device::raw::conv3d::*;
use crate::dtype::DType;
use crate::error::{Error, Result};

impl Conv3dOps<'_> {
    /// Queues the spread of `src` (`dy` of the forward convolution `g`) by
    /// `g`'s stride into `dst` (`[N, K, expanded...]`) on this stream:
    /// zeros everywhere but at multiples of the stride (see
    /// [`zero_insert`]). With `expanded` the output of
    /// [`Conv3dGeometry::data_grad_unstrided`], the input gradient of `g`
    /// is that stride-1 geometry's input gradient of `dst`.
    ///
    /// Errors: [`Error::Conv3dDType`] for a `T` other than f32 and bf16;
    /// [`Error::DeviceMismatch`]; [`Error::LengthMismatch`] for a view that
    /// is not its shape's length; [`Error::Conv3dParam`] for an `expanded`
    /// size below `(O - 1) * s + 1` on some axis (or overflowing);
    /// [`Error::Conv3dTier`] for a zero-size call; the backend's launch
    /// error.
    pub fn zero_insert<T: Element>(
        &self,
        g: &Conv3dGeometry,
        expanded: [usize; 3],
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        const OP: &str = "conv3d_zero_insert";
        if !matches!(T::DTYPE, DType::F32 | DType::BF16) {
            return Err(Error::Conv3dDType {
                tensor: "grad_output",
                dtype: T::DTYPE,
                expected: DType::F32,
            });
        }
        self.check_device(OP, src.device())?;
        self.check_device(OP, dst.device())?;
        let fits = (0..3).all(|a| {
            g.output[a]
                .saturating_sub(1)
                .checked_mul(g.params.stride[a])
                .is_some_and(|last| last < expanded[a])
        });
        let len = expanded
            .iter()
            .try_fold(g.batch * g.out_channels, |n, &e| n.checked_mul(e));
        let Some(len) = len.filter(|_| fits) else {
            return Err(Error::Conv3dParam {
                param: "zero insertion size",
                value: expanded.to_vec(),
                reason: "must hold (output - 1) * stride + 1 on every axis",
            });
        };
        check_len("conv3d zero insertion source", g.output_len(), src.len())?;
        check_len("conv3d zero insertion destination", len, dst.len())?;
        if src.is_empty() || len == 0 {
            return Err(Error::Conv3dTier {
                tier: "tiled",
                reason: "zero-size tensors are not sent to a device",
            });
        }
        let launch = Conv3dZeroInsertLaunch {
            geometry: *g,
            expanded,
            dtype: T::DTYPE,
            src: src.device_ptr(),
            dst: dst.device_ptr(),
        };
        // SAFETY: `src` and `dst` are live ranges of this stream's device
        // of `dy`'s and the destination's lengths (checked), aligned to
        // their element; `dst` is borrowed mutably, so it does not overlap
        // `src`; not empty.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dZeroInsert { args: &launch }, self.raw())
        }
    }

    /// Queues the flip of `src` (the standard-layout weight of the forward
    /// convolution `g`) into `dst` on this stream: the weight of
    /// [`Conv3dGeometry::data_grad_as_forward`], in the standard layout of
    /// that convolution (see [`flip_weight`] for the formula).
    ///
    /// Errors: [`Error::Conv3dDType`] for a `T` other than f32 and bf16;
    /// [`Error::DeviceMismatch`]; [`Error::LengthMismatch`] for a view that
    /// is not the weight's length; [`Error::Conv3dTier`] for a zero-size
    /// weight; the backend's launch error.
    pub fn flip_weight<T: Element>(
        &self,
        g: &Conv3dGeometry,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        const OP: &str = "conv3d_flip_weight";
        if !matches!(T::DTYPE, DType::F32 | DType::BF16) {
            return Err(Error::Conv3dDType {
                tensor: "weight",
                dtype: T::DTYPE,
                expected: DType::F32,
            });
        }
        self.check_device(OP, src.device())?;
        self.check_device(OP, dst.device())?;
        let len = g.weight_shape().iter().product();
        check_len("conv3d flip source", len, src.len())?;
        check_len("conv3d flip destination", len, dst.len())?;
        if len == 0 {
            return Err(Error::Conv3dTier {
                tier: "tiled",
                reason: "zero-size tensors are not sent to a device",
            });
        }
        let launch = Conv3dFlipLaunch {
            geometry: *g,
            dtype: T::DTYPE,
            src: src.device_ptr(),
            dst: dst.device_ptr(),
        };
        // SAFETY: `src` and `dst` are live ranges of this stream's device
        // of the weight's length (checked), aligned to their element; `dst`
        // is borrowed mutably, so it does not overlap `src`; not empty.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dFlipWeight { args: &launch }, self.raw())
        }
    }
}
