//! Wrappers: a backend over another ([`crate::device::faults::Faults`], a test's
//! instrumentation, `Box<dyn Backend>`). [`Driver`] and [`Backend`] have no
//! default methods, so a wrapper writes every method: the ones it changes
//! by hand, the others through [`crate::forward_driver!`] /
//! [`crate::forward_backend!`], which forward them to [`Wrap::inner`]. The
//! forwarding code is written once, here; a wrapper names what it forwards
//! (or `all`), and a method added to a trait is a compile error in every
//! wrapper until it decides to forward or change it.
//!
//! ```
//! use rocm_safe::device::{host::HostBackend, raw::{Backend, CopyOp, Driver, RawStream, Wrap}, Device};
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//!
//! /// Counts copies, forwards everything.
//! #[derive(Debug)]
//! struct CountCopies {
//!     inner: HostBackend,
//!     copies: Arc<AtomicUsize>,
//! }
//!
//! impl Wrap for CountCopies {
//!     type Inner = HostBackend;
//!     fn inner(&self) -> &HostBackend {
//!         &self.inner
//!     }
//! }
//!
//! // SAFETY: every operation is the host backend's.
//! unsafe impl Driver for CountCopies {
//!     rocm_safe::forward_driver!(
//!         info, alloc, free, alloc_pinned, free_pinned, stream_create, stream_destroy,
//!         stream_synchronize, synchronize, event_create, event_destroy, event_record,
//!         event_synchronize, stream_wait_event, event_elapsed_ms, memset_zero, mem_info,
//!         register_read_only, unregister_read_only,
//!     );
//!     unsafe fn copy(&self, op: CopyOp, bytes: usize, s: RawStream) -> rocm_safe::Result<()> {
//!         self.copies.fetch_add(1, Ordering::Relaxed);
//!         // SAFETY: the caller's guarantees, forwarded.
//!         unsafe { self.inner.copy(op, bytes, s) }
//!     }
//! }
//!
//! // SAFETY: as above.
//! unsafe impl Backend for CountCopies {
//!     rocm_safe::forward_backend!(all);
//! }
//!
//! let copies = Arc::new(AtomicUsize::new(0));
//! let inner = HostBackend::new();
//! let dev = Device::from_backend(Box::new(CountCopies { inner, copies: copies.clone() }));
//! let back = dev.stream()?.clone_htod(&[1u8, 2, 3])?.to_vec()?;
//! assert_eq!(back, [1, 2, 3]);
//! assert_eq!(copies.load(Ordering::Relaxed), 2, "one copy each way");
//! # Ok::<(), rocm_safe::Error>(())
//! ```

use crate::device::raw::backend::Driver;

/// A backend that wraps another: [`Wrap::inner`] is where
/// [`crate::forward_driver!`] and [`crate::forward_backend!`] send the
/// operations the wrapper does not change.
pub trait Wrap {
    /// The wrapped backend ([`crate::device::raw::Backend`] too where the wrapper
    /// forwards kernel operations).
    type Inner: Driver + ?Sized;
    /// The wrapped backend.
    fn inner(&self) -> &Self::Inner;
}

/// Writes, inside an `unsafe impl Driver for W` where `W:`
/// [`Wrap`](crate::device::raw::Wrap), the [`Driver`](crate::device::raw::Driver)
/// methods named (or `all` of them) as calls of the same method of
/// [`Wrap::inner`](crate::device::raw::Wrap::inner), arguments unchanged (see
/// [`crate::device::raw::Wrap`]'s module for an example).
#[macro_export]
macro_rules! forward_driver {
    (all) => {
        $crate::forward_driver!(
            info, alloc, free, alloc_pinned, free_pinned, stream_create, stream_destroy,
            stream_synchronize, synchronize, event_create, event_destroy, event_record,
            event_synchronize, stream_wait_event, event_elapsed_ms, copy, memset_zero, mem_info,
            register_read_only, unregister_read_only,
        );
    };
    ($($method:ident),+ $(,)?) => {
        $($crate::forward_driver!(@one $method);)+
    };
    (@one info) => {
        fn info(&self) -> &$crate::device::DeviceInfo {
            $crate::device::raw::Driver::info($crate::device::raw::Wrap::inner(self))
        }
    };
    (@one alloc) => {
        fn alloc(&self, bytes: usize) -> $crate::Result<$crate::device::raw::DevicePtr> {
            $crate::device::raw::Driver::alloc($crate::device::raw::Wrap::inner(self), bytes)
        }
    };
    (@one free) => {
        unsafe fn free(&self, ptr: $crate::device::raw::DevicePtr, bytes: usize) -> $crate::Result<()> {
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::free($crate::device::raw::Wrap::inner(self), ptr, bytes) }
        }
    };
    (@one alloc_pinned) => {
        fn alloc_pinned(&self, bytes: usize) -> $crate::Result<*mut u8> {
            $crate::device::raw::Driver::alloc_pinned($crate::device::raw::Wrap::inner(self), bytes)
        }
    };
    (@one free_pinned) => {
        unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::free_pinned(inner, ptr, bytes) }
        }
    };
    (@one stream_create) => {
        fn stream_create(&self) -> $crate::Result<$crate::device::raw::RawStream> {
            $crate::device::raw::Driver::stream_create($crate::device::raw::Wrap::inner(self))
        }
    };
    (@one stream_destroy) => {
        unsafe fn stream_destroy(&self, s: $crate::device::raw::RawStream) -> $crate::Result<()> {
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::stream_destroy($crate::device::raw::Wrap::inner(self), s) }
        }
    };
    (@one stream_synchronize) => {
        unsafe fn stream_synchronize(&self, s: $crate::device::raw::RawStream) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::stream_synchronize(inner, s) }
        }
    };
    (@one synchronize) => {
        fn synchronize(&self) -> $crate::Result<()> {
            $crate::device::raw::Driver::synchronize($crate::device::raw::Wrap::inner(self))
        }
    };
    (@one event_create) => {
        fn event_create(&self) -> $crate::Result<$crate::device::raw::RawEvent> {
            $crate::device::raw::Driver::event_create($crate::device::raw::Wrap::inner(self))
        }
    };
    (@one event_destroy) => {
        unsafe fn event_destroy(&self, e: $crate::device::raw::RawEvent) -> $crate::Result<()> {
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::event_destroy($crate::device::raw::Wrap::inner(self), e) }
        }
    };
    (@one event_record) => {
        unsafe fn event_record(
            &self,
            e: $crate::device::raw::RawEvent,
            s: $crate::device::raw::RawStream,
        ) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::event_record(inner, e, s) }
        }
    };
    (@one event_synchronize) => {
        unsafe fn event_synchronize(&self, e: $crate::device::raw::RawEvent) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::event_synchronize(inner, e) }
        }
    };
    (@one stream_wait_event) => {
        unsafe fn stream_wait_event(
            &self,
            s: $crate::device::raw::RawStream,
            e: $crate::device::raw::RawEvent,
        ) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::stream_wait_event(inner, s, e) }
        }
    };
    (@one event_elapsed_ms) => {
        unsafe fn event_elapsed_ms(
            &self,
            start: $crate::device::raw::RawEvent,
            end: $crate::device::raw::RawEvent,
        ) -> $crate::Result<f32> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::event_elapsed_ms(inner, start, end) }
        }
    };
    (@one copy) => {
        unsafe fn copy(
            &self,
            op: $crate::device::raw::CopyOp,
            bytes: usize,
            s: $crate::device::raw::RawStream,
        ) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::copy(inner, op, bytes, s) }
        }
    };
    (@one memset_zero) => {
        unsafe fn memset_zero(
            &self,
            dst: $crate::device::raw::DevicePtr,
            bytes: usize,
            s: $crate::device::raw::RawStream,
        ) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::memset_zero(inner, dst, bytes, s) }
        }
    };
    (@one mem_info) => {
        fn mem_info(&self) -> $crate::Result<(u64, u64)> {
            $crate::device::raw::Driver::mem_info($crate::device::raw::Wrap::inner(self))
        }
    };
    (@one register_read_only) => {
        unsafe fn register_read_only(&self, p: *const u8, bytes: usize) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::register_read_only(inner, p, bytes) }
        }
    };
    (@one unregister_read_only) => {
        unsafe fn unregister_read_only(&self, p: *const u8) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Driver::unregister_read_only(inner, p) }
        }
    };
}

/// Writes, inside an `unsafe impl Backend for W` where `W:`
/// [`Wrap`](crate::device::raw::Wrap) and its inner type is a
/// [`Backend`](crate::device::raw::Backend), the `Backend` methods named (or
/// `all` of them) as calls of the same method of
/// [`Wrap::inner`](crate::device::raw::Wrap::inner), arguments unchanged.
#[macro_export]
macro_rules! forward_backend {
    (all) => {
        $crate::forward_backend!(
            caps, kernel_source, run, conv3d_weight_layout, conv3d_vendor_available,
            conv3d_vendor_backward_available,
        );
    };
    ($($method:ident),+ $(,)?) => {
        $($crate::forward_backend!(@one $method);)+
    };
    (@one caps) => {
        fn caps(&self) -> $crate::device::KernelCaps {
            $crate::device::raw::Backend::caps($crate::device::raw::Wrap::inner(self))
        }
    };
    (@one kernel_source) => {
        fn kernel_source(&self) -> $crate::Result<$crate::device::KernelSource> {
            $crate::device::raw::Backend::kernel_source($crate::device::raw::Wrap::inner(self))
        }
    };
    (@one run) => {
        unsafe fn run(
            &self,
            op: &$crate::device::raw::KernelOp<'_>,
            s: $crate::device::raw::RawStream,
        ) -> $crate::Result<()> {
            // SAFETY: the caller's guarantees, forwarded unchanged.
            unsafe { $crate::device::raw::Backend::run($crate::device::raw::Wrap::inner(self), op, s) }
        }
    };
    (@one conv3d_weight_layout) => {
        fn conv3d_weight_layout(
            &self,
            kernel: $crate::device::Conv3dKernel,
            dtype: $crate::DType,
            g: &$crate::conv3d::Conv3dGeometry,
        ) -> $crate::device::raw::Conv3dWeightLayout {
            let inner = $crate::device::raw::Wrap::inner(self);
            $crate::device::raw::Backend::conv3d_weight_layout(inner, kernel, dtype, g)
        }
    };
    (@one conv3d_vendor_available) => {
        fn conv3d_vendor_available(&self) -> $crate::Result<()> {
            $crate::device::raw::Backend::conv3d_vendor_available($crate::device::raw::Wrap::inner(self))
        }
    };
    (@one conv3d_vendor_backward_available) => {
        fn conv3d_vendor_backward_available(&self) -> $crate::Result<()> {
            let inner = $crate::device::raw::Wrap::inner(self);
            $crate::device::raw::Backend::conv3d_vendor_backward_available(inner)
        }
    };
}
