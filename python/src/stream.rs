//! What the Python layer needs to read a safetensors file from a Python
//! file object (`safe_open(f)`, `_safe_open_handle`) and to write tensors
//! from caller memory (`serialize_file`, `TensorSpec`):
//!
//! - [`header_len`] and [`parse_head`]: the library's validation of a
//!   header, from the file's first bytes and its length (the checks of a
//!   file on disk; the data section is never held);
//! - [`convert_chunk`]: one chunk of an exact dtype conversion, so that a
//!   converted read of a stream holds one chunk of the source at a time;
//! - `Writer.write_address` (in `lib.rs`): a tensor written from a memory
//!   address with the GIL released.

use std::collections::BTreeMap;
use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyByteArray;

use crate::{dtype_of, to_py};

/// The header length `N` of a stream, from its first bytes (at least
/// `min(file_len, 40)`): the library's checks of the length prefix (a Git
/// LFS pointer, a file under 8 bytes, `N` too large or past the end).
/// `path` only names the stream in errors.
#[pyfunction]
pub fn header_len(path: PathBuf, prefix: &[u8], file_len: u64) -> PyResult<u64> {
    rocm_safe::safetensors::header_len(&path, prefix, file_len).map_err(to_py)
}

/// One tensor of a parsed head: `(name, dtype, shape, begin, end)`, the
/// byte range absolute in the file.
type Entry = (String, &'static str, Vec<u64>, u64, u64);

/// What [`parse_head`] returns: the tensors and the `__metadata__` map.
type Parsed = (Vec<Entry>, Option<BTreeMap<String, String>>);

/// Validates a header from the stream's first `8 + N` bytes (`head`) and
/// the stream's length, with every check of a file on disk, and returns
/// `(tensors, metadata)`: the tensors in data order, each with its byte
/// range in the file (absolute offsets), and the `__metadata__` map or
/// `None`.
#[pyfunction]
pub fn parse_head(py: Python<'_>, path: PathBuf, head: &[u8], file_len: u64) -> PyResult<Parsed> {
    let header = py
        .detach(|| rocm_safe::safetensors::parse_head(&path, head, file_len))
        .map_err(to_py)?;
    let start = header.data_start();
    let tensors = header
        .tensors()
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.dtype.name(),
                t.shape.clone(),
                // parse_head checked both ends against the file's length.
                start.saturating_add(t.data_offsets.0),
                start.saturating_add(t.data_offsets.1),
            )
        })
        .collect();
    Ok((tensors, header.metadata().cloned()))
}

/// Converts `src` (whole elements of dtype `from`) exactly to dtype `to`
/// (a pair of the library's conversion table) and returns the result as a
/// new `bytearray`, converted with the GIL released. `SafetensorError` for
/// a pair the table lacks or a `src` that is not whole elements.
#[pyfunction]
pub fn convert_chunk<'py>(
    py: Python<'py>,
    from: &str,
    src: &[u8],
    to: &str,
) -> PyResult<Bound<'py, PyByteArray>> {
    let (from, to) = (dtype_of(from)?, dtype_of(to)?);
    let unsupported = || {
        to_py(rocm_safe::Error::UnsupportedConversion {
            op: "convert_chunk",
            from,
            to,
            tensor: None,
        })
    };
    let (Some(s), Some(d)) = (from.size(), to.size()) else {
        return Err(unsupported());
    };
    if s == 0 || !src.len().is_multiple_of(s) {
        return Err(crate::SafetensorError::new_err(format!(
            "convert_chunk: {} bytes are not whole {} elements",
            src.len(),
            from.name()
        )));
    }
    let out_len = (src.len() / s).checked_mul(d).ok_or_else(unsupported)?;
    // A new bytearray: nothing else can reach it while it is filled.
    PyByteArray::new_with(py, out_len, |dst: &mut [u8]| {
        py.detach(|| rocm_safe::convert::convert_bytes(from, src, to, dst))
            .map_err(to_py)
    })
}
