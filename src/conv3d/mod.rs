//! 3-D convolution with an explicit fallback chain (DESIGN.md, "Conv3d
//! chain"): vendor library -> tiled GPU kernel -> naive GPU kernel -> CPU.
//!
//! - [`Conv3dProblem::new`] validates shapes and parameters (NCDHW, stride,
//!   padding, dilation, groups, optional bias; f32 or bf16 inputs) into a
//!   [`Conv3dGeometry`], with typed errors.
//! - [`Conv3dChain`] tries its [`Conv3dTier`]s in order. A tier that does
//!   not support the call is skipped (not failed); a tier's result is
//!   checked by a NaN/Inf scan and by recomputing sampled output points on
//!   the CPU in f64 ([`reference_point`]); an error or a failed check moves
//!   on to the next tier. [`Conv3dOptions`] force or forbid tiers.
//! - Each call returns a [`Conv3dReport`] (which tier served, what failed
//!   before it); [`Conv3dChain::stats`] counts attempts, successes,
//!   failures by kind and time per tier.
//! - Every tier accumulates in f32; bf16 inputs are widened exactly.
//!
//! With the `cuda` feature the GPU tiers are `cuda::CudnnTier`,
//! `cuda::CudaTiledTier` and `cuda::CudaNaiveTier` on device 0 (each
//! skipped as unavailable where its library or device is missing). In a
//! build without it (default, or `hip` alone for now) the GPU tiers are
//! [`UnavailableTier`]s and every call is served by [`CpuTier`].

mod chain;
mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
mod params;
mod reference;

pub use chain::{
    sample_points, Attempt, Conv3dChain, Conv3dOptions, Conv3dReport, Conv3dTier, CpuTier, Failure,
    Outcome, Support, TierKind, TierStats, UnavailableTier,
};
pub use cpu::{conv3d_cpu, conv3d_cpu_with, release_cpu_scratch, CpuKernel};
pub use params::{Conv3dData, Conv3dGeometry, Conv3dParams, Conv3dProblem};
pub use reference::{reference, reference_point, RefPoint};

/// The tiers of [`Conv3dChain::new`] in this build.
#[cfg(feature = "cuda")]
fn default_tiers() -> Vec<Box<dyn Conv3dTier>> {
    let mut tiers = cuda::tiers();
    tiers.push(Box::new(CpuTier));
    tiers
}

/// The tiers of [`Conv3dChain::new`] in this build.
#[cfg(not(feature = "cuda"))]
fn default_tiers() -> Vec<Box<dyn Conv3dTier>> {
    let missing = if cfg!(feature = "hip") {
        "the conv3d gpu tiers are not built for hip yet (MIOpen is not bound and \
         conv3d.hip is not in the hip code objects)"
    } else {
        "this build has no gpu backend (built without the `hip` and `cuda` features)"
    };
    vec![
        Box::new(UnavailableTier {
            kind: TierKind::Vendor,
            reason: missing.to_owned(),
        }),
        Box::new(UnavailableTier {
            kind: TierKind::Tiled,
            reason: missing.to_owned(),
        }),
        Box::new(UnavailableTier {
            kind: TierKind::Naive,
            reason: missing.to_owned(),
        }),
        Box::new(CpuTier),
    ]
}
