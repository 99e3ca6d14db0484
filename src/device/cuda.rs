//! The CUDA backend: cudarc's driver API (`cudarc::driver::{sys, result}`,
//! loaded at run time, so building needs no CUDA) and NVRTC.
//!
//! cudarc panics when it cannot find libcuda or libnvrtc, so both are probed
//! with `is_culib_present()` first: a machine without CUDA gets
//! [`Error::NoRuntime`]. The kernels come from `hip-kernels/` (through
//! `prelude.h`'s CUDA branch): PTX built by nvcc at build time when it was
//! found, else the embedded source compiled by NVRTC on first use, cached per
//! compute capability for the process and on disk ([`kernel_cache_dir`]).

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result as cu;
use cudarc::driver::sys;
use cudarc::driver::DriverError;

use super::conv3d::{vendor_conv3d, Conv3dKernel, Conv3dLaunch, Conv3dWeightLayout, VendorConv};
use super::cudnn::Cudnn;
use super::kernels::{self, Kernel, KernelCall, KernelModule};
use super::{
    Backend, BackendKind, ConvertOp, DeviceInfo, DevicePtr, RawEvent, RawStream, VisibleDevices,
};
use crate::conv3d::Conv3dGeometry;
use crate::dtype::DType;
use crate::error::{Error, Result};

const VISIBLE_VAR: &str = "CUDA_VISIBLE_DEVICES";

fn err(op: &'static str, e: DriverError) -> Error {
    Error::Cuda { op, source: e }
}

fn alloc_err(op: &'static str, bytes: usize, e: DriverError) -> Error {
    if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        Error::OutOfMemory {
            backend: "cuda",
            op,
            bytes: bytes as u64,
        }
    } else {
        err(op, e)
    }
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

/// PTX compiled by NVRTC, per module and target (`core-compute_90`), for
/// this process.
fn nvrtc_cache() -> &'static Mutex<HashMap<String, String>> {
    static CACHE: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// How the kernels of a device were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum KernelSource {
    /// PTX built by nvcc at build time.
    Nvcc,
    /// Compiled by NVRTC in this process (first use for this target).
    NvrtcCompiled,
    /// NVRTC output reused from the process cache.
    NvrtcCached,
    /// NVRTC output of an earlier process, read from the kernel cache on
    /// disk ([`kernel_cache_dir`]).
    NvrtcDiskCache,
}

/// The environment variable naming the directory of the kernel cache on
/// disk; set to an empty value to turn the disk cache off.
pub const CACHE_DIR_VAR: &str = "ROCM_SAFE_CACHE_DIR";

/// Where NVRTC's output is kept between processes: `$ROCM_SAFE_CACHE_DIR`
/// (`None` when set but empty: no disk cache), else
/// `$XDG_CACHE_HOME/rocm-safe`, else `$HOME/.cache/rocm-safe`. Compiling the
/// kernels takes NVRTC about 0.2 s per process on an H100 machine; a cached
/// copy takes a file read. A cached file names the hash of the kernel
/// source, target and options it was built from and carries a fingerprint
/// of its text, checked before use; a file that fails the check, or that
/// the driver refuses, is compiled again. Every verified call still runs
/// the device's exhaustive self-test on the kernels, whichever way they
/// were obtained.
pub fn kernel_cache_dir() -> Option<std::path::PathBuf> {
    cache_dir_from(
        std::env::var_os(CACHE_DIR_VAR),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn cache_dir_from(
    own: Option<std::ffi::OsString>,
    xdg: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> Option<std::path::PathBuf> {
    use std::path::PathBuf;
    match own {
        Some(d) if d.is_empty() => None,
        Some(d) => Some(PathBuf::from(d)),
        None => match (xdg, home) {
            (Some(x), _) if !x.is_empty() => Some(PathBuf::from(x).join("rocm-safe")),
            (_, Some(h)) if !h.is_empty() => Some(PathBuf::from(h).join(".cache/rocm-safe")),
            _ => None,
        },
    }
}

/// NVRTC options for `arch` (`compute_90`).
fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "-default-device".into(),
    ]
}

/// The disk cache's key of `source` built for `arch` with `options`.
fn cache_key(source: &str, arch: &str, options: &[String]) -> u64 {
    let mut bytes = Vec::with_capacity(source.len() + 256);
    bytes.extend_from_slice(b"rocm-safe nvrtc ptx v1\0");
    bytes.extend_from_slice(arch.as_bytes());
    for o in options {
        bytes.push(0);
        bytes.extend_from_slice(o.as_bytes());
    }
    bytes.push(0);
    bytes.extend_from_slice(source.as_bytes());
    crate::convert::fingerprint::fingerprint_bytes(&bytes).0
}

/// `target` is the module and arch (`core-compute_90`).
fn cache_file(dir: &std::path::Path, target: &str, key: u64) -> std::path::PathBuf {
    dir.join(format!("cuda-{target}-{key:016x}.ptx"))
}

/// The first line of a cached file: the key and the fingerprint of the
/// PTX text that follows.
fn cache_header(key: u64, ptx: &str) -> String {
    let fp = crate::convert::fingerprint::fingerprint_bytes(ptx.as_bytes());
    format!("// rocm-safe nvrtc cache {key:016x} {fp}\n")
}

/// The PTX of a cached file's `text` when its header matches `key` and the
/// PTX's fingerprint.
fn parse_cached(text: &str, key: u64) -> Option<&str> {
    let (head, ptx) = text.split_once('\n')?;
    let want = cache_header(key, ptx);
    (want.trim_end() == head && !ptx.is_empty()).then_some(ptx)
}

fn read_cached(dir: &std::path::Path, arch: &str, key: u64) -> Option<String> {
    let text = std::fs::read_to_string(cache_file(dir, arch, key)).ok()?;
    parse_cached(&text, key).map(str::to_owned)
}

/// Writes `ptx` into the cache (a temporary file renamed into place, so a
/// reader never sees half a file). Failures only cost a later compile.
fn write_cached(dir: &std::path::Path, arch: &str, key: u64, ptx: &str) {
    let path = cache_file(dir, arch, key);
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let r = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, cache_header(key, ptx) + ptx))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!(path = %path.display(), error = %e, "kernel cache not written");
    }
}

/// Module `which`'s PTX for `arch`: nvcc's from the build, else (with
/// `cached`) this process's cache, then the disk cache, else NVRTC (whose
/// output goes to both caches). `cached: false` compiles afresh.
fn ptx_for(arch: &str, which: KernelModule, cached: bool) -> Result<(String, KernelSource)> {
    if let Some(p) = kernels::CUDA_PTX {
        let ptx = p.get(which.index()).copied().unwrap_or_default();
        return Ok((ptx.to_owned(), KernelSource::Nvcc));
    }
    let mut cache = match nvrtc_cache().lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let target = format!("{}-{arch}", which.name());
    if cached {
        if let Some(p) = cache.get(&target) {
            return Ok((p.clone(), KernelSource::NvrtcCached));
        }
    }
    // The key hashes the whole source: only when the disk is consulted.
    let source = kernels::CUDA_SOURCES
        .get(which.index())
        .copied()
        .unwrap_or_default();
    let options = nvrtc_options(arch);
    let key = cache_key(source, arch, &options);
    let dir = kernel_cache_dir();
    if cached {
        if let Some(p) = dir.as_deref().and_then(|d| read_cached(d, &target, key)) {
            cache.insert(target, p.clone());
            return Ok((p, KernelSource::NvrtcDiskCache));
        }
    }
    // SAFETY: only tries to dlopen the candidate library names.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::NoRuntime {
            backend: "cuda",
            library: "libnvrtc",
        });
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options,
        name: Some("rocm_safe_kernels.cu".into()),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| Error::Nvrtc {
        arch: arch.to_owned(),
        source: e,
    })?;
    let src = ptx.to_src();
    if let Some(d) = dir {
        write_cached(&d, &target, key, &src);
    }
    cache.insert(target, src.clone());
    Ok((src, KernelSource::NvrtcCompiled))
}

/// The loaded module and its functions.
struct Module {
    module: sys::CUmodule,
    funcs: HashMap<Kernel, sys::CUfunction>,
    source: KernelSource,
}

// SAFETY: CUDA module and function handles are plain identifiers valid in
// their context from any thread; every use binds the context first.
unsafe impl Send for Module {}
// SAFETY: as above; the handles are never mutated after loading.
unsafe impl Sync for Module {}

/// An opened CUDA device (its primary context).
#[derive(Debug)]
pub struct CudaBackend {
    info: DeviceInfo,
    dev: sys::CUdevice,
    ctx: Ctx,
    /// The loaded modules, in `KernelModule` order.
    modules: [Mutex<Option<Arc<Module>>>; 2],
    /// cuDNN's handle and plans, created on the first vendor call.
    cudnn: Mutex<Option<Cudnn>>,
}

#[derive(Debug, Clone, Copy)]
struct Ctx(sys::CUcontext);
// SAFETY: a CUcontext is a handle the driver lets any thread make current.
unsafe impl Send for Ctx {}
// SAFETY: as above; the handle itself is never mutated.
unsafe impl Sync for Ctx {}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("source", &self.source)
            .finish()
    }
}

impl CudaBackend {
    /// Opens device `ordinal` (after `CUDA_VISIBLE_DEVICES`).
    pub fn open(ordinal: usize) -> Result<CudaBackend> {
        let dev = get_device(ordinal)?;
        let info = describe(ordinal, dev)?;
        // SAFETY: `dev` came from cuDeviceGet; released in Drop.
        let ctx = unsafe { cu::primary_ctx::retain(dev) }
            .map_err(|e| err("cuDevicePrimaryCtxRetain", e))?;
        let b = CudaBackend {
            info,
            dev,
            ctx: Ctx(ctx),
            modules: [Mutex::new(None), Mutex::new(None)],
            cudnn: Mutex::new(None),
        };
        b.bind()?;
        Ok(b)
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: the context was retained in `open` and is released only in
        // Drop.
        unsafe { cu::ctx::set_current(self.ctx.0) }.map_err(|e| err("cuCtxSetCurrent", e))
    }

    /// How this device's conversion kernels (the ones every verified call
    /// and the self-test use) were obtained; loads them if needed.
    pub fn kernel_source(&self) -> Result<KernelSource> {
        Ok(self.module(KernelModule::Core)?.source)
    }

    fn load_module(&self, which: KernelModule) -> Result<Module> {
        self.bind()?;
        let arch = self.info.arch.replace("sm_", "compute_");
        let load = |ptx: String| -> Result<sys::CUmodule> {
            let image = CString::new(ptx).map_err(|_| Error::KernelUnavailable {
                backend: "cuda",
                arch: arch.clone(),
                built: "ptx with an interior NUL".into(),
            })?;
            // SAFETY: `image` is a NUL-terminated PTX string that outlives
            // the call; the context is current.
            unsafe { cu::module::load_data(image.as_ptr().cast()) }
                .map_err(|e| err("cuModuleLoadData", e))
        };
        let (ptx, mut source) = ptx_for(&arch, which, true)?;
        let module = match load(ptx) {
            Ok(m) => m,
            // Cached PTX the driver refuses (an older driver than the NVRTC
            // that wrote it, say): compile afresh, replacing both caches.
            Err(e) if source != KernelSource::NvrtcCompiled && source != KernelSource::Nvcc => {
                tracing::debug!(error = %e, "cached kernels refused; compiling again");
                let (ptx, fresh) = ptx_for(&arch, which, false)?;
                source = fresh;
                load(ptx)?
            }
            Err(e) => return Err(e),
        };
        let mut funcs = HashMap::new();
        for k in Kernel::ALL.into_iter().filter(|k| k.module() == which) {
            let name = CString::new(k.symbol()).map_err(|_| Error::KernelUnavailable {
                backend: "cuda",
                arch: arch.clone(),
                built: k.symbol().into(),
            })?;
            // SAFETY: `module` was just loaded in the current context.
            let f = unsafe { cu::module::get_function(module, name) }
                .map_err(|e| err("cuModuleGetFunction", e))?;
            funcs.insert(k, f);
        }
        // Optional: the tensor-core conv3d kernel exists for sm_80 and newer
        // only (conv3d.hip compiles it out below); absent, the scalar tiled
        // kernel serves bf16.
        let mma = Kernel::Conv3dTiledBf16Mma;
        if let (true, Ok(name)) = (mma.module() == which, CString::new(mma.symbol())) {
            // SAFETY: `module` was just loaded in the current context.
            if let Ok(f) = unsafe { cu::module::get_function(module, name) } {
                funcs.insert(mma, f);
            }
        }
        Ok(Module {
            module,
            funcs,
            source,
        })
    }

    fn module(&self, which: KernelModule) -> Result<Arc<Module>> {
        let Some(cell) = self.modules.get(which.index()) else {
            return Err(Error::KernelUnavailable {
                backend: "cuda",
                arch: self.info.arch.clone(),
                built: which.name().into(),
            });
        };
        let mut slot = match cell.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some(m) = &*slot {
            return Ok(Arc::clone(m));
        }
        let m = Arc::new(self.load_module(which)?);
        *slot = Some(Arc::clone(&m));
        Ok(m)
    }

    /// Launches `call` on `s`.
    ///
    /// # Safety
    /// The memory `call`'s arguments reference satisfies the kernel's
    /// contract (its constructor in `kernels.rs` documents the parameters).
    unsafe fn launch(&self, mut call: KernelCall, s: RawStream) -> Result<()> {
        let m = self.module(call.kernel.module())?;
        let f = *m.funcs.get(&call.kernel).ok_or(Error::KernelUnavailable {
            backend: "cuda",
            arch: self.info.arch.clone(),
            built: call.kernel.symbol().into(),
        })?;
        self.bind()?;
        let [gx, gy, gz] = call.grid;
        let mut args = call.arg_ptrs();
        // SAFETY: `f` is a function of the loaded module; `args` point into
        // `call`, alive until the launch returns (the driver copies the
        // values); the caller vouches for the memory they reference.
        unsafe {
            cu::launch_kernel(
                f,
                (gx, gy, gz),
                (call.block, 1, 1),
                call.shared_bytes,
                stream(s),
                &mut args,
            )
        }
        .map_err(|e| err("cuLaunchKernel", e))
    }

    fn mps(&self) -> u32 {
        self.info.multiprocessors
    }
}

fn stream(s: RawStream) -> sys::CUstream {
    s.0 as usize as sys::CUstream
}
fn event(e: RawEvent) -> sys::CUevent {
    e.0 as usize as sys::CUevent
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Errors here have nowhere to go (the device is being closed); they
        // are dropped, never printed or panicked.
        let dnn = match self.cudnn.get_mut() {
            Ok(c) => c.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(mut c) = dnn {
            if self.bind().is_ok() {
                // SAFETY: the kept buffers are this device's, and idle:
                // every vendor call waits for its stream before returning.
                let _ = unsafe { c.buffers().release(self) };
                drop(c);
            } else {
                // Its handle lives in a context we cannot make current.
                std::mem::forget(c);
            }
        }
        let loaded: Vec<Arc<Module>> = self
            .modules
            .iter_mut()
            .filter_map(|cell| match cell.get_mut() {
                Ok(m) => m.take(),
                Err(p) => p.into_inner().take(),
            })
            .collect();
        for m in loaded {
            if self.bind().is_ok() {
                // SAFETY: the module was loaded by us and is unloaded once;
                // the device handle owning it is being dropped.
                let _ = unsafe { cu::module::unload(m.module) };
            }
        }
        // SAFETY: balances the retain in `open`.
        let _ = unsafe { cu::primary_ctx::release(self.dev) };
    }
}

// SAFETY: allocations come from the CUDA driver allocator with the requested size
// and 256-byte alignment (cuMemAlloc/cuMemHostAlloc align to at least 256), and every operation is the documented runtime
// call (or CPU routine) on exactly the ranges given.
unsafe impl Backend for CudaBackend {
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
        // SAFETY: the context is current; the memory is initialised by the
        // caller (Device::alloc_pinned zeroes it).
        let p = unsafe { cu::malloc_host(bytes, 0) }
            .map_err(|e| alloc_err("cuMemHostAlloc", bytes, e))?;
        Ok(p.cast())
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

    unsafe fn copy_htod(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees `bytes` readable host bytes that stay
        // valid until the stream reaches the copy.
        let host = unsafe { std::slice::from_raw_parts(src, bytes) };
        // SAFETY: `dst` is a live device range of `bytes` (caller).
        unsafe { cu::memcpy_htod_async(dst.0, host, stream(s)) }
            .map_err(|e| err("cuMemcpyHtoDAsync", e))
    }

    unsafe fn copy_dtoh(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller guarantees `bytes` writable host bytes, not read
        // until the stream reaches the copy.
        let host = unsafe { std::slice::from_raw_parts_mut(dst, bytes) };
        // SAFETY: `src` is a live device range of `bytes` (caller).
        unsafe { cu::memcpy_dtoh_async(host, src.0, stream(s)) }
            .map_err(|e| err("cuMemcpyDtoHAsync", e))
    }

    unsafe fn copy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        self.bind()?;
        // SAFETY: both are live device ranges of `bytes` (caller).
        unsafe { cu::memcpy_dtod_async(dst.0, src.0, bytes, stream(s)) }
            .map_err(|e| err("cuMemcpyDtoDAsync", e))
    }

    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()> {
        self.bind()?;
        // SAFETY: a live device range of `bytes` (caller).
        unsafe { cu::memset_d8_async(dst.0, 0, bytes, stream(s)) }
            .map_err(|e| err("cuMemsetD8Async", e))
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

    fn conv3d_weight_layout(
        &self,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &Conv3dGeometry,
    ) -> Conv3dWeightLayout {
        let has_mma = || {
            self.module(KernelModule::Conv3d)
                .is_ok_and(|m| m.funcs.contains_key(&Kernel::Conv3dTiledBf16Mma))
        };
        match kernel {
            Conv3dKernel::Naive => Conv3dWeightLayout::Standard,
            Conv3dKernel::Tiled if dtype == DType::BF16 && has_mma() => {
                Conv3dWeightLayout::packed_for(g).unwrap_or(Conv3dWeightLayout::TiledTransposed)
            }
            Conv3dKernel::Tiled => Conv3dWeightLayout::TiledTransposed,
        }
    }

    unsafe fn conv3d(&self, kernel: Conv3dKernel, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        // The caller arranged the weight in this (deterministic) layout.
        let call = match self.conv3d_weight_layout(kernel, args.dtype, &args.geometry) {
            Conv3dWeightLayout::TiledPacked { rows, cols } => {
                KernelCall::conv3d_tiled_mma(args, rows, cols)?
            }
            _ => KernelCall::conv3d(kernel, args)?,
        };
        // SAFETY: the ranges are the caller's (trait contract); the grid is
        // the one the kernel expects (checked by `KernelCall::conv3d`).
        unsafe { self.launch(call, s) }
    }

    fn conv3d_vendor_available(&self) -> Result<()> {
        super::cudnn::available()
    }

    unsafe fn conv3d_vendor(&self, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        let mut slot = match self.cudnn.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        self.bind()?;
        let c = match &mut *slot {
            Some(c) => c,
            None => slot.insert(Cudnn::new()?),
        };
        let launch = |call| {
            // SAFETY: vendor_conv3d launches only its epilogues, over the
            // caller's output and bias and its own scratch, on `s`.
            unsafe { self.launch(call, s) }
        };
        // SAFETY: the caller's guarantees; `launch` queues on `s` of this
        // device, whose cuDNN handle `c` is, with its context current.
        unsafe { vendor_conv3d(self, c, args, s, &launch) }
    }

    // ----- memory figures and versions (diagnostics) ---------------------
    /// `cuMemGetInfo` in this device's primary context.
    fn mem_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (free, total) = cu::mem_get_info().map_err(|e| err("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
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
mod kernel_cache_tests {
    use super::*;
    use std::ffi::OsString;
    use std::path::PathBuf;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    #[test]
    fn cache_dir_follows_the_environment() {
        assert_eq!(
            cache_dir_from(os("/c"), os("/x"), os("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(cache_dir_from(os(""), os("/x"), os("/h")), None);
        assert_eq!(
            cache_dir_from(None, os("/x"), os("/h")),
            Some(PathBuf::from("/x/rocm-safe"))
        );
        assert_eq!(
            cache_dir_from(None, os(""), os("/h")),
            Some(PathBuf::from("/h/.cache/rocm-safe"))
        );
        assert_eq!(cache_dir_from(None, None, None), None);
    }

    #[test]
    fn keys_depend_on_source_target_and_options() {
        let o = nvrtc_options("compute_90");
        let k = cache_key("src", "compute_90", &o);
        assert_eq!(k, cache_key("src", "compute_90", &o));
        assert_ne!(k, cache_key("src2", "compute_90", &o));
        assert_ne!(k, cache_key("src", "compute_80", &o));
        assert_ne!(
            k,
            cache_key("src", "compute_90", &nvrtc_options("compute_80"))
        );
    }

    #[test]
    fn cached_ptx_round_trips_and_damage_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let ptx = "//\n.version 8.0\n.target sm_90\n.entry f() { ret; }\n";
        assert_eq!(read_cached(dir.path(), "compute_90", 7), None);
        write_cached(dir.path(), "compute_90", 7, ptx);
        assert_eq!(
            read_cached(dir.path(), "compute_90", 7).as_deref(),
            Some(ptx)
        );
        // Another key or target: another file.
        assert_eq!(read_cached(dir.path(), "compute_90", 8), None);
        assert_eq!(read_cached(dir.path(), "compute_80", 7), None);
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A changed byte, a cut file, a foreign header: rejected.
        let path = cache_file(dir.path(), "compute_90", 7);
        let text = std::fs::read_to_string(&path).unwrap();
        for bad in [
            text.replace("sm_90", "sm_91"),
            text[..text.len() - 5].to_owned(),
            text.replacen("rocm-safe", "rocm-save", 1),
            ptx.to_owned(),
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(read_cached(dir.path(), "compute_90", 7), None, "{bad}");
        }
        // A directory that cannot be created: nothing written, no panic.
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        write_cached(&file.join("sub"), "compute_90", 7, ptx);
        assert_eq!(read_cached(&file.join("sub"), "compute_90", 7), None);
    }
}
