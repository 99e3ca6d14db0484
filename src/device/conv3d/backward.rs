//! The backward ops of a conv3d on a device ([`Conv3dBackwardLaunch`]:
//! the input's gradient, which is also the transposed convolution, the
//! weight's and the bias's; the first two also by the vendor library),
//! their sampled-point check
//! ([`Conv3dBackwardCheckLaunch`]), the safe entry points on [`Stream`],
//! and the host backend's emulation of both (the CPU kernels and the f64
//! references of [`crate::conv3d`]).

use super::check::CHECK_MAX_SAMPLES;
use super::layout::check_len;
use super::CHECK_WORDS;
use crate::conv3d::{
    backward_reference_point, conv3d_backward_cpu, sample_index, Conv3dBackwardOp,
    Conv3dBackwardProblem, Conv3dData, Conv3dGeometry,
};
use crate::convert::Element;
use crate::device::backend::KernelOp;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::info::DevicePtr;
use crate::device::stream::Stream;
use crate::dtype::DType;
use crate::error::{Error, Result};

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

/// One launch of the backward check ([`KernelOp::Conv3dBackwardCheck`]):
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

fn operand_name(op: Conv3dBackwardOp) -> &'static str {
    match op {
        Conv3dBackwardOp::Data => "conv3d backward weight",
        _ => "conv3d backward input",
    }
}

fn bias_refused() -> Error {
    Error::Conv3dParam {
        param: "backward bias",
        value: vec![1],
        reason: "only the data op (the transposed convolution) takes a bias",
    }
}

impl Stream {
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
    pub fn conv3d_backward_data<T: Element>(
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

    /// [`Stream::conv3d_backward_data`] by the vendor library (cuDNN's
    /// `cudnnConvolutionBackwardData`, MIOpen's
    /// `miopenConvolutionBackwardData`): bf16 operands are widened to f32
    /// on the device first and the library computes in f32 (its bf16 call
    /// would write a bf16 result), then `bias` is added
    /// (`conv3d_bias_f32`). The backend may wait for the stream before
    /// returning (it keeps or frees its workspace).
    ///
    /// Errors: as [`Stream::conv3d_backward_data`] (a zero-size call is
    /// [`Error::Conv3dTier`] `"vendor"`); [`Error::VendorUnavailable`]
    /// when the backend has no vendor library, or one without its backward
    /// calls; the library's own error (`Error::Conv3dCudnn`,
    /// [`Error::Conv3dMiopen`]) when it refuses the call.
    pub fn conv3d_backward_data_vendor<T: Element>(
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

    /// [`Stream::conv3d_backward_weight`] by the vendor library (cuDNN's
    /// `cudnnConvolutionBackwardFilter`, MIOpen's
    /// `miopenConvolutionBackwardWeights`), in f32 as
    /// [`Stream::conv3d_backward_data_vendor`]. Errors as that.
    pub fn conv3d_backward_weight_vendor<T: Element>(
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
    /// (`conv3d_bwd_weight_*`). Errors as [`Stream::conv3d_backward_data`].
    pub fn conv3d_backward_weight<T: Element>(
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
    /// output). Errors as [`Stream::conv3d_backward_data`].
    pub fn conv3d_backward_bias<T: Element>(
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
    /// [`super::CheckedPoint::decode`]).
    ///
    /// Errors: as [`Stream::conv3d_backward_data`]; a `bias` of another
    /// dtype than f32 / bf16; [`Error::LengthMismatch`] for a short
    /// `results`, a `locate` slot that is not one element or `samples` not
    /// 1 with it; [`Error::Conv3dTier`] for more than
    /// [`CHECK_MAX_SAMPLES`] points.
    #[allow(clippy::too_many_arguments)]
    pub fn conv3d_backward_check<T: Element, B: Element>(
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

/// # Safety
/// `p` holds `len` readable elements of `dtype` (F32 or BF16) that nothing
/// writes meanwhile.
unsafe fn host_data<'a>(p: DevicePtr, dtype: DType, len: usize) -> Result<Conv3dData<'a>> {
    if len == 0 {
        return Ok(match dtype {
            DType::BF16 => Conv3dData::BF16(&[]),
            _ => Conv3dData::F32(&[]),
        });
    }
    let addr = p.0 as usize;
    // SAFETY: the caller's guarantees (host "device" addresses are host
    // addresses).
    unsafe {
        Ok(match dtype {
            DType::F32 => Conv3dData::F32(std::slice::from_raw_parts(addr as *const f32, len)),
            DType::BF16 => {
                Conv3dData::BF16(std::slice::from_raw_parts(addr as *const half::bf16, len))
            }
            other => {
                return Err(Error::Conv3dDType {
                    tensor: "grad_output",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        })
    }
}

/// # Safety
/// `p` holds `len` writable `T`s that nothing else accesses meanwhile.
unsafe fn host_slice_mut<'a, T>(p: DevicePtr, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(p.0 as usize as *mut T, len) }
}

/// The problem a launch describes, over host memory.
///
/// # Safety
/// The launch's operand addresses hold their documented lengths, unwritten
/// meanwhile; `bias_dtype` is the bias's.
unsafe fn host_problem<'a>(
    a: &Conv3dBackwardLaunch,
    bias_dtype: DType,
) -> Result<Conv3dBackwardProblem<'a>> {
    let g = &a.geometry;
    // SAFETY: the caller's guarantees.
    unsafe {
        let dy = host_data(a.grad_output, a.dtype, g.output_len())?;
        let other = match (a.other, a.op.other_len(g)) {
            (Some(p), Some(n)) => Some(host_data(p, a.dtype, n)?),
            _ => None,
        };
        let bias = a
            .bias
            .map(|b| host_data(b, bias_dtype, g.in_channels))
            .transpose()?;
        Conv3dBackwardProblem::new(a.op, *g, dy, other, bias)
    }
}

/// The host backend's [`KernelOp::Conv3dBackward`]: the CPU kernels
/// ([`conv3d_backward_cpu`]).
///
/// # Safety
/// As [`crate::device::Backend::run`]: the launch's addresses are live host
/// allocations of the documented lengths, `output` exclusive.
pub(crate) unsafe fn host_conv3d_backward(a: &Conv3dBackwardLaunch) -> Result<()> {
    if let Some(reason) = a.op.unsupported(&a.geometry) {
        return Err(Error::Conv3dTier {
            tier: "naive",
            reason,
        });
    }
    // SAFETY: the caller's guarantees; the output does not overlap the
    // operands (it is borrowed mutably by the safe entry point).
    unsafe {
        let p = host_problem(a, DType::F32)?;
        let out = host_slice_mut::<f32>(a.output, a.output_len());
        conv3d_backward_cpu(&p, out)
    }
}

/// The host backend's [`KernelOp::Conv3dBackwardCheck`]:
/// [`backward_reference_point`] at each point, as the kernel computes it.
///
/// # Safety
/// As [`host_conv3d_backward`], `results` (and the slot) exclusive.
pub(crate) unsafe fn host_conv3d_backward_check(a: &Conv3dBackwardCheckLaunch) -> Result<()> {
    let c = &a.conv;
    let total = c.output_len();
    // SAFETY: the caller's guarantees.
    let (p, y, results) = unsafe {
        (
            host_problem(c, a.bias_dtype)?,
            host_data(c.output, DType::F32, total)?,
            host_slice_mut::<u64>(a.results, a.samples * CHECK_WORDS),
        )
    };
    let located = match a.locate {
        Some(slot) => {
            let first = (0..total).find(|&i| y.get_f32(i).is_some_and(|v| !v.is_finite()));
            // SAFETY: the caller guarantees one exclusive u64 at `slot`.
            let s = unsafe { host_slice_mut::<u64>(slot, 1) };
            s[0] = first.map_or(0, |i| (total - i) as u64);
            Some(first)
        }
        None => None,
    };
    for (j, out) in results.chunks_exact_mut(CHECK_WORDS).enumerate() {
        let index = match located {
            Some(first) => first,
            None => sample_index(total, a.seed, j),
        };
        let point = index.and_then(|i| Some((i, backward_reference_point(&p, i)?, y.get_f32(i)?)));
        match point {
            Some((i, r, v)) => {
                out[0] = i as u64;
                out[1] = f64::from(v).to_bits();
                out[2] = r.value.to_bits();
                out[3] = r.magnitude.to_bits();
            }
            None => {
                out[0] = u64::MAX;
                for o in &mut out[1..] {
                    *o = f64::NAN.to_bits();
                }
            }
        }
    }
    Ok(())
}
