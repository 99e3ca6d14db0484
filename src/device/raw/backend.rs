//! The raw backend interface: [`Driver`] (what a runtime does with memory,
//! streams, events and copies) and [`Backend`] (the kernel operations on top,
//! each a [`KernelOp`]).
//!
//! Neither trait has default methods: a backend that leaves one out does
//! not compile. A *wrapper* (a backend over another: [`crate::device::faults::Faults`],
//! a test's instrumentation, `Box<dyn Backend>`) implements [`Wrap`] and
//! writes the operations it changes; [`crate::forward_driver!`] and
//! [`crate::forward_backend!`] write the forwarding of the others, whose
//! names it lists (or `all`), so the forwarding code exists once.
//!
//! A backend that forgets an operation is refused by the compiler:
//!
//! ```compile_fail
//! use rocm_safe::device::{raw::Driver, DeviceInfo};
//!
//! #[derive(Debug)]
//! struct Half(DeviceInfo);
//!
//! // SAFETY: not a backend: it lacks every operation but `info`.
//! unsafe impl Driver for Half {
//!     fn info(&self) -> &DeviceInfo {
//!         &self.0
//!     }
//! }
//! ```

use crate::conv3d::Conv3dGeometry;
use crate::device::info::{
    BackendKind, ConvertOp, DeviceInfo, DevicePtr, KernelCaps, KernelSource, RawEvent, RawStream,
};
use crate::device::raw::conv3d::{
    Conv3dBackwardCheckLaunch, Conv3dBackwardLaunch, Conv3dCheckLaunch, Conv3dFlipLaunch,
    Conv3dGuardCheck, Conv3dGuardDecide, Conv3dKernel, Conv3dLaunch, Conv3dLayoutLaunch,
    Conv3dWeightLayout, Conv3dZeroInsertLaunch,
};
use crate::device::raw::wrap::Wrap;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// What a runtime does with memory, streams, events and copies: the part
/// of a backend that differs between HIP, CUDA and the host.
///
/// Addresses, handles and byte counts are passed as they are; the safe
/// types of [`crate::device`] guarantee the preconditions below, so
/// implementations need not re-check them. Asynchronous operations are
/// ordered on their stream; the host backend runs everything at once.
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
/// The safe types trust what an implementation returns: [`Driver::alloc`]
/// returns device memory valid for `bytes` (256-aligned) until freed,
/// [`Driver::alloc_pinned`] zeroed host memory readable and writable from
/// the host for `bytes` (256-aligned) until freed, and every operation does what its
/// documentation says and touches no other memory. Wrappers that forward to
/// a correct backend (and only add, drop or corrupt whole operations within
/// the caller's ranges) satisfy this.
pub unsafe trait Driver: Send + Sync + std::fmt::Debug + 'static {
    /// What the device is.
    fn info(&self) -> &DeviceInfo;

    /// Allocates `bytes > 0` bytes of device memory, aligned to 256 bytes.
    fn alloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees an allocation of `bytes` bytes.
    ///
    /// # Safety
    /// `ptr` came from [`Driver::alloc`] with `bytes`, is freed once, and no
    /// queued work uses it any more.
    unsafe fn free(&self, ptr: DevicePtr, bytes: usize) -> Result<()>;
    /// Allocates `bytes > 0` bytes of page-locked host memory, 256-aligned
    /// and zeroed.
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees pinned memory.
    ///
    /// # Safety
    /// `ptr` came from [`Driver::alloc_pinned`] with `bytes`, is freed once,
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

    /// Queues `op`, a copy of `bytes` bytes (see [`CopyOp`]).
    ///
    /// # Safety
    /// See the trait docs: both ranges are valid for `bytes` and do not
    /// overlap; host memory stays valid (and, for a copy to the host,
    /// unread) until `s` reaches the copy.
    unsafe fn copy(&self, op: CopyOp, bytes: usize, s: RawStream) -> Result<()>;
    /// Sets `bytes` of device memory to zero.
    ///
    /// # Safety
    /// See the trait docs.
    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()>;

    /// `(free, total)` device memory in bytes as the runtime reports it
    /// (`hipMemGetInfo`, `cuMemGetInfo`). On an APU this may be the
    /// firmware's VRAM carve-out rather than what the GPU can really use;
    /// `rocm_safe::diagnostics` compares it with sysfs. The host backend
    /// reports the host's `MemAvailable` / `MemTotal` from `/proc/meminfo`
    /// (its device memory is host memory), and
    /// [`Error::BackendUnsupported`] where that file cannot be read.
    fn mem_info(&self) -> Result<(u64, u64)>;

    /// Page-locks `bytes` of host memory at `p` for the device to read only
    /// (a mapped checkpoint file's pages, which the loader's direct path
    /// copies from without a CPU copy): `cuMemHostRegister` with
    /// `PORTABLE | READ_ONLY`, `hipHostRegister` with
    /// `hipHostRegisterPortable | hipHostRegisterReadOnly` (0x1 | 0x8 in
    /// `hip_runtime_api.h` of ROCm 6.x and 7.x; the same bit is also named
    /// `hipExtHostRegisterCoarseGrained` there). A backend that cannot
    /// (the host backend, whose "copies" would read the mapping with the
    /// CPU) refuses with [`Error::BackendUnsupported`]: the loader's pinned
    /// ring then serves.
    ///
    /// # Safety
    /// `p..p + bytes` is mapped (readable) host memory that stays mapped
    /// until [`Driver::unregister_read_only`] has returned for `p`.
    unsafe fn register_read_only(&self, p: *const u8, bytes: usize) -> Result<()>;

    /// Undoes [`Driver::register_read_only`].
    ///
    /// # Safety
    /// `p` was registered by [`Driver::register_read_only`] of this driver,
    /// is unregistered once, and no queued copy reads it any more.
    unsafe fn unregister_read_only(&self, p: *const u8) -> Result<()>;
}

/// The kernel operations of a device, over a [`Driver`]: conversions,
/// fingerprints, non-finite scans, conv3d. Implemented once for every GPU
/// runtime (the generic GPU body in `device/runtime/gpu.rs`), by the host backend
/// with the CPU implementations, and by wrappers ([`Wrap`], with
/// [`crate::forward_backend!`] for what they do not change).
///
/// # Safety
///
/// As [`Driver`]: every operation does what its documentation says on
/// exactly the ranges given.
pub unsafe trait Backend: Driver {
    /// What this backend's kernels can do (see [`KernelCaps`]).
    fn caps(&self) -> KernelCaps;

    /// How this device's conversion kernels (the ones every verified call
    /// and the self-test use) were obtained; loads them if needed.
    fn kernel_source(&self) -> Result<KernelSource>;

    /// Queues `op` on `s` (see [`KernelOp`] for what each computes and
    /// what its addresses must hold).
    ///
    /// Errors: [`Error::BackendUnsupported`] where the backend has no such
    /// kernel; for conv3d [`Error::Conv3dTier`] (sizes the kernel does not
    /// take, [`Conv3dKernel::unsupported`], or no conv3d kernels at all),
    /// [`Error::Conv3dDType`] (a dtype other than F32 and BF16),
    /// [`Error::VendorUnavailable`] or the vendor library's refusal
    /// ([`Error::Conv3dMiopen`], `Error::Conv3dCudnn`: no algorithm for the
    /// parameters, ...); allocation or launch errors.
    ///
    /// # Safety
    /// See the [`Driver`] docs: every address in `op` is a live allocation
    /// of this backend holding what the variant documents, aligned to its
    /// element; what the op writes is not accessed by anything else until
    /// `s` reaches it; `s` is live; the op is not zero-sized.
    unsafe fn run(&self, op: &KernelOp<'_>, s: RawStream) -> Result<()>;

    /// The weight layout `kernel` reads here for a call `g` with inputs of
    /// `dtype`: the caller arranges the weight so before [`KernelOp::Conv3d`]
    /// (and the safe entry point checks its length by it). Without
    /// [`KernelCaps::bf16_tensor_cores`] it is
    /// [`Conv3dWeightLayout::Standard`] for the naive kernel and
    /// [`Conv3dWeightLayout::TiledTransposed`] for the tiled one; with them,
    /// bf16 tiled calls whose sizes the tensor-core kernel takes read
    /// [`Conv3dWeightLayout::TiledPacked`]. Deterministic for a backend.
    fn conv3d_weight_layout(
        &self,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &Conv3dGeometry,
    ) -> Conv3dWeightLayout;
    /// Whether [`KernelOp::Conv3dVendor`] (through [`Backend::run`]) can run here: `Ok`, or
    /// [`Error::VendorUnavailable`] when the vendor library (MIOpen, cuDNN)
    /// is not installed or the backend has none. Cheap after the first
    /// call; a chain skips its vendor tier on `Err`.
    fn conv3d_vendor_available(&self) -> Result<()>;
    /// Whether [`KernelOp::Conv3dBackwardVendor`] can run here: `Ok`, or
    /// [`Error::VendorUnavailable`] when the vendor library is absent, the
    /// backend has none, or the library lacks its backward calls (an older
    /// library without them keeps the forward call: see
    /// [`Backend::conv3d_vendor_available`]). Cheap after the first call; a
    /// chain skips its vendor tier for the backward ops on `Err`.
    fn conv3d_vendor_backward_available(&self) -> Result<()>;
}

/// One copy of [`Driver::copy`]: its direction and addresses.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum CopyOp {
    /// Host memory at `src` to the device at `dst`.
    HtoD {
        /// The device destination.
        dst: DevicePtr,
        /// The host source.
        src: *const u8,
    },
    /// The device at `src` to host memory at `dst`.
    DtoH {
        /// The host destination.
        dst: *mut u8,
        /// The device source.
        src: DevicePtr,
    },
    /// Between device allocations.
    DtoD {
        /// The destination.
        dst: DevicePtr,
        /// The source.
        src: DevicePtr,
    },
}

impl CopyOp {
    /// The copy's name in errors and fault logs.
    pub fn name(&self) -> &'static str {
        match self {
            CopyOp::HtoD { .. } => "copy_htod",
            CopyOp::DtoH { .. } => "copy_dtoh",
            CopyOp::DtoD { .. } => "copy_dtod",
        }
    }
}

/// One kernel operation of [`Backend::run`]. Lengths count elements unless
/// named `bytes`; every address is the caller's, aligned to its element.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum KernelOp<'a> {
    /// Converts `n` elements `op.from` at `src` into `op.to` at `dst`
    /// (`op.on_device()`).
    Convert {
        /// The dtypes.
        op: ConvertOp,
        /// The source.
        src: DevicePtr,
        /// The destination.
        dst: DevicePtr,
        /// Elements.
        n: u64,
    },
    /// Adds the fingerprint sum `S` of `bytes` bytes at `src`, whose first
    /// byte is word `first_word` of the fingerprinted buffer, to the `u64`
    /// at `acc` (wrapping; 8-byte aligned).
    FingerprintSum {
        /// The bytes.
        src: DevicePtr,
        /// How many.
        bytes: u64,
        /// The word index of `src`'s first byte.
        first_word: u64,
        /// The accumulator.
        acc: DevicePtr,
    },
    /// [`KernelOp::Convert`] of a widening op (`to == F32`) that also adds
    /// the fingerprint sum of the f32 output (word 0 at `dst`) to `acc`.
    ConvertFingerprint {
        /// The dtypes.
        op: ConvertOp,
        /// The source.
        src: DevicePtr,
        /// The destination.
        dst: DevicePtr,
        /// Elements.
        n: u64,
        /// The accumulator.
        acc: DevicePtr,
    },
    /// Counts the `n` f32 elements at `dst` that differ, bit for bit, from
    /// the exact widening of the element of `op.from` at the same index of
    /// `src`, and adds the count to the `u64` at `count` (a lossless row
    /// to F32 with a device kernel: [`ConvertOp::widen_check_available`]).
    WidenCheck {
        /// The widening whose result is checked.
        op: ConvertOp,
        /// The source elements.
        src: DevicePtr,
        /// The f32 output to check.
        dst: DevicePtr,
        /// Elements.
        n: u64,
        /// The mismatch counter (8-byte aligned).
        count: DevicePtr,
    },
    /// Counts NaN (added to `counts[0]`) and Inf (`counts[1]`) among `n`
    /// elements of `dtype` (F32, BF16, F16) at `ptr`, without changing them.
    /// With a `gate` (one `u64`), only when the gate is non-zero as the
    /// kernel starts.
    CountNonFinite {
        /// The elements' dtype.
        dtype: DType,
        /// The elements.
        ptr: DevicePtr,
        /// How many.
        n: u64,
        /// Two `u64`s.
        counts: DevicePtr,
        /// The gate, if any.
        gate: Option<DevicePtr>,
    },
    /// As [`KernelOp::CountNonFinite`], and rewrites NaN to 0 and +-Inf to
    /// +-max finite in place.
    ClampNonFinite {
        /// The elements' dtype.
        dtype: DType,
        /// The elements.
        ptr: DevicePtr,
        /// How many.
        n: u64,
        /// Two `u64`s.
        counts: DevicePtr,
    },
    /// `kernel` (`kernels/conv3d.hip`) computing the convolution `args`
    /// describes: its weight in the layout [`Backend::conv3d_weight_layout`]
    /// gives for `kernel`, the f32 output written in full. The host backend
    /// computes it on the CPU.
    Conv3d {
        /// Which kernel.
        kernel: Conv3dKernel,
        /// The call.
        args: &'a Conv3dLaunch,
    },
    /// The convolution `args` describes (weight in the standard layout)
    /// by the vendor library; may wait for the stream before it returns (to
    /// free the library's workspace).
    Conv3dVendor {
        /// The call.
        args: &'a Conv3dLaunch,
    },
    /// The conv3d chain's check on the device (`conv3d_check_*`, and with
    /// [`Conv3dCheckLaunch::locate`] first `conv3d_locate_nonfinite_f32`):
    /// per sampled output point, `(index, value, f64 reference, magnitude)`
    /// into [`Conv3dCheckLaunch::results`]. Reads the operands and the
    /// output, writes only the results (and the locate slot).
    Conv3dCheck {
        /// The check.
        args: &'a Conv3dCheckLaunch,
    },
    /// A conv3d weight rearranged from the standard layout into the one a
    /// tiled kernel reads (`conv3d_layout_{u32,u16}`).
    Conv3dLayout {
        /// The rearrangement.
        args: &'a Conv3dLayoutLaunch,
    },
    /// A backward op of a conv3d (`conv3d_bwd_{data,weight,bias}_*`: the
    /// input's gradient, which is also the transposed convolution, the
    /// weight's, the bias's), the f32 result written in full. The host
    /// backend computes it on the CPU.
    Conv3dBackward {
        /// The call.
        args: &'a Conv3dBackwardLaunch,
    },
    /// The guarded fallback's verdict on the device
    /// (`conv3d_guard_decide`; see [`Conv3dGuardDecide`]): reads counts
    /// and sampled points, writes six verdict words.
    Conv3dGuardDecide {
        /// The decision.
        args: &'a Conv3dGuardDecide,
    },
    /// The guarded fallback's fused check on the device
    /// (`conv3d_guard_check_{f32,bf16}`; see [`Conv3dGuardCheck`]): the
    /// NaN/Inf counts, the sampled points and the verdict in one launch.
    /// Reads the operands and the output, writes the points, the record
    /// and (on a GPU) the accumulators, which it leaves zero.
    Conv3dGuardCheck {
        /// The check.
        args: &'a Conv3dGuardCheck,
    },
    /// The data or weight gradient `args` describes (op
    /// [`Conv3dBackwardOp::Data`](crate::conv3d::Conv3dBackwardOp::Data) or
    /// [`Weight`](crate::conv3d::Conv3dBackwardOp::Weight); the weight in
    /// the standard layout) by the vendor library
    /// (`cudnnConvolutionBackwardData/Filter`,
    /// `miopenConvolutionBackwardData/Weights`), the f32 result written in
    /// full (bf16 operands are widened to f32 first; a Data bias is added
    /// after). May wait for the stream before it returns (to free the
    /// library's workspace). The host backend has no vendor library.
    Conv3dBackwardVendor {
        /// The call.
        args: &'a Conv3dBackwardLaunch,
    },
    /// The conv3d chain's check of a backward result on the device
    /// (`conv3d_bwd_check_*`, and with a locate slot first
    /// `conv3d_locate_nonfinite_f32`), as [`KernelOp::Conv3dCheck`].
    Conv3dBackwardCheck {
        /// The check.
        args: &'a Conv3dBackwardCheckLaunch,
    },
    /// A conv3d weight flipped into the weight of the forward convolution
    /// that computes its input gradient at stride 1
    /// (`conv3d_flip_weight_{u32,u16}`; see [`Conv3dFlipLaunch`]): the
    /// tiled tier's backward path. Reads the weight, writes every element
    /// of the destination.
    Conv3dFlipWeight {
        /// The flip.
        args: &'a Conv3dFlipLaunch,
    },
    /// The weight gradient `args` describes (op
    /// [`Conv3dBackwardOp::Weight`](crate::conv3d::Conv3dBackwardOp::Weight))
    /// by the tiled split-K kernel (`conv3d_bwd_weight_tiled_{f32,bf16}`;
    /// see [`Conv3dOps::backward_weight_tiled`](crate::device::Conv3dOps::backward_weight_tiled)):
    /// the f32 result written in full. A GPU backend zeroes the result on
    /// the stream, then the kernel's blocks add their partial sums into it
    /// with float atomics, so its last bits may differ run to run. The
    /// host backend computes it on the CPU.
    ///
    /// Its own op rather than a kernel choice on
    /// [`KernelOp::Conv3dBackward`]: that op is the naive kernels for every
    /// gradient, this one exists for the weight gradient only (no invalid
    /// tiled data / bias combination to refuse) and has another contract
    /// (a memset first, atomics, not bit-reproducible).
    Conv3dBackwardWeightTiled {
        /// The call (op Weight).
        args: &'a Conv3dBackwardLaunch,
    },
    /// `dy` spread by the stride into a larger buffer, zeros between
    /// (`conv3d_zero_insert_{u32,u16}`; see [`Conv3dZeroInsertLaunch`]): a
    /// strided input gradient as a stride-1 one, the tiled tier's backward
    /// path. Reads `dy`, writes every element of the destination.
    Conv3dZeroInsert {
        /// The insertion.
        args: &'a Conv3dZeroInsertLaunch,
    },
}

impl KernelOp<'_> {
    /// The operation's name in errors and fault logs (its row of the op
    /// table, `raw/op_table.rs`).
    pub fn name(&self) -> &'static str {
        self.entry().name
    }
}

/// The refusal of a backend without a vendor convolution library.
pub(crate) fn no_vendor(kind: BackendKind) -> Error {
    Error::VendorUnavailable {
        backend: kind.name(),
        library: "none",
        reason: "this backend has no vendor convolution library".into(),
    }
}

impl Wrap for Box<dyn Backend> {
    type Inner = dyn Backend;
    fn inner(&self) -> &dyn Backend {
        &**self
    }
}

// SAFETY: forwards every call unchanged to the boxed backend, which upholds
// the trait's contract itself.
unsafe impl Driver for Box<dyn Backend> {
    crate::forward_driver!(all);
}

// SAFETY: as above.
unsafe impl Backend for Box<dyn Backend> {
    crate::forward_backend!(all);
}
