//! The fused guard check and decision of a conv3d output on the device.

use super::Conv3dOps;
use crate::conv3d::Conv3dGeometry;
use crate::convert::Element;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::conv3d_stream::CheckOperands;
use crate::device::raw::backend::KernelOp;
use crate::device::raw::conv3d::check_len;
use crate::device::raw::conv3d::CHECK_WORDS;
use crate::device::raw::conv3d::*;
use crate::error::{Error, Result};

/// The counts, points and verdict of one decision.
pub type GuardWords<'r, 'v> = (
    &'r DeviceView<'v, u64>,
    Option<&'r DeviceView<'v, u64>>,
    &'r DeviceView<'v, u64>,
);

impl Conv3dOps<'_> {
    /// Queues the guarded fallback's fused check of `output` on this stream
    /// (one launch; no synchronisation): its NaN and Inf counts (for a
    /// [`GuardStage::Repair`] the operands' too), `samples` points of
    /// [`sample_index`](crate::conv3d::sample_index)`(output_len, seed, j)`
    /// recomputed in f64 as [`Conv3dOps::check`](crate::device::Conv3dOps::check) does, and the verdict
    /// over both, as [`Conv3dOps::guard_decide`](crate::device::Conv3dOps::guard_decide) decides it (within
    /// `rel_tol`; for the output without the operands' counts, for a repair
    /// with them). Writes the stage's record: for [`GuardStage::Output`]
    /// [`GUARD_RECORD_WORDS`] words (counts, verdict, then the repair's
    /// words zeroed), for [`GuardStage::Repair`] [`GUARD_REPAIR_WORDS`]
    /// (operand counts, counts, verdict); read a verdict back with
    /// [`GuardVerdict::decode`].
    ///
    /// `words`: `results` ([`CHECK_WORDS`] per point), `acc`
    /// ([`GUARD_ACC_WORDS`] words that must be zero when the launch runs:
    /// a GPU's blocks add their counts and a ticket into them and the last
    /// block zeroes them again, so zero them once, when they are made, and
    /// order the launches that share them: one stream, or an event), and
    /// the record. With `gate`, nothing runs (and nothing is written)
    /// unless the gate is non-zero as the kernel starts.
    ///
    /// Errors: as [`Conv3dOps::check_gated`](crate::device::Conv3dOps::check_gated);
    /// [`Error::LengthMismatch`] for accumulators or a record of other
    /// lengths; the backend's launch error.
    pub fn guard_check<T: Element, B: Element, Y: Element>(
        &self,
        g: &Conv3dGeometry,
        operands: CheckOperands<'_, '_, T, B, Y>,
        (samples, seed, rel_tol): (usize, u64, f64),
        stage: GuardStage,
        (results, acc, record): (
            &mut DeviceViewMut<'_, u64>,
            &mut DeviceViewMut<'_, u64>,
            &mut DeviceViewMut<'_, u64>,
        ),
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "conv3d_guard_check";
        let check = self.check_launch(g, operands, (samples, seed), results, gate)?;
        self.check_device(OP, acc.device())?;
        self.check_device(OP, record.device())?;
        check_len("guard accumulators", GUARD_ACC_WORDS, acc.len())?;
        let words = match stage {
            GuardStage::Output => GUARD_RECORD_WORDS,
            GuardStage::Repair => GUARD_REPAIR_WORDS,
        };
        check_len("guard record", words, record.len())?;
        let args = Conv3dGuardCheck {
            check,
            rel_tol,
            stage,
            acc: acc.device_ptr(),
            record: record.device_ptr(),
        };
        // SAFETY: as for `conv3d_check_gated`: the operands, the output
        // and the gate are live ranges of this device of their shapes'
        // lengths (checked by `check_launch`), only read; `results`, `acc`
        // and `record`, of the lengths checked, are borrowed mutably, so
        // nothing else accesses them.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dGuardCheck { args: &args }, self.raw())
        }
    }
    /// Queues the guarded fallback's verdict on this stream (one block; no
    /// synchronisation): over `out_counts` (2 words: the checked output's
    /// NaN and Inf counts), `in_counts` (6 words, the operands' counts, or
    /// `None`: any non-finite output counts) and `results` (the device
    /// check's sampled points, [`CHECK_WORDS`] words each; empty: the
    /// counts alone decide), into `verdict` ([`VERDICT_WORDS`] words; its
    /// second word is the gate of a repair: 1 when the output is wrong).
    /// With `gate`, the decision runs only when that gate is non-zero.
    /// Read back with [`GuardVerdict::decode`].
    ///
    /// Errors: [`Error::DeviceMismatch`]; [`Error::LengthMismatch`] for
    /// counts, a verdict or a gate of other lengths, or results that are
    /// not whole points; [`Error::Conv3dTier`] for more points than
    /// [`crate::device::raw::conv3d::CHECK_MAX_SAMPLES`]; the backend's launch error.
    pub fn guard_decide(
        &self,
        (out_counts, in_counts, results): GuardWords<'_, '_>,
        rel_tol: f64,
        verdict: &mut DeviceViewMut<'_, u64>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "conv3d_guard_decide";
        for d in [out_counts.device(), results.device(), verdict.device()] {
            self.check_device(OP, d)?;
        }
        check_len("guard out counts", 2, out_counts.len())?;
        check_len("guard verdict", VERDICT_WORDS, verdict.len())?;
        if let Some(c) = in_counts {
            self.check_device(OP, c.device())?;
            check_len("guard operand counts", 6, c.len())?;
        }
        let gate = self.gate_ptr((OP, "guard gate"), gate)?;
        check_len(
            "guard results",
            results.len() - results.len() % CHECK_WORDS,
            results.len(),
        )?;
        let samples = results.len() / CHECK_WORDS;
        if samples > crate::device::raw::conv3d::CHECK_MAX_SAMPLES {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason: "the sampled points must number at most CHECK_MAX_SAMPLES",
            });
        }
        let args = Conv3dGuardDecide {
            gate,
            out_counts: out_counts.device_ptr(),
            in_counts: in_counts.map(|c| c.device_ptr()),
            results: results.device_ptr(),
            samples,
            rel_tol,
            verdict: verdict.device_ptr(),
        };
        // SAFETY: every range is a live view of this device with the length
        // checked above (views of u64 are aligned); only `verdict`, borrowed
        // mutably, is written.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dGuardDecide { args: &args }, self.raw())
        }
    }
}
