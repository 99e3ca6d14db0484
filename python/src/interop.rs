//! The GPU half: devices, DLPack capsules both ways, the verified load onto
//! a GPU, and the conv3d chain on tensors borrowed from PyTorch.
//!
//! # Capsules
//!
//! Out ([`capsule_from_managed`]): a PyCapsule named `"dltensor"` holding a
//! `*mut DLManagedTensor` that rocm-safe made
//! ([`rocm_safe::dlpack::Export`]). A consumer (`torch.from_dlpack`) takes
//! the pointer over and renames the capsule `"used_dltensor"`; the
//! capsule's destructor calls the managed tensor's deleter only while the
//! capsule still has its first name (never consumed), so the deleter runs
//! exactly once either way. The deleter gives the memory back to rocm-safe,
//! which frees it at the device's next sync point.
//!
//! In ([`take_capsule`]): a `"dltensor"` capsule from
//! `torch.utils.dlpack.to_dlpack`, renamed `"used_dltensor"` here before
//! its pointer moves into [`Imported`], which calls the producer's deleter
//! once when dropped.
//!
//! # Streams
//!
//! The loader orders its own streams and waits for them before it returns
//! (and [`Export::from_device`] waits for the buffer's stream), so loaded
//! tensors are complete before PyTorch sees them: any stream may read them
//! with no further ordering. The conv3d chain runs on PyTorch's current
//! stream, borrowed ([`Stream::from_raw`]); its output is complete when the
//! call returns.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use rocm_safe::device::{BackendKind, Device};
use rocm_safe::dlpack::{ffi::DLManagedTensor, Export, Imported, Managed};
use rocm_safe::transfer::{LoadOptions, Loader, Request};
use rocm_safe::verify::Policy;
use rocm_safe::DType;

use crate::{to_py, Checkpoint};

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
const USED_DLTENSOR_VERSIONED: &CStr = c"used_dltensor_versioned";

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere while it was held; the
    // maps inside stay valid.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------- devices

/// The device of `device` (`"cpu"`: the host backend, whose "device
/// memory" is host memory; `"cuda:N"`: the GPU backend `hint` names, else the one chosen at import:
/// [`crate::backend::gpu_backend`]),
/// opened once per process and shared, so that every buffer, import and
/// chain of one GPU is of one [`Device`]. Per process on purpose: Python
/// names devices by string (`"cuda:0"`) as torch does, and one handle per
/// GPU keeps its self-test, loaded kernels and vendor handles for the
/// process, as torch keeps its CUDA context.
pub fn device_of(device: &str, hint: Option<&str>) -> PyResult<Device> {
    static DEVICES: OnceLock<Mutex<HashMap<(BackendKind, usize), Device>>> = OnceLock::new();
    let (kind, ordinal) = match crate::parse_device(device).map_err(PyValueError::new_err)? {
        crate::Target::Cpu => (BackendKind::Host, 0),
        crate::Target::Gpu { ordinal } => (crate::backend::gpu_backend(hint)?, ordinal),
    };
    let mut map = lock(DEVICES.get_or_init(Default::default));
    if let Some(d) = map.get(&(kind, ordinal)) {
        return Ok(d.clone());
    }
    let d = match kind {
        BackendKind::Host => Device::host(),
        k => Device::open(k, ordinal).map_err(|e| PyRuntimeError::new_err(e.to_string()))?,
    };
    map.insert((kind, ordinal), d.clone());
    Ok(d)
}

/// `device_owned_bytes(device, backend=None)`: bytes of device memory
/// rocm-safe owns on `device` (its own buffers, and memory PyTorch gave
/// back through DLPack deleters until the next sync point frees it);
/// memory lent to PyTorch is not counted.
#[pyfunction]
#[pyo3(signature = (device, backend=None))]
pub fn device_owned_bytes(device: &str, backend: Option<&str>) -> PyResult<u64> {
    Ok(device_of(device, backend)?.owned_bytes())
}

/// `device_synchronize(device, backend=None)`: waits for the device and
/// frees the memory of tensors PyTorch released since the last sync point
/// (also drops the cached loader's staging memory when `release` is set).
#[pyfunction]
#[pyo3(signature = (device, backend=None, release=false))]
pub fn device_synchronize(
    py: Python<'_>,
    device: &str,
    backend: Option<&str>,
    release: bool,
) -> PyResult<()> {
    let dev = device_of(device, backend)?;
    if release {
        lock(loaders()).retain(|k, _| k.0 != dev.id());
        crate::moves::forget_movers();
    }
    py.detach(|| dev.synchronize())
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

// ---------------------------------------------------------------- capsules

/// The destructor of the capsules made here: runs the managed tensor's
/// deleter only when the capsule was never consumed (still named
/// `"dltensor"`). Never unwinds, never raises: it only calls the CPython
/// capsule API with the right name (which sets no error) and the deleter
/// (which catches panics inside; see `rocm_safe::dlpack`).
unsafe extern "C" fn capsule_destructor(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the capsule being destroyed, a valid
    // object. `PyCapsule_IsValid` only reads its name; when it is still
    // "dltensor" nobody took the pointer (a consumer renames it first), so
    // this is the only owner of the `DLManagedTensor` it holds: one made by
    // `Managed::into_raw`, whose deleter frees it and may be called once
    // from any thread. The pointer is then not used again.
    unsafe {
        if ffi::PyCapsule_IsValid(capsule, DLTENSOR.as_ptr()) != 1 {
            return;
        }
        let ptr = ffi::PyCapsule_GetPointer(capsule, DLTENSOR.as_ptr()).cast::<DLManagedTensor>();
        if ptr.is_null() {
            return;
        }
        if let Some(deleter) = (*ptr).deleter {
            deleter(ptr);
        }
    }
}

/// A `"dltensor"` capsule owning `managed` (see the module docs).
pub fn capsule_from_managed(
    py: Python<'_>,
    managed: Managed<DLManagedTensor>,
) -> PyResult<Py<PyAny>> {
    let raw = managed.into_raw();
    // SAFETY: `raw` is a valid managed tensor we own; the capsule takes it
    // over with a destructor that deletes it unless a consumer took it. The
    // name is a static C string, as the capsule keeps a pointer to it.
    let cap =
        unsafe { ffi::PyCapsule_New(raw.cast(), DLTENSOR.as_ptr(), Some(capsule_destructor)) };
    if cap.is_null() {
        // SAFETY: no capsule was made, so `raw` is still ours alone: delete
        // it once here.
        unsafe {
            if let Some(deleter) = (*raw).deleter {
                deleter(raw);
            }
        }
        return Err(
            PyErr::take(py).unwrap_or_else(|| PyRuntimeError::new_err("PyCapsule_New failed"))
        );
    }
    // SAFETY: `cap` is a new reference just returned by PyCapsule_New.
    Ok(unsafe { Bound::from_owned_ptr(py, cap) }.unbind())
}

/// Takes the managed tensor out of a DLPack capsule (a producer's: from
/// `torch.utils.dlpack.to_dlpack`, `"dltensor"`, or a versioned
/// `"dltensor_versioned"`) and imports it on `device`: the capsule is
/// renamed `"used_dltensor"` / `"used_dltensor_versioned"` first, so its
/// destructor leaves the tensor alone; from then on [`Imported`] owns it
/// (and calls its deleter once, also when the import is refused).
pub fn take_capsule(device: &Device, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Imported> {
    let p = obj.as_ptr();
    // SAFETY: `p` is a live object (borrowed through `obj`); IsValid checks
    // its type and name without setting an error.
    let is = |n: &CStr| unsafe { ffi::PyCapsule_IsValid(p, n.as_ptr()) } == 1;
    let (name, used, versioned) = if is(DLTENSOR) {
        (DLTENSOR, USED_DLTENSOR, false)
    } else if is(DLTENSOR_VERSIONED) {
        (DLTENSOR_VERSIONED, USED_DLTENSOR_VERSIONED, true)
    } else {
        return Err(PyTypeError::new_err(format!(
            "{what}: expected an unused DLPack capsule named \"dltensor\" or \"dltensor_versioned\" \
             (torch.utils.dlpack.to_dlpack(tensor))"
        )));
    };
    // SAFETY: a valid capsule of that name (checked above).
    let ptr = unsafe { ffi::PyCapsule_GetPointer(p, name.as_ptr()) };
    if ptr.is_null() {
        return Err(PyErr::take(obj.py())
            .unwrap_or_else(|| PyValueError::new_err(format!("{what}: empty DLPack capsule"))));
    }
    // SAFETY: renaming a valid capsule; the name is a static C string.
    if unsafe { ffi::PyCapsule_SetName(p, used.as_ptr()) } != 0 {
        return Err(PyErr::take(obj.py())
            .unwrap_or_else(|| PyRuntimeError::new_err("PyCapsule_SetName failed")));
    }
    // SAFETY: the capsule held an unconsumed managed tensor of the ABI its
    // name says, now ours alone (renamed: neither the capsule's destructor
    // nor another consumer will use it). PyTorch's tensor stays alive (and
    // unchanged) until the deleter runs; it was made in the process's
    // primary context of the device it names; the caller orders the
    // producer's writes before our work (same stream: PyTorch's current
    // one).
    let imported = unsafe {
        if versioned {
            Imported::from_raw_versioned(device, ptr.cast())
        } else {
            Imported::from_raw(device, ptr.cast())
        }
    };
    imported.map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

// ---------------------------------------------------------------- the load

/// What a verified load did: `str()` is the library's report
/// (`LoadReport`'s `Display`), `to_dict()` its numbers, per tensor too.
#[pyclass(frozen, module = "rocm_safe._native")]
pub struct LoadReport {
    text: String,
    dict: Py<PyDict>,
}

#[pymethods]
impl LoadReport {
    fn __str__(&self) -> String {
        self.text.clone()
    }

    fn __repr__(&self) -> String {
        let first = self.text.lines().next().unwrap_or_default();
        format!("<rocm_safe LoadReport: {first}>")
    }

    /// The report as a dict: device, file_bytes, out_bytes, ms, ring_ms,
    /// ring_jobs, direct_jobs, direct_bytes, direct_refused,
    /// gb_per_s, all_fast, by_rung {rung: tensors}, tensors [{name, dtype,
    /// out_dtype, shape, rung, attempts, ms, ...}].
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.dict.bind(py).copy()
    }

    fn __getitem__<'py>(&self, py: Python<'py>, key: &str) -> PyResult<Bound<'py, PyAny>> {
        self.dict.bind(py).as_any().get_item(key)
    }
}

fn report_of(py: Python<'_>, r: &rocm_safe::transfer::LoadReport) -> PyResult<LoadReport> {
    let d = PyDict::new(py);
    d.set_item("device", &r.device)?;
    d.set_item("file_bytes", r.file_bytes)?;
    d.set_item("out_bytes", r.out_bytes)?;
    d.set_item("ms", r.ms)?;
    d.set_item("ring_ms", r.ring_ms)?;
    d.set_item("ring_jobs", r.ring_jobs)?;
    // The direct path: ring jobs copied straight from the registered page
    // cache, and why it was turned off (None when nothing was refused).
    d.set_item("direct_jobs", r.direct.jobs)?;
    d.set_item("direct_bytes", r.direct.bytes)?;
    d.set_item("direct_refused", r.direct.refused.as_deref())?;
    d.set_item("gb_per_s", r.bytes_per_s() / 1e9)?;
    d.set_item("all_fast", r.all_fast())?;
    let by_rung = PyDict::new(py);
    for (rung, n, _) in r.by_rung() {
        if n > 0 {
            by_rung.set_item(rung.name(), n)?;
        }
    }
    d.set_item("by_rung", by_rung)?;
    let mut tensors = Vec::with_capacity(r.tensors.len());
    for t in &r.tensors {
        let td = PyDict::new(py);
        td.set_item("name", &t.name)?;
        td.set_item("dtype", t.dtype.name())?;
        td.set_item("out_dtype", t.out_dtype.name())?;
        td.set_item("shape", t.shape.clone())?;
        td.set_item("file_bytes", t.file_bytes)?;
        td.set_item("out_bytes", t.out_bytes)?;
        td.set_item("rung", t.rung.name())?;
        let attempts: Vec<String> = t
            .attempts
            .iter()
            .map(|a| format!("{} failed: {}", a.step, a.failure))
            .collect();
        td.set_item("attempts", attempts)?;
        td.set_item("oom_retried", t.oom_retried)?;
        td.set_item("offloaded", t.offloaded)?;
        td.set_item("routed", t.routed.clone())?;
        td.set_item("ms", t.ms)?;
        tensors.push(td);
    }
    d.set_item("tensors", tensors)?;
    Ok(LoadReport {
        text: r.to_string(),
        dict: d.unbind(),
    })
}

/// Per process: `last_load_report()` is the process's last load, whatever
/// the device.
fn last_report() -> &'static Mutex<Option<Py<LoadReport>>> {
    static LAST: OnceLock<Mutex<Option<Py<LoadReport>>>> = OnceLock::new();
    LAST.get_or_init(Default::default)
}

/// `last_load_report()`: the report of the last GPU load of this process
/// (`None` before the first).
#[pyfunction]
pub fn last_load_report(py: Python<'_>) -> Option<Py<LoadReport>> {
    lock(last_report()).as_ref().map(|r| r.clone_ref(py))
}

/// Loader cache key: device id, dtype, policy (by name).
type LoaderKey = (u64, Option<DType>, &'static str);

/// One loader per device and options, kept between loads (its pinned ring
/// and staging are made once: a warm load reuses them). Per process, not
/// in the device's slot: a loader holds its device (a cycle in a slot).
fn loaders() -> &'static Mutex<HashMap<LoaderKey, Arc<Mutex<Loader>>>> {
    static L: OnceLock<Mutex<HashMap<LoaderKey, Arc<Mutex<Loader>>>>> = OnceLock::new();
    L.get_or_init(Default::default)
}

/// The GPU load (see `device::load_to_device`).
pub fn load(
    py: Python<'_>,
    checkpoint: &Checkpoint,
    names: &[String],
    device: &str,
    backend: Option<&str>,
    dtype: Option<DType>,
    policy: Policy,
) -> PyResult<Vec<(String, Py<PyAny>)>> {
    let reqs: Vec<Request> = names.iter().map(Request::whole).collect();
    load_requests(py, checkpoint, &reqs, device, backend, dtype, policy)
}

/// The GPU load of whole tensors or slices of them (`Request`s), with the
/// cached loader of the device: [`load`], and the slices of a distributed
/// load's shards (`distributed.rs`).
pub fn load_requests(
    py: Python<'_>,
    checkpoint: &Checkpoint,
    reqs: &[Request],
    device: &str,
    backend: Option<&str>,
    dtype: Option<DType>,
    policy: Policy,
) -> PyResult<Vec<(String, Py<PyAny>)>> {
    let ckpt = checkpoint.get()?;
    for r in reqs {
        ckpt.info(&r.name).map_err(to_py)?;
    }
    let dev = device_of(device, backend)?;
    let key = (dev.id(), dtype, crate::policy_name(policy));
    let loader = {
        let mut map = lock(loaders());
        match map.get(&key) {
            Some(l) => l.clone(),
            None => {
                let opts = LoadOptions::default().with_dtype(dtype).with_policy(policy);
                let l = Arc::new(Mutex::new(Loader::new(&dev, opts).map_err(to_py)?));
                // One cached loader per device: another dtype or policy
                // replaces it (its staging is freed at the next sync).
                map.retain(|k, _| k.0 != dev.id());
                map.insert(key, l.clone());
                l
            }
        }
    };
    let loaded = py
        .detach(|| lock(&loader).load(&ckpt, reqs))
        .map_err(to_py)?;
    let report = Py::new(py, report_of(py, &loaded.report)?)?;
    *lock(last_report()) = Some(report);
    let mut out = Vec::with_capacity(loaded.tensors.len());
    for t in loaded.tensors {
        let name = t.name.clone();
        let managed = Export::from_loaded(t)
            .and_then(Export::into_managed)
            .map_err(to_py)?;
        out.push((name, capsule_from_managed(py, managed)?));
    }
    Ok(out)
}
