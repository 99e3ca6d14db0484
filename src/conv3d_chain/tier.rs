//! What a tier is: its kind, its support, the trait, the CPU and unavailable tiers.
//!
//! [`TierKind`], [`Support`], the [`Conv3dTier`] trait, and the two tiers
//! without a device ([`CpuTier`], [`UnavailableTier`]).

use std::fmt;

use super::{DeviceBackwardOperands, DeviceOperands};
use crate::conv3d::{
    conv3d_backward_cpu, conv3d_cpu, Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dGeometry,
    Conv3dProblem,
};
use crate::device::DeviceViewMut;
use crate::error::{Error, Result};

/// What a tier is: the crate's four kinds, in the chain's default order,
/// or [`TierKind::Custom`] for a tier written outside the crate.
///
/// Options ([`Conv3dOptions::force`](super::Conv3dOptions::force),
/// [`forbid`](super::Conv3dOptions::forbid)) select tiers by kind; reports
/// and statistics name each tier by [`Conv3dTier::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TierKind {
    /// The vendor library: MIOpen on HIP, cuDNN on CUDA, loaded at run time.
    Vendor,
    /// The tiled implicit-GEMM GPU kernel.
    Tiled,
    /// The naive GPU kernel (one thread per output point).
    Naive,
    /// The CPU implementation (rayon), which takes every parameter set.
    Cpu,
    /// A tier written outside the crate, with its kind's name (`"winograd"`):
    /// forced and forbidden by that name, counted and reported under its
    /// tier's [`Conv3dTier::name`]. It should not reuse one of the names
    /// above (those parse as the crate's kinds).
    Custom(&'static str),
}

impl TierKind {
    /// The crate's kinds in the default order ([`TierKind::Custom`] kinds
    /// are the caller's).
    pub const ALL: [TierKind; 4] = [
        TierKind::Vendor,
        TierKind::Tiled,
        TierKind::Naive,
        TierKind::Cpu,
    ];

    /// Lowercase name: `vendor`, `tiled`, `naive`, `cpu`, or a custom
    /// kind's own.
    pub fn name(self) -> &'static str {
        match self {
            TierKind::Vendor => "vendor",
            TierKind::Tiled => "tiled",
            TierKind::Naive => "naive",
            TierKind::Cpu => "cpu",
            TierKind::Custom(name) => name,
        }
    }

    /// Whether this is one of the crate's kinds ([`TierKind::ALL`]).
    pub fn is_builtin(self) -> bool {
        !matches!(self, TierKind::Custom(_))
    }
}

impl fmt::Display for TierKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for TierKind {
    type Err = ();
    /// Parses the name of one of the crate's kinds ([`TierKind::ALL`]); a
    /// custom kind's name is an error (its `&'static str` is the tier's).
    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        TierKind::ALL.into_iter().find(|k| k.name() == s).ok_or(())
    }
}

/// Whether a tier can take a call. `Unsupported` and `Unavailable` make
/// the chain skip the tier (a skip is not a failure).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    /// The tier takes these parameters.
    Yes,
    /// The tier does not implement these parameters (say, a dtype or a
    /// kernel size it has no code for).
    Unsupported(String),
    /// The tier cannot run at all here (no device, library not found,
    /// feature not compiled in).
    Unavailable(String),
}

/// One way of computing a conv3d. The chain asks [`support`](Self::support)
/// first and calls [`run`](Self::run) only on `Support::Yes`.
pub trait Conv3dTier: Send + Sync {
    /// Which kind of tier this is (what options force or forbid).
    fn kind(&self) -> TierKind;
    /// A name for reports and statistics (`"cpu"`, `"cudnn"`, ...).
    fn name(&self) -> &str;
    /// Whether this tier can take `problem`.
    fn support(&self, problem: &Conv3dProblem<'_>) -> Support;
    /// Computes `problem` into `out` (f32, `[N, K, OD, OH, OW]`, exactly
    /// the output's length). An error moves the chain to the next tier.
    fn run(&self, problem: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()>;
    /// Whether this tier can take the device call `ops`
    /// ([`Conv3dChain::run_device`](super::Conv3dChain::run_device)). The
    /// default asks [`support`](Self::support) with the operands' host
    /// copies ([`DeviceOperands::host_problem`], made once per call); the
    /// tiers of this crate answer from the geometry alone.
    fn support_device(&self, ops: &DeviceOperands<'_, '_>) -> Support {
        match ops.host_problem() {
            Ok(p) => self.support(&p),
            Err(e) => Support::Unavailable(format!("no host copy of the operands: {e}")),
        }
    }
    /// Computes the device call `ops` into device memory `out` (f32, the
    /// output's length) with its work on `ops.stream`, for
    /// [`Conv3dChain::run_device`](super::Conv3dChain::run_device). The
    /// default runs [`run`](Self::run) on the host copies of the operands
    /// ([`DeviceOperands::host_problem`]) and copies the output in (the CPU
    /// tier's way); the GPU tiers of `ops.stream`'s device read the
    /// operands in place and copy nothing.
    fn run_device(
        &self,
        ops: &DeviceOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        super::device_run::run_on_host_then_copy(self, ops, out)
    }
    /// Whether this tier can take the backward op `op` (a gradient or the
    /// transposed convolution, [`crate::conv3d::Conv3dBackwardProblem`])
    /// of the forward convolution `g`, on the host or on a device. The
    /// default: unsupported (a tier without backward ops is skipped).
    fn support_backward(&self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Support {
        let _ = (op, g);
        Support::Unsupported(format!("the {} tier has no backward ops", self.name()))
    }
    /// Computes the backward problem `p` into `out` (f32, the result's
    /// length). The default: an error (the chain calls it only on
    /// [`Support::Yes`] from [`support_backward`](Self::support_backward)).
    fn run_backward(&self, p: &Conv3dBackwardProblem<'_>, out: &mut [f32]) -> Result<()> {
        let _ = (p, out);
        Err(Error::Conv3dTier {
            tier: "backward",
            reason: "this tier has no backward ops",
        })
    }
    /// Computes the device backward call `ops` into device memory `out`
    /// (f32, the result's length) with its work on `ops.stream`. The
    /// default runs [`run_backward`](Self::run_backward) on host copies of
    /// the operands and copies the result in; the naive tier of
    /// `ops.stream`'s device reads them in place.
    fn run_backward_device(
        &self,
        ops: &DeviceBackwardOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        super::backward_chain::run_backward_on_host_then_copy(self, ops, out)
    }
}

/// The CPU tier as a [`Conv3dTier`]: every parameter set, always available.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuTier;

impl Conv3dTier for CpuTier {
    fn kind(&self) -> TierKind {
        TierKind::Cpu
    }
    fn name(&self) -> &str {
        "cpu"
    }
    fn support(&self, _: &Conv3dProblem<'_>) -> Support {
        Support::Yes
    }
    fn support_device(&self, _: &DeviceOperands<'_, '_>) -> Support {
        Support::Yes
    }
    fn run(&self, problem: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        conv3d_cpu(problem, out)
    }
    fn support_backward(&self, _: Conv3dBackwardOp, _: &Conv3dGeometry) -> Support {
        Support::Yes
    }
    fn run_backward(&self, p: &Conv3dBackwardProblem<'_>, out: &mut [f32]) -> Result<()> {
        conv3d_backward_cpu(p, out)
    }
}

/// A tier this build or machine does not have: always skipped, with the
/// reason in the report (say, "built without the `cuda` feature").
#[derive(Debug, Clone)]
pub struct UnavailableTier {
    /// The kind it stands for.
    pub kind: TierKind,
    /// Why it is not available.
    pub reason: String,
}

impl Conv3dTier for UnavailableTier {
    fn kind(&self) -> TierKind {
        self.kind
    }
    fn name(&self) -> &str {
        self.kind.name()
    }
    fn support(&self, _: &Conv3dProblem<'_>) -> Support {
        Support::Unavailable(self.reason.clone())
    }
    fn support_device(&self, _: &DeviceOperands<'_, '_>) -> Support {
        Support::Unavailable(self.reason.clone())
    }
    fn support_backward(&self, _: Conv3dBackwardOp, _: &Conv3dGeometry) -> Support {
        Support::Unavailable(self.reason.clone())
    }
    fn run(&self, _: &Conv3dProblem<'_>, _: &mut [f32]) -> Result<()> {
        Err(Error::Conv3dTier {
            tier: "unavailable",
            reason: "an unavailable tier was run",
        })
    }
}
