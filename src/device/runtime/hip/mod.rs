//! The HIP runtime, loaded at run time: `loader` finds and opens
//! `libamdhip64` once per process -> `sys` binds the functions used
//! (declared here, checked against the HIP 5.4 to 7.14 headers) ->
//! `result` (one runtime call each, returning [`HipError`]) -> this
//! module's [`HipRuntime`] (owning handles, implementing the crate's
//! `Driver` and `Runtime` traits) under the generic GPU body (`gpu.rs`),
//! which implements the kernel operations once for HIP and CUDA.
//!
//! **What the loader reads** (details in `loader`): a HIP runtime
//! already in the process first (PyTorch's, say: one runtime per process);
//! else `ROCM_SAFE_HIP_RUNTIME` (a `libamdhip64.so*` file, or a folder
//! holding one), `$ROCM_PATH/lib`, `$HIP_PATH/lib`, the loader path,
//! `/opt/rocm/lib`, the TheRock pip SDK's `_rocm_sdk_core/lib`; in each,
//! `.so.7`, `.so.6`, `.so.5`, then `.so`. When none loads,
//! [`Error::RuntimeNotFound`] lists every place tried. Nothing of HIP is
//! needed to build or link: no binary records a `libamdhip64` soname.
//! Inside the crate, `loader::runtime_library()` gives the loaded
//! library (its path: MIOpen is taken from the same ROCm); publicly,
//! [`runtime_file`].
//!
//! **The device's arch** is read from sysfs
//! (`/sys/class/kfd/kfd/topology/nodes/*/properties`,
//! `gfx_target_version`), matched to the HIP ordinal by PCI location,
//! never from `hipDeviceProp_t` (whose layout changed in ROCm 6); then
//! `HSA_OVERRIDE_GFX_VERSION` (or `HSA_OVERRIDE_GFX_VERSION_<node>`), when
//! set, replaces it, as it does in the runtime, which then loads only that
//! arch's code object. With no KFD topology (a stand-in runtime in CI) the
//! arch is the override's, or `unknown`. [`arch_choice`] reports both.
//!
//! **Errors are cleared where handled**: after every failed runtime call,
//! `hipGetLastError` (see `result`), so HIP 7's sticky last error never
//! reaches the caller's next check. A user who may not open `/dev/kfd` gets
//! [`Error::DevicePermission`] (join the `render` and `video` groups), not
//! "no device".
//!
//! Kernels are the code objects build.rs made, one per gfx arch, loaded
//! with `hipModuleLoadData`.

mod kfd;
mod loader;
mod result;
pub(crate) mod sys;

use std::ffi::{c_void, CString};

pub use kfd::{parse_gfx_override, GfxOverride, GFX_OVERRIDE_VAR};
pub use loader::{runtime_file, HipRuntimeFile, RUNTIME_VAR};
pub use result::HipError;

use crate::device::info::{
    BackendKind, DeviceInfo, DevicePtr, KernelBuild, KernelCaps, KernelSource, RawEvent, RawStream,
};
use crate::device::kernels::{self, KernelCall, KernelModule};
use crate::device::raw::backend::{CopyOp, Driver};
use crate::device::runtime::gpu::Runtime;
use crate::device::runtime::vendor::miopen::Miopen;
use crate::device::VisibleDevices;
use crate::error::{Error, Result};
use kfd::{kfd_nodes, parse_pci_bus_id, KfdAccess, KfdNode};
use sys::Api;

#[allow(unused_imports)]
pub(crate) use loader::runtime_library;

const VISIBLE_VAR: &str = "HIP_VISIBLE_DEVICES";

fn err(op: &'static str, e: HipError) -> Error {
    Error::RuntimeCall {
        backend: "hip",
        op,
        code: i64::from(e.0),
        source: Box::new(e),
    }
}

/// An allocation's error: [`Error::OutOfMemory`] for the runtime's
/// out-of-memory code (the transfer ladder retries on it), else the
/// runtime's error. The runtime's last error is already cleared.
fn alloc_err(op: &'static str, bytes: usize, e: HipError) -> Error {
    let oom = e == HipError::OUT_OF_MEMORY;
    Error::or_out_of_memory(oom, "hip", op, bytes, || err(op, e))
}

fn no_device(ordinal: Option<usize>, count: usize) -> Error {
    Error::NoDevice {
        backend: "hip",
        ordinal,
        count,
        visible: VisibleDevices::read(VISIBLE_VAR, ordinal),
    }
}

/// Why no device is seen, when the runtime sees none: `/dev/kfd` there but
/// not usable by this user is a permission problem; an invalid
/// `HSA_OVERRIDE_GFX_VERSION` makes the runtime refuse every GPU.
fn explain_no_device(fallback: Error) -> Error {
    explain_no_device_with(
        kfd::kfd_access(std::path::Path::new(kfd::KFD_PATH)),
        kfd::gfx_override_from(None, &kfd::process_env),
        fallback,
    )
}

fn explain_no_device_with(access: KfdAccess, over: Option<GfxOverride>, fallback: Error) -> Error {
    if let KfdAccess::Denied { group } = access {
        return Error::DevicePermission {
            backend: "hip",
            path: kfd::KFD_PATH.into(),
            reason: kfd::permission_advice(group.as_deref()),
        };
    }
    if let Some(GfxOverride {
        var,
        value,
        arch: Err(reason),
    }) = over
    {
        return Error::InvalidEnvironment { var, value, reason };
    }
    fallback
}

/// Number of HIP devices; "no device", "no permission" and "no driver" as
/// typed errors.
fn device_count(api: &Api, ordinal: Option<usize>) -> Result<usize> {
    match result::device::count(api) {
        Ok(n) if n > 0 => Ok(usize::try_from(n).unwrap_or(0)),
        Ok(_) => Err(explain_no_device(no_device(ordinal, 0))),
        Err(e) if e == HipError::NO_DEVICE => Err(explain_no_device(no_device(ordinal, 0))),
        Err(e) if e == HipError::INSUFFICIENT_DRIVER || e == HipError::NOT_INITIALIZED => {
            Err(explain_no_device(Error::NoRuntime {
                backend: "hip",
                library: "the amdgpu kernel driver (/dev/kfd)",
            }))
        }
        Err(e) => Err(explain_no_device(err("hipGetDeviceCount", e))),
    }
}

/// The gfx arch the runtime wants for a device: the override's when one is
/// set (`HSA_OVERRIDE_GFX_VERSION_<node>`, else `HSA_OVERRIDE_GFX_VERSION`),
/// else the KFD node's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchChoice {
    /// The GPU's own arch from the KFD topology, when there is one.
    pub device_arch: Option<String>,
    /// The override in effect, if any.
    pub gfx_override: Option<GfxOverride>,
    /// The arch whose code object the runtime loads (`"unknown"` when
    /// neither says).
    pub arch: String,
    /// The code object this build has for `arch`, or why there is none
    /// (the archs built, and the override when it is the reason).
    pub code_object: std::result::Result<&'static str, String>,
}

fn choose_arch(
    node: Option<&KfdNode>,
    env: &dyn Fn(&str) -> Option<String>,
    built: &[&'static str],
) -> Result<ArchChoice> {
    let device_arch = node.map(|n| n.arch.clone());
    let gfx_override = kfd::gfx_override_from(node.map(|n| n.node), env);
    let arch = match &gfx_override {
        Some(GfxOverride { arch: Ok(a), .. }) => a.clone(),
        Some(GfxOverride {
            var,
            value,
            arch: Err(reason),
        }) => {
            return Err(Error::InvalidEnvironment {
                var: var.clone(),
                value: value.clone(),
                reason: reason.clone(),
            })
        }
        None => device_arch.clone().unwrap_or_else(|| "unknown".into()),
    };
    let code_object = match built.iter().find(|a| **a == arch) {
        Some(a) => Ok(*a),
        None => {
            let why = match (&gfx_override, &device_arch) {
                (Some(o), Some(d)) => format!(
                    "{}={} makes the runtime load a {arch} code object (the GPU is {d}), \
                     and this build has none",
                    o.var, o.value
                ),
                (Some(o), None) => format!(
                    "{}={} makes the runtime load a {arch} code object, and this build has none",
                    o.var, o.value
                ),
                (None, _) => format!("this build has no {arch} code object"),
            };
            Err(format!("{why} (built: {})", built.join(",")))
        }
    };
    Ok(ArchChoice {
        device_arch,
        gfx_override,
        arch,
        code_object,
    })
}

/// The KFD node of HIP device `ordinal` (by PCI location, else the
/// ordinal-th GPU node).
fn kfd_node(api: &Api, ordinal: i32, nodes: &[KfdNode]) -> Option<KfdNode> {
    let by_pci = result::device::pci_bus_id(api, ordinal)
        .ok()
        .and_then(|id| parse_pci_bus_id(&id))
        .and_then(|(dom, loc)| {
            nodes
                .iter()
                .find(|n| n.domain == dom && n.location_id == loc)
        });
    // Fallback: the ordinal-th GPU node (exact when no visibility variable
    // reorders devices).
    by_pci
        .or_else(|| usize::try_from(ordinal).ok().and_then(|o| nodes.get(o)))
        .cloned()
}

/// Which arch HIP device `ordinal` runs kernels as, and which code object
/// of this build serves it: the KFD arch, the `HSA_OVERRIDE_GFX_VERSION`
/// in effect, and the result (for the doctor).
///
/// Errors: [`Error::RuntimeNotFound`], [`Error::NoDevice`], an invalid
/// override ([`Error::InvalidEnvironment`]), or the runtime's error.
pub fn arch_choice(ordinal: usize) -> Result<ArchChoice> {
    let api = loader::api()?;
    let count = device_count(api, Some(ordinal))?;
    let o = match i32::try_from(ordinal) {
        Ok(o) if ordinal < count => o,
        _ => return Err(no_device(Some(ordinal), count)),
    };
    let node = kfd_node(api, o, &kfd_nodes());
    choose_arch(node.as_ref(), &kfd::process_env, &built_archs())
}

/// The `HSA_OVERRIDE_GFX_VERSION` set for the whole process, if any, with
/// the arch it names or why the runtime refuses it (per-node overrides are
/// in [`arch_choice`]).
pub fn gfx_override() -> Option<GfxOverride> {
    kfd::gfx_override_from(None, &kfd::process_env)
}

fn describe(api: &Api, ordinal: usize) -> Result<(DeviceInfo, ArchChoice)> {
    let o = i32::try_from(ordinal).unwrap_or(i32::MAX);
    let name = result::device::name(api, o).map_err(|e| err("hipDeviceGetName", e))?;
    let total = result::device::total_mem(api, o).map_err(|e| err("hipDeviceTotalMem", e))?;
    let node = kfd_node(api, o, &kfd_nodes());
    let choice = choose_arch(node.as_ref(), &kfd::process_env, &built_archs())?;
    let info = DeviceInfo {
        kind: BackendKind::Hip,
        ordinal,
        name,
        arch: choice.arch.clone(),
        total_memory: total as u64,
        multiprocessors: node.as_ref().map_or(64, |n| n.compute_units.max(1)),
        visible: VisibleDevices::read(VISIBLE_VAR, Some(ordinal)),
    };
    Ok((info, choice))
}

/// The HIP devices this process sees (after `HIP_VISIBLE_DEVICES`).
///
/// Errors: [`Error::RuntimeNotFound`] (no runtime), [`Error::NoDevice`],
/// [`Error::DevicePermission`] (`/dev/kfd` not usable by this user), or
/// the runtime's error.
pub fn list() -> Result<Vec<DeviceInfo>> {
    let api = loader::api()?;
    let n = device_count(api, None)?;
    (0..n).map(|o| describe(api, o).map(|(i, _)| i)).collect()
}

/// The HIP runtime's version (`hipRuntimeGetVersion`) as `(raw, "major.minor.patch")`,
/// `HIP_VERSION` = major * 10^7 + minor * 10^5 + patch. Needs no device.
///
/// Errors: [`Error::RuntimeNotFound`], or the runtime's error ([`Error::RuntimeCall`]).
pub fn runtime_version() -> Result<(i32, String)> {
    let api = loader::api()?;
    let v = result::info::runtime_version(api).map_err(|e| err("hipRuntimeGetVersion", e))?;
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
/// Errors: [`Error::RuntimeNotFound`], [`Error::NoDevice`] /
/// [`Error::NoRuntime`] / [`Error::DevicePermission`] as [`list`], or the
/// runtime's error.
pub fn driver_version() -> Result<i32> {
    let api = loader::api()?;
    device_count(api, None)?;
    // SAFETY: a device is present (device_count returned at least one).
    unsafe { result::info::driver_version(api) }.map_err(|e| err("hipDriverGetVersion", e))
}

/// The PCI bus id (`"0000:c3:00.0"`) of HIP device `ordinal`, to match it
/// with its sysfs entry.
///
/// Errors: [`Error::RuntimeNotFound`], or the runtime's error.
pub fn pci_bus_id(ordinal: usize) -> Result<String> {
    let api = loader::api()?;
    let o = i32::try_from(ordinal).unwrap_or(i32::MAX);
    result::device::pci_bus_id(api, o).map_err(|e| err("hipDeviceGetPCIBusId", e))
}

/// The gfx archs this build has code objects for.
pub fn built_archs() -> Vec<&'static str> {
    kernels::HIP_CODE_OBJECTS.iter().map(|(a, _)| *a).collect()
}

/// An opened HIP device: the HIP runtime under the generic GPU body.
pub struct HipRuntime {
    info: DeviceInfo,
    choice: ArchChoice,
    ordinal: i32,
    api: &'static Api,
}

impl std::fmt::Debug for HipRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipRuntime")
            .field("info", &self.info)
            .field("arch", &self.choice)
            .finish()
    }
}

/// A loaded HIP module.
pub(crate) struct Module(sys::Module);
// SAFETY: HIP module handles are identifiers valid on their device from any
// thread; every use selects the device first.
unsafe impl Send for Module {}
// SAFETY: as above; never mutated after loading.
unsafe impl Sync for Module {}

/// A kernel of a loaded module.
#[derive(Clone, Copy)]
pub(crate) struct Function(sys::Function);
// SAFETY: as for `Module`.
unsafe impl Send for Function {}
// SAFETY: as for `Module`.
unsafe impl Sync for Function {}

fn stream(s: RawStream) -> sys::Stream {
    s.0 as usize as sys::Stream
}
fn event(e: RawEvent) -> sys::Event {
    e.0 as usize as sys::Event
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
        f: impl FnOnce(&Api) -> std::result::Result<T, HipError>,
    ) -> Result<T> {
        self.bind()?;
        f(self.api).map_err(|e| err(op, e))
    }

    /// Opens device `ordinal` (after `HIP_VISIBLE_DEVICES`).
    ///
    /// Errors: [`Error::RuntimeNotFound`], [`Error::NoDevice`],
    /// [`Error::DevicePermission`], [`Error::InvalidEnvironment`] (an
    /// `HSA_OVERRIDE_GFX_VERSION` the runtime refuses), or the runtime's
    /// error.
    pub fn open(ordinal: usize) -> Result<HipRuntime> {
        let api = loader::api()?;
        let count = device_count(api, Some(ordinal))?;
        let o = match i32::try_from(ordinal) {
            Ok(o) if ordinal < count => o,
            _ => return Err(no_device(Some(ordinal), count)),
        };
        result::device::set(api, o).map_err(|e| err("hipSetDevice", e))?;
        let (info, choice) = describe(api, ordinal)?;
        Ok(HipRuntime {
            info,
            choice,
            ordinal: o,
            api,
        })
    }

    /// The arch this device's kernels are loaded for, and why.
    pub fn arch_choice(&self) -> &ArchChoice {
        &self.choice
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
        let p = result::memory::malloc(self.api, bytes)
            .map_err(|e| alloc_err("hipMalloc", bytes, e))?;
        Ok(DevicePtr(p as usize as u64))
    }

    unsafe fn free(&self, ptr: DevicePtr, _bytes: usize) -> Result<()> {
        // SAFETY: the caller passes a live allocation of ours, freed once.
        self.on("hipFree", |api| unsafe {
            result::memory::free(api, dptr(ptr))
        })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        let p: *mut u8 = result::memory::host_malloc(self.api, bytes)
            .map_err(|e| alloc_err("hipHostMalloc", bytes, e))?
            .cast();
        crate::device::hostmem::zero_parallel(p, bytes);
        Ok(p)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) -> Result<()> {
        // SAFETY: the caller passes a live pinned allocation of ours.
        self.on("hipHostFree", |api| unsafe {
            result::memory::host_free(api, ptr.cast())
        })
    }

    fn stream_create(&self) -> Result<RawStream> {
        self.on("hipStreamCreateWithFlags", result::stream::create)
            .map(|s| RawStream(s as usize as u64))
    }

    unsafe fn stream_destroy(&self, s: RawStream) -> Result<()> {
        // SAFETY: live stream of ours, destroyed once (caller).
        self.on("hipStreamDestroy", |api| unsafe {
            result::stream::destroy(api, stream(s))
        })
    }

    unsafe fn stream_synchronize(&self, s: RawStream) -> Result<()> {
        // SAFETY: live stream (caller).
        self.on("hipStreamSynchronize", |api| unsafe {
            result::stream::synchronize(api, stream(s))
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
        self.on("hipEventDestroy", |api| unsafe {
            result::event::destroy(api, event(e))
        })
    }

    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        // SAFETY: live handles (caller).
        self.on("hipEventRecord", |api| unsafe {
            result::event::record(api, event(e), stream(s))
        })
    }

    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
        // SAFETY: live event (caller).
        self.on("hipEventSynchronize", |api| unsafe {
            result::event::synchronize(api, event(e))
        })
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        // SAFETY: live handles (caller).
        self.on("hipStreamWaitEvent", |api| unsafe {
            result::stream::wait_event(api, stream(s), event(e))
        })
    }

    unsafe fn event_elapsed_ms(&self, a: RawEvent, b: RawEvent) -> Result<f32> {
        // SAFETY: live events (caller).
        self.on("hipEventElapsedTime", |api| unsafe {
            result::event::elapsed(api, event(a), event(b))
        })
    }

    unsafe fn copy(&self, op: CopyOp, bytes: usize, s: RawStream) -> Result<()> {
        let (dst, src, kind) = match op {
            CopyOp::HtoD { dst, src } => (dptr(dst), src.cast(), sys::MEMCPY_HOST_TO_DEVICE),
            CopyOp::DtoH { dst, src } => (
                dst.cast(),
                dptr(src).cast_const(),
                sys::MEMCPY_DEVICE_TO_HOST,
            ),
            CopyOp::DtoD { dst, src } => (
                dptr(dst),
                dptr(src).cast_const(),
                sys::MEMCPY_DEVICE_TO_DEVICE,
            ),
        };
        // SAFETY: both ranges valid for `bytes` until the stream reaches the
        // copy (caller).
        self.on("hipMemcpyAsync", |api| unsafe {
            result::memory::copy_async(api, dst, src, bytes, kind, stream(s))
        })
    }

    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()> {
        // SAFETY: live device range (caller).
        self.on("hipMemsetAsync", |api| unsafe {
            result::memory::zero_async(api, dptr(dst), bytes, stream(s))
        })
    }

    // ----- memory figures and versions (diagnostics) ---------------------
    /// `hipMemGetInfo` on this device. On an APU several ROCm releases
    /// report only the VRAM carve-out here.
    fn mem_info(&self) -> Result<(u64, u64)> {
        let (free, total) = self.on("hipMemGetInfo", result::info::mem_get_info)?;
        Ok((free as u64, total as u64))
    }

    unsafe fn register_read_only(&self, p: *const u8, bytes: usize) -> Result<()> {
        Runtime::bind(self)?;
        // SAFETY: the caller's range stays mapped until unregistered; the
        // device only reads it. A refusal (a device whose
        // `hostRegisterReadOnlySupported` is 0, a file system the kernel
        // will not pin) is cleared from the runtime's last error (`check`):
        // the loader then serves from its pinned ring.
        unsafe {
            result::memory::host_register_flags(
                self.api,
                p.cast_mut().cast(),
                bytes,
                result::memory::REGISTER_READ_ONLY,
            )
        }
        .map_err(|e| alloc_err("hipHostRegister(ReadOnly)", bytes, e))
    }

    unsafe fn unregister_read_only(&self, p: *const u8) -> Result<()> {
        // SAFETY: registered by `register_read_only`, unregistered once and
        // idle (caller).
        self.on("hipHostUnregister", |api| unsafe {
            result::memory::host_unregister(api, p.cast_mut().cast())
        })
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
            code: KernelBuild::Embedded,
            modules: 1,
            bf16_tensor_cores: false,
            vendor_library: Some("miopen"),
        }
    }

    fn bind(&self) -> Result<()> {
        result::device::set(self.api, self.ordinal).map_err(|e| err("hipSetDevice", e))
    }

    unsafe fn host_register(&self, p: *mut u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's range stays mapped until unregistered. A
        // refusal is cleared from the runtime's last error (`check`): the
        // caller falls back to unpinned staging.
        unsafe { result::memory::host_register(self.api, p.cast(), bytes) }
            .map_err(|e| alloc_err("hipHostRegister", bytes, e))
    }

    unsafe fn host_unregister(&self, p: *mut u8) -> Result<()> {
        // SAFETY: registered by `host_register`, unregistered once (caller).
        self.on("hipHostUnregister", |api| unsafe {
            result::memory::host_unregister(api, p.cast())
        })
    }

    fn load_module(&self, _which: KernelModule) -> Result<(Module, KernelSource)> {
        let wanted = match &self.choice.code_object {
            Ok(arch) => *arch,
            Err(why) => {
                return Err(Error::KernelUnavailable {
                    backend: "hip",
                    arch: format!("{} ({why})", self.info.arch),
                    built: built_archs().join(","),
                })
            }
        };
        let Some((_, image)) = kernels::HIP_CODE_OBJECTS.iter().find(|(a, _)| *a == wanted) else {
            return Err(Error::KernelUnavailable {
                backend: "hip",
                arch: wanted.to_owned(),
                built: built_archs().join(","),
            });
        };
        self.bind()?;
        // SAFETY: `image` is a complete code object embedded in the binary
        // ('static); the device is selected.
        let module = unsafe { result::module::load_data(self.api, image.as_ptr().cast()) }
            .map_err(|e| err("hipModuleLoadData", e))?;
        Ok((Module(module), KernelSource::Embedded))
    }

    fn function(&self, module: &Module, symbol: &'static str) -> Result<Function> {
        let name = CString::new(symbol).map_err(|_| Error::KernelUnavailable {
            backend: "hip",
            arch: self.info.arch.clone(),
            built: symbol.into(),
        })?;
        // SAFETY: `module` is loaded on this device (selected by the caller
        // through the GPU body).
        unsafe { result::module::get_function(self.api, module.0, &name) }
            .map(Function)
            .map_err(|e| err("hipModuleGetFunction", e))
    }

    unsafe fn unload_module(&self, module: Module) -> Result<()> {
        // SAFETY: the caller's guarantees: loaded by us, unloaded once.
        unsafe { result::module::unload(self.api, module.0) }.map_err(|e| err("hipModuleUnload", e))
    }

    unsafe fn launch(&self, f: Function, call: &mut KernelCall, s: RawStream) -> Result<()> {
        let (grid, block, shared) = (call.grid, call.block, call.shared_bytes);
        let mut args = call.arg_ptrs();
        // SAFETY: `f` belongs to a loaded module (caller); `args` point into
        // `call`, alive until the launch returns (HIP copies the values);
        // the caller vouches for the memory they reference and for `s`.
        unsafe { result::module::launch(self.api, f.0, grid, block, shared, stream(s), &mut args) }
            .map_err(|e| err("hipModuleLaunchKernel", e))
    }

    fn vendor_available(&self) -> Result<()> {
        crate::device::runtime::vendor::miopen::library().map(|_| ())
    }

    fn vendor_backward_available(&self) -> Result<()> {
        crate::device::runtime::vendor::miopen::backward_available()
    }

    fn vendor_open(&self) -> Result<Miopen> {
        Miopen::new()
    }
}

#[cfg(test)]
mod tests;
