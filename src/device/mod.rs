//! Devices, device memory, pinned host memory, streams and events.
//!
//! | concept | type | notes |
//! | --- | --- | --- |
//! | a GPU (or the CPU standing in for one) | [`Device`] | cheap to clone; records errors from `Drop` |
//! | a queue of device work | [`Stream`] | copies and kernels run in order on one stream |
//! | a point in a stream | [`Event`] | order streams, time work, know when a buffer is free |
//! | device memory | [`DeviceBuffer<T>`] | owns its allocation; `Drop` waits for the device, then frees |
//! | a range of device memory | [`DeviceView`], [`DeviceViewMut`] | borrowed, any element offset |
//! | page-locked host memory | [`PinnedBuffer<T>`] | async copies; host access waits for them |
//! | a conv3d on the device | [`Stream::conv3d`], [`Stream::conv3d_vendor`] | the conv3d chain's GPU tiers; [`Conv3dLaunch`] at the backend |
//!
//! Backends implement [`Backend`], a raw, object-safe interface (addresses,
//! handles, byte counts): [`host`] (always; device memory is host memory and
//! kernels are `crate::convert`), `hip` (feature `hip`) and `cuda` (feature
//! `cuda`). A wrapping backend implements [`Backend`] over another and is
//! opened with [`Device::from_backend`]: [`faults::Faults`] injects the
//! documented ROCm failure modes into any backend.
//!
//! The safe types uphold the raw interface's rules: zero-length work never
//! reaches a backend, lengths are checked before any call, memory is freed
//! once, after the device is idle.
//!
//! # Example: a staged, verified upload
//!
//! A copy stream fills a device buffer from pinned memory, an event orders
//! the conversion on a compute stream after it, and the conversion is
//! checked against the host's expectation. It runs here on the host
//! backend; `Device::open(BackendKind::Hip, 0)?` runs it on a GPU.
//!
//! ```
//! use half::bf16;
//! use rocm_safe::device::Device;
//! use rocm_safe::verify::{self, Served, VerifyOptions};
//!
//! # fn main() -> rocm_safe::Result<()> {
//! let dev = Device::host();
//! let (copy, compute) = (dev.stream()?, dev.stream()?);
//! let host: Vec<bf16> = (0..1000u16).map(bf16::from_bits).collect();
//!
//! let mut pinned = dev.alloc_pinned::<bf16>(host.len())?;
//! pinned.as_mut_slice()?.copy_from_slice(&host);
//! let mut staged = copy.alloc::<bf16>(host.len())?;
//! // Asynchronous; touching `pinned` again first waits for this copy.
//! staged.view_mut().copy_htod_async(&copy, &mut pinned)?;
//! let uploaded = dev.event()?;
//! copy.record(&uploaded)?;
//! compute.wait(&uploaded)?; // the conversion starts after the copy
//!
//! let mut out = compute.alloc::<f32>(host.len())?;
//! let opts = VerifyOptions::default(); // self-test once, fingerprint per call
//! let report = verify::convert_verified(&compute, &host, &staged.view(), &mut out.view_mut(), &opts)?;
//! assert_eq!(report.served, Served::Device);
//! assert_eq!(report.expected, report.actual);
//! # Ok(())
//! # }
//! ```

mod conv3d;
#[cfg(feature = "cuda")]
mod cudnn;
pub mod faults;
pub mod host;
pub(crate) mod kernels;
#[cfg(any(feature = "hip", test))]
pub(crate) mod miopen;
mod visible;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "hip")]
pub mod hip;

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};
use std::sync::{Arc, Mutex, OnceLock};

use crate::convert::fingerprint::{finish, Fingerprint};
use crate::convert::Element;
use crate::dtype::DType;
use crate::error::{Error, Result};

pub use conv3d::{tiled_weight_layout, Conv3dKernel, Conv3dLaunch, Conv3dWeightLayout};
pub use visible::VisibleDevices;

/// Which implementation runs a [`Device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum BackendKind {
    /// The CPU: device memory is host memory, kernels are `crate::convert`.
    Host,
    /// AMD GPUs through the HIP runtime (feature `hip`).
    Hip,
    /// NVIDIA GPUs through the CUDA driver and NVRTC (feature `cuda`).
    Cuda,
}

impl BackendKind {
    /// The backend's lowercase name (`"host"`, `"hip"`, `"cuda"`).
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Hip => "hip",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Whether this build contains the backend (its cargo feature is on).
    pub const fn is_built(self) -> bool {
        match self {
            BackendKind::Host => true,
            BackendKind::Hip => cfg!(feature = "hip"),
            BackendKind::Cuda => cfg!(feature = "cuda"),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a backend reports about its device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// The backend.
    pub kind: BackendKind,
    /// The ordinal the device was opened with (after the runtime applied
    /// `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// The device's name as the runtime gives it.
    pub name: String,
    /// The architecture: `gfx90a`, `gfx1151` (HIP), `sm_90` (CUDA), `host`.
    pub arch: String,
    /// Total device memory in bytes (0 where unknown).
    pub total_memory: u64,
    /// Compute units / streaming multiprocessors (sizes kernel grids).
    pub multiprocessors: u32,
    /// The visibility variable in effect and what this ordinal maps to.
    pub visible: VisibleDevices,
}

/// A device address as the backend hands it out (the host backend: a host
/// address). Only meaningful to the backend that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub const fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes))
    }
}

/// A backend's stream handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawStream(pub u64);

/// A backend's event handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawEvent(pub u64);

/// The dtypes of an elementwise conversion kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ConvertOp {
    /// Source dtype.
    pub from: DType,
    /// Destination dtype.
    pub to: DType,
}

impl ConvertOp {
    /// The conversions the device kernels implement: bf16/f16 -> f32 and
    /// f32 -> bf16/f16.
    pub const DEVICE: [ConvertOp; 4] = [
        ConvertOp {
            from: DType::BF16,
            to: DType::F32,
        },
        ConvertOp {
            from: DType::F16,
            to: DType::F32,
        },
        ConvertOp {
            from: DType::F32,
            to: DType::BF16,
        },
        ConvertOp {
            from: DType::F32,
            to: DType::F16,
        },
    ];

    /// Whether a device kernel implements this conversion.
    pub fn on_device(self) -> bool {
        Self::DEVICE.contains(&self)
    }

    /// The kernel symbol, `convert_{src}_{dst}`.
    pub fn symbol(self) -> Option<&'static str> {
        Some(match (self.from, self.to) {
            (DType::BF16, DType::F32) => "convert_bf16_f32",
            (DType::F16, DType::F32) => "convert_f16_f32",
            (DType::F32, DType::BF16) => "convert_f32_bf16",
            (DType::F32, DType::F16) => "convert_f32_f16",
            _ => return None,
        })
    }
}

impl std::fmt::Display for ConvertOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}->{}",
            self.from.name().to_lowercase(),
            self.to.name().to_lowercase()
        )
    }
}

/// The raw interface every backend implements.
///
/// Addresses, handles and byte counts are passed as they are; the safe types
/// of this module guarantee the preconditions below, so backends need not
/// re-check them. Asynchronous operations are ordered on their stream; the
/// host backend runs everything at once.
///
/// Operations that take handles or addresses are `unsafe`: the caller
/// promises they came from this backend and are live (not freed/destroyed),
/// that `bytes`/`n` stay inside the allocations, that no other operation
/// writes the same memory concurrently, and that host memory passed to an
/// asynchronous copy stays valid (and unaliased by writes) until the stream
/// reaches it. Zero-length work is never passed.
///
/// # Safety
///
/// The safe types trust what an implementation returns: [`Backend::alloc`]
/// returns device memory valid for `bytes` (256-aligned) until freed,
/// [`Backend::alloc_pinned`] host memory readable and writable from the
/// host for `bytes` (256-aligned) until freed, and every operation does what
/// its documentation says and touches no other memory. Wrappers that
/// forward to a correct backend (and only add, drop or corrupt whole
/// operations within the caller's ranges) satisfy this.
pub unsafe trait Backend: Send + Sync + std::fmt::Debug + 'static {
    /// What the device is.
    fn info(&self) -> &DeviceInfo;

    /// Allocates `bytes > 0` bytes of device memory, aligned to 256 bytes.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees an allocation of `bytes` bytes.
    ///
    /// # Safety
    /// `ptr` came from [`Backend::alloc`] with `bytes`, is freed once, and no
    /// queued work uses it any more.
    unsafe fn free(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Allocates `bytes > 0` bytes of page-locked host memory, 256-aligned.
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees pinned memory.
    ///
    /// # Safety
    /// `ptr` came from [`Backend::alloc_pinned`] with `bytes`, is freed once,
    /// and no queued copy uses it any more.
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()>;

    /// Creates a stream.
    fn stream_create(&self) -> Result<RawStream>;
    /// Destroys a stream.
    ///
    /// # Safety
    /// `s` is live and destroyed once.
    unsafe fn stream_destroy(&self, s: RawStream) -> Result<()>;
    /// Waits until all work queued on `s` is done.
    ///
    /// # Safety
    /// `s` is live.
    unsafe fn stream_synchronize(&self, s: RawStream) -> Result<()>;
    /// Waits until all work on the device is done.
    fn synchronize(&self) -> Result<()>;
    /// Creates an event (with timing).
    fn event_create(&self) -> Result<RawEvent>;
    /// Destroys an event.
    ///
    /// # Safety
    /// `e` is live and destroyed once.
    unsafe fn event_destroy(&self, e: RawEvent) -> Result<()>;
    /// Records `e` at the current end of `s`.
    ///
    /// # Safety
    /// `e` and `s` are live.
    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()>;
    /// Waits until the work before the last record of `e` is done.
    ///
    /// # Safety
    /// `e` is live.
    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()>;
    /// Makes later work on `s` wait for `e`.
    ///
    /// # Safety
    /// `s` and `e` are live.
    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()>;
    /// Milliseconds between two completed events.
    ///
    /// # Safety
    /// Both events are live.
    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32>;

    /// Copies `bytes` from host memory to the device.
    ///
    /// # Safety
    /// See the trait docs; `src` stays valid until `s` reaches the copy.
    unsafe fn copy_htod(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        s: RawStream,
    ) -> Result<()>;
    /// Copies `bytes` from the device to host memory.
    ///
    /// # Safety
    /// See the trait docs; `dst` stays valid and unread until `s` reaches the copy.
    unsafe fn copy_dtoh(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()>;
    /// Copies `bytes` between device allocations (non-overlapping).
    ///
    /// # Safety
    /// See the trait docs.
    unsafe fn copy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()>;
    /// Sets `bytes` of device memory to zero.
    ///
    /// # Safety
    /// See the trait docs.
    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()>;

    /// Converts `n` elements `op.from` at `src` into `op.to` at `dst`
    /// (`op.on_device()`; both addresses aligned to their element size).
    ///
    /// # Safety
    /// See the trait docs.
    unsafe fn convert(
        &self,
        op: ConvertOp,
        src: DevicePtr,
        dst: DevicePtr,
        n: u64,
        s: RawStream,
    ) -> Result<()>;
    /// Adds the fingerprint sum `S` of `bytes` bytes at `src`, whose first
    /// byte is word `first_word` of the fingerprinted buffer, to the `u64` at
    /// `acc` (wrapping).
    ///
    /// # Safety
    /// See the trait docs; `acc` is an 8-byte aligned `u64` in device memory.
    unsafe fn fingerprint_sum(
        &self,
        src: DevicePtr,
        bytes: u64,
        first_word: u64,
        acc: DevicePtr,
        s: RawStream,
    ) -> Result<()>;
    /// [`Backend::convert`] of a widening op (`to == F32`) that also adds the
    /// fingerprint sum of the f32 output (word 0 at `dst`) to `acc`.
    ///
    /// # Safety
    /// As [`Backend::convert`] and [`Backend::fingerprint_sum`].
    unsafe fn convert_fingerprint(
        &self,
        op: ConvertOp,
        src: DevicePtr,
        dst: DevicePtr,
        n: u64,
        acc: DevicePtr,
        s: RawStream,
    ) -> Result<()>;
    /// Counts NaN (added to `counts[0]`) and Inf (`counts[1]`) among `n`
    /// elements of `dtype` (F32, BF16, F16); with `clamp`, rewrites NaN to 0
    /// and +-Inf to +-max finite in place.
    ///
    /// # Safety
    /// See the trait docs; `counts` is two aligned `u64`s in device memory.
    unsafe fn nonfinite(
        &self,
        dtype: DType,
        ptr: DevicePtr,
        n: u64,
        clamp: bool,
        counts: DevicePtr,
        s: RawStream,
    ) -> Result<()>;

    // ----- conv3d (device/conv3d.rs; the chain's GPU tiers) ---------------
    /// Queues `kernel` (`hip-kernels/conv3d.hip`) computing the convolution
    /// `args` describes: its weight in the layout `kernel` reads, the f32
    /// output written in full. The host backend computes it on the CPU.
    ///
    /// Errors: [`Error::Conv3dTier`] for sizes the kernel does not take
    /// ([`Conv3dKernel::unsupported`]), [`Error::Conv3dDType`] for a dtype
    /// other than F32 and BF16, or the launch error.
    ///
    /// # Safety
    /// See the trait docs: every address in `args` is a live allocation of
    /// this backend holding what [`Conv3dLaunch`] documents (lengths from
    /// its geometry, each address aligned to its element), `output` is not
    /// accessed by anything else until `s` reaches the call, `s` is live,
    /// and the call is not zero-sized.
    ///
    /// The default (for backends without conv3d kernels, such as wrappers
    /// written before conv3d existed) refuses with [`Error::Conv3dTier`].
    unsafe fn conv3d(&self, kernel: Conv3dKernel, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        let _ = (args, s);
        Err(Error::Conv3dTier {
            tier: kernel.name(),
            reason: "this backend has no conv3d kernels",
        })
    }
    /// The weight layout `kernel` reads here for a call `g` with inputs of
    /// `dtype`: the caller arranges the weight so before [`Backend::conv3d`]
    /// (and the safe entry point checks its length by it). The default is
    /// [`Conv3dWeightLayout::Standard`] for the naive kernel and
    /// [`Conv3dWeightLayout::TiledTransposed`] for the tiled one; the CUDA
    /// backend answers [`Conv3dWeightLayout::TiledPacked`] for bf16 where its
    /// tensor-core kernel exists and takes `g`. Deterministic for a backend.
    fn conv3d_weight_layout(
        &self,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &crate::conv3d::Conv3dGeometry,
    ) -> Conv3dWeightLayout {
        let _ = (dtype, g);
        match kernel {
            Conv3dKernel::Naive => Conv3dWeightLayout::Standard,
            Conv3dKernel::Tiled => Conv3dWeightLayout::TiledTransposed,
        }
    }
    /// Whether [`Backend::conv3d_vendor`] can run here: `Ok`, or
    /// [`Error::VendorUnavailable`] when the vendor library (MIOpen, cuDNN)
    /// is not installed or the backend has none (host, and the default).
    /// Cheap after the first call; a chain skips its vendor tier on `Err`.
    fn conv3d_vendor_available(&self) -> Result<()> {
        Err(Error::VendorUnavailable {
            backend: self.info().kind.name(),
            library: "none",
            reason: "this backend has no vendor convolution library".into(),
        })
    }
    /// Computes the convolution `args` describes (weight in the standard
    /// layout) with the vendor library on `s`; may wait for `s` before it
    /// returns (to free the library's workspace).
    ///
    /// Errors: [`Error::VendorUnavailable`]; the library's refusal
    /// ([`Error::Conv3dMiopen`], `Error::Conv3dCudnn`: no algorithm for the
    /// parameters, ...); allocation or launch errors.
    ///
    /// The default returns [`Backend::conv3d_vendor_available`]'s error.
    ///
    /// # Safety
    /// As [`Backend::conv3d`].
    unsafe fn conv3d_vendor(&self, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        let _ = (args, s);
        self.conv3d_vendor_available()?;
        Err(Error::VendorUnavailable {
            backend: self.info().kind.name(),
            library: "none",
            reason: "this backend implements no vendor convolution call".into(),
        })
    }

    // ----- memory figures and versions (diagnostics) ---------------------
    /// `(free, total)` device memory in bytes as the runtime reports it
    /// (`hipMemGetInfo`, `cuMemGetInfo`). On an APU this may be the
    /// firmware's VRAM carve-out rather than what the GPU can really use;
    /// `rocm_safe::diagnostics` compares it with sysfs.
    ///
    /// The host backend reports the host's `MemAvailable` / `MemTotal`
    /// from `/proc/meminfo` (its device memory is host memory), and
    /// [`Error::BackendUnsupported`] where that file cannot be read.
    /// The provided default is [`Error::BackendUnsupported`], so backends
    /// written before this method existed keep compiling; wrappers should
    /// forward it.
    fn mem_info(&self) -> Result<(u64, u64)> {
        Err(Error::BackendUnsupported {
            backend: self.info().kind.name(),
            op: "mem_info",
        })
    }
}

// SAFETY: forwards every call unchanged to the boxed backend, which upholds
// the trait's contract itself.
unsafe impl Backend for Box<dyn Backend> {
    fn info(&self) -> &DeviceInfo {
        (**self).info()
    }
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        (**self).alloc(bytes)
    }
    unsafe fn free(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).free(ptr, bytes) }
    }
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        (**self).alloc_pinned(bytes)
    }
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).free_pinned(ptr, bytes) }
    }
    fn stream_create(&self) -> Result<RawStream> {
        (**self).stream_create()
    }
    unsafe fn stream_destroy(&self, s: RawStream) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).stream_destroy(s) }
    }
    unsafe fn stream_synchronize(&self, s: RawStream) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).stream_synchronize(s) }
    }
    fn synchronize(&self) -> Result<()> {
        (**self).synchronize()
    }
    fn event_create(&self) -> Result<RawEvent> {
        (**self).event_create()
    }
    unsafe fn event_destroy(&self, e: RawEvent) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).event_destroy(e) }
    }
    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).event_record(e, s) }
    }
    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).event_synchronize(e) }
    }
    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).stream_wait_event(s, e) }
    }
    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).event_elapsed_ms(start, end) }
    }
    unsafe fn copy_htod(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).copy_htod(dst, src, bytes, s) }
    }
    unsafe fn copy_dtoh(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).copy_dtoh(dst, src, bytes, s) }
    }
    unsafe fn copy_dtod(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).copy_dtod(dst, src, bytes, s) }
    }
    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).memset_zero(dst, bytes, s) }
    }
    unsafe fn convert(
        &self,
        op: ConvertOp,
        src: DevicePtr,
        dst: DevicePtr,
        n: u64,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).convert(op, src, dst, n, s) }
    }
    unsafe fn fingerprint_sum(
        &self,
        src: DevicePtr,
        bytes: u64,
        first_word: u64,
        acc: DevicePtr,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).fingerprint_sum(src, bytes, first_word, acc, s) }
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
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).convert_fingerprint(op, src, dst, n, acc, s) }
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
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).nonfinite(dtype, ptr, n, clamp, counts, s) }
    }

    unsafe fn conv3d(&self, kernel: Conv3dKernel, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).conv3d(kernel, args, s) }
    }
    fn conv3d_weight_layout(
        &self,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &crate::conv3d::Conv3dGeometry,
    ) -> Conv3dWeightLayout {
        (**self).conv3d_weight_layout(kernel, dtype, g)
    }
    fn conv3d_vendor_available(&self) -> Result<()> {
        (**self).conv3d_vendor_available()
    }
    unsafe fn conv3d_vendor(&self, args: &Conv3dLaunch, s: RawStream) -> Result<()> {
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { (**self).conv3d_vendor(args, s) }
    }

    // ----- memory figures and versions (diagnostics) ---------------------
    fn mem_info(&self) -> Result<(u64, u64)> {
        (**self).mem_info()
    }
}

/// Opens the raw backend of device `ordinal` of `kind` (to wrap it, for
/// example in [`faults::Faults`], before [`Device::from_backend`]). Errors as
/// [`Device::open`].
pub fn open_backend(kind: BackendKind, ordinal: usize) -> Result<Box<dyn Backend>> {
    match kind {
        BackendKind::Host if ordinal == 0 => Ok(Box::new(host::HostBackend::new())),
        BackendKind::Host => Err(Error::NoDevice {
            backend: "host",
            ordinal: Some(ordinal),
            count: 1,
            visible: VisibleDevices::none(),
        }),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Ok(Box::new(cuda::CudaBackend::open(ordinal)?)),
        #[cfg(feature = "hip")]
        BackendKind::Hip => Ok(Box::new(hip::HipBackend::open(ordinal)?)),
        #[allow(unreachable_patterns)]
        other => Err(Error::BackendNotBuilt {
            backend: other.name(),
        }),
    }
}

struct DeviceInner {
    backend: Box<dyn Backend>,
    errors: Mutex<Vec<Error>>,
    self_test: OnceLock<Arc<crate::verify::SelfTestReport>>,
}

/// An opened device. Cloning is cheap (shared handle).
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("info", self.info()).finish()
    }
}

impl Device {
    /// Wraps a backend (for example a fault-injecting one around another).
    pub fn from_backend(backend: Box<dyn Backend>) -> Device {
        Device {
            inner: Arc::new(DeviceInner {
                backend,
                errors: Mutex::new(Vec::new()),
                self_test: OnceLock::new(),
            }),
        }
    }

    /// The host backend (always available).
    pub fn host() -> Device {
        Device::from_backend(Box::new(host::HostBackend::new()))
    }

    /// Opens device `ordinal` of `kind`.
    ///
    /// Errors: [`Error::BackendNotBuilt`] when the feature is off,
    /// [`Error::NoRuntime`] when the runtime library cannot be loaded,
    /// [`Error::NoDevice`] when there is no such device, or the runtime's own
    /// error.
    pub fn open(kind: BackendKind, ordinal: usize) -> Result<Device> {
        Ok(Device::from_backend(open_backend(kind, ordinal)?))
    }

    /// The devices of `kind` this process can see (the runtime applies
    /// `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`; each entry's
    /// [`DeviceInfo::visible`] reports the mapping).
    ///
    /// Errors as [`Device::open`]; no device at all is [`Error::NoDevice`].
    pub fn list(kind: BackendKind) -> Result<Vec<DeviceInfo>> {
        match kind {
            BackendKind::Host => Ok(vec![Device::host().info().clone()]),
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => cuda::list(),
            #[cfg(feature = "hip")]
            BackendKind::Hip => hip::list(),
            #[allow(unreachable_patterns)]
            other => Err(Error::BackendNotBuilt {
                backend: other.name(),
            }),
        }
    }

    /// What the device is.
    pub fn info(&self) -> &DeviceInfo {
        self.inner.backend.info()
    }

    /// The backend's kind.
    pub fn kind(&self) -> BackendKind {
        self.info().kind
    }

    /// The raw backend (for wrappers and the verified conversion layer).
    pub fn backend(&self) -> &dyn Backend {
        self.inner.backend.as_ref()
    }

    /// Whether two handles are the same opened device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Creates a new stream.
    pub fn stream(&self) -> Result<Stream> {
        let raw = self.backend().stream_create()?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                device: self.clone(),
                raw,
            }),
        })
    }

    /// Creates a new event.
    pub fn event(&self) -> Result<Event> {
        let raw = self.backend().event_create()?;
        Ok(Event {
            device: self.clone(),
            raw,
        })
    }

    /// Waits until all work on the device is done.
    pub fn synchronize(&self) -> Result<()> {
        self.backend().synchronize()
    }

    /// Records an error that happened where it could not be returned
    /// (`Drop`); read them with [`Device::take_errors`].
    pub fn record_err(&self, e: Error) {
        if let Ok(mut v) = self.inner.errors.lock() {
            v.push(e);
        }
    }

    /// Returns (and clears) the errors recorded since the last call.
    pub fn take_errors(&self) -> Vec<Error> {
        match self.inner.errors.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(_) => Vec::new(),
        }
    }

    /// Allocates page-locked host memory for `len` elements, zeroed.
    pub fn alloc_pinned<T: bytemuck::Pod>(&self, len: usize) -> Result<PinnedBuffer<T>> {
        let bytes = byte_len::<T>("alloc_pinned", len)?;
        let ptr = if bytes == 0 {
            std::ptr::null_mut()
        } else {
            let p = self.backend().alloc_pinned(bytes)?;
            // SAFETY: `p` is a fresh allocation of `bytes` bytes from the
            // backend, writable from the host and not shared yet.
            unsafe { std::ptr::write_bytes(p, 0, bytes) };
            p
        };
        Ok(PinnedBuffer {
            device: self.clone(),
            ptr,
            len,
            pending: None,
            _p: PhantomData,
        })
    }

    /// `(free, total)` device memory in bytes as the runtime reports it
    /// (see [`Backend::mem_info`]: the host backend reports host RAM; on an
    /// APU the runtime's total may be only the VRAM carve-out).
    ///
    /// Errors: [`Error::BackendUnsupported`] where the backend cannot tell,
    /// or the runtime's own error.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        self.backend().mem_info()
    }

    pub(crate) fn self_test_cell(&self) -> &OnceLock<Arc<crate::verify::SelfTestReport>> {
        &self.inner.self_test
    }
}

fn byte_len<T>(op: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::SizeOverflow { op, elements: len })
}

struct StreamInner {
    device: Device,
    raw: RawStream,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        let b = self.device.backend();
        // SAFETY: the stream was created by this backend and this is its only
        // destruction (StreamInner is shared through an Arc and dropped once).
        let r = unsafe { b.stream_synchronize(self.raw) }
            // SAFETY: as above; nothing uses the handle after this.
            .and_then(|_| unsafe { b.stream_destroy(self.raw) });
        if let Err(e) = r {
            self.device.record_err(e);
        }
    }
}

/// A queue of device work. Cloning shares the same stream.
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("raw", &self.inner.raw)
            .finish()
    }
}

/// NaN and Inf counts of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct NonFinite {
    /// NaN values.
    pub nan: u64,
    /// Infinite values (either sign).
    pub inf: u64,
}

impl Stream {
    /// The stream's device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The raw handle.
    pub fn raw(&self) -> RawStream {
        self.inner.raw
    }

    fn backend(&self) -> &dyn Backend {
        self.inner.device.backend()
    }

    fn check_device(&self, op: &'static str, other: &Device) -> Result<()> {
        if self.device().same(other) {
            Ok(())
        } else {
            Err(Error::DeviceMismatch { op })
        }
    }

    /// Waits until all work queued on this stream is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live while `self.inner` is.
        unsafe { self.backend().stream_synchronize(self.raw()) }
    }

    /// Records `event` at the current end of this stream.
    pub fn record(&self, event: &Event) -> Result<()> {
        self.check_device("record", &event.device)?;
        // SAFETY: both handles are live (owned by `self` and `event`) and
        // belong to this device.
        unsafe { self.backend().event_record(event.raw, self.raw()) }
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.check_device("wait", &event.device)?;
        // SAFETY: both handles are live and belong to this device.
        unsafe { self.backend().stream_wait_event(self.raw(), event.raw) }
    }

    /// Allocates `len` elements on this stream's device. The contents are
    /// unspecified (zeros on the host backend).
    pub fn alloc<T: bytemuck::Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let bytes = byte_len::<T>("alloc", len)?;
        let ptr = if bytes == 0 {
            DevicePtr(0)
        } else {
            self.backend().alloc(bytes)?
        };
        Ok(DeviceBuffer {
            ptr,
            len,
            stream: self.clone(),
            _p: PhantomData,
        })
    }

    /// Allocates `len` zeroed elements.
    pub fn alloc_zeros<T: bytemuck::Pod>(&self, len: usize) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc::<T>(len)?;
        b.memset_zero()?;
        Ok(b)
    }

    /// Allocates and fills a buffer from a host slice (synchronous).
    pub fn clone_htod<T: bytemuck::Pod>(&self, src: &[T]) -> Result<DeviceBuffer<T>> {
        let mut b = self.alloc::<T>(src.len())?;
        b.copy_htod(src)?;
        Ok(b)
    }

    /// Converts `src` into `dst` on the device (`ConvertOp::on_device`
    /// pairs only; others are [`Error::UnsupportedConversion`]). Queued on
    /// this stream; lengths must be equal.
    pub fn convert<S: Element, D: Element>(
        &self,
        src: &DeviceView<'_, S>,
        dst: &mut DeviceViewMut<'_, D>,
    ) -> Result<()> {
        let op = self.check_convert("convert", src, dst)?;
        if src.len == 0 {
            return Ok(());
        }
        // SAFETY: both views are live ranges of allocations on this device
        // (checked), `dst` is borrowed mutably so nothing else writes it, the
        // lengths are equal and non-zero, and the element types match `op`.
        unsafe {
            self.backend()
                .convert(op, src.ptr, dst.ptr, src.len as u64, self.raw())
        }
    }

    fn check_convert<S: Element, D: Element>(
        &self,
        op: &'static str,
        src: &DeviceView<'_, S>,
        dst: &DeviceViewMut<'_, D>,
    ) -> Result<ConvertOp> {
        self.check_device(op, src.device)?;
        self.check_device(op, dst.device)?;
        let c = ConvertOp {
            from: S::DTYPE,
            to: D::DTYPE,
        };
        if !c.on_device() {
            return Err(Error::UnsupportedConversion {
                op,
                from: S::DTYPE,
                to: D::DTYPE,
            });
        }
        if src.len != dst.len {
            return Err(Error::LengthMismatch {
                op,
                expected: src.len,
                actual: dst.len,
            });
        }
        Ok(c)
    }

    /// Queues the fingerprint sum of `src`'s bytes (word 0 = its first byte)
    /// into `acc` (one `u64`; added, wrapping). Finish with
    /// [`crate::convert::fingerprint::finish`].
    pub fn fingerprint_sum_into<T: bytemuck::Pod>(
        &self,
        src: &DeviceView<'_, T>,
        acc: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        self.check_device("fingerprint", src.device)?;
        self.check_device("fingerprint", acc.device)?;
        if acc.len() != 1 {
            return Err(Error::LengthMismatch {
                op: "fingerprint accumulator",
                expected: 1,
                actual: acc.len(),
            });
        }
        let bytes = src.num_bytes() as u64;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `src` is a live range on this device, `acc` a live,
        // 256-aligned one-element u64 buffer borrowed mutably.
        unsafe {
            self.backend()
                .fingerprint_sum(src.ptr, bytes, 0, acc.ptr, self.raw())
        }
    }

    /// The fingerprint of `src`'s bytes, computed on the device (waits for it).
    pub fn fingerprint<T: bytemuck::Pod>(&self, src: &DeviceView<'_, T>) -> Result<Fingerprint> {
        let mut acc = self.alloc_zeros::<u64>(1)?;
        self.fingerprint_sum_into(src, &mut acc.view_mut())?;
        let mut s = [0u64];
        acc.copy_dtoh(&mut s)?;
        Ok(finish(s[0], src.num_bytes() as u64))
    }

    /// [`Stream::convert`] of bf16/f16 -> f32 that also adds the fingerprint
    /// sum of the output (as the kernel wrote it) to `acc[0]`.
    pub fn convert_fingerprint_into<S: Element>(
        &self,
        src: &DeviceView<'_, S>,
        dst: &mut DeviceViewMut<'_, f32>,
        acc: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        let op = self.check_convert("convert_fingerprint", src, dst)?;
        self.check_device("convert_fingerprint", acc.device)?;
        if acc.len() != 1 {
            return Err(Error::LengthMismatch {
                op: "fingerprint accumulator",
                expected: 1,
                actual: acc.len(),
            });
        }
        if src.len == 0 {
            return Ok(());
        }
        // SAFETY: as in `convert` and `fingerprint_sum_into`; `op` is a
        // widening to f32 (checked by `check_convert` with D = f32).
        unsafe {
            self.backend().convert_fingerprint(
                op,
                src.ptr,
                dst.ptr,
                src.len as u64,
                acc.ptr,
                self.raw(),
            )
        }
    }

    /// Counts NaN and Inf in `buf` (f32, bf16, f16); with `clamp`, rewrites
    /// NaN to 0 and +-Inf to +-max finite. Waits for the result.
    pub fn nonfinite<T: Element>(
        &self,
        buf: &mut DeviceViewMut<'_, T>,
        clamp: bool,
    ) -> Result<NonFinite> {
        self.check_device("nonfinite", buf.device)?;
        if !matches!(T::DTYPE, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::UnsupportedConversion {
                op: "nonfinite",
                from: T::DTYPE,
                to: T::DTYPE,
            });
        }
        if buf.len == 0 {
            return Ok(NonFinite::default());
        }
        let counts = self.alloc_zeros::<u64>(2)?;
        // SAFETY: `buf` is a live range on this device borrowed mutably;
        // `counts` holds two aligned u64s.
        unsafe {
            self.backend().nonfinite(
                T::DTYPE,
                buf.ptr,
                buf.len as u64,
                clamp,
                counts.ptr,
                self.raw(),
            )?
        };
        let mut c = [0u64; 2];
        counts.copy_dtoh(&mut c)?;
        Ok(NonFinite {
            nan: c[0],
            inf: c[1],
        })
    }
}

/// A point in a stream's work.
pub struct Event {
    device: Device,
    raw: RawEvent,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").field("raw", &self.raw).finish()
    }
}

impl Event {
    /// Waits until the work before the last record is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is live while `self` is.
        unsafe { self.device.backend().event_synchronize(self.raw) }
    }

    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        if !self.device.same(&end.device) {
            return Err(Error::DeviceMismatch { op: "elapsed_ms" });
        }
        // SAFETY: both handles are live and of this device.
        unsafe { self.device.backend().event_elapsed_ms(self.raw, end.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is live and destroyed only here.
        if let Err(e) = unsafe { self.device.backend().event_destroy(self.raw) } {
            self.device.record_err(e);
        }
    }
}

/// Device memory for `len` elements of `T`, owned. Holds its stream (copies
/// run there) and through it its device.
///
/// `Drop` waits for the device to be idle, then frees; errors there are
/// recorded on the device ([`Device::take_errors`]), never panicked.
pub struct DeviceBuffer<T> {
    ptr: DevicePtr,
    len: usize,
    stream: Stream,
    _p: PhantomData<T>,
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

fn range_of(op: &'static str, r: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match r.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match r.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(Error::OutOfBounds {
            op,
            start,
            end,
            len,
        });
    }
    Ok((start, end))
}

impl<T: bytemuck::Pod> DeviceBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    /// The buffer's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
    /// The buffer's device.
    pub fn device(&self) -> &Device {
        self.stream.device()
    }
    /// The device address (for backends and wrappers).
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The whole buffer, borrowed.
    pub fn view(&self) -> DeviceView<'_, T> {
        DeviceView {
            ptr: self.ptr,
            len: self.len,
            device: self.stream.device(),
            _p: PhantomData,
        }
    }
    /// The whole buffer, borrowed mutably.
    pub fn view_mut(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut {
            ptr: self.ptr,
            len: self.len,
            device: self.stream.device(),
            _p: PhantomData,
        }
    }
    /// Elements `range`, borrowed. Out of range is [`Error::OutOfBounds`].
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>> {
        let (s, e) = range_of("slice", range, self.len)?;
        Ok(DeviceView {
            ptr: self.ptr.offset((s * std::mem::size_of::<T>()) as u64),
            len: e - s,
            device: self.stream.device(),
            _p: PhantomData,
        })
    }
    /// Elements `range`, borrowed mutably.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        let (s, e) = range_of("slice_mut", range, self.len)?;
        Ok(DeviceViewMut {
            ptr: self.ptr.offset((s * std::mem::size_of::<T>()) as u64),
            len: e - s,
            device: self.stream.device(),
            _p: PhantomData,
        })
    }

    /// Copies `src` into the buffer and waits for the copy.
    pub fn copy_htod(&mut self, src: &[T]) -> Result<()> {
        let stream = self.stream.clone();
        self.view_mut().copy_htod(&stream, src)
    }
    /// Copies the buffer into `dst` and waits for the copy.
    pub fn copy_dtoh(&self, dst: &mut [T]) -> Result<()> {
        self.view().copy_dtoh(&self.stream, dst)
    }
    /// The buffer's contents as a new vector (waits).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); self.len];
        self.copy_dtoh(&mut v)?;
        Ok(v)
    }
    /// Queues a copy of `src` (same length) into this buffer on its stream.
    pub fn copy_dtod(&mut self, src: &DeviceView<'_, T>) -> Result<()> {
        let stream = self.stream.clone();
        self.view_mut().copy_dtod(&stream, src)
    }
    /// Queues zeroing the buffer on its stream.
    pub fn memset_zero(&mut self) -> Result<()> {
        let stream = self.stream.clone();
        self.view_mut().memset_zero(&stream)
    }
}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.len == 0 || std::mem::size_of::<T>() == 0 {
            return;
        }
        let dev = self.stream.device();
        let bytes = self.len * std::mem::size_of::<T>();
        // Work on any stream may still use the memory: wait for the device.
        let r = dev.backend().synchronize().and_then(|_| {
            // SAFETY: `ptr` came from `alloc(bytes)` on this backend, this is
            // its only free, and the device is idle.
            unsafe { dev.backend().free(self.ptr, bytes) }
        });
        if let Err(e) = r {
            dev.record_err(e);
        }
    }
}

impl<T> std::fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceView")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<T> std::fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceViewMut")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

/// A borrowed range of device memory.
#[derive(Clone, Copy)]
pub struct DeviceView<'a, T> {
    ptr: DevicePtr,
    len: usize,
    device: &'a Device,
    _p: PhantomData<&'a T>,
}

/// A mutably borrowed range of device memory.
pub struct DeviceViewMut<'a, T> {
    ptr: DevicePtr,
    len: usize,
    device: &'a Device,
    _p: PhantomData<&'a mut T>,
}

fn cast_check<A, B>(op: &'static str, ptr: DevicePtr, len: usize) -> Result<usize> {
    let bytes = len * std::mem::size_of::<A>();
    let sb = std::mem::size_of::<B>().max(1);
    if !bytes.is_multiple_of(sb) {
        return Err(Error::LengthMismatch {
            op,
            expected: bytes / sb * sb,
            actual: bytes,
        });
    }
    let align = std::mem::align_of::<B>() as u64;
    if !ptr.0.is_multiple_of(align) {
        return Err(Error::Misaligned {
            op,
            addr: ptr.0,
            align,
        });
    }
    Ok(bytes / sb)
}

impl<'a, T: bytemuck::Pod> DeviceView<'a, T> {
    /// The same bytes as elements of `B` (whole elements, aligned).
    pub fn cast<B: bytemuck::Pod>(&self) -> Result<DeviceView<'a, B>> {
        let len = cast_check::<T, B>("cast", self.ptr, self.len)?;
        Ok(DeviceView {
            ptr: self.ptr,
            len,
            device: self.device,
            _p: PhantomData,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    /// The device address of the first element.
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// The device.
    pub fn device(&self) -> &'a Device {
        self.device
    }
    /// Elements `range` of this view.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'a, T>> {
        let (s, e) = range_of("slice", range, self.len)?;
        Ok(DeviceView {
            ptr: self.ptr.offset((s * std::mem::size_of::<T>()) as u64),
            len: e - s,
            device: self.device,
            _p: PhantomData,
        })
    }

    /// Copies the view into `dst` (same length) on `stream`, and waits.
    pub fn copy_dtoh(&self, stream: &Stream, dst: &mut [T]) -> Result<()> {
        stream.check_device("copy_dtoh", self.device)?;
        if dst.len() != self.len {
            return Err(Error::LengthMismatch {
                op: "copy_dtoh",
                expected: self.len,
                actual: dst.len(),
            });
        }
        if self.num_bytes() == 0 {
            return Ok(());
        }
        // SAFETY: the view is a live range of this device; `dst` has exactly
        // `num_bytes` writable bytes, borrowed mutably until the synchronize
        // below, so nothing reads or frees it while the copy runs.
        unsafe {
            stream.backend().copy_dtoh(
                dst.as_mut_ptr().cast(),
                self.ptr,
                self.num_bytes(),
                stream.raw(),
            )?
        };
        stream.synchronize()
    }
}

impl<'a, T: bytemuck::Pod> DeviceViewMut<'a, T> {
    /// The same bytes as elements of `B`, reborrowed mutably.
    pub fn cast_mut<B: bytemuck::Pod>(&mut self) -> Result<DeviceViewMut<'_, B>> {
        let len = cast_check::<T, B>("cast_mut", self.ptr, self.len)?;
        Ok(DeviceViewMut {
            ptr: self.ptr,
            len,
            device: self.device,
            _p: PhantomData,
        })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    /// The device address of the first element.
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// The same range, read-only.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView {
            ptr: self.ptr,
            len: self.len,
            device: self.device,
            _p: PhantomData,
        }
    }
    /// Elements `range` of this view, reborrowed mutably.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        let (s, e) = range_of("slice_mut", range, self.len)?;
        Ok(DeviceViewMut {
            ptr: self.ptr.offset((s * std::mem::size_of::<T>()) as u64),
            len: e - s,
            device: self.device,
            _p: PhantomData,
        })
    }

    /// Splits the view at element `mid` into two disjoint mutable views
    /// (consumes it; reborrow with [`DeviceViewMut::slice_mut`] to keep it).
    pub fn split_at_mut(self, mid: usize) -> Result<(DeviceViewMut<'a, T>, DeviceViewMut<'a, T>)> {
        if mid > self.len {
            return Err(Error::OutOfBounds {
                op: "split_at_mut",
                start: mid,
                end: mid,
                len: self.len,
            });
        }
        let off = (mid * std::mem::size_of::<T>()) as u64;
        Ok((
            DeviceViewMut {
                ptr: self.ptr,
                len: mid,
                device: self.device,
                _p: PhantomData,
            },
            DeviceViewMut {
                ptr: self.ptr.offset(off),
                len: self.len - mid,
                device: self.device,
                _p: PhantomData,
            },
        ))
    }

    /// Copies `src` (same length) into the view on `stream`, and waits.
    pub fn copy_htod(&mut self, stream: &Stream, src: &[T]) -> Result<()> {
        stream.check_device("copy_htod", self.device)?;
        if src.len() != self.len {
            return Err(Error::LengthMismatch {
                op: "copy_htod",
                expected: self.len,
                actual: src.len(),
            });
        }
        if self.num_bytes() == 0 {
            return Ok(());
        }
        // SAFETY: the view is a live, mutably borrowed range of this device;
        // `src` has `num_bytes` readable bytes and stays borrowed until the
        // synchronize below.
        unsafe {
            stream.backend().copy_htod(
                self.ptr,
                src.as_ptr().cast(),
                self.num_bytes(),
                stream.raw(),
            )?
        };
        stream.synchronize()
    }

    /// Queues a copy of `src` (same length) into the view on `stream`.
    pub fn copy_dtod(&mut self, stream: &Stream, src: &DeviceView<'_, T>) -> Result<()> {
        stream.check_device("copy_dtod", self.device)?;
        stream.check_device("copy_dtod", src.device)?;
        if src.len != self.len {
            return Err(Error::LengthMismatch {
                op: "copy_dtod",
                expected: self.len,
                actual: src.len,
            });
        }
        if self.num_bytes() == 0 {
            return Ok(());
        }
        // SAFETY: both are live ranges of this device; `self` is borrowed
        // mutably, so `src` (a shared borrow) cannot overlap it.
        unsafe {
            stream
                .backend()
                .copy_dtod(self.ptr, src.ptr, self.num_bytes(), stream.raw())
        }
    }

    /// Queues zeroing the view on `stream`.
    pub fn memset_zero(&mut self, stream: &Stream) -> Result<()> {
        stream.check_device("memset_zero", self.device)?;
        if self.num_bytes() == 0 {
            return Ok(());
        }
        // SAFETY: a live, mutably borrowed range of this device.
        unsafe {
            stream
                .backend()
                .memset_zero(self.ptr, self.num_bytes(), stream.raw())
        }
    }

    /// Queues an asynchronous copy from pinned memory (same length) on
    /// `stream`. The pinned buffer remembers the copy: touching it from the
    /// host, or dropping it, first waits for the copy.
    pub fn copy_htod_async(&mut self, stream: &Stream, src: &mut PinnedBuffer<T>) -> Result<()> {
        stream.check_device("copy_htod_async", self.device)?;
        stream.check_device("copy_htod_async", &src.device)?;
        if src.len != self.len {
            return Err(Error::LengthMismatch {
                op: "copy_htod_async",
                expected: self.len,
                actual: src.len,
            });
        }
        if self.num_bytes() == 0 {
            return Ok(());
        }
        src.wait()?;
        // SAFETY: the destination is a live, mutably borrowed device range;
        // the pinned memory is live and stays so until the event recorded
        // below completes (PinnedBuffer waits for it before any host access
        // or free).
        unsafe {
            stream
                .backend()
                .copy_htod(self.ptr, src.ptr, self.num_bytes(), stream.raw())?
        };
        src.mark_pending(stream)
    }

    /// Queues an asynchronous copy of `self.len()` elements of `src`,
    /// starting at element `src_start`, into the view on `stream` (a partly
    /// filled staging buffer copies only what it holds). The pinned buffer
    /// remembers the copy as [`DeviceViewMut::copy_htod_async`] does.
    ///
    /// Errors: [`Error::OutOfBounds`] when the range passes the end of `src`.
    pub fn copy_htod_async_range(
        &mut self,
        stream: &Stream,
        src: &mut PinnedBuffer<T>,
        src_start: usize,
    ) -> Result<()> {
        stream.check_device("copy_htod_async_range", self.device)?;
        stream.check_device("copy_htod_async_range", &src.device)?;
        let end = src_start.checked_add(self.len).filter(|&e| e <= src.len);
        let Some(_) = end else {
            return Err(Error::OutOfBounds {
                op: "copy_htod_async_range",
                start: src_start,
                end: src_start.saturating_add(self.len),
                len: src.len,
            });
        };
        if self.num_bytes() == 0 {
            return Ok(());
        }
        src.wait()?;
        let off = src_start * std::mem::size_of::<T>();
        // SAFETY: the destination is a live, mutably borrowed device range;
        // `src_start + len <= src.len` (checked above), so the source range
        // lies inside the live pinned allocation, which stays alive and
        // unwritten until the event recorded below completes (PinnedBuffer
        // waits for it before any host access or free).
        unsafe {
            stream.backend().copy_htod(
                self.ptr,
                src.ptr.add(off).cast_const(),
                self.num_bytes(),
                stream.raw(),
            )?
        };
        src.mark_pending(stream)
    }

    /// Queues an asynchronous copy of this view into pinned memory.
    pub fn copy_dtoh_async(&self, stream: &Stream, dst: &mut PinnedBuffer<T>) -> Result<()> {
        stream.check_device("copy_dtoh_async", self.device)?;
        stream.check_device("copy_dtoh_async", &dst.device)?;
        if dst.len != self.len {
            return Err(Error::LengthMismatch {
                op: "copy_dtoh_async",
                expected: self.len,
                actual: dst.len,
            });
        }
        if self.num_bytes() == 0 {
            return Ok(());
        }
        dst.wait()?;
        // SAFETY: as in `copy_htod_async`; the host side is not read before
        // the recorded event completes.
        unsafe {
            stream
                .backend()
                .copy_dtoh(dst.ptr, self.ptr, self.num_bytes(), stream.raw())?
        };
        dst.mark_pending(stream)
    }
}

/// Page-locked host memory for `len` elements of `T` (a staging buffer for
/// asynchronous copies). Host access ([`PinnedBuffer::as_slice`],
/// [`PinnedBuffer::as_mut_slice`]) and `Drop` first wait for the last copy
/// that used it.
pub struct PinnedBuffer<T> {
    device: Device,
    ptr: *mut u8,
    len: usize,
    pending: Option<Event>,
    _p: PhantomData<T>,
}

// SAFETY: the buffer exclusively owns its allocation (like a Vec<T>); the raw
// pointer is only dereferenced through &self / &mut self methods.
unsafe impl<T: Send> Send for PinnedBuffer<T> {}
// SAFETY: shared access only reads (as_slice after waiting), like &[T].
unsafe impl<T: Sync> Sync for PinnedBuffer<T> {}

impl<T> std::fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("len", &self.len)
            .field("pending", &self.pending.is_some())
            .finish()
    }
}

impl<T: bytemuck::Pod> PinnedBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn mark_pending(&mut self, stream: &Stream) -> Result<()> {
        let ev = match self.pending.take() {
            Some(e) => e,
            None => stream.device().event()?,
        };
        stream.record(&ev)?;
        self.pending = Some(ev);
        Ok(())
    }

    /// Waits for the last asynchronous copy that used this buffer.
    pub fn wait(&mut self) -> Result<()> {
        if let Some(ev) = &self.pending {
            ev.synchronize()?;
        }
        Ok(())
    }

    /// The contents (waits for pending copies first).
    pub fn as_slice(&mut self) -> Result<&[T]> {
        self.wait()?;
        if self.len == 0 {
            return Ok(&[]);
        }
        // SAFETY: `ptr` is a live, 256-aligned allocation of len*size_of::<T>
        // bytes, initialised (zeroed at allocation, T: Pod), with no copy in
        // flight (waited above); the borrow of self keeps it alive.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.cast::<T>(), self.len) })
    }

    /// The contents, mutable (waits for pending copies first).
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.wait()?;
        if self.len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: as in `as_slice`; `&mut self` makes this the only access.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<T>(), self.len) })
    }
}

impl<T> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        if let Some(ev) = &self.pending {
            if let Err(e) = ev.synchronize() {
                self.device.record_err(e);
                // The copy may still be running: leak rather than free.
                return;
            }
        }
        let bytes = self.len * std::mem::size_of::<T>();
        // SAFETY: `ptr` came from `alloc_pinned(bytes)`, is freed only here,
        // and no copy uses it (waited above).
        if let Err(e) = unsafe { self.device.backend().free_pinned(self.ptr, bytes) } {
            self.device.record_err(e);
        }
    }
}
