//! The crate's error type.
//!
//! One enum, one variant per failure, each with its message beside it
//! (`#[error(...)]`); [`Error::kind`] sorts them into the few
//! [`ErrorKind`]s a caller decides on (retry after freeing memory, fall
//! back, report a bad file, raise the right Python exception). Every variant
//! says what failed and where (file, tensor, operation); messages are
//! lowercase and carry the underlying `source()` where there is one.
//!
//! The module sits at the bottom of the crate (with `dtype`). The data its
//! variants carry that belongs to another module lives in that module, in a
//! leaf file that names nothing of the crate ([`Fingerprint`] in
//! `convert::fingerprint`, [`VisibleDevices`] in `device`, `FaultKind` in
//! `device::fault_kind` (named `device::faults::FaultKind` with feature
//! `testing`)); `scripts/import-graph.py`
//! checks that those files stay leaves. Backend errors (the HIP runtime's,
//! the CUDA driver's) and the conv3d chain's report are boxed, so the enum
//! is the same in every build.
//!
//! [`Fingerprint`]: crate::convert::Fingerprint
//! [`VisibleDevices`]: crate::device::VisibleDevices

mod kind;
mod payload;
mod variants;

pub use kind::ErrorKind;
pub use payload::{NotFound, TensorRef};
pub use variants::Error;

/// A boxed error of a layer above this module or of a dependency (a
/// runtime's error code, the conv3d chain's report): a source to display
/// and, for the caller who knows its type, to downcast.
pub type BoxedSource = Box<dyn std::error::Error + Send + Sync + 'static>;

/// `"{path}: tensor {name:?}: "` for an error at a tensor, else nothing.
fn at(tensor: &Option<TensorRef>) -> String {
    tensor
        .as_ref()
        .map(|t| format!("{t}: "))
        .unwrap_or_default()
}

/// What an unsupported conversion at a tensor adds: read it as raw bytes.
fn raw_bytes_hint(tensor: &Option<TensorRef>) -> &'static str {
    if tensor.is_some() {
        " (read such a tensor as raw bytes)"
    } else {
        ""
    }
}

/// `" (tensor {name:?})"` for an error at a named tensor, else nothing.
fn tensor_note(tensor: &Option<String>) -> String {
    tensor
        .as_ref()
        .map(|t| format!(" (tensor {t:?})"))
        .unwrap_or_default()
}

/// `" {ordinal}"` when an ordinal was asked for, else nothing.
fn ordinal_note(ordinal: &Option<usize>) -> String {
    ordinal.map(|o| format!(" {o}")).unwrap_or_default()
}

/// The compiler's log on lines of its own, when it wrote one.
fn log_note(log: &str) -> String {
    if log.is_empty() {
        String::new()
    } else {
        format!("\n{log}")
    }
}

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
