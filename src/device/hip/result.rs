//! Thin `Result`-returning wrappers over the HIP runtime (`hip-runtime-sys`),
//! grouped by topic, each a single runtime call (cudarc's `driver/result.rs`
//! pattern). Raw handles in, raw handles out; the backend in `mod.rs` owns
//! them.

use std::ffi::{c_void, CStr};
use std::mem::MaybeUninit;

use hip_runtime_sys as sys;

/// The HIP runtime's error code. Its `Display` carries the code and the
/// runtime's own message (`hipGetErrorString`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HipError(pub sys::hipError_t);

impl HipError {
    /// The runtime's message for this code.
    pub fn message(&self) -> String {
        // SAFETY: hipGetErrorString returns a pointer to a static,
        // NUL-terminated string for any code (or null, handled below).
        let p = unsafe { sys::hipGetErrorString(self.0) };
        if p.is_null() {
            return "unknown error".into();
        }
        // SAFETY: non-null, NUL-terminated, static (see above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl std::fmt::Debug for HipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HipError({:?}: {})", self.0, self.message())
    }
}

impl std::fmt::Display for HipError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} ({}): {}", self.0, self.0 as u32, self.message())
    }
}

impl std::error::Error for HipError {}

/// `.result()` on a raw code.
pub trait HipResultExt {
    /// `Ok(())` for `hipSuccess`, else the error.
    fn result(self) -> Result<(), HipError>;
}

impl HipResultExt for sys::hipError_t {
    fn result(self) -> Result<(), HipError> {
        if self == sys::hipError_t::hipSuccess {
            Ok(())
        } else {
            Err(HipError(self))
        }
    }
}

/// Devices.
pub mod device {
    use super::*;

    /// `hipGetDeviceCount`.
    pub fn count() -> Result<i32, HipError> {
        let mut n = 0i32;
        // SAFETY: writes one int.
        unsafe { sys::hipGetDeviceCount(&mut n) }.result()?;
        Ok(n)
    }

    /// `hipSetDevice` (the calling thread's current device).
    pub fn set(ordinal: i32) -> Result<(), HipError> {
        // SAFETY: plain call; an invalid ordinal is an error code.
        unsafe { sys::hipSetDevice(ordinal) }.result()
    }

    /// `hipDeviceSynchronize` on the current device.
    pub fn synchronize() -> Result<(), HipError> {
        // SAFETY: plain call.
        unsafe { sys::hipDeviceSynchronize() }.result()
    }

    /// `hipDeviceGetName`.
    pub fn name(ordinal: i32) -> Result<String, HipError> {
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: the runtime writes at most `len` bytes, NUL-terminated.
        unsafe { sys::hipDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, ordinal) }.result()?;
        // SAFETY: NUL-terminated within the buffer (zeroed, and the
        // runtime terminates what it writes).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    /// `hipDeviceTotalMem`.
    pub fn total_mem(ordinal: i32) -> Result<usize, HipError> {
        let mut b = 0usize;
        // SAFETY: writes one size_t.
        unsafe { sys::hipDeviceTotalMem(&mut b, ordinal) }.result()?;
        Ok(b)
    }

    /// `hipDeviceGetPCIBusId`: `"dddd:bb:dd.f"`.
    pub fn pci_bus_id(ordinal: i32) -> Result<String, HipError> {
        let mut buf = [0 as std::ffi::c_char; 64];
        // SAFETY: writes at most `len` bytes, NUL-terminated.
        unsafe { sys::hipDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, ordinal) }
            .result()?;
        // SAFETY: NUL-terminated within the zeroed buffer.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }
}

/// Memory.
pub mod memory {
    use super::*;

    /// `hipMalloc`.
    pub fn malloc(bytes: usize) -> Result<*mut c_void, HipError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        unsafe { sys::hipMalloc(&mut p, bytes) }.result()?;
        Ok(p)
    }

    /// `hipFree`.
    ///
    /// # Safety
    /// `p` came from `malloc` and is freed once.
    pub unsafe fn free(p: *mut c_void) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipFree(p) }.result()
    }

    /// `hipHostMalloc` (pinned, default flags).
    pub fn host_malloc(bytes: usize) -> Result<*mut c_void, HipError> {
        let mut p = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        unsafe { sys::hipHostMalloc(&mut p, bytes, 0) }.result()?;
        Ok(p)
    }

    /// `hipHostRegister` (default flags).
    ///
    /// # Safety
    /// `p..p + bytes` stays mapped until `host_unregister`.
    pub unsafe fn host_register(p: *mut c_void, bytes: usize) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipHostRegister(p, bytes, 0) }.result()
    }

    /// `hipHostUnregister`.
    ///
    /// # Safety
    /// `p` came from `host_register` and is unregistered once.
    pub unsafe fn host_unregister(p: *mut c_void) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipHostUnregister(p) }.result()
    }

    /// `hipHostFree`.
    ///
    /// # Safety
    /// `p` came from `host_malloc` and is freed once.
    pub unsafe fn host_free(p: *mut c_void) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipHostFree(p) }.result()
    }

    /// `hipMemcpyAsync`.
    ///
    /// # Safety
    /// Both ranges are valid for `bytes` until the stream reaches the copy.
    pub unsafe fn copy_async(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: sys::hipMemcpyKind,
        stream: sys::hipStream_t,
    ) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipMemcpyAsync(dst, src, bytes, kind, stream) }.result()
    }

    /// `hipMemsetAsync` to zero.
    ///
    /// # Safety
    /// `dst` is valid device memory for `bytes`.
    pub unsafe fn zero_async(
        dst: *mut c_void,
        bytes: usize,
        stream: sys::hipStream_t,
    ) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipMemsetAsync(dst, 0, bytes, stream) }.result()
    }
}

/// Memory figures and versions (diagnostics).
pub mod info {
    use super::*;

    /// `hipMemGetInfo` on the current device: `(free, total)` bytes.
    pub fn mem_get_info() -> Result<(usize, usize), HipError> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        unsafe { sys::hipMemGetInfo(&mut free, &mut total) }.result()?;
        Ok((free, total))
    }

    /// `hipRuntimeGetVersion` (`HIP_VERSION`: major * 10^7 + minor * 10^5 +
    /// patch). Touches no device.
    pub fn runtime_version() -> Result<i32, HipError> {
        let mut v = 0i32;
        // SAFETY: writes one int.
        unsafe { sys::hipRuntimeGetVersion(&mut v) }.result()?;
        Ok(v)
    }

    /// `hipDriverGetVersion`.
    ///
    /// # Safety
    /// At least one device must be present: HIP 5.x reads the first device
    /// without checking that there is one.
    pub unsafe fn driver_version() -> Result<i32, HipError> {
        let mut v = 0i32;
        // SAFETY: writes one int; the caller guarantees a device.
        unsafe { sys::hipDriverGetVersion(&mut v) }.result()?;
        Ok(v)
    }
}

/// Streams.
pub mod stream {
    use super::*;

    /// `hipStreamCreateWithFlags(hipStreamNonBlocking)`.
    pub fn create() -> Result<sys::hipStream_t, HipError> {
        let mut s = MaybeUninit::uninit();
        // SAFETY: writes one handle; 1 = hipStreamNonBlocking.
        unsafe { sys::hipStreamCreateWithFlags(s.as_mut_ptr(), 1) }.result()?;
        // SAFETY: initialised by the successful call.
        Ok(unsafe { s.assume_init() })
    }

    /// `hipStreamDestroy`.
    ///
    /// # Safety
    /// `s` is live and destroyed once.
    pub unsafe fn destroy(s: sys::hipStream_t) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipStreamDestroy(s) }.result()
    }

    /// `hipStreamSynchronize`.
    ///
    /// # Safety
    /// `s` is live.
    pub unsafe fn synchronize(s: sys::hipStream_t) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipStreamSynchronize(s) }.result()
    }

    /// `hipStreamWaitEvent`.
    ///
    /// # Safety
    /// Both handles are live.
    pub unsafe fn wait_event(s: sys::hipStream_t, e: sys::hipEvent_t) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipStreamWaitEvent(s, e, 0) }.result()
    }
}

/// Events.
pub mod event {
    use super::*;

    /// `hipEventCreateWithFlags(hipEventDefault)`.
    pub fn create() -> Result<sys::hipEvent_t, HipError> {
        let mut e = MaybeUninit::uninit();
        // SAFETY: writes one handle.
        unsafe { sys::hipEventCreateWithFlags(e.as_mut_ptr(), 0) }.result()?;
        // SAFETY: initialised by the successful call.
        Ok(unsafe { e.assume_init() })
    }

    /// `hipEventDestroy`.
    ///
    /// # Safety
    /// `e` is live and destroyed once.
    pub unsafe fn destroy(e: sys::hipEvent_t) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipEventDestroy(e) }.result()
    }

    /// `hipEventRecord`.
    ///
    /// # Safety
    /// Both handles are live.
    pub unsafe fn record(e: sys::hipEvent_t, s: sys::hipStream_t) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipEventRecord(e, s) }.result()
    }

    /// `hipEventSynchronize`.
    ///
    /// # Safety
    /// `e` is live.
    pub unsafe fn synchronize(e: sys::hipEvent_t) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipEventSynchronize(e) }.result()
    }

    /// `hipEventElapsedTime`.
    ///
    /// # Safety
    /// Both handles are live.
    pub unsafe fn elapsed(a: sys::hipEvent_t, b: sys::hipEvent_t) -> Result<f32, HipError> {
        let mut ms = 0f32;
        // SAFETY: caller; writes one float.
        unsafe { sys::hipEventElapsedTime(&mut ms, a, b) }.result()?;
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
    pub unsafe fn load_data(image: *const c_void) -> Result<sys::hipModule_t, HipError> {
        let mut m = MaybeUninit::uninit();
        // SAFETY: caller; writes one handle.
        unsafe { sys::hipModuleLoadData(m.as_mut_ptr(), image) }.result()?;
        // SAFETY: initialised by the successful call.
        Ok(unsafe { m.assume_init() })
    }

    /// `hipModuleUnload`.
    ///
    /// # Safety
    /// `m` is loaded and unloaded once; no function of it is used after.
    pub unsafe fn unload(m: sys::hipModule_t) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe { sys::hipModuleUnload(m) }.result()
    }

    /// `hipModuleGetFunction`.
    ///
    /// # Safety
    /// `m` is loaded.
    pub unsafe fn get_function(
        m: sys::hipModule_t,
        name: &CStr,
    ) -> Result<sys::hipFunction_t, HipError> {
        let mut f = MaybeUninit::uninit();
        // SAFETY: caller; `name` is NUL-terminated; writes one handle.
        unsafe { sys::hipModuleGetFunction(f.as_mut_ptr(), m, name.as_ptr()) }.result()?;
        // SAFETY: initialised by the successful call.
        Ok(unsafe { f.assume_init() })
    }

    /// `hipModuleLaunchKernel` with a 3-D grid of 1-D blocks.
    ///
    /// # Safety
    /// `f` is a function of a loaded module; `params` point to live values
    /// of its parameter types; the memory they reference is valid for the
    /// kernel's accesses until the stream reaches it; `shared_bytes` is what
    /// the kernel needs beyond its static shared memory.
    pub unsafe fn launch(
        f: sys::hipFunction_t,
        grid: [u32; 3],
        block: u32,
        shared_bytes: u32,
        stream: sys::hipStream_t,
        params: &mut [*mut c_void],
    ) -> Result<(), HipError> {
        // SAFETY: caller.
        unsafe {
            sys::hipModuleLaunchKernel(
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
        }
        .result()
    }
}
