//! The CUDA runtime: cudarc's driver API (`cudarc::driver::{sys, result}`,
//! loaded at run time, so building needs no CUDA) and NVRTC, under the
//! generic GPU body (`gpu.rs`), which does everything else.
//!
//! cudarc panics when it cannot find libcuda, so it is probed with
//! `is_culib_present()` first: a machine without CUDA gets
//! [`Error::NoRuntime`] (`libcuda.so.1` is one file per system, so
//! cudarc's own choice of it is safe). NVRTC and cuDNN are bound by the
//! crate (`vendor/nvrtc.rs`, `vendor/cudnn.rs`) and opened so that a copy
//! already in the process (PyTorch's) is the one used. The kernels come
//! from `kernels/` (through `prelude.h`'s CUDA branch): PTX built by
//! nvcc at build time when it was found, else the embedded source compiled
//! by NVRTC on first use to machine code for the device's own arch (a
//! cubin; PTX where NVRTC gives none), one module at a time
//! (`KernelModule`), cached per arch for the process and on disk
//! (`crate::device::kernel_cache`). A cached cubin loads in milliseconds; PTX would
//! cost the driver's translation in every process its cache misses.

use std::ffi::CString;

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::DriverError;

use crate::device::info::{
    BackendKind, DeviceInfo, DevicePtr, KernelBuild, KernelCaps, KernelSource, RawEvent, RawStream,
};
use crate::device::kernel_cache;
use crate::device::kernels::{self, KernelCall, KernelModule};
use crate::device::raw::backend::{CopyOp, Driver};
use crate::device::runtime::gpu::Runtime;
use crate::device::runtime::vendor::cudnn::Cudnn;
use crate::device::runtime::vendor::nvrtc::Output;
use crate::device::VisibleDevices;
use crate::error::{Error, Result};

const VISIBLE_VAR: &str = "CUDA_VISIBLE_DEVICES";

fn err(op: &'static str, e: DriverError) -> Error {
    Error::RuntimeCall {
        backend: "cuda",
        op,
        code: e.0 as i64,
        source: Box::new(e),
    }
}

/// An allocation's error: [`Error::OutOfMemory`] for the runtime's
/// out-of-memory code (the transfer ladder retries on it), else the
/// runtime's error.
fn alloc_err(op: &'static str, bytes: usize, e: DriverError) -> Error {
    let oom = e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
    Error::or_out_of_memory(oom, "cuda", op, bytes, || err(op, e))
}

/// Loads libcuda (typed error when absent) and initialises the driver.
fn init() -> Result<()> {
    // SAFETY: only tries to dlopen the candidate library names; no symbol is
    // called.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::NoRuntime {
            backend: "cuda",
            library: "libcuda",
        });
    }
    match cu::init() {
        Ok(()) => Ok(()),
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => Err(Error::NoDevice {
            backend: "cuda",
            ordinal: None,
            count: 0,
            visible: VisibleDevices::read(VISIBLE_VAR, None),
        }),
        Err(e) => Err(err("cuInit", e)),
    }
}

fn device_count() -> Result<usize> {
    init()?;
    let n = cu::device::get_count().map_err(|e| err("cuDeviceGetCount", e))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

fn attribute(dev: sys::CUdevice, a: sys::CUdevice_attribute) -> Result<i32> {
    // SAFETY: `dev` came from cuDeviceGet after cuInit.
    unsafe { cu::device::get_attribute(dev, a) }.map_err(|e| err("cuDeviceGetAttribute", e))
}

fn describe(ordinal: usize, dev: sys::CUdevice) -> Result<DeviceInfo> {
    use sys::CUdevice_attribute as A;
    let major = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = attribute(dev, A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let mps = attribute(dev, A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    let name = cu::device::get_name(dev).map_err(|e| err("cuDeviceGetName", e))?;
    // SAFETY: `dev` came from cuDeviceGet after cuInit.
    let total = unsafe { cu::device::total_mem(dev) }.map_err(|e| err("cuDeviceTotalMem", e))?;
    Ok(DeviceInfo {
        kind: BackendKind::Cuda,
        ordinal,
        name,
        arch: format!("sm_{major}{minor}"),
        total_memory: total as u64,
        multiprocessors: u32::try_from(mps).unwrap_or(1),
        visible: VisibleDevices::read(VISIBLE_VAR, Some(ordinal)),
    })
}

fn get_device(ordinal: usize) -> Result<sys::CUdevice> {
    let count = device_count().map_err(|e| match e {
        Error::NoDevice {
            backend,
            count,
            visible,
            ..
        } => Error::NoDevice {
            backend,
            ordinal: Some(ordinal),
            count,
            visible,
        },
        other => other,
    })?;
    if ordinal >= count {
        return Err(Error::NoDevice {
            backend: "cuda",
            ordinal: Some(ordinal),
            count,
            visible: VisibleDevices::read(VISIBLE_VAR, Some(ordinal)),
        });
    }
    let o = i32::try_from(ordinal).map_err(|_| Error::NoDevice {
        backend: "cuda",
        ordinal: Some(ordinal),
        count,
        visible: VisibleDevices::read(VISIBLE_VAR, Some(ordinal)),
    })?;
    cu::device::get(o).map_err(|e| err("cuDeviceGet", e))
}

/// The CUDA devices this process sees.
pub fn list() -> Result<Vec<DeviceInfo>> {
    let count = device_count()?;
    if count == 0 {
        return Err(Error::NoDevice {
            backend: "cuda",
            ordinal: None,
            count: 0,
            visible: VisibleDevices::read(VISIBLE_VAR, None),
        });
    }
    (0..count)
        .map(|i| {
            let o = i32::try_from(i).unwrap_or(i32::MAX);
            let dev = cu::device::get(o).map_err(|e| err("cuDeviceGet", e))?;
            describe(i, dev)
        })
        .collect()
}

/// The CUDA driver's version (`cuDriverGetVersion`) as `(raw, "major.minor")`,
/// raw = major * 1000 + minor * 10 (`12040` -> `"12.4"`). Needs no device
/// and no `cuInit`.
///
/// Errors: [`Error::NoRuntime`] when libcuda cannot be loaded, or the
/// driver's error.
pub fn driver_version() -> Result<(i32, String)> {
    // SAFETY: only tries to dlopen the candidate library names.
    if !unsafe { sys::is_culib_present() } {
        return Err(Error::NoRuntime {
            backend: "cuda",
            library: "libcuda",
        });
    }
    let mut v = 0i32;
    // SAFETY: libcuda is loadable (checked above), so cudarc's loader does
    // not panic; the call writes one int and needs no initialisation.
    unsafe { sys::cuDriverGetVersion(&mut v) }
        .result()
        .map_err(|e| err("cuDriverGetVersion", e))?;
    Ok((v, decode_cuda_version(v)))
}

/// A CUDA version number decoded: `12040` -> `"12.4"`.
pub fn decode_cuda_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}

/// NVRTC options for `target` (`sm_90` for machine code, `compute_90` for
/// PTX) and module `which` (its `RS_PART`: `kernels/prelude.h`).
fn nvrtc_options(target: &str, which: KernelModule) -> Vec<String> {
    let mut o = vec![
        format!("--gpu-architecture={target}"),
        "-default-device".into(),
    ];
    if which.part() != 0 {
        o.push(format!("-DRS_PART={}", which.part()));
    }
    o
}

/// A module's code as `cuModuleLoadData` takes it.
#[derive(Debug, PartialEq, Eq)]
enum Image {
    /// PTX text (no NUL): the driver translates it to machine code on load
    /// (28 s for the whole conv3d source on an H100, and again in every
    /// process whose driver cache does not hold it).
    Ptx(Vec<u8>),
    /// Machine code for the device's own arch: loaded as it is.
    Cubin(Vec<u8>),
}

/// Module `which`'s code for compute capability `cc` (`"90"`): nvcc's PTX
/// from the build; else machine code for `sm_{cc}` (PTX for
/// `compute_{cc}` where this NVRTC gives no cubin) from the kernel cache
/// ([`kernel_cache::get_or_compile`]: this process's, then the disk's),
/// else NVRTC's. `cached: false` compiles afresh.
///
/// The first conv3d module a process needs brings the other four with it,
/// compiled side by side on threads of their own where the machine has a
/// core for each ([`compile_alongside`]): a first use then waits about as
/// long as the slowest module takes alone (7.5 s on an H100 host, against
/// 17 s one after another).
fn image_for(cc: &str, which: KernelModule, cached: bool) -> Result<(Image, KernelSource)> {
    if let Some(p) = kernels::CUDA_PTX {
        let ptx = p.get(which.index()).copied().unwrap_or_default();
        return Ok((Image::Ptx(ptx.as_bytes().to_vec()), KernelSource::Nvcc));
    }
    let source = kernels::CUDA_SOURCES
        .get(which.source())
        .copied()
        .unwrap_or_default();
    let nvrtc = crate::device::runtime::vendor::nvrtc::library()?;
    let (output, target, ext) = if nvrtc.has_cubin() {
        (Output::Cubin, format!("sm_{cc}"), "cubin")
    } else {
        (Output::Ptx, format!("compute_{cc}"), "ptx")
    };
    let options = nvrtc_options(&target, which);
    let req = kernel_cache::Request {
        runtime: "cuda",
        compiler: "nvrtc",
        ext,
        module: which.name(),
        target: &target,
        source,
        options: &options,
    };
    let dir = kernel_cache::dir();
    let get = || {
        kernel_cache::get_or_compile(&req, dir.as_deref(), cached, || {
            nvrtc.compile(source, "rocm_safe_kernels.cu", &options, &target, output)
        })
    };
    let (code, from) = if cached && !kernel_cache::in_process(&req) {
        compile_alongside(cc, which, get)?
    } else {
        get()?
    };
    let image = match output {
        Output::Cubin => Image::Cubin(code),
        Output::Ptx => Image::Ptx(code),
    };
    Ok((image, from))
}

/// Runs `get` (module `which`'s load) while the other modules of its
/// source are brought into the process cache on threads of their own, and
/// waits for all of them (no thread outlives the call: a process may exit
/// right after). Only where the machine has a core per module and this is
/// the first time for `cc`; otherwise `get` alone. A sibling that fails is
/// only logged: its own first use reports the error.
fn compile_alongside<T>(
    cc: &str,
    which: KernelModule,
    get: impl FnOnce() -> Result<T>,
) -> Result<T> {
    static DONE: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let siblings: Vec<KernelModule> = KernelModule::ALL
        .into_iter()
        .filter(|m| m.source() == which.source() && *m != which)
        .collect();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let first = {
        let mut done = match DONE.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let key = format!("{cc}/{}", which.source());
        let first = !done.contains(&key);
        if first {
            done.push(key);
        }
        first
    };
    if siblings.is_empty() || !first || cores <= siblings.len() {
        return get();
    }
    std::thread::scope(|sc| {
        for m in siblings {
            sc.spawn(move || {
                if let Err(e) = image_for(cc, m, true) {
                    tracing::debug!(module = m.name(), error = %e, "module not compiled ahead");
                }
            });
        }
        get()
    })
}

/// An opened CUDA device (its primary context): the CUDA runtime under the
/// generic GPU body.
#[derive(Debug)]
pub struct CudaRuntime {
    info: DeviceInfo,
    dev: sys::CUdevice,
    ctx: Ctx,
}

#[derive(Debug, Clone, Copy)]
struct Ctx(sys::CUcontext);
// SAFETY: a CUcontext is a handle the driver lets any thread make current.
unsafe impl Send for Ctx {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for Ctx {}

/// A loaded CUDA module.
pub(crate) struct Module(sys::CUmodule);
// SAFETY: CUDA module handles are plain identifiers valid in their context
// from any thread; every use binds the context first.
unsafe impl Send for Module {}
// SAFETY: as above; never mutated after loading.
unsafe impl Sync for Module {}

/// A kernel of a loaded module.
#[derive(Clone, Copy)]
pub(crate) struct Function(sys::CUfunction);
// SAFETY: as for `Module`.
unsafe impl Send for Function {}
// SAFETY: as for `Module`.
unsafe impl Sync for Function {}

impl CudaRuntime {
    /// Opens device `ordinal` (after `CUDA_VISIBLE_DEVICES`).
    pub fn open(ordinal: usize) -> Result<CudaRuntime> {
        let dev = get_device(ordinal)?;
        let info = describe(ordinal, dev)?;
        // SAFETY: `dev` came from cuDeviceGet; released in Drop.
        let ctx = unsafe { cu::primary_ctx::retain(dev) }
            .map_err(|e| err("cuDevicePrimaryCtxRetain", e))?;
        let rt = CudaRuntime {
            info,
            dev,
            ctx: Ctx(ctx),
        };
        rt.bind()?;
        Ok(rt)
    }

    /// The compute capability as a number (`sm_90` -> 90; 0 if unknown).
    fn sm(&self) -> u32 {
        self.info
            .arch
            .trim_start_matches("sm_")
            .parse()
            .unwrap_or(0)
    }
}

fn stream(s: RawStream) -> sys::CUstream {
    s.0 as usize as sys::CUstream
}
fn event(e: RawEvent) -> sys::CUevent {
    e.0 as usize as sys::CUevent
}

impl Drop for CudaRuntime {
    fn drop(&mut self) {
        // The GPU body has unloaded the modules and the cuDNN state.
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { cu::primary_ctx::release(self.dev) };
    }
}

// SAFETY: allocations come from the CUDA driver allocator with the requested
// size and 256-byte alignment (cuMemAlloc/cuMemHostAlloc align to at least
// 256), and every operation is the documented driver call on exactly the
// ranges given.
unsafe impl Driver for CudaRuntime {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        // SAFETY: the context is current; the memory is handed to a
        // DeviceBuffer that frees it.
        let p = unsafe { cu::malloc_sync(bytes) }.map_err(|e| alloc_err("cuMemAlloc", bytes, e))?;
        Ok(DevicePtr(p))
    }

    unsafe fn free(&self, ptr: DevicePtr, _bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes a live allocation of ours, freed once.
        unsafe { cu::free_sync(ptr.0) }.map_err(|e| err("cuMemFree", e))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        // SAFETY: the context is current; the memory is zeroed below before
        // anyone reads it.
        let p: *mut u8 = unsafe { cu::malloc_host(bytes, 0) }
            .map_err(|e| alloc_err("cuMemHostAlloc", bytes, e))?
            .cast();
        crate::device::hostmem::zero_parallel(p, bytes);
        Ok(p)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes a live pinned allocation of ours.
        unsafe { cu::free_host(ptr.cast()) }.map_err(|e| err("cuMemFreeHost", e))
    }

    fn stream_create(&self) -> Result<RawStream> {
        self.bind()?;
        let s = cu::stream::create(cu::stream::StreamKind::NonBlocking)
            .map_err(|e| err("cuStreamCreate", e))?;
        Ok(RawStream(s as usize as u64))
    }

    unsafe fn stream_destroy(&self, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes a live stream of ours, destroyed once.
        unsafe { cu::stream::destroy(stream(s)) }.map_err(|e| err("cuStreamDestroy", e))
    }

    unsafe fn stream_synchronize(&self, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes a live stream.
        unsafe { cu::stream::synchronize(stream(s)) }.map_err(|e| err("cuStreamSynchronize", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        cu::ctx::synchronize().map_err(|e| err("cuCtxSynchronize", e))
    }

    fn event_create(&self) -> Result<RawEvent> {
        self.bind()?;
        let e = cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| err("cuEventCreate", e))?;
        Ok(RawEvent(e as usize as u64))
    }

    unsafe fn event_destroy(&self, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes a live event, destroyed once.
        unsafe { cu::event::destroy(event(e)) }.map_err(|e| err("cuEventDestroy", e))
    }

    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes live handles.
        unsafe { cu::event::record(event(e), stream(s)) }.map_err(|e| err("cuEventRecord", e))
    }

    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes a live event.
        unsafe { cu::event::synchronize(event(e)) }.map_err(|e| err("cuEventSynchronize", e))
    }

    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller passes live handles.
        unsafe {
            cu::stream::wait_event(
                stream(s),
                event(e),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(|e| err("cuStreamWaitEvent", e))
    }

    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        self.bind()?;
        // SAFETY: the caller passes live events.
        unsafe { cu::event::elapsed(event(start), event(end)) }
            .map_err(|e| err("cuEventElapsedTime", e))
    }

    unsafe fn copy(&self, op: CopyOp, bytes: usize, s: RawStream) -> Result<()> {
        self.bind()?;
        let r = match op {
            CopyOp::HtoD { dst, src } => {
                // SAFETY: the caller guarantees `bytes` readable host bytes
                // that stay valid until the stream reaches the copy, and a
                // live device range of `bytes` at `dst`.
                unsafe {
                    let host = std::slice::from_raw_parts(src, bytes);
                    cu::memcpy_htod_async(dst.0, host, stream(s))
                }
            }
            CopyOp::DtoH { dst, src } => {
                // SAFETY: the caller guarantees `bytes` writable host bytes,
                // not read until the stream reaches the copy, and a live
                // device range of `bytes` at `src`.
                unsafe {
                    let host = std::slice::from_raw_parts_mut(dst, bytes);
                    cu::memcpy_dtoh_async(host, src.0, stream(s))
                }
            }
            // SAFETY: both are live device ranges of `bytes` (caller).
            CopyOp::DtoD { dst, src } => unsafe {
                cu::memcpy_dtod_async(dst.0, src.0, bytes, stream(s))
            },
        };
        r.map_err(|e| err("cuMemcpyAsync", e))
    }

    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: a live device range of `bytes` (caller).
        unsafe { cu::memset_d8_async(dst.0, 0, bytes, stream(s)) }
            .map_err(|e| err("cuMemsetD8Async", e))
    }

    // ----- memory figures and versions (diagnostics) ---------------------
    /// `cuMemGetInfo` in this device's primary context.
    fn mem_info(&self) -> Result<(u64, u64)> {
        Runtime::bind(self)?;
        let (free, total) = cu::mem_get_info().map_err(|e| err("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    unsafe fn register_read_only(&self, p: *const u8, bytes: usize) -> Result<()> {
        Runtime::bind(self)?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_READ_ONLY;
        // SAFETY: the caller's range stays mapped until unregistered; with
        // READ_ONLY the driver never writes it (a read-only file mapping:
        // without the flag the driver answers "invalid value").
        unsafe { sys::cuMemHostRegister_v2(p.cast_mut().cast(), bytes, flags) }
            .result()
            .map_err(|e| alloc_err("cuMemHostRegister(READ_ONLY)", bytes, e))
    }

    unsafe fn unregister_read_only(&self, p: *const u8) -> Result<()> {
        Runtime::bind(self)?;
        // SAFETY: registered by `register_read_only`, unregistered once and
        // idle (caller).
        unsafe { sys::cuMemHostUnregister(p.cast_mut().cast()) }
            .result()
            .map_err(|e| err("cuMemHostUnregister", e))
    }
}

// SAFETY: `launch` is cuLaunchKernel of exactly the call given; modules and
// functions stay valid until `unload_module`.
unsafe impl Runtime for CudaRuntime {
    type Module = Module;
    type Function = Function;
    type Vendor = Cudnn;

    fn caps(&self) -> KernelCaps {
        KernelCaps {
            code: if kernels::CUDA_PTX.is_some() {
                KernelBuild::Embedded
            } else {
                KernelBuild::RunTime
            },
            modules: KernelModule::ALL.len(),
            bf16_tensor_cores: self.sm() >= 80,
            vendor_library: Some("cudnn"),
        }
    }

    unsafe fn host_register(&self, p: *mut u8, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller's range stays mapped until unregistered; flags
        // 0: page-locked for this context.
        unsafe { sys::cuMemHostRegister_v2(p.cast(), bytes, 0) }
            .result()
            .map_err(|e| alloc_err("cuMemHostRegister", bytes, e))
    }

    unsafe fn host_unregister(&self, p: *mut u8) -> Result<()> {
        self.bind()?;
        // SAFETY: registered by `host_register`, unregistered once (caller).
        unsafe { sys::cuMemHostUnregister(p.cast()) }
            .result()
            .map_err(|e| err("cuMemHostUnregister", e))
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: the context was retained in `open` and is released only in
        // Drop.
        unsafe { cu::ctx::set_current(self.ctx.0) }.map_err(|e| err("cuCtxSetCurrent", e))
    }

    fn load_module(&self, which: KernelModule) -> Result<(Module, KernelSource)> {
        let cc = self.info.arch.trim_start_matches("sm_").to_owned();
        let load = |image: Image| -> Result<sys::CUmodule> {
            match image {
                Image::Ptx(ptx) => {
                    let text = CString::new(ptx).map_err(|_| Error::KernelUnavailable {
                        backend: "cuda",
                        arch: self.info.arch.clone(),
                        built: "ptx with an interior NUL".into(),
                    })?;
                    // SAFETY: `text` is a NUL-terminated PTX string that
                    // outlives the call; the context is current.
                    unsafe { cu::module::load_data(text.as_ptr().cast()) }
                }
                Image::Cubin(elf) => {
                    if elf.get(..4) != Some(&b"\x7fELF"[..]) {
                        return Err(Error::KernelUnavailable {
                            backend: "cuda",
                            arch: self.info.arch.clone(),
                            built: "a cubin that is not an ELF image".into(),
                        });
                    }
                    // SAFETY: `elf` is a whole ELF image (the driver reads
                    // its size from the ELF headers) that outlives the
                    // call; the context is current.
                    unsafe { cu::module::load_data(elf.as_ptr().cast()) }
                }
            }
            .map_err(|e| err("cuModuleLoadData", e))
        };
        let (image, mut source) = image_for(&cc, which, true)?;
        let module = match load(image) {
            Ok(m) => m,
            // Cached code the driver refuses (an older driver than the
            // NVRTC that wrote it, a damaged file): compile afresh,
            // replacing both caches.
            Err(e) if source != KernelSource::Compiled && source != KernelSource::Nvcc => {
                tracing::debug!(error = %e, "cached kernels refused; compiling again");
                let (image, fresh) = image_for(&cc, which, false)?;
                source = fresh;
                load(image)?
            }
            Err(e) => return Err(e),
        };
        Ok((Module(module), source))
    }

    fn function(&self, module: &Module, symbol: &'static str) -> Result<Function> {
        let name = CString::new(symbol).map_err(|_| Error::KernelUnavailable {
            backend: "cuda",
            arch: self.info.arch.clone(),
            built: symbol.into(),
        })?;
        // SAFETY: `module` is loaded in this device's context (current).
        unsafe { cu::module::get_function(module.0, name) }
            .map(Function)
            .map_err(|e| err("cuModuleGetFunction", e))
    }

    unsafe fn unload_module(&self, module: Module) -> Result<()> {
        // SAFETY: the caller's guarantees: loaded by us, unloaded once.
        unsafe { cu::module::unload(module.0) }.map_err(|e| err("cuModuleUnload", e))
    }

    unsafe fn launch(&self, f: Function, call: &mut KernelCall, s: RawStream) -> Result<()> {
        let [gx, gy, gz] = call.grid;
        let (block, shared) = (call.block, call.shared_bytes);
        let mut args = call.arg_ptrs();
        // SAFETY: `f` is a function of a loaded module (caller); `args`
        // point into `call`, alive until the launch returns (the driver
        // copies the values); the caller vouches for the memory they
        // reference and for `s`.
        unsafe {
            cu::launch_kernel(
                f.0,
                (gx, gy, gz),
                (block, 1, 1),
                shared,
                stream(s),
                &mut args,
            )
        }
        .map_err(|e| err("cuLaunchKernel", e))
    }

    fn vendor_available(&self) -> Result<()> {
        crate::device::runtime::vendor::cudnn::available()
    }

    fn vendor_backward_available(&self) -> Result<()> {
        crate::device::runtime::vendor::cudnn::backward_available()
    }

    fn vendor_open(&self) -> Result<Cudnn> {
        Cudnn::new()
    }
}

#[cfg(test)]
mod version_tests {
    use super::*;

    #[test]
    fn versions_decode_and_absent_driver_is_typed() {
        assert_eq!(decode_cuda_version(12040), "12.4");
        assert_eq!(decode_cuda_version(13000), "13.0");
        match driver_version() {
            Ok((raw, text)) => assert_eq!(text, decode_cuda_version(raw)),
            Err(e) => assert!(matches!(e, Error::NoRuntime { .. }), "{e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_the_target_and_the_part() {
        let o = nvrtc_options("sm_90", KernelModule::Conv3dTiledBf16Mma);
        assert_eq!(
            o,
            ["--gpu-architecture=sm_90", "-default-device", "-DRS_PART=5"]
        );
        // The core source has no parts.
        let o = nvrtc_options("compute_80", KernelModule::Core);
        assert_eq!(o, ["--gpu-architecture=compute_80", "-default-device"]);
    }

    #[test]
    fn a_load_alongside_its_siblings_returns_its_own_result() {
        // Siblings that cannot compile here (no NVRTC in CI) are only
        // logged; the module's own result or error comes back, and no
        // thread outlives the call.
        let cc = format!("t{}", std::process::id());
        let got = compile_alongside(&cc, KernelModule::Conv3d, || Ok(7));
        assert_eq!(got.unwrap(), 7);
        let e = compile_alongside(&cc, KernelModule::Conv3dNaive, || {
            Err::<u8, _>(Error::BackendUnsupported {
                backend: "cuda",
                op: "compile",
            })
        });
        assert!(matches!(e, Err(Error::BackendUnsupported { .. })));
    }
}
