//! The GPU backend body, written once for every runtime: the [`Runtime`]
//! trait (what HIP and CUDA each supply) and [`Gpu`], which owns the module
//! cache, the kernel operations, the vendor-library slot and the teardown
//! order.
//!
//! A runtime implements [`Driver`] (memory, streams, events, copies) and
//! [`Runtime`] (make the device current, load a module, look a kernel up,
//! launch it, its [`KernelCaps`], open its vendor library). Everything a
//! kernel operation does beyond that (argument marshalling in
//! `kernels.rs`, grid sizes, which kernel serves which call, the conv3d
//! weight layout, the vendor tier's buffers and epilogues) is here, so the
//! code HIP runs is the code the CUDA tests execute.
#![cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::backend::{Backend, Driver, KernelOp};
use super::conv3d::{Conv3dKernel, Conv3dLaunch, Conv3dWeightLayout};
use super::hostmem::{Mapping, PinMethod, REGISTER_MIN};
use super::info::{DeviceInfo, KernelCaps, KernelSource, RawStream};
use super::kernels::{Kernel, KernelCall, KernelModule};
use super::vendor::{vendor_conv3d, VendorConv};
use crate::conv3d::Conv3dGeometry;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// What a GPU runtime (HIP, CUDA) supplies beyond [`Driver`]; [`Gpu`] does
/// the rest.
///
/// # Safety
/// As [`Driver`]; in addition [`Runtime::launch`] launches exactly the
/// function given with the grid, block, shared memory and arguments of the
/// call, on the stream given, and the handles a runtime returns stay valid
/// until unloaded.
pub(crate) unsafe trait Runtime: Driver + Sized {
    /// A loaded module.
    type Module: Send + Sync;
    /// A kernel of a loaded module.
    type Function: Copy + Send + Sync;
    /// The vendor convolution library's state (handle, plans, buffers).
    type Vendor: VendorConv + Send;

    /// What the kernels can do here ([`KernelCaps::modules`] modules).
    fn caps(&self) -> KernelCaps;
    /// Makes this device current for the calling thread.
    fn bind(&self) -> Result<()>;
    /// Loads module `which` (with one module, every kernel is in it and
    /// `which` is [`KernelModule::Core`]); says how its code was obtained.
    fn load_module(&self, which: KernelModule) -> Result<(Self::Module, KernelSource)>;
    /// Kernel `symbol` of `module`.
    fn function(&self, module: &Self::Module, symbol: &'static str) -> Result<Self::Function>;
    /// Unloads a module.
    ///
    /// # Safety
    /// `module` came from [`Runtime::load_module`], is unloaded once, and no
    /// launch of its kernels can follow.
    unsafe fn unload_module(&self, module: Self::Module) -> Result<()>;
    /// Launches `f` with `call`'s grid, block, shared memory and arguments on
    /// `s` (the device is current).
    ///
    /// # Safety
    /// `f` is `call.kernel` of a loaded module of this device; the memory
    /// `call`'s arguments reference satisfies the kernel's contract (its
    /// constructor in `kernels.rs` documents the parameters); `s` is live.
    unsafe fn launch(&self, f: Self::Function, call: &mut KernelCall, s: RawStream) -> Result<()>;
    /// Whether the vendor library can be loaded here (cheap after the first
    /// call): `Ok` or [`Error::VendorUnavailable`].
    fn vendor_available(&self) -> Result<()>;
    /// Opens the vendor library for this device (which is current).
    fn vendor_open(&self) -> Result<Self::Vendor>;
    /// Page-locks `bytes` of host memory at `p` for this device's copies
    /// (`cuMemHostRegister`, `hipHostRegister`).
    ///
    /// # Safety
    /// `p..p + bytes` is mapped, writable host memory that stays mapped
    /// until [`Runtime::host_unregister`].
    unsafe fn host_register(&self, p: *mut u8, bytes: usize) -> Result<()>;
    /// Undoes [`Runtime::host_register`].
    ///
    /// # Safety
    /// `p` was registered here, is unregistered once, and no queued copy
    /// uses it any more.
    unsafe fn host_unregister(&self, p: *mut u8) -> Result<()>;
}

/// A loaded module and the kernels looked up in it.
struct Loaded<R: Runtime> {
    module: R::Module,
    funcs: HashMap<Kernel, R::Function>,
    source: KernelSource,
}

/// A GPU device: a runtime and everything built on it once.
pub(crate) struct Gpu<R: Runtime> {
    /// The loaded modules, one slot per [`KernelCaps::modules`].
    modules: Vec<Mutex<Option<Arc<Loaded<R>>>>>,
    /// The vendor library's state, opened on the first vendor call.
    vendor: Mutex<Option<R::Vendor>>,
    /// Pinned host memory we mapped and registered, by address
    /// ([`Driver::alloc_pinned`] here).
    mapped: Mutex<HashMap<usize, Mapping>>,
    /// How large pinned buffers are made (`ROCM_SAFE_PINNED`).
    pin: PinMethod,
    /// Set when the runtime refused a registration: the runtime's own
    /// pinned allocator serves from then on.
    register_refused: AtomicBool,
    /// Last: dropped after the modules and the vendor state (`Drop`).
    rt: R,
}

impl<R: Runtime> std::fmt::Debug for Gpu<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("runtime", &self.rt).finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl<R: Runtime> Gpu<R> {
    /// The GPU body over an opened runtime.
    pub(crate) fn new(rt: R) -> Gpu<R> {
        Gpu::with_pin(rt, PinMethod::from_env())
    }

    /// [`Gpu::new`] with the pinning method given (tests).
    pub(crate) fn with_pin(rt: R, pin: PinMethod) -> Gpu<R> {
        let n = rt.caps().modules.max(1);
        Gpu {
            modules: (0..n).map(|_| Mutex::new(None)).collect(),
            vendor: Mutex::new(None),
            mapped: Mutex::new(HashMap::new()),
            pin,
            register_refused: AtomicBool::new(false),
            rt,
        }
    }

    /// A mapped, registered buffer of at least `bytes`, or `None` where
    /// this device does not register (small sizes, `hostalloc`, an earlier
    /// refusal) or the mapping or registration failed (the caller then uses
    /// the runtime's allocator).
    fn alloc_registered(&self, bytes: usize) -> Option<*mut u8> {
        if bytes < REGISTER_MIN
            || self.pin != PinMethod::Register
            || self.register_refused.load(Ordering::Relaxed)
        {
            return None;
        }
        let m = match Mapping::new(bytes) {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, bytes, "pinned memory: no mapping");
                return None;
            }
        };
        // SAFETY: the mapping stays mapped until `free_pinned` (or `Drop`)
        // has unregistered it.
        match unsafe { self.rt.host_register(m.ptr(), m.len()) } {
            Ok(()) => {
                let p = m.ptr();
                lock(&self.mapped).insert(p as usize, m);
                Some(p)
            }
            Err(e) => {
                tracing::info!(error = %e, "pinned memory: registration refused; using the runtime's allocator");
                self.register_refused.store(true, Ordering::Relaxed);
                None
            }
        }
    }

    /// The module slot `k` is built into.
    fn slot_of(&self, k: Kernel) -> (usize, KernelModule) {
        if self.modules.len() == 1 {
            (0, KernelModule::Core)
        } else {
            (k.module().index(), k.module())
        }
    }

    fn unavailable(&self, built: impl Into<String>) -> Error {
        Error::KernelUnavailable {
            backend: self.rt.info().kind.name(),
            arch: self.rt.info().arch.clone(),
            built: built.into(),
        }
    }

    fn load(&self, index: usize, which: KernelModule) -> Result<Loaded<R>> {
        self.rt.bind()?;
        let (module, source) = self.rt.load_module(which)?;
        let single = self.modules.len() == 1;
        let mut funcs = HashMap::new();
        let mut missing = None;
        for k in Kernel::ALL
            .into_iter()
            .filter(|k| single || k.module().index() == index)
        {
            match self.rt.function(&module, k.symbol()) {
                Ok(f) => {
                    funcs.insert(k, f);
                }
                Err(e) => {
                    missing = Some(e);
                    break;
                }
            }
        }
        // Optional kernels (the tensor-core conv3d on CUDA sm_80+) are
        // compiled out elsewhere: absent, the scalar kernel serves.
        let opt = Kernel::Conv3dTiledBf16Mma;
        if single || opt.module().index() == index {
            if let Ok(f) = self.rt.function(&module, opt.symbol()) {
                funcs.insert(opt, f);
            }
        }
        if let Some(e) = missing {
            // SAFETY: loaded just above, unloaded once, nothing launched.
            let _ = unsafe { self.rt.unload_module(module) };
            return Err(e);
        }
        Ok(Loaded {
            module,
            funcs,
            source,
        })
    }

    /// The module holding `k`, loaded on first use.
    fn module(&self, k: Kernel) -> Result<Arc<Loaded<R>>> {
        let (index, which) = self.slot_of(k);
        let Some(cell) = self.modules.get(index) else {
            return Err(self.unavailable(which.name()));
        };
        let mut slot = lock(cell);
        if let Some(m) = &*slot {
            return Ok(Arc::clone(m));
        }
        let m = Arc::new(self.load(index, which)?);
        *slot = Some(Arc::clone(&m));
        Ok(m)
    }

    /// Whether `k` exists on this device (loads its module).
    fn has(&self, k: Kernel) -> bool {
        self.module(k).is_ok_and(|m| m.funcs.contains_key(&k))
    }

    /// Launches `call` on `s`.
    ///
    /// # Safety
    /// The memory `call`'s arguments reference satisfies the kernel's
    /// contract (its constructor in `kernels.rs` documents the parameters);
    /// `s` is a live stream of this device.
    unsafe fn launch(&self, mut call: KernelCall, s: RawStream) -> Result<()> {
        let m = self.module(call.kernel)?;
        let Some(&f) = m.funcs.get(&call.kernel) else {
            return Err(self.unavailable(call.kernel.symbol()));
        };
        self.rt.bind()?;
        // SAFETY: `f` is `call.kernel` of a loaded module of this device (the
        // Arc keeps it loaded); the caller vouches for the memory and `s`.
        unsafe { self.rt.launch(f, &mut call, s) }
    }

    fn mps(&self) -> u32 {
        self.rt.info().multiprocessors
    }

    /// The vendor call of [`KernelOp::Conv3dVendor`].
    ///
    /// # Safety
    /// As [`Backend::run`] for `args` and `s`.
    unsafe fn vendor(&self, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        self.rt.vendor_available()?;
        let mut slot = lock(&self.vendor);
        self.rt.bind()?;
        let lib = match &mut *slot {
            Some(v) => v,
            None => slot.insert(self.rt.vendor_open()?),
        };
        let launch = |call| {
            // SAFETY: vendor_conv3d launches only its epilogues, over the
            // caller's output and bias and its own scratch, on `s`.
            unsafe { self.launch(call, s) }
        };
        // SAFETY: the caller's guarantees; `launch` queues on `s` of this
        // device, whose vendor state `lib` is, with the device current.
        unsafe { vendor_conv3d(&self.rt, lib, args, s, &launch) }
    }
}

impl<R: Runtime> Drop for Gpu<R> {
    /// The teardown order: the vendor library's kept buffers, then its
    /// handle, then the modules, then (dropping `rt`) the runtime's own
    /// state (CUDA releases its context). Errors here have nowhere to go
    /// (the device is being closed); they are dropped, never printed or
    /// panicked.
    fn drop(&mut self) {
        let vendor = match self.vendor.get_mut() {
            Ok(v) => v.take(),
            Err(p) => p.into_inner().take(),
        };
        if let Some(mut v) = vendor {
            if self.rt.bind().is_ok() {
                // SAFETY: the kept buffers are this device's, and idle:
                // every vendor call waits for its stream before returning.
                let _ = unsafe { v.buffers().release(&self.rt) };
                drop(v);
            } else {
                // Its handle belongs to a device we cannot make current.
                std::mem::forget(v);
            }
        }
        let loaded: Vec<Arc<Loaded<R>>> = self
            .modules
            .iter_mut()
            .filter_map(|cell| match cell.get_mut() {
                Ok(m) => m.take(),
                Err(p) => p.into_inner().take(),
            })
            .collect();
        for m in loaded {
            // `&mut self`: no launch holds a clone any more.
            let Ok(m) = Arc::try_unwrap(m) else { continue };
            if self.rt.bind().is_ok() {
                // SAFETY: loaded by us, unloaded once, no launch can follow.
                let _ = unsafe { self.rt.unload_module(m.module) };
            }
        }
        // Pinned buffers hold the device, so none is left unless one was
        // leaked; a leaked mapping is unregistered before it is unmapped,
        // and one the runtime will not unregister stays mapped.
        let mapped = std::mem::take(match self.mapped.get_mut() {
            Ok(m) => m,
            Err(p) => p.into_inner(),
        });
        for (p, m) in mapped {
            // SAFETY: registered by us, unregistered once; the device is
            // closing, so no copy is queued on it.
            if unsafe { self.rt.host_unregister(p as *mut u8) }.is_err() {
                std::mem::forget(m);
            }
        }
    }
}

// SAFETY: memory, streams, events and copies are the runtime's (a correct
// `Driver`); nothing here adds to them.
unsafe impl<R: Runtime> Driver for Gpu<R> {
    fn info(&self) -> &DeviceInfo {
        self.rt.info()
    }
    fn forward(&self) -> Option<&dyn Driver> {
        Some(&self.rt)
    }

    /// Large buffers: huge pages mapped here, faulted in on the rayon pool
    /// and registered with the runtime (5-7x faster to pin than the
    /// runtime's allocator on the H100 host; `device/hostmem.rs`); small
    /// ones, `ROCM_SAFE_PINNED=hostalloc`, or after a refused
    /// registration: the runtime's allocator.
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        match self.alloc_registered(bytes) {
            Some(p) => Ok(p),
            None => self.rt.alloc_pinned(bytes),
        }
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        let mapped = lock(&self.mapped).remove(&(ptr as usize));
        match mapped {
            Some(m) => {
                // SAFETY: registered in `alloc_pinned`, freed once and idle
                // (the caller's guarantees).
                match unsafe { self.rt.host_unregister(ptr) } {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        // Still locked by the runtime: never unmapped.
                        std::mem::forget(m);
                        Err(e)
                    }
                }
            }
            // SAFETY: the caller's guarantees, forwarded.
            None => unsafe { self.rt.free_pinned(ptr, bytes) },
        }
    }
}

// SAFETY: every kernel operation launches the kernel of `hip-kernels/` that
// computes it, with the arguments and grid `kernels.rs` builds from exactly
// the caller's ranges; the vendor call is `vendor_conv3d`'s contract.
unsafe impl<R: Runtime> Backend for Gpu<R> {
    fn caps(&self) -> KernelCaps {
        self.rt.caps()
    }

    fn kernel_source(&self) -> Result<KernelSource> {
        Ok(self.module(Kernel::ConvertBf16F32)?.source)
    }

    unsafe fn run(&self, op: &KernelOp<'_>, s: RawStream) -> Result<()> {
        let call = match *op {
            // SAFETY: the caller's guarantees (trait contract).
            KernelOp::Conv3dVendor { args } => return unsafe { self.vendor(args, s) },
            // The caller arranged the weight in this (deterministic) layout.
            KernelOp::Conv3d { kernel, args } => {
                match self.conv3d_weight_layout(kernel, args.dtype, &args.geometry) {
                    Conv3dWeightLayout::TiledPacked { rows, cols } => {
                        KernelCall::conv3d_tiled_mma(args, rows, cols)?
                    }
                    _ => KernelCall::conv3d(kernel, args)?,
                }
            }
            _ => KernelCall::for_op(op, self.mps())?,
        };
        // SAFETY: the ranges are the caller's (trait contract); the grid and
        // arguments are the kernel's (checked by `KernelCall`).
        unsafe { self.launch(call, s) }
    }

    fn conv3d_weight_layout(
        &self,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &Conv3dGeometry,
    ) -> Conv3dWeightLayout {
        let mut caps = self.rt.caps();
        // Declared by the arch, confirmed by the loaded module (it may have
        // been built without the tensor-core kernel).
        caps.bf16_tensor_cores = caps.bf16_tensor_cores
            && kernel == Conv3dKernel::Tiled
            && dtype == DType::BF16
            && self.has(Kernel::Conv3dTiledBf16Mma);
        Conv3dWeightLayout::choose(caps, kernel, dtype, g)
    }

    fn conv3d_vendor_available(&self) -> Result<()> {
        self.rt.vendor_available()
    }
}

/// The generic body over a recording runtime, so that CI executes what HIP
/// and CUDA share: the module cache, kernel lookup (optional kernels
/// included), the launches each operation makes, the weight-layout choice
/// from [`KernelCaps`], the vendor slot and the teardown order.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
    use crate::device::host::HostBackend;
    use crate::device::info::{ConvertOp, DevicePtr};
    use crate::device::vendor::VendorBuffers;

    /// What the recording runtime saw, in order.
    type Log = Arc<Mutex<Vec<String>>>;

    fn push(log: &Log, s: impl Into<String>) {
        lock(log).push(s.into());
    }

    #[derive(Debug)]
    struct Recording {
        host: HostBackend,
        caps: KernelCaps,
        log: Log,
        /// Symbols `function` does not find.
        absent: Vec<&'static str>,
        /// `host_register` / `host_unregister` fail.
        refuse: (bool, bool),
    }

    impl Drop for Recording {
        fn drop(&mut self) {
            push(&self.log, "runtime dropped");
        }
    }

    // SAFETY: memory and streams are the host backend's.
    unsafe impl Driver for Recording {
        fn info(&self) -> &DeviceInfo {
            self.host.info()
        }
        fn forward(&self) -> Option<&dyn Driver> {
            Some(&self.host)
        }
        unsafe fn free(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
            push(&self.log, format!("free {bytes}"));
            // SAFETY: the caller's guarantees, forwarded.
            unsafe { self.host.free(ptr, bytes) }
        }
        fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
            push(&self.log, format!("runtime alloc_pinned {bytes}"));
            self.host.alloc_pinned(bytes)
        }
        unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
            push(&self.log, format!("runtime free_pinned {bytes}"));
            // SAFETY: the caller's guarantees, forwarded.
            unsafe { self.host.free_pinned(ptr, bytes) }
        }
    }

    struct Vendor {
        log: Log,
        buffers: VendorBuffers,
    }

    impl Drop for Vendor {
        fn drop(&mut self) {
            push(&self.log, "vendor dropped");
        }
    }

    impl VendorConv for Vendor {
        fn workspace(&mut self, _a: &Conv3dLaunch) -> Result<usize> {
            Ok(1000)
        }
        unsafe fn forward(
            &mut self,
            _a: &Conv3dLaunch,
            _s: RawStream,
            _y: DevicePtr,
            _ws: DevicePtr,
        ) -> Result<()> {
            push(&self.log, "vendor forward");
            Ok(())
        }
        fn buffers(&mut self) -> &mut VendorBuffers {
            &mut self.buffers
        }
    }

    // SAFETY: `launch` only records the call (it touches no memory).
    unsafe impl Runtime for Recording {
        type Module = KernelModule;
        type Function = &'static str;
        type Vendor = Vendor;
        fn caps(&self) -> KernelCaps {
            self.caps
        }
        fn bind(&self) -> Result<()> {
            Ok(())
        }
        fn load_module(&self, which: KernelModule) -> Result<(KernelModule, KernelSource)> {
            push(&self.log, format!("load {}", which.name()));
            Ok((which, KernelSource::Compiled))
        }
        fn function(&self, _m: &KernelModule, symbol: &'static str) -> Result<&'static str> {
            if self.absent.contains(&symbol) {
                return Err(Error::KernelUnavailable {
                    backend: "test",
                    arch: "test".into(),
                    built: symbol.into(),
                });
            }
            Ok(symbol)
        }
        unsafe fn unload_module(&self, m: KernelModule) -> Result<()> {
            push(&self.log, format!("unload {}", m.name()));
            Ok(())
        }
        unsafe fn launch(
            &self,
            f: &'static str,
            call: &mut KernelCall,
            _s: RawStream,
        ) -> Result<()> {
            assert_eq!(f, call.kernel.symbol());
            assert!(call.block > 0 && call.grid.iter().all(|&g| g > 0));
            push(&self.log, format!("launch {f}"));
            Ok(())
        }
        fn vendor_available(&self) -> Result<()> {
            Ok(())
        }
        fn vendor_open(&self) -> Result<Vendor> {
            push(&self.log, "vendor opened");
            Ok(Vendor {
                log: Arc::clone(&self.log),
                buffers: VendorBuffers::default(),
            })
        }
        unsafe fn host_register(&self, p: *mut u8, bytes: usize) -> Result<()> {
            push(&self.log, format!("register {bytes}"));
            assert_eq!(p as usize % super::super::hostmem::HUGE_PAGE, 0);
            if self.refuse.0 {
                return Err(Error::BackendUnsupported {
                    backend: "test",
                    op: "host_register",
                });
            }
            Ok(())
        }
        unsafe fn host_unregister(&self, _p: *mut u8) -> Result<()> {
            push(&self.log, "unregister");
            if self.refuse.1 {
                return Err(Error::BackendUnsupported {
                    backend: "test",
                    op: "host_unregister",
                });
            }
            Ok(())
        }
    }

    fn gpu(modules: usize, tensor_cores: bool, absent: Vec<&'static str>) -> (Gpu<Recording>, Log) {
        gpu_pinning(
            modules,
            tensor_cores,
            absent,
            PinMethod::Register,
            (false, false),
        )
    }

    fn gpu_pinning(
        modules: usize,
        tensor_cores: bool,
        absent: Vec<&'static str>,
        pin: PinMethod,
        refuse: (bool, bool),
    ) -> (Gpu<Recording>, Log) {
        let log = Log::default();
        let caps = KernelCaps {
            code: crate::device::KernelCode::RunTime,
            modules,
            bf16_tensor_cores: tensor_cores,
            vendor_library: Some("test"),
        };
        let rt = Recording {
            host: HostBackend::new(),
            caps,
            log: Arc::clone(&log),
            absent,
            refuse,
        };
        (Gpu::with_pin(rt, pin), log)
    }

    fn taken(log: &Log) -> Vec<String> {
        std::mem::take(&mut *lock(log))
    }

    /// Large pinned buffers are mapped here and registered (rounded up to
    /// whole 2 MiB pages), zeroed and writable, and unregistered when
    /// freed; small ones come from the runtime's allocator.
    #[test]
    fn large_pinned_buffers_are_registered_mappings_small_ones_the_runtimes() {
        let (g, log) = gpu(1, false, vec![]);
        let big = 3 << 20;
        let p = g.alloc_pinned(big).unwrap();
        assert_eq!(taken(&log), ["register 4194304"]);
        // SAFETY: `big` bytes of host memory, ours alone until freed.
        let s = unsafe { std::slice::from_raw_parts_mut(p, big) };
        assert!(s.iter().all(|&b| b == 0));
        s.fill(0x5A);
        // SAFETY: allocated above with `big`, freed once, idle.
        unsafe { g.free_pinned(p, big) }.unwrap();
        assert_eq!(taken(&log), ["unregister"]);
        assert!(lock(&g.mapped).is_empty());

        let small = REGISTER_MIN - 256;
        let p = g.alloc_pinned(small).unwrap();
        // SAFETY: as above.
        unsafe { g.free_pinned(p, small) }.unwrap();
        assert_eq!(
            taken(&log),
            [
                format!("runtime alloc_pinned {small}"),
                format!("runtime free_pinned {small}")
            ]
        );
    }

    /// `ROCM_SAFE_PINNED=hostalloc` never registers; a runtime that refuses
    /// one registration is not asked again, and its buffers go back to its
    /// allocator.
    #[test]
    fn hostalloc_or_a_refused_registration_uses_the_runtimes_allocator() {
        let big = 4 << 20;
        let (g, log) = gpu_pinning(1, false, vec![], PinMethod::HostAlloc, (false, false));
        let p = g.alloc_pinned(big).unwrap();
        // SAFETY: allocated above with `big`, freed once, idle.
        unsafe { g.free_pinned(p, big) }.unwrap();
        assert_eq!(
            taken(&log),
            [
                format!("runtime alloc_pinned {big}"),
                format!("runtime free_pinned {big}")
            ]
        );

        let (g, log) = gpu_pinning(1, false, vec![], PinMethod::Register, (true, false));
        let a = g.alloc_pinned(big).unwrap();
        let b = g.alloc_pinned(big).unwrap();
        // SAFETY: as above, each once.
        unsafe {
            g.free_pinned(a, big).unwrap();
            g.free_pinned(b, big).unwrap();
        }
        assert_eq!(
            taken(&log),
            [
                format!("register {big}"),
                format!("runtime alloc_pinned {big}"),
                format!("runtime alloc_pinned {big}"),
                format!("runtime free_pinned {big}"),
                format!("runtime free_pinned {big}"),
            ]
        );
    }

    /// A failed unregistration is the caller's error (the mapping stays,
    /// never unmapped under the runtime); a buffer leaked past the device's
    /// end is unregistered before the runtime goes.
    #[test]
    fn unregistration_failures_and_leaks() {
        let big = 2 << 20;
        let (g, log) = gpu_pinning(1, false, vec![], PinMethod::Register, (false, true));
        let p = g.alloc_pinned(big).unwrap();
        // SAFETY: allocated above with `big`, freed once, idle.
        let e = unsafe { g.free_pinned(p, big) }.unwrap_err();
        assert!(
            matches!(
                e,
                Error::BackendUnsupported {
                    op: "host_unregister",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(lock(&g.mapped).is_empty());

        let (g, log2) = gpu(1, false, vec![]);
        let _leaked = g.alloc_pinned(big).unwrap();
        drop(g);
        assert_eq!(
            taken(&log2),
            ["register 2097152", "unregister", "runtime dropped"]
        );
        drop(log);
    }

    fn geometry(dtype_bf16: bool) -> Conv3dLaunch {
        let (input, weight) = ([1, 16, 4, 8, 8], [16, 16, 3, 3, 3]);
        let x = vec![0f32; input.iter().product()];
        let w = vec![0f32; weight.iter().product()];
        let g = Conv3dProblem::new(
            Conv3dParams::default().with_padding([1; 3]),
            Conv3dData::F32(&x),
            &input,
            Conv3dData::F32(&w),
            &weight,
            None,
        )
        .unwrap()
        .geometry;
        Conv3dLaunch {
            geometry: g,
            dtype: if dtype_bf16 { DType::BF16 } else { DType::F32 },
            input: DevicePtr(256),
            weight: DevicePtr(512),
            bias: Some(DevicePtr(768)),
            output: DevicePtr(1024),
        }
    }

    fn convert(op: ConvertOp, n: u64) -> KernelOp<'static> {
        KernelOp::Convert {
            op,
            src: DevicePtr(0),
            dst: DevicePtr(0),
            n,
        }
    }

    fn scan(dtype: DType, clamp: bool) -> KernelOp<'static> {
        let (ptr, n, counts) = (DevicePtr(0), 10, DevicePtr(0));
        if clamp {
            KernelOp::ClampNonFinite {
                dtype,
                ptr,
                n,
                counts,
            }
        } else {
            KernelOp::CountNonFinite {
                dtype,
                ptr,
                n,
                counts,
            }
        }
    }

    fn fingerprint() -> KernelOp<'static> {
        KernelOp::FingerprintSum {
            src: DevicePtr(0),
            bytes: 64,
            first_word: 0,
            acc: DevicePtr(0),
        }
    }

    fn conv(kernel: Conv3dKernel, args: &Conv3dLaunch) -> KernelOp<'_> {
        KernelOp::Conv3d { kernel, args }
    }

    fn count(log: &Log, s: &str) -> usize {
        lock(log).iter().filter(|l| *l == s).count()
    }

    #[test]
    fn modules_load_once_each_on_first_use_and_unload_in_order() {
        let (g, log) = gpu(2, false, vec![]);
        let s = RawStream(0);
        let op = ConvertOp::DEVICE[0];
        // SAFETY: the recording runtime touches no memory.
        unsafe {
            g.run(&convert(op, 10), s).unwrap();
            g.run(&convert(op, 10), s).unwrap();
            g.run(&scan(DType::F32, false), s).unwrap();
            g.run(&scan(DType::BF16, true), s).unwrap();
        }
        assert_eq!(count(&log, "load core"), 1, "{:?}", lock(&log));
        assert_eq!(
            count(&log, "load conv3d"),
            0,
            "conv3d not compiled for conversions"
        );
        assert_eq!(count(&log, "launch convert_bf16_f32"), 2);
        assert_eq!(count(&log, "launch nonfinite_f32"), 1);
        assert_eq!(count(&log, "launch nonfinite_bf16"), 1);
        assert_eq!(g.kernel_source().unwrap(), KernelSource::Compiled);
        let a = geometry(false);
        // SAFETY: as above.
        unsafe { g.run(&conv(Conv3dKernel::Naive, &a), s) }.unwrap();
        assert_eq!(count(&log, "load conv3d"), 1);
        drop(g);
        let l = lock(&log).clone();
        let at = |s: &str| l.iter().position(|x| x == s).unwrap();
        assert!(at("unload core") < at("runtime dropped"), "{l:?}");
        assert!(at("unload conv3d") < at("runtime dropped"), "{l:?}");
    }

    #[test]
    fn one_module_holds_every_kernel() {
        let (g, log) = gpu(1, false, vec![]);
        // SAFETY: the recording runtime touches no memory.
        unsafe {
            g.run(&conv(Conv3dKernel::Tiled, &geometry(false)), RawStream(0))
                .unwrap();
            g.run(&fingerprint(), RawStream(0)).unwrap();
        }
        assert_eq!(count(&log, "load core"), 1, "{:?}", lock(&log));
        assert_eq!(count(&log, "launch conv3d_tiled_f32"), 1);
        assert_eq!(count(&log, "launch fingerprint_sum_u8"), 1);
    }

    #[test]
    fn a_missing_kernel_fails_the_load_and_unloads_the_module() {
        let (g, log) = gpu(2, false, vec!["convert_f16_f32"]);
        let op = ConvertOp::DEVICE[0];
        // SAFETY: the recording runtime touches no memory.
        let e = unsafe { g.run(&convert(op, 1), RawStream(0)) };
        assert!(matches!(e, Err(Error::KernelUnavailable { .. })), "{e:?}");
        assert_eq!(count(&log, "unload core"), 1, "{:?}", lock(&log));
        // Not cached: the next call tries again.
        // SAFETY: as above.
        let _ = unsafe { g.run(&convert(op, 1), RawStream(0)) };
        assert_eq!(count(&log, "load core"), 2);
    }

    #[test]
    fn tensor_cores_are_declared_then_confirmed_by_the_module() {
        let bf16 = geometry(true);
        let layout = |g: &Gpu<Recording>, dtype| {
            g.conv3d_weight_layout(Conv3dKernel::Tiled, dtype, &bf16.geometry)
        };
        let (with, _) = gpu(2, true, vec![]);
        assert!(matches!(
            layout(&with, DType::BF16),
            Conv3dWeightLayout::TiledPacked { .. }
        ));
        assert_eq!(
            layout(&with, DType::F32),
            Conv3dWeightLayout::TiledTransposed
        );
        // SAFETY: the recording runtime touches no memory.
        unsafe { with.run(&conv(Conv3dKernel::Tiled, &bf16), RawStream(0)) }.unwrap();
        let (without, _) = gpu(2, false, vec![]);
        assert_eq!(
            layout(&without, DType::BF16),
            Conv3dWeightLayout::TiledTransposed
        );
        // Declared, but the module was built without the kernel.
        let (absent, log) = gpu(2, true, vec!["conv3d_tiled_bf16_mma"]);
        assert_eq!(
            layout(&absent, DType::BF16),
            Conv3dWeightLayout::TiledTransposed
        );
        // SAFETY: as above.
        unsafe { absent.run(&conv(Conv3dKernel::Tiled, &bf16), RawStream(0)) }.unwrap();
        assert_eq!(
            count(&log, "launch conv3d_tiled_bf16"),
            1,
            "{:?}",
            lock(&log)
        );
        assert_eq!(
            gpu(2, false, vec![]).0.conv3d_weight_layout(
                Conv3dKernel::Naive,
                DType::BF16,
                &bf16.geometry
            ),
            Conv3dWeightLayout::Standard
        );
    }

    #[test]
    fn the_vendor_slot_opens_once_keeps_buffers_and_tears_down_first() {
        let (g, log) = gpu(2, false, vec![]);
        for dtype_bf16 in [false, true, false] {
            // SAFETY: the recording runtime's vendor and launches touch no
            // memory; its buffers are host allocations.
            unsafe {
                g.run(
                    &KernelOp::Conv3dVendor {
                        args: &geometry(dtype_bf16),
                    },
                    RawStream(0),
                )
            }
            .unwrap();
        }
        let l = lock(&log).clone();
        assert_eq!(
            l.iter().filter(|x| *x == "vendor opened").count(),
            1,
            "{l:?}"
        );
        assert_eq!(l.iter().filter(|x| *x == "vendor forward").count(), 3);
        // f32 with bias: the bias epilogue; bf16: the widening epilogue.
        assert_eq!(
            l.iter().filter(|x| *x == "launch conv3d_bias_f32").count(),
            2
        );
        assert_eq!(
            l.iter()
                .filter(|x| *x == "launch conv3d_widen_bias_bf16")
                .count(),
            1
        );
        // The 1000-byte workspace was kept, not freed between calls.
        assert_eq!(l.iter().filter(|x| *x == "free 1000").count(), 0, "{l:?}");
        let before = l.len();
        drop(g);
        let l = lock(&log).clone();
        let tail = &l[before..];
        let at = |s: &str| {
            tail.iter()
                .position(|x| x == s)
                .unwrap_or_else(|| panic!("{s} not in {tail:?}"))
        };
        assert!(at("free 1000") < at("vendor dropped"), "{tail:?}");
        assert!(at("vendor dropped") < at("unload conv3d"), "{tail:?}");
        assert!(at("unload conv3d") < at("runtime dropped"), "{tail:?}");
        // The epilogues live in the conv3d module: the core one never loaded.
        assert!(!tail.iter().any(|x| x == "unload core"), "{tail:?}");
    }
}
