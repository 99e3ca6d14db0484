//! The guarded conv3d on tensors handed over by DLPack capsules: torch's
//! own conv3d output checked on the device and, where wrong, rewritten in
//! place by the tiled kernel, with no host wait (`Conv3dGuard`). One guard
//! per device, made once; the verdicts come back as records.

use std::sync::{Arc, Mutex, OnceLock};

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use rocm_safe::conv3d_chain::{Conv3dGuard, GuardRecord, Guarded, GuardedOutput};
use rocm_safe::device::{raw::GuardVerdict, Device};
use rocm_safe::DType;

use crate::conv3d::{chain_of, operands_of, params, Call};
use crate::errors::op_to_py;
use crate::interop::{device_of, lock};

type Guards = Mutex<Vec<(Device, Arc<Conv3dGuard>)>>;

/// The guard of each device (its buffers and verdict ring). Per process,
/// as the chains are (`conv3d.rs`).
fn guards() -> &'static Guards {
    static G: OnceLock<Guards> = OnceLock::new();
    G.get_or_init(Default::default)
}

fn guard_of(dev: &Device) -> Arc<Conv3dGuard> {
    let mut v = lock(guards());
    if let Some((_, g)) = v.iter().find(|(d, _)| d.same(dev)) {
        return g.clone();
    }
    let g = Arc::new(Conv3dGuard::new(dev));
    v.push((dev.clone(), g.clone()));
    g
}

/// One record as Python gets it: `(ticket, output_failed, non_finite,
/// operands_finite, mismatch, repaired, repair_failed, repair_problem)`;
/// `mismatch` and `repair_problem` are texts or `None`.
pub type PyRecord = (
    u64,
    bool,
    bool,
    bool,
    Option<String>,
    bool,
    bool,
    Option<String>,
);

fn describe(v: &GuardVerdict) -> Option<String> {
    if let Some((i, value, reference, tol)) = v.off {
        return Some(format!(
            "value {value} at output index {i} differs from the f64 reference {reference} \
             by more than {tol:e}"
        ));
    }
    v.non_finite
        .then(|| "a NaN or infinity in the output".to_string())
}

fn to_py(r: &GuardRecord) -> PyRecord {
    (
        r.ticket,
        r.output_failed(),
        r.output.non_finite,
        r.operands_finite,
        describe(&r.output),
        r.repaired,
        r.repair_failed(),
        describe(&r.repair),
    )
}

/// `conv3d_guard(device, stream, input, weight, bias, out, stride,
/// padding, dilation, groups, backend=None, points=False, rel_tol=None)`:
/// queues on `stream` (torch's current stream) the check of `out` (torch's
/// conv3d output, float32 or bfloat16 as the input) and its repair behind
/// a device-side gate. Returns `(ticket, records)`: the call's ticket, or
/// `None` when the tiled kernel cannot take the call (then nothing was
/// queued: check it synchronously), and the records of earlier calls
/// collected meanwhile (see `PyRecord`). `points`: also recompute the
/// chain's sampled points in f64 (else the NaN/Inf count alone), within
/// `rel_tol` (when the output was computed at a lower precision, TF32) or
/// the chain's tolerance for the dtype.
/// Errors: `TypeError` / `ValueError` for what the chain does not take,
/// `RuntimeError` for a launch or allocation failure.
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, dilation, groups, backend=None, points=false, rel_tol=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv3d_guard(
    py: Python<'_>,
    device: &str,
    stream: u64,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    stride: [usize; 3],
    padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
    points: bool,
    rel_tol: Option<f64>,
) -> PyResult<(Option<u64>, Vec<PyRecord>)> {
    let call = Call::take("conv3d", device, backend, (input, weight, bias, out))?;
    // The work queued on `s` outlives this call (nothing waits for it): it
    // reads the operands and writes `out` on torch's current stream, the
    // stream torch orders those tensors' memory by (its caching allocator
    // hands freed memory out again in stream order), so it is done with
    // them before that memory is reused.
    let s = call.stream(stream)?;
    let params = params(stride, padding, dilation, groups);
    let chain = chain_of(&call.dev);
    let guard = guard_of(&call.dev);
    let Call { x, w, b, mut y, .. } = call;
    let (xd, wd, bd, xs, ws) = operands_of(&x, &w, b.as_ref(), "conv3d")?;
    let samples = if points {
        chain.options().verify_samples
    } else {
        0
    };
    let rel_tol = rel_tol.unwrap_or(match xd.dtype() {
        DType::BF16 => chain.options().rel_tol_bf16,
        _ => chain.options().rel_tol_f32,
    });
    let map = |e: rocm_safe::Error| PyValueError::new_err(format!("conv3d output: {e}"));
    let out = match y.dtype() {
        DType::F32 => GuardedOutput::F32(y.view_mut().map_err(map)?),
        DType::BF16 => GuardedOutput::BF16(y.view_mut().map_err(map)?),
        d => {
            return Err(PyTypeError::new_err(format!(
                "conv3d output: dtype {} is not guarded (float32 and bfloat16)",
                d.name()
            )))
        }
    };
    let r = py.detach(|| {
        guard.guard(
            &chain,
            &s,
            params,
            (xd, &xs),
            (wd, &ws),
            bd,
            out,
            (samples, rel_tol),
        )
    });
    match r {
        Ok(Guarded::Queued { ticket, records }) => {
            Ok((Some(ticket), records.iter().map(to_py).collect()))
        }
        Ok(_) => Ok((None, Vec::new())),
        Err(e) => Err(op_to_py("conv3d_guard", e)),
    }
}

/// `conv3d_guard_harvest(device, backend=None)`: every record of `device`'s
/// guard not yet returned, oldest first (waits for the device work queued
/// before them). `[]` for a device never guarded.
#[pyfunction]
#[pyo3(signature = (device, backend=None))]
pub fn conv3d_guard_harvest(
    py: Python<'_>,
    device: &str,
    backend: Option<&str>,
) -> PyResult<Vec<PyRecord>> {
    let dev = device_of(device, backend)?;
    let known = lock(guards())
        .iter()
        .find(|(d, _)| d.same(&dev))
        .map(|(_, g)| g.clone());
    let Some(guard) = known else {
        return Ok(Vec::new());
    };
    let r = py.detach(|| guard.harvest());
    match r {
        Ok(records) => Ok(records.iter().map(to_py).collect()),
        Err(e) => Err(op_to_py("conv3d_guard_harvest", e)),
    }
}
