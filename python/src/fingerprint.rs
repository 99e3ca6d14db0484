//! Fingerprints of tensors PyTorch holds (`rocm_safe.torch`'s distributed
//! loads check every tensor a rank received with them): the crate's
//! position-keyed 64-bit fingerprint ([`rocm_safe::convert::fingerprint`])
//! of a tensor's bytes, computed where the tensor lives.
//!
//! Tensors arrive as DLPack capsules (contiguous; `_distributed.py` passes
//! flat `uint8` views). A CPU tensor is imported on the host backend and
//! summed by the host (rayon, [`par_sum_bytes`]); a GPU tensor is summed
//! on the device by the fingerprint kernel, on PyTorch's current stream
//! (borrowed), and the sums are read back once per call. Either way the
//! value is the one [`fingerprint_bytes`](rocm_safe::convert::fingerprint::fingerprint_bytes)
//! gives for the same bytes, so a fingerprint computed on one rank's host
//! can be compared with one computed on another rank's device.

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use rocm_safe::convert::fingerprint::{finish, par_sum_bytes};
use rocm_safe::device::{raw::RawStream, BackendKind, Device, Stream};
use rocm_safe::dlpack::Imported;

use crate::interop::{device_of, take_capsule};
use crate::moves::host_bytes;

/// The fingerprints of `imports` (all of `dev`), in order.
fn fingerprints_of(dev: &Device, stream: u64, imports: &[Imported]) -> PyResult<Vec<u64>> {
    if dev.kind() == BackendKind::Host {
        let mut out = Vec::with_capacity(imports.len());
        for imp in imports {
            let b = host_bytes(imp, "tensor_fingerprint")?;
            out.push(finish(par_sum_bytes(0, b), b.len() as u64).0);
        }
        return Ok(out);
    }
    // SAFETY: `stream` is PyTorch's current stream of this device (the
    // caller's contract, `_distributed.py`), alive for the call; the
    // `Stream` is dropped before the call returns and never destroyed by
    // rocm-safe.
    let s = unsafe { Stream::from_raw(dev, RawStream(stream)) };
    let err = |e: rocm_safe::Error| PyRuntimeError::new_err(format!("tensor_fingerprint: {e}"));
    let n = imports.len();
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut acc = s.alloc_zeros::<u64>(n).map_err(err)?;
    let mut lens = Vec::with_capacity(n);
    for (i, imp) in imports.iter().enumerate() {
        let v = imp
            .view::<u8>()
            .map_err(|e| PyValueError::new_err(format!("tensor_fingerprint: {e}")))?;
        lens.push(v.num_bytes() as u64);
        let mut one = acc.slice_mut(i..i + 1).map_err(err)?;
        s.fingerprint_sum_into(&v, &mut one).map_err(err)?;
    }
    let mut sums = vec![0u64; n];
    acc.view().copy_dtoh(&s, &mut sums).map_err(err)?;
    Ok(sums
        .iter()
        .zip(&lens)
        .map(|(&sum, &len)| finish(sum, len).0)
        .collect())
}

/// `tensor_fingerprints(device, stream, capsules, backend=None)`: the
/// fingerprint (an `int`, 64 bits) of each tensor's bytes, in order.
/// `device`: `"cpu"` (the tensors are CPU tensors, summed by the host) or
/// `"cuda:N"` (GPU tensors of that device, summed on it on the stream
/// `stream`, PyTorch's current one: the call orders after the work queued
/// there and waits for its sums). `capsules`: unused DLPack capsules of
/// contiguous tensors (`torch.utils.dlpack.to_dlpack`). Errors:
/// `TypeError` for what is not a capsule, `ValueError` for a tensor the
/// device cannot read (another device, not contiguous), `RuntimeError`
/// for a device failure.
#[pyfunction]
#[pyo3(signature = (device, stream, capsules, backend=None))]
pub fn tensor_fingerprints(
    py: Python<'_>,
    device: &str,
    stream: u64,
    capsules: Vec<Bound<'_, PyAny>>,
    backend: Option<&str>,
) -> PyResult<Vec<u64>> {
    let dev = device_of(device, backend)?;
    let imports = capsules
        .iter()
        .map(|c| take_capsule(&dev, c, "tensor_fingerprint"))
        .collect::<PyResult<Vec<Imported>>>()?;
    py.detach(|| fingerprints_of(&dev, stream, &imports))
}

/// `tensor_fingerprint(device, stream, capsule, backend=None)`: the
/// fingerprint of one tensor's bytes ([`tensor_fingerprints`] of one).
#[pyfunction]
#[pyo3(signature = (device, stream, capsule, backend=None))]
pub fn tensor_fingerprint(
    py: Python<'_>,
    device: &str,
    stream: u64,
    capsule: Bound<'_, PyAny>,
    backend: Option<&str>,
) -> PyResult<u64> {
    let v = tensor_fingerprints(py, device, stream, vec![capsule], backend)?;
    v.first()
        .copied()
        .ok_or_else(|| PyRuntimeError::new_err("tensor_fingerprint: no result"))
}

/// `bytes_fingerprint(data)`: the fingerprint of a bytes-like object's
/// bytes (anything with the buffer protocol), computed on the host: what
/// [`tensor_fingerprints`] gives for a tensor holding the same bytes.
#[pyfunction]
pub fn bytes_fingerprint(py: Python<'_>, data: &[u8]) -> u64 {
    py.detach(|| finish(par_sum_bytes(0, data), data.len() as u64).0)
}
