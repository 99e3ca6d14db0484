//! [`PinnedBuffer`]: page-locked host memory, the staging buffer of
//! asynchronous copies; host access waits for the copies that use it.

use std::marker::PhantomData;

use super::device_handle::Device;
use super::stream::{Event, Stream};
use crate::error::Result;

/// Page-locked host memory for `len` elements of `T` (a staging buffer for
/// asynchronous copies). Host access ([`PinnedBuffer::as_slice`],
/// [`PinnedBuffer::as_mut_slice`]) and `Drop` first wait for the last copy
/// that used it.
pub struct PinnedBuffer<T> {
    device: Device,
    ptr: *mut u8,
    len: usize,
    pending: Option<Event>,
    /// Whether `pending` was waited for since it was recorded (the copy is
    /// done: waiting again would be a driver call for nothing).
    waited: bool,
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
    /// Takes ownership of `len` elements at `ptr`, allocated (and zeroed)
    /// by `device`'s backend `alloc_pinned` (null for no bytes).
    pub(crate) fn from_alloc(device: Device, ptr: *mut u8, len: usize) -> PinnedBuffer<T> {
        PinnedBuffer {
            device,
            ptr,
            len,
            pending: None,
            waited: false,
            _p: PhantomData,
        }
    }
    /// The device whose runtime pinned this memory.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The first byte, for a copy the caller queues and then records with
    /// [`PinnedBuffer::mark_pending`] (after [`PinnedBuffer::wait`]).
    pub(crate) fn as_mut_ptr_for_copy(&mut self) -> *mut u8 {
        self.ptr
    }
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Remembers a copy just queued on `stream` that uses this buffer.
    pub(crate) fn mark_pending(&mut self, stream: &Stream) -> Result<()> {
        let ev = match self.pending.take() {
            Some(e) => e,
            None => stream.device().event()?,
        };
        // Not waited for, whatever happens below: a failed record leaves
        // an event whose state is unknown.
        self.waited = false;
        stream.record(&ev)?;
        self.pending = Some(ev);
        Ok(())
    }

    /// The event recorded after the last asynchronous copy that used this
    /// buffer, while that copy may still be running (`None` once waited
    /// for, or when no copy used it): another stream that waits for it is
    /// ordered after the copy and the work queued before it.
    pub(crate) fn pending_event(&self) -> Option<&Event> {
        self.pending.as_ref().filter(|_| !self.waited)
    }

    /// Waits for the last asynchronous copy that used this buffer.
    pub fn wait(&mut self) -> Result<()> {
        if let Some(ev) = &self.pending {
            if !self.waited {
                ev.synchronize()?;
                self.waited = true;
            }
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
        if let Some(ev) = self.pending.as_ref().filter(|_| !self.waited) {
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
