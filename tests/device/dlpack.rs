//! DLPack exports: of device buffers, host vectors and loaded tensors
//! (fields as the header says, the deleter giving the memory back once,
//! from any thread), each read back through an import; and imports of
//! another device's tensors refused (the foreign producers' imports:
//! `tests/device/dlpack_import.rs`). The `fn name(dev: &Device)` tests run on the
//! host backend always and on CUDA / HIP with `--ignored` where a GPU is.

use std::sync::atomic::Ordering;

use common::dlpack::{check_fields, expected_code, pattern, Abi, Foreign};
use rocm_safe::device::Device;
use rocm_safe::dlpack::ffi::{DLDevice, DLDeviceType, DLManagedTensorVersioned, DLPackVersion};
use rocm_safe::dlpack::{self, DlpackFlags, Export, Imported};
use rocm_safe::transfer::{LoadedTensor, TensorData};
use rocm_safe::{DType, Error};

use crate::common;

per_device!(
    round_trip_both_abis,
    deleter_runs_once_and_frees,
    export_refusals_give_the_memory_back,
    import_refuses_other_devices,
);
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
        check_fields(m.tensor(), dev, dtype, shape, bytes);
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
