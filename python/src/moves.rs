//! Verified moves of tensors PyTorch already holds (`rocm_safe.torch`'s
//! `to_device`, `to_cpu`, `cast`, `module_to`): the natives over
//! [`rocm_safe::moves::Mover`], one mover per device, kept for the
//! process (its pinned staging is reused between calls).
//!
//! Host memory arrives as objects with the buffer protocol (a contiguous
//! `uint8` numpy view of a CPU tensor's bytes), device memory as DLPack
//! capsules. Device work runs on PyTorch's current stream, borrowed, and
//! is complete when a call returns.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use rocm_safe::device::{raw::RawStream, BackendKind, Device, Stream};
use rocm_safe::dlpack::Imported;
use rocm_safe::moves::{MoveOptions, MoveReport, Mover};
use rocm_safe::DType;

use crate::errors::op_to_py;
use crate::interop::{device_of, lock, take_capsule};

type Movers = Mutex<HashMap<(u64, bool), Arc<Mutex<Mover>>>>;

fn movers() -> &'static Movers {
    static M: OnceLock<Movers> = OnceLock::new();
    M.get_or_init(Default::default)
}

/// The device moves on `device` run on: the process's device, or with the
/// `testing` feature and faults injected, the same device behind them.
fn move_device(device: &str, backend: Option<&str>) -> PyResult<Device> {
    let dev = device_of(device, backend)?;
    #[cfg(feature = "testing")]
    if let Some(d) = crate::inject_moves::faulted_move_device(&dev)? {
        return Ok(d);
    }
    Ok(dev)
}

fn mover_of(dev: &Device, verify: bool) -> PyResult<Arc<Mutex<Mover>>> {
    let mut m = lock(movers());
    if let Some(x) = m.get(&(dev.id(), verify)) {
        return Ok(x.clone());
    }
    let opts = MoveOptions::default().with_verify(verify);
    let mover = Mover::new(dev, opts).map_err(|e| op_to_py("move", e))?;
    let x = Arc::new(Mutex::new(mover));
    m.insert((dev.id(), verify), x.clone());
    Ok(x)
}

/// Forgets every mover (their staging is freed): after faults change, and
/// by `release_memory`.
pub(crate) fn forget_movers() {
    lock(movers()).clear();
}

/// The stream of a move: a stream of the host backend, or PyTorch's
/// current stream of the device, borrowed.
fn move_stream(dev: &Device, raw: u64) -> PyResult<Stream> {
    if dev.kind() == BackendKind::Host {
        dev.stream()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    } else {
        // SAFETY: `raw` is PyTorch's current stream of this device (the
        // caller's contract, `_moves.py`), alive for the call; the
        // `Stream` is dropped before the call returns and never destroyed
        // by rocm-safe.
        Ok(unsafe { Stream::from_raw(dev, RawStream(raw)) })
    }
}

fn dtype_named(name: &str) -> PyResult<DType> {
    name.parse::<DType>()
        .map_err(|_| PyValueError::new_err(format!("unknown dtype {name:?}")))
}

/// The bytes of a CPU tensor imported on the host backend (whose "device
/// memory" is host memory). Callers (the moves, the distributed load's
/// fingerprints) pass tensors nothing writes while the call runs.
pub(crate) fn host_bytes<'i>(imp: &'i Imported, what: &str) -> PyResult<&'i [u8]> {
    let v = imp
        .view::<u8>()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
    let n = v.num_bytes();
    if n == 0 {
        return Ok(&[]);
    }
    // SAFETY: `imp` was imported on the host backend, so its address is
    // host memory: `n` bytes of a CPU tensor that the managed tensor owned
    // by `imp` keeps alive while the returned slice (which borrows `imp`)
    // lives. The Python callers (`_moves.py`, `_distributed.py`) pass
    // contiguous tensors that nothing writes while the call runs.
    Ok(unsafe { std::slice::from_raw_parts(v.device_ptr().0 as usize as *const u8, n) })
}

/// The writable bytes of a CPU tensor imported on the host backend.
fn host_bytes_mut<'i>(imp: &'i mut Imported, what: &str) -> PyResult<&'i mut [u8]> {
    let v = imp
        .view_mut::<u8>()
        .map_err(|e| PyValueError::new_err(format!("{what}: {e}")))?;
    let (p, n) = (v.device_ptr().0 as usize as *mut u8, v.num_bytes());
    if n == 0 {
        return Ok(&mut []);
    }
    // SAFETY: as in `host_bytes`, borrowed mutably through `imp` (whose
    // `view_mut` refuses read-only imports); the destination is a new
    // tensor of `_moves.py`'s that nothing else reads or writes until the
    // call returns.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n) })
}

/// The CPU tensors of `objs` (DLPack capsules), imported on the host.
fn host_imports(objs: &[Bound<'_, PyAny>], what: &str) -> PyResult<Vec<Imported>> {
    let host = device_of("cpu", None)?;
    objs.iter().map(|o| take_capsule(&host, o, what)).collect()
}

/// What every move needs: the device (behind the faults, when injected),
/// the stream and the device's mover.
struct MoveCall {
    dev: Device,
    stream: Stream,
    mover: Arc<Mutex<Mover>>,
}

impl MoveCall {
    fn open(device: &str, backend: Option<&str>, stream: u64, verify: bool) -> PyResult<MoveCall> {
        let dev = move_device(device, backend)?;
        let stream = move_stream(&dev, stream)?;
        let mover = mover_of(&dev, verify)?;
        Ok(MoveCall { dev, stream, mover })
    }
}

/// A report as a dict: `kind`, `bytes`, `pieces`, `rung`, `check`,
/// `attempts` (a list of `(rung, failure)`), `seconds`, `text`.
fn report_dict<'py>(py: Python<'py>, r: &MoveReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", r.kind.name())?;
    d.set_item("bytes", r.bytes)?;
    d.set_item("pieces", r.pieces)?;
    d.set_item("rung", r.rung.name())?;
    d.set_item("check", r.check.name())?;
    let a = PyList::empty(py);
    for at in &r.attempts {
        a.append((at.step.name(), at.failure.to_string()))?;
    }
    d.set_item("attempts", a)?;
    d.set_item("seconds", r.elapsed.as_secs_f64())?;
    d.set_item("text", r.to_string())?;
    Ok(d)
}

/// `move_upload(device, stream, srcs, offsets, dst, verify=True,
/// backend=None)`: the CPU tensors `srcs` (DLPack capsules, contiguous)
/// into the device tensor `dst` (a DLPack capsule of `uint8`) at byte
/// `offsets`, as one packed span (the bytes between them zeroed), checked;
/// a ladder of rungs on failure. Returns the report dict. Errors:
/// `ValueError` for what does not fit, `RuntimeError` (with every rung's
/// failure) when no rung served.
#[pyfunction]
#[pyo3(signature = (device, stream, srcs, offsets, dst, verify=true, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn move_upload<'py>(
    py: Python<'py>,
    device: &str,
    stream: u64,
    srcs: Vec<Bound<'py, PyAny>>,
    offsets: Vec<usize>,
    dst: &Bound<'py, PyAny>,
    verify: bool,
    backend: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let MoveCall {
        dev,
        stream: s,
        mover,
    } = MoveCall::open(device, backend, stream, verify)?;
    let mut out = take_capsule(&dev, dst, "move_upload dst")?;
    let imports = host_imports(&srcs, "move_upload src")?;
    let slices = imports
        .iter()
        .map(|i| host_bytes(i, "move_upload src"))
        .collect::<PyResult<Vec<&[u8]>>>()?;
    let mut view = out
        .view_mut::<u8>()
        .map_err(|e| PyValueError::new_err(format!("move_upload dst: {e}")))?;
    let r = py.detach(|| lock(&mover).upload_packed(&s, &slices, &offsets, &mut view));
    match r {
        Ok(r) => report_dict(py, &r),
        Err(e) => Err(op_to_py("move_upload", e)),
    }
}

/// `move_download(device, stream, src, from_dtype, dst, to_dtype,
/// verify=True, backend=None)`: the device tensor `src` (a DLPack
/// capsule, elements of `from_dtype`, a safetensors dtype name) into the
/// CPU tensor `dst` (a capsule; elements of `to_dtype`, converted exactly
/// on the CPU as the bytes arrive), checked. Returns the report dict.
#[pyfunction]
#[pyo3(signature = (device, stream, src, from_dtype, dst, to_dtype, verify=true, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn move_download<'py>(
    py: Python<'py>,
    device: &str,
    stream: u64,
    src: &Bound<'py, PyAny>,
    from_dtype: &str,
    dst: &Bound<'py, PyAny>,
    to_dtype: &str,
    verify: bool,
    backend: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let (from, to) = (dtype_named(from_dtype)?, dtype_named(to_dtype)?);
    let MoveCall {
        dev,
        stream: s,
        mover,
    } = MoveCall::open(device, backend, stream, verify)?;
    let input = take_capsule(&dev, src, "move_download src")?;
    let mut host = host_imports(std::slice::from_ref(dst), "move_download dst")?;
    let out = match host.first_mut() {
        Some(h) => host_bytes_mut(h, "move_download dst")?,
        None => return Err(PyValueError::new_err("move_download dst: missing")),
    };
    let view = input
        .view::<u8>()
        .map_err(|e| PyValueError::new_err(format!("move_download src: {e}")))?;
    let r = py.detach(|| lock(&mover).download_into(&s, &view, from, out, to));
    match r {
        Ok(r) => report_dict(py, &r),
        Err(e) => Err(op_to_py("move_download", e)),
    }
}

/// `move_cast(device, stream, src, from_dtype, dst, to_dtype, verify=True,
/// backend=None)`: converts the device tensor `src` into the device tensor
/// `dst` (capsules; safetensors dtype names), checked (a widening exactly,
/// a narrowing at samples), through the host when the device kernel is
/// missing or fails its check. Returns the report dict.
#[pyfunction]
#[pyo3(signature = (device, stream, src, from_dtype, dst, to_dtype, verify=true, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn move_cast<'py>(
    py: Python<'py>,
    device: &str,
    stream: u64,
    src: &Bound<'py, PyAny>,
    from_dtype: &str,
    dst: &Bound<'py, PyAny>,
    to_dtype: &str,
    verify: bool,
    backend: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let (from, to) = (dtype_named(from_dtype)?, dtype_named(to_dtype)?);
    let MoveCall {
        dev,
        stream: s,
        mover,
    } = MoveCall::open(device, backend, stream, verify)?;
    let input = take_capsule(&dev, src, "move_cast src")?;
    let mut output = take_capsule(&dev, dst, "move_cast dst")?;
    let sv = input
        .view::<u8>()
        .map_err(|e| PyValueError::new_err(format!("move_cast src: {e}")))?;
    let mut dv = output
        .view_mut::<u8>()
        .map_err(|e| PyValueError::new_err(format!("move_cast dst: {e}")))?;
    let r = py.detach(|| lock(&mover).cast(&s, &sv, from, &mut dv, to));
    match r {
        Ok(r) => report_dict(py, &r),
        Err(e) => Err(op_to_py("move_cast", e)),
    }
}
