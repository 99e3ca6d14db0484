//! [`Device`]: an opened device, shared by cheap clones, recording the
//! errors that happen where they cannot be returned (`Drop`).

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::info::{BackendKind, DeviceInfo, DevicePtr};
use super::pinned::PinnedBuffer;
use super::runtime::host;
use super::stream::{Event, Stream};
use crate::device::raw::backend::{Backend, Driver};
use crate::error::{Error, ErrorKind, Result};

struct DeviceInner {
    backend: Box<dyn Backend>,
    errors: Mutex<Vec<Error>>,
    id: u64,
    /// Device memory dropped by its owners, freed at the next sync point.
    pending: Mutex<Pending>,
    /// Bytes of device memory rocm-safe owns on this device (allocated or
    /// taken over, not yet freed or given away).
    owned: AtomicU64,
    /// State that layers above keep per device (the verified conversion's
    /// self-test report), one value per type; dropped with the device.
    slots: Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>,
}

/// Frees waiting for the device's next sync point: a dropped buffer may
/// still be read or written by work queued on any stream of the device, so
/// it is freed only once the whole device has been idle, without making
/// the thread that dropped it wait.
#[derive(Default)]
struct Pending {
    frees: Vec<(DevicePtr, usize)>,
    bytes: usize,
}

/// Above this many bytes waiting, a drop waits for the device and frees
/// them all (so deferral never holds more than this much memory back).
pub(crate) const PENDING_FREE_MAX: usize = 256 << 20;

impl Drop for DeviceInner {
    fn drop(&mut self) {
        let p = std::mem::take(match self.pending.get_mut() {
            Ok(p) => p,
            Err(e) => e.into_inner(),
        });
        if p.frees.is_empty() || self.backend.synchronize().is_err() {
            // Possibly still in use after a failed wait: leaked, never
            // freed under a kernel that may still run.
            return;
        }
        for (ptr, bytes) in p.frees {
            // SAFETY: each came from this backend's `alloc(bytes)`, is freed
            // once (taken out of the list), and the device is idle.
            let _ = unsafe { self.backend.free(ptr, bytes) };
        }
    }
}

/// The next [`Device::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

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
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                pending: Mutex::new(Pending::default()),
                owned: AtomicU64::new(0),
                slots: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The host backend (always available).
    pub fn host() -> Device {
        Device::from_backend(Box::new(host::HostBackend::new()))
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

    /// How this device's conversion kernels were obtained (see
    /// [`Backend::kernel_source`]); loads them if needed.
    pub fn kernel_source(&self) -> Result<super::KernelSource> {
        self.backend().kernel_source()
    }

    /// Creates a new stream.
    pub fn stream(&self) -> Result<Stream> {
        Stream::create(self)
    }

    /// Creates a new event.
    pub fn event(&self) -> Result<Event> {
        let raw = self.backend().event_create()?;
        Ok(Event {
            device: self.clone(),
            raw,
        })
    }

    /// Waits until all work on the device is done, then frees the memory
    /// of buffers dropped since the last sync point.
    pub fn synchronize(&self) -> Result<()> {
        self.backend().synchronize()?;
        self.free_pending_idle();
        Ok(())
    }

    /// Frees `bytes` at `ptr` (an allocation of this device's backend that
    /// nothing will use again) once every stream of the device has reached
    /// the work queued so far: at the next [`Device::synchronize`],
    /// [`Device::take_errors`], out-of-memory retry or device close, or at
    /// once (after a wait for the device) when more than 256 MiB are
    /// waiting. Dropping a buffer therefore never waits for the device.
    pub(crate) fn defer_free(&self, ptr: DevicePtr, bytes: usize) {
        let over = {
            let mut p = lock(&self.inner.pending);
            p.frees.push((ptr, bytes));
            p.bytes = p.bytes.saturating_add(bytes);
            p.bytes > PENDING_FREE_MAX
        };
        if over {
            if let Err(e) = self.synchronize() {
                self.record_err(e);
            }
        }
    }

    /// Bytes of dropped buffers waiting for the next sync point.
    pub fn pending_free_bytes(&self) -> usize {
        lock(&self.inner.pending).bytes
    }

    /// Frees every pending allocation; the device is idle (the caller just
    /// synchronized it). Errors are recorded ([`Device::take_errors`]).
    fn free_pending_idle(&self) {
        let p = std::mem::take(&mut *lock(&self.inner.pending));
        for (ptr, bytes) in p.frees {
            // SAFETY: each came from this backend's `alloc(bytes)` (the
            // buffer that deferred it owned it), is freed once (taken out of
            // the list), and the device is idle.
            match unsafe { self.backend().free(ptr, bytes) } {
                Ok(()) => self.account(-(bytes as i128)),
                Err(e) => self.record_err(e),
            }
        }
    }

    /// Allocates `bytes` on the device; out of memory, it waits for the
    /// device, frees what dropped buffers left pending, and tries once more.
    pub(crate) fn alloc_raw(&self, bytes: usize) -> Result<DevicePtr> {
        let p = match self.backend().alloc(bytes) {
            Err(e) if e.kind() == ErrorKind::OutOfMemory && self.pending_free_bytes() > 0 => {
                self.synchronize()?;
                self.backend().alloc(bytes)
            }
            r => r,
        }?;
        self.account(bytes as i128);
        Ok(p)
    }

    /// Bytes of device memory rocm-safe owns on this device: allocated by
    /// its buffers or taken over ([`super::DeviceBuffer::from_raw_parts`]),
    /// not yet freed (dropped buffers count until their memory is freed at
    /// the next sync point) nor given away
    /// ([`super::DeviceBuffer::into_raw_parts`]).
    pub fn owned_bytes(&self) -> u64 {
        self.inner.owned.load(Ordering::SeqCst)
    }

    /// Adds `delta` bytes to [`Device::owned_bytes`] (saturating at 0).
    pub(crate) fn account(&self, delta: i128) {
        let _ = self
            .inner
            .owned
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| {
                let n = (i128::from(v) + delta).clamp(0, i128::from(u64::MAX));
                u64::try_from(n).ok()
            });
    }

    /// Records an error that happened where it could not be returned
    /// (`Drop`); read them with [`Device::take_errors`].
    pub fn record_err(&self, e: Error) {
        if let Ok(mut v) = self.inner.errors.lock() {
            v.push(e);
        }
    }

    /// Returns (and clears) the errors recorded since the last call. Frees
    /// of dropped buffers still waiting for a sync point are made first (a
    /// wait for the device), so their errors are among them.
    pub fn take_errors(&self) -> Vec<Error> {
        if self.pending_free_bytes() > 0 {
            if let Err(e) = self.synchronize() {
                self.record_err(e);
            }
        }
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
            // Zeroed by the backend (the `Driver` contract).
            self.backend().alloc_pinned(bytes)?
        };
        Ok(PinnedBuffer::from_alloc(self.clone(), ptr, len))
    }

    /// `(free, total)` device memory in bytes as the runtime reports it
    /// (see [`Driver::mem_info`]: the host backend reports host RAM; on an
    /// APU the runtime's total may be only the VRAM carve-out).
    ///
    /// Errors: [`Error::BackendUnsupported`] where the backend cannot tell,
    /// or the runtime's own error.
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        self.backend().mem_info()
    }

    /// A number no other device opened by this process has (clones share
    /// it).
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The value of type `T` kept on this device by a layer above (the
    /// device knows nothing of the type), if one was stored.
    pub(crate) fn slot<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let v = lock(&self.inner.slots).get(&TypeId::of::<T>()).cloned()?;
        v.downcast::<T>().ok()
    }

    /// Stores `value` as this device's `T` unless one is there already;
    /// returns the one kept (the first stored wins). It lives as long as
    /// the device: a value must not hold the device itself (the cycle
    /// would keep both alive).
    pub(crate) fn slot_or_insert<T: Any + Send + Sync>(&self, value: T) -> Arc<T> {
        let key = TypeId::of::<T>();
        let mut slots = lock(&self.inner.slots);
        // The entry of `TypeId::of::<T>()` always holds a `T`.
        if let Some(v) = slots
            .get(&key)
            .cloned()
            .and_then(|v| v.downcast::<T>().ok())
        {
            return v;
        }
        let v = Arc::new(value);
        slots.insert(key, v.clone());
        v
    }

    /// A handle that does not keep the device open.
    pub(crate) fn downgrade(&self) -> WeakDevice {
        WeakDevice(Arc::downgrade(&self.inner))
    }
}

/// A [`Device`] that is not kept open by this handle.
#[derive(Clone)]
pub(crate) struct WeakDevice(Weak<DeviceInner>);

impl WeakDevice {
    /// A handle of no device (`upgrade` gives `None`).
    pub(crate) const fn new() -> WeakDevice {
        WeakDevice(Weak::new())
    }

    /// The device, while another handle keeps it open.
    pub(crate) fn upgrade(&self) -> Option<Device> {
        self.0.upgrade().map(|inner| Device { inner })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

pub(crate) fn byte_len<T>(op: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::SizeOverflow { op, elements: len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::faults::{FaultKind, FaultPlan, Faults, When};
    use crate::device::runtime::host::HostBackend;

    #[test]
    fn out_of_memory_with_frees_pending_syncs_frees_and_retries_once() {
        let (f, h) = Faults::new(
            HostBackend::new(),
            FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Nth(1)),
        );
        let dev = Device::from_backend(Box::new(f));
        let s = dev.stream().unwrap();
        drop(s.alloc::<u8>(4096).unwrap()); // allocation 0: now pending
        assert_eq!(dev.pending_free_bytes(), 4096);
        // Allocation 1 runs out of memory; the pending free is made and
        // allocation 2 serves the call.
        let b = s.alloc::<u8>(1024).unwrap();
        assert_eq!(h.injected().len(), 1);
        assert_eq!(dev.pending_free_bytes(), 0);
        assert_eq!(dev.owned_bytes(), 1024);
        drop(b);
        // Nothing pending: out of memory is returned as it is.
        let (f, _h) = Faults::new(
            HostBackend::new(),
            FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Nth(0)),
        );
        let dev = Device::from_backend(Box::new(f));
        let e = dev.stream().unwrap().alloc::<u8>(16).unwrap_err();
        assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    }

    #[test]
    fn a_failed_free_at_the_sync_point_is_recorded_and_stays_owned() {
        let (f, h) = Faults::new(
            HostBackend::new(),
            FaultPlan::one(FaultKind::TeardownFailure, When::Always),
        );
        h.set_enabled(false);
        let dev = Device::from_backend(Box::new(f));
        let s = dev.stream().unwrap();
        drop(s.alloc::<u8>(64).unwrap());
        drop(s);
        // A failing free at the sync point is recorded, not lost.
        h.set_enabled(true);
        dev.synchronize().unwrap();
        let errs = dev.take_errors();
        assert!(
            errs.iter()
                .any(|e| matches!(e, Error::InjectedFault { .. })),
            "{errs:?}"
        );
        assert_eq!(dev.owned_bytes(), 64, "a failed free stays owned (leaked)");
    }

    #[test]
    fn slots_keep_one_value_per_type_and_drop_with_the_device() {
        struct Marker(u32);
        let dev = Device::host();
        assert!(dev.slot::<Marker>().is_none());
        let first = dev.slot_or_insert(Marker(1));
        // The first stored wins; clones of the handle see it.
        let again = dev.clone().slot_or_insert(Marker(2));
        assert!(Arc::ptr_eq(&first, &again));
        assert_eq!(dev.slot::<Marker>().map(|m| m.0), Some(1));
        assert!(dev.slot::<u64>().is_none());
        // Another device has slots of its own.
        assert!(Device::host().slot::<Marker>().is_none());
        let weak = dev.downgrade();
        assert!(weak.upgrade().is_some_and(|d| d.same(&dev)));
        drop((dev, again));
        assert_eq!(Arc::strong_count(&first), 1, "the device's copy is gone");
        assert!(weak.upgrade().is_none());
        assert!(WeakDevice::new().upgrade().is_none());
    }

    #[test]
    fn open_with_takes_the_options_given() {
        use crate::device::{DeviceOptions, Pinning};
        let opts = DeviceOptions::default().with_pinning(Pinning::HostAlloc);
        let d = Device::open_with(BackendKind::Host, 0, &opts).unwrap();
        assert_eq!(d.kind(), BackendKind::Host);
        let e = Device::open_with(BackendKind::Host, 1, &opts).unwrap_err();
        assert!(matches!(e, Error::NoDevice { .. }), "{e}");
    }
}
