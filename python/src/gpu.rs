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

use rocm_safe::conv3d::{Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dGeometry, Conv3dParams};
use rocm_safe::conv3d_chain::{
    device_tiers, BackwardInputs, Conv3dChain, Conv3dOptions, Conv3dReport, Conv3dTier,
    DeviceBackwardOperands, DeviceConv3dData, DeviceOperands, Support, TierKind,
};
use rocm_safe::device::{BackendKind, Device, DeviceViewMut, RawStream, Stream};
use rocm_safe::dlpack::{ffi::DLManagedTensor, Export, Imported, Managed};
use rocm_safe::transfer::{LoadOptions, Loader};
use rocm_safe::verify::Policy;
use rocm_safe::DType;

use crate::errors::op_to_py;
use crate::{to_py, Checkpoint};

const DLTENSOR: &CStr = c"dltensor";
const USED_DLTENSOR: &CStr = c"used_dltensor";
const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
const USED_DLTENSOR_VERSIONED: &CStr = c"used_dltensor_versioned";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere while it was held; the
    // maps inside stay valid.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------- devices

/// The backend `"cuda:N"` means in this build: HIP on a `hip` build, CUDA
/// on a `cuda` build; with both, `hint` (`"hip"` when PyTorch is a ROCm
/// build) decides.
fn gpu_backend(hint: Option<&str>) -> PyResult<BackendKind> {
    let (hip, cuda) = (BackendKind::Hip.is_built(), BackendKind::Cuda.is_built());
    match (hip, cuda, hint) {
        (true, true, Some("hip")) | (true, false, _) => Ok(BackendKind::Hip),
        (_, true, _) => Ok(BackendKind::Cuda),
        (false, false, _) => Err(PyRuntimeError::new_err(
            "this rocm_safe was built without a GPU backend: build the wheel with \
             `maturin build --release --features cuda` (NVIDIA) or `--features hip` (AMD ROCm)",
        )),
    }
}

/// The device of `device` (`"cpu"`: the host backend, whose "device
/// memory" is host memory; `"cuda:N"`: the GPU backend of this build),
/// opened once per process and shared, so that every buffer, import and
/// chain of one GPU is of one [`Device`].
pub fn device_of(device: &str, hint: Option<&str>) -> PyResult<Device> {
    static DEVICES: OnceLock<Mutex<HashMap<(BackendKind, usize), Device>>> = OnceLock::new();
    let (kind, ordinal) = match crate::parse_device(device).map_err(PyValueError::new_err)? {
        crate::Target::Cpu => (BackendKind::Host, 0),
        crate::Target::Gpu { ordinal } => (gpu_backend(hint)?, ordinal),
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
/// and staging are made once: a warm load reuses them).
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
    let ckpt = checkpoint.get()?;
    for n in names {
        ckpt.info(n).map_err(to_py)?;
    }
    let dev = device_of(device, backend)?;
    let key = (dev.id(), dtype, crate::policy_name(policy));
    let loader = {
        let mut map = lock(loaders());
        match map.get(&key) {
            Some(l) => l.clone(),
            None => {
                let opts = LoadOptions {
                    dtype,
                    policy,
                    ..LoadOptions::default()
                };
                let l = Arc::new(Mutex::new(Loader::new(&dev, opts).map_err(to_py)?));
                // One cached loader per device: another dtype or policy
                // replaces it (its staging is freed at the next sync).
                map.retain(|k, _| k.0 != dev.id());
                map.insert(key, l.clone());
                l
            }
        }
    };
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let loaded = py
        .detach(|| lock(&loader).load_names(&ckpt, &refs))
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

// ---------------------------------------------------------------- conv3d

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
    let i = TierKind::ALL.iter().position(|t| *t == kind).unwrap_or(0);
    *lock(injected()) & (1 << i) != 0
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

/// Each device's chain.
type Chains = Mutex<Vec<(Device, Arc<Conv3dChain>)>>;

/// The chain of each device, made once (statistics accumulate there).
fn chains() -> &'static Chains {
    static C: OnceLock<Chains> = OnceLock::new();
    C.get_or_init(Default::default)
}

fn chain_of(dev: &Device) -> Arc<Conv3dChain> {
    let mut v = lock(chains());
    if let Some((_, c)) = v.iter().find(|(d, _)| d.same(dev)) {
        return c.clone();
    }
    let tiers = device_tiers(dev)
        .into_iter()
        .map(|t| Box::new(Injectable(t)) as Box<dyn Conv3dTier>)
        .collect();
    let c = Arc::new(Conv3dChain::with_tiers(tiers, Conv3dOptions::default()));
    v.push((dev.clone(), c.clone()));
    c
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

fn import_data<'a>(imp: &'a Imported, what: &str) -> PyResult<DeviceConv3dData<'a>> {
    let map = |e: rocm_safe::Error| PyValueError::new_err(format!("{what}: {e}"));
    match imp.dtype() {
        DType::F32 => Ok(DeviceConv3dData::F32(imp.view().map_err(map)?)),
        DType::BF16 => Ok(DeviceConv3dData::BF16(imp.view().map_err(map)?)),
        d => Err(PyTypeError::new_err(format!(
            "{what}: dtype {} is not supported by the conv3d chain (float32 and bfloat16)",
            d.name()
        ))),
    }
}

/// `conv3d(device, stream, input, weight, bias, out, stride, padding,
/// dilation, groups, backend=None)`: the conv3d chain on tensors borrowed
/// through DLPack capsules (`out`: f32, the output's shape, written in
/// place), with its device work on `stream` (PyTorch's current stream's
/// handle; ignored on `"cpu"`). Returns `(served tier name, report)`.
/// Errors: `TypeError` / `ValueError` for what the chain does not take,
/// `RuntimeError` when no tier served (with the report).
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, dilation, groups, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv3d(
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
) -> PyResult<(String, String)> {
    let dev = device_of(device, backend)?;
    let x = take_capsule(&dev, input, "conv3d input")?;
    let w = take_capsule(&dev, weight, "conv3d weight")?;
    let b = bias
        .map(|b| take_capsule(&dev, b, "conv3d bias"))
        .transpose()?;
    let mut y = take_capsule(&dev, out, "conv3d output")?;
    if y.dtype() != DType::F32 {
        return Err(PyTypeError::new_err("conv3d output: must be float32"));
    }
    let s = if dev.kind() == BackendKind::Host {
        dev.stream()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
    } else {
        // SAFETY: `stream` is PyTorch's current stream of this device
        // (`torch.cuda.current_stream(device).cuda_stream`, 0 for the
        // default stream), made in the primary context the device uses; the
        // caller keeps it alive for the call, and the `Stream` is dropped
        // before this returns (never destroyed by rocm-safe).
        unsafe { Stream::from_raw(&dev, RawStream(stream)) }
    };
    let params = Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    let chain = chain_of(&dev);
    let xd = import_data(&x, "conv3d input")?;
    let wd = import_data(&w, "conv3d weight")?;
    let bd = b
        .as_ref()
        .map(|b| import_data(b, "conv3d bias"))
        .transpose()?;
    let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
    let mut yv = y
        .view_mut::<f32>()
        .map_err(|e| PyValueError::new_err(format!("conv3d output: {e}")))?;
    let r = py.detach(|| chain.run_device(&s, params, xd, &xs, wd, &ws, bd, &mut yv));
    match r {
        Ok(report) => {
            let served = report.served().map(|a| a.name.clone()).unwrap_or_default();
            Ok((served, report.to_string()))
        }
        Err(e) => Err(op_to_py("conv3d", e)),
    }
}

/// `conv3d_verify(device, stream, input, weight, bias, out, stride,
/// padding, dilation, groups, backend=None)`: checks `out` (float32 or
/// bfloat16, computed by something else: torch's own conv3d) at the
/// chain's sampled points on the device, on `stream` (the f64
/// recomputation from the operands, one small read-back). Returns `None`
/// when every sampled point agrees, else the mismatch as text. No NaN/Inf
/// scan (the caller has `torch.isfinite`). `rel_tol`: the tolerance when
/// the output was computed at a lower precision (TF32), else the chain's.
/// Errors as `conv3d`.
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, dilation, groups, backend=None, rel_tol=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv3d_verify(
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
    rel_tol: Option<f64>,
) -> PyResult<Option<String>> {
    let dev = device_of(device, backend)?;
    let x = take_capsule(&dev, input, "conv3d input")?;
    let w = take_capsule(&dev, weight, "conv3d weight")?;
    let b = bias
        .map(|b| take_capsule(&dev, b, "conv3d bias"))
        .transpose()?;
    let y = take_capsule(&dev, out, "conv3d output")?;
    let s = if dev.kind() == BackendKind::Host {
        dev.stream()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?
    } else {
        // SAFETY: as in `conv3d`: torch's current stream of this device,
        // alive for the call; the `Stream` is dropped before this returns.
        unsafe { Stream::from_raw(&dev, RawStream(stream)) }
    };
    let params = Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    let chain = chain_of(&dev);
    let xd = import_data(&x, "conv3d input")?;
    let wd = import_data(&w, "conv3d weight")?;
    let bd = b
        .as_ref()
        .map(|b| import_data(b, "conv3d bias"))
        .transpose()?;
    let yd = import_data(&y, "conv3d output")?;
    let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
    let r = py.detach(|| match rel_tol {
        None => chain.verify_device(&s, params, xd, &xs, wd, &ws, bd, yd),
        Some(rel) => chain.verify_device_within(&s, params, (xd, &xs), (wd, &ws), bd, yd, rel),
    });
    match r {
        Ok(Ok(())) => Ok(None),
        Ok(Err(failure)) => Ok(Some(failure.to_string())),
        Err(e) => Err(op_to_py("conv3d_verify", e)),
    }
}

/// The stream a chain call runs on: a stream of the host backend, or
/// PyTorch's current stream of the device, borrowed.
fn call_stream(dev: &Device, stream: u64) -> PyResult<Stream> {
    if dev.kind() == BackendKind::Host {
        dev.stream()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    } else {
        // SAFETY: as in `conv3d`: `stream` is PyTorch's current stream of
        // this device, alive for the call; the `Stream` is dropped before
        // the caller returns (never destroyed by rocm-safe).
        Ok(unsafe { Stream::from_raw(dev, RawStream(stream)) })
    }
}

/// A chain call's result for Python: `(served tier, report)`, or the
/// error ([`op_to_py`]: `ValueError` for what the chain does not take).
fn chain_result(what: &str, r: rocm_safe::Result<Conv3dReport>) -> PyResult<(String, String)> {
    match r {
        Ok(report) => {
            let served = report.served().map(|a| a.name.clone()).unwrap_or_default();
            Ok((served, report.to_string()))
        }
        Err(e) => Err(op_to_py(what, e)),
    }
}

/// `conv3d_backward(device, stream, op, grad_output, other, out,
/// input_shape, weight_shape, stride, padding, dilation, groups,
/// backend=None)`: a gradient of the forward conv3d `(input_shape,
/// weight_shape, stride, padding, dilation, groups)` through the chain on
/// tensors borrowed through DLPack, on `stream`, into `out` (f32, written
/// in place): `op` `"data"` (`other`: the weight; `out` the input's
/// shape), `"weight"` (`other`: the forward input; `out` the weight's
/// shape) or `"bias"` (`other` None, `out` `[K]`; the shapes and
/// parameters are not used). Returns `(served tier name, report)`.
#[pyfunction]
#[pyo3(signature = (device, stream, op, grad_output, other, out, input_shape, weight_shape, stride, padding, dilation, groups, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv3d_backward(
    py: Python<'_>,
    device: &str,
    stream: u64,
    op: &str,
    grad_output: &Bound<'_, PyAny>,
    other: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    input_shape: Vec<i64>,
    weight_shape: Vec<i64>,
    stride: [usize; 3],
    padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
) -> PyResult<(String, String)> {
    let dev = device_of(device, backend)?;
    let dy = take_capsule(&dev, grad_output, "conv3d backward grad_output")?;
    let o = other
        .map(|o| take_capsule(&dev, o, "conv3d backward operand"))
        .transpose()?;
    let mut y = take_capsule(&dev, out, "conv3d backward output")?;
    if y.dtype() != DType::F32 {
        return Err(PyTypeError::new_err(
            "conv3d backward output: must be float32",
        ));
    }
    let s = call_stream(&dev, stream)?;
    let params = Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    let chain = chain_of(&dev);
    let dyd = import_data(&dy, "conv3d backward grad_output")?;
    let od = o
        .as_ref()
        .map(|o| import_data(o, "conv3d backward operand"))
        .transpose()?;
    let dy_shape = dy.shape().to_vec();
    let mut yv = y
        .view_mut::<f32>()
        .map_err(|e| PyValueError::new_err(format!("conv3d backward output: {e}")))?;
    let inputs = match (op, od) {
        ("data", Some(weight)) => Some(BackwardInputs::Data {
            grad_output: dyd,
            weight,
        }),
        ("weight", Some(input)) => Some(BackwardInputs::Weight {
            input,
            grad_output: dyd,
        }),
        ("bias", None) => None,
        _ => {
            return Err(PyValueError::new_err(format!(
                "conv3d_backward: op {op:?} with{} a second operand: \"data\" and \"weight\" take one, \"bias\" none",
                if o.is_some() { "" } else { "out" }
            )))
        }
    };
    let r = py.detach(|| match inputs {
        Some(i) => chain.backward_device(&s, params, &input_shape, &weight_shape, i, &mut yv),
        None => chain.backward_bias_device(&s, dyd, &dy_shape, &mut yv),
    });
    chain_result("conv3d_backward", r)
}

/// `conv_transpose3d(device, stream, input, weight, bias, out, stride,
/// padding, output_padding, dilation, groups, backend=None)`: the
/// transposed convolution (PyTorch's semantics; weight `[C_in,
/// C_out/groups, KD, KH, KW]`) through the chain on tensors borrowed
/// through DLPack, on `stream`, into `out` (f32, written in place).
/// Returns `(served tier name, report)`; errors as `conv3d`.
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, output_padding, dilation, groups, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose3d(
    py: Python<'_>,
    device: &str,
    stream: u64,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    stride: [usize; 3],
    padding: [usize; 3],
    output_padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
) -> PyResult<(String, String)> {
    let dev = device_of(device, backend)?;
    let x = take_capsule(&dev, input, "conv_transpose3d input")?;
    let w = take_capsule(&dev, weight, "conv_transpose3d weight")?;
    let b = bias
        .map(|b| take_capsule(&dev, b, "conv_transpose3d bias"))
        .transpose()?;
    let mut y = take_capsule(&dev, out, "conv_transpose3d output")?;
    if y.dtype() != DType::F32 {
        return Err(PyTypeError::new_err(
            "conv_transpose3d output: must be float32",
        ));
    }
    let s = call_stream(&dev, stream)?;
    let params = Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    let chain = chain_of(&dev);
    let xd = import_data(&x, "conv_transpose3d input")?;
    let wd = import_data(&w, "conv_transpose3d weight")?;
    let bd = b
        .as_ref()
        .map(|b| import_data(b, "conv_transpose3d bias"))
        .transpose()?;
    let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
    let mut yv = y
        .view_mut::<f32>()
        .map_err(|e| PyValueError::new_err(format!("conv_transpose3d output: {e}")))?;
    let r = py.detach(|| {
        chain.conv_transpose3d_device(&s, params, output_padding, xd, &xs, wd, &ws, bd, &mut yv)
    });
    chain_result("conv_transpose3d", r)
}

/// `conv_transpose3d_verify(device, stream, input, weight, bias, out,
/// stride, padding, output_padding, dilation, groups, backend=None)`:
/// checks `out` (float32, computed by something else: torch's own
/// conv_transpose3d) at the chain's sampled points on the device, on
/// `stream`. Returns `None` when every sampled point agrees, else the
/// mismatch as text. Errors as `conv_transpose3d`.
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, output_padding, dilation, groups, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose3d_verify(
    py: Python<'_>,
    device: &str,
    stream: u64,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    stride: [usize; 3],
    padding: [usize; 3],
    output_padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
) -> PyResult<Option<String>> {
    let dev = device_of(device, backend)?;
    let x = take_capsule(&dev, input, "conv_transpose3d input")?;
    let w = take_capsule(&dev, weight, "conv_transpose3d weight")?;
    let b = bias
        .map(|b| take_capsule(&dev, b, "conv_transpose3d bias"))
        .transpose()?;
    let y = take_capsule(&dev, out, "conv_transpose3d output")?;
    if y.dtype() != DType::F32 {
        return Err(PyTypeError::new_err(
            "conv_transpose3d_verify output: must be float32",
        ));
    }
    let s = call_stream(&dev, stream)?;
    let params = Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    let chain = chain_of(&dev);
    let xd = import_data(&x, "conv_transpose3d input")?;
    let wd = import_data(&w, "conv_transpose3d weight")?;
    let bd = b
        .as_ref()
        .map(|b| import_data(b, "conv_transpose3d bias"))
        .transpose()?;
    let yv = y
        .view::<f32>()
        .map_err(|e| PyValueError::new_err(format!("conv_transpose3d output: {e}")))?;
    let (xs, ws) = (x.shape().to_vec(), w.shape().to_vec());
    let r = py.detach(|| {
        chain.verify_conv_transpose3d_device(&s, params, output_padding, xd, &xs, wd, &ws, bd, yv)
    });
    match r {
        Ok(Ok(())) => Ok(None),
        Ok(Err(failure)) => Ok(Some(failure.to_string())),
        Err(e) => chain_result("conv_transpose3d_verify", Err(e)).map(|_| None),
    }
}

/// `(name, attempts, successes, skips, errors, non_finite, mismatches,
/// seconds)` of one tier.
type StatsRow = (String, u64, u64, u64, u64, u64, u64, f64);

/// `conv3d_stats()`: per tier name (over every device's chain), the
/// counters `(attempts, successes, skips, errors, non_finite, mismatches,
/// seconds)`.
#[pyfunction]
pub fn conv3d_stats() -> Vec<StatsRow> {
    let chains: Vec<Arc<Conv3dChain>> = lock(chains()).iter().map(|(_, c)| c.clone()).collect();
    let mut out: Vec<StatsRow> = Vec::new();
    for c in chains {
        for s in c.stats() {
            match out.iter_mut().find(|o| o.0 == s.name) {
                Some(o) => {
                    o.1 += s.attempts;
                    o.2 += s.successes;
                    o.3 += s.skips;
                    o.4 += s.errors;
                    o.5 += s.non_finite;
                    o.6 += s.mismatches;
                    o.7 += s.time.as_secs_f64();
                }
                None => out.push((
                    s.name.clone(),
                    s.attempts,
                    s.successes,
                    s.skips,
                    s.errors,
                    s.non_finite,
                    s.mismatches,
                    s.time.as_secs_f64(),
                )),
            }
        }
    }
    out
}
