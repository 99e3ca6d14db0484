//! The crate's error type.
//!
//! One enum, one variant per failure; [`Error::kind`] sorts them into the
//! few [`ErrorKind`]s a caller decides on (retry after freeing memory, fall
//! back, report a bad file, raise the right Python exception). Every variant
//! says what failed and where (file, tensor, operation); messages are
//! lowercase and carry the underlying `source()` where there is one.
//!
//! The module sits at the bottom of the crate (with `dtype`): it names no
//! module above it. The data its variants carry that upper modules also use
//! is defined here and re-exported under the upper modules' paths ([`Fingerprint`] as `convert::Fingerprint`,
//! [`FaultKind`] as `device::faults::FaultKind`, [`VisibleDevices`] as
//! `device::VisibleDevices`, [`NotFound`] as `device::dynlib::NotFound`);
//! backend errors (the HIP runtime's, the CUDA driver's) and the conv3d
//! chain's report are boxed, so the enum is the same in every build.

mod display;
mod kind;
mod payload;
mod variants;

pub use kind::ErrorKind;
pub use payload::{FaultKind, Fingerprint, NotFound, TensorRef, VisibleDevices};
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

/// Result alias used throughout the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
