//! The guarded conv3d fallback's device side, as data: the launches of its
//! fused check and of its decision, the gate, and the word layouts of the
//! records and the verdict (the host backend's emulation of both kernels is
//! `runtime/host/check_emulation.rs`).
//!
//! A guarded call (`conv3d_chain::Conv3dChain::guard_device`) checks an
//! output that another library computed (torch's conv3d), decides on the
//! device whether it is wrong ([`Conv3dOps::guard_decide`](crate::device::Conv3dOps::guard_decide)), and queues
//! the repair (the tiled kernel writing over that output) and the repair's
//! own checks behind a *gate*: one `u64` of device memory, the verdict's
//! second word. Each gated kernel reads the gate as it starts and returns at
//! once when it is zero. So nothing waits on the host: the verdict is copied
//! back later, when the caller asks.
//!
//! [`Conv3dOps::guard_check`](crate::device::Conv3dOps::guard_check) fuses a decision with what it reads: one
//! launch counts the output's NaN/Inf (and for a repair the operands'),
//! recomputes the sampled points and, in its last block to finish, writes
//! the verdict, where [`Stream::count_nonfinite_gated_into`](crate::device::Stream::count_nonfinite_gated_into),
//! [`Conv3dOps::check_gated`](crate::device::Conv3dOps::check_gated) and [`Conv3dOps::guard_decide`](crate::device::Conv3dOps::guard_decide) take
//! one launch each.

use super::Conv3dCheckLaunch;
#[cfg(doc)]
use super::CHECK_WORDS;
use crate::device::info::DevicePtr;

/// `u64` words of a verdict ([`Conv3dGuardDecide::verdict`]):
/// `[bits, gate, index, value, reference, tolerance]`.
pub const VERDICT_WORDS: usize = 6;

/// Verdict bit: a NaN or infinity in the checked output (from finite
/// operands, where the operands' counts were given).
pub const VERDICT_NON_FINITE: u64 = 1;
/// Verdict bit: a sampled point off its f64 recomputation.
pub const VERDICT_MISMATCH: u64 = 2;

/// `u64` words of the record a fused check of the output writes
/// ([`GuardStage::Output`]): the output's NaN and Inf counts (2), its
/// verdict ([`VERDICT_WORDS`]), then the [`GUARD_REPAIR_WORDS`] words a
/// repair's check writes, zeroed.
pub const GUARD_RECORD_WORDS: usize = 2 + VERDICT_WORDS + GUARD_REPAIR_WORDS;

/// `u64` words of the record a fused check of a repair writes
/// ([`GuardStage::Repair`]): the operands' NaN and Inf counts (input,
/// weight, bias: 6), the repaired output's (2), its verdict
/// ([`VERDICT_WORDS`]).
pub const GUARD_REPAIR_WORDS: usize = 6 + 2 + VERDICT_WORDS;

/// `u64` words of a fused check's accumulators
/// ([`Conv3dOps::guard_check`](crate::device::Conv3dOps::guard_check)): a ticket and four pairs of counts.
pub const GUARD_ACC_WORDS: usize = 9;

/// Which verdict a fused guard check decides ([`Conv3dOps::guard_check`](crate::device::Conv3dOps::guard_check)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GuardStage {
    /// The checked output's (another library's): any NaN or infinity in
    /// it counts (the operands are not read); writes
    /// [`GUARD_RECORD_WORDS`] words.
    Output,
    /// A repair's: the operands are counted too, and a NaN or infinity
    /// counts only from finite operands; writes [`GUARD_REPAIR_WORDS`]
    /// words.
    Repair,
}

/// One launch of `conv3d_guard_check_{f32,bf16}`
/// ([`KernelOp::Conv3dGuardCheck`](crate::device::raw::KernelOp::Conv3dGuardCheck)): the NaN/Inf counts, the sampled points
/// and the verdict of one output in one launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv3dGuardCheck {
    /// The points checked, as [`KernelOp::Conv3dCheck`](crate::device::raw::KernelOp::Conv3dCheck) checks them (no
    /// located point; `samples` may be 0), and the gate
    /// (`check.conv.gate`): with one, nothing runs unless it is non-zero.
    pub check: Conv3dCheckLaunch,
    /// Relative tolerance against each point's `|bias| + sum |x * w|`.
    pub rel_tol: f64,
    /// Which verdict, and so which record.
    pub stage: GuardStage,
    /// [`GUARD_ACC_WORDS`] words, zero when the launch starts and again
    /// when it ends (a GPU's blocks add into them; the host backend never
    /// touches them).
    pub acc: DevicePtr,
    /// The record: [`GUARD_RECORD_WORDS`] or [`GUARD_REPAIR_WORDS`] words
    /// by `stage`, every one written (when it runs).
    pub record: DevicePtr,
}

/// One launch of `conv3d_guard_decide` ([`KernelOp::Conv3dGuardDecide`](crate::device::raw::KernelOp::Conv3dGuardDecide)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv3dGuardDecide {
    /// With a gate, the decision runs only when the gate is non-zero (a
    /// repair's verdict, decided only when the repair ran).
    pub gate: Option<DevicePtr>,
    /// The checked output's NaN and Inf counts (2 words).
    pub out_counts: DevicePtr,
    /// The operands' counts (input, weight, bias: 6 words), or `None`: any
    /// non-finite output counts.
    pub in_counts: Option<DevicePtr>,
    /// The sampled points as the device check wrote them ([`CHECK_WORDS`]
    /// each).
    pub results: DevicePtr,
    /// Points in `results` (0: the counts alone decide).
    pub samples: usize,
    /// Relative tolerance against each point's `|bias| + sum |x * w|`.
    pub rel_tol: f64,
    /// [`VERDICT_WORDS`] words, every one written (when it runs).
    pub verdict: DevicePtr,
}

/// A verdict read back ([`GuardVerdict::decode`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardVerdict {
    /// A NaN or infinity in the output.
    pub non_finite: bool,
    /// The first sampled point off (lowest sample number): `(index, value,
    /// reference, tolerance)`.
    pub off: Option<(usize, f64, f64, f64)>,
}

impl GuardVerdict {
    /// The verdict in `words` (at least [`VERDICT_WORDS`]; shorter reads as
    /// no failure).
    pub fn decode(words: &[u64]) -> GuardVerdict {
        let Some(w) = words.get(..VERDICT_WORDS) else {
            return GuardVerdict {
                non_finite: false,
                off: None,
            };
        };
        let off = (w[0] & VERDICT_MISMATCH != 0 && w[2] != u64::MAX).then(|| {
            (
                usize::try_from(w[2]).unwrap_or(usize::MAX),
                f64::from_bits(w[3]),
                f64::from_bits(w[4]),
                f64::from_bits(w[5]),
            )
        });
        GuardVerdict {
            non_finite: w[0] & VERDICT_NON_FINITE != 0,
            off,
        }
    }

    /// Whether the output was judged wrong.
    pub fn failed(&self) -> bool {
        self.non_finite || self.off.is_some()
    }
}
