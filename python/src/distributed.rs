//! The reads of a distributed load's shards (`rocm_safe.torch`'s
//! `load_distributed(mode="shard")`): each rank reads only its slice.
//!
//! - [`load_slices_to_device`]: slices of any dimension, through the
//!   verified GPU loader (the same pipeline, checks and ladder as a whole
//!   tensor: `Request::slice`; a later dimension's slice is read run by
//!   run into the pinned ring).
//! - [`read_strided`]: on the CPU, a slice of a later dimension, which is
//!   `outer` runs of bytes at a fixed stride in the file, read with
//!   `pread` on a few threads into a new `bytearray`.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyByteArray;

use rocm_safe::transfer::Request;

use crate::device::{parse_device, parse_verify, Target};
use crate::{Checkpoint, SafetensorError};

/// `load_slices_to_device(checkpoint, requests, device, dtype=None,
/// verify="fingerprint", backend=None)`: `requests` is a list of
/// `(name, dim, start, end)`: indices `start..end` of dimension `dim` of
/// each tensor, loaded onto the GPU `device` (`"cuda:N"`) by the verified
/// loader as a contiguous tensor of the slice's shape, converted to
/// `dtype` (a safetensors name) where given. Returns `(name, capsule)` per
/// request, as `load_to_device` does (a slice the ladder kept on the host
/// comes back as a CPU capsule).
#[pyfunction]
#[pyo3(signature = (checkpoint, requests, device, dtype=None, verify="fingerprint", backend=None))]
pub fn load_slices_to_device(
    py: Python<'_>,
    checkpoint: &Checkpoint,
    requests: Vec<(String, usize, u64, u64)>,
    device: &str,
    dtype: Option<&str>,
    verify: &str,
    backend: Option<&str>,
) -> PyResult<Vec<(String, Py<PyAny>)>> {
    let policy = parse_verify(verify).map_err(PyValueError::new_err)?;
    let dtype = dtype.map(crate::dtype_of).transpose()?;
    let Target::Gpu { ordinal } = parse_device(device).map_err(SafetensorError::new_err)? else {
        return Err(PyValueError::new_err(
            "load_slices_to_device: device \"cpu\" is read with Checkpoint.read(rows=...) or read_strided",
        ));
    };
    let reqs: Vec<Request> = requests
        .into_iter()
        .map(|(n, d, s, e)| Request::slice(n, d, s..e))
        .collect();
    crate::interop::load_requests(
        py,
        checkpoint,
        &reqs,
        &format!("cuda:{ordinal}"),
        backend,
        dtype,
        policy,
    )
}

/// Threads of one strided read.
const READ_THREADS: usize = 8;

/// `read_strided(path, begin, end, outer, stride, skip, run)`: the bytes of
/// `outer` runs of `run` bytes, run `o` at `begin + o * stride + skip` in
/// the file `path`, concatenated into a new `bytearray`. `begin..end` is
/// the tensor's byte range (from the library's validated header): every
/// run must lie inside it (`ValueError` otherwise). A file shorter than
/// that range is a `SafetensorError` naming it; an I/O error an `OSError`.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn read_strided<'py>(
    py: Python<'py>,
    path: PathBuf,
    begin: u64,
    end: u64,
    outer: u64,
    stride: u64,
    skip: u64,
    run: u64,
) -> PyResult<Bound<'py, PyByteArray>> {
    let bad = || PyValueError::new_err("read_strided: the runs do not fit the tensor's byte range");
    if skip.checked_add(run).ok_or_else(bad)? > stride && outer > 0 {
        return Err(bad());
    }
    let span = outer.checked_mul(stride).ok_or_else(bad)?;
    if begin.checked_add(span).ok_or_else(bad)? > end {
        return Err(bad());
    }
    let total = usize::try_from(outer.checked_mul(run).ok_or_else(bad)?).map_err(|_| bad())?;
    let run_us = usize::try_from(run).map_err(|_| bad())?;
    let file = File::open(&path)?;
    let len = file.metadata()?.len();
    if len < end {
        return Err(SafetensorError::new_err(format!(
            "{}: the file is {len} bytes, shorter than its header says ({end})",
            path.display()
        )));
    }
    PyByteArray::new_with(py, total, |dst: &mut [u8]| {
        if run_us == 0 {
            return Ok(());
        }
        py.detach(|| {
            let rows: Vec<&mut [u8]> = dst.chunks_mut(run_us).collect();
            let per = rows.len().div_ceil(READ_THREADS).max(1);
            let mut groups: Vec<Vec<(u64, &mut [u8])>> = Vec::new();
            for (o, r) in rows.into_iter().enumerate() {
                if o % per == 0 {
                    groups.push(Vec::with_capacity(per));
                }
                let at = begin + o as u64 * stride + skip;
                if let Some(g) = groups.last_mut() {
                    g.push((at, r));
                }
            }
            std::thread::scope(|sc| {
                let handles: Vec<_> = groups
                    .into_iter()
                    .map(|g| {
                        let f = &file;
                        sc.spawn(move || -> std::io::Result<()> {
                            for (at, r) in g {
                                f.read_exact_at(r, at)?;
                            }
                            Ok(())
                        })
                    })
                    .collect();
                for h in handles {
                    match h.join() {
                        Ok(r) => r?,
                        Err(_) => {
                            return Err(std::io::Error::other(
                                "read_strided: a read thread failed",
                            ));
                        }
                    }
                }
                Ok(())
            })
        })
        .map_err(PyErr::from)
    })
}
