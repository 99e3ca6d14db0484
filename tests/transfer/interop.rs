//! Loading into memory the caller provides (`Loader::load_into`) and typed
//! access to loaded tensors, on the host backend, on `Faults<host>`, and
//! (`--ignored`, feature `cuda`) on a GPU.

use crate::common::faults::faulty;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use half::bf16;
use rocm_safe::device::faults::{FaultKind, When};
use rocm_safe::device::{
    host::HostBackend,
    raw::{Backend, Driver, Wrap},
    Device,
};
use rocm_safe::fallback::Failure;
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
    LoadOptions::to_dtype(DType::F32)
        .with_buffer_bytes(64 * 1024)
        .with_ring_buffers(2)
        .with_small_chunk_bytes(16 * 1024)
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
            ckpt.read_converted_bytes(name, DType::F32).unwrap()
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
    let all = ckpt.read_converted_bytes("w", DType::F32).unwrap();
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
    let (dev, h) = faulty(
        HostBackend::new(),
        (FaultKind::CopyLandsZeros, When::Nth(0)),
    );
    let s = dev.stream().unwrap();
    let want = ckpt.read_converted_bytes("w", DType::F32).unwrap();
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
    let (dev, _h) = faulty(
        HostBackend::new(),
        (FaultKind::CopyLandsZeros, When::Always),
    );
    let mut dst = dev.stream().unwrap().alloc::<u8>(want.len()).unwrap();
    let e = Loader::new(&dev, opts())
        .unwrap()
        .load_into(&ckpt, &Request::whole("w"), &mut dst.view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::VerificationFailed { .. }), "{e}");
}

/// Four bf16 tensors of 48 KiB: with 64 KiB buffers each job holds about
/// one, so a load wants the whole ring.
const FOUR: [&str; 4] = ["a", "b", "c", "d"];

fn four_tensors(dir: &Path) -> Checkpoint {
    let path = dir.join("g.safetensors");
    let mut w = SafeTensorsWriter::create(
        &path,
        FOUR.iter()
            .map(|n| TensorSpec::new(*n, DType::BF16, vec![24_576u64])),
        None,
    )
    .unwrap();
    for (i, n) in FOUR.iter().enumerate() {
        let b: Vec<u8> = (0..24_576u32)
            .flat_map(|k| bf16::from_f32((k as f32 + i as f32) * 0.5).to_le_bytes())
            .collect();
        w.write_tensor(n, &b).unwrap();
    }
    Checkpoint::open(w.finish().unwrap()).unwrap()
}

fn assert_four_exact(ckpt: &Checkpoint, loaded: &rocm_safe::transfer::Loaded) {
    for n in FOUR {
        let want = ckpt.read_converted_bytes(n, DType::F32).unwrap();
        assert_eq!(loaded.get(n).unwrap().data.to_host().unwrap(), want, "{n}");
    }
}

fn ring_of_four() -> LoadOptions {
    opts().with_ring_buffers(4).with_self_test(false)
}

#[test]
fn a_ring_short_of_device_memory_loads_all_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = four_tensors(dir.path());
    // Device allocations of the first load: every slot before the outputs
    // (staging and sums: 0-1, 2-3, ...): the second slot's or third's
    // runs out of memory, so the ring has one or two slots; the outputs
    // follow, and the ring works with what it has. The next load grows it.
    for nth in [2, 3, 4] {
        let (dev, h) = faulty(
            HostBackend::new(),
            (FaultKind::OutOfMemoryOnAlloc, When::Nth(nth)),
        );
        let mut loader = Loader::new(&dev, ring_of_four()).unwrap();
        let loaded = loader.load_all(&ckpt).unwrap();
        assert_eq!(h.injected().len(), 1, "the ring's slots hit the fault");
        assert!(loaded.report.ring_jobs >= 4, "{}", loaded.report.ring_jobs);
        assert!(loaded.report.all_fast(), "{}", loaded.report);
        assert_four_exact(&ckpt, &loaded);
        let before = dev.owned_bytes();
        drop(loaded);
        let again = loader.load_all(&ckpt).unwrap();
        assert!(again.report.all_fast(), "{}", again.report);
        assert_four_exact(&ckpt, &again);
        // The ring grew back to four slots (64 KiB and the sums each).
        let slot = (64 * 1024 + 2 * 256 * 8) as u64;
        dev.synchronize().unwrap();
        assert!(dev.owned_bytes() >= before + slot, "nth {nth}");
    }
}

/// The ring's pinned buffers are pinned on a thread of their own while the
/// load goes on; when one cannot be pinned, the ring works with the
/// buffers before it (or, with none, every tensor goes down the ladder
/// with the failure recorded) and a later load pins the rest.
#[test]
fn a_ring_whose_pinning_fails_loads_all_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = four_tensors(dir.path());
    // Pinned allocations of a first load: each slot's copy of its sums
    // (0-3), made with the slots, then the ring's buffers (4-7), in order,
    // on the pinning thread.
    for buffer in 0..4u64 {
        let (dev, h) = faulty(
            HostBackend::new(),
            (FaultKind::OutOfMemoryOnPinned, When::Nth(4 + buffer)),
        );
        let mut loader = Loader::new(&dev, ring_of_four()).unwrap();
        let loaded = loader.load_all(&ckpt).unwrap();
        // The first buffer is waited for; the others may be pinned after
        // the load returns (a fast host): wait for the failing one.
        let t = std::time::Instant::now();
        while h.injected().is_empty() && t.elapsed().as_secs() < 60 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let hit = h.injected();
        assert_eq!(hit.len(), 1, "buffer {buffer}");
        assert_eq!(hit[0].op, "alloc_pinned");
        assert_four_exact(&ckpt, &loaded);
        let r = &loaded.report;
        if buffer == 0 {
            assert_eq!(r.ring_jobs, 4, "{r}");
            for t in &r.tensors {
                assert_ne!(t.rung, Rung::PinnedRing, "{t}");
                assert_eq!(t.attempts.first().map(|a| a.step), Some(Rung::PinnedRing));
            }
            assert!(r.tensors.iter().any(|t| t
                .attempts
                .iter()
                .any(|a| matches!(&a.failure, Failure::Error(Error::OutOfMemory { .. })))));
        } else {
            assert!(r.all_fast(), "buffer {buffer}: {r}");
        }
        drop(loaded);
        // The next load meets the failure (if the first did not) and works
        // with the slots before it; the one after pins the rest.
        for _ in 0..2 {
            let again = loader.load_all(&ckpt).unwrap();
            assert!(again.report.all_fast(), "buffer {buffer}: {}", again.report);
            assert_four_exact(&ckpt, &again);
        }
    }
}

/// The host backend with pinned allocations of 64 KiB or more that take
/// 20 ms each (after the memory is taken, as pinning does), counted.
#[derive(Debug)]
struct SlowPins {
    inner: HostBackend,
    made: Arc<AtomicI64>,
    live: Arc<AtomicI64>,
}

impl Wrap for SlowPins {
    type Inner = HostBackend;
    fn inner(&self) -> &HostBackend {
        &self.inner
    }
}

// SAFETY: every operation is the host backend's; `alloc_pinned` only waits
// before it.
unsafe impl Driver for SlowPins {
    rocm_safe::forward_driver!(
        info,
        alloc,
        free,
        stream_create,
        stream_destroy,
        stream_synchronize,
        synchronize,
        event_create,
        event_destroy,
        event_record,
        event_synchronize,
        stream_wait_event,
        event_elapsed_ms,
        copy,
        memset_zero,
        mem_info,
        register_read_only,
        unregister_read_only,
    );
    fn alloc_pinned(&self, bytes: usize) -> rocm_safe::Result<*mut u8> {
        let p = self.inner.alloc_pinned(bytes)?;
        self.made.fetch_add(1, Ordering::SeqCst);
        self.live.fetch_add(1, Ordering::SeqCst);
        if bytes >= 64 * 1024 {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(p)
    }
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> rocm_safe::Result<()> {
        // SAFETY: forwards the caller's guarantees.
        unsafe { self.inner.free_pinned(ptr, bytes) }?;
        self.live.fetch_sub(1, Ordering::SeqCst);
        Ok(())
    }
}

// SAFETY: every kernel operation is the host backend's.
unsafe impl Backend for SlowPins {
    rocm_safe::forward_backend!(all);
}

fn slow_pins() -> (Device, Arc<AtomicI64>, Arc<AtomicI64>) {
    let (made, live) = (Arc::new(AtomicI64::new(0)), Arc::new(AtomicI64::new(0)));
    let b = SlowPins {
        inner: HostBackend::new(),
        made: made.clone(),
        live: live.clone(),
    };
    (Device::from_backend(Box::new(b)), made, live)
}

/// With slow pinning, a first load starts filling as soon as the first
/// buffer is pinned (it waits for that one), takes the others as they
/// come, keeps the ring between loads while it is still being pinned (no
/// buffer pinned twice), and dropping the loader stops the pinning thread
/// and frees every buffer it pinned.
#[test]
fn the_ring_is_pinned_while_the_load_runs() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = four_tensors(dir.path());
    let (dev, made, live) = slow_pins();
    let mut loader = Loader::new(&dev, ring_of_four()).unwrap();
    for k in 0..3 {
        let loaded = loader.load_all(&ckpt).unwrap();
        assert!(loaded.report.all_fast(), "{}", loaded.report);
        assert_four_exact(&ckpt, &loaded);
        if k == 0 {
            let t = &loaded.report.timing;
            assert!(t.wait_pin_ms > 0.0, "{t:?}");
        }
    }
    drop(loader);
    assert_eq!(live.load(Ordering::SeqCst), 0, "pinned buffers left");
    // Four buffers and four copies of the sums, each pinned once.
    assert!(
        made.load(Ordering::SeqCst) <= 8,
        "{}",
        made.load(Ordering::SeqCst)
    );

    // A loader dropped right after a load of one tensor, its ring still
    // being pinned: the thread stops and nothing stays pinned.
    let (dev, _made, live) = slow_pins();
    let mut loader = Loader::new(&dev, ring_of_four()).unwrap();
    let loaded = loader.load(&ckpt, &[Request::whole("a")]).unwrap();
    assert!(loaded.report.all_fast(), "{}", loaded.report);
    drop((loaded, loader));
    assert_eq!(live.load(Ordering::SeqCst), 0, "pinned buffers left");
}

/// A loader's first load makes its whole ring (every device slot at once,
/// the pinned buffers on a thread of their own), with or without a
/// self-test and under a memory budget alike: after a load of one small
/// tensor (one job) a 4-buffer ring holds two slots more device memory than
/// a 2-buffer one.
#[test]
fn the_first_load_makes_the_whole_ring() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    let slot = (64 * 1024 + 2 * 256 * 8) as u64;
    let want = ckpt.read_converted_bytes("w", DType::F32).unwrap();
    let owned = |ring_buffers: usize, self_test: bool, memory_budget: Option<u64>| {
        let dev = Device::from_backend(Box::new(HostBackend::new()));
        let o = opts()
            .with_ring_buffers(ring_buffers)
            .with_self_test(self_test)
            .with_memory_budget(memory_budget);
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
    for (self_test, budget) in [(false, None), (true, None), (false, Some(1 << 30))] {
        assert_eq!(
            owned(4, self_test, budget) - owned(2, self_test, budget),
            2 * slot,
            "self_test {self_test}, budget {budget:?}"
        );
    }
}

/// A first load runs the device's self-test on a thread of its own while
/// it allocates, then applies the verdict: a conversion kernel the test
/// finds writing zeros is not trusted, so its tensor starts on the CPU
/// conversion with the reason recorded, and loads exactly; a self-test that
/// cannot run (its upload fails) fails the load with that error.
#[test]
fn the_load_s_own_self_test_decides_the_first_rung() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    let (dev, h) = faulty(
        HostBackend::new(),
        (FaultKind::ConvertWritesZeros, When::Always),
    );
    let loaded = Loader::new(&dev, opts())
        .unwrap()
        .load(&ckpt, &[Request::whole("w")])
        .unwrap();
    assert!(!h.injected().is_empty(), "the self-test met the fault");
    let t = loaded.report.tensor("w").unwrap();
    assert_eq!(t.rung, Rung::CpuConvert, "{t}");
    assert!(
        matches!(
            t.attempts.as_slice(),
            [a] if a.step == Rung::PinnedRing && matches!(a.failure, Failure::NoTrustedKernel { .. })
        ),
        "{t}"
    );
    let want = ckpt.read_converted_bytes("w", DType::F32).unwrap();
    assert_eq!(loaded.get("w").unwrap().data.to_host().unwrap(), want);

    let (dev, _h) = faulty(
        HostBackend::new(),
        (FaultKind::InvalidValueOnCopy, When::Always),
    );
    let e = Loader::new(&dev, opts())
        .unwrap()
        .load(&ckpt, &[Request::whole("w")])
        .unwrap_err();
    assert!(matches!(e, Error::InjectedFault { .. }), "{e}");
}
