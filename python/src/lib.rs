//! `rocm_safe._native`: the Rust half of the `rocm_safe` Python package.
//!
//! Everything here is a thin layer over the `rocm-safe` library: the strict
//! reader ([`rocm_safe::safetensors::Checkpoint`]), the atomic streaming
//! writer ([`rocm_safe::safetensors::SafeTensorsWriter`]), the exact dtype
//! conversions and the doctor's report. The Python API users call
//! (`safe_open`, `rocm_safe.numpy`, `rocm_safe.torch`) lives in the
//! pure-Python package next to this crate and turns the byte buffers made
//! here into numpy arrays or torch tensors.
//!
//! Tensor data is read straight into a `bytearray` allocated by Python
//! (`PyByteArray::new_with`), with the GIL released during the read: the
//! array or tensor built over it is the only copy of the data.
//!
//! The GPU path (`device="cuda"`) is [`load_to_device`]: the verified
//! loader fills device memory and hands each tensor over as a DLPack
//! capsule. `interop.rs` (DLPack capsules, loads to a device) also runs the conv3d chain on tensors borrowed from
//! PyTorch through DLPack.

#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod backend;
mod conv3d;
mod device;
mod distributed;
mod errors;
mod fingerprint;
mod guard;
#[cfg(feature = "testing")]
mod inject;
#[cfg(feature = "testing")]
mod inject_moves;
mod interop;
mod moves;
mod stream;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};

use rocm_safe::convert::table;
use rocm_safe::safetensors::{
    Checkpoint as RsCheckpoint, SafeTensorsWriter, TensorInfo, TensorSpec, WriteOptions,
};
use rocm_safe::DType;

pub use device::{load_to_device, parse_device, parse_verify, policy_name, Target};
pub use errors::{to_py, SafetensorError};

/// A dtype from its safetensors name (`"BF16"`, `"F32"`, ...), or a
/// `ValueError` naming it.
fn dtype_of(name: &str) -> PyResult<DType> {
    DType::from_str(name).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `(name, dtype, shape)` of a tensor, as handed to Python.
type Described = (String, &'static str, Vec<u64>);

fn describe(t: &TensorInfo) -> Described {
    (t.name.clone(), t.dtype.name(), t.shape.clone())
}

/// Output dtype of a read of `info` converted to `to`: `to` for a float
/// tensor the library converts (a row of its conversion table: F64, F32,
/// F16, BF16, F8_E4M3, F8_E5M2 to F32, F16 or BF16), the stored dtype
/// otherwise when `floats_only`, and an error for any other explicit
/// request.
fn target(info: &TensorInfo, to: Option<&str>, floats_only: bool) -> PyResult<DType> {
    let Some(to) = to else {
        return Ok(info.dtype);
    };
    let to = dtype_of(to)?;
    if to == info.dtype || rocm_safe::convert::supported(info.dtype, to) {
        Ok(to)
    } else if floats_only && !info.dtype.is_convertible_float() {
        Ok(info.dtype)
    } else {
        Err(SafetensorError::new_err(format!(
            "tensor {:?}: cannot convert {} to {} ({})",
            info.name,
            info.dtype.name(),
            to.name(),
            what_converts()
        )))
    }
}

/// `"F64, F32, F16, BF16, F8_E4M3 and F8_E5M2 tensors convert to F32, BF16
/// or F16"`: the conversion table in words.
fn what_converts() -> String {
    let mut sources: Vec<&str> = Vec::new();
    for r in &table::CONVERSIONS {
        if !sources.contains(&r.from.name()) {
            sources.push(r.from.name());
        }
    }
    let targets: Vec<&str> = table::targets().iter().map(|d| d.name()).collect();
    let list = |v: &[&str], and: &str| match v.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} {and} {last}", rest.join(", ")),
        _ => v.join(""),
    };
    format!(
        "{} tensors convert to {}",
        list(&sources, "and"),
        list(&targets, "or")
    )
}

/// One row of the conversion table as Python sees it: `(from, to,
/// src_size, dst_size, device kernel, fused kernel, elements per work
/// item, lossless)`.
type ConversionRow = (
    &'static str,
    &'static str,
    usize,
    usize,
    Option<&'static str>,
    Option<&'static str>,
    u32,
    bool,
);

/// The library's conversion table (`rocm_safe::convert::table`), one tuple
/// per pair: `(from, to, src_size, dst_size, kernel, fused, per_item,
/// lossless)`. `rocm_safe._dtypes` builds its tables from it.
#[pyfunction]
fn conversions() -> Vec<ConversionRow> {
    table::CONVERSIONS
        .iter()
        .map(|r| {
            (
                r.from.name(),
                r.to.name(),
                r.src_size,
                r.dst_size,
                r.kernel,
                r.fused,
                r.per_item,
                r.lossless,
            )
        })
        .collect()
}

/// Every safetensors dtype as `(name, bits)`, in the specification's order.
#[pyfunction]
fn dtypes() -> Vec<(&'static str, u64)> {
    DType::ALL.iter().map(|d| (d.name(), d.bits())).collect()
}

/// Bytes of `elements` elements of `dtype`, as a `usize`.
fn byte_len(path: &Path, info: &TensorInfo, elements: u64, dtype: DType) -> PyResult<usize> {
    dtype
        .bytes_for(elements)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            to_py(rocm_safe::Error::TooLargeForPlatform {
                path: path.to_owned(),
                tensor: info.name.clone(),
                bytes: u64::MAX,
            })
        })
}

/// An open checkpoint: one `.safetensors` file or every shard of a
/// `*.safetensors.index.json`, validated at open (see the library's
/// `Checkpoint::open` for every check). Reads are positioned reads of the
/// validated descriptors, with the GIL released.
///
/// `close()` drops the library's reader (reads in flight on other threads
/// finish first); any later call raises `SafetensorError("... is closed")`.
#[pyclass(frozen, module = "rocm_safe._native")]
pub struct Checkpoint {
    path: PathBuf,
    inner: Mutex<Option<Arc<RsCheckpoint>>>,
}

impl Checkpoint {
    fn lock(&self) -> MutexGuard<'_, Option<Arc<RsCheckpoint>>> {
        // A poisoned lock only means a panic elsewhere while it was held;
        // the Option inside is still a valid value.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The library's checkpoint, or `SafetensorError` once closed.
    pub fn get(&self) -> PyResult<Arc<RsCheckpoint>> {
        self.lock().clone().ok_or_else(|| {
            SafetensorError::new_err(format!("{}: file is closed", self.path.display()))
        })
    }

    fn info(&self, ckpt: &RsCheckpoint, name: &str) -> PyResult<TensorInfo> {
        ckpt.info(name).cloned().map_err(to_py)
    }
}

#[pymethods]
impl Checkpoint {
    /// Opens and validates `path` (a safetensors file, or an index whose
    /// name ends in `.json`).
    #[new]
    fn new(py: Python<'_>, path: PathBuf) -> PyResult<Self> {
        let opened = py.detach(|| RsCheckpoint::open(&path)).map_err(to_py)?;
        Ok(Checkpoint {
            path,
            inner: Mutex::new(Some(Arc::new(opened))),
        })
    }

    /// The path given at open.
    #[getter]
    fn path(&self) -> PathBuf {
        self.path.clone()
    }

    /// Whether `close()` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.lock().is_none()
    }

    /// Closes the files (idempotent).
    fn close(&self) {
        self.lock().take();
    }

    /// A second handle on the same open files (`SafetensorError` once this
    /// one is closed). It stays open when this one is closed, until it is
    /// closed or freed itself: a slice holds one, so that it can still be
    /// read after its `safe_open` closed, as with the safetensors package.
    fn share(&self) -> PyResult<Checkpoint> {
        Ok(Checkpoint {
            path: self.path.clone(),
            inner: Mutex::new(Some(self.get()?)),
        })
    }

    /// Whether this is a sharded checkpoint (opened from an index).
    fn is_sharded(&self) -> PyResult<bool> {
        let c = self.get()?;
        Ok(c.index_metadata().is_some() || c.shards().len() != 1)
    }

    /// Paths of the shard files (the file itself when not sharded).
    fn shard_paths(&self) -> PyResult<Vec<PathBuf>> {
        let c = self.get()?;
        Ok(c.shards().iter().map(|s| s.path().to_owned()).collect())
    }

    /// Every tensor as `(name, dtype, shape)`: shard order, then data
    /// offset order within a shard.
    fn tensors(&self) -> PyResult<Vec<Described>> {
        let c = self.get()?;
        Ok(c.tensors().map(|(_, t)| describe(t)).collect())
    }

    /// `(dtype, shape)` of one tensor (`SafetensorError` when absent).
    fn describe(&self, name: &str) -> PyResult<(&'static str, Vec<u64>)> {
        let c = self.get()?;
        let t = self.info(&c, name)?;
        Ok((t.dtype.name(), t.shape))
    }

    /// Whether the checkpoint has a tensor of this name.
    fn __contains__(&self, name: &str) -> PyResult<bool> {
        Ok(self.get()?.get(name).is_some())
    }

    /// Number of tensors.
    fn __len__(&self) -> PyResult<usize> {
        Ok(self.get()?.len())
    }

    /// The `__metadata__` map (merged over shards), or `None`.
    fn metadata(&self) -> PyResult<Option<BTreeMap<String, String>>> {
        Ok(self.get()?.metadata().cloned())
    }

    /// Output dtype name of reading `name` with `to` (see `read`).
    #[pyo3(signature = (name, to=None, floats_only=false))]
    fn target_dtype(
        &self,
        name: &str,
        to: Option<&str>,
        floats_only: bool,
    ) -> PyResult<&'static str> {
        let c = self.get()?;
        let info = self.info(&c, name)?;
        Ok(target(&info, to, floats_only)?.name())
    }

    /// Reads a tensor (or rows `start..end` of its first dimension) into a
    /// new `bytearray` and returns `(bytearray, dtype, shape)`.
    ///
    /// `to` converts exactly on the way (F64/F32/F16/BF16 to F32, F16 or
    /// BF16). With `floats_only`, tensors of other dtypes are returned as
    /// stored; without, such a request is a `SafetensorError`.
    #[pyo3(signature = (name, to=None, rows=None, floats_only=false))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        name: &str,
        to: Option<&str>,
        rows: Option<(u64, u64)>,
        floats_only: bool,
    ) -> PyResult<(Bound<'py, PyByteArray>, &'static str, Vec<u64>)> {
        let c = self.get()?;
        let info = self.info(&c, name)?;
        let out = target(&info, to, floats_only)?;
        let mut shape = info.shape.clone();
        let elements = match rows {
            None => info.num_elements(),
            Some((start, end)) => {
                // Row checks (scalar, range) are the library's; the size
                // computed here only has to be right when they pass.
                let per_row = shape.iter().skip(1).fold(1u64, |a, &d| a.saturating_mul(d));
                if let Some(first) = shape.first_mut() {
                    *first = end.saturating_sub(start);
                }
                end.saturating_sub(start).saturating_mul(per_row)
            }
        };
        let len = match (rows, info.shape.is_empty()) {
            // A row read of a scalar: let the library refuse it (NoRows).
            (Some(_), true) => 0,
            _ => byte_len(&self.path, &info, elements, out)?,
        };
        let buf = PyByteArray::new_with(py, len, |dst: &mut [u8]| {
            py.detach(|| match rows {
                None if out == info.dtype => c.read_bytes_into(name, dst),
                None => c.read_converted_bytes_into(name, out, dst),
                Some((s, e)) if out == info.dtype => c.read_rows_bytes_into(name, s..e, dst),
                Some((s, e)) => read_rows_converted(&c, &info, s..e, out, dst),
            })
            .map_err(to_py)
        })?;
        Ok((buf, out.name(), shape))
    }

    fn __repr__(&self) -> String {
        format!(
            "rocm_safe._native.Checkpoint({:?}{})",
            self.path.display().to_string(),
            if self.closed() { ", closed" } else { "" }
        )
    }
}

/// Rows `rows` of `info`, converted to `to` (F32, F16 or BF16), into
/// `dst`: the library's typed row read (exact conversion, one staging
/// chunk), straight into `dst` when it is aligned for the element type (a
/// `bytearray`'s buffer always is).
fn read_rows_converted(
    c: &RsCheckpoint,
    info: &TensorInfo,
    rows: std::ops::Range<u64>,
    to: DType,
    dst: &mut [u8],
) -> rocm_safe::Result<()> {
    fn typed<T: rocm_safe::convert::Element>(
        c: &RsCheckpoint,
        info: &TensorInfo,
        rows: std::ops::Range<u64>,
        dst: &mut [u8],
    ) -> rocm_safe::Result<()> {
        match bytemuck::try_cast_slice_mut::<u8, T>(dst) {
            Ok(d) => c.read_rows_into(&info.name, rows, d),
            Err(_) => {
                // Unaligned: convert a copy (never the case for a bytearray).
                let v: Vec<T> = c.read_rows(&info.name, rows)?;
                dst.copy_from_slice(bytemuck::cast_slice(&v));
                Ok(())
            }
        }
    }
    match to {
        DType::F32 => typed::<f32>(c, info, rows, dst),
        DType::F16 => typed::<half::f16>(c, info, rows, dst),
        DType::BF16 => typed::<half::bf16>(c, info, rows, dst),
        _ => Err(rocm_safe::Error::UnsupportedConversion {
            op: "read",
            from: info.dtype,
            to,
            tensor: Some(rocm_safe::error::TensorRef::new(c.path(), &info.name)),
        }),
    }
}

/// Validates a whole safetensors file held in memory (`safetensors.load`'s
/// input) with the same checks as a file, and returns its tensors as
/// `(name, bytearray, dtype, shape)` in data order, each converted to `to`
/// when it is a float tensor (others are returned as stored).
#[pyfunction]
#[pyo3(signature = (data, to=None))]
#[allow(clippy::type_complexity)]
fn load_bytes<'py>(
    py: Python<'py>,
    data: &[u8],
    to: Option<&str>,
) -> PyResult<(
    Vec<(String, Bound<'py, PyByteArray>, &'static str, Vec<u64>)>,
    Option<BTreeMap<String, String>>,
)> {
    let path = Path::new("<bytes>");
    let header = py
        .detach(|| rocm_safe::safetensors::parse_bytes(path, data))
        .map_err(to_py)?;
    let start = header.data_start();
    let mut out = Vec::with_capacity(header.tensors().len());
    for info in header.tensors() {
        let dtype = target(info, to, true)?;
        // parse_bytes checked that every tensor lies inside `data`.
        let src = usize::try_from(start + info.data_offsets.0)
            .ok()
            .zip(usize::try_from(start + info.data_offsets.1).ok())
            .and_then(|(b, e)| data.get(b..e))
            .ok_or_else(|| {
                SafetensorError::new_err(format!("<bytes>: tensor {:?} out of bounds", info.name))
            })?;
        let len = byte_len(path, info, info.num_elements(), dtype)?;
        let buf = PyByteArray::new_with(py, len, |dst: &mut [u8]| {
            if dtype == info.dtype {
                dst.copy_from_slice(src);
                Ok(())
            } else {
                py.detach(|| rocm_safe::convert::convert_bytes(info.dtype, src, dtype, dst))
                    .map_err(to_py)
            }
        })?;
        out.push((info.name.clone(), buf, dtype.name(), info.shape.clone()));
    }
    Ok((out, header.metadata().cloned()))
}

/// A safetensors file being written: the library's streaming writer
/// (temporary file in the destination's folder, fsync, rename; never over
/// a file this process is reading).
///
/// The tensors are laid out as the `safetensors` package lays them out
/// (by dtype, widest alignment first, then by name): `order()` gives that
/// order, and `write(name, chunk)` must follow it, each tensor in any
/// number of chunks. `finish()` renames the file into place; dropping an
/// unfinished writer (or `abort()`) removes the temporary file.
#[pyclass(frozen, module = "rocm_safe._native")]
pub struct Writer {
    order: Vec<String>,
    inner: Mutex<Option<SafeTensorsWriter>>,
}

impl Writer {
    fn lock(&self) -> MutexGuard<'_, Option<SafeTensorsWriter>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[pymethods]
impl Writer {
    /// Creates the temporary file and writes the header for `tensors`
    /// (`(name, dtype, shape)` each) and `metadata`.
    #[new]
    #[pyo3(signature = (path, tensors, metadata=None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        tensors: Vec<(String, String, Vec<u64>)>,
        metadata: Option<BTreeMap<String, String>>,
    ) -> PyResult<Self> {
        let mut specs = Vec::with_capacity(tensors.len());
        for (name, dtype, shape) in tensors {
            specs.push(TensorSpec::new(name, dtype_of(&dtype)?, shape));
        }
        // The safetensors crate's order: dtype descending, then name
        // (`DType`'s order is that crate's: tests/safetensors/read.rs).
        specs.sort_by(|a, b| b.dtype.cmp(&a.dtype).then_with(|| a.name.cmp(&b.name)));
        let order = specs.iter().map(|s| s.name.clone()).collect();
        let w = py
            .detach(|| {
                SafeTensorsWriter::create_with(
                    &path,
                    specs,
                    metadata.as_ref(),
                    WriteOptions::default(),
                )
            })
            .map_err(to_py)?;
        Ok(Writer {
            order,
            inner: Mutex::new(Some(w)),
        })
    }

    /// The tensor names in the order they must be written.
    fn order(&self) -> Vec<String> {
        self.order.clone()
    }

    /// Appends `chunk` (little-endian bytes) to tensor `name`, the next in
    /// `order()`; a tensor is complete when its byte size is reached.
    fn write(&self, py: Python<'_>, name: &str, chunk: &Bound<'_, PyBytes>) -> PyResult<()> {
        let bytes = chunk.as_bytes();
        let mut guard = self.lock();
        let w = guard
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("writer already finished or aborted"))?;
        py.detach(|| w.write_chunk(name, bytes)).map_err(to_py)
    }

    /// Appends the `length` bytes at memory address `address` to tensor
    /// `name` (as `write`), read straight from that memory with the GIL
    /// released: no copy is made, and other Python threads run while the
    /// bytes are written.
    ///
    /// The caller guarantees that `address` points to `length` readable
    /// bytes that stay alive and unchanged during the call: the contract of
    /// `TensorSpec.data_ptr` in the `safetensors` API (`serialize_file`);
    /// rocm_safe's own saves pass the address of a numpy array they hold.
    /// A null address with a non-zero length, or a range that wraps around
    /// the address space, is a `SafetensorError`; so is a length past the
    /// tensor's end (checked before any byte is read).
    fn write_address(
        &self,
        py: Python<'_>,
        name: &str,
        address: usize,
        length: usize,
    ) -> PyResult<()> {
        if length > 0 && (address == 0 || address.checked_add(length).is_none()) {
            return Err(SafetensorError::new_err(format!(
                "tensor {name:?}: {length} bytes at address {address:#x} are not valid memory"
            )));
        }
        if isize::try_from(length).is_err() {
            return Err(SafetensorError::new_err(format!(
                "tensor {name:?}: {length} bytes is more than one buffer can hold"
            )));
        }
        let mut guard = self.lock();
        let w = guard
            .as_mut()
            .ok_or_else(|| PyRuntimeError::new_err("writer already finished or aborted"))?;
        let bytes: &[u8] = if length == 0 {
            &[]
        } else {
            // SAFETY: `address` is non-null and `address + length` does not
            // wrap (checked above), `length <= isize::MAX`, and u8 needs no
            // alignment. That the range is readable memory that nothing
            // writes during the call is this method's documented contract
            // with its caller (`TensorSpec.data_ptr`'s, as in the
            // safetensors package): the Python layer passes the buffer of an
            // array it keeps alive for the call.
            unsafe { std::slice::from_raw_parts(address as *const u8, length) }
        };
        py.detach(|| w.write_chunk(name, bytes)).map_err(to_py)
    }

    /// Flushes, fsyncs and renames the file into place; returns its path.
    fn finish(&self, py: Python<'_>) -> PyResult<PathBuf> {
        let w = self
            .lock()
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("writer already finished or aborted"))?;
        py.detach(|| w.finish()).map_err(to_py)
    }

    /// Removes the temporary file; the output is not created (idempotent).
    fn abort(&self) {
        self.lock().take();
    }
}

/// The doctor's report (the library's `diagnostics::Report`, the JSON of
/// `cargo run --example doctor -- --json`) with its commands written for a
/// pip user, and the doctor's table from the library's one renderer:
/// `(json, text, all_passed, usable)`. `usable` is false only when a check
/// failed with no fallback left.
#[pyfunction]
fn doctor_report(py: Python<'_>) -> PyResult<(String, String, bool, bool)> {
    use rocm_safe::diagnostics::{render_text, Audience, Report};
    let report = py.detach(|| Report::collect().for_audience(Audience::Pip));
    let json = serde_json::to_string_pretty(&report).map_err(|e| {
        PyRuntimeError::new_err(format!("doctor: cannot serialise the report: {e}"))
    })?;
    let text = render_text(&report);
    Ok((json, text, report.all_passed(), report.usable()))
}

/// `rocm_safe::device::kernel_loads()` as JSON (a list of objects).
#[pyfunction]
fn kernel_loads_json() -> PyResult<String> {
    serde_json::to_string(&rocm_safe::device::kernel_loads())
        .map_err(|e| PyRuntimeError::new_err(format!("kernel_loads: {e}")))
}

/// The cargo features this extension was built with (`"cuda"`, `"hip"`).
#[pyfunction]
fn features() -> Vec<&'static str> {
    let mut f = Vec::new();
    if cfg!(feature = "cuda") {
        f.push("cuda");
    }
    if cfg!(feature = "hip") {
        f.push("hip");
    }
    if cfg!(feature = "testing") {
        f.push("testing");
    }
    f
}

/// The extension module `rocm_safe._native`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("SafetensorError", m.py().get_type::<SafetensorError>())?;
    m.add_class::<Checkpoint>()?;
    m.add_class::<Writer>()?;
    m.add_function(wrap_pyfunction!(load_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(stream::header_len, m)?)?;
    m.add_function(wrap_pyfunction!(stream::parse_head, m)?)?;
    m.add_function(wrap_pyfunction!(stream::convert_chunk, m)?)?;
    m.add_function(wrap_pyfunction!(doctor_report, m)?)?;
    m.add_function(wrap_pyfunction!(features, m)?)?;
    m.add_function(wrap_pyfunction!(backend::set_default_backend, m)?)?;
    m.add_function(wrap_pyfunction!(backend::gpu_devices, m)?)?;
    m.add_function(wrap_pyfunction!(kernel_loads_json, m)?)?;
    m.add_function(wrap_pyfunction!(conversions, m)?)?;
    m.add_function(wrap_pyfunction!(dtypes, m)?)?;
    m.add_function(wrap_pyfunction!(device::parse_device_py, m)?)?;
    m.add_function(wrap_pyfunction!(device::parse_verify_py, m)?)?;
    m.add_function(wrap_pyfunction!(device::load_to_device_py, m)?)?;
    m.add_class::<interop::LoadReport>()?;
    m.add_function(wrap_pyfunction!(interop::last_load_report, m)?)?;
    m.add_function(wrap_pyfunction!(interop::device_owned_bytes, m)?)?;
    m.add_function(wrap_pyfunction!(interop::device_synchronize, m)?)?;
    m.add_function(wrap_pyfunction!(conv3d::conv3d, m)?)?;
    m.add_function(wrap_pyfunction!(conv3d::conv3d_stats, m)?)?;
    m.add_function(wrap_pyfunction!(conv3d::conv3d_verify, m)?)?;
    m.add_function(wrap_pyfunction!(guard::conv3d_guard, m)?)?;
    m.add_function(wrap_pyfunction!(guard::conv3d_guard_harvest, m)?)?;
    m.add_function(wrap_pyfunction!(conv3d::conv3d_backward, m)?)?;
    m.add_function(wrap_pyfunction!(conv3d::conv_transpose3d, m)?)?;
    m.add_function(wrap_pyfunction!(conv3d::conv_transpose3d_verify, m)?)?;
    #[cfg(feature = "testing")]
    m.add_function(wrap_pyfunction!(inject::inject_conv3d_failures, m)?)?;
    m.add_function(wrap_pyfunction!(moves::move_upload, m)?)?;
    m.add_function(wrap_pyfunction!(moves::move_download, m)?)?;
    m.add_function(wrap_pyfunction!(moves::move_cast, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::tensor_fingerprints, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::tensor_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(fingerprint::bytes_fingerprint, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::load_slices_to_device, m)?)?;
    m.add_function(wrap_pyfunction!(distributed::read_strided, m)?)?;
    #[cfg(feature = "testing")]
    m.add_function(wrap_pyfunction!(inject_moves::inject_move_faults, m)?)?;
    #[cfg(feature = "testing")]
    m.add_function(wrap_pyfunction!(inject_moves::move_faults_injected, m)?)?;
    Ok(())
}
