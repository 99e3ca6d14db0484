//! Devices and the verification policy: parsing, and the GPU hook.
//!
//! [`load_to_device`] is where the GPU step plugs in: it receives an open
//! [`Checkpoint`](crate::Checkpoint), the tensors asked for, the parsed
//! device, the conversion dtype and the verification policy, and must
//! return one DLPack capsule per tensor (`(name, capsule)`), which the
//! Python side hands to `torch.from_dlpack`; the work is in `interop.rs`.

use pyo3::prelude::*;

use rocm_safe::verify::Policy;

use crate::{Checkpoint, SafetensorError};

/// Where tensors are to be loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Host memory (numpy arrays, CPU torch tensors).
    Cpu,
    /// GPU `ordinal` as torch numbers them (`cuda:N`, also on ROCm builds
    /// of torch, where `torch.cuda` is HIP).
    Gpu {
        /// The device's ordinal.
        ordinal: usize,
    },
}

/// Parses a `device=` value as the `safetensors` package accepts it:
/// `"cpu"`, `"cuda"`, `"cuda:N"`, an integer `N` (`cuda:N`); `"hip"` and
/// `"hip:N"` are accepted as spellings of the same GPU.
pub fn parse_device(device: &str) -> Result<Target, String> {
    let d = device.trim();
    if d == "cpu" {
        return Ok(Target::Cpu);
    }
    let (kind, ordinal) = match d.split_once(':') {
        Some((k, n)) => (k, Some(n)),
        None => (d, None),
    };
    let ordinal = match ordinal {
        None => 0,
        Some(n) => n
            .parse::<usize>()
            .map_err(|_| format!("invalid device {device:?}: the ordinal must be a number"))?,
    };
    match kind {
        "cuda" | "hip" => Ok(Target::Gpu { ordinal }),
        _ => match d.parse::<usize>() {
            Ok(ordinal) => Ok(Target::Gpu { ordinal }),
            Err(_) => Err(format!(
                "device {device:?} is not supported: use \"cpu\", \"cuda\", \"cuda:N\" or N"
            )),
        },
    }
}

/// Parses a `verify=` policy name: `"off"`, `"fingerprint"` (the
/// default), `"fused_fingerprint"`, `"readback"` (`-` and `_` alike, any
/// case).
pub fn parse_verify(name: &str) -> Result<Policy, String> {
    match name.trim().to_ascii_lowercase().replace('-', "_").as_str() {
        "off" | "none" => Ok(Policy::Off),
        "fingerprint" => Ok(Policy::Fingerprint),
        "fused_fingerprint" | "fused" => Ok(Policy::FusedFingerprint),
        "readback" | "read_back" => Ok(Policy::ReadBack),
        _ => Err(format!(
            "unknown verify policy {name:?}: use \"off\", \"fingerprint\" (the default), \
             \"fused_fingerprint\" or \"readback\""
        )),
    }
}

/// The canonical name of a policy (what `parse_verify` reads back).
pub fn policy_name(p: Policy) -> &'static str {
    match p {
        Policy::Off => "off",
        Policy::Fingerprint => "fingerprint",
        Policy::FusedFingerprint => "fused_fingerprint",
        Policy::ReadBack => "readback",
        // A policy newer than this package (the enum is non-exhaustive):
        // named, never mistaken for one of the above.
        _ => "unknown",
    }
}

/// `parse_device` for Python: `("cpu", 0)` or `("cuda", N)`;
/// `SafetensorError` otherwise.
#[pyfunction(name = "parse_device")]
pub fn parse_device_py(device: &str) -> PyResult<(&'static str, usize)> {
    match parse_device(device).map_err(SafetensorError::new_err)? {
        Target::Cpu => Ok(("cpu", 0)),
        Target::Gpu { ordinal } => Ok(("cuda", ordinal)),
    }
}

/// `parse_verify` for Python: the canonical policy name; `ValueError`
/// otherwise.
#[pyfunction(name = "parse_verify")]
pub fn parse_verify_py(name: &str) -> PyResult<&'static str> {
    parse_verify(name)
        .map(policy_name)
        .map_err(pyo3::exceptions::PyValueError::new_err)
}

/// The GPU hook: loads `names` of `checkpoint` onto GPU `ordinal` (HIP on
/// a `hip` build, CUDA on a `cuda` build; with both, `backend` decides:
/// `"hip"` or `"cuda"`), converted to `dtype` (float tensors only, as the
/// library's `LoadOptions::dtype`), checked with `policy`, and returns one
/// DLPack capsule (`"dltensor"`) per tensor, which the caller hands to
/// `torch.from_dlpack` (no copy).
///
/// The staged, verified `rocm_safe::transfer::Loader` (one per device,
/// kept between loads) fills device memory; each loaded tensor becomes a
/// `rocm_safe::dlpack::Export` whose deleter gives the memory back to
/// rocm-safe (freed at the device's next sync point). The loader waits for
/// its streams before it returns, so the tensors are complete on every
/// stream. A tensor the ladder kept on the host comes back as a CPU
/// capsule (the report says so; the Python side moves it). The load's
/// report is kept for `last_load_report()`.
pub fn load_to_device(
    py: Python<'_>,
    checkpoint: &Checkpoint,
    names: &[String],
    ordinal: usize,
    dtype: Option<rocm_safe::DType>,
    policy: Policy,
    backend: Option<&str>,
) -> PyResult<Vec<(String, Py<PyAny>)>> {
    crate::interop::load(
        py,
        checkpoint,
        names,
        &format!("cuda:{ordinal}"),
        backend,
        dtype,
        policy,
    )
}

/// `load_to_device` for Python: `(checkpoint, names, device, dtype=None,
/// verify="fingerprint", backend=None)`, with the device and policy parsed
/// here.
#[pyfunction(name = "load_to_device")]
#[pyo3(signature = (checkpoint, names, device, dtype=None, verify="fingerprint", backend=None))]
pub fn load_to_device_py(
    py: Python<'_>,
    checkpoint: &Checkpoint,
    names: Vec<String>,
    device: &str,
    dtype: Option<&str>,
    verify: &str,
    backend: Option<&str>,
) -> PyResult<Vec<(String, Py<PyAny>)>> {
    let policy = parse_verify(verify).map_err(pyo3::exceptions::PyValueError::new_err)?;
    let dtype = dtype.map(crate::dtype_of).transpose()?;
    match parse_device(device).map_err(SafetensorError::new_err)? {
        Target::Gpu { ordinal } => {
            load_to_device(py, checkpoint, &names, ordinal, dtype, policy, backend)
        }
        Target::Cpu => Err(pyo3::exceptions::PyValueError::new_err(
            "load_to_device: device \"cpu\" is read with Checkpoint.read",
        )),
    }
}
