//! `rocm_safe::Error` to Python exceptions.
//!
//! | library error | Python exception |
//! | --- | --- |
//! | [`Error::Io`] (and the I/O of a file that is not regular: a folder) | the `OSError` subclass of its errno (`FileNotFoundError`, `PermissionError`, `IsADirectoryError`, ...), `filename` set |
//! | [`Error::AllocationFailed`] | `MemoryError` |
//! | [`Error::BackendNotBuilt`], [`Error::NoRuntime`], [`Error::RuntimeNotFound`], [`Error::DevicePermission`], [`Error::NoDevice`], ... (devices) | `RuntimeError` |
//! | everything else: malformed headers and indexes, our stricter checks (duplicate keys, LFS pointers, overlapping data), missing tensors, files changed while read, writer refusals | `rocm_safe.SafetensorError` |
//!
//! The message is always the library's: it names the file and, where there
//! is one, the tensor.

use pyo3::exceptions::{PyMemoryError, PyOSError, PyRuntimeError};
use pyo3::prelude::*;

use rocm_safe::Error;

// `rocm_safe._errors.SafetensorError`: defined in Python so that it derives
// from the `safetensors` package's exception where that is installed
// (`except safetensors.SafetensorError` keeps working); imported when first
// raised or registered.
pyo3::import_exception!(rocm_safe._errors, SafetensorError);

/// The Python exception for a library error (see the module docs).
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
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
                "folder" => Some(libc_errno::EISDIR),
                _ => Some(libc_errno::ENODEV),
            };
            os_error(&msg, errno, &path)
        }
        Error::AllocationFailed { .. } => PyMemoryError::new_err(msg),
        Error::BackendNotBuilt { .. }
        | Error::NoRuntime { .. }
        | Error::RuntimeNotFound { .. }
        | Error::DevicePermission { .. }
        | Error::InvalidEnvironment { .. }
        | Error::NoDevice { .. }
        | Error::NoSuchDevice { .. }
        | Error::BackendUnsupported { .. }
        | Error::OutOfMemory { .. }
        | Error::KernelUnavailable { .. } => PyRuntimeError::new_err(msg),
        _ => SafetensorError::new_err(msg),
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
