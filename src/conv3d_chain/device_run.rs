//! The chain over device memory: operands and output another framework
//! owns (DLPack imports), on the caller's stream.
//!
//! [`Conv3dChain::run_device`] runs the same tiers, in the same order, with
//! the same skips, checks, statistics and report as
//! [`Conv3dChain::run_into`], but the GPU tiers of the operands' device read
//! the input and weight where they are and write the output in place, on
//! the caller's stream ([`Conv3dTier::run_device`]); the other tiers (the
//! CPU tier, a chain of another device) copy the operands to the host
//! when they run ([`DeviceOperands::host_problem`]), compute there and copy
//! the output in.
//!
//! The checks run on the device, on the caller's stream, whatever tier
//! served: the non-finite scan ([`Stream::count_nonfinite_into`]) and the
//! sampled f64 points ([`Conv3dOps::check`](crate::device::Conv3dOps::check)) are queued after the tier,
//! and one small copy reads both back (the only wait of a call whose output
//! is clean). Only when the output holds a NaN or an infinity does a second
//! round run on the device: the operands' non-finite counts (are the
//! inputs all finite?) and the f64 reference at the first non-finite
//! output point (the overflow rule of [`Conv3dChain::run_into`]), again
//! read back in one copy. No operand or output crosses to the host.
//!
//! The buffers this needs (the bias widened to f32 when it is bf16, the
//! check's counts and results) are kept by the chain and reused across
//! calls ([`DeviceScratch`]); the tiled kernels' weight layouts are kept
//! by their tiers (`device_tiers.rs`).

use std::cell::OnceCell;
use std::sync::{MutexGuard, TryLockError};

use half::bf16;

use super::chain::{compare, overflows_f32, sample_count, TierFail};
use super::{Conv3dChain, Conv3dReport, Conv3dTier};
use crate::conv3d::{Conv3dData, Conv3dGeometry, Conv3dParams, Conv3dProblem, ShapeDim};
use crate::device::{
    raw::CheckedPoint, raw::CHECK_MAX_SAMPLES, raw::CHECK_WORDS, Conv3dKernel, Device,
    DeviceBuffer, DeviceView, DeviceViewMut, Stream,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fallback::Failure;

/// An input, weight or bias of a conv3d in device memory, compact
/// row-major.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum DeviceConv3dData<'a> {
    /// f32 elements.
    F32(DeviceView<'a, f32>),
    /// bf16 elements (widened exactly by every tier).
    BF16(DeviceView<'a, bf16>),
}

impl DeviceConv3dData<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceConv3dData::F32(_) => DType::F32,
            DeviceConv3dData::BF16(_) => DType::BF16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            DeviceConv3dData::F32(v) => v.len(),
            DeviceConv3dData::BF16(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn device(&self) -> &Device {
        match self {
            DeviceConv3dData::F32(v) => v.device(),
            DeviceConv3dData::BF16(v) => v.device(),
        }
    }

    pub(super) fn check_device(&self, stream: &Stream, op: &'static str) -> Result<()> {
        if stream.device().same(self.device()) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch { op })
        }
    }

    pub(super) fn to_host(self, stream: &Stream) -> Result<HostData> {
        Ok(match self {
            DeviceConv3dData::F32(v) => HostData::F32(v.to_vec(stream)?),
            DeviceConv3dData::BF16(v) => HostData::BF16(v.to_vec(stream)?),
        })
    }

    /// Queues adding its NaN and Inf counts to `counts` (two words).
    pub(super) fn count_nonfinite_into(
        &self,
        stream: &Stream,
        counts: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        self.count_nonfinite_gated_into(stream, counts, None)
    }

    /// [`DeviceConv3dData::count_nonfinite_into`] behind a gate (see
    /// [`Stream::count_nonfinite_gated_into`]).
    pub(super) fn count_nonfinite_gated_into(
        &self,
        stream: &Stream,
        counts: &mut DeviceViewMut<'_, u64>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        match self {
            DeviceConv3dData::F32(v) => stream.count_nonfinite_gated_into(v, counts, gate),
            DeviceConv3dData::BF16(v) => stream.count_nonfinite_gated_into(v, counts, gate),
        }
    }
}

/// A host copy of a device operand.
#[derive(Debug)]
pub(super) enum HostData {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
}

impl HostData {
    pub(super) fn data(&self) -> Conv3dData<'_> {
        match self {
            HostData::F32(v) => Conv3dData::F32(v),
            HostData::BF16(v) => Conv3dData::BF16(v),
        }
    }
}

/// Host copies of a device call's operands.
#[derive(Debug)]
struct HostCopies {
    input: HostData,
    weight: HostData,
    bias: Option<HostData>,
}

/// What [`Conv3dTier::run_device`] gets: the stream, the validated
/// geometry, the operands on the device and the bias widened to f32 on the
/// device; host copies of the operands on request
/// ([`DeviceOperands::host_problem`]).
#[derive(Debug)]
pub struct DeviceOperands<'r, 'a> {
    /// The caller's stream: every tier's device work is queued on it.
    pub stream: &'r Stream,
    /// The validated sizes of the call.
    pub geometry: Conv3dGeometry,
    /// The input `[N, C, D, H, W]`.
    pub input: DeviceConv3dData<'a>,
    /// The weight `[K, C/G, KD, KH, KW]`, standard layout.
    pub weight: DeviceConv3dData<'a>,
    /// The bias `[K]` in f32, if any (the caller's, or widened from bf16
    /// on the device).
    pub bias: Option<DeviceView<'r, f32>>,
    /// The bias as the caller gave it (what host copies and the check read).
    raw_bias: Option<DeviceConv3dData<'a>>,
    /// Host copies, made by the first tier that asks.
    host: OnceCell<HostCopies>,
}

impl DeviceOperands<'_, '_> {
    /// The dtype of input and weight.
    pub fn dtype(&self) -> DType {
        self.input.dtype()
    }

    /// The call with host copies of its operands (copied on the first
    /// request of a call, on the stream, which waits; later requests reuse
    /// them): what tiers that compute on the host run on. The GPU tiers of
    /// the stream's device never ask.
    pub fn host_problem(&self) -> Result<Conv3dProblem<'_>> {
        let h = match self.host.get() {
            Some(h) => h,
            None => {
                let copies = HostCopies {
                    input: self.input.to_host(self.stream)?,
                    weight: self.weight.to_host(self.stream)?,
                    bias: self.raw_bias.map(|b| b.to_host(self.stream)).transpose()?,
                };
                self.host.get_or_init(|| copies)
            }
        };
        let g = &self.geometry;
        Conv3dProblem::new(
            g.params,
            h.input.data(),
            &g.input_shape(),
            h.weight.data(),
            &g.weight_shape(),
            h.bias.as_ref().map(HostData::data),
        )
    }
}

/// The default [`Conv3dTier::run_device`]: the tier's host `run` on the
/// operands' host copies, then a copy of the output into `out` on the
/// operands' stream (waits).
pub(super) fn run_on_host_then_copy(
    tier: &(impl Conv3dTier + ?Sized),
    ops: &DeviceOperands<'_, '_>,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    let problem = ops.host_problem()?;
    let mut host = Vec::new();
    host.try_reserve_exact(out.len())
        .map_err(|_| Error::OutOfMemory {
            backend: "host",
            op: "conv3d host output",
            bytes: (out.len() as u64).saturating_mul(4),
        })?;
    host.resize(out.len(), 0f32);
    tier.run(&problem, &mut host)?;
    out.copy_htod(ops.stream, &host)
}

/// Words at the start of the check buffer: output counts (2), input,
/// weight and bias counts (2 each), the locate slot (1), padding.
pub(super) const HEADER: usize = 16;
pub(super) const OUT_COUNTS: std::ops::Range<usize> = 0..2;
pub(super) const IN_COUNTS: [std::ops::Range<usize>; 3] = [2..4, 4..6, 6..8];
pub(super) const LOCATE_SLOT: usize = 8;

/// The device buffers [`Conv3dChain::run_device`] reuses across calls on
/// one device: the bias widened to f32 (bf16 biases only) and the check's
/// words (counts, the locate slot, the sampled points' results). Allocated
/// on a stream of the chain's own (nothing is queued there) and grown when
/// a call needs more; every use is on the caller's stream, and a call ends
/// with that stream drained (the check's read-back), so the next call may
/// reuse them on any stream.
#[derive(Debug)]
pub(crate) struct DeviceScratch {
    device: Device,
    /// An owned stream of `device`, for the allocations only.
    pub(super) alloc_on: Stream,
    pub(super) bias: Option<DeviceBuffer<f32>>,
    pub(super) check: Option<DeviceBuffer<u64>>,
}

impl DeviceScratch {
    fn new(device: &Device) -> Result<DeviceScratch> {
        Ok(DeviceScratch {
            device: device.clone(),
            alloc_on: device.stream()?,
            bias: None,
            check: None,
        })
    }

    /// A buffer of at least `len` elements in `slot`, reused when large
    /// enough (contents unspecified).
    pub(super) fn ensure<'s, T: bytemuck::Pod>(
        alloc_on: &Stream,
        slot: &'s mut Option<DeviceBuffer<T>>,
        len: usize,
    ) -> Result<&'s mut DeviceBuffer<T>> {
        if slot.as_ref().is_some_and(|b| b.len() >= len) {
            if let Some(b) = slot {
                return Ok(b);
            }
        }
        *slot = None;
        Ok(slot.insert(alloc_on.alloc::<T>(len)?))
    }

    /// The bias of `channels` channels as f32 on the device: an f32 bias
    /// as it is, a bf16 one widened on `stream` into `slot` (grown by
    /// [`DeviceScratch::ensure`]); `None` without a bias.
    pub(super) fn bias_f32<'v>(
        stream: &Stream,
        alloc_on: &Stream,
        slot: &'v mut Option<DeviceBuffer<f32>>,
        bias: Option<DeviceConv3dData<'v>>,
        channels: usize,
    ) -> Result<Option<DeviceView<'v, f32>>> {
        Ok(match bias {
            None => None,
            Some(DeviceConv3dData::F32(v)) => Some(v),
            Some(DeviceConv3dData::BF16(v)) if channels == 0 => Some(v.cast::<f32>()?),
            Some(DeviceConv3dData::BF16(v)) => {
                let b = DeviceScratch::ensure(alloc_on, slot, channels)?;
                stream.convert(&v, &mut b.slice_mut(..channels)?)?;
                Some(b.slice(..channels)?)
            }
        })
    }
}

/// The chain's scratch for one call: the shared one (locked), or a
/// call's own when another thread holds it.
pub(super) enum ScratchGuard<'c> {
    Shared(MutexGuard<'c, Option<DeviceScratch>>),
    Own(DeviceScratch),
}

impl ScratchGuard<'_> {
    pub(super) fn get(&mut self) -> Result<&mut DeviceScratch> {
        match self {
            ScratchGuard::Own(s) => Ok(s),
            ScratchGuard::Shared(g) => g.as_mut().ok_or(Error::Conv3dTier {
                tier: "check",
                reason: "the chain's scratch was not made",
            }),
        }
    }
}

impl Conv3dChain {
    /// The scratch buffers of `device` for one call.
    pub(super) fn scratch_for(&self, device: &Device) -> Result<ScratchGuard<'_>> {
        let mut g = match self.scratch.try_lock() {
            Ok(g) => g,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            // Another call holds it: this call gets buffers of its own.
            Err(TryLockError::WouldBlock) => {
                return Ok(ScratchGuard::Own(DeviceScratch::new(device)?))
            }
        };
        if !g.as_ref().is_some_and(|s| s.device.same(device)) {
            *g = Some(DeviceScratch::new(device)?);
        }
        Ok(ScratchGuard::Shared(g))
    }

    /// Computes a conv3d whose operands and output are device memory of
    /// `stream`'s device (tensors borrowed from PyTorch through DLPack, say),
    /// on `stream`, returning the report. Input `[N, C, D, H, W]` and weight
    /// `[K, C/G, KD, KH, KW]` of one dtype (f32 or bf16), bias `[K]` of
    /// either; `out` is the f32 output `[N, K, OD, OH, OW]`, written in
    /// place.
    ///
    /// Work the caller queued on `stream` before the call (what wrote the
    /// operands) is ordered before the chain reads them: everything runs
    /// on `stream`. The output is complete when this returns: the check's
    /// read-back waits for `stream` (and with no checks configured, the
    /// stream is synchronized); no other stream or device-wide sync is
    /// waited for. GPU tiers of another device, and the CPU tier, copy the
    /// operands to the host when they run, and the output in.
    ///
    /// The checks run on the device (see the module docs): the same
    /// non-finite scan, sampled points ([`crate::conv3d::sample_index`]),
    /// tolerances and overflow rule as [`Conv3dChain::run_into`]. A check
    /// that cannot run (its launch fails) fails the tier it was checking.
    ///
    /// Errors: [`Error::DeviceMismatch`] when an operand is not on
    /// `stream`'s device; the shape and parameter errors of
    /// [`Conv3dGeometry::new`]; [`Error::Conv3dDType`] for a weight of
    /// another dtype than the input; [`Error::LengthMismatch`] for an
    /// operand or an `out` of another length than its shape's;
    /// [`Error::Conv3dNoTier`] and [`Error::Conv3dOverflow`] as
    /// [`Conv3dChain::run_into`]; errors of the bias widening.
    #[allow(clippy::too_many_arguments)]
    pub fn run_device<D: ShapeDim>(
        &self,
        stream: &Stream,
        params: Conv3dParams,
        input: DeviceConv3dData<'_>,
        input_shape: &[D],
        weight: DeviceConv3dData<'_>,
        weight_shape: &[D],
        bias: Option<DeviceConv3dData<'_>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<Conv3dReport> {
        let g = validate(
            stream,
            params,
            (input, input_shape),
            (weight, weight_shape),
            bias,
            (out.device(), out.len()),
        )?;
        let k = g.out_channels;
        let mut guard = self.scratch_for(stream.device())?;
        let scratch = guard.get()?;
        let DeviceScratch {
            alloc_on,
            bias: bias_buf,
            check,
            ..
        } = scratch;
        let bias_f32 = DeviceScratch::bias_f32(stream, alloc_on, bias_buf, bias, k)?;
        let ops = DeviceOperands {
            stream,
            geometry: g,
            input,
            weight,
            bias: bias_f32,
            raw_bias: bias,
            host: OnceCell::new(),
        };
        let total = g.output_len();
        let samples = sample_count(total, self.options().verify_samples).min(CHECK_MAX_SAMPLES);
        let words = HEADER + CHECK_WORDS * samples.max(1);
        let check = DeviceScratch::ensure(alloc_on, check, words)?;
        self.run_tiers(
            |tier| tier.support_device(&ops),
            |tier| {
                tier.run_device(&ops, out)
                    .map_err(|e| TierFail::Failed(Failure::Error(e)))?;
                self.check_device(&ops, &out.as_view(), samples, check)
            },
        )
    }

    /// The checks of one tier's device output `out` (see the module docs),
    /// with `check` (at least `HEADER + CHECK_WORDS * max(samples, 1)`
    /// words) for the counts and results.
    fn check_device(
        &self,
        ops: &DeviceOperands<'_, '_>,
        out: &DeviceView<'_, f32>,
        samples: usize,
        check: &mut DeviceBuffer<u64>,
    ) -> std::result::Result<(), TierFail> {
        let err = |e: Error| TierFail::Failed(Failure::Error(e));
        let s = ops.stream;
        let scan = self.options().scan_non_finite;
        let used = HEADER + CHECK_WORDS * samples;
        if !scan && samples == 0 {
            return s.synchronize().map_err(err);
        }
        let words = self
            .queue_check(ops, out, samples, None, check)
            .and_then(|()| read_words(s, check, used))
            .map_err(err)?;
        let points = CheckedPoint::decode(&words[HEADER..]);
        if scan && words[OUT_COUNTS].iter().any(|&c| c != 0) {
            self.non_finite(ops, out, check)?;
        }
        let rel = self.rel_tol(ops.dtype());
        for p in points {
            let Some(index) = p.index else { continue };
            compare(index, p.value, p.reference, p.magnitude, rel)?;
        }
        Ok(())
    }

    /// Queues the output's non-finite count (when the scan is on and not
    /// `locate`) and the device check of `samples` points (or, with
    /// `locate`, of the first non-finite point) into `check`.
    fn queue_check(
        &self,
        ops: &DeviceOperands<'_, '_>,
        out: &DeviceView<'_, f32>,
        samples: usize,
        locate: Option<()>,
        check: &mut DeviceBuffer<u64>,
    ) -> Result<()> {
        let s = ops.stream;
        let mut all = check.view_mut();
        let (mut head, mut results) = all.slice_mut(..)?.split_at_mut(HEADER)?;
        if locate.is_none() && self.options().scan_non_finite {
            let mut counts = head.slice_mut(OUT_COUNTS)?;
            counts.memset_zero(s)?;
            s.count_nonfinite_into(out, &mut counts)?;
        }
        if samples == 0 {
            return Ok(());
        }
        let mut slot = head.slice_mut(LOCATE_SLOT..=LOCATE_SLOT)?;
        let locate = locate.map(|()| &mut slot);
        let seed = self.options().seed;
        let g = &ops.geometry;
        match (ops.input, ops.weight, ops.raw_bias) {
            (DeviceConv3dData::F32(x), DeviceConv3dData::F32(w), b) => check_typed(
                s,
                g,
                (&x, &w, b),
                out,
                (samples, seed),
                locate,
                &mut results,
            ),
            (DeviceConv3dData::BF16(x), DeviceConv3dData::BF16(w), b) => check_typed(
                s,
                g,
                (&x, &w, b),
                out,
                (samples, seed),
                locate,
                &mut results,
            ),
            (x, w, _) => Err(Error::Conv3dDType {
                tensor: "weight",
                dtype: w.dtype(),
                expected: x.dtype(),
            }),
        }
    }

    /// A non-finite value in the output: the operands' counts (inputs all
    /// finite?) and the reference at the first non-finite output point,
    /// on the device, read back in one copy; then the overflow rule.
    fn non_finite(
        &self,
        ops: &DeviceOperands<'_, '_>,
        out: &DeviceView<'_, f32>,
        check: &mut DeviceBuffer<u64>,
    ) -> std::result::Result<(), TierFail> {
        let err = |e: Error| TierFail::Failed(Failure::Error(e));
        let s = ops.stream;
        let queue = |check: &mut DeviceBuffer<u64>| -> Result<()> {
            let mut all = check.view_mut();
            let operands = [Some(ops.input), Some(ops.weight), ops.raw_bias];
            for (range, data) in IN_COUNTS.into_iter().zip(operands) {
                let mut counts = all.slice_mut(range)?;
                counts.memset_zero(s)?;
                if let Some(d) = data {
                    d.count_nonfinite_into(s, &mut counts)?;
                }
            }
            self.queue_check(ops, out, 1, Some(()), check)
        };
        let words = queue(check)
            .and_then(|()| read_words(s, check, HEADER + CHECK_WORDS))
            .map_err(err)?;
        let inputs_finite = IN_COUNTS
            .into_iter()
            .all(|r| words[r].iter().all(|&c| c == 0));
        if !inputs_finite {
            return Ok(()); // a NaN or infinity in, one out: no failure
        }
        let Some(p) = CheckedPoint::decode(&words[HEADER..]).into_iter().next() else {
            return Err(err(located_nothing()));
        };
        let Some(index) = p.index else {
            return Err(err(located_nothing()));
        };
        if overflows_f32(p.reference) {
            return Err(TierFail::Overflow {
                index,
                reference: p.reference,
                value: p.value,
            });
        }
        Err(TierFail::Failed(Failure::NonFinite {
            index,
            value: p.value,
        }))
    }
}

impl Conv3dChain {
    /// Checks a conv3d output that something else computed (torch's own
    /// conv3d, say: what `install_conv3d_fallback(mode="verify")` does)
    /// at this chain's sampled points, on the device, on `stream`: the f64
    /// recomputation from the operands against `output` (f32 or bf16,
    /// `[N, K, OD, OH, OW]`) within the chain's tolerance for the inputs'
    /// dtype, read back in one small copy. Operands as
    /// [`Conv3dChain::run_device`].
    ///
    /// Returns `Ok(Ok(()))` when every sampled point agrees,
    /// `Ok(Err(Failure::ValueMismatch { .. }))` at the first that does not
    /// (a NaN or infinity at a sampled point whose reference is finite
    /// included). There is no non-finite scan here (the caller has one:
    /// `torch.isfinite`), and with [`Conv3dOptions::verify_samples`]
    /// zero nothing is checked.
    ///
    /// Errors: those of [`Conv3dChain::run_device`]'s validation; the
    /// check's launch or read-back error.
    ///
    /// [`Conv3dOptions::verify_samples`]: super::Conv3dOptions::verify_samples
    #[allow(clippy::too_many_arguments)]
    pub fn verify_device<D: ShapeDim>(
        &self,
        stream: &Stream,
        params: Conv3dParams,
        input: DeviceConv3dData<'_>,
        input_shape: &[D],
        weight: DeviceConv3dData<'_>,
        weight_shape: &[D],
        bias: Option<DeviceConv3dData<'_>>,
        output: DeviceConv3dData<'_>,
    ) -> Result<std::result::Result<(), Failure>> {
        let rel = self.rel_tol(input.dtype());
        self.verify_device_within(
            stream,
            params,
            (input, input_shape),
            (weight, weight_shape),
            bias,
            output,
            rel,
        )
    }

    /// [`Conv3dChain::verify_device`] with the tolerance `rel_tol`
    /// (relative to each point's `|bias| + sum |x * w|`) instead of the
    /// chain's for the dtype: for an output computed at a known lower
    /// precision, e.g. TF32 (10-bit mantissa products: `2e-3` covers them)
    /// for f32 operands.
    ///
    /// Errors: those of [`Conv3dChain::verify_device`].
    #[allow(clippy::too_many_arguments)]
    pub fn verify_device_within<D: ShapeDim>(
        &self,
        stream: &Stream,
        params: Conv3dParams,
        (input, input_shape): (DeviceConv3dData<'_>, &[D]),
        (weight, weight_shape): (DeviceConv3dData<'_>, &[D]),
        bias: Option<DeviceConv3dData<'_>>,
        output: DeviceConv3dData<'_>,
        rel_tol: f64,
    ) -> Result<std::result::Result<(), Failure>> {
        let g = validate(
            stream,
            params,
            (input, input_shape),
            (weight, weight_shape),
            bias,
            (output.device(), output.len()),
        )?;
        let samples =
            sample_count(g.output_len(), self.options().verify_samples).min(CHECK_MAX_SAMPLES);
        if samples == 0 || Conv3dKernel::Naive.unsupported(&g).is_some() {
            return Ok(Ok(()));
        }
        let mut guard = self.scratch_for(stream.device())?;
        let scratch = guard.get()?;
        let words = CHECK_WORDS * samples;
        let buf = DeviceScratch::ensure(&scratch.alloc_on, &mut scratch.check, words)?;
        let queued = {
            let mut results = buf.slice_mut(..words)?;
            let r = &mut results;
            let sampling = (samples, self.options().seed);
            macro_rules! check_out {
                ($x:expr, $w:expr, $y:expr) => {
                    match bias {
                        Some(DeviceConv3dData::F32(b)) => {
                            stream
                                .conv3d_ops()
                                .check(&g, $x, $w, Some(&b), $y, sampling, None, r)
                        }
                        Some(DeviceConv3dData::BF16(b)) => {
                            stream
                                .conv3d_ops()
                                .check(&g, $x, $w, Some(&b), $y, sampling, None, r)
                        }
                        None => stream
                            .conv3d_ops()
                            .check::<_, f32, _>(&g, $x, $w, None, $y, sampling, None, r),
                    }
                };
            }
            use DeviceConv3dData::{BF16, F32};
            match (input, weight, output) {
                (F32(x), F32(w), F32(y)) => check_out!(&x, &w, &y),
                (F32(x), F32(w), BF16(y)) => check_out!(&x, &w, &y),
                (BF16(x), BF16(w), F32(y)) => check_out!(&x, &w, &y),
                (BF16(x), BF16(w), BF16(y)) => check_out!(&x, &w, &y),
                (x, w, _) => Err(Error::Conv3dDType {
                    tensor: "weight",
                    dtype: w.dtype(),
                    expected: x.dtype(),
                }),
            }
        };
        queued?;
        let words = read_words(stream, buf, words)?;
        for p in CheckedPoint::decode(&words) {
            let Some(index) = p.index else { continue };
            if let Err(f) = compare(index, p.value, p.reference, p.magnitude, rel_tol) {
                return Ok(Err(f));
            }
        }
        Ok(Ok(()))
    }
}

/// The checks every device call starts with: devices, shapes, dtypes and
/// lengths (the output's given as its device and length).
pub(super) fn validate<D: ShapeDim>(
    stream: &Stream,
    params: Conv3dParams,
    (input, input_shape): (DeviceConv3dData<'_>, &[D]),
    (weight, weight_shape): (DeviceConv3dData<'_>, &[D]),
    bias: Option<DeviceConv3dData<'_>>,
    (out_device, out_len): (&Device, usize),
) -> Result<Conv3dGeometry> {
    input.check_device(stream, "conv3d_device input")?;
    weight.check_device(stream, "conv3d_device weight")?;
    if let Some(b) = &bias {
        b.check_device(stream, "conv3d_device bias")?;
    }
    if !stream.device().same(out_device) {
        return Err(Error::DeviceMismatch {
            op: "conv3d_device output",
        });
    }
    let g = Conv3dGeometry::new(params, input_shape, weight_shape)?;
    if weight.dtype() != input.dtype() {
        return Err(Error::Conv3dDType {
            tensor: "weight",
            dtype: weight.dtype(),
            expected: input.dtype(),
        });
    }
    let k = g.out_channels;
    for (op, expected, actual) in [
        (
            "conv3d input",
            g.input_shape().iter().product(),
            input.len(),
        ),
        (
            "conv3d weight",
            g.weight_shape().iter().product(),
            weight.len(),
        ),
        ("conv3d bias", k, bias.map_or(k, |b| b.len())),
        ("conv3d device output", g.output_len(), out_len),
    ] {
        if expected != actual {
            return Err(Error::LengthMismatch {
                op,
                expected,
                actual,
                tensor: None,
            });
        }
    }
    Ok(g)
}

pub(super) fn located_nothing() -> Error {
    Error::Conv3dTier {
        tier: "check",
        reason: "the scan counted a non-finite output value the locate pass did not find",
    }
}

/// The first `used` words of `check`, read back on `s` (waits for it).
pub(super) fn read_words(s: &Stream, check: &DeviceBuffer<u64>, used: usize) -> Result<Vec<u64>> {
    let mut words = vec![0u64; used];
    check.slice(..used)?.copy_dtoh(s, &mut words)?;
    Ok(words)
}

/// Input, weight and the bias as given.
type CheckOperands<'r, 'v, T> = (
    &'r DeviceView<'v, T>,
    &'r DeviceView<'v, T>,
    Option<DeviceConv3dData<'v>>,
);

/// [`Conv3dOps::check`](crate::device::Conv3dOps::check) with the bias's own element type.
fn check_typed<T: crate::convert::Element>(
    s: &Stream,
    g: &Conv3dGeometry,
    (x, w, bias): CheckOperands<'_, '_, T>,
    out: &DeviceView<'_, f32>,
    sampling: (usize, u64),
    locate: Option<&mut DeviceViewMut<'_, u64>>,
    results: &mut DeviceViewMut<'_, u64>,
) -> Result<()> {
    match bias {
        Some(DeviceConv3dData::BF16(b)) => {
            s.conv3d_ops()
                .check(g, x, w, Some(&b), out, sampling, locate, results)
        }
        Some(DeviceConv3dData::F32(b)) => {
            s.conv3d_ops()
                .check(g, x, w, Some(&b), out, sampling, locate, results)
        }
        None => s
            .conv3d_ops()
            .check::<T, f32, f32>(g, x, w, None, out, sampling, locate, results),
    }
}

#[cfg(test)]
mod tests;
