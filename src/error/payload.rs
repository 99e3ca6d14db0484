//! The data of error variants that is the error's own: where a reader's
//! error happened ([`TensorRef`]) and the loader's list of places tried
//! ([`NotFound`], itself an error: the source of
//! [`Error::RuntimeNotFound`](super::Error::RuntimeNotFound)).

use std::fmt;
use std::path::PathBuf;

/// A tensor of a file: where a reader's error happened, for the variants
/// that operations other than reads also return
/// ([`Error::LengthMismatch`](super::Error::LengthMismatch),
/// [`Error::UnsupportedConversion`](super::Error::UnsupportedConversion)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRef {
    /// The file.
    pub path: PathBuf,
    /// The tensor's name.
    pub tensor: String,
}

impl TensorRef {
    /// The tensor `tensor` of the file `path`.
    pub fn new(path: impl Into<PathBuf>, tensor: impl Into<String>) -> TensorRef {
        TensorRef {
            path: path.into(),
            tensor: tensor.into(),
        }
    }
}

impl fmt::Display for TensorRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: tensor {:?}", self.path.display(), self.tensor)
    }
}

/// No place held a library that loads: every place tried, with why
/// (the library loader's error, `device::dynlib`'s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotFound {
    /// What the library is.
    pub what: String,
    /// `(place, why it did not load)` in the order tried.
    pub tried: Vec<(String, String)>,
}

impl fmt::Display for NotFound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} not found; tried ", self.what)?;
        for (i, (place, why)) in self.tried.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{place}: {why}")?;
        }
        Ok(())
    }
}

impl std::error::Error for NotFound {}
