//! [`Stream`] (a queue of device work) and [`Event`] (a point in it).

use std::sync::Arc;

use super::buffer::DeviceBuffer;
use super::device_handle::{byte_len, Device};
use super::info::{DevicePtr, RawEvent, RawStream};
use crate::device::raw::backend::Backend;
use crate::error::{Error, Result};

struct StreamInner {
    device: Device,
    raw: RawStream,
    /// Created by rocm-safe (synchronized and destroyed with the last
    /// clone), or borrowed from its owner ([`Stream::from_raw`]).
    owned: bool,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
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

impl Stream {
    /// A new stream of `device` (owned: destroyed when the last clone goes).
    pub(super) fn create(device: &Device) -> Result<Stream> {
        let raw = device.backend().stream_create()?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                device: device.clone(),
                raw,
                owned: true,
            }),
        })
    }

    /// Wraps a stream rocm-safe did not create (a `hipStream_t` /
    /// `CUstream` a trainer owns, as its address; `RawStream(0)` is the
    /// runtime's default stream), so that every operation can run on it,
    /// ordered with the owner's own work. rocm-safe never synchronizes on
    /// drop nor destroys it.
    ///
    /// # Safety
    /// `raw` is a live stream of `device`'s runtime context (for the host
    /// backend, any value), and stays live while this `Stream`, its clones
    /// and the buffers allocated on it exist.
    pub unsafe fn from_raw(device: &Device, raw: RawStream) -> Stream {
        Stream {
            inner: Arc::new(StreamInner {
                device: device.clone(),
                raw,
                owned: false,
            }),
        }
    }

    /// Whether rocm-safe created this stream (and destroys it with the
    /// last clone) rather than borrowing it ([`Stream::from_raw`]).
    pub fn is_owned(&self) -> bool {
        self.inner.owned
    }

    /// The stream's device.
    pub fn device(&self) -> &Device {
        &self.inner.device
    }

    /// The raw handle.
    pub fn raw(&self) -> RawStream {
        self.inner.raw
    }

    pub(crate) fn backend(&self) -> &dyn Backend {
        self.inner.device.backend()
    }

    /// The device address of an optional gate (one `u64` of this device
    /// that a gated kernel reads as it starts; see
    /// `Conv3dOps::guard_decide`), checked: [`Error::DeviceMismatch`]
    /// (`op`) for a gate of another device, [`Error::LengthMismatch`]
    /// (`what`) for one that is not one element.
    pub(crate) fn gate_ptr(
        &self,
        (op, what): (&'static str, &'static str),
        gate: Option<&super::buffer::DeviceView<'_, u64>>,
    ) -> Result<Option<super::info::DevicePtr>> {
        let Some(g) = gate else { return Ok(None) };
        self.check_device(op, g.device())?;
        if g.len() != 1 {
            return Err(Error::LengthMismatch {
                op: what,
                expected: 1,
                actual: g.len(),
                tensor: None,
            });
        }
        Ok(Some(g.device_ptr()))
    }

    pub(crate) fn check_device(&self, op: &'static str, other: &Device) -> Result<()> {
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
            self.device().alloc_raw(bytes)?
        };
        Ok(DeviceBuffer::from_alloc(ptr, len, self.clone()))
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
}

/// A point in a stream's work.
pub struct Event {
    pub(super) device: Device,
    pub(super) raw: RawEvent,
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
