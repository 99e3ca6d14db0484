//! DLPack both ways: exports of device buffers, host vectors and loaded
//! tensors (fields as the header says, the deleter giving the memory back
//! once, from any thread), imports of hand-built foreign tensors (accepted
//! layouts, typed refusals after which the producer's deleter ran once).
//! The `fn name(dev: &Device)` tests run on the host backend always and on
//! CUDA / HIP with `--ignored` where a GPU is.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rocm_safe::device::{BackendKind, Device};
use rocm_safe::dlpack::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion, DLTensor,
};
use rocm_safe::dlpack::{self, DlpackFlags, Export, Imported};
use rocm_safe::transfer::{LoadedTensor, TensorData};
use rocm_safe::{DType, Error};

mod common;

per_device!(
    round_trip_both_abis,
    deleter_runs_once_and_frees,
    export_refusals_give_the_memory_back,
    import_refuses_other_devices,
);

fn expected_device_type(kind: BackendKind) -> u32 {
    match kind {
        BackendKind::Host => 1,
        BackendKind::Cuda => 2,
        BackendKind::Hip => 10,
        other => panic!("no DLPack device type known for {other}"),
    }
}

/// DLPack 1.3 `(code, bits)` of every dtype, from the header's enum.
fn expected_code(d: DType) -> (u8, u8) {
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

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Checks a produced `DLTensor` against what was exported.
fn check_fields(t: &DLTensor, dev: &Device, dtype: DType, shape: &[u64], bytes: usize) {
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

// ----- device tests ----------------------------------------------------------

fn round_trip_both_abis(dev: &Device) {
    let s = dev.stream().unwrap();
    let cases: [(DType, &[u64]); 6] = [
        (DType::F32, &[2, 3]),
        (DType::BF16, &[4, 1, 5]),
        (DType::U8, &[]),
        (DType::I64, &[3, 0, 2]),
        (DType::F8_E4M3, &[17]),
        (DType::F4, &[2, 8]),
    ];
    for (dtype, shape) in cases {
        let n: u64 = shape.iter().product();
        let bytes = dtype.bytes_for(n).unwrap() as usize;
        let data = pattern(bytes, dtype.bits() as u8);

        // Legacy ABI.
        let e = Export::from_device(s.clone_htod(&data).unwrap(), dtype, shape).unwrap();
        assert_eq!((e.dtype(), e.shape()), (dtype, shape));
        let m = e.into_managed().unwrap();
        // SAFETY: read while `m` owns the tensor.
        check_fields(unsafe { m.tensor() }, dev, dtype, shape, bytes);
        // SAFETY: a managed tensor just made, handed over once.
        let t = unsafe { Imported::from_raw(dev, m.into_raw()) }.unwrap();
        assert_eq!((t.dtype(), t.shape(), t.num_bytes()), (dtype, shape, bytes));
        assert!(!t.is_read_only());
        assert_eq!(t.view::<u8>().unwrap().to_vec(&s).unwrap(), data);
        drop(t);

        // Versioned ABI.
        let m = Export::from_device(s.clone_htod(&data).unwrap(), dtype, shape)
            .unwrap()
            .into_managed_versioned()
            .unwrap();
        // SAFETY: read while `m` owns the tensor.
        let raw = unsafe { &*m.as_ptr() };
        assert_eq!(raw.version, DLPackVersion { major: 1, minor: 3 });
        assert_eq!(raw.flags, DlpackFlags::empty());
        check_fields(&raw.dl_tensor, dev, dtype, shape, bytes);
        // SAFETY: as above.
        let mut t = unsafe { Imported::from_raw_versioned(dev, m.into_raw()) }.unwrap();
        assert_eq!(t.dl_device(), dlpack::dl_device(dev).unwrap());
        assert_eq!(t.view::<u8>().unwrap().to_vec(&s).unwrap(), data);
        // Writable: the consumer holds the only reference.
        let ones = vec![1u8; bytes];
        t.view_mut::<u8>().unwrap().copy_htod(&s, &ones).unwrap();
        assert_eq!(t.view::<u8>().unwrap().to_vec(&s).unwrap(), ones);
    }
    // Typed views of an f32 tensor.
    let vals: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
    let raw = Export::from_device(s.clone_htod(&vals).unwrap(), DType::F32, &[3, 2])
        .unwrap()
        .into_managed_versioned()
        .unwrap()
        .into_raw();
    // SAFETY: as above.
    let t = unsafe { Imported::from_raw_versioned(dev, raw) }.unwrap();
    assert_eq!(t.view::<f32>().unwrap().to_vec(&s).unwrap(), vals);
    assert_eq!(t.view::<u16>().unwrap().len(), 12);
    let e = t.view::<[u8; 5]>().unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    drop(t);
    dev.synchronize().unwrap();
    assert!(dev.take_errors().is_empty());
}

fn deleter_runs_once_and_frees(dev: &Device) {
    let s = dev.stream().unwrap();
    dev.synchronize().unwrap();
    let base = dev.owned_bytes();
    let n = 4096usize;
    let export = || Export::from_device(s.alloc_zeros::<u8>(n).unwrap(), DType::U8, &[n as u64]);

    // The deleter called by hand on this thread.
    let raw = export().unwrap().into_managed().unwrap().into_raw();
    assert_eq!(dev.owned_bytes(), base, "given away while exported");
    // SAFETY: the tensor just made; its deleter called once, as a consumer would.
    unsafe { ((*raw).deleter.unwrap())(raw) };
    assert_eq!(
        dev.owned_bytes(),
        base + n as u64,
        "taken back, free deferred"
    );
    assert!(dev.pending_free_bytes() >= n);
    dev.synchronize().unwrap();
    assert_eq!(dev.owned_bytes(), base);
    assert_eq!(dev.pending_free_bytes(), 0);

    // The deleter called from another thread (versioned).
    let raw = export()
        .unwrap()
        .into_managed_versioned()
        .unwrap()
        .into_raw() as usize;
    std::thread::spawn(move || {
        let p = raw as *mut DLManagedTensorVersioned;
        // SAFETY: the tensor made above, handed to this thread; deleted once.
        unsafe { ((*p).deleter.unwrap())(p) }
    })
    .join()
    .unwrap();
    dev.synchronize().unwrap();
    assert_eq!(dev.owned_bytes(), base);

    // Dropping the owning handle, or the unconverted export, is the deleter.
    drop(export().unwrap().into_managed().unwrap());
    drop(export().unwrap());
    let m = export().unwrap().into_managed_versioned().unwrap();
    std::thread::spawn(move || drop(m)).join().unwrap();
    dev.synchronize().unwrap();
    assert_eq!(dev.owned_bytes(), base);
    assert!(dev.take_errors().is_empty());

    // The capsule keeps the device open: its handles here are all gone
    // before the deleter runs.
    let other = Device::open(dev.kind(), dev.info().ordinal).unwrap();
    let m = Export::from_device(
        other.stream().unwrap().clone_htod(&[7u32; 64]).unwrap(),
        DType::U32,
        &[8, 8],
    )
    .unwrap()
    .into_managed()
    .unwrap();
    drop(other);
    drop(m);
}

fn export_refusals_give_the_memory_back(dev: &Device) {
    let s = dev.stream().unwrap();
    dev.synchronize().unwrap();
    let base = dev.owned_bytes();
    let buf = || s.alloc_zeros::<u16>(12).unwrap();

    // The elements need not be the dtype's: 12 u16 are 6 f32.
    drop(Export::from_device(buf(), DType::F32, &[2, 3]).unwrap());
    let e = Export::from_device(buf(), DType::F32, &[2, 2]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                expected: 16,
                actual: 24,
                ..
            }
        ),
        "{e}"
    );
    let e = Export::from_device(buf(), DType::F4, &[3]).unwrap_err();
    assert!(
        matches!(e, Error::DlpackUnsupported { what: "shape", .. }),
        "{e}"
    );
    let e = Export::from_device(buf(), DType::U8, &[u64::MAX, 2]).unwrap_err();
    assert!(
        matches!(e, Error::DlpackUnsupported { what: "shape", .. }),
        "{e}"
    );
    let e = Export::from_device(buf(), DType::U8, &[1 << 63]).unwrap_err();
    assert!(
        matches!(e, Error::DlpackUnsupported { what: "shape", .. }),
        "{e}"
    );
    dev.synchronize().unwrap();
    assert_eq!(dev.owned_bytes(), base, "refused buffers are freed");
    assert!(dev.take_errors().is_empty());
}

fn import_refuses_other_devices(dev: &Device) {
    let own = dlpack::dl_device(dev).unwrap();
    let other_type = if own.device_type == DLDeviceType::CPU {
        DLDeviceType::CUDA
    } else {
        DLDeviceType::CPU
    };
    for device in [
        DLDevice {
            device_type: own.device_type,
            device_id: own.device_id + 1,
        },
        DLDevice {
            device_type: other_type,
            device_id: own.device_id,
        },
        DLDevice {
            device_type: DLDeviceType::VULKAN,
            device_id: own.device_id,
        },
    ] {
        for abi in [Abi::Legacy, Abi::Versioned] {
            let (r, calls) = Foreign::new(DType::F32, &[2, 2])
                .with(|f| f.device = device)
                .import(dev, abi);
            let e = r.unwrap_err();
            assert!(
                matches!(e, Error::DlpackUnsupported { what: "device", .. }),
                "{e}"
            );
            assert_eq!(calls.load(Ordering::SeqCst), 1, "deleter ran once");
        }
    }
}

// ----- foreign producers -------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Abi {
    Legacy,
    Versioned,
}

/// A producer's tensor built by hand: host bytes, shape, strides and a
/// deleter that counts its calls.
struct Foreign {
    data: Vec<u8>,
    shape: Vec<i64>,
    strides: Option<Vec<i64>>,
    device: DLDevice,
    dtype: DLDataType,
    byte_offset: u64,
    null_data: bool,
    version: DLPackVersion,
    flags: DlpackFlags,
    calls: Arc<AtomicUsize>,
}

impl Foreign {
    /// A compact host tensor of `dtype` and `shape` with patterned bytes.
    fn new(dtype: DType, shape: &[i64]) -> Foreign {
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

    fn with(mut self, f: impl FnOnce(&mut Foreign)) -> Foreign {
        f(&mut self);
        self
    }

    fn tensor(&mut self) -> DLTensor {
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
    fn into_legacy(mut self) -> *mut DLManagedTensor {
        let dl_tensor = self.tensor();
        Box::into_raw(Box::new(DLManagedTensor {
            dl_tensor,
            manager_ctx: Box::into_raw(Box::new(self)).cast(),
            deleter: Some(delete_legacy),
        }))
    }

    fn into_versioned(mut self) -> *mut DLManagedTensorVersioned {
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
    fn import(self, dev: &Device, abi: Abi) -> (rocm_safe::Result<Imported>, Arc<AtomicUsize>) {
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

// ----- host-only tests -----------------------------------------------------------

#[test]
fn every_dtype_exports_with_its_dlpack_code_and_round_trips() {
    let dev = Device::host();
    let s = dev.stream().unwrap();
    for d in DType::ALL {
        assert_eq!(
            (dlpack::data_type(d).code.0, dlpack::data_type(d).bits),
            expected_code(d)
        );
        assert_eq!(dlpack::dtype(dlpack::data_type(d)).unwrap(), d);
        // 8 elements fill whole bytes for every width (4, 6, 8.. bits).
        let bytes = d.bytes_for(8).unwrap() as usize;
        let data = pattern(bytes, 11);
        for abi in [Abi::Legacy, Abi::Versioned] {
            let e = Export::from_host(data.clone(), d, &[2, 4]).unwrap();
            assert_eq!(e.dl_device().device_type, DLDeviceType::CPU);
            // SAFETY: managed tensors just made, handed over once.
            let t = unsafe {
                match abi {
                    Abi::Legacy => {
                        let m = e.into_managed().unwrap();
                        check_fields(m.tensor(), &dev, d, &[2, 4], bytes);
                        Imported::from_raw(&dev, m.into_raw())
                    }
                    Abi::Versioned => Imported::from_raw_versioned(
                        &dev,
                        e.into_managed_versioned().unwrap().into_raw(),
                    ),
                }
            }
            .unwrap();
            assert_eq!(t.dtype(), d);
            assert_eq!(t.shape(), &[2, 4]);
            assert_eq!(
                t.view::<u8>().unwrap().to_vec(&s).unwrap(),
                data,
                "{d} {abi:?}"
            );
        }
    }
}

#[test]
fn dtypes_without_a_rocm_safe_dtype_are_refused() {
    for (code, bits, lanes, what) in [
        (7, 8, 1, "dtype"),   // float8_e3m4
        (8, 8, 1, "dtype"),   // float8_e4m3 (with infinities)
        (9, 8, 1, "dtype"),   // float8_e4m3b11fnuz
        (5, 128, 1, "dtype"), // complex128
        (3, 64, 1, "dtype"),  // opaque handle
        (2, 8, 1, "dtype"),   // float of 8 bits
        (0, 0, 1, "dtype"),   // int of 0 bits
        (99, 8, 1, "dtype"),  // unknown code
        (2, 32, 2, "lanes"),  // float32x2
        (2, 32, 0, "lanes"),
    ] {
        let dt = DLDataType {
            code: DLDataTypeCode(code),
            bits,
            lanes,
        };
        let e = dlpack::dtype(dt).unwrap_err();
        assert!(
            matches!(&e, Error::DlpackUnsupported { what: w, .. } if *w == what),
            "{e}"
        );
        for abi in [Abi::Legacy, Abi::Versioned] {
            let (r, calls) = Foreign::new(DType::U8, &[4])
                .with(|f| f.dtype = dt)
                .import(&Device::host(), abi);
            let e = r.unwrap_err();
            assert!(
                matches!(&e, Error::DlpackUnsupported { what: w, .. } if *w == what),
                "{e}"
            );
            assert_eq!(calls.load(Ordering::SeqCst), 1);
        }
    }
}

/// What one import of a changed foreign tensor must give.
fn refused(abi: Abi, f: Foreign) -> Error {
    let (r, calls) = f.import(&Device::host(), abi);
    let e = r.unwrap_err();
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "the producer's deleter ran once after: {e}"
    );
    let msg = e.to_string();
    assert!(msg.starts_with("dlpack import: "), "{msg}");
    e
}

#[test]
fn malformed_and_unsupported_imports_are_typed_errors_after_the_deleter() {
    for abi in [Abi::Legacy, Abi::Versioned] {
        let f = || Foreign::new(DType::I32, &[2, 2]);
        let e = refused(abi, f().with(|f| f.strides = Some(vec![1, 2])));
        assert!(
            matches!(
                e,
                Error::DlpackUnsupported {
                    what: "strides",
                    ..
                }
            ),
            "{e}"
        );
        let e = refused(abi, f().with(|f| f.strides = Some(vec![4, 1])));
        assert!(
            matches!(
                e,
                Error::DlpackUnsupported {
                    what: "strides",
                    ..
                }
            ),
            "{e}"
        );
        let e = refused(abi, f().with(|f| f.strides = Some(vec![-2, 1])));
        assert!(
            matches!(
                e,
                Error::DlpackUnsupported {
                    what: "strides",
                    ..
                }
            ),
            "{e}"
        );
        let e = refused(abi, f().with(|f| f.null_data = true));
        assert!(
            matches!(e, Error::DlpackInvalid { what: "data", .. }),
            "{e}"
        );
        let e = refused(abi, f().with(|f| f.shape = vec![2, -2]));
        assert!(
            matches!(e, Error::DlpackInvalid { what: "shape", .. }),
            "{e}"
        );
        let e = refused(
            abi,
            f().with(|f| {
                f.shape = vec![i64::MAX, i64::MAX];
                f.strides = None;
            }),
        );
        assert!(
            matches!(e, Error::DlpackInvalid { what: "shape", .. }),
            "{e}"
        );
        let e = refused(abi, f().with(|f| f.byte_offset = u64::MAX - 2));
        assert!(
            matches!(e, Error::DlpackInvalid { what: "data", .. }),
            "{e}"
        );
        let e = refused(
            abi,
            f().with(|f| {
                f.device = DLDevice {
                    device_type: DLDeviceType::CPU,
                    device_id: 1,
                }
            }),
        );
        assert!(
            matches!(e, Error::DlpackUnsupported { what: "device", .. }),
            "{e}"
        );
        let e = refused(
            abi,
            f().with(|f| {
                f.device = DLDevice {
                    device_type: DLDeviceType::ROCM,
                    device_id: 0,
                }
            }),
        );
        assert!(
            matches!(e, Error::DlpackUnsupported { what: "device", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("rocm:0"), "{e}");
        let e = refused(abi, f().with(|f| f.dtype.lanes = 2));
        assert!(
            matches!(e, Error::DlpackUnsupported { what: "lanes", .. }),
            "{e}"
        );
        // Three 4-bit elements are not whole bytes.
        let e = refused(abi, Foreign::new(DType::F4, &[3]));
        assert!(
            matches!(e, Error::DlpackUnsupported { what: "shape", .. }),
            "{e}"
        );
    }
    // Versioned only: major version, padded sub-byte elements.
    for major in [0, 2, u32::MAX] {
        let e = refused(
            Abi::Versioned,
            Foreign::new(DType::F32, &[2]).with(|f| f.version.major = major),
        );
        assert!(
            matches!(
                e,
                Error::DlpackUnsupported {
                    what: "version",
                    ..
                }
            ),
            "{e}"
        );
    }
    let e = refused(
        Abi::Versioned,
        Foreign::new(DType::F4, &[4]).with(|f| f.flags = DlpackFlags::IS_SUBBYTE_TYPE_PADDED),
    );
    assert!(
        matches!(e, Error::DlpackUnsupported { what: "flags", .. }),
        "{e}"
    );
}

#[test]
fn a_null_managed_tensor_is_refused_without_a_call() {
    let dev = Device::host();
    // SAFETY: NULL is allowed and refused.
    let e = unsafe { Imported::from_raw(&dev, std::ptr::null_mut()) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::DlpackInvalid {
                what: "pointer",
                ..
            }
        ),
        "{e}"
    );
    // SAFETY: as above.
    let e = unsafe { Imported::from_raw_versioned(&dev, std::ptr::null_mut()) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::DlpackInvalid {
                what: "pointer",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn accepted_layouts_read_the_producers_bytes() {
    let dev = Device::host();
    let s = dev.stream().unwrap();
    for abi in [Abi::Legacy, Abi::Versioned] {
        // NULL strides (compact) for every version, size-1 dimensions with
        // any stride, pinned host memory, a newer minor version.
        let variants: Vec<Foreign> = vec![
            Foreign::new(DType::F32, &[2, 3]).with(|f| f.strides = None),
            Foreign::new(DType::F32, &[2, 1, 3]).with(|f| f.strides = Some(vec![3, 77, 1])),
            Foreign::new(DType::F32, &[1, 1]).with(|f| f.strides = Some(vec![0, 0])),
            Foreign::new(DType::F32, &[4, 0, 3]).with(|f| f.strides = Some(vec![9, 9, 9])),
            Foreign::new(DType::BF16, &[4]).with(|f| {
                f.device = DLDevice {
                    device_type: DLDeviceType::CUDAHOST,
                    device_id: 0,
                }
            }),
            Foreign::new(DType::BF16, &[4]).with(|f| f.version.minor = 9),
            Foreign::new(DType::U8, &[]),
        ];
        for f in variants {
            let want = f.data.clone();
            let shape: Vec<u64> = f.shape.iter().map(|&d| d as u64).collect();
            let (r, calls) = f.import(&dev, abi);
            let t = r.unwrap();
            assert_eq!(t.shape(), shape.as_slice());
            assert_eq!(t.view::<u8>().unwrap().to_vec(&s).unwrap(), want);
            assert_eq!(calls.load(Ordering::SeqCst), 0, "alive while imported");
            drop(t);
            assert_eq!(calls.load(Ordering::SeqCst), 1, "deleted once on drop");
        }
        // A byte offset moves the start.
        let f = Foreign::new(DType::U8, &[4]).with(|f| {
            f.data = (0..8).collect();
            f.byte_offset = 4;
        });
        let (r, _) = f.import(&dev, abi);
        assert_eq!(
            r.unwrap().view::<u8>().unwrap().to_vec(&s).unwrap(),
            [4, 5, 6, 7]
        );
        // Zero elements with a NULL data pointer.
        let (r, calls) = Foreign::new(DType::F64, &[0, 5])
            .with(|f| f.null_data = true)
            .import(&dev, abi);
        let t = r.unwrap();
        assert_eq!((t.num_bytes(), t.view::<f64>().unwrap().len()), (0, 0));
        drop(t);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}

#[test]
fn writes_reach_the_producer_unless_read_only() {
    let dev = Device::host();
    let s = dev.stream().unwrap();
    // Writable: the producer's bytes change (its context holds them until
    // the deleter, so read them through the view before the drop).
    let (r, calls) = Foreign::new(DType::U16, &[3]).import(&dev, Abi::Versioned);
    let mut t = r.unwrap();
    t.view_mut::<u16>()
        .unwrap()
        .copy_htod(&s, &[1, 2, 3])
        .unwrap();
    assert_eq!(t.view::<u16>().unwrap().to_vec(&s).unwrap(), [1, 2, 3]);
    drop(t);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let (r, calls) = Foreign::new(DType::U16, &[3])
        .with(|f| f.flags = DlpackFlags::READ_ONLY)
        .import(&dev, Abi::Versioned);
    let mut t = r.unwrap();
    assert!(t.is_read_only());
    assert_eq!(t.view::<u16>().unwrap().len(), 3);
    let e = t.view_mut::<u16>().unwrap_err();
    assert!(
        matches!(
            e,
            Error::DlpackUnsupported {
                op: "view_mut",
                what: "flags",
                ..
            }
        ),
        "{e}"
    );
    // Dropped on another thread: the deleter runs there, once.
    std::thread::spawn(move || drop(t)).join().unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn loaded_tensors_export_from_the_device_or_the_host() {
    let dev = Device::host();
    let s = dev.stream().unwrap();
    let bytes = pattern(24, 5);
    for data in [
        TensorData::Buffer(s.clone_htod(&bytes).unwrap()),
        TensorData::KeptOnHost(bytes.clone()),
    ] {
        let t = LoadedTensor {
            name: "w".into(),
            dtype: DType::BF16,
            shape: vec![3, 4],
            data,
        };
        let raw = Export::from_loaded(t)
            .unwrap()
            .into_managed_versioned()
            .unwrap()
            .into_raw();
        // SAFETY: a managed tensor just made, handed over once.
        let t = unsafe { Imported::from_raw_versioned(&dev, raw) }.unwrap();
        assert_eq!(t.dl_device().device_type, DLDeviceType::CPU);
        assert_eq!((t.dtype(), t.shape()), (DType::BF16, &[3u64, 4][..]));
        assert_eq!(t.view::<u8>().unwrap().to_vec(&s).unwrap(), bytes);
    }
    // A host vector of any element type is kept as allocated.
    let v: Vec<u64> = (0..6).collect();
    let raw = Export::from_host(v.clone(), DType::U64, &[6])
        .unwrap()
        .into_managed()
        .unwrap()
        .into_raw();
    // SAFETY: as above.
    let t = unsafe { Imported::from_raw(&dev, raw) }.unwrap();
    assert_eq!(t.view::<u64>().unwrap().to_vec(&s).unwrap(), v);
    let e = Export::from_host(v, DType::U32, &[6]).unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
}

#[test]
fn debug_output_names_the_dlpack_device() {
    let dev = Device::host();
    let s = dev.stream().unwrap();
    let e = Export::from_device(s.clone_htod(&[1u8, 2, 3, 4]).unwrap(), DType::F32, &[1]).unwrap();
    let text = format!("{e:?}");
    assert!(text.contains("\"cpu:0\""), "{text}");
    assert!(!text.contains("DLDeviceType"), "{text}");
}
