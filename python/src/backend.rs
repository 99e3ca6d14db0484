//! Which GPU backend `"cuda:N"` means in this process.
//!
//! The one wheel carries both GPU backends. The Python package chooses one
//! at import (`rocm_safe/_backend.py`: the environment, PyTorch's build,
//! a runtime already in the process, the machine's GPUs) and records it
//! here with [`set_default_backend`]; [`gpu_backend`] then resolves every
//! device request. A request that names its backend (the torch layers pass
//! `"hip"` for a ROCm build of torch, `"cuda"` for a CUDA build) gets that
//! backend or an error, never the other one.

use std::sync::Mutex;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use rocm_safe::device::{BackendKind, Device};

/// The choice made at import: the backend (`None` for the CPU) and why;
/// `None` before the package has chosen (the native module imported on its
/// own).
type Chosen = Option<(Option<BackendKind>, String)>;

static DEFAULT: Mutex<Chosen> = Mutex::new(None);

fn chosen() -> Chosen {
    DEFAULT.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The kind a backend name means (`"hip"`, `"cuda"`), or `None` for
/// `"cpu"`; a `ValueError` for any other name.
fn kind_of(name: &str) -> PyResult<Option<BackendKind>> {
    match name {
        "hip" => Ok(Some(BackendKind::Hip)),
        "cuda" => Ok(Some(BackendKind::Cuda)),
        "cpu" => Ok(None),
        other => Err(PyValueError::new_err(format!(
            "unknown backend {other:?}: use \"hip\", \"cuda\" or \"cpu\""
        ))),
    }
}

/// `set_default_backend(name, reason="")`: records the backend chosen at
/// import (`"hip"`, `"cuda"` or `"cpu"`) and why, for device requests that
/// do not name one.
#[pyfunction]
#[pyo3(signature = (name, reason=""))]
pub fn set_default_backend(name: &str, reason: &str) -> PyResult<()> {
    let kind = kind_of(name)?;
    *DEFAULT.lock().unwrap_or_else(|p| p.into_inner()) = Some((kind, reason.to_owned()));
    Ok(())
}

/// The GPU backends this build has, for messages (`"hip, cuda"`).
fn built_names() -> String {
    let names: Vec<&str> = [BackendKind::Hip, BackendKind::Cuda]
        .into_iter()
        .filter(|k| k.is_built())
        .map(|k| k.name())
        .collect();
    names.join(", ")
}

/// The backend `"cuda:N"` means: the one `hint` names (`"hip"` when
/// PyTorch is a ROCm build, `"cuda"` when it is a CUDA build), an error
/// when this build lacks it; without a hint, the one chosen at import (an
/// error naming the reason when the CPU was chosen), else the only one
/// built, else HIP (the crate's order).
pub fn gpu_backend(hint: Option<&str>) -> PyResult<BackendKind> {
    let (hip, cuda) = (BackendKind::Hip.is_built(), BackendKind::Cuda.is_built());
    if !hip && !cuda {
        return Err(PyRuntimeError::new_err(
            "this rocm_safe was built without a GPU backend: install the one wheel \
             (scripts/build-wheel.sh builds it), or build with \
             `maturin build --release --features cuda` (NVIDIA) or `--features hip` (AMD ROCm)",
        ));
    }
    let wanted = match (hint, chosen()) {
        (Some(h), _) => kind_of(h)?,
        (None, Some((Some(k), _))) => Some(k),
        (None, Some((None, reason))) => {
            return Err(PyRuntimeError::new_err(format!(
                "no GPU backend serves this process ({reason}): see rocm_safe.backend(); \
                 ROCM_SAFE_BACKEND=hip or =cuda forces one"
            )))
        }
        (None, None) => None,
    };
    match wanted {
        Some(k) if k.is_built() => Ok(k),
        Some(k) => Err(PyRuntimeError::new_err(format!(
            "the {k} backend was asked for ({}), but this rocm_safe has only {}: \
             it never serves one backend's tensors with the other",
            if hint.is_some() {
                "named by the caller; the torch API names PyTorch's build"
            } else {
                "chosen at import"
            },
            built_names()
        ))),
        None if hip => Ok(BackendKind::Hip),
        None => Ok(BackendKind::Cuda),
    }
}

/// `gpu_devices(backend)`: `(ordinal, name, arch)` of each device the
/// backend's runtime reports. Opens the runtime (the one already in the
/// process first); `RuntimeError` when it cannot, or sees no device.
#[pyfunction]
pub fn gpu_devices(backend: &str) -> PyResult<Vec<(usize, String, String)>> {
    let kind = kind_of(backend)?.unwrap_or(BackendKind::Host);
    let list = Device::list(kind).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    Ok(list
        .into_iter()
        .map(|i| (i.ordinal, i.name, i.arch))
        .collect())
}
