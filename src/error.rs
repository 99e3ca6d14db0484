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
    /// A backend whose cargo feature is off in this build.
    #[error("{backend}: backend not built (enable the `{backend}` feature)")]
    BackendNotBuilt {
        /// The backend (`"hip"`, `"cuda"`).
        backend: &'static str,
    },

    /// The backend's runtime library could not be loaded.
    #[error("{backend}: runtime not available: {library} could not be loaded")]
    NoRuntime {
        /// The backend.
        backend: &'static str,
        /// The library looked for (`"libcuda"`, `"libnvrtc"`, `"libamdhip64"`).
        library: &'static str,
    },

    /// No device (or not the one asked for).
    #[error("{backend}: no device{}: {count} visible ({visible})", ordinal.map(|o| format!(" {o}")).unwrap_or_default())]
    NoDevice {
        /// The backend.
        backend: &'static str,
        /// The ordinal asked for (`None` when listing).
        ordinal: Option<usize>,
        /// How many devices the runtime reports.
        count: usize,
        /// The visibility variable in effect.
        visible: crate::device::VisibleDevices,
    },

    /// A device operation ran out of memory.
    #[error("{backend}: {op}: out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// The backend.
        backend: &'static str,
        /// The operation.
        op: &'static str,
        /// The size asked for.
        bytes: u64,
    },

    /// An element count whose size in bytes does not fit in `usize`.
    #[error("{op}: {elements} elements overflow the address space")]
    SizeOverflow {
        /// The operation.
        op: &'static str,
        /// The element count.
        elements: usize,
    },

    /// Buffers, streams or events of different devices in one operation.
    #[error("{op}: operands belong to different devices")]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
    },

    /// Event timing asked of an event that was never recorded.
    #[error("{op}: event not recorded")]
    EventNotRecorded {
        /// The operation.
        op: &'static str,
    },

    /// A device address not aligned for the element type asked for.
    #[error("{op}: address {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The operation.
        op: &'static str,
        /// The address.
        addr: u64,
        /// The alignment required.
        align: u64,
    },

    /// An element range outside a buffer.
    #[error("{op}: range {start}..{end} out of bounds for length {len}")]
    OutOfBounds {
        /// The operation.
        op: &'static str,
        /// Range start.
        start: usize,
        /// Range end (exclusive).
        end: usize,
        /// The buffer's length.
        len: usize,
    },

    /// No kernel code for this device (no code object for its gfx arch).
    #[error("{backend}: no kernels for {arch} in this build (built for: {built})")]
    KernelUnavailable {
        /// The backend.
        backend: &'static str,
        /// The device's architecture.
        arch: String,
        /// The architectures the build embeds, comma separated.
        built: String,
    },

    /// A CUDA driver call failed.
    #[cfg(feature = "cuda")]
    #[error("cuda: {op}: {source}")]
    Cuda {
        /// The driver call.
        op: &'static str,
        /// The driver's error (code and message).
        #[source]
        source: cudarc::driver::DriverError,
    },

    /// NVRTC could not compile the kernels.
    #[cfg(feature = "cuda")]
    #[error("cuda: nvrtc compile for {arch}: {source}")]
    Nvrtc {
        /// The target (`compute_90`).
        arch: String,
        /// NVRTC's error with its log.
        #[source]
        source: cudarc::nvrtc::CompileError,
    },

    /// A HIP runtime call failed.
    #[cfg(feature = "hip")]
    #[error("hip: {op}: {source}")]
    Hip {
        /// The runtime call.
        op: &'static str,
        /// The runtime's error (code and hipGetErrorString).
        #[source]
        source: crate::device::hip::HipError,
    },

    /// A failure injected by the fault-injection backend
    /// (`crate::device::faults`).
    #[error("{op}: injected fault: {fault}")]
    InjectedFault {
        /// The failure mode.
        fault: crate::device::faults::FaultKind,
        /// The backend operation hit.
        op: &'static str,
    },

    /// A device result whose fingerprint differs from the one the host
    /// computed from the source.
    #[error("{op}: verification failed on {device}: expected fingerprint {expected}, device gave {actual}")]
    VerificationFailed {
        /// The operation (`"convert bf16->f32"`).
        op: String,
        /// The device (`"cuda:0 sm_90"`).
        device: String,
        /// Fingerprint computed on the host.
        expected: crate::convert::Fingerprint,
        /// Fingerprint of the device's output.
        actual: crate::convert::Fingerprint,
    },

    /// A device kernel failed its self-test and the policy forbids the CPU
    /// fallback.
    #[error("{op}: the device kernel failed its self-test on {device} ({mismatches} of {tested} patterns wrong) and fallback is off")]
    KernelUntrusted {
        /// The conversion.
        op: String,
        /// The device.
        device: String,
        /// Patterns that differed from the CPU.
        mismatches: u64,
        /// Patterns tested.
        tested: u64,
    },
}
