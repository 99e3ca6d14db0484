//! [`Device`]: an opened device, shared by cheap clones, recording the
//! errors that happen where they cannot be returned (`Drop`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::backend::{Backend, Driver};
#[cfg(feature = "cuda")]
use super::cuda;
#[cfg(any(feature = "hip", feature = "cuda"))]
use super::gpu::Gpu;
#[cfg(feature = "hip")]
use super::hip;
use super::info::{BackendKind, DeviceInfo};
use super::pinned::PinnedBuffer;
use super::stream::{Event, Stream};
use super::{host, VisibleDevices};
use crate::error::{Error, Result};

/// Opens the raw backend of device `ordinal` of `kind` (to wrap it, for
/// example in [`super::faults::Faults`], before [`Device::from_backend`]). Errors as
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
        BackendKind::Cuda => Ok(Box::new(Gpu::new(cuda::CudaRuntime::open(ordinal)?))),
        #[cfg(feature = "hip")]
        BackendKind::Hip => Ok(Box::new(Gpu::new(hip::HipRuntime::open(ordinal)?))),
        #[allow(unreachable_patterns)]
        other => Err(Error::BackendNotBuilt {
            backend: other.name(),
        }),
    }
}

struct DeviceInner {
    backend: Box<dyn Backend>,
    errors: Mutex<Vec<Error>>,
    id: u64,
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
    /// it): a key for per-device state kept by layers above this one (the
    /// verified-conversion self-test caches its report under it).
    pub fn id(&self) -> u64 {
        self.inner.id
    }
}

pub(crate) fn byte_len<T>(op: &'static str, len: usize) -> Result<usize> {
    len.checked_mul(std::mem::size_of::<T>())
        .ok_or(Error::SizeOverflow { op, elements: len })
}
