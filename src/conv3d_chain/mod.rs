//! The conv3d chain: vendor -> tiled GPU -> naive GPU -> CPU, with checks and reports.
//!
//! The conv3d chain: a 3-D convolution with an explicit fallback chain
//! (crate [contract 3](crate#contracts)): vendor library -> tiled GPU
//! kernel -> naive GPU kernel -> CPU.
//!
//! This layer sits above [`device`](crate::device) and below
//! `diagnostics` (feature `doctor`); the problem it solves (parameters,
//! geometry, the f64 reference, the CPU kernel) is [`crate::conv3d`], below
//! the device layer.
//!
//! - [`Conv3dChain`] tries its [`Conv3dTier`]s in order. A tier that does
//!   not support the call is skipped (not failed); a tier's result is
//!   checked by a NaN/Inf scan and by recomputing sampled output points on
//!   the CPU in f64 ([`reference_point`](crate::conv3d::reference_point));
//!   an error or a failed check moves on to the next tier.
//!   [`Conv3dOptions`] force or forbid tiers.
//! - [`Conv3dChain::run_device`] runs the same chain on operands and an
//!   output in device memory (tensors borrowed from another framework), on
//!   the caller's stream: the device's GPU tiers read and write them in
//!   place ([`Conv3dTier::run_device`]), the others compute on the host
//!   and copy the output in; the checks run on the device output.
//! - Each call returns a [`Conv3dReport`] (one [`TierAttempt`] per tier:
//!   served, skipped or failed, in the vocabulary of
//!   [`crate::fallback`]); [`Conv3dChain::stats`] counts attempts,
//!   successes, failures by kind and time per tier.
//! - Every tier accumulates in f32; bf16 inputs are widened exactly.
//!
//! The GPU tiers ([`VendorTier`], [`TiledTier`], [`NaiveTier`]) belong to
//! one [`Device`] and run through its backend, so they work on HIP, CUDA,
//! the host backend (the CPU standing in for a GPU, which runs the whole
//! GPU path in CI) and under `device::faults::Faults` (feature `testing`).
//! [`Conv3dChain::for_device`] builds the chain of one device;
//! [`Conv3dChain::first_gpu`] uses the first GPU this build and machine have
//! (HIP, then CUDA) and otherwise puts [`UnavailableTier`]s (saying why)
//! before the CPU tier.
//!
//! - The backward ops (`backward_chain.rs`): the gradients of a conv3d and the
//!   transposed convolution ([`Conv3dChain::run_backward`],
//!   [`Conv3dChain::backward_device`], [`Conv3dChain::backward_bias_device`],
//!   [`Conv3dChain::conv_transpose3d_device`]) through the tiers that take
//!   them ([`Conv3dTier::support_backward`]: the vendor library's backward
//!   calls for the data and weight gradients, the tiled GPU kernels for the
//!   input gradient, the naive GPU kernels, the CPU), with the same checks
//!   and reports.
//! - A guard over another library's output ([`Conv3dGuard`]): checked on
//!   the device and, where wrong, rewritten by the tiled kernel behind a
//!   device-side gate, with no host wait; the verdicts come back later.
//!

mod backward_chain;
mod chain;
mod device_run;
mod device_tiers;
mod guard;
mod report;
mod tier;
mod tiled_wgrad;

pub use backward_chain::{BackwardInputs, DeviceBackwardOperands};
pub use chain::{Conv3dChain, Conv3dOptions};
pub use device_run::{DeviceConv3dData, DeviceOperands};
pub use device_tiers::{device_tiers, NaiveTier, TiledTier, VendorTier, TILED_MAX_STRIDE_PRODUCT};
pub use guard::{Conv3dGuard, GuardOperand, GuardRecord, Guarded, GuardedOutput, GUARD_SLOTS};
pub use report::{Conv3dReport, TierAttempt, TierStats};
pub use tier::{Conv3dTier, CpuTier, Support, TierKind, UnavailableTier};

use std::sync::Mutex;

use crate::device::{BackendKind, Device, WeakDevice};

/// The first GPU device this build has and this machine shows (HIP, then
/// CUDA), or why there is none. While a chain made by
/// [`Conv3dChain::first_gpu`] holds it, later ones share it (its loaded
/// kernels, vendor-library handle and plans); once the last is dropped, the
/// device closes and the next call opens it again. Only a weak handle is
/// kept here, so no device outlives the chains that use it.
fn default_gpu() -> std::result::Result<Device, String> {
    static GPU: Mutex<WeakDevice> = Mutex::new(WeakDevice::new());
    let mut weak = match GPU.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    if let Some(d) = weak.upgrade() {
        return Ok(d);
    }
    let d = open_default_gpu()?;
    *weak = d.downgrade();
    Ok(d)
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

/// The tiers of [`Conv3dChain::first_gpu`].
pub(crate) fn default_tiers() -> Vec<Box<dyn Conv3dTier>> {
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
