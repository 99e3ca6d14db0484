//! [`Imported`]: another framework's DLPack tensor, owned until dropped and
//! lent as rocm-safe views after the checks that make that sound.

use dlpark::dlpack::FromRawError;
use dlpark::ffi::DLTensor;
use dlpark::tensor::TensorRef;
use dlpark::{AllocationDeleter, Managed, ManagedTensorBase};

use super::ffi::{DLDevice, DLManagedTensor, DLManagedTensorVersioned, DlpackFlags};
use super::types::{device_name, dl_device, dtype as dtype_of, from_dlpark_device};
use super::types::{from_dlpark_dtype, usable_on};
use crate::device::{info::DevicePtr, Device, DeviceView, DeviceViewMut};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// A tensor another framework produced (PyTorch, JAX, CuPy, numpy, a Rust
/// crate), taken over as its DLPack managed tensor: it keeps the producer's
/// tensor alive, lends its memory as [`DeviceView`] / [`DeviceViewMut`] of
/// the importing [`Device`], and calls the producer's deleter exactly once
/// when dropped.
///
/// Only what a view can describe is taken: memory of the importing device
/// (its DLPack device type and ordinal; on the host backend `kDLCPU` and
/// pinned host memory), a dtype with a [`DType`] in one lane, compact
/// row-major strides (or NULL), DLPack major version 1. Anything else is a
/// typed error, after the producer's deleter ran.
pub struct Imported {
    /// Declared first: the producer's deleter runs before the device
    /// handle goes.
    _producer: AllocationDeleter,
    device: Device,
    ptr: DevicePtr,
    bytes: usize,
    dtype: DType,
    shape: Vec<u64>,
    read_only: bool,
    dl_device: DLDevice,
}

impl std::fmt::Debug for Imported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Imported")
            .field("ptr", &self.ptr)
            .field("bytes", &self.bytes)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("read_only", &self.read_only)
            .field("dl_device", &super::types::device_name(self.dl_device))
            .finish()
    }
}

/// What the checks found: everything [`Imported`] holds but the owner.
struct Parts {
    ptr: DevicePtr,
    bytes: usize,
    dtype: DType,
    shape: Vec<u64>,
    dl_device: DLDevice,
}

fn unsupported(what: &'static str, found: String) -> Error {
    Error::DlpackUnsupported {
        op: "import",
        what,
        found,
    }
}

fn invalid(what: &'static str, found: String) -> Error {
    Error::DlpackInvalid {
        op: "import",
        what,
        found,
    }
}

impl Imported {
    /// Takes over a legacy `DLManagedTensor` (the pointer of a `"dltensor"`
    /// capsule, which the caller then renames `"used_dltensor"`) and checks
    /// that `device` can use it.
    ///
    /// Ownership moves here whatever the outcome: on success the tensor is
    /// released when the `Imported` is dropped; on a refusal the producer's
    /// deleter has run before the error returns. A NULL `ptr` is
    /// [`Error::DlpackInvalid`] and calls nothing.
    ///
    /// Errors: [`Error::DlpackUnsupported`] for a device type or ordinal
    /// other than `device`'s (`what: "device"`), a dtype without a
    /// [`DType`] (`"dtype"`), more than one lane (`"lanes"`), strides that
    /// are not compact row-major (`"strides"`), packed sub-byte data
    /// declared padded (`"flags"`), a size that is not whole bytes
    /// (`"shape"`); [`Error::DlpackInvalid`] for a NULL `ptr`
    /// (`"pointer"`), a negative or overflowing shape (`"shape"`), a NULL
    /// data pointer with a non-zero size or an address range that overflows
    /// (`"data"`).
    ///
    /// # Safety
    /// `ptr` is NULL or a valid `DLManagedTensor` that the caller owns and
    /// hands over (it never uses nor deletes it again), whose `dl_tensor`
    /// stays unchanged until its deleter runs; `shape` (and `strides`, when
    /// not NULL) point to `ndim` readable `int64_t`; `data + byte_offset`
    /// addresses the tensor's bytes, allocated in this process on the
    /// memory its `device` names (for a GPU, in the runtime context
    /// `device` uses: the primary context), alive until the deleter runs;
    /// the producer's writes to them are complete or ordered before work
    /// queued on `device`'s streams (what the Python protocol's `stream`
    /// argument arranges), and nobody else writes them while a view
    /// lives; the deleter, when not NULL, may be called once from any
    /// thread and does not unwind.
    pub unsafe fn from_raw(device: &Device, ptr: *mut DLManagedTensor) -> Result<Imported> {
        // SAFETY: the caller's contract is `import`'s; dlpark's structure is
        // the C header's, as ours is (checked in `ffi`).
        unsafe { import(device, ptr.cast::<dlpark::ffi::DLManagedTensor>()) }
    }

    /// Takes over a `DLManagedTensorVersioned` (the pointer of a
    /// `"dltensor_versioned"` capsule, renamed `"used_dltensor_versioned"`
    /// after) as [`Imported::from_raw`] does; its `READ_ONLY` flag makes
    /// [`Imported::view_mut`] refuse.
    ///
    /// Errors as [`Imported::from_raw`], and [`Error::DlpackUnsupported`]
    /// (`what: "version"`) for a major version other than 1 (the deleter,
    /// which every version keeps at the same place, has run).
    ///
    /// # Safety
    /// As [`Imported::from_raw`], for a `DLManagedTensorVersioned` (whose
    /// fields after `flags` are read only when its major version is 1);
    /// without `READ_ONLY`, the producer allows writes to the memory.
    pub unsafe fn from_raw_versioned(
        device: &Device,
        ptr: *mut DLManagedTensorVersioned,
    ) -> Result<Imported> {
        // SAFETY: as in `from_raw`.
        unsafe { import(device, ptr.cast::<dlpark::ffi::DLManagedTensorVersioned>()) }
    }

    /// The importing device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Where the tensor is, as the producer named it.
    pub fn dl_device(&self) -> DLDevice {
        self.dl_device
    }

    /// The tensor's dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The tensor's shape (row-major; empty for a 0-d tensor).
    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// The tensor's size in bytes.
    pub fn num_bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the producer marked the tensor read-only (versioned
    /// `READ_ONLY` flag).
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// The tensor's bytes as elements of `T`, borrowed (any `T` whose size
    /// divides the byte count: `u8` for the raw bytes, `u16` or
    /// [`half::bf16`] for a `BF16` tensor).
    ///
    /// Errors: [`Error::LengthMismatch`] when the bytes are not whole
    /// elements, [`Error::Misaligned`] when the address is not aligned for
    /// `T`.
    pub fn view<T: bytemuck::Pod>(&self) -> Result<DeviceView<'_, T>> {
        let len = self.elements::<T>("dlpack view")?;
        // SAFETY: `import` checked that `bytes` bytes at `ptr` are memory of
        // `self.device` (its type and ordinal), and its caller vouched that
        // they stay allocated until the producer's deleter, which runs only
        // when `self` is dropped (after this borrow), hold the tensor's
        // bytes (any of which are valid `T`: `Pod`) and are not written
        // except through ordered work. `from_raw` checks the alignment.
        unsafe { DeviceView::from_raw(&self.device, self.ptr, len) }
    }

    /// The tensor's bytes as elements of `T`, borrowed mutably.
    ///
    /// Errors: [`Error::DlpackUnsupported`] (`op: "view_mut"`,
    /// `what: "flags"`) for a read-only tensor; as [`Imported::view`].
    pub fn view_mut<T: bytemuck::Pod>(&mut self) -> Result<DeviceViewMut<'_, T>> {
        if self.read_only {
            return Err(Error::DlpackUnsupported {
                op: "view_mut",
                what: "flags",
                found: "the producer marked the tensor read-only".into(),
            });
        }
        let len = self.elements::<T>("dlpack view_mut")?;
        // SAFETY: as in `view`; `&mut self` makes this the only view this
        // `Imported` lends while it lives, and the producer allows writes
        // (no READ_ONLY flag).
        unsafe { DeviceViewMut::from_raw(&self.device, self.ptr, len) }
    }

    /// The number of `T` in the tensor's bytes; [`Error::LengthMismatch`]
    /// when they are not whole elements.
    fn elements<T>(&self, op: &'static str) -> Result<usize> {
        let size = std::mem::size_of::<T>().max(1);
        if !self.bytes.is_multiple_of(size) {
            return Err(Error::LengthMismatch {
                op,
                expected: self.bytes / size * size,
                actual: self.bytes,
                tensor: None,
            });
        }
        Ok(self.bytes / size)
    }
}

/// Takes over a managed tensor of either ABI; see [`Imported::from_raw`].
///
/// # Safety
/// [`Imported::from_raw`]'s contract, for `M`.
unsafe fn import<M: ManagedTensorBase>(device: &Device, ptr: *mut M) -> Result<Imported> {
    // SAFETY: the caller hands over a valid managed tensor (or NULL, which
    // is refused without a call); on an unknown major version dlpark calls
    // the deleter itself before returning the error.
    let managed = unsafe { Managed::from_raw(ptr) }.map_err(|e| match e {
        FromRawError::Null => invalid("pointer", "null managed tensor".into()),
        FromRawError::Version { source } => unsupported(
            "version",
            format!("dlpack major version {} (only 1)", source.actual),
        ),
        other => invalid("pointer", other.to_string()),
    })?;
    // From here every early return drops `managed`: the deleter runs once.
    let flags = DlpackFlags::from_bits_retain(managed.flags().bits());
    // SAFETY: the caller vouched that the descriptor stays readable and
    // unchanged while the tensor is owned here.
    let parts = check(device, unsafe { managed.tensor() }, flags)?;
    Ok(Imported {
        _producer: managed.into_deleter(),
        device: device.clone(),
        ptr: parts.ptr,
        bytes: parts.bytes,
        dtype: parts.dtype,
        shape: parts.shape,
        read_only: flags.contains(DlpackFlags::READ_ONLY),
        dl_device: parts.dl_device,
    })
}

/// Everything an import refuses, in the order a caller would want to hear
/// it: where, what type, what shape, what layout, what address.
fn check(device: &Device, t: &DLTensor, flags: DlpackFlags) -> Result<Parts> {
    let dl = from_dlpark_device(t.device);
    if !usable_on(dl, device) {
        let own = dl_device(device)
            .map(device_name)
            .unwrap_or_else(|_| format!("{}:{}", device.kind(), device.info().ordinal));
        return Err(unsupported(
            "device",
            format!("{} (importing device is {own})", device_name(dl)),
        ));
    }
    let dtype = dtype_of(from_dlpark_dtype(t.dtype))?;
    if dtype.bits() < 8 && flags.contains(DlpackFlags::IS_SUBBYTE_TYPE_PADDED) {
        return Err(unsupported(
            "flags",
            format!("{dtype} with padded sub-byte elements (only packed)"),
        ));
    }
    // SAFETY: the caller of `import` vouched that `shape` and `strides`
    // (when not NULL) point to `ndim` readable values that stay unchanged.
    let r = unsafe { TensorRef::from_raw(t) }.map_err(|e| invalid("shape", e.to_string()))?;
    check_compact(r.shape(), r.strides())?;
    // Non-negative: TensorRef checked every dimension.
    let shape: Vec<u64> = r.shape().iter().map(|&d| d.unsigned_abs()).collect();
    let bytes = u64::try_from(r.num_elements())
        .ok()
        .and_then(|n| dtype.bytes_for(n))
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| {
            unsupported(
                "shape",
                format!("{shape:?} of {dtype} is not a whole number of bytes"),
            )
        })?;
    let base = t.data as usize as u64;
    if bytes == 0 {
        return Ok(Parts {
            ptr: DevicePtr(0),
            bytes,
            dtype,
            shape,
            dl_device: dl,
        });
    }
    if base == 0 {
        return Err(invalid(
            "data",
            format!("null data pointer for {bytes} bytes"),
        ));
    }
    let addr = base
        .checked_add(t.byte_offset)
        .filter(|a| a.checked_add(bytes as u64).is_some())
        .ok_or_else(|| {
            invalid(
                "data",
                format!(
                    "{base:#x} + byte_offset {} + {bytes} bytes overflows",
                    t.byte_offset
                ),
            )
        })?;
    Ok(Parts {
        ptr: DevicePtr(addr),
        bytes,
        dtype,
        shape,
        dl_device: dl,
    })
}

/// Compact row-major, ignoring the stride of a dimension of size 1 (it
/// addresses nothing) and every stride of a tensor with no elements; NULL
/// strides are compact.
fn check_compact(shape: &[i64], strides: Option<&[i64]>) -> Result<()> {
    let Some(strides) = strides else {
        return Ok(());
    };
    if shape.contains(&0) {
        return Ok(());
    }
    let mut expected: i128 = 1;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d != 1 && i128::from(s) != expected {
            return Err(unsupported(
                "strides",
                format!("{strides:?} for shape {shape:?} (only compact row-major)"),
            ));
        }
        expected = expected.saturating_mul(i128::from(d));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compactness() {
        assert!(check_compact(&[2, 3], Some(&[3, 1])).is_ok());
        assert!(check_compact(&[2, 3], None).is_ok());
        assert!(check_compact(&[2, 1, 3], Some(&[3, 99, 1])).is_ok());
        assert!(check_compact(&[1, 1], Some(&[0, 0])).is_ok());
        assert!(check_compact(&[2, 0], Some(&[5, 7])).is_ok());
        assert!(check_compact(&[], Some(&[])).is_ok());
        assert!(check_compact(&[2, 2], Some(&[1, 2])).is_err());
        assert!(check_compact(&[2, 3], Some(&[4, 1])).is_err());
        assert!(check_compact(&[4], Some(&[2])).is_err());
    }
}
