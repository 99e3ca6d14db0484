//! [`Conv3dOps::forward`](crate::device::Conv3dOps::forward) and [`Conv3dOps::vendor`](crate::device::Conv3dOps::vendor): a forward conv3d on a stream.

use super::Conv3dOps;
use crate::conv3d::Conv3dGeometry;
use crate::convert::Element;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::raw::backend::KernelOp;
use crate::device::raw::conv3d::*;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A conv3d call's operands: input, weight (in the kernel's layout), bias.
pub(crate) type Operands<'r, 'v, T> = (
    &'r DeviceView<'v, T>,
    &'r DeviceView<'v, T>,
    Option<DeviceView<'v, f32>>,
);

impl Conv3dOps<'_> {
    /// The weight layout `kernel` reads on this stream's device for a call
    /// `g` with inputs of `dtype` (lay the weight out with
    /// [`Conv3dWeightLayout::arrange`] before uploading it).
    pub fn weight_layout(
        &self,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &Conv3dGeometry,
    ) -> Conv3dWeightLayout {
        self.backend().conv3d_weight_layout(kernel, dtype, g)
    }

    /// Checks a conv3d call's operands (input, weight, bias) and output and
    /// builds its launch description.
    fn conv3d_launch<T: Element, Y: Element>(
        &self,
        op: &'static str,
        layout: Conv3dWeightLayout,
        g: &Conv3dGeometry,
        (input, weight, bias): Operands<'_, '_, T>,
        out: &mut DeviceViewMut<'_, Y>,
    ) -> Result<Conv3dLaunch> {
        if !matches!(T::DTYPE, DType::F32 | DType::BF16) {
            return Err(Error::Conv3dDType {
                tensor: "input",
                dtype: T::DTYPE,
                expected: DType::F32,
            });
        }
        self.check_device(op, input.device())?;
        self.check_device(op, weight.device())?;
        self.check_device(op, out.device())?;
        if let Some(b) = &bias {
            self.check_device(op, b.device())?;
        }
        let product = |s: [usize; 5]| s.iter().product::<usize>();
        check_len("conv3d device input", product(g.input_shape()), input.len())?;
        check_len("conv3d device weight", layout.len(g), weight.len())?;
        if let Some(b) = &bias {
            check_len("conv3d device bias", g.out_channels, b.len())?;
        }
        check_len("conv3d device output", g.output_len(), out.len())?;
        Ok(Conv3dLaunch {
            geometry: *g,
            dtype: T::DTYPE,
            input: input.device_ptr(),
            weight: weight.device_ptr(),
            bias: bias.map(|b| b.device_ptr()),
            output: out.device_ptr(),
            output_dtype: Y::DTYPE,
            gate: None,
        })
    }

    /// Queues `kernel` computing the convolution `g` of `input` and `weight`
    /// (plus `bias`) into `out` on this stream (no synchronisation).
    /// `weight` is in the layout the backend asks for
    /// ([`Conv3dOps::weight_layout`](crate::device::Conv3dOps::weight_layout)).
    ///
    /// Errors: [`Error::Conv3dDType`] for a `T` other than f32 and bf16,
    /// [`Error::DeviceMismatch`], [`Error::LengthMismatch`] for a view whose
    /// length is not its shape's, [`Error::Conv3dTier`] for sizes the kernel
    /// does not take (see [`Conv3dKernel::unsupported`]; zero-size calls
    /// among them), or the backend's launch error.
    pub fn forward<T: Element>(
        &self,
        kernel: Conv3dKernel,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: Option<DeviceView<'_, f32>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let layout = self.backend().conv3d_weight_layout(kernel, T::DTYPE, g);
        let launch = self.conv3d_launch("conv3d", layout, g, (input, weight, bias), out)?;
        // Refuses zero-size work and sizes the grid cannot hold.
        kernel.grid(g)?;
        // SAFETY: every view is a live range of this stream's device with
        // exactly its shape's length (checked above), typed views are
        // aligned to their element, `out` is borrowed mutably (nothing else
        // writes it) and the call is not zero-sized.
        unsafe {
            self.backend().run(
                &KernelOp::Conv3d {
                    kernel,
                    args: &launch,
                },
                self.raw(),
            )
        }
    }

    /// [`Conv3dOps::forward`](crate::device::Conv3dOps::forward) of the tiled kernel behind a `gate` (one `u64` of
    /// this device: the kernel runs only when it is non-zero as the kernel
    /// starts; see [`Conv3dOps::guard_decide`](crate::device::Conv3dOps::guard_decide)), writing an output of
    /// `Y`: f32, or bf16 rounded to nearest even (the guarded fallback
    /// writes over another library's bf16 output in place).
    ///
    /// Errors: as [`Conv3dOps::forward`](crate::device::Conv3dOps::forward); [`Error::Conv3dDType`] for an output
    /// other than f32 and bf16; [`Error::LengthMismatch`] for a gate that
    /// is not one element.
    pub fn tiled_gated<T: Element, Y: Element>(
        &self,
        g: &Conv3dGeometry,
        (input, weight, bias): Operands<'_, '_, T>,
        out: &mut DeviceViewMut<'_, Y>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "conv3d";
        let kernel = Conv3dKernel::Tiled;
        if !matches!(Y::DTYPE, DType::F32 | DType::BF16) {
            return Err(Error::Conv3dDType {
                tensor: "output",
                dtype: Y::DTYPE,
                expected: DType::F32,
            });
        }
        let gate = self.gate_ptr((OP, "conv3d gate"), gate)?;
        let layout = self.backend().conv3d_weight_layout(kernel, T::DTYPE, g);
        let mut launch = self.conv3d_launch(OP, layout, g, (input, weight, bias), out)?;
        launch.gate = gate;
        kernel.grid(g)?;
        // SAFETY: as in `conv3d`; the gate, if any, is one live u64 of this
        // device, only read.
        unsafe {
            self.backend().run(
                &KernelOp::Conv3d {
                    kernel,
                    args: &launch,
                },
                self.raw(),
            )
        }
    }

    /// Queues the vendor library's convolution (MIOpen on HIP, cuDNN on
    /// CUDA) of `g` on this stream; `weight` is in the standard layout. The
    /// backend may wait for the stream before returning (it frees its
    /// workspace).
    ///
    /// Errors: as [`Conv3dOps::forward`](crate::device::Conv3dOps::forward); [`Error::VendorUnavailable`] when the
    /// backend has no vendor library here; the library's own error
    /// ([`Error::Conv3dMiopen`], `Error::Conv3dCudnn`) when it refuses the
    /// call (no algorithm for these parameters, ...).
    pub fn vendor<T: Element>(
        &self,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: Option<DeviceView<'_, f32>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let std = Conv3dWeightLayout::Standard;
        let launch = self.conv3d_launch("conv3d_vendor", std, g, (input, weight, bias), out)?;
        if let Some(reason) = Conv3dKernel::Naive.unsupported(g) {
            return Err(Error::Conv3dTier {
                tier: "vendor",
                reason,
            });
        }
        // SAFETY: as in `conv3d`.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dVendor { args: &launch }, self.raw())
        }
    }
}
