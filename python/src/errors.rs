//! `rocm_safe::Error` to Python exceptions, by [`ErrorKind`].
//!
//! | kind | Python exception ([`to_py`]: the safetensors-compatible API and loads) |
//! | --- | --- |
//! | `Io` ([`Error::Io`], and a path that is not a regular file: a folder) | the `OSError` subclass of its errno (`FileNotFoundError`, `PermissionError`, `IsADirectoryError`, ...), `filename` set |
//! | `OutOfMemory` (host or device) | `MemoryError` |
//! | `Overflow` | `OverflowError` |
//! | `Device`, `Unavailable` (backend not built, no runtime, no device, ...), `Verification` | `RuntimeError` |
//! | `InvalidFile`, `NotFound`, `Usage`, `Unsupported`, `Changed`, `Cancelled`: malformed headers and indexes, our stricter checks (duplicate keys, LFS pointers, overlapping data), missing tensors, files changed while read, writer refusals | `rocm_safe.SafetensorError` (as the `safetensors` package raises for these) |
//! | a kind added later | `RuntimeError` |
//!
//! [`op_to_py`] (the device operations: conv3d and its gradients) differs
//! in one place: what the caller passed (`Usage`, `Unsupported`) is a
//! `ValueError`, which the torch fallback reads as "the chain does not
//! take this call".
//!
//! The message is always the library's: it names the file and, where there
//! is one, the tensor.

use pyo3::exceptions::{PyMemoryError, PyOSError, PyOverflowError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use rocm_safe::error::ErrorKind;
use rocm_safe::Error;

// `rocm_safe._errors.SafetensorError`: defined in Python so that it derives
// from the `safetensors` package's exception where that is installed
// (`except safetensors.SafetensorError` keeps working); imported when first
// raised or registered.
pyo3::import_exception!(rocm_safe._errors, SafetensorError);

/// The Python exception for a library error (see the module docs).
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::Io => io_to_py(e, msg),
        ErrorKind::OutOfMemory => PyMemoryError::new_err(msg),
        ErrorKind::Overflow => PyOverflowError::new_err(msg),
        ErrorKind::InvalidFile
        | ErrorKind::NotFound
        | ErrorKind::Usage
        | ErrorKind::Unsupported
        | ErrorKind::Changed
        | ErrorKind::Cancelled => SafetensorError::new_err(msg),
        // Device, Unavailable, Verification, and kinds added later.
        _ => PyRuntimeError::new_err(msg),
    }
}

/// The Python exception for an error of the device operation `what`
/// (`"conv3d"`, ...), its message prefixed with `what`: `ValueError` for
/// what the caller passed, else as [`to_py`] (module docs).
pub fn op_to_py(what: &str, e: Error) -> PyErr {
    let msg = format!("{what}: {e}");
    match e.kind() {
        ErrorKind::Usage | ErrorKind::Unsupported => PyValueError::new_err(msg),
        ErrorKind::Io => io_to_py(e, msg),
        ErrorKind::OutOfMemory => PyMemoryError::new_err(msg),
        ErrorKind::Overflow => PyOverflowError::new_err(msg),
        _ => PyRuntimeError::new_err(msg),
    }
}

/// An error of [`ErrorKind::Io`]: the `OSError` of its errno, `filename`
/// set where it names a path.
fn io_to_py(e: Error, msg: String) -> PyErr {
    match e {
        Error::Io { path, source, .. } => {
            let errno = source.raw_os_error().or(match source.kind() {
                // The library's own I/O refusals carry no errno ("path has
                // no file name" for "/", "."): EINVAL, as the OS would say.
                std::io::ErrorKind::InvalidInput => Some(libc_errno::EINVAL),
                _ => None,
            });
            os_error(&msg, errno, &path)
        }
        Error::NotRegularFile { path, kind } => {
            // The safetensors package fails on these with an OSError
            // (ENODEV from its mmap); we refuse them before reading, with
            // the errno a program expects for what the path is.
            let errno = match kind {
                "folder" => libc_errno::EISDIR,
                _ => libc_errno::ENODEV,
            };
            os_error(&msg, Some(errno), &path)
        }
        _ => PyOSError::new_err(msg),
    }
}

/// Linux errno values used above (the `libc` crate is not needed for three).
mod libc_errno {
    pub const EINVAL: i32 = 22;
    pub const EISDIR: i32 = 21;
    pub const ENODEV: i32 = 19;
}

/// `OSError(errno, message)` (Python picks the subclass from the errno),
/// with `filename` set to `path`; without an errno a plain
/// `OSError(message)` (with `filename` set, Python would print it as
/// `[Errno None] None: 'path'`).
fn os_error(msg: &str, errno: Option<i32>, path: &std::path::Path) -> PyErr {
    let err = match errno {
        Some(n) => PyOSError::new_err((n, msg.to_owned())),
        None => return PyOSError::new_err(msg.to_owned()),
    };
    Python::attach(|py| {
        // Best effort: the exception is right without the attribute.
        let _ = err
            .value(py)
            .setattr("filename", path.to_string_lossy().into_owned());
    });
    err
}
