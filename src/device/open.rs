//! Opening a device: the one place that names every runtime
//! ([`open_backend`], [`Device::open`], [`Device::list`]), so that the safe
//! types ([`Device`], [`Stream`](super::Stream), the buffers) depend on
//! none of them.

use super::device_handle::Device;
use super::info::{BackendKind, DeviceInfo};
use super::options::DeviceOptions;
#[cfg(feature = "cuda")]
use super::runtime::cuda;
#[cfg(feature = "hip")]
use super::runtime::hip;
use super::runtime::host;
use super::visible::VisibleDevices;
use crate::device::raw::backend::Backend;
#[cfg(any(feature = "hip", feature = "cuda"))]
use crate::device::runtime::gpu::Gpu;
use crate::error::{Error, Result};

/// Opens the raw backend of device `ordinal` of `kind` (to wrap it, for
/// example in `Faults` (feature `testing`), before [`Device::from_backend`]),
/// with the options of [`DeviceOptions::from_env`]. Errors as
/// [`Device::open`].
pub fn open_backend(kind: BackendKind, ordinal: usize) -> Result<Box<dyn Backend>> {
    open_backend_with(kind, ordinal, &DeviceOptions::from_env())
}

/// [`open_backend`] with the options given (no environment is read).
pub fn open_backend_with(
    kind: BackendKind,
    ordinal: usize,
    options: &DeviceOptions,
) -> Result<Box<dyn Backend>> {
    #[cfg(not(any(feature = "hip", feature = "cuda")))]
    let _ = options;
    match kind {
        BackendKind::Host if ordinal == 0 => Ok(Box::new(host::HostBackend::new())),
        BackendKind::Host => Err(Error::NoDevice {
            backend: "host",
            ordinal: Some(ordinal),
            count: 1,
            visible: VisibleDevices::none(),
        }),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Ok(Box::new(Gpu::new(
            cuda::CudaRuntime::open(ordinal)?,
            options.pinning,
        ))),
        #[cfg(feature = "hip")]
        BackendKind::Hip => Ok(Box::new(Gpu::new(
            hip::HipRuntime::open(ordinal)?,
            options.pinning,
        ))),
        #[allow(unreachable_patterns)]
        other => Err(Error::BackendNotBuilt {
            backend: other.name(),
        }),
    }
}

impl Device {
    /// Opens device `ordinal` of `kind` with the options the environment
    /// asks for ([`DeviceOptions::from_env`]).
    ///
    /// Errors: [`Error::BackendNotBuilt`] when the feature is off,
    /// [`Error::NoRuntime`] when the runtime library cannot be loaded,
    /// [`Error::NoDevice`] when there is no such device, or the runtime's own
    /// error.
    pub fn open(kind: BackendKind, ordinal: usize) -> Result<Device> {
        Device::open_with(kind, ordinal, &DeviceOptions::from_env())
    }

    /// Opens device `ordinal` of `kind` with `options` (no environment
    /// variable is read). Errors as [`Device::open`].
    pub fn open_with(kind: BackendKind, ordinal: usize, options: &DeviceOptions) -> Result<Device> {
        Ok(Device::from_backend(open_backend_with(
            kind, ordinal, options,
        )?))
    }

    /// The first device that opens, in the order HIP, CUDA, host: ordinal
    /// 0 of the first GPU backend that is built and has a device, else the
    /// host backend (always available). Use [`Device::open`] to see why a
    /// GPU backend did not open.
    pub fn first_available() -> Device {
        [BackendKind::Hip, BackendKind::Cuda]
            .into_iter()
            .filter(|k| k.is_built())
            .find_map(|k| Device::open(k, 0).ok())
            .unwrap_or_else(Device::host)
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
}
