//! The vocabulary of every fallback chain: attempts, outcomes, failures.
//!
//! A chain tries its steps in order (the rungs of
//! [`transfer::Rung`](crate::transfer::Rung), the tiers of
//! [`conv3d_chain::TierKind`](crate::conv3d_chain::TierKind)) until one
//! serves, and records what happened at each (crate contract 3, see
//! [the crate docs](crate#contracts)):
//!
//! - a step that ran and did not serve is an [`Attempt`] holding its
//!   [`Failure`]; the loader's
//!   [`TensorReport::attempts`](crate::transfer::TensorReport::attempts)
//!   lists those of one tensor, the conv3d report
//!   [`Conv3dReport::failures`](crate::conv3d_chain::Conv3dReport::failures)
//!   those of one call;
//! - the conv3d report also lists the tiers it skipped and the one that
//!   served, each with an [`Outcome`];
//! - the failure kinds are one enum for every chain: an operation's
//!   [`Error`], a check that found different data (a fingerprint of a copy
//!   or of an output, a value recomputed on the CPU), a non-finite value,
//!   a kernel that is missing or untrusted.

use std::fmt;

use crate::convert::Fingerprint;
use crate::dtype::DType;
use crate::error::Error;

/// Which fingerprint check of a transfer caught a bad result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub enum Check {
    /// The copied bytes on the device against the staged host bytes.
    Copy,
    /// The tensor's final bytes on the device (after the conversion, or the
    /// device-side copy) against what the host computed from the source.
    Output,
}

/// Why a step of a fallback chain that ran did not serve.
#[derive(Debug)]
#[non_exhaustive]
pub enum Failure {
    /// An operation failed (device error, out of memory, injected fault).
    Error(Error),
    /// A fingerprint check found different data (contract 2): the
    /// fingerprint the host computed against the device's.
    FingerprintMismatch {
        /// Which check.
        check: Check,
        /// Fingerprint the host computed.
        expected: Fingerprint,
        /// Fingerprint of the device's data.
        actual: Fingerprint,
    },
    /// A sampled output point differs from its f64 recomputation on the
    /// CPU beyond the tolerance.
    ValueMismatch {
        /// Flat index of the point.
        index: usize,
        /// The step's value.
        got: f32,
        /// The f64 reference.
        expected: f64,
        /// The allowed absolute difference.
        tolerance: f64,
    },
    /// The output holds a NaN or infinity although every input is finite.
    NonFinite {
        /// Flat index of the first such point.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// The work this item shared with others (a pinned-buffer job of the
    /// loader) failed; the error is recorded on item `with` (the first).
    JobFailed {
        /// The item whose report holds the error.
        with: String,
    },
    /// The step cannot do this conversion on the device: no device kernel
    /// for the pair (`f64 -> f32`), or the kernel failed the device's
    /// self-test.
    NoTrustedKernel {
        /// Source dtype.
        from: DType,
        /// Target dtype.
        to: DType,
    },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Error(e) => write!(f, "{e}"),
            Failure::FingerprintMismatch {
                check,
                expected,
                actual,
            } => write!(
                f,
                "{check:?} fingerprint mismatch: expected {expected}, device gave {actual}"
            ),
            Failure::ValueMismatch {
                index,
                got,
                expected,
                tolerance,
            } => write!(
                f,
                "output {got} at index {index} differs from the f64 reference {expected} by more than {tolerance:.3e}"
            ),
            Failure::NonFinite { index, value } => {
                write!(f, "non-finite output {value} at index {index}")
            }
            Failure::JobFailed { with } => {
                write!(
                    f,
                    "its pinned-buffer job failed (error recorded on {with:?})"
                )
            }
            Failure::NoTrustedKernel { from, to } => {
                write!(f, "no trusted device kernel for {from}->{to}")
            }
        }
    }
}

/// One step of a chain that ran and did not serve: which step (a
/// [`Rung`](crate::transfer::Rung) of the loader) and why.
#[derive(Debug)]
pub struct Attempt<S> {
    /// The step.
    pub step: S,
    /// What went wrong.
    pub failure: Failure,
}

/// What happened at one step of a chain during one call.
#[derive(Debug)]
pub enum Outcome {
    /// The step's result passed the checks and was returned.
    Served,
    /// The step was not run: forbidden, not the forced step, unsupported
    /// parameters, or unavailable here.
    Skipped(String),
    /// The step ran and failed.
    Failed(Failure),
}
