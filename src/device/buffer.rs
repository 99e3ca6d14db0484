//! Device memory: [`DeviceBuffer`] (owned), [`DeviceView`] and
//! [`DeviceViewMut`] (borrowed), all over one range type, [`DeviceSpan`],
//! and the copies between them and the host.

use std::marker::PhantomData;
use std::ops::{Bound, Deref, RangeBounds};

use super::device_handle::Device;
use super::info::DevicePtr;
use super::pinned::PinnedBuffer;
use super::stream::Stream;
use crate::device::raw::backend::CopyOp;
use crate::error::{Error, Result};

/// A range of device memory: its first address and its length in elements
/// of `T`. Buffers and views dereference to it for the accessors they
/// share; it grants no access to the memory itself.
pub struct DeviceSpan<T> {
    ptr: DevicePtr,
    len: usize,
    _p: PhantomData<fn() -> T>,
}

impl<T> Clone for DeviceSpan<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceSpan<T> {}

impl<T> std::fmt::Debug for DeviceSpan<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSpan")
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

impl<T> DeviceSpan<T> {
    /// A span of `len` elements at `ptr` (the caller keeps it inside a live
    /// allocation before using it for anything).
    pub(crate) const fn new(ptr: DevicePtr, len: usize) -> DeviceSpan<T> {
        DeviceSpan {
            ptr,
            len,
            _p: PhantomData,
        }
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.len * std::mem::size_of::<T>()
    }
    /// The device address of the first element (for backends and
    /// wrappers; only meaningful to the backend that made it).
    pub fn device_ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Elements `range` of this span; [`Error::OutOfBounds`] past its end.
    fn sub(&self, op: &'static str, range: impl RangeBounds<usize>) -> Result<DeviceSpan<T>> {
        let (s, e) = range_of(op, range, self.len)?;
        Ok(DeviceSpan::new(
            self.ptr.offset((s * std::mem::size_of::<T>()) as u64),
            e - s,
        ))
    }

    /// The same bytes as elements of `B`: whole elements, aligned.
    fn cast<B>(&self, op: &'static str) -> Result<DeviceSpan<B>> {
        let bytes = self.num_bytes();
        let sb = std::mem::size_of::<B>().max(1);
        if !bytes.is_multiple_of(sb) {
            return Err(Error::LengthMismatch {
                op,
                expected: bytes / sb * sb,
                actual: bytes,
                tensor: None,
            });
        }
        let align = std::mem::align_of::<B>() as u64;
        if !self.ptr.0.is_multiple_of(align) {
            return Err(Error::Misaligned {
                op,
                addr: self.ptr.0,
                align,
            });
        }
        Ok(DeviceSpan::new(self.ptr, bytes / sb))
    }
}

/// Device memory for `len` elements of `T`, owned. Holds its stream (copies
/// run there) and through it its device. Dereferences to [`DeviceSpan`]
/// (`len`, `num_bytes`, `device_ptr`).
///
/// `Drop` hands the memory back to the device, which frees it at its next
/// sync point ([`Device::synchronize`]) without making the dropping thread
/// wait; errors there are recorded on the device ([`Device::take_errors`]),
/// never panicked.
pub struct DeviceBuffer<T> {
    span: DeviceSpan<T>,
    stream: Stream,
    /// Whether dropping frees the memory: false for a crate-internal
    /// stand-in over memory a caller lends for one call
    /// ([`DeviceBuffer::lent`]).
    owned: bool,
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.span.ptr)
            .field("len", &self.span.len)
            .finish()
    }
}

impl<T> Deref for DeviceBuffer<T> {
    type Target = DeviceSpan<T>;
    fn deref(&self) -> &DeviceSpan<T> {
        &self.span
    }
}

impl<T: bytemuck::Pod> DeviceBuffer<T> {
    /// Takes ownership of `len` elements at `ptr`, allocated on `stream`'s
    /// device by its backend's `alloc` (or `DevicePtr(0)` for no bytes).
    pub(crate) fn from_alloc(ptr: DevicePtr, len: usize, stream: Stream) -> DeviceBuffer<T> {
        DeviceBuffer {
            span: DeviceSpan::new(ptr, len),
            stream,
            owned: true,
        }
    }

    /// A buffer over `view`'s memory that never frees it, so that code
    /// written for owned buffers (the loader's pipeline) can fill memory a
    /// caller lends ([`crate::transfer::Loader::load_into`]).
    ///
    /// # Safety
    /// The returned buffer (and anything made from it) is dropped before
    /// the borrow of `view` ends, and `stream` belongs to `view`'s device.
    pub(crate) unsafe fn lent(view: &mut DeviceViewMut<'_, T>, stream: Stream) -> DeviceBuffer<T> {
        DeviceBuffer {
            span: view.span,
            stream,
            owned: false,
        }
    }
    /// Gives up ownership: the device address, the length in elements and
    /// the stream (whose device allocated the memory). Nothing frees the
    /// memory any more; give it back with [`DeviceBuffer::from_raw_parts`]
    /// (or free it with the backend's `free` of `len * size_of::<T>()`
    /// bytes once no work uses it). Used to hand memory rocm-safe allocated
    /// to another framework (DLPack export does this).
    pub fn into_raw_parts(self) -> (DevicePtr, usize, Stream) {
        let me = std::mem::ManuallyDrop::new(self);
        if me.owned {
            me.stream.device().account(-(me.span.num_bytes() as i128));
        }
        // SAFETY: `me` is never used or dropped again, so the stream is
        // moved out exactly once (its destructor runs with the returned
        // value's).
        let stream = unsafe { std::ptr::read(&me.stream) };
        (me.span.ptr, me.span.len, stream)
    }

    /// Takes ownership of `len` elements of `T` at `ptr` on `stream`'s
    /// device: dropping the buffer frees them with that device's backend
    /// (`hipFree`, `cuMemFree`, the host allocator).
    ///
    /// # Safety
    /// `ptr` is an allocation of `stream`'s device's backend
    /// ([`super::raw::Driver::alloc`]: the pointer of
    /// [`DeviceBuffer::into_raw_parts`], or memory another framework
    /// allocated with the same runtime allocator, `hipMalloc` /
    /// `cuMemAlloc`, not a caching allocator's sub-block) of exactly
    /// `len * size_of::<T>()` bytes (`DevicePtr(0)` when that is 0); nobody
    /// else frees it; and its contents are valid values of `T` before they
    /// are read.
    pub unsafe fn from_raw_parts(ptr: DevicePtr, len: usize, stream: Stream) -> DeviceBuffer<T> {
        let b = DeviceBuffer::from_alloc(ptr, len, stream);
        b.device().account(b.span.num_bytes() as i128);
        b
    }

    /// The buffer's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
    /// The buffer's device.
    pub fn device(&self) -> &Device {
        self.stream.device()
    }

    /// The whole buffer, borrowed.
    pub fn view(&self) -> DeviceView<'_, T> {
        DeviceView::new(self.span, self.device())
    }
    /// The whole buffer, borrowed mutably.
    pub fn view_mut(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut::new(self.span, self.stream.device())
    }
    /// Elements `range`, borrowed. Out of range is [`Error::OutOfBounds`].
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>> {
        Ok(DeviceView::new(
            self.span.sub("slice", range)?,
            self.device(),
        ))
    }
    /// Elements `range`, borrowed mutably.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        let span = self.span.sub("slice_mut", range)?;
        Ok(DeviceViewMut::new(span, self.stream.device()))
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
        self.view().to_vec(&self.stream)
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
    /// Hands the memory to the device, which frees it at its next sync
    /// point (work on any stream may still use it); never waits here.
    fn drop(&mut self) {
        let bytes = self.span.num_bytes();
        if bytes > 0 && self.owned {
            self.stream.device().defer_free(self.span.ptr, bytes);
        }
    }
}

/// A borrowed range of device memory. Dereferences to [`DeviceSpan`].
pub struct DeviceView<'a, T> {
    span: DeviceSpan<T>,
    device: &'a Device,
    _p: PhantomData<&'a T>,
}

/// A mutably borrowed range of device memory. Dereferences to
/// [`DeviceSpan`].
pub struct DeviceViewMut<'a, T> {
    span: DeviceSpan<T>,
    device: &'a Device,
    _p: PhantomData<&'a mut T>,
}

impl<T> Clone for DeviceView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DeviceView<'_, T> {}

impl<T> std::fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceView")
            .field("span", &self.span)
            .finish()
    }
}

impl<T> std::fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceViewMut")
            .field("span", &self.span)
            .finish()
    }
}

impl<T> Deref for DeviceView<'_, T> {
    type Target = DeviceSpan<T>;
    fn deref(&self) -> &DeviceSpan<T> {
        &self.span
    }
}

impl<T> Deref for DeviceViewMut<'_, T> {
    type Target = DeviceSpan<T>;
    fn deref(&self) -> &DeviceSpan<T> {
        &self.span
    }
}

impl<'a, T: bytemuck::Pod> DeviceView<'a, T> {
    /// A view of `span` on `device` (the caller keeps the span inside a live
    /// allocation of that device for `'a`).
    pub(crate) fn new(span: DeviceSpan<T>, device: &'a Device) -> DeviceView<'a, T> {
        DeviceView {
            span,
            device,
            _p: PhantomData,
        }
    }

    /// Borrows `len` elements of `T` at `ptr`, memory rocm-safe does not own
    /// (another framework's tensor), so that conversions, fingerprints and
    /// conv3d can run on it. Nothing is freed when the view goes.
    ///
    /// Errors: [`Error::Misaligned`] when `ptr` is not aligned for `T`,
    /// [`Error::SizeOverflow`] when the byte length overflows.
    ///
    /// # Safety
    /// `ptr` addresses `len * size_of::<T>()` bytes of `device`'s memory
    /// (for the host backend, host memory), valid values of `T`, that stay
    /// allocated and are not written by anyone for `'a` except through work
    /// ordered after what reads them.
    pub unsafe fn from_raw(device: &'a Device, ptr: DevicePtr, len: usize) -> Result<Self> {
        Ok(DeviceView::new(
            raw_span(ptr, len, "DeviceView::from_raw")?,
            device,
        ))
    }
    /// The same bytes as elements of `B` (whole elements, aligned).
    pub fn cast<B: bytemuck::Pod>(&self) -> Result<DeviceView<'a, B>> {
        Ok(DeviceView::new(self.span.cast("cast")?, self.device))
    }
    /// The device.
    pub fn device(&self) -> &'a Device {
        self.device
    }
    /// Elements `range` of this view.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'a, T>> {
        Ok(DeviceView::new(self.span.sub("slice", range)?, self.device))
    }

    /// Copies the view into `dst` (same length) on `stream`, and waits.
    pub fn copy_dtoh(&self, stream: &Stream, dst: &mut [T]) -> Result<()> {
        check("copy_dtoh", stream, self.device, self.len(), dst.len())?;
        if self.num_bytes() == 0 {
            return Ok(());
        }
        // SAFETY: the view is a live range of this device; `dst` has exactly
        // `num_bytes` writable bytes, borrowed mutably until the synchronize
        // below, so nothing reads or frees it while the copy runs.
        unsafe {
            let op = CopyOp::DtoH {
                dst: dst.as_mut_ptr().cast(),
                src: self.span.ptr,
            };
            stream.backend().copy(op, self.num_bytes(), stream.raw())?
        };
        stream.synchronize()
    }

    /// The view's contents as a new vector, copied on `stream` (waits).
    /// Allocates fallibly: [`Error::OutOfMemory`] when the host cannot hold
    /// them.
    pub fn to_vec(&self, stream: &Stream) -> Result<Vec<T>> {
        let mut v = Vec::new();
        v.try_reserve_exact(self.len())
            .map_err(|_| Error::OutOfMemory {
                backend: "host",
                op: "to_vec",
                bytes: self.num_bytes() as u64,
            })?;
        v.resize(self.len(), T::zeroed());
        self.copy_dtoh(stream, &mut v)?;
        Ok(v)
    }

    /// Queues an asynchronous copy of this view into pinned memory (same
    /// length) on `stream`. The pinned buffer remembers the copy: touching
    /// it from the host, or dropping it, first waits for the copy.
    pub fn copy_dtoh_async(&self, stream: &Stream, dst: &mut PinnedBuffer<T>) -> Result<()> {
        check(
            "copy_dtoh_async",
            stream,
            self.device,
            self.len(),
            dst.len(),
        )?;
        stream.check_device("copy_dtoh_async", dst.device())?;
        if self.num_bytes() == 0 {
            return Ok(());
        }
        dst.wait()?;
        // SAFETY: the view is a live range of this device; the pinned memory
        // is live and is not read from the host before the event recorded
        // below completes (PinnedBuffer waits for it before any host access
        // or free).
        unsafe {
            let op = CopyOp::DtoH {
                dst: dst.as_mut_ptr_for_copy(),
                src: self.span.ptr,
            };
            stream.backend().copy(op, self.num_bytes(), stream.raw())?
        };
        dst.mark_pending(stream)
    }

    /// Queues an asynchronous copy of this view into `dst` starting at
    /// element `dst_start` (a staging buffer larger than one piece), on
    /// `stream`. The pinned buffer remembers the copy as
    /// [`DeviceView::copy_dtoh_async`] does.
    ///
    /// Errors: [`Error::OutOfBounds`] when the view does not fit in `dst`
    /// from `dst_start`.
    pub fn copy_dtoh_async_range(
        &self,
        stream: &Stream,
        dst: &mut PinnedBuffer<T>,
        dst_start: usize,
    ) -> Result<()> {
        const OP: &str = "copy_dtoh_async_range";
        stream.check_device(OP, self.device)?;
        stream.check_device(OP, dst.device())?;
        if dst_start
            .checked_add(self.len())
            .is_none_or(|e| e > dst.len())
        {
            return Err(Error::OutOfBounds {
                op: OP,
                start: dst_start,
                end: dst_start.saturating_add(self.len()),
                len: dst.len(),
            });
        }
        if self.num_bytes() == 0 {
            return Ok(());
        }
        dst.wait()?;
        let off = dst_start * std::mem::size_of::<T>();
        // SAFETY: the view is a live range of this device; `dst_start +
        // len <= dst.len` (checked), so the destination lies inside the
        // live pinned allocation, which is not read from the host before
        // the event recorded below completes (PinnedBuffer waits for it
        // before any host access or free).
        unsafe {
            let op = CopyOp::DtoH {
                dst: dst.as_mut_ptr_for_copy().add(off),
                src: self.span.ptr,
            };
            stream.backend().copy(op, self.num_bytes(), stream.raw())?
        };
        dst.mark_pending(stream)
    }
}

/// A span of `len` elements of `T` at an outside address, checked for
/// alignment and a byte length that fits.
fn raw_span<T>(ptr: DevicePtr, len: usize, op: &'static str) -> Result<DeviceSpan<T>> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::SizeOverflow { op, elements: len })?;
    let align = std::mem::align_of::<T>() as u64;
    if !ptr.0.is_multiple_of(align) {
        return Err(Error::Misaligned {
            op,
            addr: ptr.0,
            align,
        });
    }
    Ok(DeviceSpan::new(ptr, len))
}

/// The checks every copy makes: `stream` is on `device`, the lengths match.
fn check(
    op: &'static str,
    stream: &Stream,
    device: &Device,
    expected: usize,
    actual: usize,
) -> Result<()> {
    stream.check_device(op, device)?;
    if expected != actual {
        return Err(Error::LengthMismatch {
            op,
            expected,
            actual,
            tensor: None,
        });
    }
    Ok(())
}

impl<'a, T: bytemuck::Pod> DeviceViewMut<'a, T> {
    /// Borrows `len` elements of `T` at `ptr` mutably, memory rocm-safe does
    /// not own (another framework's tensor), as [`DeviceView::from_raw`].
    ///
    /// # Safety
    /// As [`DeviceView::from_raw`], and nothing else reads or writes the
    /// memory for `'a` except through work ordered with what this view's
    /// operations queue.
    pub unsafe fn from_raw(device: &'a Device, ptr: DevicePtr, len: usize) -> Result<Self> {
        Ok(DeviceViewMut::new(
            raw_span(ptr, len, "DeviceViewMut::from_raw")?,
            device,
        ))
    }

    /// A mutable view of `span` on `device` (the caller keeps the span
    /// inside a live allocation of that device, borrowed exclusively, for
    /// `'a`).
    pub(crate) fn new(span: DeviceSpan<T>, device: &'a Device) -> DeviceViewMut<'a, T> {
        DeviceViewMut {
            span,
            device,
            _p: PhantomData,
        }
    }
    /// The same bytes as elements of `B`, reborrowed mutably.
    pub fn cast_mut<B: bytemuck::Pod>(&mut self) -> Result<DeviceViewMut<'_, B>> {
        Ok(DeviceViewMut::new(self.span.cast("cast_mut")?, self.device))
    }
    /// The device.
    pub fn device(&self) -> &'a Device {
        self.device
    }
    /// The same range, read-only.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView::new(self.span, self.device)
    }
    /// Elements `range` of this view, reborrowed mutably.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        Ok(DeviceViewMut::new(
            self.span.sub("slice_mut", range)?,
            self.device,
        ))
    }

    /// Splits the view at element `mid` into two disjoint mutable views
    /// (consumes it; reborrow with [`DeviceViewMut::slice_mut`] to keep it).
    pub fn split_at_mut(self, mid: usize) -> Result<(DeviceViewMut<'a, T>, DeviceViewMut<'a, T>)> {
        let head = self.span.sub("split_at_mut", ..mid)?;
        let tail = self.span.sub("split_at_mut", mid..)?;
        Ok((
            DeviceViewMut::new(head, self.device),
            DeviceViewMut::new(tail, self.device),
        ))
    }

    /// Copies `src` (same length) into the view on `stream`, and waits.
    pub fn copy_htod(&mut self, stream: &Stream, src: &[T]) -> Result<()> {
        check("copy_htod", stream, self.device, self.len(), src.len())?;
        if self.num_bytes() == 0 {
            return Ok(());
        }
        // SAFETY: the view is a live, mutably borrowed range of this device;
        // `src` has `num_bytes` readable bytes and stays borrowed until the
        // synchronize below.
        unsafe {
            let op = CopyOp::HtoD {
                dst: self.span.ptr,
                src: src.as_ptr().cast(),
            };
            stream.backend().copy(op, self.num_bytes(), stream.raw())?
        };
        stream.synchronize()
    }

    /// Queues a copy of `src` (same length) into the view on `stream`.
    pub fn copy_dtod(&mut self, stream: &Stream, src: &DeviceView<'_, T>) -> Result<()> {
        check("copy_dtod", stream, self.device, self.len(), src.len())?;
        stream.check_device("copy_dtod", src.device)?;
        if self.num_bytes() == 0 {
            return Ok(());
        }
        // SAFETY: both are live ranges of this device; `self` is borrowed
        // mutably, so `src` (a shared borrow) cannot overlap it.
        unsafe {
            let op = CopyOp::DtoD {
                dst: self.span.ptr,
                src: src.span.ptr,
            };
            stream.backend().copy(op, self.num_bytes(), stream.raw())
        }
    }

    /// Copies `src`, memory of another device of the same runtime (made
    /// ready on `src_stream`, which is synchronized first), into the view
    /// on `stream` (the view's device), and waits: the runtime's device to
    /// device copy across devices (`cuMemcpyDtoDAsync` under CUDA's unified
    /// addressing, `hipMemcpyAsync` device to device), over NVLink / xGMI
    /// where the devices have peer access, staged by the runtime otherwise.
    ///
    /// Errors: [`Error::LengthMismatch`]; [`Error::BackendUnsupported`]
    /// when the two devices are of different runtimes.
    pub(crate) fn copy_from_peer(
        &mut self,
        stream: &Stream,
        src: &DeviceView<'_, T>,
        src_stream: &Stream,
    ) -> Result<()> {
        check("copy_from_peer", stream, self.device, self.len(), src.len())?;
        src_stream.check_device("copy_from_peer", src.device)?;
        if stream.device().kind() != src_stream.device().kind() {
            return Err(Error::BackendUnsupported {
                backend: src_stream.device().kind().name(),
                op: "copy_from_peer (devices of two runtimes)",
            });
        }
        if self.num_bytes() == 0 {
            return Ok(());
        }
        src_stream.synchronize()?;
        // SAFETY: `self` is a live, mutably borrowed range of this device;
        // `src` a live range of a device of the same runtime, whose
        // pointers the runtime resolves in its one address space (unified
        // addressing; the host backend's are host memory), ready (its
        // stream synchronized above) and borrowed until the synchronize
        // below; two devices' allocations never overlap.
        unsafe {
            let op = CopyOp::DtoD {
                dst: self.span.ptr,
                src: src.span.ptr,
            };
            stream.backend().copy(op, self.num_bytes(), stream.raw())?;
        }
        stream.synchronize()
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
                .memset_zero(self.span.ptr, self.num_bytes(), stream.raw())
        }
    }

    /// Queues an asynchronous copy from pinned memory (same length) on
    /// `stream`. The pinned buffer remembers the copy: touching it from the
    /// host, or dropping it, first waits for the copy.
    pub fn copy_htod_async(&mut self, stream: &Stream, src: &mut PinnedBuffer<T>) -> Result<()> {
        check(
            "copy_htod_async",
            stream,
            self.device,
            self.len(),
            src.len(),
        )?;
        self.copy_htod_async_range(stream, src, 0)
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
        stream.check_device("copy_htod_async_range", src.device())?;
        let end = src_start
            .checked_add(self.len())
            .filter(|&e| e <= src.len());
        let Some(_) = end else {
            return Err(Error::OutOfBounds {
                op: "copy_htod_async_range",
                start: src_start,
                end: src_start.saturating_add(self.len()),
                len: src.len(),
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
            let op = CopyOp::HtoD {
                dst: self.span.ptr,
                src: src.as_mut_ptr_for_copy().add(off).cast_const(),
            };
            stream.backend().copy(op, self.num_bytes(), stream.raw())?
        };
        src.mark_pending(stream)
    }

    /// Queues an asynchronous copy of `self.num_bytes()` bytes of host
    /// memory at `src` into the view on `stream`: the loader's direct path,
    /// from mapped file pages registered with
    /// [`Driver::register_read_only`](super::Driver::register_read_only).
    ///
    /// # Safety
    /// `src..src + self.num_bytes()` lies inside one registered range that
    /// stays registered and mapped until the copy has completed on
    /// `stream` (an event recorded after it has been waited on).
    pub(crate) unsafe fn copy_htod_async_registered(
        &mut self,
        stream: &Stream,
        src: *const u8,
    ) -> Result<()> {
        stream.check_device("copy_htod_async_registered", self.device)?;
        if self.num_bytes() == 0 {
            return Ok(());
        }
        let op = CopyOp::HtoD {
            dst: self.span.ptr,
            src,
        };
        // SAFETY: the destination is a live, mutably borrowed device range;
        // the source range is registered and stays so until the copy is
        // done (the caller's guarantee).
        unsafe { stream.backend().copy(op, self.num_bytes(), stream.raw()) }
    }

    /// Queues an asynchronous copy of this view into pinned memory (see
    /// [`DeviceView::copy_dtoh_async`]).
    pub fn copy_dtoh_async(&self, stream: &Stream, dst: &mut PinnedBuffer<T>) -> Result<()> {
        self.as_view().copy_dtoh_async(stream, dst)
    }
}
