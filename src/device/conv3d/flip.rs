//! The flipped weight on a device ([`Conv3dFlipLaunch`],
//! [`Stream::conv3d_flip_weight`]): a conv3d weight as the weight of the
//! forward convolution that computes its input gradient at stride 1
//! ([`Conv3dGeometry::data_grad_as_forward`]), made by
//! `conv3d_flip_weight_{u32,u16}`, and the host backend's emulation
//! ([`flip_weight`]).
//!
//! Its own [`KernelOp`] rather than another [`super::Conv3dWeightLayout`]:
//! a layout is the same convolution's weight arranged for a kernel, chosen
//! by the backend per call and reversible; the flip belongs to another
//! convolution (other shape, other geometry), is chosen by the tiled tier
//! for a backward op only, and is faulted as a backward kernel
//! ([`crate::device::faults`]).

use super::layout::check_len;
use crate::conv3d::{flip_weight, Conv3dGeometry};
use crate::convert::Element;
use crate::device::backend::KernelOp;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::info::DevicePtr;
use crate::device::stream::Stream;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One flip of a conv3d weight ([`KernelOp::Conv3dFlipWeight`]): the
/// standard-layout weight at `src` (`geometry.weight_shape()` elements of
/// `dtype`, `[K, C/G, KD, KH, KW]`) into `[C, K/G, KD, KH, KW]` at `dst`
/// (as many elements, every one written): `dst[g*Cg + c, k, a, b, e] =
/// src[g*Kg + k, c, KD-1-a, KH-1-b, KW-1-e]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dFlipLaunch {
    /// The forward convolution whose weight is flipped.
    pub geometry: Conv3dGeometry,
    /// The elements' dtype (F32 or BF16).
    pub dtype: DType,
    /// The standard-layout weight.
    pub src: DevicePtr,
    /// The flipped weight.
    pub dst: DevicePtr,
}

impl Conv3dFlipLaunch {
    /// Elements of the weight (source and destination alike).
    pub fn len(&self) -> usize {
        self.geometry.weight_shape().iter().product()
    }

    /// Whether the weight has no elements (never launched).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Stream {
    /// Queues the flip of `src` (the standard-layout weight of the forward
    /// convolution `g`) into `dst` on this stream: the weight of
    /// [`Conv3dGeometry::data_grad_as_forward`], in the standard layout of
    /// that convolution (see [`flip_weight`] for the formula).
    ///
    /// Errors: [`Error::Conv3dDType`] for a `T` other than f32 and bf16;
    /// [`Error::DeviceMismatch`]; [`Error::LengthMismatch`] for a view that
    /// is not the weight's length; [`Error::Conv3dTier`] for a zero-size
    /// weight; the backend's launch error.
    pub fn conv3d_flip_weight<T: Element>(
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

/// The host backend's [`KernelOp::Conv3dFlipWeight`]: [`flip_weight`].
///
/// # Safety
/// As [`crate::device::Backend::run`]: `src` and `dst` are live host
/// allocations of the weight's length, `dst` exclusive.
pub(crate) unsafe fn host_conv3d_flip(a: &Conv3dFlipLaunch) -> Result<()> {
    let n = a.len();
    if n == 0 {
        return Ok(());
    }
    // SAFETY: the caller's guarantees (host "device" addresses are host
    // addresses); the element size matches the dtype.
    unsafe {
        match a.dtype {
            DType::F32 => flip_typed::<u32>(a, n),
            DType::BF16 => flip_typed::<u16>(a, n),
            other => Err(Error::Conv3dDType {
                tensor: "weight",
                dtype: other,
                expected: DType::F32,
            }),
        }
    }
}

/// # Safety
/// As [`host_conv3d_flip`], with `n` elements of `T`'s size each way.
unsafe fn flip_typed<T: Copy + Send + Sync>(a: &Conv3dFlipLaunch, n: usize) -> Result<()> {
    // SAFETY: the caller's guarantees.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts(a.src.0 as usize as *const T, n),
            std::slice::from_raw_parts_mut(a.dst.0 as usize as *mut T, n),
        )
    };
    flip_weight(&a.geometry, src, dst)
}
