//! Failure injection for the package's own tests (feature `testing`; a
//! release wheel has none of it): conv3d tier kinds whose runs fail on
//! purpose, set by `rocm_safe.torch._inject_conv3d_failures(kinds)` or
//! `ROCM_SAFE_CONV3D_FAIL=vendor,tiled` at start-up.

use std::sync::{Mutex, OnceLock};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use rocm_safe::conv3d::{Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dGeometry};
use rocm_safe::conv3d_chain::{
    Conv3dTier, DeviceBackwardOperands, DeviceOperands, Support, TierKind,
};
use rocm_safe::device::DeviceViewMut;

use crate::interop::lock;

/// The tiers of a chain, each made injectable.
pub fn wrap(tiers: Vec<Box<dyn Conv3dTier>>) -> Vec<Box<dyn Conv3dTier>> {
    tiers
        .into_iter()
        .map(|t| Box::new(Injectable(t)) as Box<dyn Conv3dTier>)
        .collect()
}

/// Tier kinds whose runs fail on purpose (tests: a vendor library that
/// breaks), as a bit set of `TierKind::ALL` indices.
fn injected() -> &'static Mutex<u8> {
    static I: OnceLock<Mutex<u8>> = OnceLock::new();
    I.get_or_init(|| {
        // ROCM_SAFE_CONV3D_FAIL=vendor,tiled at start-up, as the keyword.
        let mask = std::env::var("ROCM_SAFE_CONV3D_FAIL")
            .map(|v| mask_of(v.split(',').map(str::trim)).unwrap_or(0))
            .unwrap_or(0);
        Mutex::new(mask)
    })
}

fn mask_of<'a>(kinds: impl IntoIterator<Item = &'a str>) -> Result<u8, String> {
    let mut m = 0u8;
    for k in kinds {
        if k.is_empty() {
            continue;
        }
        let i = TierKind::ALL
            .iter()
            .position(|t| t.name() == k)
            .ok_or_else(|| format!("unknown conv3d tier {k:?}: vendor, tiled, naive or cpu"))?;
        m |= 1 << i;
    }
    Ok(m)
}

fn is_injected(kind: TierKind) -> bool {
    // A kind outside `TierKind::ALL` (a custom tier) is never injected.
    TierKind::ALL
        .iter()
        .position(|t| *t == kind)
        .is_some_and(|i| *lock(injected()) & (1 << i) != 0)
}

/// A tier that fails on demand (tests), otherwise its inner tier.
struct Injectable(Box<dyn Conv3dTier>);

const INJECTED: &str = "failure injected for testing (rocm_safe.torch._inject_conv3d_failures)";

impl Conv3dTier for Injectable {
    fn kind(&self) -> TierKind {
        self.0.kind()
    }
    fn name(&self) -> &str {
        self.0.name()
    }
    fn support(&self, p: &rocm_safe::conv3d::Conv3dProblem<'_>) -> Support {
        if is_injected(self.kind()) {
            Support::Yes
        } else {
            self.0.support(p)
        }
    }
    fn run(
        &self,
        p: &rocm_safe::conv3d::Conv3dProblem<'_>,
        out: &mut [f32],
    ) -> rocm_safe::Result<()> {
        if is_injected(self.kind()) {
            return Err(rocm_safe::Error::Conv3dTier {
                tier: "injected",
                reason: INJECTED,
            });
        }
        self.0.run(p, out)
    }
    fn support_device(&self, ops: &DeviceOperands<'_, '_>) -> Support {
        if is_injected(self.kind()) {
            Support::Yes
        } else {
            self.0.support_device(ops)
        }
    }
    fn run_device(
        &self,
        ops: &DeviceOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> rocm_safe::Result<()> {
        if is_injected(self.kind()) {
            return Err(rocm_safe::Error::Conv3dTier {
                tier: "injected",
                reason: INJECTED,
            });
        }
        self.0.run_device(ops, out)
    }
    fn support_backward(&self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Support {
        if is_injected(self.kind()) {
            Support::Yes
        } else {
            self.0.support_backward(op, g)
        }
    }
    fn run_backward(
        &self,
        p: &Conv3dBackwardProblem<'_>,
        out: &mut [f32],
    ) -> rocm_safe::Result<()> {
        if is_injected(self.kind()) {
            return Err(rocm_safe::Error::Conv3dTier {
                tier: "injected",
                reason: INJECTED,
            });
        }
        self.0.run_backward(p, out)
    }
    fn run_backward_device(
        &self,
        ops: &DeviceBackwardOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> rocm_safe::Result<()> {
        if is_injected(self.kind()) {
            return Err(rocm_safe::Error::Conv3dTier {
                tier: "injected",
                reason: INJECTED,
            });
        }
        self.0.run_backward_device(ops, out)
    }
}

/// `_inject_conv3d_failures(kinds)`: makes the runs of these tier kinds
/// (`"vendor"`, `"tiled"`, `"naive"`, `"cpu"`) fail from now on (an empty
/// list stops it); returns the previous list. For tests.
#[pyfunction]
pub fn inject_conv3d_failures(kinds: Vec<String>) -> PyResult<Vec<&'static str>> {
    let m = mask_of(kinds.iter().map(String::as_str)).map_err(PyValueError::new_err)?;
    let mut g = lock(injected());
    let prev = *g;
    *g = m;
    Ok(TierKind::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| prev & (1 << i) != 0)
        .map(|(_, k)| k.name())
        .collect())
}
