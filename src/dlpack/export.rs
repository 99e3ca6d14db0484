//! [`Export`]: memory rocm-safe owns, given to another framework as a DLPack
//! managed tensor whose deleter gives it back.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use std::ptr::NonNull;

use dlpark::metadata::Dynamic;
use dlpark::ManagedTensorBase;

use super::ffi::{DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned};
use super::managed::Managed;
use super::types::{data_type, dl_device, to_dlpark_device, to_dlpark_dtype};
use crate::device::{info::DevicePtr, DeviceBuffer, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::transfer::{LoadedTensor, TensorData};

/// A tensor on its way out: memory rocm-safe gave up (a device buffer, a
/// host vector), its dtype and its shape, ready to become a managed tensor
/// ([`Export::into_managed`], [`Export::into_managed_versioned`]).
///
/// Dropping an `Export` (or the [`Managed`] it becomes, or calling the
/// managed tensor's deleter) gives the memory back: device memory is freed
/// at the device's next sync point, host memory at once.
pub struct Export {
    owner: Box<Owner>,
    /// The address of the first byte (0 when there are none).
    data: u64,
    device: DLDevice,
    dtype: DType,
    shape: Vec<u64>,
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("data", &format_args!("{:#x}", self.data))
            .field("device", &super::types::device_name(self.device))
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .finish()
    }
}

/// What a managed tensor's `manager_ctx` owns: the memory, until the
/// deleter drops it.
enum Owner {
    /// Raw parts of a device buffer ([`DeviceBuffer::into_raw_parts`]); the
    /// stream keeps the device open.
    Device {
        ptr: DevicePtr,
        bytes: usize,
        stream: Stream,
    },
    /// A host vector, kept as it was allocated.
    Host { _vec: Box<dyn Any + Send> },
}

impl Drop for Owner {
    /// Runs inside the `extern "C"` deleter: never unwinds (a panic is
    /// caught and the memory leaked; errors of the free are recorded on the
    /// device, [`crate::device::Device::take_errors`]).
    fn drop(&mut self) {
        if let Owner::Device { ptr, bytes, stream } = self {
            let (ptr, bytes, stream) = (*ptr, *bytes, stream.clone());
            let _ = catch_unwind(AssertUnwindSafe(move || {
                // SAFETY: the raw parts `DeviceBuffer::into_raw_parts` gave up
                // in `Export::from_device` (an allocation of `stream`'s device
                // of exactly `bytes` bytes, any bytes valid as `u8`), taken
                // back once: the owner is dropped once, by the consumer's one
                // deleter call (or with the unconverted `Export`), after
                // which nothing outside uses the memory. The free itself waits
                // for the device's next sync point.
                drop(unsafe { DeviceBuffer::<u8>::from_raw_parts(ptr, bytes, stream) });
            }));
        }
    }
}

/// The number of bytes `shape` of `dtype` occupies, checked.
fn byte_size(dtype: DType, shape: &[u64]) -> Result<usize> {
    let unsupported = |found: String| Error::DlpackUnsupported {
        op: "export",
        what: "shape",
        found,
    };
    if i32::try_from(shape.len()).is_err() {
        return Err(unsupported(format!("{} dimensions", shape.len())));
    }
    if let Some(d) = shape.iter().find(|&&d| i64::try_from(d).is_err()) {
        return Err(unsupported(format!("dimension {d} does not fit an int64")));
    }
    shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .and_then(|n| dtype.bytes_for(n))
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            unsupported(format!(
                "{shape:?} of {dtype} is not a whole number of bytes that fits in memory"
            ))
        })
}

impl Export {
    /// Exports a device buffer as a tensor of `dtype` and `shape` (row-major)
    /// on the buffer's device: `kDLROCM`, `kDLCUDA` or `kDLCPU` (host
    /// backend), device id its ordinal. The buffer's elements need not be
    /// `dtype` (a loaded tensor is a `DeviceBuffer<u8>`); its size in bytes
    /// must be the tensor's.
    ///
    /// Waits for the work queued on the buffer's stream, so that a consumer
    /// may read the memory on any stream; work on other streams that writes
    /// the buffer must be complete (or ordered) before the consumer reads.
    /// The buffer's memory is then given up ([`DeviceBuffer::into_raw_parts`]:
    /// [`crate::device::Device::owned_bytes`] no longer counts it) until the
    /// deleter gives it back.
    ///
    /// Errors: [`Error::LengthMismatch`] (in bytes) when the buffer is not
    /// the tensor's size, [`Error::DlpackUnsupported`] (`what: "shape"`)
    /// for a shape that overflows or does not fill whole bytes,
    /// (`what: "device"`) for an ordinal beyond `int32`, or the stream's
    /// error. On error the buffer is dropped (freed as usual).
    pub fn from_device<T: bytemuck::Pod>(
        buf: DeviceBuffer<T>,
        dtype: DType,
        shape: &[u64],
    ) -> Result<Export> {
        let bytes = byte_size(dtype, shape)?;
        if bytes != buf.num_bytes() {
            return Err(Error::LengthMismatch {
                op: "dlpack export",
                expected: bytes,
                actual: buf.num_bytes(),
                tensor: None,
            });
        }
        let device = dl_device(buf.device())?;
        buf.stream().synchronize()?;
        let (ptr, _, stream) = buf.into_raw_parts();
        Ok(Export {
            owner: Box::new(Owner::Device { ptr, bytes, stream }),
            data: if bytes == 0 { 0 } else { ptr.0 },
            device,
            dtype,
            shape: shape.to_vec(),
        })
    }

    /// Exports a host vector (a host-kept tensor) as a `kDLCPU` tensor of
    /// `dtype` and `shape`, device id 0. The vector is kept as allocated
    /// and freed by the deleter.
    ///
    /// Errors as [`Export::from_device`], without the device's.
    pub fn from_host<T: bytemuck::Pod + Send>(
        data: Vec<T>,
        dtype: DType,
        shape: &[u64],
    ) -> Result<Export> {
        let bytes = byte_size(dtype, shape)?;
        let actual = std::mem::size_of_val(data.as_slice());
        if bytes != actual {
            return Err(Error::LengthMismatch {
                op: "dlpack export",
                expected: bytes,
                actual,
                tensor: None,
            });
        }
        // Moving the vector into the box does not move its elements.
        let addr = if bytes == 0 {
            0
        } else {
            data.as_ptr() as usize as u64
        };
        Ok(Export {
            owner: Box::new(Owner::Host {
                _vec: Box::new(data),
            }),
            data: addr,
            device: DLDevice {
                device_type: DLDeviceType::CPU,
                device_id: 0,
            },
            dtype,
            shape: shape.to_vec(),
        })
    }

    /// Exports a loaded tensor, kept on the device ([`Export::from_device`])
    /// or on the host ([`Export::from_host`]), with its dtype and shape.
    pub fn from_loaded(tensor: LoadedTensor) -> Result<Export> {
        match tensor.data {
            TensorData::Buffer(b) => Export::from_device(b, tensor.dtype, &tensor.shape),
            TensorData::KeptOnHost(v) => Export::from_host(v, tensor.dtype, &tensor.shape),
        }
    }

    /// The tensor's dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The tensor's shape.
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Where the tensor is, as DLPack names it.
    pub fn dl_device(&self) -> DLDevice {
        self.device
    }

    /// The tensor as a legacy `DLManagedTensor` (for a `"dltensor"`
    /// capsule: [`Managed::into_raw`]).
    ///
    /// Errors: [`Error::DlpackUnsupported`] (`what: "shape"`) when dlpark
    /// cannot lay the shape out (never for a shape [`Export`] accepted); the
    /// memory is given back then.
    pub fn into_managed(self) -> Result<Managed<DLManagedTensor>> {
        let raw = self.into_abi::<dlpark::ffi::DLManagedTensor>()?;
        // SAFETY: dlpark's structure is the C header's, as ours is (checked
        // in `ffi`); the tensor just made is owned by the new handle alone.
        Ok(unsafe { Managed::from_raw(raw.cast()) })
    }

    /// The tensor as a `DLManagedTensorVersioned`, version 1.3, flags 0
    /// (for a `"dltensor_versioned"` capsule: [`Managed::into_raw`]).
    ///
    /// Errors as [`Export::into_managed`].
    pub fn into_managed_versioned(self) -> Result<Managed<DLManagedTensorVersioned>> {
        let raw = self.into_abi::<dlpark::ffi::DLManagedTensorVersioned>()?;
        // SAFETY: as in `into_managed`.
        Ok(unsafe { Managed::from_raw(raw.cast()) })
    }

    /// The managed tensor dlpark builds (of either ABI), given up as its
    /// pointer: the caller owns it.
    fn into_abi<M: ManagedTensorBase>(self) -> Result<NonNull<M>> {
        let Export {
            owner,
            data,
            device,
            dtype,
            shape,
        } = self;
        // The owner moves into the allocation; if that fails it is dropped
        // there, which gives the memory back.
        let mut init = Dynamic::compact(shape)
            .initialize_as::<M>(owner)
            .map_err(|e| Error::DlpackUnsupported {
                op: "export",
                what: "shape",
                found: e.to_string(),
            })?;
        init.set_data(data as usize as *mut c_void)
            .set_device(to_dlpark_device(device))
            .set_dtype(to_dlpark_dtype(data_type(dtype)))
            .set_byte_offset(0);
        // SAFETY: `data` addresses the tensor's bytes (NULL for none) on
        // `device`, kept alive by the owner until the deleter drops it;
        // shape and compact strides live in the same allocation (explicit
        // for ndim > 0); flags stay empty: the memory is writable and the
        // consumer holds the only reference to it.
        let raw = unsafe { init.finish() }.into_raw();
        NonNull::new(raw).ok_or_else(|| Error::DlpackInvalid {
            op: "export",
            what: "pointer",
            found: "null managed tensor".into(),
        })
    }
}
