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
//! | a conv3d on the device | [`Conv3dOps::forward`](crate::device::Conv3dOps::forward), [`Conv3dOps::vendor`](crate::device::Conv3dOps::vendor) | the conv3d chain's GPU tiers; [`Conv3dLaunch`] at the backend |
//! | its gradients on the device | [`Conv3dOps::backward_data`](crate::device::Conv3dOps::backward_data) (also `conv_transpose3d`), `_weight`, `_bias`; [`Conv3dOps::backward_data_vendor`](crate::device::Conv3dOps::backward_data_vendor), `_weight_vendor` | the chain's naive and vendor tiers for the backward ops; [`Conv3dBackwardLaunch`] at the backend |
//!
//! Backends implement two raw, object-safe traits (addresses, handles, byte
//! counts): [`Driver`] (memory, streams, events, copies: what differs per
//! runtime) and [`Backend`] (the kernel operations). [`host`] (always, in `runtime/`;
//! device memory is host memory and kernels are `crate::convert`)
//! implements both; the GPU runtimes, `hip` (feature `hip`) and `cuda`
//! (feature `cuda`), implement only [`Driver`] and a small crate-private
//! `Runtime` trait (load a module, launch a kernel, open the vendor
//! library), and one generic GPU body (`runtime/gpu.rs`) implements [`Backend`]
//! over either, so every line HIP runs beyond its runtime calls is a line
//! the CUDA tests execute. Neither trait has default methods (a backend
//! that leaves one out does not compile); a wrapping backend implements
//! [`Wrap`], writes what it changes and forwards the rest with
//! [`crate::forward_driver!`] / [`crate::forward_backend!`], and is opened
//! with [`Device::from_backend`]:
//! `faults::Faults` (feature `testing`) injects the documented ROCm failure modes into any
//! backend.
//!
//! The layers inside, bottom to top (ARCHITECTURE.md, "Layer order"): plain
//! data; the raw interface ([`raw`]); the runtimes; the safe types at this
//! root; the factory that names every runtime ([`raw::open_backend`],
//! [`Device::open`], [`Device::list`]).
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
//! use rocm_safe::fallback::Outcome;
//! use rocm_safe::verify::{self, VerifyOptions};
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
//! assert!(matches!(report.outcome, Outcome::Served));
//! assert_eq!(report.expected, report.actual);
//! # Ok(())
//! # }
//! ```

mod buffer;
pub(crate) mod conv3d_stream;
mod device_handle;
pub(crate) mod dynlib;
pub(crate) mod fault_kind;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod faults;
mod hostmem;
pub(crate) mod info;
pub(crate) mod kernel_cache;
pub(crate) mod kernels;
pub(crate) mod open;
mod ops;
mod options;
mod pinned;
pub mod raw;
mod stream;
pub(crate) mod visible;

pub(crate) mod runtime;

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub use runtime::cuda;
#[cfg(feature = "hip")]
#[cfg_attr(docsrs, doc(cfg(feature = "hip")))]
pub use runtime::hip;
pub use runtime::host;

pub use buffer::{DeviceBuffer, DeviceSpan, DeviceView, DeviceViewMut};
pub use conv3d_stream::Conv3dOps;
pub use device_handle::Device;
pub(crate) use device_handle::WeakDevice;
pub(crate) use info::record_kernel_load;
pub use info::{
    kernel_loads, BackendKind, ConvertOp, DeviceInfo, KernelBuild, KernelCaps, KernelLoad,
    KernelSource,
};
pub use ops::NonFinite;
pub use options::{DeviceOptions, Pinning, PINNED_VAR};
pub use pinned::PinnedBuffer;
pub use raw::conv3d::Conv3dKernel;
pub use stream::{Event, Stream};
pub use visible::VisibleDevices;

#[cfg(doc)]
use raw::{Backend, Conv3dBackwardLaunch, Conv3dLaunch, Driver, Wrap};
