//! [`Fingerprint`]: the value a fingerprint is. A leaf (it names nothing of
//! the crate), so that the error's variants can carry it.

use std::fmt;

/// A 64-bit buffer fingerprint (see the module's documentation for its
/// definition).
/// Equal buffers have equal fingerprints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint(pub u64);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}
