//! Fault injection into the verified moves, for the package's own tests
//! (feature `testing`; a release wheel has none of it): the failures of
//! the reported ROCm bugs, injected by `rocm_safe.torch._inject_move_faults`
//! under the device a move runs on (the crate's `Faults` backend).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use rocm_safe::device::faults::{FaultHandle, FaultKind, FaultPlan, FaultRule, Faults, When};
use rocm_safe::device::{raw::open_backend, Device};

use crate::interop::lock;

#[derive(Default)]
struct State {
    plan: Option<FaultPlan>,
    /// The faulted device of each device id, with its log.
    devices: HashMap<u64, (Device, FaultHandle)>,
}

fn state() -> &'static Mutex<State> {
    static S: OnceLock<Mutex<State>> = OnceLock::new();
    S.get_or_init(Default::default)
}

fn kind_named(name: &str) -> PyResult<FaultKind> {
    Ok(match name {
        "small_copy_lost" => FaultKind::SmallCopyLost,
        "copy_zeroed_range" => FaultKind::CopyZeroedRange,
        "download_truncated" => FaultKind::DownloadTruncated,
        "invalid_value_on_large_copy" => FaultKind::InvalidValueOnLargeCopy,
        "pinned_refused_sticky" => FaultKind::PinnedRefusedSticky,
        "convert_writes_zeros" => FaultKind::ConvertWritesZeros,
        "copy_lands_zeros" => FaultKind::CopyLandsZeros,
        "copy_lands_stale" => FaultKind::CopyLandsStale,
        "copy_lands_garbage" => FaultKind::CopyLandsGarbage,
        "invalid_value_on_copy" => FaultKind::InvalidValueOnCopy,
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown move fault {other:?}: small_copy_lost, copy_zeroed_range, \
                 download_truncated, invalid_value_on_large_copy, pinned_refused_sticky, \
                 convert_writes_zeros, copy_lands_zeros, copy_lands_stale, copy_lands_garbage \
                 or invalid_value_on_copy"
            )))
        }
    })
}

fn when_named(when: &str, n: u64) -> PyResult<When> {
    Ok(match when {
        "always" => When::Always,
        "nth" => When::Nth(n),
        "every" => When::EveryNth(n),
        other => {
            return Err(PyValueError::new_err(format!(
                "unknown fault schedule {other:?}: always, nth or every"
            )))
        }
    })
}

/// `inject_move_faults(rules, seed=0)`: from now on, moves run on their
/// device behind the crate's `Faults` backend with `rules`, a list of
/// `(kind, when, n)` (`when`: `"always"`, `"nth"` (the `n`-th operation
/// the kind applies to, 0-based) or `"every"` (every `n`-th)). An empty
/// list stops injecting. Each call starts fresh counts.
#[pyfunction]
#[pyo3(signature = (rules, seed=0))]
pub fn inject_move_faults(rules: Vec<(String, String, u64)>, seed: u64) -> PyResult<()> {
    let rules = rules
        .iter()
        .map(|(k, w, n)| {
            Ok(FaultRule {
                kind: kind_named(k)?,
                when: when_named(w, *n)?,
            })
        })
        .collect::<PyResult<Vec<_>>>()?;
    let mut st = lock(state());
    st.devices.clear();
    st.plan = (!rules.is_empty()).then_some(FaultPlan { seed, rules });
    drop(st);
    crate::moves::forget_movers();
    Ok(())
}

/// `move_faults_injected()`: the faults injected so far under the current
/// rules, as `(kind, operation, index)`.
#[pyfunction]
pub fn move_faults_injected() -> Vec<(String, &'static str, u64)> {
    lock(state())
        .devices
        .values()
        .flat_map(|(_, h)| h.injected())
        .map(|f| (format!("{:?}", f.kind), f.op, f.index))
        .collect()
}

/// The device a move on `dev` runs on while faults are injected: `dev`'s
/// runtime and ordinal behind `Faults` (made once per rules), else `None`.
pub(crate) fn faulted_move_device(dev: &Device) -> PyResult<Option<Device>> {
    let mut st = lock(state());
    let Some(plan) = st.plan.clone() else {
        return Ok(None);
    };
    if let Some((d, _)) = st.devices.get(&dev.id()) {
        return Ok(Some(d.clone()));
    }
    let info = dev.info();
    let inner = open_backend(info.kind, info.ordinal)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    let (f, h) = Faults::new(inner, plan);
    let d = Device::from_backend(Box::new(f));
    st.devices.insert(dev.id(), (d.clone(), h));
    Ok(Some(d))
}
