//! DLPack, both directions: rocm-safe memory handed to PyTorch, JAX, CuPy,
//! numpy or another Rust crate as a DLPack managed tensor ([`Export`]), and
//! their tensors borrowed as rocm-safe views ([`Imported`]), without a copy.
//!
//! | concept | type | notes |
//! | --- | --- | --- |
//! | memory on its way out | [`Export`] | a device buffer, a host vector or a loaded tensor, with dtype and shape |
//! | a managed tensor, owned | [`Managed`] of [`ffi::DLManagedTensor`] or [`ffi::DLManagedTensorVersioned`] | dropping it calls its deleter; [`Managed::into_raw`] gives the pointer for a `"dltensor"` / `"dltensor_versioned"` capsule |
//! | another framework's tensor | [`Imported`] | owns the producer's managed tensor, calls its deleter once on drop; lends [`DeviceView`](crate::device::DeviceView)s |
//! | where memory is | [`dl_device`] | `kDLROCM` on HIP, `kDLCUDA` on CUDA, `kDLCPU` on the host backend; the device's ordinal |
//! | element types | [`data_type`], [`dtype`] | every [`DType`] has a DLPack 1.3 code |
//!
//! # Layout
//!
//! Exported tensors are compact row-major with explicit strides (DLPack 1.2
//! and later forbid a NULL `strides` when `ndim != 0`; a 0-d tensor has
//! NULL shape and strides), `byte_offset` 0, `data` NULL when the tensor has
//! no bytes, flags 0 (writable: the consumer holds the only reference) and
//! version 1.3 for the versioned ABI. Sub-byte dtypes (`F4`, `F6_*`) are
//! exported packed, as their bytes are stored (DLPack reads element `i`
//! from bits `i * bits..`, little bit-endian). Imports accept a NULL
//! `strides` as compact for every version, and ignore the stride of a
//! dimension of size 1 (PyTorch hands out arbitrary ones there); any other
//! layout is refused.
//!
//! # Ownership
//!
//! An export gives its memory up ([`DeviceBuffer::into_raw_parts`]) and
//! keeps the raw parts with the buffer's [`Stream`](crate::device::Stream),
//! so the device outlives the capsule. The deleter (any thread, exactly once,
//! never unwinding) takes them back ([`DeviceBuffer::from_raw_parts`]) and
//! drops them: the memory is freed at the device's next sync point, when
//! every stream, the consumer's included, has finished with it
//! ([`Device::owned_bytes`](crate::device::Device::owned_bytes) counts it
//! again from the deleter until then). An import owns the producer's
//! managed tensor; a refused import calls the producer's deleter before it
//! returns the error (the usual DLPack rule once ownership was taken), so
//! the caller never frees the tensor after calling
//! [`Imported::from_raw`] / [`Imported::from_raw_versioned`].
//!
//! # The types: ours; the builder: `dlpark`
//!
//! The C structures in this module's signatures ([`ffi`], [`Managed`],
//! [`DlpackFlags`]) are the crate's own, laid out as the DLPack 1.3 header
//! (checked at compile time), so no dependency's release changes this API.
//! The allocation of shape and strides next to the header and
//! the exactly-once deleter come from `dlpark` 0.10 (the latest stable
//! release; default features off, so it adds only `bitflags` and `snafu`).
//! A custom owner is any `Box<T: Send>` (here the raw parts of device
//! memory), installed with a deleter that drops it; one builder makes both
//! ABIs; and dlpark's `Managed::from_raw` reads a foreign managed tensor,
//! calling its deleter when its major version is unknown. The import and
//! export code casts between its structures and ours (the same layout).
//! What it does not decide is left here: which device types and dtypes
//! rocm-safe takes, the compactness rule, and the views.
//!
//! # Example: a round trip on the host backend
//!
//! ```
//! use rocm_safe::device::Device;
//! use rocm_safe::dlpack::{Export, Imported};
//! use rocm_safe::DType;
//!
//! # fn main() -> rocm_safe::Result<()> {
//! let dev = Device::host();
//! let buf = dev.stream()?.clone_htod(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0])?;
//! // What a `"dltensor_versioned"` capsule would carry.
//! let raw = Export::from_device(buf, DType::F32, &[2, 3])?
//!     .into_managed_versioned()?
//!     .into_raw();
//! // SAFETY: a managed tensor just made, whose ownership moves here once.
//! let t = unsafe { Imported::from_raw_versioned(&dev, raw) }?;
//! assert_eq!(t.shape(), &[2, 3]);
//! assert_eq!(t.view::<f32>()?.to_vec(&dev.stream()?)?[5], 6.0);
//! drop(t); // the deleter: the memory goes back to rocm-safe
//! # Ok(())
//! # }
//! ```

mod export;
pub mod ffi;
mod import;
mod managed;
mod types;

pub use export::Export;
pub use ffi::DlpackFlags;
pub use import::Imported;
pub use managed::Managed;
pub use types::{data_type, dl_device, dtype};

#[cfg(doc)]
use crate::{device::DeviceBuffer, DType};
