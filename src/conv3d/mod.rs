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
//! The GPU tiers ([`VendorTier`], [`TiledTier`], [`NaiveTier`]) belong to
//! one [`crate::device::Device`] and run through its backend, so
//! they work on HIP, CUDA, the host backend (the CPU standing in for a GPU,
//! which runs the whole GPU path in CI) and under
//! [`Faults`](crate::device::faults::Faults).
//! [`Conv3dChain::for_device`] builds the chain of one device;
//! [`Conv3dChain::new`] uses the first GPU this build and machine have
//! (HIP, then CUDA) and otherwise puts [`UnavailableTier`]s (saying why)
//! before the CPU tier.

mod chain;
mod cpu;
mod params;
mod reference;
mod tiers;

pub use chain::{
    sample_points, Attempt, Conv3dChain, Conv3dOptions, Conv3dReport, Conv3dTier, CpuTier, Failure,
    Outcome, Support, TierKind, TierStats, UnavailableTier,
};
pub use cpu::{conv3d_cpu, conv3d_cpu_with, release_cpu_scratch, CpuKernel};
pub use params::{Conv3dData, Conv3dGeometry, Conv3dParams, Conv3dProblem};
pub use reference::{reference, reference_point, RefPoint};
pub use tiers::{device_tiers, NaiveTier, TiledTier, VendorTier};

use std::sync::OnceLock;

use crate::device::{BackendKind, Device};

/// The first GPU device this build has and this machine shows (HIP, then
/// CUDA), or why there is none; opened once per process and shared, so
/// every [`Conv3dChain::new`] reuses its loaded kernels and vendor-library
/// handle and plans.
fn default_gpu() -> std::result::Result<Device, String> {
    static GPU: OnceLock<std::result::Result<Device, String>> = OnceLock::new();
    GPU.get_or_init(open_default_gpu).clone()
}

fn open_default_gpu() -> std::result::Result<Device, String> {
    let mut why = Vec::new();
    for kind in [BackendKind::Hip, BackendKind::Cuda] {
        if !kind.is_built() {
            continue;
        }
        match Device::open(kind, 0) {
            Ok(d) => return Ok(d),
            Err(e) => why.push(e.to_string()),
        }
    }
    if why.is_empty() {
        Err("this build has no gpu backend (built without the `hip` and `cuda` features)".into())
    } else {
        Err(format!("no gpu device ({})", why.join("; ")))
    }
}

/// The tiers of [`Conv3dChain::new`].
fn default_tiers() -> Vec<Box<dyn Conv3dTier>> {
    match default_gpu() {
        Ok(device) => device_tiers(&device),
        Err(reason) => unavailable_gpu_tiers(reason),
    }
}

/// A device's chain when its device is missing: the vendor, tiled and naive
/// tiers unavailable for `reason` (skipped, not failed), then the CPU tier.
pub(crate) fn unavailable_gpu_tiers(reason: String) -> Vec<Box<dyn Conv3dTier>> {
    let mut tiers: Vec<Box<dyn Conv3dTier>> = [TierKind::Vendor, TierKind::Tiled, TierKind::Naive]
        .into_iter()
        .map(|kind| {
            Box::new(UnavailableTier {
                kind,
                reason: reason.clone(),
            }) as Box<dyn Conv3dTier>
        })
        .collect();
    tiers.push(Box::new(CpuTier));
    tiers
}
