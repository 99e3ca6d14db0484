//! The HIP backend: `hip-runtime-sys` (sys, raw bindings over libamdhip64)
//! -> [`result`] (one runtime call each, returning [`HipError`]) -> this
//! module's [`HipBackend`] (owning handles, implementing
//! [`Backend`]).
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

pub mod result;

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

use hip_runtime_sys as sys;

pub use result::HipError;

use super::conv3d::{vendor_conv3d, Conv3dKernel, Conv3dLaunch, VendorConv};
use super::kernels::{self, Kernel, KernelCall};
use super::miopen::Miopen;
use super::{
    Backend, BackendKind, ConvertOp, DeviceInfo, DevicePtr, RawEvent, RawStream, VisibleDevices,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

const VISIBLE_VAR: &str = "HIP_VISIBLE_DEVICES";

fn err(op: &'static str, e: HipError) -> Error {
    Error::Hip { op, source: e }
}

fn alloc_err(op: &'static str, bytes: usize, e: HipError) -> Error {
    if e.0 == sys::hipError_t::hipErrorOutOfMemory {
        Error::OutOfMemory {
            backend: "hip",
            op,
            bytes: bytes as u64,
        }
    } else {
        err(op, e)
    }
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

/// One GPU node of the KFD topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KfdNode {
    /// `gfx90a`, `gfx1151`, ...
    pub arch: String,
    /// PCI domain.
    pub domain: u32,
    /// PCI location (`bus << 8 | device << 3 | function`).
    pub location_id: u32,
    /// Compute units (`simd_count / simd_per_cu`).
    pub compute_units: u32,
}

/// The gfx name of a KFD `gfx_target_version` (`90010` -> `gfx90a`,
/// `110501` -> `gfx1151`); `None` for 0 (a CPU node).
pub fn gfx_name(target_version: u32) -> Option<String> {
    if target_version == 0 {
        return None;
    }
    let major = target_version / 10_000;
    let minor = (target_version / 100) % 100;
    let step = target_version % 100;
    Some(format!("gfx{major}{minor:x}{step:x}"))
}

/// Parses one node's `properties` text.
pub fn parse_kfd_properties(text: &str) -> Option<KfdNode> {
    let mut props = HashMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if let (Some(k), Some(v)) = (it.next(), it.next()) {
            if let Ok(v) = v.parse::<u64>() {
                props.insert(k, v);
            }
        }
    }
    let get = |k: &str| props.get(k).copied().unwrap_or(0);
    let arch = gfx_name(u32::try_from(get("gfx_target_version")).ok()?)?;
    let simd_per_cu = get("simd_per_cu").max(1);
    Some(KfdNode {
        arch,
        domain: u32::try_from(get("domain")).unwrap_or(0),
        location_id: u32::try_from(get("location_id")).unwrap_or(0),
        compute_units: u32::try_from(get("simd_count") / simd_per_cu).unwrap_or(0),
    })
}

/// The GPU nodes of `/sys/class/kfd/kfd/topology/nodes`, in node order.
pub fn kfd_nodes() -> Vec<KfdNode> {
    let Ok(dir) = std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes") else {
        return Vec::new();
    };
    let mut nodes: Vec<(u64, KfdNode)> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let idx = e.file_name().to_str()?.parse::<u64>().ok()?;
            let text = std::fs::read_to_string(e.path().join("properties")).ok()?;
            Some((idx, parse_kfd_properties(&text)?))
        })
        .collect();
    nodes.sort_by_key(|(i, _)| *i);
    nodes.into_iter().map(|(_, n)| n).collect()
}

/// `(domain, location_id)` of a `"dddd:bb:dd.f"` PCI bus id.
pub fn parse_pci_bus_id(id: &str) -> Option<(u32, u32)> {
    let (domain, rest) = id.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let dev = u32::from_str_radix(dev, 16).ok()?;
    let func = u32::from_str_radix(func, 16).ok()?;
    Some((domain, (bus << 8) | (dev << 3) | func))
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

struct Module {
    module: sys::hipModule_t,
    funcs: HashMap<Kernel, sys::hipFunction_t>,
}

// SAFETY: HIP module and function handles are identifiers valid on their
// device from any thread; every use selects the device first.
unsafe impl Send for Module {}
// SAFETY: as above; never mutated after loading.
unsafe impl Sync for Module {}

/// An opened HIP device.
pub struct HipBackend {
    info: DeviceInfo,
    ordinal: i32,
    module: Mutex<Option<Arc<Module>>>,
    /// MIOpen's handle and plans, created on the first vendor call.
    miopen: Mutex<Option<Miopen>>,
}

impl std::fmt::Debug for HipBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipBackend")
            .field("info", &self.info)
            .finish()
    }
}

fn stream(s: RawStream) -> sys::hipStream_t {
    s.0 as usize as sys::hipStream_t
}
fn event(e: RawEvent) -> sys::hipEvent_t {
    e.0 as usize as sys::hipEvent_t
}
fn dptr(p: DevicePtr) -> *mut c_void {
    p.0 as usize as *mut c_void
}

impl HipBackend {
    /// Opens device `ordinal` (after `HIP_VISIBLE_DEVICES`).
    pub fn open(ordinal: usize) -> Result<HipBackend> {
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
        Ok(HipBackend {
            info: describe(ordinal)?,
            ordinal: o,
            module: Mutex::new(None),
            miopen: Mutex::new(None),
        })
    }

    fn bind(&self) -> Result<()> {
        result::device::set(self.ordinal).map_err(|e| err("hipSetDevice", e))
    }

    fn load_module(&self) -> Result<Module> {
        self.bind()?;
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
        let mut funcs = HashMap::new();
        for k in Kernel::ALL {
            let name = CString::new(k.symbol()).map_err(|_| Error::KernelUnavailable {
                backend: "hip",
                arch: self.info.arch.clone(),
                built: k.symbol().into(),
            })?;
            // SAFETY: `module` was just loaded.
            let f = unsafe { result::module::get_function(module, &name) }
                .map_err(|e| err("hipModuleGetFunction", e))?;
            funcs.insert(k, f);
        }
        Ok(Module { module, funcs })
    }

    fn module(&self) -> Result<Arc<Module>> {
        let mut slot = match self.module.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(m) = &*slot {
            return Ok(Arc::clone(m));
        }
        let m = Arc::new(self.load_module()?);
        *slot = Some(Arc::clone(&m));
        Ok(m)
    }

    /// Launches `call` on `s`.
    ///
    /// # Safety
    /// The memory `call`'s arguments reference satisfies the kernel's
    /// contract (its constructor in `kernels.rs` documents the parameters).
    unsafe fn launch(&self, mut call: KernelCall, s: RawStream) -> Result<()> {
        let m = self.module()?;
        let f = *m.funcs.get(&call.kernel).ok_or(Error::KernelUnavailable {
            backend: "hip",
            arch: self.info.arch.clone(),
            built: call.kernel.symbol().into(),
        })?;
        self.bind()?;
        let mut args = call.arg_ptrs();
        // SAFETY: `f` belongs to the loaded module; `args` point into `call`,
        // alive until the launch returns (HIP copies the values); the
        // caller vouches for the memory they reference.
        unsafe {
            result::module::launch(
                f,
                call.grid,
                call.block,
                call.shared_bytes,
                stream(s),
                &mut args,
            )
        }
        .map_err(|e| err("hipModuleLaunchKernel", e))
    }

    fn mps(&self) -> u32 {
        self.info.multiprocessors
    }
}

impl Drop for HipBackend {
    fn drop(&mut self) {
        // Errors here have nowhere to go (the device is being closed); they
        // are dropped, never printed or panicked.
        let miopen = match self.miopen.get_mut() {
            Ok(m) => m.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(mut m) = miopen {
            if self.bind().is_ok() {
                // SAFETY: the kept buffers are this device's, and idle:
                // every vendor call waits for its stream before returning.
                let _ = unsafe { m.buffers().release(self) };
                drop(m);
            } else {
                // Its handle belongs to a device we cannot select: leak it.
                std::mem::forget(m);
            }
        }
        let m = match self.module.get_mut() {
            Ok(m) => m.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(m) = m {
            if self.bind().is_ok() {
                // SAFETY: loaded by us, unloaded once, no launch can follow.
                let _ = unsafe { result::module::unload(m.module) };
            }
        }
    }
}

// SAFETY: allocations come from the HIP runtime allocator with the requested size
// and 256-byte alignment (hipMalloc/hipHostMalloc align to at least 256), and every operation is the documented runtime
// call (or CPU routine) on exactly the ranges given.
unsafe impl Backend for HipBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        let p = result::memory::malloc(bytes).map_err(|e| alloc_err("hipMalloc", bytes, e))?;
        Ok(DevicePtr(p as usize as u64))
    }

    unsafe fn free(&self, ptr: DevicePtr, _bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes a live allocation of ours, freed once.
        unsafe { result::memory::free(dptr(ptr)) }.map_err(|e| err("hipFree", e))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        let p =
            result::memory::host_malloc(bytes).map_err(|e| alloc_err("hipHostMalloc", bytes, e))?;
        Ok(p.cast())
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes a live pinned allocation of ours.
        unsafe { result::memory::host_free(ptr.cast()) }.map_err(|e| err("hipHostFree", e))
    }

    fn stream_create(&self) -> Result<RawStream> {
        self.bind()?;
        let s = result::stream::create().map_err(|e| err("hipStreamCreateWithFlags", e))?;
        Ok(RawStream(s as usize as u64))
    }

    unsafe fn stream_destroy(&self, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: live stream of ours, destroyed once (caller).
        unsafe { result::stream::destroy(stream(s)) }.map_err(|e| err("hipStreamDestroy", e))
    }

    unsafe fn stream_synchronize(&self, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: live stream (caller).
        unsafe { result::stream::synchronize(stream(s)) }
            .map_err(|e| err("hipStreamSynchronize", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        result::device::synchronize().map_err(|e| err("hipDeviceSynchronize", e))
    }

    fn event_create(&self) -> Result<RawEvent> {
        self.bind()?;
        let e = result::event::create().map_err(|e| err("hipEventCreateWithFlags", e))?;
        Ok(RawEvent(e as usize as u64))
    }

    unsafe fn event_destroy(&self, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: live event, destroyed once (caller).
        unsafe { result::event::destroy(event(e)) }.map_err(|e| err("hipEventDestroy", e))
    }

    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: live handles (caller).
        unsafe { result::event::record(event(e), stream(s)) }.map_err(|e| err("hipEventRecord", e))
    }

    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: live event (caller).
        unsafe { result::event::synchronize(event(e)) }.map_err(|e| err("hipEventSynchronize", e))
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: live handles (caller).
        unsafe { result::stream::wait_event(stream(s), event(e)) }
            .map_err(|e| err("hipStreamWaitEvent", e))
    }

    unsafe fn event_elapsed_ms(&self, a: RawEvent, b: RawEvent) -> Result<f32> {
        self.bind()?;
        // SAFETY: live events (caller).
        unsafe { result::event::elapsed(event(a), event(b)) }
            .map_err(|e| err("hipEventElapsedTime", e))
    }

    unsafe fn copy_htod(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges valid until the stream reaches the copy (caller).
        unsafe {
            result::memory::copy_async(
                dptr(dst),
                src.cast(),
                bytes,
                sys::hipMemcpyKind::hipMemcpyHostToDevice,
                stream(s),
            )
        }
        .map_err(|e| err("hipMemcpyAsync(HtoD)", e))
    }

    unsafe fn copy_dtoh(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges valid until the stream reaches the copy (caller).
        unsafe {
            result::memory::copy_async(
                dst.cast(),
                dptr(src),
                bytes,
                sys::hipMemcpyKind::hipMemcpyDeviceToHost,
                stream(s),
            )
        }
        .map_err(|e| err("hipMemcpyAsync(DtoH)", e))
    }

    unsafe fn copy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: both live device ranges (caller).
        unsafe {
            result::memory::copy_async(
                dptr(dst),
                dptr(src),
                bytes,
                sys::hipMemcpyKind::hipMemcpyDeviceToDevice,
                stream(s),
            )
        }
        .map_err(|e| err("hipMemcpyAsync(DtoD)", e))
    }

    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: live device range (caller).
        unsafe { result::memory::zero_async(dptr(dst), bytes, stream(s)) }
            .map_err(|e| err("hipMemsetAsync", e))
    }

    unsafe fn convert(
        &self,
        op: ConvertOp,
        src: DevicePtr,
        dst: DevicePtr,
        n: u64,
        s: RawStream,
    ) -> Result<()> {
        let call = KernelCall::convert(op, src, dst, n, self.mps())?;
        // SAFETY: the ranges are the caller's (trait contract).
        unsafe { self.launch(call, s) }
    }

    unsafe fn fingerprint_sum(
        &self,
        src: DevicePtr,
        bytes: u64,
        first_word: u64,
        acc: DevicePtr,
        s: RawStream,
    ) -> Result<()> {
        let call = KernelCall::fingerprint_sum(src, bytes, first_word, acc, self.mps());
        // SAFETY: the ranges are the caller's (trait contract).
        unsafe { self.launch(call, s) }
    }

    unsafe fn convert_fingerprint(
        &self,
        op: ConvertOp,
        src: DevicePtr,
        dst: DevicePtr,
        n: u64,
        acc: DevicePtr,
        s: RawStream,
    ) -> Result<()> {
        let call = KernelCall::convert_fingerprint(op, src, dst, n, acc, self.mps())?;
        // SAFETY: the ranges are the caller's (trait contract).
        unsafe { self.launch(call, s) }
    }

    unsafe fn nonfinite(
        &self,
        dtype: DType,
        ptr: DevicePtr,
        n: u64,
        clamp: bool,
        counts: DevicePtr,
        s: RawStream,
    ) -> Result<()> {
        let call = KernelCall::nonfinite(dtype, ptr, n, clamp, counts, self.mps())?;
        // SAFETY: the ranges are the caller's (trait contract).
        unsafe { self.launch(call, s) }
    }

    unsafe fn conv3d(&self, kernel: Conv3dKernel, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        let call = KernelCall::conv3d(kernel, args)?;
        // SAFETY: the ranges are the caller's (trait contract); the grid is
        // the one the kernel expects (checked by `KernelCall::conv3d`).
        unsafe { self.launch(call, s) }
    }

    fn conv3d_vendor_available(&self) -> Result<()> {
        super::miopen::library().map(|_| ())
    }

    unsafe fn conv3d_vendor(&self, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        let mut slot = match self.miopen.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        self.bind()?;
        let m = match &mut *slot {
            Some(m) => m,
            None => slot.insert(Miopen::new()?),
        };
        let launch = |call| {
            // SAFETY: vendor_conv3d launches only its epilogues, over the
            // caller's output and bias and its own scratch, on `s`.
            unsafe { self.launch(call, s) }
        };
        // SAFETY: the caller's guarantees; `launch` queues on `s` of this
        // device, whose MIOpen handle `m` is, with the device selected.
        unsafe { vendor_conv3d(self, m, args, s, &launch) }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_names_from_target_versions() {
        assert_eq!(gfx_name(90010).as_deref(), Some("gfx90a"));
        assert_eq!(gfx_name(90402).as_deref(), Some("gfx942"));
        assert_eq!(gfx_name(100300).as_deref(), Some("gfx1030"));
        assert_eq!(gfx_name(110501).as_deref(), Some("gfx1151"));
        assert_eq!(gfx_name(0), None);
    }

    #[test]
    fn kfd_properties_and_pci_ids_parse() {
        let text = "cpu_cores_count 0\nsimd_count 80\nsimd_per_cu 2\ngfx_target_version 110501\n\
                    location_id 49408\ndomain 0\n";
        let n = parse_kfd_properties(text).unwrap();
        assert_eq!(n.arch, "gfx1151");
        assert_eq!(n.compute_units, 40);
        assert_eq!(n.location_id, 49408);
        assert_eq!(parse_pci_bus_id("0000:c1:00.0"), Some((0, 0xc1 << 8)));
        assert_eq!(
            parse_pci_bus_id("0001:03:02.1"),
            Some((1, (3 << 8) | (2 << 3) | 1))
        );
        assert_eq!(parse_pci_bus_id("garbage"), None);
        assert!(parse_kfd_properties("gfx_target_version 0\n").is_none());
        assert!(parse_kfd_properties("").is_none());
    }

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
