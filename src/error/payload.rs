//! The data some variants carry: small types that the modules above the
//! error (`convert`, `device`, `conv3d_chain`) also use and re-export under
//! their own paths. They live here so that the error module names nothing
//! above it (see ARCHITECTURE.md, "Layer order").

use std::fmt;
use std::path::PathBuf;

/// A 64-bit buffer fingerprint (defined in `convert::fingerprint`, which
/// re-exports it).
/// Equal buffers have equal fingerprints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Fingerprint(pub u64);

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

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
/// (`device::dynlib`, re-exported there).
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

/// A failure mode to inject (the fault-injection backend,
/// `device::faults` (feature `testing`), re-exported there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum FaultKind {
    /// A host-to-device copy lands zeros.
    CopyLandsZeros,
    /// A host-to-device copy is lost; the destination keeps stale data.
    CopyLandsStale,
    /// A host-to-device copy fails with "invalid value".
    InvalidValueOnCopy,
    /// A host-to-device copy lands, but a chunk of it is garbage.
    CopyLandsGarbage,
    /// A conversion kernel writes zeros.
    ConvertWritesZeros,
    /// A device allocation runs out of memory.
    OutOfMemoryOnAlloc,
    /// A pinned host allocation runs out of memory.
    OutOfMemoryOnPinned,
    /// A kernel launch fails.
    LaunchFailure,
    /// Freeing memory or destroying a stream or event fails (and leaks).
    TeardownFailure,
    /// A conv3d kernel or vendor call fails.
    Conv3dLaunchFailure,
    /// A conv3d kernel or vendor call writes zeros.
    Conv3dWritesZeros,
    /// A conv3d kernel or vendor call writes garbage (finite values).
    Conv3dWritesGarbage,
    /// A conv3d kernel or vendor call writes a NaN.
    Conv3dWritesNonFinite,
    /// The vendor library finds no algorithm for a conv3d (forward or
    /// backward).
    VendorNoAlgorithm,
    /// The conv3d chain's device check (`device::KernelOp::Conv3dCheck`) fails.
    Conv3dCheckFailure,
    /// A conv3d backward kernel (`device::KernelOp::Conv3dBackward`), a
    /// vendor backward call (`device::KernelOp::Conv3dBackwardVendor`), or
    /// the tiled tier's `device::KernelOp::Conv3dBackwardWeightTiled`,
    /// `device::KernelOp::Conv3dFlipWeight` and
    /// `device::KernelOp::Conv3dZeroInsert` fails.
    Conv3dBackwardLaunchFailure,
    /// A conv3d backward kernel, vendor backward call, weight flip or zero
    /// insertion writes garbage (finite values).
    Conv3dBackwardWritesGarbage,
    /// A conv3d backward kernel, vendor backward call, weight flip or zero
    /// insertion writes a NaN.
    Conv3dBackwardWritesNonFinite,
    /// A small host-to-device copy (at most 64 KiB) is lost and reads back
    /// as zeros: the gfx11 staging failure, whose lost copies are the
    /// odd-numbered ones (a rule of `When::EveryNth(2)`).
    SmallCopyLost,
    /// A host-to-device copy lands, then a range of it (at most 4 KiB, at a
    /// seeded place) reads back as zeros.
    CopyZeroedRange,
    /// A device-to-host copy arrives in part: only the bytes below its last
    /// 4 GiB boundary land (copies of 4 GiB or less: the first half, the
    /// same failure at a size a test can afford).
    DownloadTruncated,
    /// A copy (either direction) of more than 1 MiB fails with "invalid
    /// value", as large copies do after a refused registration.
    InvalidValueOnLargeCopy,
    /// A pinned allocation (a host registration) is refused and leaves a
    /// sticky error that the next runtime call returns once, as HIP 7 does
    /// until the error is read.
    PinnedRefusedSticky,
    /// A read-only registration of mapped file pages (the loader's direct
    /// path, `Driver::register_read_only`) is refused, as where the
    /// runtime lacks the flag or the file system will not pin its pages.
    RegistrationRefused,
}

#[cfg(any(test, feature = "testing"))]
impl FaultKind {
    pub(crate) const ALL: [FaultKind; 24] = [
        FaultKind::CopyLandsZeros,
        FaultKind::CopyLandsGarbage,
        FaultKind::CopyLandsStale,
        FaultKind::InvalidValueOnCopy,
        FaultKind::ConvertWritesZeros,
        FaultKind::OutOfMemoryOnAlloc,
        FaultKind::OutOfMemoryOnPinned,
        FaultKind::LaunchFailure,
        FaultKind::TeardownFailure,
        FaultKind::Conv3dLaunchFailure,
        FaultKind::Conv3dWritesZeros,
        FaultKind::Conv3dWritesGarbage,
        FaultKind::Conv3dWritesNonFinite,
        FaultKind::VendorNoAlgorithm,
        FaultKind::Conv3dCheckFailure,
        FaultKind::Conv3dBackwardLaunchFailure,
        FaultKind::Conv3dBackwardWritesGarbage,
        FaultKind::Conv3dBackwardWritesNonFinite,
        FaultKind::SmallCopyLost,
        FaultKind::CopyZeroedRange,
        FaultKind::DownloadTruncated,
        FaultKind::InvalidValueOnLargeCopy,
        FaultKind::PinnedRefusedSticky,
        FaultKind::RegistrationRefused,
    ];

    pub(crate) fn index(self) -> usize {
        Self::ALL.iter().position(|k| *k == self).unwrap_or(0)
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            FaultKind::CopyLandsZeros => "copy lands zeros",
            FaultKind::CopyLandsStale => "copy lands stale data",
            FaultKind::InvalidValueOnCopy => "invalid value on copy",
            FaultKind::CopyLandsGarbage => "copy lands a garbage chunk",
            FaultKind::ConvertWritesZeros => "conversion writes zeros",
            FaultKind::OutOfMemoryOnAlloc => "out of memory on allocation",
            FaultKind::OutOfMemoryOnPinned => "out of memory on pinned allocation",
            FaultKind::LaunchFailure => "kernel launch failure",
            FaultKind::TeardownFailure => "teardown failure",
            FaultKind::Conv3dLaunchFailure => "conv3d launch failure",
            FaultKind::Conv3dWritesZeros => "conv3d writes zeros",
            FaultKind::Conv3dWritesGarbage => "conv3d writes garbage",
            FaultKind::Conv3dWritesNonFinite => "conv3d writes a nan",
            FaultKind::VendorNoAlgorithm => "vendor library finds no algorithm",
            FaultKind::Conv3dCheckFailure => "conv3d check failure",
            FaultKind::Conv3dBackwardLaunchFailure => "conv3d backward launch failure",
            FaultKind::Conv3dBackwardWritesGarbage => "conv3d backward writes garbage",
            FaultKind::Conv3dBackwardWritesNonFinite => "conv3d backward writes a nan",
            FaultKind::SmallCopyLost => "small copy lost (reads back as zeros)",
            FaultKind::CopyZeroedRange => "copy lands with a zeroed range",
            FaultKind::DownloadTruncated => "download truncated at a 4 GiB boundary",
            FaultKind::InvalidValueOnLargeCopy => "invalid value on a copy over 1 MiB",
            FaultKind::PinnedRefusedSticky => "pinned registration refused, sticky error left",
            FaultKind::RegistrationRefused => "read-only registration refused",
        };
        f.write_str(s)
    }
}

/// The device-visibility variable in effect for a backend, and what one
/// ordinal maps to under it (`HIP_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`:
/// the runtimes apply them; this only reports which physical device an
/// ordinal maps to). Re-exported as `device::VisibleDevices`.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct VisibleDevices {
    /// The variable the runtime reads (`HIP_VISIBLE_DEVICES`,
    /// `CUDA_VISIBLE_DEVICES`), or empty for the host backend.
    pub var: &'static str,
    /// Its value, when set.
    pub value: Option<String>,
    /// The entry of the list the ordinal maps to (a physical index or UUID),
    /// when the variable is set and has that many entries.
    pub physical: Option<String>,
}

impl VisibleDevices {
    /// No visibility variable (host backend).
    pub fn none() -> VisibleDevices {
        VisibleDevices::default()
    }

    /// Reads `var` and maps `ordinal` to its entry (comma separated, blanks
    /// trimmed). Only `var` is reported: HIP also applies
    /// `ROCR_VISIBLE_DEVICES` below it, which this does not model.
    pub fn read(var: &'static str, ordinal: Option<usize>) -> VisibleDevices {
        let value = std::env::var(var).ok();
        let physical = match (&value, ordinal) {
            (Some(v), Some(i)) => v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .nth(i)
                .map(str::to_owned),
            _ => None,
        };
        VisibleDevices {
            var,
            value,
            physical,
        }
    }
}

impl fmt::Display for VisibleDevices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.var.is_empty() {
            return f.write_str("no visibility variable");
        }
        match (&self.value, &self.physical) {
            (None, _) => write!(f, "{} unset", self.var),
            (Some(v), Some(p)) => write!(f, "{}={v:?}, maps to {p}", self.var),
            (Some(v), None) => write!(f, "{}={v:?}", self.var),
        }
    }
}
