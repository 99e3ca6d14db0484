//! What a call and a chain's life did: reports and statistics.
//!
//! [`Conv3dReport`]: one [`TierAttempt`] per tier; [`TierStats`]: counters
//! per tier over the chain's life.

use std::fmt;
use std::time::Duration;

use super::TierKind;
use crate::error::Error;
use crate::fallback::{Failure, Outcome};

/// One tier's part in a call: what happened there ([`Outcome`]) and how
/// long it took.
#[derive(Debug)]
#[non_exhaustive]
pub struct TierAttempt {
    /// The tier's kind.
    pub kind: TierKind,
    /// The tier's name.
    pub name: String,
    /// What happened.
    pub outcome: Outcome,
    /// Time spent in it (run and checks; zero when skipped).
    pub time: Duration,
}

/// The record of one call: which tier served and what happened before.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Conv3dReport {
    /// Every tier of the chain in order, up to the one that served.
    pub attempts: Vec<TierAttempt>,
}

impl Conv3dReport {
    /// The attempt that served, if any.
    pub fn served(&self) -> Option<&TierAttempt> {
        self.attempts
            .iter()
            .find(|a| matches!(a.outcome, Outcome::Served))
    }

    /// The kind of the tier that served, if any.
    pub fn served_by(&self) -> Option<TierKind> {
        self.served().map(|a| a.kind)
    }

    /// The report an [`Error::Conv3dNoTier`] carries (the error module sits
    /// below this one, so the variant holds it boxed); `None` for any other
    /// error.
    pub fn of(e: &Error) -> Option<&Conv3dReport> {
        match e {
            Error::Conv3dNoTier { report } => report.downcast_ref(),
            _ => None,
        }
    }

    /// The failures before the serving tier (skips excluded).
    pub fn failures(&self) -> impl Iterator<Item = (&TierAttempt, &Failure)> + '_ {
        self.attempts.iter().filter_map(|a| match &a.outcome {
            Outcome::Failed(f) => Some((a, f)),
            _ => None,
        })
    }
}

impl fmt::Display for Conv3dReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.attempts.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            match &a.outcome {
                Outcome::Served => write!(f, "{}: served in {:.3?}", a.name, a.time)?,
                Outcome::Skipped(why) => write!(f, "{}: skipped ({why})", a.name)?,
                Outcome::Failed(Failure::Error(e)) => write!(f, "{}: failed (error: {e})", a.name)?,
                Outcome::Failed(why) => write!(f, "{}: failed ({why})", a.name)?,
            }
        }
        if self.attempts.is_empty() {
            f.write_str("no tiers")?;
        }
        Ok(())
    }
}

/// A report is the error of a call that no tier served
/// ([`Error::Conv3dNoTier`] carries it boxed, [`Conv3dReport::of`] gives it
/// back).
impl std::error::Error for Conv3dReport {}

/// Counters of one tier over the chain's life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TierStats {
    /// The tier's name.
    pub name: String,
    /// Times it ran (skips excluded).
    pub attempts: u64,
    /// Times its result was returned.
    pub successes: u64,
    /// Times it was skipped (forbidden, not forced, unsupported, unavailable).
    pub skips: u64,
    /// Runs that returned an error.
    pub errors: u64,
    /// Runs rejected by the non-finite scan.
    pub non_finite: u64,
    /// Runs rejected by the sampled f64 verification.
    pub mismatches: u64,
    /// Total time spent running and checking it.
    pub time: Duration,
}
