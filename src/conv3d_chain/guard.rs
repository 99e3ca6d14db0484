//! The guarded conv3d: another library's output checked and, where it is
//! wrong, repaired by the tiled kernel on the device, with no host wait.
//!
//! [`Conv3dGuard::guard`] takes a conv3d output that something else
//! computed (torch's conv3d, on torch's stream) and queues behind it, on
//! the same stream:
//!
//! 1. one launch ([`Conv3dOps::guard_check`](crate::device::Conv3dOps::guard_check), [`GuardStage::Output`]):
//!    the output's NaN/Inf count, when asked the device check of sampled
//!    points (f64 recomputation from the operands), and the verdict, whose
//!    second word is the *gate* of everything that follows (the launch
//!    also zeroes the repair's words of the record, so no per-call memset);
//! 2. behind the gate (each kernel reads it as it starts and returns at
//!    once when it is zero): the weight's layout where the tiled kernel
//!    wants one, the tiled kernel writing the convolution over the output
//!    in place (f32, or bf16 rounded to nearest even), and one launch of
//!    that repair's own checks ([`GuardStage::Repair`]: the operands'
//!    NaN/Inf counts, the repaired output's, the chain's sampled points,
//!    the verdict);
//! 3. an asynchronous copy of the counts and both verdicts (22 words) into
//!    a pinned slot of a ring, and the slot's event (which a later call on
//!    another stream waits for before it reuses the buffers).
//!
//! So a guarded call makes five driver calls (three launches, the copy,
//! the event), six where the tiled kernel wants a weight layout and one
//! more for a bf16 bias (widened to f32 for the tiled kernel); once the
//! ring has wrapped, one more waits for the event of the slot's previous
//! call (64 calls old: done), and a call on another stream than the last
//! one's waits for that call's event on the device. The separate count,
//! check and verdict launches, a memset and a second event took fifteen
//! or more.
//!
//! Nothing waits on the host: the call returns a ticket, and the verdicts
//! come back as [`GuardRecord`]s when a slot is reused (the ring holds
//! [`GUARD_SLOTS`] calls, so the host learns a call's verdict at most that
//! many guarded calls later, waiting only on work that old) or when the
//! caller asks ([`Conv3dGuard::harvest`], which waits for all of them).
//!
//! What the caller gives up for that: a repaired output was repaired by the
//! tiled tier alone (not the whole chain), and a repair that itself fails
//! its checks is known only when its record is harvested
//! ([`GuardRecord::repair_failed`]): the caller reports it then and sends
//! later calls of that kind through the synchronous chain
//! ([`Conv3dChain::run_device`]), which tries every tier. Calls the tiled
//! kernel cannot take are refused up front ([`Guarded::Unguardable`]) so
//! that the caller checks them synchronously instead.

use std::sync::Mutex;

use half::bf16;

use super::device_run::{validate, DeviceConv3dData, DeviceScratch};
use super::Conv3dChain;
use crate::conv3d::{Conv3dGeometry, Conv3dParams, ShapeDim};
use crate::device::{
    conv3d_stream::CheckBias, info::RawStream, raw::Conv3dWeightLayout, raw::GuardStage,
    raw::GuardVerdict, raw::CHECK_MAX_SAMPLES, raw::CHECK_WORDS, raw::GUARD_ACC_WORDS,
    raw::GUARD_RECORD_WORDS, raw::GUARD_REPAIR_WORDS, raw::VERDICT_WORDS, Conv3dKernel, Device,
    DeviceBuffer, DeviceView, DeviceViewMut, PinnedBuffer, Stream,
};
use crate::error::{Error, Result};

/// Guarded calls whose verdicts can be in flight at once (the pinned ring).
pub const GUARD_SLOTS: usize = 64;

/// Words of the device header: the record (output counts (2), verdict
/// (6), operand counts (6), the repair's counts (2) and verdict (6)),
/// padding.
const HEAD: usize = 32;
/// The words copied back per call: the record.
const RECORD_WORDS: usize = GUARD_RECORD_WORDS;
const VERDICT: std::ops::Range<usize> = 2..8;
const IN_COUNTS: std::ops::Range<usize> = 8..14;
const REPAIR_VERDICT: std::ops::Range<usize> = 16..22;
// The record is the output stage's: its counts and verdict, then the
// repair stage's words.
const _: () = assert!(RECORD_WORDS == VERDICT.end + GUARD_REPAIR_WORDS);
const _: () = assert!(REPAIR_VERDICT.end == RECORD_WORDS && RECORD_WORDS <= HEAD);
const _: () = assert!(VERDICT.end - VERDICT.start == VERDICT_WORDS);

/// An output to guard, in device memory, written in place when repaired.
#[derive(Debug)]
#[non_exhaustive]
pub enum GuardedOutput<'a> {
    /// f32 elements.
    F32(DeviceViewMut<'a, f32>),
    /// bf16 elements (the repair rounds to nearest even).
    BF16(DeviceViewMut<'a, bf16>),
}

impl GuardedOutput<'_> {
    fn len(&self) -> usize {
        match self {
            GuardedOutput::F32(v) => v.len(),
            GuardedOutput::BF16(v) => v.len(),
        }
    }
    fn device(&self) -> &Device {
        match self {
            GuardedOutput::F32(v) => v.device(),
            GuardedOutput::BF16(v) => v.device(),
        }
    }
}

/// What [`Conv3dGuard::guard`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum Guarded {
    /// The checks and the gated repair are queued; the call's record comes
    /// back with this ticket. `records`: verdicts harvested meanwhile.
    Queued {
        /// This call's ticket.
        ticket: u64,
        /// Records of earlier calls collected to free their slots.
        records: Vec<GuardRecord>,
    },
    /// Nothing was queued: the tiled kernel cannot repair this call (the
    /// reason); check it synchronously.
    Unguardable(String),
}

/// The verdicts of one guarded call, read back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardRecord {
    /// The call's ticket ([`Guarded::Queued`]).
    pub ticket: u64,
    /// The verdict on the guarded output: a NaN/Inf in it, or a sampled
    /// point off its f64 recomputation.
    pub output: GuardVerdict,
    /// Whether the operands were all finite (counted only when the output
    /// was judged wrong; `true` otherwise).
    pub operands_finite: bool,
    /// Whether the tiled kernel rewrote the output (the verdict failed).
    pub repaired: bool,
    /// The verdict on the repaired output (no failure when not repaired).
    pub repair: GuardVerdict,
}

impl GuardRecord {
    fn decode(ticket: u64, w: &[u64]) -> GuardRecord {
        let output = GuardVerdict::decode(&w[VERDICT]);
        GuardRecord {
            ticket,
            output,
            operands_finite: w[IN_COUNTS].iter().all(|&c| c == 0),
            repaired: w[VERDICT.start + 1] != 0,
            repair: GuardVerdict::decode(&w[REPAIR_VERDICT]),
        }
    }

    /// The output was wrong and the operands finite: a failure of whatever
    /// computed it (a NaN from a NaN input is not one).
    pub fn output_failed(&self) -> bool {
        self.output.off.is_some() || (self.output.non_finite && self.operands_finite)
    }

    /// The repair ran and failed its own checks: the output holds wrong
    /// values (report it; compute later calls through the whole chain).
    pub fn repair_failed(&self) -> bool {
        self.repaired && self.repair.failed()
    }
}

/// One pinned slot of the ring and the ticket whose words it holds.
#[derive(Debug)]
struct Slot {
    words: PinnedBuffer<u64>,
    ticket: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    /// Header and both calls' sampled points.
    words: Option<DeviceBuffer<u64>>,
    /// The fused checks' accumulators: zeroed once when made, left zero
    /// by every check that runs.
    acc: Option<DeviceBuffer<u64>>,
    /// The tiled kernel's weight layout.
    layout: Option<DeviceBuffer<u32>>,
    /// A bf16 bias widened to f32.
    bias: Option<DeviceBuffer<f32>>,
    /// The slot of the last call queued: its event, recorded after that
    /// call's work on its stream, is what the next call (on another
    /// stream) waits for on the device before reusing the buffers (none
    /// once the host waited for it).
    last_slot: Option<usize>,
    /// The stream of the last call (a call on the same stream needs no
    /// wait: its work is ordered already).
    last_stream: Option<RawStream>,
    slots: Vec<Slot>,
    next_ticket: u64,
    alloc_on: Option<Stream>,
}

/// The guarded conv3d of one device (see the module docs): buffers and the
/// ring of verdicts, kept across calls. Thread-safe: calls are serialised.
#[derive(Debug)]
pub struct Conv3dGuard {
    device: Device,
    state: Mutex<State>,
}

/// Input and weight with their shapes.
pub type GuardOperand<'a, 's, D> = (DeviceConv3dData<'a>, &'s [D]);

impl Conv3dGuard {
    /// The guard of `device`. Allocates nothing until the first call.
    pub fn new(device: &Device) -> Conv3dGuard {
        Conv3dGuard {
            device: device.clone(),
            state: Mutex::new(State::default()),
        }
    }

    /// Queues the checks of `output` (the convolution of `input`, `weight`
    /// and `bias` with `params`, computed by something else and still
    /// being computed on `stream`, perhaps) and its gated repair, on
    /// `stream`; see the module docs. `samples`: points of the output to
    /// recompute in f64 (0: the NaN/Inf count alone), within `rel_tol` of
    /// each point's `|bias| + sum |x * w|`. The repair is checked with
    /// `chain`'s options (its samples, seed and tolerance for the dtype).
    ///
    /// `output` must not overlap the operands (the repair reads them while
    /// writing it), and its dtype is the input's.
    ///
    /// Errors: [`Error::DeviceMismatch`] for operands or an output of
    /// another device than `stream`'s or this guard's; the validation of
    /// [`Conv3dChain::run_device`]; [`Error::Conv3dDType`] for an output of
    /// another dtype than the input; allocation and launch errors (then
    /// nothing reliable was queued: compute the call another way).
    #[allow(clippy::too_many_arguments)]
    pub fn guard<D: ShapeDim>(
        &self,
        chain: &Conv3dChain,
        stream: &Stream,
        params: Conv3dParams,
        input: GuardOperand<'_, '_, D>,
        weight: GuardOperand<'_, '_, D>,
        bias: Option<DeviceConv3dData<'_>>,
        mut output: GuardedOutput<'_>,
        (samples, rel_tol): (usize, f64),
    ) -> Result<Guarded> {
        if !stream.device().same(&self.device) {
            return Err(Error::DeviceMismatch { op: "conv3d guard" });
        }
        let g = validate(
            stream,
            params,
            input,
            weight,
            bias,
            (output.device(), output.len()),
        )?;
        let out_dtype = match &output {
            GuardedOutput::F32(_) => crate::dtype::DType::F32,
            GuardedOutput::BF16(_) => crate::dtype::DType::BF16,
        };
        if out_dtype != input.0.dtype() {
            return Err(Error::Conv3dDType {
                tensor: "output",
                dtype: out_dtype,
                expected: input.0.dtype(),
            });
        }
        // Any shape the tiled kernel can compute: a repair is rare, so its
        // speed on a shape the chain would give the naive kernel is moot.
        if let Some(why) = Conv3dKernel::Tiled.cannot_take(&g) {
            return Ok(Guarded::Unguardable(why.to_string()));
        }
        let total = g.output_len();
        let s1 = samples.min(total).min(CHECK_MAX_SAMPLES);
        let s2 = chain
            .options()
            .verify_samples
            .min(total)
            .min(CHECK_MAX_SAMPLES);
        let repair_rel = chain.rel_tol(input.0.dtype());
        let seed = chain.options().seed;
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let st = &mut *st;
        // Free this call's slot first (its verdict may still be in flight).
        let mut records = Vec::new();
        if st.slots.len() < GUARD_SLOTS {
            let words = self.device.alloc_pinned::<u64>(RECORD_WORDS)?;
            st.slots.push(Slot {
                words,
                ticket: None,
            });
        }
        let ticket = st.next_ticket;
        let slot_at = (ticket % GUARD_SLOTS as u64) as usize;
        if let Some(slot) = st.slots.get_mut(slot_at) {
            records.extend(take_record(slot)?);
        }
        let alloc_on = match &st.alloc_on {
            Some(s) => s,
            None => st.alloc_on.insert(self.device.stream()?),
        };
        let need = HEAD + CHECK_WORDS * (s1 + s2);
        let words = DeviceScratch::ensure(alloc_on, &mut st.words, need)?;
        if st.last_stream != Some(stream.raw()) {
            let last = st.last_slot.and_then(|i| st.slots.get(i));
            if let Some(ev) = last.and_then(|slot| slot.words.pending_event()) {
                stream.wait(ev)?;
            }
        }
        let acc = match &mut st.acc {
            Some(acc) => acc,
            None => {
                let mut acc = alloc_on.alloc::<u64>(GUARD_ACC_WORDS)?;
                // On the call's stream: ordered before the checks below, and
                // every later call is ordered after this one's.
                acc.view_mut().memset_zero(stream)?;
                st.acc.insert(acc)
            }
        };
        let k = g.out_channels;
        let bias_f32 = DeviceScratch::bias_f32(stream, alloc_on, &mut st.bias, bias, k)?;
        let dtype = input.0.dtype();
        let layout = stream
            .conv3d_ops()
            .weight_layout(Conv3dKernel::Tiled, dtype, &g);
        let layout_words = (layout.len(&g) * dtype.size().unwrap_or(4)).div_ceil(4);
        let layout_buf = match layout {
            Conv3dWeightLayout::Standard => None,
            _ => Some(DeviceScratch::ensure(
                alloc_on,
                &mut st.layout,
                layout_words,
            )?),
        };
        let plan = Plan {
            g: &g,
            x: input.0,
            w: weight.0,
            bias,
            bias_f32,
            layout,
            samples: (s1, s2, seed),
            rel: (rel_tol, repair_rel),
        };
        queue(stream, &plan, (words, acc), layout_buf, &mut output)?;
        let Some(slot) = st.slots.get_mut(slot_at) else {
            return Err(no_slot());
        };
        // The copy records the slot's event after it: the next call's wait.
        words
            .slice(..RECORD_WORDS)?
            .copy_dtoh_async(stream, &mut slot.words)?;
        slot.ticket = Some(ticket);
        st.last_slot = Some(slot_at);
        st.last_stream = Some(stream.raw());
        st.next_ticket += 1;
        Ok(Guarded::Queued { ticket, records })
    }

    /// Every record not yet collected, oldest first (waits for their
    /// copies: for the device work queued before them).
    pub fn harvest(&self) -> Result<Vec<GuardRecord>> {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut out = Vec::new();
        for slot in &mut st.slots {
            out.extend(take_record(slot)?);
        }
        out.sort_by_key(|r| r.ticket);
        Ok(out)
    }
}

fn no_slot() -> Error {
    Error::Conv3dTier {
        tier: "guard",
        reason: "the verdict ring has no slot for this call",
    }
}

/// The slot's record, if it holds one (waits for its copy).
fn take_record(slot: &mut Slot) -> Result<Option<GuardRecord>> {
    let Some(ticket) = slot.ticket.take() else {
        return Ok(None);
    };
    let w = slot.words.as_slice()?;
    Ok(Some(GuardRecord::decode(ticket, w)))
}

/// One call's device work, as [`queue`] needs it.
struct Plan<'p, 'a> {
    g: &'p Conv3dGeometry,
    x: DeviceConv3dData<'a>,
    w: DeviceConv3dData<'a>,
    bias: Option<DeviceConv3dData<'a>>,
    bias_f32: Option<DeviceView<'a, f32>>,
    layout: Conv3dWeightLayout,
    /// Points checked of the output, of the repair, and their seed.
    samples: (usize, usize, u64),
    /// Tolerances of the output's check and the repair's.
    rel: (f64, f64),
}

/// Queues the output's fused check (its verdict's word 1 is the gate), the
/// gated repair and the repair's fused check into `words` (header, then
/// both calls' points), accumulating in `acc`.
fn queue(
    s: &Stream,
    p: &Plan<'_, '_>,
    (words, acc): (&mut DeviceBuffer<u64>, &mut DeviceBuffer<u64>),
    layout_buf: Option<&mut DeviceBuffer<u32>>,
    out: &mut GuardedOutput<'_>,
) -> Result<()> {
    let (s1, s2, seed) = p.samples;
    let all = words.view_mut();
    let (head, rest) = all.split_at_mut(HEAD)?;
    let (mut record, _) = head.split_at_mut(RECORD_WORDS)?;
    let (mut res1, rest) = rest.split_at_mut(CHECK_WORDS * s1)?;
    let (mut res2, _) = rest.split_at_mut(CHECK_WORDS * s2)?;
    let mut acc = acc.view_mut();
    // 1. The output's counts, points and verdict (every record word).
    let first = (&mut res1, &mut acc, &mut record);
    check(
        s,
        p,
        out,
        (s1, seed, p.rel.0),
        GuardStage::Output,
        first,
        None,
    )?;
    // 2. Behind the gate: the repair, then its counts (the operands' too),
    // points and verdict into the record's last words.
    let (verdict, mut rrecord) = record.split_at_mut(VERDICT.end)?;
    let gate = verdict
        .as_view()
        .slice(VERDICT.start + 1..VERDICT.start + 2)?;
    let gate = Some(&gate);
    repair(s, p, layout_buf, out, gate)?;
    let second = (&mut res2, &mut acc, &mut rrecord);
    check(
        s,
        p,
        out,
        (s2, seed, p.rel.1),
        GuardStage::Repair,
        second,
        gate,
    )
}

/// The fused check of `out` ([`Conv3dOps::guard_check`](crate::device::Conv3dOps::guard_check)) at `stage`.
fn check(
    s: &Stream,
    p: &Plan<'_, '_>,
    out: &GuardedOutput<'_>,
    sampling: (usize, u64, f64),
    stage: GuardStage,
    words: (
        &mut DeviceViewMut<'_, u64>,
        &mut DeviceViewMut<'_, u64>,
        &mut DeviceViewMut<'_, u64>,
    ),
    gate: Option<&DeviceView<'_, u64>>,
) -> Result<()> {
    use DeviceConv3dData::{BF16, F32};
    macro_rules! with_bias {
        ($x:expr, $w:expr, $y:expr) => {
            match p.bias {
                Some(F32(b)) => {
                    let ops = ($x, $w, Some(&b) as CheckBias<'_, '_, f32>, $y);
                    s.conv3d_ops()
                        .guard_check(p.g, ops, sampling, stage, words, gate)
                }
                Some(BF16(b)) => {
                    let ops = ($x, $w, Some(&b) as CheckBias<'_, '_, bf16>, $y);
                    s.conv3d_ops()
                        .guard_check(p.g, ops, sampling, stage, words, gate)
                }
                None => {
                    let ops = ($x, $w, None as CheckBias<'_, '_, f32>, $y);
                    s.conv3d_ops()
                        .guard_check(p.g, ops, sampling, stage, words, gate)
                }
            }
        };
    }
    match (p.x, p.w, out) {
        (F32(x), F32(w), GuardedOutput::F32(y)) => with_bias!(&x, &w, &y.as_view()),
        (BF16(x), BF16(w), GuardedOutput::BF16(y)) => with_bias!(&x, &w, &y.as_view()),
        (x, _, _) => Err(Error::Conv3dDType {
            tensor: "output",
            dtype: x.dtype(),
            expected: x.dtype(),
        }),
    }
}

/// The tiled kernel over `out`, behind `gate`, with the weight laid out
/// (behind the gate too) where the kernel asks.
fn repair(
    s: &Stream,
    p: &Plan<'_, '_>,
    layout_buf: Option<&mut DeviceBuffer<u32>>,
    out: &mut GuardedOutput<'_>,
    gate: Option<&DeviceView<'_, u64>>,
) -> Result<()> {
    use DeviceConv3dData::{BF16, F32};
    let g = p.g;
    macro_rules! run {
        ($x:expr, $w:expr, $y:expr, $t:ty) => {{
            match layout_buf {
                None => s
                    .conv3d_ops()
                    .tiled_gated(g, (&$x, &$w, p.bias_f32), $y, gate),
                Some(buf) => {
                    let mut all = buf.view_mut();
                    let mut typed = all.cast_mut::<$t>()?;
                    let mut dst = typed.slice_mut(..p.layout.len(g))?;
                    s.conv3d_ops()
                        .arrange_weight_gated(p.layout, g, &$w, &mut dst, gate)?;
                    s.conv3d_ops()
                        .tiled_gated(g, (&$x, &dst.as_view(), p.bias_f32), $y, gate)
                }
            }
        }};
    }
    match (p.x, p.w, out) {
        (F32(x), F32(w), GuardedOutput::F32(y)) => run!(x, w, y, f32),
        (BF16(x), BF16(w), GuardedOutput::BF16(y)) => run!(x, w, y, bf16),
        (x, _, _) => Err(Error::Conv3dDType {
            tensor: "output",
            dtype: x.dtype(),
            expected: x.dtype(),
        }),
    }
}
