//! Thin `Result`-returning wrappers over the HIP runtime's functions
//! (`sys::Api`), grouped by topic, each a single runtime call;
//! raw handles in, raw handles out (the backend in `mod.rs` owns them).
//!
//! **Every failure is cleared.** HIP 7 keeps a failed call's code as the
//! thread's "last error" until `hipGetLastError` reads it, so an error
//! rocm-safe handles itself (an out-of-memory it retries after freeing, a
//! `hipHostRegister` the pinned ring does without) would otherwise surface
//! in the caller's next check (PyTorch's kernel-launch check reports it as
//! its own failure). `check` calls `hipGetLastError` after every failed
//! call, so the failure reaches the caller only as this crate's
//! [`crate::Error`] value. A last error that was already pending before
//! the call (someone else's) is left alone when the call succeeds.

use std::ffi::{c_uint, c_void, CStr};

use super::sys::{self, Api, Event, Function, MemcpyKind, Module, Status, Stream};

/// A HIP runtime error code (`hipError_t`), kept as its number: a code this
/// crate does not know (a newer runtime's) prints its number, and is never
/// undefined behaviour. [`HipError::CODES`] names every code of HIP 5.4 to
/// 7.14 (the constants below; checked against the headers by the tests).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct HipError(pub u32);

macro_rules! hip_error_codes {
    ($($konst:ident = $value:literal, $name:literal $(, $note:literal)?;)*) => {
        impl HipError {
            $(
                #[doc = concat!("`", $name, "` (", stringify!($value), ")" $(, ", ", $note)?, ".")]
                pub const $konst: HipError = HipError($value);
            )*

            /// Every code's C name, deprecated aliases after their code's
            /// name (so [`HipError::name`] finds the current one first).
            pub const CODES: &'static [(u32, &'static str)] = &[$(($value, $name)),*];
        }
    };
}

hip_error_codes! {
    SUCCESS = 0, "hipSuccess";
    INVALID_VALUE = 1, "hipErrorInvalidValue";
    OUT_OF_MEMORY = 2, "hipErrorOutOfMemory";
    MEMORY_ALLOCATION = 2, "hipErrorMemoryAllocation", "a deprecated name for the same code";
    NOT_INITIALIZED = 3, "hipErrorNotInitialized";
    INITIALIZATION_ERROR = 3, "hipErrorInitializationError", "a deprecated name for the same code";
    DEINITIALIZED = 4, "hipErrorDeinitialized";
    PROFILER_DISABLED = 5, "hipErrorProfilerDisabled";
    PROFILER_NOT_INITIALIZED = 6, "hipErrorProfilerNotInitialized";
    PROFILER_ALREADY_STARTED = 7, "hipErrorProfilerAlreadyStarted";
    PROFILER_ALREADY_STOPPED = 8, "hipErrorProfilerAlreadyStopped";
    INVALID_CONFIGURATION = 9, "hipErrorInvalidConfiguration";
    INVALID_PITCH_VALUE = 12, "hipErrorInvalidPitchValue";
    INVALID_SYMBOL = 13, "hipErrorInvalidSymbol";
    INVALID_DEVICE_POINTER = 17, "hipErrorInvalidDevicePointer";
    INVALID_MEMCPY_DIRECTION = 21, "hipErrorInvalidMemcpyDirection";
    INSUFFICIENT_DRIVER = 35, "hipErrorInsufficientDriver";
    MISSING_CONFIGURATION = 52, "hipErrorMissingConfiguration";
    PRIOR_LAUNCH_FAILURE = 53, "hipErrorPriorLaunchFailure";
    INVALID_DEVICE_FUNCTION = 98, "hipErrorInvalidDeviceFunction";
    NO_DEVICE = 100, "hipErrorNoDevice";
    INVALID_DEVICE = 101, "hipErrorInvalidDevice";
    INVALID_IMAGE = 200, "hipErrorInvalidImage";
    INVALID_CONTEXT = 201, "hipErrorInvalidContext";
    CONTEXT_ALREADY_CURRENT = 202, "hipErrorContextAlreadyCurrent";
    MAP_FAILED = 205, "hipErrorMapFailed";
    MAP_BUFFER_OBJECT_FAILED = 205, "hipErrorMapBufferObjectFailed", "a deprecated name for the same code";
    UNMAP_FAILED = 206, "hipErrorUnmapFailed";
    ARRAY_IS_MAPPED = 207, "hipErrorArrayIsMapped";
    ALREADY_MAPPED = 208, "hipErrorAlreadyMapped";
    NO_BINARY_FOR_GPU = 209, "hipErrorNoBinaryForGpu";
    ALREADY_ACQUIRED = 210, "hipErrorAlreadyAcquired";
    NOT_MAPPED = 211, "hipErrorNotMapped";
    NOT_MAPPED_AS_ARRAY = 212, "hipErrorNotMappedAsArray";
    NOT_MAPPED_AS_POINTER = 213, "hipErrorNotMappedAsPointer";
    ECC_NOT_CORRECTABLE = 214, "hipErrorECCNotCorrectable";
    UNSUPPORTED_LIMIT = 215, "hipErrorUnsupportedLimit";
    CONTEXT_ALREADY_IN_USE = 216, "hipErrorContextAlreadyInUse";
    PEER_ACCESS_UNSUPPORTED = 217, "hipErrorPeerAccessUnsupported";
    INVALID_KERNEL_FILE = 218, "hipErrorInvalidKernelFile";
    INVALID_GRAPHICS_CONTEXT = 219, "hipErrorInvalidGraphicsContext";
    INVALID_SOURCE = 300, "hipErrorInvalidSource";
    FILE_NOT_FOUND = 301, "hipErrorFileNotFound";
    SHARED_OBJECT_SYMBOL_NOT_FOUND = 302, "hipErrorSharedObjectSymbolNotFound";
    SHARED_OBJECT_INIT_FAILED = 303, "hipErrorSharedObjectInitFailed";
    OPERATING_SYSTEM = 304, "hipErrorOperatingSystem";
    INVALID_HANDLE = 400, "hipErrorInvalidHandle";
    INVALID_RESOURCE_HANDLE = 400, "hipErrorInvalidResourceHandle", "a deprecated name for the same code";
    ILLEGAL_STATE = 401, "hipErrorIllegalState";
    NOT_FOUND = 500, "hipErrorNotFound";
    NOT_READY = 600, "hipErrorNotReady";
    ILLEGAL_ADDRESS = 700, "hipErrorIllegalAddress";
    LAUNCH_OUT_OF_RESOURCES = 701, "hipErrorLaunchOutOfResources";
    LAUNCH_TIME_OUT = 702, "hipErrorLaunchTimeOut";
    PEER_ACCESS_ALREADY_ENABLED = 704, "hipErrorPeerAccessAlreadyEnabled";
    PEER_ACCESS_NOT_ENABLED = 705, "hipErrorPeerAccessNotEnabled";
    SET_ON_ACTIVE_PROCESS = 708, "hipErrorSetOnActiveProcess";
    CONTEXT_IS_DESTROYED = 709, "hipErrorContextIsDestroyed";
    ASSERT = 710, "hipErrorAssert";
    HOST_MEMORY_ALREADY_REGISTERED = 712, "hipErrorHostMemoryAlreadyRegistered";
    HOST_MEMORY_NOT_REGISTERED = 713, "hipErrorHostMemoryNotRegistered";
    LAUNCH_FAILURE = 719, "hipErrorLaunchFailure";
    COOPERATIVE_LAUNCH_TOO_LARGE = 720, "hipErrorCooperativeLaunchTooLarge";
    NOT_SUPPORTED = 801, "hipErrorNotSupported";
    STREAM_CAPTURE_UNSUPPORTED = 900, "hipErrorStreamCaptureUnsupported";
    STREAM_CAPTURE_INVALIDATED = 901, "hipErrorStreamCaptureInvalidated";
    STREAM_CAPTURE_MERGE = 902, "hipErrorStreamCaptureMerge";
    STREAM_CAPTURE_UNMATCHED = 903, "hipErrorStreamCaptureUnmatched";
    STREAM_CAPTURE_UNJOINED = 904, "hipErrorStreamCaptureUnjoined";
    STREAM_CAPTURE_ISOLATION = 905, "hipErrorStreamCaptureIsolation";
    STREAM_CAPTURE_IMPLICIT = 906, "hipErrorStreamCaptureImplicit";
    CAPTURED_EVENT = 907, "hipErrorCapturedEvent";
    STREAM_CAPTURE_WRONG_THREAD = 908, "hipErrorStreamCaptureWrongThread";
    GRAPH_EXEC_UPDATE_FAILURE = 910, "hipErrorGraphExecUpdateFailure";
    INVALID_CHANNEL_DESCRIPTOR = 911, "hipErrorInvalidChannelDescriptor";
    INVALID_TEXTURE = 912, "hipErrorInvalidTexture";
    INVALID_RESOURCE_TYPE = 914, "hipErrorInvalidResourceType";
    INVALID_RESOURCE_CONFIGURATION = 915, "hipErrorInvalidResourceConfiguration";
    STREAM_DETACHED = 916, "hipErrorStreamDetached";
    UNKNOWN = 999, "hipErrorUnknown";
    RUNTIME_MEMORY = 1052, "hipErrorRuntimeMemory";
    RUNTIME_OTHER = 1053, "hipErrorRuntimeOther";
    INVALID_CLUSTER_SIZE = 1054, "hipErrorInvalidClusterSize";
    TBD = 1055, "hipErrorTbd";
}

impl HipError {
    /// The code's C name (`"hipErrorOutOfMemory"`), `None` for a code no
    /// header up to HIP 7.14 defines. 1054 is `hipErrorInvalidClusterSize`
    /// (HIP 7.14; before, the `hipErrorTbd` end marker, never returned).
    pub fn name(&self) -> Option<&'static str> {
        Self::CODES
            .iter()
            .find(|(v, _)| *v == self.0)
            .map(|(_, n)| *n)
    }

    /// The runtime's own message (`hipGetErrorString`), when a runtime is
    /// loaded and has one.
    pub fn message(&self) -> Option<String> {
        let api = super::loader::api().ok()?;
        // SAFETY: hipGetErrorString takes any code (an unknown one gives
        // its "unknown" string) and returns null or a static NUL-terminated
        // string.
        let p = unsafe { (api.hipGetErrorString)(self.0) };
        if p.is_null() {
            return None;
        }
        // SAFETY: non-null, NUL-terminated and static (above).
        let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
        (!text.is_empty()).then_some(text)
    }
}

impl std::fmt::Debug for HipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "HipError({n} = {})", self.0),
            None => write!(f, "HipError({})", self.0),
        }
    }
}

impl std::fmt::Display for HipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} ({})", self.0)?,
            None => write!(f, "unknown hipError_t {}", self.0)?,
        }
        match self.message() {
            Some(m) => write!(f, ": {m}"),
            None => Ok(()),
        }
    }
}

impl std::error::Error for HipError {}

/// `Ok(())` for `hipSuccess`; otherwise the error, after clearing it from
/// the runtime's per-thread last error (`hipGetLastError`, module docs).
pub(crate) fn check(api: &Api, status: Status) -> Result<(), HipError> {
    if status == HipError::SUCCESS.0 {
        return Ok(());
    }
    clear_last_error(api);
    Err(HipError(status))
}

/// Reads (and so resets) the calling thread's last HIP error.
pub(crate) fn clear_last_error(api: &Api) {
    // SAFETY: hipGetLastError takes no arguments and only reads and resets
    // the thread's last error. Its value is the failure just handled.
    let _ = unsafe { (api.hipGetLastError)() };
}

/// Devices.
pub mod device {
    use super::*;

    /// `hipGetDeviceCount`.
    pub(crate) fn count(api: &Api) -> Result<i32, HipError> {
        let mut n = 0i32;
        // SAFETY: writes one int.
        check(api, unsafe { (api.hipGetDeviceCount)(&mut n) })?;
        Ok(n)
    }

    /// `hipSetDevice` (the calling thread's current device).
    pub(crate) fn set(api: &Api, ordinal: i32) -> Result<(), HipError> {
        // SAFETY: plain call; an invalid ordinal is an error code.
        check(api, unsafe { (api.hipSetDevice)(ordinal) })
    }

    /// `hipDeviceSynchronize` on the current device.
    pub(crate) fn synchronize(api: &Api) -> Result<(), HipError> {
        // SAFETY: plain call.
        check(api, unsafe { (api.hipDeviceSynchronize)() })
    }

    /// `hipDeviceGetName`.
    pub(crate) fn name(api: &Api, ordinal: i32) -> Result<String, HipError> {
        let mut buf = [0 as std::ffi::c_char; 256];
        // The last byte stays 0 whatever the runtime writes.
        let len = (buf.len() - 1) as i32;
        // SAFETY: the runtime writes at most `len` bytes.
        check(api, unsafe {
            (api.hipDeviceGetName)(buf.as_mut_ptr(), len, ordinal)
        })?;
        // SAFETY: NUL-terminated within the buffer (its last byte is 0).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// `hipDeviceTotalMem`.
    pub(crate) fn total_mem(api: &Api, ordinal: i32) -> Result<usize, HipError> {
        let mut b = 0usize;
        // SAFETY: writes one size_t.
        check(api, unsafe { (api.hipDeviceTotalMem)(&mut b, ordinal) })?;
        Ok(b)
    }

    /// `hipDeviceGetPCIBusId`: `"dddd:bb:dd.f"`.
    pub(crate) fn pci_bus_id(api: &Api, ordinal: i32) -> Result<String, HipError> {
        let mut buf = [0 as std::ffi::c_char; 64];
        let len = (buf.len() - 1) as i32;
        // SAFETY: writes at most `len` bytes.
        check(api, unsafe {
            (api.hipDeviceGetPCIBusId)(buf.as_mut_ptr(), len, ordinal)
        })?;
        // SAFETY: NUL-terminated within the buffer (its last byte is 0).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }
}

/// Memory.
pub mod memory {
    use super::*;

    /// `hipMalloc`.
    pub(crate) fn malloc(api: &Api, bytes: usize) -> Result<*mut c_void, HipError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check(api, unsafe { (api.hipMalloc)(&mut p, bytes) })?;
        Ok(p)
    }

    /// `hipFree`.
    ///
    /// # Safety
    /// `p` came from `malloc` and is freed once.
    pub(crate) unsafe fn free(api: &Api, p: *mut c_void) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipFree)(p) })
    }

    /// `hipHostMalloc` (pinned, default flags).
    pub(crate) fn host_malloc(api: &Api, bytes: usize) -> Result<*mut c_void, HipError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        check(api, unsafe { (api.hipHostMalloc)(&mut p, bytes, 0) })?;
        Ok(p)
    }

    /// `hipHostRegister` (default flags).
    ///
    /// # Safety
    /// `p..p + bytes` stays mapped until `host_unregister`.
    pub(crate) unsafe fn host_register(
        api: &Api,
        p: *mut c_void,
        bytes: usize,
    ) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipHostRegister)(p, bytes, 0) })
    }

    /// `hipHostRegisterPortable | hipHostRegisterReadOnly` (0x1 | 0x8, the
    /// `hipHostRegisterFlags` of `hip_runtime_api.h` in ROCm 6.x and 7.x).
    pub(crate) const REGISTER_READ_ONLY: c_uint = 0x1 | 0x8;

    /// `hipHostRegister` with `flags`.
    ///
    /// # Safety
    /// `p..p + bytes` stays mapped until `host_unregister`.
    pub(crate) unsafe fn host_register_flags(
        api: &Api,
        p: *mut c_void,
        bytes: usize,
        flags: c_uint,
    ) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipHostRegister)(p, bytes, flags) })
    }

    /// `hipHostUnregister`.
    ///
    /// # Safety
    /// `p` came from `host_register` and is unregistered once.
    pub(crate) unsafe fn host_unregister(api: &Api, p: *mut c_void) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipHostUnregister)(p) })
    }

    /// `hipHostFree`.
    ///
    /// # Safety
    /// `p` came from `host_malloc` and is freed once.
    pub(crate) unsafe fn host_free(api: &Api, p: *mut c_void) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipHostFree)(p) })
    }

    /// `hipMemcpyAsync`.
    ///
    /// # Safety
    /// Both ranges are valid for `bytes` until the stream reaches the copy.
    pub(crate) unsafe fn copy_async(
        api: &Api,
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: MemcpyKind,
        stream: Stream,
    ) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe {
            (api.hipMemcpyAsync)(dst, src, bytes, kind, stream)
        })
    }

    /// `hipMemsetAsync` to zero.
    ///
    /// # Safety
    /// `dst` is valid device memory for `bytes`.
    pub(crate) unsafe fn zero_async(
        api: &Api,
        dst: *mut c_void,
        bytes: usize,
        stream: Stream,
    ) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipMemsetAsync)(dst, 0, bytes, stream) })
    }
}

/// Memory figures and versions (diagnostics).
pub mod info {
    use super::*;

    /// `hipMemGetInfo` on the current device: `(free, total)` bytes.
    pub(crate) fn mem_get_info(api: &Api) -> Result<(usize, usize), HipError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        check(api, unsafe { (api.hipMemGetInfo)(&mut free, &mut total) })?;
        Ok((free, total))
    }

    /// `hipRuntimeGetVersion` (`HIP_VERSION`: major * 10^7 + minor * 10^5 +
    /// patch). Touches no device.
    pub(crate) fn runtime_version(api: &Api) -> Result<i32, HipError> {
        let mut v = 0i32;
        // SAFETY: writes one int.
        check(api, unsafe { (api.hipRuntimeGetVersion)(&mut v) })?;
        Ok(v)
    }

    /// `hipDriverGetVersion`.
    ///
    /// # Safety
    /// At least one device must be present: HIP 5.x reads the first device
    /// without checking that there is one.
    pub(crate) unsafe fn driver_version(api: &Api) -> Result<i32, HipError> {
        let mut v = 0i32;
        // SAFETY: writes one int; the caller guarantees a device.
        check(api, unsafe { (api.hipDriverGetVersion)(&mut v) })?;
        Ok(v)
    }
}

/// Streams.
pub mod stream {
    use super::*;

    /// `hipStreamCreateWithFlags(hipStreamNonBlocking)`.
    pub(crate) fn create(api: &Api) -> Result<Stream, HipError> {
        let mut s: Stream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(api, unsafe {
            (api.hipStreamCreateWithFlags)(&mut s, sys::STREAM_NON_BLOCKING)
        })?;
        Ok(s)
    }

    /// `hipStreamDestroy`.
    ///
    /// # Safety
    /// `s` is live and destroyed once.
    pub(crate) unsafe fn destroy(api: &Api, s: Stream) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipStreamDestroy)(s) })
    }

    /// `hipStreamSynchronize`.
    ///
    /// # Safety
    /// `s` is live.
    pub(crate) unsafe fn synchronize(api: &Api, s: Stream) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipStreamSynchronize)(s) })
    }

    /// `hipStreamWaitEvent`.
    ///
    /// # Safety
    /// Both handles are live.
    pub(crate) unsafe fn wait_event(api: &Api, s: Stream, e: Event) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipStreamWaitEvent)(s, e, 0) })
    }
}

/// Events.
pub mod event {
    use super::*;

    /// `hipEventCreateWithFlags(hipEventDefault)`.
    pub(crate) fn create(api: &Api) -> Result<Event, HipError> {
        let mut e: Event = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check(api, unsafe {
            (api.hipEventCreateWithFlags)(&mut e, sys::EVENT_DEFAULT)
        })?;
        Ok(e)
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// `e` is live and destroyed once.
    pub(crate) unsafe fn destroy(api: &Api, e: Event) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipEventDestroy)(e) })
    }

    /// `hipEventRecord`.
    ///
    /// # Safety
    /// Both handles are live.
    pub(crate) unsafe fn record(api: &Api, e: Event, s: Stream) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipEventRecord)(e, s) })
    }

    /// `hipEventSynchronize`.
    ///
    /// # Safety
    /// `e` is live.
    pub(crate) unsafe fn synchronize(api: &Api, e: Event) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipEventSynchronize)(e) })
    }

    /// `hipEventElapsedTime`.
    ///
    /// # Safety
    /// Both handles are live.
    pub(crate) unsafe fn elapsed(api: &Api, a: Event, b: Event) -> Result<f32, HipError> {
        let mut ms = 0f32;
        // SAFETY: caller; writes one float.
        check(api, unsafe { (api.hipEventElapsedTime)(&mut ms, a, b) })?;
        Ok(ms)
    }
}

/// Modules and launches.
pub mod module {
    use super::*;

    /// `hipModuleLoadData`.
    ///
    /// # Safety
    /// `image` points to a complete code object that outlives the call.
    pub(crate) unsafe fn load_data(api: &Api, image: *const c_void) -> Result<Module, HipError> {
        let mut m: Module = std::ptr::null_mut();
        // SAFETY: caller; writes one handle.
        check(api, unsafe { (api.hipModuleLoadData)(&mut m, image) })?;
        Ok(m)
    }

    /// `hipModuleUnload`.
    ///
    /// # Safety
    /// `m` is loaded and unloaded once; no function of it is used after.
    pub(crate) unsafe fn unload(api: &Api, m: Module) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe { (api.hipModuleUnload)(m) })
    }

    /// `hipModuleGetFunction`.
    ///
    /// # Safety
    /// `m` is loaded.
    pub(crate) unsafe fn get_function(
        api: &Api,
        m: Module,
        name: &CStr,
    ) -> Result<Function, HipError> {
        let mut f: Function = std::ptr::null_mut();
        // SAFETY: caller; `name` is NUL-terminated; writes one handle.
        check(api, unsafe {
            (api.hipModuleGetFunction)(&mut f, m, name.as_ptr())
        })?;
        Ok(f)
    }

    /// `hipModuleLaunchKernel` with a 3-D grid of 1-D blocks.
    ///
    /// # Safety
    /// `f` is a function of a loaded module; `params` point to live values
    /// of its parameter types; the memory they reference is valid for the
    /// kernel's accesses until the stream reaches it; `shared_bytes` is what
    /// the kernel needs beyond its static shared memory.
    pub(crate) unsafe fn launch(
        api: &Api,
        f: Function,
        grid: [u32; 3],
        block: u32,
        shared_bytes: u32,
        stream: Stream,
        params: &mut [*mut c_void],
    ) -> Result<(), HipError> {
        // SAFETY: caller.
        check(api, unsafe {
            (api.hipModuleLaunchKernel)(
                f,
                grid[0],
                grid[1],
                grid[2],
                block,
                1,
                1,
                shared_bytes,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_print_their_names_and_unknown_codes_their_numbers() {
        assert_eq!(HipError::OUT_OF_MEMORY.name(), Some("hipErrorOutOfMemory"));
        // An alias shares its code; the current name wins.
        assert_eq!(HipError::MEMORY_ALLOCATION, HipError::OUT_OF_MEMORY);
        assert_eq!(HipError(2).name(), Some("hipErrorOutOfMemory"));
        assert_eq!(HipError(400).name(), Some("hipErrorInvalidHandle"));
        let text = HipError(2).to_string();
        assert!(text.starts_with("hipErrorOutOfMemory (2)"), "{text}");
        // A code no header defines is a number, never undefined behaviour.
        for code in [10u32, 913, 1056, 4242, u32::MAX] {
            let e = HipError(code);
            assert_eq!(e.name(), None);
            let text = e.to_string();
            assert!(
                text.starts_with(&format!("unknown hipError_t {code}")),
                "{text}"
            );
            assert!(format!("{e:?}").contains(&code.to_string()));
        }
        // Every constant is in the table once with its value.
        let mut seen = std::collections::HashSet::new();
        for (v, n) in HipError::CODES {
            assert!(seen.insert(*n), "{n} twice");
            assert!(n.starts_with("hip"), "{n}");
            assert!(HipError(*v).name().is_some());
        }
    }
}
