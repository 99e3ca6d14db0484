//! [`ErrorKind`]: the few classes of [`Error`] that callers decide on.

use std::fmt;

use super::Error;

/// What kind of failure an [`Error`] is: the class a caller decides on
/// without naming variants. The transfer ladder stops on [`ErrorKind::Io`]
/// and [`ErrorKind::Changed`] (no rung can read the file) and frees its
/// caches and retries on [`ErrorKind::OutOfMemory`]; the Python package
/// picks its exception class from it.
///
/// New kinds may be added; match with a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file is not a valid safetensors file or index: a malformed
    /// header, JSON, data layout or shard map, or a Git LFS pointer.
    InvalidFile,
    /// A file changed while it was being read (shrank, or its identity,
    /// size or modification time differs from when it was opened): the
    /// bytes read may mix old and new contents.
    Changed,
    /// The operating system failed an operation on a file, or a path
    /// names something that is not a regular file.
    Io,
    /// A tensor name that the file or checkpoint does not hold.
    NotFound,
    /// The caller's request is inconsistent: buffer lengths, dtypes,
    /// ranges, alignments, devices of operands, option values, conv3d
    /// shapes and parameters, a writer used out of order, an output that is
    /// an input.
    Usage,
    /// A request rocm-safe does not handle: a dtype conversion, a DLPack
    /// layout, a size beyond this platform's address space.
    Unsupported,
    /// What was asked for is not there: a backend not built, a runtime or
    /// vendor library not installed, no (permitted) device, kernels not
    /// built for this device, an operation this backend lacks, a runtime
    /// that the environment makes refuse every device.
    Unavailable,
    /// Memory ran out or would: a device or pinned allocation the runtime
    /// refused, a host buffer larger than RAM plus swap.
    OutOfMemory,
    /// A size or a result beyond what its type holds: an element count
    /// whose byte size overflows the address space, a conv3d whose exact
    /// result is beyond f32 although every input is finite.
    Overflow,
    /// A device, runtime or vendor library call failed (including faults
    /// injected in its place, and a conv3d call that no tier served).
    Device,
    /// A result failed its independent check: a fingerprint mismatch, a
    /// kernel that failed its self-test (with the CPU fallback off), a load
    /// whose rung failed a check with fallback off.
    Verification,
    /// The caller cancelled the operation (a writer's cancellation flag).
    Cancelled,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 12] = [
        ErrorKind::InvalidFile,
        ErrorKind::Changed,
        ErrorKind::Io,
        ErrorKind::NotFound,
        ErrorKind::Usage,
        ErrorKind::Unsupported,
        ErrorKind::Unavailable,
        ErrorKind::OutOfMemory,
        ErrorKind::Overflow,
        ErrorKind::Device,
        ErrorKind::Verification,
        ErrorKind::Cancelled,
    ];

    /// The kind's name in snake case (`"out_of_memory"`), as reports and
    /// the Python package write it.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidFile => "invalid_file",
            ErrorKind::Changed => "changed",
            ErrorKind::Io => "io",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Usage => "usage",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::OutOfMemory => "out_of_memory",
            ErrorKind::Overflow => "overflow",
            ErrorKind::Device => "device",
            ErrorKind::Verification => "verification",
            ErrorKind::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Error {
    /// The error's [`ErrorKind`]. A [`Error::TransferFailed`] has the kind
    /// of the error it carries, or [`ErrorKind::Verification`] when its rung
    /// failed a check rather than with an error.
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind as K;
        match self {
            Error::FileTooSmall { .. }
            | Error::LfsPointer { .. }
            | Error::HeaderTooLarge { .. }
            | Error::HeaderOutOfBounds { .. }
            | Error::HeaderNotUtf8 { .. }
            | Error::HeaderNotObject { .. }
            | Error::HeaderJson { .. }
            | Error::DuplicateKey { .. }
            | Error::InvalidMetadata { .. }
            | Error::InvalidTensorEntry { .. }
            | Error::UnknownDType { .. }
            | Error::InvalidTensorSize { .. }
            | Error::InvalidDataOffsets { .. }
            | Error::DataLayout { .. }
            | Error::InvalidIndex { .. }
            | Error::InvalidShardName { .. }
            | Error::TensorInTwoShards { .. }
            | Error::TensorNotInIndex { .. }
            | Error::MetadataConflict { .. } => K::InvalidFile,
            Error::FileShrunk { .. } | Error::FileChanged { .. } => K::Changed,
            Error::Io { .. } | Error::NotRegularFile { .. } => K::Io,
            Error::TensorNotFound { .. } => K::NotFound,
            Error::LengthMismatch { .. }
            | Error::DTypeMismatch { .. }
            | Error::NoRows { .. }
            | Error::SliceDim { .. }
            | Error::RowRange { .. }
            | Error::Writer { .. }
            | Error::WriterSize { .. }
            | Error::OutputIsInput { .. }
            | Error::OutputNotRegular { .. }
            | Error::DeviceMismatch { .. }
            | Error::EventNotRecorded { .. }
            | Error::Misaligned { .. }
            | Error::OutOfBounds { .. }
            | Error::Conv3dParam { .. }
            | Error::Conv3dShape { .. }
            | Error::Conv3dDType { .. }
            | Error::InvalidLoadOptions { .. }
            | Error::DlpackInvalid { .. } => K::Usage,
            Error::UnsupportedConversion { .. }
            | Error::TooLargeForPlatform { .. }
            | Error::DlpackUnsupported { .. } => K::Unsupported,
            Error::BackendNotBuilt { .. }
            | Error::NoRuntime { .. }
            | Error::RuntimeNotFound { .. }
            | Error::DevicePermission { .. }
            | Error::InvalidEnvironment { .. }
            | Error::NoDevice { .. }
            | Error::BackendUnsupported { .. }
            | Error::NoSuchDevice { .. }
            | Error::KernelUnavailable { .. }
            | Error::VendorUnavailable { .. } => K::Unavailable,
            Error::OutOfMemory { .. }
            | Error::AllocationFailed { .. }
            | Error::Conv3dTooLarge { .. } => K::OutOfMemory,
            Error::SizeOverflow { .. } | Error::Conv3dOverflow { .. } => K::Overflow,
            Error::RuntimeCall { .. }
            | Error::Nvrtc { .. }
            | Error::InjectedFault { .. }
            | Error::Conv3dTier { .. }
            | Error::Conv3dNoTier { .. }
            | Error::Conv3dCudnn { .. }
            | Error::Conv3dMiopen { .. } => K::Device,
            Error::VerificationFailed { .. } | Error::KernelUntrusted { .. } => K::Verification,
            Error::TransferFailed { source, .. } => {
                source.as_ref().map_or(K::Verification, |e| e.kind())
            }
            Error::Cancelled { .. } => K::Cancelled,
        }
    }

    /// [`Error::OutOfMemory`] for `op` of `bytes` on `backend` when `oom`
    /// (the runtime said so), else `other()`: how a backend reports a failed
    /// allocation, so that callers can tell memory pressure (retry, free
    /// caches, go down a ladder) from every other error.
    #[cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]
    pub(crate) fn or_out_of_memory(
        oom: bool,
        backend: &'static str,
        op: &'static str,
        bytes: usize,
        other: impl FnOnce() -> Error,
    ) -> Error {
        if oom {
            Error::OutOfMemory {
                backend,
                op,
                bytes: bytes as u64,
            }
        } else {
            other()
        }
    }
}

#[cfg(test)]
mod tests;
