//! The GPU backend body, written once for every runtime: the [`Runtime`]
//! trait (what HIP and CUDA each supply) and [`Gpu`], which owns the module
//! cache, the kernel operations, the vendor-library slot and the teardown
//! order.
//!
//! A runtime implements [`Driver`] (memory, streams, events, copies) and
//! [`Runtime`] (make the device current, load a module, look a kernel up,
//! launch it, its [`KernelCaps`], open its vendor library). Everything a
//! kernel operation does beyond that is here, so the code HIP runs is the
//! code the CUDA tests execute: what each op launches (`gpu/launch_plan.rs`,
//! one exhaustive match; the conv3d kernels' parameter lists and grids in
//! `gpu/conv3d_launch.rs`, the others' in `kernels.rs`), the conv3d
//! weight layout, and the vendor tier's buffers and epilogues.
#![cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::conv3d::Conv3dGeometry;
use crate::device::hostmem::{Mapping, REGISTER_MIN};
use crate::device::info::{KernelCaps, KernelSource, RawStream};
use crate::device::kernels::{Kernel, KernelCall, KernelModule};
use crate::device::options::Pinning;
use crate::device::raw::backend::{Backend, Driver, KernelOp};
use crate::device::raw::conv3d::{
    Conv3dBackwardLaunch, Conv3dKernel, Conv3dLaunch, Conv3dWeightLayout,
};
use crate::device::raw::wrap::Wrap;
use crate::device::runtime::vendor::vendor_backward::vendor_conv3d_backward;
use crate::device::runtime::vendor::{vendor_conv3d, VendorConv};
use crate::dtype::DType;
use crate::error::{Error, Result};

pub(crate) mod conv3d_launch;
mod launch_plan;

use launch_plan::LaunchPlan;

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
    /// Whether the vendor library's backward calls are bound here (the
    /// library loads and has them): `Ok` or [`Error::VendorUnavailable`].
    fn vendor_backward_available(&self) -> Result<()>;
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
    /// How large pinned buffers are made (`DeviceOptions::pinning`).
    pin: Pinning,
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
    /// The GPU body over an opened runtime, pinning host memory by `pin`
    /// (the device's [`DeviceOptions`](crate::device::DeviceOptions)).
    pub(crate) fn new(rt: R, pin: Pinning) -> Gpu<R> {
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

    /// Unregisters a mapping, then unmaps it; one the runtime will not
    /// unregister is still locked by it, so it is never unmapped (leaked).
    ///
    /// # Safety
    /// `m` was registered in [`Gpu::alloc_registered`], is released once,
    /// and no queued copy uses it any more.
    unsafe fn release(&self, m: Mapping) -> Result<()> {
        // SAFETY: the caller's guarantees.
        let r = unsafe { self.rt.host_unregister(m.ptr()) };
        if r.is_err() {
            std::mem::forget(m);
        }
        r
    }

    /// A mapped, registered buffer of at least `bytes`, or `None` where
    /// this device does not register (small sizes, `hostalloc`, an earlier
    /// refusal) or the mapping or registration failed (the caller then uses
    /// the runtime's allocator).
    fn alloc_registered(&self, bytes: usize) -> Option<*mut u8> {
        if bytes < REGISTER_MIN
            || self.pin != Pinning::Register
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
        let started = std::time::Instant::now();
        self.rt.bind()?;
        let (module, source) = self.rt.load_module(which)?;
        let single = self.modules.len() == 1;
        crate::device::record_kernel_load(crate::device::KernelLoad {
            backend: self.rt.info().kind.name(),
            arch: self.rt.info().arch.clone(),
            module: if single { "all" } else { which.name() },
            source,
            seconds: started.elapsed().as_secs_f64(),
        });
        let mut funcs = HashMap::new();
        let mut missing = None;
        for k in Kernel::all()
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

    /// Runs `call` with this device's vendor state (opened on first use,
    /// under its lock, the device current) and a launcher of kernels on `s`.
    ///
    /// # Safety
    /// `s` is a live stream of this device, and `call` launches through the
    /// launcher only kernel calls whose memory satisfies the kernel's
    /// contract (the vendor calls' epilogues and widenings).
    unsafe fn with_vendor(
        &self,
        s: RawStream,
        call: impl FnOnce(&mut R::Vendor, &dyn Fn(KernelCall) -> Result<()>) -> Result<()>,
    ) -> Result<()> {
        let mut slot = lock(&self.vendor);
        self.rt.bind()?;
        let lib = match &mut *slot {
            Some(v) => v,
            None => slot.insert(self.rt.vendor_open()?),
        };
        let launch = |k| {
            // SAFETY: the caller's guarantees: `call` launches only the
            // vendor calls' epilogues and widenings, over the caller's
            // ranges and their own kept buffers, on `s`.
            unsafe { self.launch(k, s) }
        };
        call(lib, &launch)
    }

    /// Carries out `plan` on `s`.
    ///
    /// # Safety
    /// As [`Backend::run`] for the op `plan` was made from
    /// ([`LaunchPlan::of`]).
    unsafe fn execute(&self, plan: LaunchPlan<'_>, s: RawStream) -> Result<()> {
        match plan {
            LaunchPlan::Kernels(calls) => {
                for call in calls {
                    // SAFETY: the ranges are the caller's (trait contract):
                    // each call reads and writes only them, with the grid
                    // and arguments its `KernelCall` constructor checked;
                    // all are queued on `s` in order (a check reads its
                    // locate slot after the locate wrote it).
                    unsafe { self.launch(call, s)? };
                }
                Ok(())
            }
            LaunchPlan::ZeroThen { dst, bytes, call } => {
                // SAFETY: `dst..dst + bytes` is the op's result, the
                // caller's and exclusive (trait contract); zeroed on `s`
                // before the kernel (on `s` too) adds its partial sums
                // into it.
                unsafe {
                    self.memset_zero(dst, bytes, s)?;
                    self.launch(call, s)
                }
            }
            // SAFETY: the caller's guarantees (trait contract).
            LaunchPlan::Vendor(args) => unsafe { self.vendor(args, s) },
            // SAFETY: the caller's guarantees (trait contract).
            LaunchPlan::VendorBackward(args) => unsafe { self.vendor_backward(args, s) },
        }
    }

    /// The vendor call of [`KernelOp::Conv3dVendor`].
    ///
    /// # Safety
    /// As [`Backend::run`] for `args` and `s`.
    unsafe fn vendor(&self, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        self.rt.vendor_available()?;
        let call = |lib: &mut R::Vendor, launch: &dyn Fn(KernelCall) -> Result<()>| {
            // SAFETY: the caller's guarantees; `launch` queues on `s` of
            // this device, whose vendor state `lib` is, with the device
            // current.
            unsafe { vendor_conv3d(&self.rt, lib, args, s, launch) }
        };
        // SAFETY: `s` is live (caller); `vendor_conv3d` launches only its
        // epilogues over the caller's output and bias and its own scratch.
        unsafe { self.with_vendor(s, call) }
    }

    /// The vendor call of [`KernelOp::Conv3dBackwardVendor`].
    ///
    /// # Safety
    /// As [`Backend::run`] for `args` and `s`.
    unsafe fn vendor_backward(&self, args: &Conv3dBackwardLaunch, s: RawStream) -> Result<()> {
        self.rt.vendor_backward_available()?;
        let call = |lib: &mut R::Vendor, launch: &dyn Fn(KernelCall) -> Result<()>| {
            // SAFETY: as in `vendor`.
            unsafe { vendor_conv3d_backward(&self.rt, lib, args, s, launch) }
        };
        // SAFETY: `s` is live (caller); `vendor_conv3d_backward` launches
        // only its widenings (the caller's operands into its kept buffers)
        // and the bias epilogue over the caller's result.
        unsafe { self.with_vendor(s, call) }
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
        let mapped = std::mem::take(
            self.mapped
                .get_mut()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for m in mapped.into_values() {
            // SAFETY: registered by us, unregistered once; the device is
            // closing, so no copy is queued on it.
            let _ = unsafe { self.release(m) };
        }
    }
}

/// The body's memory, streams, events and copies are its runtime's.
impl<R: Runtime> Wrap for Gpu<R> {
    type Inner = R;
    fn inner(&self) -> &R {
        &self.rt
    }
}

// SAFETY: memory, streams, events and copies are the runtime's (a correct
// `Driver`); nothing here adds to them.
unsafe impl<R: Runtime> Driver for Gpu<R> {
    crate::forward_driver!(
        info,
        alloc,
        free,
        stream_create,
        stream_destroy,
        stream_synchronize,
        synchronize,
        event_create,
        event_destroy,
        event_record,
        event_synchronize,
        stream_wait_event,
        event_elapsed_ms,
        copy,
        memset_zero,
        mem_info,
        register_read_only,
        unregister_read_only,
    );

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
            // SAFETY: registered in `alloc_pinned`, freed once and idle (the
            // caller's guarantees).
            Some(m) => unsafe { self.release(m) },
            // SAFETY: the caller's guarantees, forwarded.
            None => unsafe { self.rt.free_pinned(ptr, bytes) },
        }
    }
}

// SAFETY: every kernel operation launches the kernel of `kernels/` that
// computes it, with the arguments and grid `kernels.rs` builds from exactly
// the caller's ranges; the vendor calls are `vendor_conv3d`'s and
// `vendor_conv3d_backward`'s contracts.
unsafe impl<R: Runtime> Backend for Gpu<R> {
    fn caps(&self) -> KernelCaps {
        self.rt.caps()
    }

    fn kernel_source(&self) -> Result<KernelSource> {
        Ok(self.module(Kernel::FingerprintSum)?.source)
    }

    unsafe fn run(&self, op: &KernelOp<'_>, s: RawStream) -> Result<()> {
        let layout = |k, dtype, g: &Conv3dGeometry| self.conv3d_weight_layout(k, dtype, g);
        let plan = LaunchPlan::of(op, self.mps(), &layout)?;
        // SAFETY: the caller's guarantees (trait contract), for the plan of
        // this very op.
        unsafe { self.execute(plan, s) }
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

    fn conv3d_vendor_backward_available(&self) -> Result<()> {
        self.rt.vendor_backward_available()
    }
}

#[cfg(test)]
mod tests;
