//! The DLPack 1.3 C structures (`dlpack.h`), as this crate's own types: the
//! managed tensors a caller hands to Python or C and takes back, and what
//! they hold. Their layout is the header's, checked at compile time against
//! the C layout (sizes, alignments, field offsets on 64-bit targets), so a
//! pointer to one is a pointer to the C structure.
//!
//! The codes of [`DLDeviceType`] and [`DLDataTypeCode`] are newtypes over
//! the C integers (with the header's values as constants), so that a code
//! newer than this crate is a value, not undefined behaviour.

use std::ffi::c_void;
use std::ops::{BitOr, BitOrAssign};

/// The DLPack version of a `DLManagedTensorVersioned` (a different major
/// version means a different layout: only the deleter may be called).
#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq, Eq, Hash)]
pub struct DLPackVersion {
    /// Major version (1 for this layout).
    pub major: u32,
    /// Minor version (new codes, same layout).
    pub minor: u32,
}

/// Where a tensor's memory is (`DLDeviceType`, a C `enum`: `unsigned int`).
#[repr(transparent)]
#[derive(Debug, Copy, Clone, PartialEq, Eq, Hash)]
pub struct DLDeviceType(pub u32);

impl DLDeviceType {
    /// `kDLCPU`: host memory.
    pub const CPU: DLDeviceType = DLDeviceType(1);
    /// `kDLCUDA`: CUDA device memory.
    pub const CUDA: DLDeviceType = DLDeviceType(2);
    /// `kDLCUDAHost`: pinned host memory of CUDA (`cudaMallocHost`).
    pub const CUDAHOST: DLDeviceType = DLDeviceType(3);
    /// `kDLOpenCL`.
    pub const OPENCL: DLDeviceType = DLDeviceType(4);
    /// `kDLVulkan`.
    pub const VULKAN: DLDeviceType = DLDeviceType(7);
    /// `kDLMetal`.
    pub const METAL: DLDeviceType = DLDeviceType(8);
    /// `kDLVPI`.
    pub const VPI: DLDeviceType = DLDeviceType(9);
    /// `kDLROCM`: ROCm (HIP) device memory.
    pub const ROCM: DLDeviceType = DLDeviceType(10);
    /// `kDLROCMHost`: pinned host memory of ROCm (`hipHostMalloc`).
    pub const ROCMHOST: DLDeviceType = DLDeviceType(11);
    /// `kDLExtDev`.
    pub const EXTDEV: DLDeviceType = DLDeviceType(12);
    /// `kDLCUDAManaged`: CUDA managed memory.
    pub const CUDAMANAGED: DLDeviceType = DLDeviceType(13);
    /// `kDLOneAPI`.
    pub const ONEAPI: DLDeviceType = DLDeviceType(14);
    /// `kDLWebGPU`.
    pub const WEBGPU: DLDeviceType = DLDeviceType(15);
    /// `kDLHexagon`.
    pub const HEXAGON: DLDeviceType = DLDeviceType(16);
    /// `kDLMAIA`.
    pub const MAIA: DLDeviceType = DLDeviceType(17);
    /// `kDLTrn`.
    pub const TRN: DLDeviceType = DLDeviceType(18);
}

/// A device: its type and index (`DLDevice`).
#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq, Eq, Hash)]
pub struct DLDevice {
    /// Where the memory is.
    pub device_type: DLDeviceType,
    /// The device's index (0 for host, pinned and managed memory).
    pub device_id: i32,
}

/// The kind of an element type (`DLDataTypeCode`, stored as `uint8_t`).
#[repr(transparent)]
#[derive(Debug, Copy, Clone, PartialEq, Eq, Hash)]
pub struct DLDataTypeCode(pub u8);

impl DLDataTypeCode {
    /// `kDLInt`: signed integer.
    pub const INT: DLDataTypeCode = DLDataTypeCode(0);
    /// `kDLUInt`: unsigned integer.
    pub const UINT: DLDataTypeCode = DLDataTypeCode(1);
    /// `kDLFloat`: IEEE floating point.
    pub const FLOAT: DLDataTypeCode = DLDataTypeCode(2);
    /// `kDLOpaqueHandle`.
    pub const OPAQUEHANDLE: DLDataTypeCode = DLDataTypeCode(3);
    /// `kDLBfloat`: bfloat16.
    pub const BFLOAT: DLDataTypeCode = DLDataTypeCode(4);
    /// `kDLComplex`: complex (two floats).
    pub const COMPLEX: DLDataTypeCode = DLDataTypeCode(5);
    /// `kDLBool`.
    pub const BOOL: DLDataTypeCode = DLDataTypeCode(6);
    /// `kDLFloat8_e3m4`.
    pub const FLOAT8_E3M4: DLDataTypeCode = DLDataTypeCode(7);
    /// `kDLFloat8_e4m3`.
    pub const FLOAT8_E4M3: DLDataTypeCode = DLDataTypeCode(8);
    /// `kDLFloat8_e4m3b11fnuz`.
    pub const FLOAT8_E4M3B11FNUZ: DLDataTypeCode = DLDataTypeCode(9);
    /// `kDLFloat8_e4m3fn`.
    pub const FLOAT8_E4M3FN: DLDataTypeCode = DLDataTypeCode(10);
    /// `kDLFloat8_e4m3fnuz`.
    pub const FLOAT8_E4M3FNUZ: DLDataTypeCode = DLDataTypeCode(11);
    /// `kDLFloat8_e5m2`.
    pub const FLOAT8_E5M2: DLDataTypeCode = DLDataTypeCode(12);
    /// `kDLFloat8_e5m2fnuz`.
    pub const FLOAT8_E5M2FNUZ: DLDataTypeCode = DLDataTypeCode(13);
    /// `kDLFloat8_e8m0fnu`.
    pub const FLOAT8_E8M0FNU: DLDataTypeCode = DLDataTypeCode(14);
    /// `kDLFloat6_e2m3fn`.
    pub const FLOAT6_E2M3FN: DLDataTypeCode = DLDataTypeCode(15);
    /// `kDLFloat6_e3m2fn`.
    pub const FLOAT6_E3M2FN: DLDataTypeCode = DLDataTypeCode(16);
    /// `kDLFloat4_e2m1fn`.
    pub const FLOAT4_E2M1FN: DLDataTypeCode = DLDataTypeCode(17);
}

/// An element type: kind, bits and lanes (`DLDataType`).
#[repr(C)]
#[derive(Debug, Copy, Clone, PartialEq, Eq, Hash)]
pub struct DLDataType {
    /// The kind.
    pub code: DLDataTypeCode,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for a scalar).
    pub lanes: u16,
}

impl DLDataType {
    /// A scalar (one lane) of `code` and `bits`.
    pub const fn scalar(code: DLDataTypeCode, bits: u8) -> DLDataType {
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }
}

/// A tensor's description: where its bytes are and how to read them
/// (`DLTensor`; it owns nothing).
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct DLTensor {
    /// The memory (a device pointer on a GPU); NULL for no bytes.
    pub data: *mut c_void,
    /// Where the memory is.
    pub device: DLDevice,
    /// The number of dimensions.
    pub ndim: i32,
    /// The element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or NULL for compact row-major.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// A tensor with its owner and deleter, the legacy ABI (`DLManagedTensor`,
/// a `"dltensor"` capsule).
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; called once by its last owner.
    pub deleter: Option<unsafe extern "C" fn(self_: *mut DLManagedTensor)>,
}

/// The flags of a `DLManagedTensorVersioned` (a `uint64_t` bit mask).
#[repr(transparent)]
#[derive(Debug, Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct DlpackFlags(u64);

impl DlpackFlags {
    /// `DLPACK_FLAG_BITMASK_READ_ONLY`: consumers must not write the data.
    pub const READ_ONLY: DlpackFlags = DlpackFlags(1);
    /// `DLPACK_FLAG_BITMASK_IS_COPIED`: the data is an unaliased copy.
    pub const IS_COPIED: DlpackFlags = DlpackFlags(1 << 1);
    /// `DLPACK_FLAG_BITMASK_IS_SUBBYTE_TYPE_PADDED`: sub-byte elements are
    /// padded to a byte each.
    pub const IS_SUBBYTE_TYPE_PADDED: DlpackFlags = DlpackFlags(1 << 2);

    /// No flag set.
    pub const fn empty() -> DlpackFlags {
        DlpackFlags(0)
    }

    /// The flags of the bit mask `bits`, unknown bits kept.
    pub const fn from_bits_retain(bits: u64) -> DlpackFlags {
        DlpackFlags(bits)
    }

    /// The bit mask.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: DlpackFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for DlpackFlags {
    type Output = DlpackFlags;
    fn bitor(self, rhs: DlpackFlags) -> DlpackFlags {
        DlpackFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for DlpackFlags {
    fn bitor_assign(&mut self, rhs: DlpackFlags) {
        self.0 |= rhs.0;
    }
}

/// A tensor with its owner, deleter, version and flags, the versioned ABI
/// (`DLManagedTensorVersioned`, a `"dltensor_versioned"` capsule).
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version of this structure.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Frees the tensor; called once by its last owner.
    pub deleter: Option<unsafe extern "C" fn(self_: *mut DLManagedTensorVersioned)>,
    /// Read-only, copied, padded sub-byte elements.
    pub flags: DlpackFlags,
    /// The tensor (read only when `version.major` is 1).
    pub dl_tensor: DLTensor,
}

/// The layout of each structure is the C header's (and so dlpark's, whose
/// pointers the import and export code casts to and from): sizes,
/// alignments and offsets on 64-bit targets.
#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    macro_rules! same {
        ($ours:ty, $theirs:ty, $size:expr, $align:expr) => {
            assert!(size_of::<$ours>() == $size && size_of::<$theirs>() == $size);
            assert!(align_of::<$ours>() == $align && align_of::<$theirs>() == $align);
        };
    }
    same!(DLPackVersion, dlpark::ffi::DLPackVersion, 8, 4);
    same!(DLDevice, dlpark::ffi::DLDevice, 8, 4);
    same!(DLDataType, dlpark::ffi::DLDataType, 4, 2);
    same!(DLTensor, dlpark::ffi::DLTensor, 48, 8);
    same!(DLManagedTensor, dlpark::ffi::DLManagedTensor, 64, 8);
    same!(
        DLManagedTensorVersioned,
        dlpark::ffi::DLManagedTensorVersioned,
        80,
        8
    );
    same!(DlpackFlags, dlpark::DlpackFlags, 8, 8);
    assert!(offset_of!(DLTensor, device) == 8 && offset_of!(DLTensor, ndim) == 16);
    assert!(offset_of!(DLTensor, dtype) == 20 && offset_of!(DLTensor, shape) == 24);
    assert!(offset_of!(DLTensor, strides) == 32 && offset_of!(DLTensor, byte_offset) == 40);
    assert!(offset_of!(DLManagedTensor, manager_ctx) == 48);
    assert!(offset_of!(DLManagedTensor, deleter) == 56);
    assert!(offset_of!(DLManagedTensorVersioned, manager_ctx) == 8);
    assert!(offset_of!(DLManagedTensorVersioned, deleter) == 16);
    assert!(offset_of!(DLManagedTensorVersioned, flags) == 24);
    assert!(offset_of!(DLManagedTensorVersioned, dl_tensor) == 32);
};

/// A managed tensor structure of either ABI: what [`Managed`](super::Managed) owns.
/// Sealed: implemented by [`DLManagedTensor`] and
/// [`DLManagedTensorVersioned`] only.
pub trait ManagedTensor: sealed::Sealed {
    /// Calls the deleter of the structure at `ptr`, if it has one.
    ///
    /// # Safety
    /// `ptr` is a valid structure of this type whose ownership is the
    /// caller's; it is not used again.
    #[doc(hidden)]
    unsafe fn delete(ptr: *mut Self);
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::DLManagedTensor {}
    impl Sealed for super::DLManagedTensorVersioned {}
}

impl ManagedTensor for DLManagedTensor {
    unsafe fn delete(ptr: *mut Self) {
        // SAFETY: the caller's contract: a valid structure it owns; its
        // deleter is called once, with the structure's own pointer.
        unsafe {
            if let Some(d) = (*ptr).deleter {
                d(ptr)
            }
        }
    }
}

impl ManagedTensor for DLManagedTensorVersioned {
    unsafe fn delete(ptr: *mut Self) {
        // SAFETY: as for `DLManagedTensor`; the deleter is at the same place
        // in every major version.
        unsafe {
            if let Some(d) = (*ptr).deleter {
                d(ptr)
            }
        }
    }
}
