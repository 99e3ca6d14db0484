//! The HIP runtime: `hip-runtime-sys` (sys, raw bindings over libamdhip64)
//! -> [`result`] (one runtime call each, returning [`HipError`]) -> this
//! module's [`HipRuntime`] (owning handles, implementing the crate's
//! `Driver` and `Runtime` traits) under the generic GPU body (`gpu.rs`),
//! which implements the kernel operations once for HIP and CUDA.
//!
//! Kernels are the code objects build.rs made with `hipcc --genco`, one per
//! gfx arch, loaded with `hipModuleLoadData`. The device's arch is read from
//! sysfs (`/sys/class/kfd/kfd/topology/nodes/*/properties`,
//! `gfx_target_version`), matched to the HIP ordinal by PCI location, never
//! from `hipDeviceProp_t` (whose layout changed in ROCm 6).
//!
//! Note: `hip-runtime-sys` declares `hipError_t` as a Rust enum; a code the
//! bindings do not list would be undefined behaviour on return. The codes of
//! HIP 5.x and 6.x are all listed.

mod kfd;
pub mod result;

use std::ffi::{c_void, CString};

use hip_runtime_sys as sys;

pub use result::HipError;

use super::backend::{CopyOp, Driver};
use super::gpu::Runtime;
use super::info::{
    BackendKind, DeviceInfo, DevicePtr, KernelCaps, KernelCode, KernelSource, RawEvent, RawStream,
};
use super::kernels::{self, KernelCall, KernelModule};
use super::vendor::miopen::Miopen;
use super::VisibleDevices;
use crate::error::{Error, Result};
use kfd::{kfd_nodes, parse_pci_bus_id};

const VISIBLE_VAR: &str = "HIP_VISIBLE_DEVICES";

fn err(op: &'static str, e: HipError) -> Error {
    Error::Hip { op, source: e }
}

/// An allocation's error: [`Error::OutOfMemory`] for the runtime's
/// out-of-memory code (the transfer ladder retries on it), else the
/// runtime's error.
fn alloc_err(op: &'static str, bytes: usize, e: HipError) -> Error {
    let oom = e.0 == sys::hipError_t::hipErrorOutOfMemory;
    Error::or_out_of_memory(oom, "hip", op, bytes, || err(op, e))
}

/// Number of HIP devices; "no device" and "no driver" as typed errors.
fn device_count(ordinal: Option<usize>) -> Result<usize> {
    match result::device::count() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        Err(e) if e.0 == sys::hipError_t::hipErrorNoDevice => Err(Error::NoDevice {
            backend: "hip",
            ordinal,
            count: 0,
            visible: VisibleDevices::read(VISIBLE_VAR, ordinal),
        }),
        Err(e)
            if matches!(
                e.0,
                sys::hipError_t::hipErrorInsufficientDriver
                    | sys::hipError_t::hipErrorNotInitialized
            ) =>
        {
            Err(Error::NoRuntime {
                backend: "hip",
                library: "the amdgpu kernel driver (/dev/kfd)",
            })
        }
        Err(e) => Err(err("hipGetDeviceCount", e)),
    }
}
fn describe(ordinal: usize) -> Result<DeviceInfo> {
    let o = i32::try_from(ordinal).unwrap_or(i32::MAX);
    let name = result::device::name(o).map_err(|e| err("hipDeviceGetName", e))?;
    let total = result::device::total_mem(o).map_err(|e| err("hipDeviceTotalMem", e))?;
    let nodes = kfd_nodes();
    let by_pci = result::device::pci_bus_id(o)
        .ok()
        .and_then(|id| parse_pci_bus_id(&id))
        .and_then(|(dom, loc)| {
            nodes
                .iter()
                .find(|n| n.domain == dom && n.location_id == loc)
        });
    // Fallback: the ordinal-th GPU node (exact when no visibility variable
    // reorders devices).
    let node = by_pci.or_else(|| nodes.get(ordinal));
    Ok(DeviceInfo {
        kind: BackendKind::Hip,
        ordinal,
        name,
        arch: node.map_or_else(|| "unknown".into(), |n| n.arch.clone()),
        total_memory: total as u64,
        multiprocessors: node.map_or(64, |n| n.compute_units.max(1)),
        visible: VisibleDevices::read(VISIBLE_VAR, Some(ordinal)),
    })
}

/// The HIP devices this process sees (after `HIP_VISIBLE_DEVICES`).
pub fn list() -> Result<Vec<DeviceInfo>> {
    let n = device_count(None)?;
    if n == 0 {
        return Err(Error::NoDevice {
            backend: "hip",
            ordinal: None,
            count: 0,
            visible: VisibleDevices::read(VISIBLE_VAR, None),
        });
    }
    (0..n).map(describe).collect()
}

/// The HIP runtime's version (`hipRuntimeGetVersion`) as `(raw, "major.minor.patch")`,
/// `HIP_VERSION` = major * 10^7 + minor * 10^5 + patch. Needs no device.
///
/// Errors: the runtime's error ([`Error::Hip`]).
pub fn runtime_version() -> Result<(i32, String)> {
    let v = result::info::runtime_version().map_err(|e| err("hipRuntimeGetVersion", e))?;
    Ok((v, decode_hip_version(v)))
}

/// `HIP_VERSION` decoded: `50221153` -> `"5.2.21153"`.
pub fn decode_hip_version(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

/// The driver version `hipDriverGetVersion` reports (on AMD the ROCclr
/// platform build number * 100 + revision), asked only when a device is
/// present (HIP 5.x reads device 0 unchecked).
///
/// Errors: [`Error::NoDevice`] / [`Error::NoRuntime`] as [`list`], or the
/// runtime's error.
pub fn driver_version() -> Result<i32> {
    let n = device_count(None)?;
    if n == 0 {
        return Err(Error::NoDevice {
            backend: "hip",
            ordinal: None,
            count: 0,
            visible: VisibleDevices::read(VISIBLE_VAR, None),
        });
    }
    // SAFETY: a device is present (checked just above).
    unsafe { result::info::driver_version() }.map_err(|e| err("hipDriverGetVersion", e))
}

/// The PCI bus id (`"0000:c3:00.0"`) of HIP device `ordinal`, to match it
/// with its sysfs entry.
///
/// Errors: the runtime's error.
pub fn pci_bus_id(ordinal: usize) -> Result<String> {
    let o = i32::try_from(ordinal).unwrap_or(i32::MAX);
    result::device::pci_bus_id(o).map_err(|e| err("hipDeviceGetPCIBusId", e))
}

/// The gfx archs this build has code objects for.
pub fn built_archs() -> Vec<&'static str> {
    kernels::HIP_CODE_OBJECTS.iter().map(|(a, _)| *a).collect()
}

/// An opened HIP device: the HIP runtime under the generic GPU body.
pub struct HipRuntime {
    info: DeviceInfo,
    ordinal: i32,
}

impl std::fmt::Debug for HipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipRuntime")
            .field("info", &self.info)
            .finish()
    }
}

/// A loaded HIP module.
pub(crate) struct Module(sys::hipModule_t);
// SAFETY: HIP module handles are identifiers valid on their device from any
// thread; every use selects the device first.
unsafe impl Send for Module {}
// SAFETY: as above; never mutated after loading.
unsafe impl Sync for Module {}

/// A kernel of a loaded module.
#[derive(Clone, Copy)]
pub(crate) struct Function(sys::hipFunction_t);
// SAFETY: as for `Module`.
unsafe impl Send for Function {}
// SAFETY: as for `Module`.
unsafe impl Sync for Function {}

fn stream(s: RawStream) -> sys::hipStream_t {
    s.0 as usize as sys::hipStream_t
}
fn event(e: RawEvent) -> sys::hipEvent_t {
    e.0 as usize as sys::hipEvent_t
}
fn dptr(p: DevicePtr) -> *mut c_void {
    p.0 as usize as *mut c_void
}

impl HipRuntime {
    /// Selects this device, then makes the runtime call `f` (named `op` in
    /// errors).
    fn on<T>(
        &self,
        op: &'static str,
        f: impl FnOnce() -> std::result::Result<T, HipError>,
    ) -> Result<T> {
        self.bind()?;
        f().map_err(|e| err(op, e))
    }

    /// Opens device `ordinal` (after `HIP_VISIBLE_DEVICES`).
    pub fn open(ordinal: usize) -> Result<HipRuntime> {
        let count = device_count(Some(ordinal))?;
        let o = match i32::try_from(ordinal) {
            Ok(o) if ordinal < count => o,
            _ => {
                return Err(Error::NoDevice {
                    backend: "hip",
                    ordinal: Some(ordinal),
                    count,
                    visible: VisibleDevices::read(VISIBLE_VAR, Some(ordinal)),
                })
            }
        };
        result::device::set(o).map_err(|e| err("hipSetDevice", e))?;
        Ok(HipRuntime {
            info: describe(ordinal)?,
            ordinal: o,
        })
    }
}

// SAFETY: allocations come from the HIP runtime allocator with the requested
// size and 256-byte alignment (hipMalloc/hipHostMalloc align to at least
// 256), and every operation is the documented runtime call on exactly the
// ranges given.
unsafe impl Driver for HipRuntime {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        let p = result::memory::malloc(bytes).map_err(|e| alloc_err("hipMalloc", bytes, e))?;
        Ok(DevicePtr(p as usize as u64))
    }

    unsafe fn free(&self, ptr: DevicePtr, _bytes: usize) -> Result<()> {
        // SAFETY: the caller passes a live allocation of ours, freed once.
        self.on("hipFree", || unsafe { result::memory::free(dptr(ptr)) })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        let p: *mut u8 = result::memory::host_malloc(bytes)
            .map_err(|e| alloc_err("hipHostMalloc", bytes, e))?
            .cast();
        crate::device::hostmem::zero_parallel(p, bytes);
        Ok(p)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) -> Result<()> {
        // SAFETY: the caller passes a live pinned allocation of ours.
        self.on("hipHostFree", || unsafe {
            result::memory::host_free(ptr.cast())
        })
    }

    fn stream_create(&self) -> Result<RawStream> {
        self.on("hipStreamCreateWithFlags", result::stream::create)
            .map(|s| RawStream(s as usize as u64))
    }

    unsafe fn stream_destroy(&self, s: RawStream) -> Result<()> {
        // SAFETY: live stream of ours, destroyed once (caller).
        self.on("hipStreamDestroy", || unsafe {
            result::stream::destroy(stream(s))
        })
    }

    unsafe fn stream_synchronize(&self, s: RawStream) -> Result<()> {
        // SAFETY: live stream (caller).
        self.on("hipStreamSynchronize", || unsafe {
            result::stream::synchronize(stream(s))
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.on("hipDeviceSynchronize", result::device::synchronize)
    }

    fn event_create(&self) -> Result<RawEvent> {
        self.on("hipEventCreateWithFlags", result::event::create)
            .map(|e| RawEvent(e as usize as u64))
    }

    unsafe fn event_destroy(&self, e: RawEvent) -> Result<()> {
        // SAFETY: live event, destroyed once (caller).
        self.on("hipEventDestroy", || unsafe {
            result::event::destroy(event(e))
        })
    }

    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        // SAFETY: live handles (caller).
        self.on("hipEventRecord", || unsafe {
            result::event::record(event(e), stream(s))
        })
    }

    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
        // SAFETY: live event (caller).
        self.on("hipEventSynchronize", || unsafe {
            result::event::synchronize(event(e))
        })
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        // SAFETY: live handles (caller).
        self.on("hipStreamWaitEvent", || unsafe {
            result::stream::wait_event(stream(s), event(e))
        })
    }

    unsafe fn event_elapsed_ms(&self, a: RawEvent, b: RawEvent) -> Result<f32> {
        // SAFETY: live events (caller).
        self.on("hipEventElapsedTime", || unsafe {
            result::event::elapsed(event(a), event(b))
        })
    }

    unsafe fn copy(&self, op: CopyOp, bytes: usize, s: RawStream) -> Result<()> {
        use sys::hipMemcpyKind as K;
        let (dst, src, kind) = match op {
            CopyOp::HtoD { dst, src } => (dptr(dst), src.cast(), K::hipMemcpyHostToDevice),
            CopyOp::DtoH { dst, src } => {
                (dst.cast(), dptr(src).cast_const(), K::hipMemcpyDeviceToHost)
            }
            CopyOp::DtoD { dst, src } => (
                dptr(dst),
                dptr(src).cast_const(),
                K::hipMemcpyDeviceToDevice,
            ),
        };
        self.bind()?;
        // SAFETY: both ranges valid for `bytes` until the stream reaches the
        // copy (caller).
        unsafe { result::memory::copy_async(dst, src, bytes, kind, stream(s)) }
            .map_err(|e| err("hipMemcpyAsync", e))
    }

    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()> {
        // SAFETY: live device range (caller).
        self.on("hipMemsetAsync", || unsafe {
            result::memory::zero_async(dptr(dst), bytes, stream(s))
        })
    }

    // ----- memory figures and versions (diagnostics) ---------------------
    /// `hipMemGetInfo` on this device. On an APU several ROCm releases
    /// report only the VRAM carve-out here.
    fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (free, total) = result::info::mem_get_info().map_err(|e| err("hipMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }
}

// SAFETY: `launch` is hipModuleLaunchKernel of exactly the call given;
// modules and functions stay valid until `unload_module`.
unsafe impl Runtime for HipRuntime {
    type Module = Module;
    type Function = Function;
    type Vendor = Miopen;

    fn caps(&self) -> KernelCaps {
        KernelCaps {
            code: KernelCode::Embedded,
            modules: 1,
            bf16_tensor_cores: false,
            vendor_library: Some("miopen"),
        }
    }

    fn bind(&self) -> Result<()> {
        result::device::set(self.ordinal).map_err(|e| err("hipSetDevice", e))
    }

    unsafe fn host_register(&self, p: *mut u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's range stays mapped until unregistered.
        unsafe { result::memory::host_register(p.cast(), bytes) }
            .map_err(|e| alloc_err("hipHostRegister", bytes, e))
    }

    unsafe fn host_unregister(&self, p: *mut u8) -> Result<()> {
        // SAFETY: registered by `host_register`, unregistered once (caller).
        self.on("hipHostUnregister", || unsafe {
            result::memory::host_unregister(p.cast())
        })
    }

    fn load_module(&self, _which: KernelModule) -> Result<(Module, KernelSource)> {
        let Some((_, image)) = kernels::HIP_CODE_OBJECTS
            .iter()
            .find(|(a, _)| *a == self.info.arch)
        else {
            return Err(Error::KernelUnavailable {
                backend: "hip",
                arch: self.info.arch.clone(),
                built: built_archs().join(","),
            });
        };
        // SAFETY: `image` is a complete code object embedded in the binary
        // ('static); the device is selected.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
            .map_err(|e| err("hipModuleLoadData", e))?;
        Ok((Module(module), KernelSource::Embedded))
    }

    fn function(&self, module: &Module, symbol: &'static str) -> Result<Function> {
        let name = CString::new(symbol).map_err(|_| Error::KernelUnavailable {
            backend: "hip",
            arch: self.info.arch.clone(),
            built: symbol.into(),
        })?;
        // SAFETY: `module` is loaded on this device (selected).
        unsafe { result::module::get_function(module.0, &name) }
            .map(Function)
            .map_err(|e| err("hipModuleGetFunction", e))
    }

    unsafe fn unload_module(&self, module: Module) -> Result<()> {
        // SAFETY: the caller's guarantees: loaded by us, unloaded once.
        unsafe { result::module::unload(module.0) }.map_err(|e| err("hipModuleUnload", e))
    }

    unsafe fn launch(&self, f: Function, call: &mut KernelCall, s: RawStream) -> Result<()> {
        let (grid, block, shared) = (call.grid, call.block, call.shared_bytes);
        let mut args = call.arg_ptrs();
        // SAFETY: `f` belongs to a loaded module (caller); `args` point into
        // `call`, alive until the launch returns (HIP copies the values);
        // the caller vouches for the memory they reference and for `s`.
        unsafe { result::module::launch(f.0, grid, block, shared, stream(s), &mut args) }
            .map_err(|e| err("hipModuleLaunchKernel", e))
    }

    fn vendor_available(&self) -> Result<()> {
        crate::device::vendor::miopen::library().map(|_| ())
    }

    fn vendor_open(&self) -> Result<Miopen> {
        Miopen::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_decode_and_never_need_a_device() {
        assert_eq!(decode_hip_version(50221153), "5.2.21153");
        assert_eq!(decode_hip_version(60342134), "6.3.42134");
        // The runtime version needs no device; the driver version is a
        // typed "no device" where there is none (CI), never a crash.
        let (raw, text) = runtime_version().unwrap();
        assert!(raw > 0 && text.starts_with(&format!("{}.", raw / 10_000_000)));
        match driver_version() {
            Ok(v) => assert!(v > 0),
            Err(e) => assert!(
                matches!(e, Error::NoDevice { .. } | Error::NoRuntime { .. }),
                "{e}"
            ),
        }
    }
}
