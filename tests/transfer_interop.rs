//! Loading into memory the caller provides (`Loader::load_into`) and typed
//! access to loaded tensors, on the host backend, on `Faults<host>`, and
//! (`--ignored`, feature `cuda`) on a GPU.

use std::path::{Path, PathBuf};

mod common;

use half::bf16;
use rocm_safe::device::faults::{FaultKind, FaultPlan, Faults, When};
use rocm_safe::device::{host::HostBackend, Device};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{LoadOptions, Loader, Request, Rung};
use rocm_safe::{DType, Error};

/// A checkpoint with a bf16 matrix, an f64 vector and an i64 vector, with
/// values that depend on their position.
fn checkpoint(dir: &Path) -> PathBuf {
    let path = dir.join("m.safetensors");
    let specs = [
        ("w", DType::BF16, vec![64u64, 33]),
        ("d", DType::F64, vec![10]),
        ("pos", DType::I64, vec![5]),
    ];
    let mut w = SafeTensorsWriter::create(
        &path,
        specs
            .iter()
            .map(|(n, d, s)| TensorSpec::new(*n, *d, s.clone())),
        None,
    )
    .unwrap();
    let wb: Vec<u8> = (0..64 * 33u32)
        .flat_map(|i| bf16::from_f32(i as f32 * 0.25 - 100.0).to_le_bytes())
        .collect();
    w.write_tensor("w", &wb).unwrap();
    let db: Vec<u8> = (0..10)
        .flat_map(|i| (f64::from(i) / 3.0).to_le_bytes())
        .collect();
    w.write_tensor("d", &db).unwrap();
    let pb: Vec<u8> = (0..5i64)
        .flat_map(|i| (i * 1000 - 7).to_le_bytes())
        .collect();
    w.write_tensor("pos", &pb).unwrap();
    w.finish().unwrap()
}

per_device!(
    load_into_fills_caller_memory,
    typed_access_to_loaded_tensors
);

fn opts() -> LoadOptions {
    LoadOptions {
        buffer_bytes: 64 * 1024,
        ring_buffers: 2,
        small_chunk_bytes: 16 * 1024,
        ..LoadOptions::to_dtype(DType::F32)
    }
}

fn load_into_fills_caller_memory(dev: &Device) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    let mut loader = Loader::new(dev, opts()).unwrap();
    let s = dev.stream().unwrap();
    for (name, rung) in [
        ("w", Rung::PinnedRing),
        ("d", Rung::CpuConvert),
        ("pos", Rung::PinnedRing),
    ] {
        let stored = ckpt.info(name).unwrap().dtype;
        let want = if stored.is_convertible_float() {
            ckpt.read_as_bytes(name, DType::F32).unwrap()
        } else {
            ckpt.read_bytes(name).unwrap()
        };
        // The trainer's allocation, filled with a pattern the load must
        // replace entirely.
        let mut dst = s.clone_htod(&vec![0xa5u8; want.len()]).unwrap();
        let rep = loader
            .load_into(&ckpt, &Request::whole(name), &mut dst.view_mut())
            .unwrap();
        assert_eq!(rep.rung, rung, "{rep}");
        assert!(rep.attempts.is_empty(), "{rep}");
        assert_eq!(dst.to_vec().unwrap(), want, "{name}");
    }
    // Rows of a tensor: the caller's buffer holds just them.
    let rows = Request::rows("w", 10..20);
    let mut dst = s.alloc::<u8>(10 * 33 * 4).unwrap();
    loader.load_into(&ckpt, &rows, &mut dst.view_mut()).unwrap();
    let all = ckpt.read_as_bytes("w", DType::F32).unwrap();
    assert_eq!(dst.to_vec().unwrap(), all[10 * 33 * 4..20 * 33 * 4]);
    // Wrong length, another device: typed errors, nothing written.
    let mut short = s.alloc_zeros::<u8>(16).unwrap();
    let e = loader
        .load_into(&ckpt, &Request::whole("w"), &mut short.view_mut())
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "load_into",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(short.to_vec().unwrap(), vec![0; 16]);
    let other = Device::host();
    let mut elsewhere = other.stream().unwrap().alloc::<u8>(all.len()).unwrap();
    let e = loader
        .load_into(&ckpt, &Request::whole("w"), &mut elsewhere.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    // The caller's memory is the caller's: nothing of it was freed.
    drop(loader);
    dev.synchronize().unwrap();
    assert!(dev.take_errors().is_empty());
    assert_eq!(dst.to_vec().unwrap().len(), 10 * 33 * 4);
}

fn typed_access_to_loaded_tensors(dev: &Device) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    let loaded = Loader::new(dev, opts()).unwrap().load_all(&ckpt).unwrap();
    assert!(loaded.report.all_fast(), "{}", loaded.report);
    let w = loaded.get("w").unwrap();
    let got: Vec<f32> = w.to_vec().unwrap();
    let want: Vec<f32> = ckpt.read("w").unwrap();
    assert_eq!(got, want);
    let view = w.device_view::<f32>().unwrap().unwrap();
    assert_eq!(view.len(), 64 * 33);
    let e = w.to_vec::<bf16>().unwrap_err();
    assert!(
        matches!(
            e,
            Error::DTypeMismatch {
                stored: DType::F32,
                asked: DType::BF16,
                ..
            }
        ),
        "{e}"
    );
    let pos: Vec<i64> = loaded.get("pos").unwrap().to_vec().unwrap();
    assert_eq!(pos, [-7, 993, 1993, 2993, 3993]);
    let d: Vec<f32> = loaded.get("d").unwrap().to_vec().unwrap();
    assert_eq!(d[3], 1.0);
}

#[test]
fn load_into_goes_down_the_ladder_and_refuses_a_bad_host_copy() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    // One bad copy: the ring's copy of "w" lands zeros; a lower rung serves
    // it, into the caller's memory, exactly.
    let (f, h) = Faults::new(
        HostBackend::new(),
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Nth(0)),
    );
    let dev = Device::from_backend(Box::new(f));
    let s = dev.stream().unwrap();
    let want = ckpt.read_as_bytes("w", DType::F32).unwrap();
    let mut dst = s.alloc::<u8>(want.len()).unwrap();
    let rep = Loader::new(&dev, opts())
        .unwrap()
        .load_into(&ckpt, &Request::whole("w"), &mut dst.view_mut())
        .unwrap();
    assert_eq!(h.injected().len(), 1);
    assert_ne!(rep.rung, Rung::PinnedRing, "{rep}");
    assert!(!rep.attempts.is_empty(), "{rep}");
    assert_eq!(dst.to_vec().unwrap(), want);
    // Every copy lands zeros: the tensor ends on the host, and its copy
    // into the caller's memory is checked and refused, not returned wrong.
    let (f, _h) = Faults::new(
        HostBackend::new(),
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Always),
    );
    let dev = Device::from_backend(Box::new(f));
    let mut dst = dev.stream().unwrap().alloc::<u8>(want.len()).unwrap();
    let e = Loader::new(&dev, opts())
        .unwrap()
        .load_into(&ckpt, &Request::whole("w"), &mut dst.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::VerificationFailed { .. }), "{e}");
}

#[test]
fn a_ring_that_cannot_be_pinned_whole_loads_all_the_same() {
    // Four bf16 tensors of 48 KiB: with 64 KiB buffers each job holds about
    // one, so the load wants the whole ring.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("g.safetensors");
    let names = ["a", "b", "c", "d"];
    let mut w = SafeTensorsWriter::create(
        &path,
        names
            .iter()
            .map(|n| TensorSpec::new(*n, DType::BF16, vec![24_576u64])),
        None,
    )
    .unwrap();
    for (i, n) in names.iter().enumerate() {
        let b: Vec<u8> = (0..24_576u32)
            .flat_map(|k| bf16::from_f32((k as f32 + i as f32) * 0.5).to_le_bytes())
            .collect();
        w.write_tensor(n, &b).unwrap();
    }
    let ckpt = Checkpoint::open(w.finish().unwrap()).unwrap();
    // Device allocations of the first load: the first slot (0, 1), then the
    // rest of the ring before any fill (2, ...): the first of those runs
    // out of memory, so the ring starts with one slot, the outputs follow,
    // and the job loop grows the ring (or works with what it has).
    for nth in [2, 3, 4] {
        let (f, h) = Faults::new(
            HostBackend::new(),
            FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Nth(nth)),
        );
        let dev = Device::from_backend(Box::new(f));
        let o = LoadOptions {
            ring_buffers: 4,
            self_test: false,
            ..opts()
        };
        let loaded = Loader::new(&dev, o).unwrap().load_all(&ckpt).unwrap();
        assert_eq!(h.injected().len(), 1, "the ring's pinning hit the fault");
        assert!(loaded.report.ring_jobs >= 4, "{}", loaded.report.ring_jobs);
        assert!(loaded.report.all_fast(), "{}", loaded.report);
        for n in names {
            let want = ckpt.read_as_bytes(n, DType::F32).unwrap();
            assert_eq!(loaded.get(n).unwrap().data.to_host().unwrap(), want, "{n}");
        }
    }
}

/// A loader's first load pins its whole ring before the first fill, with
/// or without a self-test to run meanwhile: after a load of one small
/// tensor (one job) a 4-buffer ring holds two slots more device memory than
/// a 2-buffer one. Under a memory budget the ring grows only as jobs need
/// (one job: one slot).
#[test]
fn the_first_load_pins_the_whole_ring() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    let slot = (64 * 1024 + 2 * 256 * 8) as u64;
    let want = ckpt.read_as_bytes("w", DType::F32).unwrap();
    let owned = |ring_buffers: usize, self_test: bool, memory_budget: Option<u64>| {
        let dev = Device::from_backend(Box::new(HostBackend::new()));
        let o = LoadOptions {
            ring_buffers,
            self_test,
            memory_budget,
            ..opts()
        };
        let mut loader = Loader::new(&dev, o).unwrap();
        let loaded = loader.load(&ckpt, &[Request::whole("w")]).unwrap();
        assert!(loaded.report.all_fast(), "{}", loaded.report);
        assert_eq!(loaded.get("w").unwrap().data.to_host().unwrap(), want);
        dev.synchronize().unwrap();
        let bytes = dev.owned_bytes();
        // A second load finds the ring as it is and still loads exactly.
        let again = loader.load(&ckpt, &[Request::whole("w")]).unwrap();
        assert_eq!(again.get("w").unwrap().data.to_host().unwrap(), want);
        bytes
    };
    for self_test in [false, true] {
        assert_eq!(
            owned(4, self_test, None) - owned(2, self_test, None),
            2 * slot,
            "self_test {self_test}"
        );
    }
    let budget = Some(1 << 30);
    assert_eq!(owned(4, false, budget), owned(2, false, budget));
}
