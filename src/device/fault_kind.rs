//! [`FaultKind`]: the failure modes the fault-injection backend
//! (`device::faults`, feature `testing`) injects. A leaf (it names nothing
//! of the crate), so that [`Error::InjectedFault`](crate::Error::InjectedFault)
//! can carry it in every build.

use std::fmt;

/// A failure mode to inject (the fault-injection backend,
/// `device::faults` (feature `testing`), re-exports it).
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
