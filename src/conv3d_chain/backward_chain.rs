//! The chain's backward ops: the gradients of a conv3d (input, weight,
//! bias) and the transposed convolution (`conv_transpose3d`), through the
//! same tiers, checks, statistics and reports as the forward call.
//!
//! A backward problem ([`Conv3dBackwardProblem`]) goes down the tiers that
//! take it ([`Conv3dTier::support_backward`]): the vendor tier runs the
//! data and weight gradients through its library
//! (`cudnnConvolutionBackwardData/Filter`,
//! `miopenConvolutionBackwardData/Weights`, in f32: bf16 operands are
//! widened on the device first; a `conv_transpose3d` bias is added after)
//! and is skipped as unsupported for the bias gradient (no library call)
//! and as unavailable where its library, or the library's backward calls,
//! are absent (always on the host backend); the tiled tier serves the
//! input gradient (and `conv_transpose3d`) as the forward convolution of
//! `dy` (spread by the stride where there is one) with the flipped weight
//! ([`Conv3dGeometry::data_grad_as_forward`], [`super::TiledTier`]) and
//! the weight gradient by its split-K kernel
//! ([`crate::device::Conv3dOps::backward_weight_tiled`]: float atomics,
//! so not bit-reproducible run to run, checked as every tier is) where there
//! are at least 8 output channels per group, and skips the rest (the bias
//! gradient, ...) as unsupported; the naive tier runs the gather kernels
//! of `kernels/conv3d.hip` (`conv3d_bwd_*`), the CPU tier the CPU
//! kernels. Every result is checked as a forward output is:
//! the non-finite scan (a NaN or infinity from finite operands fails the
//! tier unless the f64 reference there is beyond the f32 range:
//! [`Error::Conv3dOverflow`]) and sampled points recomputed in f64
//! ([`crate::conv3d::backward_reference_point`], the same tolerances
//! relative to `|bias| + sum |a * b|`).
//!
//! On device memory ([`Conv3dChain::backward_device`],
//! [`Conv3dChain::backward_bias_device`],
//! [`Conv3dChain::conv_transpose3d_device`]) the vendor, tiled and naive tiers of
//! the stream's device read and write in place on the caller's stream and
//! the checks run on the device (`conv3d_bwd_check_*`), read back in one
//! small copy, as [`Conv3dChain::run_device`] does.

use std::cell::OnceCell;

use super::chain::{compare, overflows_f32, sample_count, sample_points, TierFail};
use super::device_run::{
    located_nothing, read_words, DeviceScratch, HostData, HEADER, IN_COUNTS, LOCATE_SLOT,
    OUT_COUNTS,
};
use super::{Conv3dChain, Conv3dReport, Conv3dTier, DeviceConv3dData};
use crate::conv3d::{
    backward_reference_point, Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dGeometry,
    Conv3dParams, ShapeDim,
};
use crate::convert::Element;
use crate::device::{
    raw::CheckedPoint, raw::CHECK_MAX_SAMPLES, raw::CHECK_WORDS, DeviceBuffer, DeviceView,
    DeviceViewMut, Stream,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fallback::Failure;

/// The operands of a gradient on the device
/// ([`Conv3dChain::backward_device`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum BackwardInputs<'a> {
    /// The input's gradient from `dy` and the weight (standard layout).
    Data {
        /// `dy` `[N, K, OD, OH, OW]`.
        grad_output: DeviceConv3dData<'a>,
        /// The weight `[K, C/G, KD, KH, KW]`.
        weight: DeviceConv3dData<'a>,
    },
    /// The weight's gradient from the forward input and `dy`.
    Weight {
        /// The forward input `[N, C, D, H, W]`.
        input: DeviceConv3dData<'a>,
        /// `dy` `[N, K, OD, OH, OW]`.
        grad_output: DeviceConv3dData<'a>,
    },
}

/// What [`Conv3dTier::run_backward_device`] gets: the stream, the op, the
/// forward geometry, the operands on the device and the bias (Data only)
/// widened to f32 on the device; host copies on request.
#[derive(Debug)]
pub struct DeviceBackwardOperands<'r, 'a> {
    /// The caller's stream: every tier's device work is queued on it.
    pub stream: &'r Stream,
    /// Which gradient (Data: also the transposed convolution).
    pub op: Conv3dBackwardOp,
    /// The forward convolution's sizes.
    pub geometry: Conv3dGeometry,
    /// `dy`.
    pub grad_output: DeviceConv3dData<'a>,
    /// The weight (Data) or the forward input (Weight).
    pub other: Option<DeviceConv3dData<'a>>,
    /// Data only: the bias in f32 (the caller's, or widened on the device).
    pub bias: Option<DeviceView<'r, f32>>,
    raw_bias: Option<DeviceConv3dData<'a>>,
    host: OnceCell<(HostData, Option<HostData>, Option<HostData>)>,
}

impl DeviceBackwardOperands<'_, '_> {
    /// The dtype of `dy` and the other operand.
    pub fn dtype(&self) -> DType {
        self.grad_output.dtype()
    }

    /// The call with host copies of its operands (copied on the first
    /// request, on the stream, which waits; later requests reuse them).
    pub fn host_problem(&self) -> Result<Conv3dBackwardProblem<'_>> {
        let h = match self.host.get() {
            Some(h) => h,
            None => {
                let s = self.stream;
                let copies = (
                    self.grad_output.to_host(s)?,
                    self.other.map(|o| o.to_host(s)).transpose()?,
                    self.raw_bias.map(|b| b.to_host(s)).transpose()?,
                );
                self.host.get_or_init(|| copies)
            }
        };
        Conv3dBackwardProblem::new(
            self.op,
            self.geometry,
            h.0.data(),
            h.1.as_ref().map(HostData::data),
            h.2.as_ref().map(HostData::data),
        )
    }
}

/// The default [`Conv3dTier::run_backward_device`]: the tier's host
/// `run_backward` on host copies, then a copy of the result into `out` on
/// the operands' stream (waits).
pub(super) fn run_backward_on_host_then_copy(
    tier: &(impl Conv3dTier + ?Sized),
    ops: &DeviceBackwardOperands<'_, '_>,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    let problem = ops.host_problem()?;
    let mut host = Vec::new();
    host.try_reserve_exact(out.len())
        .map_err(|_| Error::OutOfMemory {
            backend: "host",
            op: "conv3d backward host output",
            bytes: (out.len() as u64).saturating_mul(4),
        })?;
    host.resize(out.len(), 0f32);
    tier.run_backward(&problem, &mut host)?;
    out.copy_htod(ops.stream, &host)
}

/// The backward op of `ops` on its device, in place on its stream, through
/// `Stream`'s entry points: the naive kernels (`conv3d_backward_*`), or
/// with `vendor` the vendor library (`conv3d_backward_*_vendor`: Data and
/// Weight only).
pub(super) fn run_backward_views(
    ops: &DeviceBackwardOperands<'_, '_>,
    vendor: bool,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    fn typed<T: Element>(
        ops: &DeviceBackwardOperands<'_, '_>,
        vendor: bool,
        dy: &DeviceView<'_, T>,
        other: Option<&DeviceView<'_, T>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let (s, g) = (ops.stream, &ops.geometry);
        match (ops.op, other, vendor) {
            (Conv3dBackwardOp::Data, Some(w), false) => {
                s.conv3d_ops().backward_data(g, dy, w, ops.bias, out)
            }
            (Conv3dBackwardOp::Data, Some(w), true) => {
                s.conv3d_ops().backward_data_vendor(g, dy, w, ops.bias, out)
            }
            (Conv3dBackwardOp::Weight, Some(x), false) => {
                s.conv3d_ops().backward_weight(g, x, dy, out)
            }
            (Conv3dBackwardOp::Weight, Some(x), true) => {
                s.conv3d_ops().backward_weight_vendor(g, x, dy, out)
            }
            (Conv3dBackwardOp::Bias, None, false) => s.conv3d_ops().backward_bias(g, dy, out),
            _ => Err(operands_refused()),
        }
    }
    use DeviceConv3dData::{BF16, F32};
    match (ops.grad_output, ops.other) {
        (F32(dy), Some(F32(o))) => typed(ops, vendor, &dy, Some(&o), out),
        (F32(dy), None) => typed(ops, vendor, &dy, None, out),
        (BF16(dy), Some(BF16(o))) => typed(ops, vendor, &dy, Some(&o), out),
        (BF16(dy), None) => typed(ops, vendor, &dy, None, out),
        (dy, Some(o)) => Err(dtype_mismatch(ops.op, o.dtype(), dy.dtype())),
    }
}

fn operands_refused() -> Error {
    Error::Conv3dParam {
        param: "backward operands",
        value: Vec::new(),
        reason: "data takes dy and the weight, weight takes the input and dy, bias takes dy",
    }
}

fn dtype_mismatch(op: Conv3dBackwardOp, dtype: DType, expected: DType) -> Error {
    Error::Conv3dDType {
        tensor: if op == Conv3dBackwardOp::Data {
            "weight"
        } else {
            "input"
        },
        dtype,
        expected,
    }
}

/// The first non-finite value of `out` and whether that is a failure:
/// `None` when there is none or the operands are not all finite.
fn first_non_finite(p: &Conv3dBackwardProblem<'_>, out: &[f32]) -> Option<(usize, f32)> {
    let (index, &value) = out.iter().enumerate().find(|(_, v)| !v.is_finite())?;
    p.inputs_finite().then_some((index, value))
}

impl Conv3dChain {
    /// Computes the backward problem `p` (a gradient, or the transposed
    /// convolution: [`Conv3dBackwardProblem::conv_transpose3d`]) through
    /// the tiers that take it, each result checked (see the module docs),
    /// returning the f32 result (its shape: [`Conv3dBackwardProblem::output_shape`])
    /// and the report.
    ///
    /// Errors: [`Error::Conv3dNoTier`] (carrying the report) when no tier
    /// served; [`Error::Conv3dOverflow`] when the exact result overflows
    /// f32 (the overflow rule of [`Conv3dChain::run_into`]).
    pub fn run_backward(&self, p: &Conv3dBackwardProblem<'_>) -> Result<(Vec<f32>, Conv3dReport)> {
        let mut out = Vec::new();
        out.try_reserve_exact(p.output_len())
            .map_err(|_| Error::OutOfMemory {
                backend: "host",
                op: "conv3d backward output",
                bytes: (p.output_len() as u64).saturating_mul(4),
            })?;
        out.resize(p.output_len(), 0f32);
        let samples = sample_points(
            p.output_len(),
            self.options().verify_samples,
            self.options().seed,
        );
        let report = self.run_tiers(
            |tier| tier.support_backward(p.op, &p.geometry),
            |tier| {
                tier.run_backward(p, &mut out)
                    .map_err(|e| TierFail::Failed(Failure::Error(e)))?;
                self.check_backward(p, &samples, &out)
            },
        )?;
        Ok((out, report))
    }

    /// The checks of one tier's host backward result.
    fn check_backward(
        &self,
        p: &Conv3dBackwardProblem<'_>,
        samples: &[usize],
        out: &[f32],
    ) -> std::result::Result<(), TierFail> {
        if self.options().scan_non_finite {
            if let Some((index, value)) = first_non_finite(p, out) {
                return Err(match backward_reference_point(p, index) {
                    Some(r) if overflows_f32(r.value) => TierFail::Overflow {
                        index,
                        reference: r.value,
                        value,
                    },
                    _ => TierFail::Failed(Failure::NonFinite { index, value }),
                });
            }
        }
        let rel = self.rel_tol(p.dtype());
        for &index in samples {
            let (Some(r), Some(&got)) = (backward_reference_point(p, index), out.get(index)) else {
                continue;
            };
            compare(index, got, r.value, r.magnitude, rel)?;
        }
        Ok(())
    }

    /// A gradient of the forward convolution `params` of an input of
    /// `input_shape` with a weight of `weight_shape`, on operands in
    /// device memory of `stream`'s device, on `stream`, into `out` (f32:
    /// the input's shape for [`BackwardInputs::Data`], the weight's for
    /// [`BackwardInputs::Weight`]). Ordering, waits and host copies as
    /// [`Conv3dChain::run_device`]; checks as [`Conv3dChain::run_backward`],
    /// on the device.
    ///
    /// Errors: [`Error::DeviceMismatch`]; the shape and parameter errors of
    /// [`Conv3dGeometry::new`]; [`Error::Conv3dDType`] for operands of two
    /// dtypes or other than f32 / bf16; [`Error::LengthMismatch`];
    /// [`Error::Conv3dNoTier`], [`Error::Conv3dOverflow`].
    #[allow(clippy::too_many_arguments)]
    pub fn backward_device<D: ShapeDim>(
        &self,
        stream: &Stream,
        params: Conv3dParams,
        input_shape: &[D],
        weight_shape: &[D],
        inputs: BackwardInputs<'_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<Conv3dReport> {
        let g = Conv3dGeometry::new(params, input_shape, weight_shape)?;
        let (op, dy, other) = match inputs {
            BackwardInputs::Data {
                grad_output,
                weight,
            } => (Conv3dBackwardOp::Data, grad_output, weight),
            BackwardInputs::Weight { input, grad_output } => {
                (Conv3dBackwardOp::Weight, grad_output, input)
            }
        };
        self.backward_on_device(stream, op, g, (dy, Some(other)), None, out)
    }

    /// The bias gradient `[K]` of `grad_output` `[N, K, OD, OH, OW]` (a
    /// sum over `N` and the output volume per channel) on the device, as
    /// [`Conv3dChain::backward_device`].
    pub fn backward_bias_device<D: ShapeDim>(
        &self,
        stream: &Stream,
        grad_output: DeviceConv3dData<'_>,
        grad_output_shape: &[D],
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<Conv3dReport> {
        let g = Conv3dGeometry::for_bias_grad(grad_output_shape)?;
        let op = Conv3dBackwardOp::Bias;
        self.backward_on_device(stream, op, g, (grad_output, None), None, out)
    }

    /// `conv_transpose3d` (PyTorch's semantics: input `[N, Cin, D, H, W]`,
    /// weight `[Cin, Cout/G, KD, KH, KW]`, optional bias `[Cout]` of f32 or
    /// bf16, `params` with stride, padding, dilation and groups, and
    /// `output_padding`) on the device into `out` (f32 `[N, Cout, OD, OH,
    /// OW]`, [`Conv3dGeometry::transposed`]), as
    /// [`Conv3dChain::backward_device`]: the input gradient of the forward
    /// convolution it transposes, plus the bias.
    ///
    /// Errors: as [`Conv3dChain::backward_device`], and those of
    /// [`Conv3dGeometry::transposed`].
    #[allow(clippy::too_many_arguments)]
    pub fn conv_transpose3d_device<D: ShapeDim>(
        &self,
        stream: &Stream,
        params: Conv3dParams,
        output_padding: [usize; 3],
        input: DeviceConv3dData<'_>,
        input_shape: &[D],
        weight: DeviceConv3dData<'_>,
        weight_shape: &[D],
        bias: Option<DeviceConv3dData<'_>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<Conv3dReport> {
        let g = Conv3dGeometry::transposed(params, output_padding, input_shape, weight_shape)?;
        let op = Conv3dBackwardOp::Data;
        self.backward_on_device(stream, op, g, (input, Some(weight)), bias, out)
    }

    /// Validation, the bias widening, the tiers and the device checks of a
    /// backward call on the device.
    fn backward_on_device(
        &self,
        stream: &Stream,
        op: Conv3dBackwardOp,
        g: Conv3dGeometry,
        (dy, other): (DeviceConv3dData<'_>, Option<DeviceConv3dData<'_>>),
        bias: Option<DeviceConv3dData<'_>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<Conv3dReport> {
        validate_backward(stream, op, &g, (dy, other), bias, (out.device(), out.len()))?;
        let c = g.in_channels;
        let mut guard = self.scratch_for(stream.device())?;
        let scratch = guard.get()?;
        let DeviceScratch {
            alloc_on,
            bias: bias_buf,
            check,
            ..
        } = scratch;
        let bias_f32 = DeviceScratch::bias_f32(stream, alloc_on, bias_buf, bias, c)?;
        let ops = DeviceBackwardOperands {
            stream,
            op,
            geometry: g,
            grad_output: dy,
            other,
            bias: bias_f32,
            raw_bias: bias,
            host: OnceCell::new(),
        };
        let total = op.output_len(&g);
        // A zero-size call (served by the CPU) has nothing for the device
        // check to recompute from: its result is scanned only.
        let samples = match op.unsupported(&g) {
            Some(_) => 0,
            None => sample_count(total, self.options().verify_samples).min(CHECK_MAX_SAMPLES),
        };
        let words = HEADER + CHECK_WORDS * samples.max(1);
        let check = DeviceScratch::ensure(alloc_on, check, words)?;
        self.run_tiers(
            |tier| tier.support_backward(op, &g),
            |tier| {
                tier.run_backward_device(&ops, out)
                    .map_err(|e| TierFail::Failed(Failure::Error(e)))?;
                self.check_backward_device(&ops, &out.as_view(), samples, check)
            },
        )
    }

    /// Checks a `conv_transpose3d` output that something else computed
    /// (torch's own: `install_conv3d_fallback(mode="verify")`) at this
    /// chain's sampled points on the device, on `stream`: the f64
    /// recomputation from the operands against `output` (f32) within the
    /// chain's tolerance, read back in one small copy. Operands as
    /// [`Conv3dChain::conv_transpose3d_device`].
    ///
    /// Returns `Ok(Ok(()))` when every sampled point agrees (or nothing is
    /// sampled: zero-size calls, no samples configured),
    /// `Ok(Err(Failure::ValueMismatch { .. }))` at the first that does not.
    ///
    /// Errors: those of [`Conv3dChain::conv_transpose3d_device`]'s
    /// validation; the check's launch or read-back error.
    #[allow(clippy::too_many_arguments)]
    pub fn verify_conv_transpose3d_device<D: ShapeDim>(
        &self,
        stream: &Stream,
        params: Conv3dParams,
        output_padding: [usize; 3],
        input: DeviceConv3dData<'_>,
        input_shape: &[D],
        weight: DeviceConv3dData<'_>,
        weight_shape: &[D],
        bias: Option<DeviceConv3dData<'_>>,
        output: DeviceView<'_, f32>,
    ) -> Result<std::result::Result<(), Failure>> {
        let g = Conv3dGeometry::transposed(params, output_padding, input_shape, weight_shape)?;
        let op = Conv3dBackwardOp::Data;
        let operands = (input, Some(weight));
        validate_backward(
            stream,
            op,
            &g,
            operands,
            bias,
            (output.device(), output.len()),
        )?;
        let samples =
            sample_count(op.output_len(&g), self.options().verify_samples).min(CHECK_MAX_SAMPLES);
        if samples == 0 || op.unsupported(&g).is_some() {
            return Ok(Ok(()));
        }
        let ops = DeviceBackwardOperands {
            stream,
            op,
            geometry: g,
            grad_output: input,
            other: Some(weight),
            bias: None,
            raw_bias: bias,
            host: OnceCell::new(),
        };
        let mut guard = self.scratch_for(stream.device())?;
        let scratch = guard.get()?;
        let words = HEADER + CHECK_WORDS * samples;
        let check = DeviceScratch::ensure(&scratch.alloc_on, &mut scratch.check, words)?;
        self.queue_backward_check(&ops, &output, samples, false, check)?;
        let words = read_words(stream, check, words)?;
        let rel = self.rel_tol(input.dtype());
        for p in CheckedPoint::decode(&words[HEADER..]) {
            let Some(index) = p.index else { continue };
            if let Err(f) = compare(index, p.value, p.reference, p.magnitude, rel) {
                return Ok(Err(f));
            }
        }
        Ok(Ok(()))
    }
}

/// The checks every backward call on the device starts with: devices,
/// dtypes and lengths (the result's given as its device and length).
fn validate_backward(
    stream: &Stream,
    op: Conv3dBackwardOp,
    g: &Conv3dGeometry,
    (dy, other): (DeviceConv3dData<'_>, Option<DeviceConv3dData<'_>>),
    bias: Option<DeviceConv3dData<'_>>,
    (out_device, out_len): (&crate::device::Device, usize),
) -> Result<()> {
    const OP: &str = "conv3d_backward_device";
    dy.check_device(stream, OP)?;
    for d in [other, bias].into_iter().flatten() {
        d.check_device(stream, OP)?;
    }
    if !stream.device().same(out_device) {
        return Err(Error::DeviceMismatch { op: OP });
    }
    if let Some(o) = other {
        if o.dtype() != dy.dtype() {
            return Err(dtype_mismatch(op, o.dtype(), dy.dtype()));
        }
    }
    {
        let lengths = [
            ("conv3d backward grad_output", g.output_len(), dy.len()),
            (
                "conv3d backward operand",
                op.other_len(g).unwrap_or(0),
                other.map_or(0, |o| o.len()),
            ),
            (
                "conv3d backward bias",
                g.in_channels,
                bias.map_or(g.in_channels, |b| b.len()),
            ),
            ("conv3d backward device output", op.output_len(g), out_len),
        ];
        for (what, expected, actual) in lengths {
            if expected != actual {
                return Err(Error::LengthMismatch {
                    op: what,
                    expected,
                    actual,
                    tensor: None,
                });
            }
        }
    }
    Ok(())
}

impl Conv3dChain {
    /// The checks of one tier's device backward result, as
    /// `check_device` of a forward call.
    fn check_backward_device(
        &self,
        ops: &DeviceBackwardOperands<'_, '_>,
        out: &DeviceView<'_, f32>,
        samples: usize,
        check: &mut DeviceBuffer<u64>,
    ) -> std::result::Result<(), TierFail> {
        let err = |e: Error| TierFail::Failed(Failure::Error(e));
        let s = ops.stream;
        let scan = self.options().scan_non_finite;
        if !scan && samples == 0 {
            return s.synchronize().map_err(err);
        }
        let words = self
            .queue_backward_check(ops, out, samples, false, check)
            .and_then(|()| read_words(s, check, HEADER + CHECK_WORDS * samples))
            .map_err(err)?;
        if scan && words[OUT_COUNTS].iter().any(|&c| c != 0) {
            self.backward_non_finite(ops, out, check)?;
        }
        let rel = self.rel_tol(ops.dtype());
        for p in CheckedPoint::decode(&words[HEADER..]) {
            let Some(index) = p.index else { continue };
            compare(index, p.value, p.reference, p.magnitude, rel)?;
        }
        Ok(())
    }

    /// Queues the result's non-finite count (scan on, not `locate`) and the
    /// device check of `samples` points (or of the first non-finite one).
    fn queue_backward_check(
        &self,
        ops: &DeviceBackwardOperands<'_, '_>,
        out: &DeviceView<'_, f32>,
        samples: usize,
        locate: bool,
        check: &mut DeviceBuffer<u64>,
    ) -> Result<()> {
        let s = ops.stream;
        let mut all = check.view_mut();
        let (mut head, mut results) = all.slice_mut(..)?.split_at_mut(HEADER)?;
        if !locate && self.options().scan_non_finite {
            let mut counts = head.slice_mut(OUT_COUNTS)?;
            counts.memset_zero(s)?;
            s.count_nonfinite_into(out, &mut counts)?;
        }
        if samples == 0 {
            return Ok(());
        }
        let mut slot = head.slice_mut(LOCATE_SLOT..=LOCATE_SLOT)?;
        let slot = locate.then_some(&mut slot);
        let sampling = (samples, self.options().seed);
        let (op, g, bias) = (ops.op, &ops.geometry, ops.raw_bias);
        #[allow(clippy::too_many_arguments)]
        fn typed<T: Element>(
            s: &Stream,
            (op, g): (Conv3dBackwardOp, &Conv3dGeometry),
            operands: (&DeviceView<'_, T>, Option<&DeviceView<'_, T>>),
            bias: Option<DeviceConv3dData<'_>>,
            out: &DeviceView<'_, f32>,
            sampling: (usize, u64),
            slot: Option<&mut DeviceViewMut<'_, u64>>,
            results: &mut DeviceViewMut<'_, u64>,
        ) -> Result<()> {
            match bias {
                Some(DeviceConv3dData::F32(b)) => s.conv3d_ops().backward_check(
                    op,
                    g,
                    operands,
                    Some(&b),
                    out,
                    sampling,
                    slot,
                    results,
                ),
                Some(DeviceConv3dData::BF16(b)) => s.conv3d_ops().backward_check(
                    op,
                    g,
                    operands,
                    Some(&b),
                    out,
                    sampling,
                    slot,
                    results,
                ),
                None => s
                    .conv3d_ops()
                    .backward_check::<T, f32>(op, g, operands, None, out, sampling, slot, results),
            }
        }
        use DeviceConv3dData::{BF16, F32};
        let r = &mut results;
        let og = (op, g);
        match (ops.grad_output, ops.other) {
            (F32(d), Some(F32(o))) => typed(s, og, (&d, Some(&o)), bias, out, sampling, slot, r),
            (F32(d), None) => typed(s, og, (&d, None), bias, out, sampling, slot, r),
            (BF16(d), Some(BF16(o))) => typed(s, og, (&d, Some(&o)), bias, out, sampling, slot, r),
            (BF16(d), None) => typed(s, og, (&d, None), bias, out, sampling, slot, r),
            (d, Some(o)) => Err(dtype_mismatch(op, o.dtype(), d.dtype())),
        }
    }

    /// A non-finite value in a backward result: the operands' counts and
    /// the reference at the first non-finite element, on the device, read
    /// back in one copy; then the overflow rule.
    fn backward_non_finite(
        &self,
        ops: &DeviceBackwardOperands<'_, '_>,
        out: &DeviceView<'_, f32>,
        check: &mut DeviceBuffer<u64>,
    ) -> std::result::Result<(), TierFail> {
        let err = |e: Error| TierFail::Failed(Failure::Error(e));
        let s = ops.stream;
        let queue = |check: &mut DeviceBuffer<u64>| -> Result<()> {
            let mut all = check.view_mut();
            let operands = [Some(ops.grad_output), ops.other, ops.raw_bias];
            for (range, data) in IN_COUNTS.into_iter().zip(operands) {
                let mut counts = all.slice_mut(range)?;
                counts.memset_zero(s)?;
                if let Some(d) = data {
                    d.count_nonfinite_into(s, &mut counts)?;
                }
            }
            self.queue_backward_check(ops, out, 1, true, check)
        };
        let words = queue(check)
            .and_then(|()| read_words(s, check, HEADER + CHECK_WORDS))
            .map_err(err)?;
        let inputs_finite = IN_COUNTS
            .into_iter()
            .all(|r| words[r].iter().all(|&c| c == 0));
        if !inputs_finite {
            return Ok(());
        }
        let Some(index_point) = CheckedPoint::decode(&words[HEADER..]).into_iter().next() else {
            return Err(err(located_nothing()));
        };
        let Some(index) = index_point.index else {
            return Err(err(located_nothing()));
        };
        if overflows_f32(index_point.reference) {
            return Err(TierFail::Overflow {
                index,
                reference: index_point.reference,
                value: index_point.value,
            });
        }
        Err(TierFail::Failed(Failure::NonFinite {
            index,
            value: index_point.value,
        }))
    }
}
