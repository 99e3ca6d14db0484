//! The crate's error type.
//!
//! One enum, one variant per failure kind. Every variant says what failed and
//! where (file, tensor, operation); messages are lowercase and carry the
//! underlying `source()` where there is one.

use std::path::PathBuf;

use crate::dtype::DType;

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in rocm-safe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ----- general -------------------------------------------------------
    /// A buffer handed to an operation has the wrong length.
    #[error("{op}: length mismatch: expected {expected}, got {actual}")]
    LengthMismatch {
        /// The operation that checked the length.
        op: &'static str,
        /// The length it needed (in the operation's unit: elements or bytes).
        expected: usize,
        /// The length it got.
        actual: usize,
    },

    /// A conversion between two dtypes that rocm-safe does not convert.
    #[error("{op}: cannot convert {from} to {to}")]
    UnsupportedConversion {
        /// The operation asked to convert.
        op: &'static str,
        /// Source dtype.
        from: DType,
        /// Requested dtype.
        to: DType,
    },

    /// An I/O operation on a file failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`"open"`, `"read header"`, ...).
        op: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    // ----- safetensors reader (src/safetensors) ----------------------------
    // ----- devices (src/device) -------------------------------------------
}
