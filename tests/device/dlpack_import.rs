//! DLPack imports of hand-built foreign tensors: the accepted layouts
//! (read and written through), and typed refusals after which the
//! producer's deleter ran once (the exports: `tests/device/dlpack.rs`). Host-only.

use std::sync::atomic::Ordering;

use common::dlpack::{Abi, Foreign};
use rocm_safe::device::Device;
use rocm_safe::dlpack::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};
use rocm_safe::dlpack::{self, DlpackFlags, Imported};
use rocm_safe::{DType, Error};

use crate::common;

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
