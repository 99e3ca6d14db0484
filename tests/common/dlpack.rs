//! Shared by the DLPack tests (`tests/device/dlpack.rs`, `tests/device/dlpack_import.rs`):
//! what the header says of each device and dtype, the checks of a produced
//! `DLTensor`, and a foreign producer's tensor built by hand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rocm_safe::device::{BackendKind, Device};
use rocm_safe::dlpack::ffi::{
    DLDataType, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLPackVersion,
    DLTensor,
};
use rocm_safe::dlpack::{self, DlpackFlags, Imported};
use rocm_safe::DType;

pub fn expected_device_type(kind: BackendKind) -> u32 {
    match kind {
        BackendKind::Host => 1,
        BackendKind::Cuda => 2,
        BackendKind::Hip => 10,
        other => panic!("no DLPack device type known for {other}"),
    }
}

/// DLPack 1.3 `(code, bits)` of every dtype, from the header's enum.
pub fn expected_code(d: DType) -> (u8, u8) {
    match d {
        DType::BOOL => (6, 8),
        DType::F4 => (17, 4),
        DType::F6_E2M3 => (15, 6),
        DType::F6_E3M2 => (16, 6),
        DType::U8 => (1, 8),
        DType::I8 => (0, 8),
        DType::F8_E5M2 => (12, 8),
        DType::F8_E4M3 => (10, 8),
        DType::F8_E8M0 => (14, 8),
        DType::F8_E4M3FNUZ => (11, 8),
        DType::F8_E5M2FNUZ => (13, 8),
        DType::I16 => (0, 16),
        DType::U16 => (1, 16),
        DType::F16 => (2, 16),
        DType::BF16 => (4, 16),
        DType::I32 => (0, 32),
        DType::U32 => (1, 32),
        DType::F32 => (2, 32),
        DType::C64 => (5, 64),
        DType::F64 => (2, 64),
        DType::I64 => (0, 64),
        DType::U64 => (1, 64),
        other => panic!("no DLPack code known for {other}"),
    }
}

pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Checks a produced `DLTensor` against what was exported.
pub fn check_fields(t: &DLTensor, dev: &Device, dtype: DType, shape: &[u64], bytes: usize) {
    assert_eq!(t.device.device_type.0, expected_device_type(dev.kind()));
    assert_eq!(t.device.device_id as usize, dev.info().ordinal);
    assert_eq!((t.dtype.code.0, t.dtype.bits), expected_code(dtype));
    assert_eq!(t.dtype.lanes, 1);
    assert_eq!(t.ndim as usize, shape.len());
    assert_eq!(t.byte_offset, 0);
    assert_eq!(
        t.data.is_null(),
        bytes == 0,
        "data is NULL exactly when empty"
    );
    if shape.is_empty() {
        return;
    }
    // SAFETY: a tensor just produced: `ndim` shape and stride values.
    let (got_shape, got_strides) = unsafe {
        (
            std::slice::from_raw_parts(t.shape, shape.len()),
            std::slice::from_raw_parts(t.strides, shape.len()),
        )
    };
    let want: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    assert_eq!(got_shape, want.as_slice());
    // Explicit, compact row-major.
    assert!(!t.strides.is_null());
    let mut stride = 1i64;
    for (i, &d) in want.iter().enumerate().rev() {
        assert_eq!(got_strides[i], stride, "stride {i} of {shape:?}");
        stride *= d;
    }
}

#[derive(Clone, Copy, Debug)]
pub enum Abi {
    Legacy,
    Versioned,
}

/// A producer's tensor built by hand: host bytes, shape, strides and a
/// deleter that counts its calls.
pub struct Foreign {
    pub data: Vec<u8>,
    pub shape: Vec<i64>,
    pub strides: Option<Vec<i64>>,
    pub device: DLDevice,
    pub dtype: DLDataType,
    pub byte_offset: u64,
    pub null_data: bool,
    pub version: DLPackVersion,
    pub flags: DlpackFlags,
    pub calls: Arc<AtomicUsize>,
}

impl Foreign {
    /// A compact host tensor of `dtype` and `shape` with patterned bytes.
    pub fn new(dtype: DType, shape: &[i64]) -> Foreign {
        let n: u64 = shape.iter().map(|&d| d.max(0) as u64).product();
        let bytes = dtype.bytes_for(n).unwrap_or(0) as usize;
        let mut strides = vec![0i64; shape.len()];
        let mut s = 1i64;
        for i in (0..shape.len()).rev() {
            strides[i] = s;
            s = s.saturating_mul(shape[i]);
        }
        Foreign {
            data: pattern(bytes, 3),
            shape: shape.to_vec(),
            strides: Some(strides),
            device: DLDevice {
                device_type: DLDeviceType::CPU,
                device_id: 0,
            },
            dtype: dlpack::data_type(dtype),
            byte_offset: 0,
            null_data: false,
            version: DLPackVersion { major: 1, minor: 3 },
            flags: DlpackFlags::empty(),
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn with(mut self, f: impl FnOnce(&mut Foreign)) -> Foreign {
        f(&mut self);
        self
    }

    pub fn tensor(&mut self) -> DLTensor {
        DLTensor {
            data: if self.null_data {
                std::ptr::null_mut()
            } else {
                self.data.as_mut_ptr().cast()
            },
            device: self.device,
            ndim: self.shape.len() as i32,
            dtype: self.dtype,
            shape: self.shape.as_mut_ptr(),
            strides: self
                .strides
                .as_mut()
                .map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: self.byte_offset,
        }
    }

    /// The managed tensor: the producer's state moves into its context.
    pub fn into_legacy(mut self) -> *mut DLManagedTensor {
        let dl_tensor = self.tensor();
        Box::into_raw(Box::new(DLManagedTensor {
            dl_tensor,
            manager_ctx: Box::into_raw(Box::new(self)).cast(),
            deleter: Some(delete_legacy),
        }))
    }

    pub fn into_versioned(mut self) -> *mut DLManagedTensorVersioned {
        let dl_tensor = self.tensor();
        let (version, flags) = (self.version, self.flags);
        Box::into_raw(Box::new(DLManagedTensorVersioned {
            version,
            manager_ctx: Box::into_raw(Box::new(self)).cast(),
            deleter: Some(delete_versioned),
            flags,
            dl_tensor,
        }))
    }

    /// Imports it; the result and the producer's deleter count.
    pub fn import(self, dev: &Device, abi: Abi) -> (rocm_safe::Result<Imported>, Arc<AtomicUsize>) {
        let calls = self.calls.clone();
        // SAFETY: a managed tensor just built, over memory it owns, handed
        // over once; its deleter frees it and may run on any thread.
        let r = unsafe {
            match abi {
                Abi::Legacy => Imported::from_raw(dev, self.into_legacy()),
                Abi::Versioned => Imported::from_raw_versioned(dev, self.into_versioned()),
            }
        };
        (r, calls)
    }
}

/// # Safety
/// `m` was made by `Foreign::into_legacy` and is deleted once.
unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    // SAFETY: the caller's contract.
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: the context `into_legacy` boxed.
    let f = unsafe { Box::from_raw(m.manager_ctx.cast::<Foreign>()) };
    f.calls.fetch_add(1, Ordering::SeqCst);
}

/// # Safety
/// `m` was made by `Foreign::into_versioned` and is deleted once.
unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    // SAFETY: the caller's contract.
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: the context `into_versioned` boxed.
    let f = unsafe { Box::from_raw(m.manager_ctx.cast::<Foreign>()) };
    f.calls.fetch_add(1, Ordering::SeqCst);
}
