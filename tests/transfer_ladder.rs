//! The transfer pipeline on the host backend and on `Faults<host>`: every
//! fault mode is detected and served by the next rung with bit-exact data,
//! forced rungs, fail-fast, budget offloading, progress, concurrent loads, a
//! file truncated during the load, and a seeded campaign of 1000 trials.

mod common;

use std::path::{Path, PathBuf};

use rocm_safe::device::faults::{FaultHandle, FaultKind, FaultPlan, FaultRule, Faults, When};
use rocm_safe::device::{host::HostBackend, Backend, ConvertOp, Device};
use rocm_safe::fallback::{Check, Failure};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{Fallback, LoadOptions, Loaded, Loader, Request, Rung};
use rocm_safe::verify::{self, Policy};
use rocm_safe::{DType, Error};

use common::{sparse_bf16, Open, Rng};

per_device!(
    clean_load_is_exact,
    faults_are_caught,
    tiny_tensors_past_256_per_slot_are_exact_on_the_ring,
    zeros_in_a_slot_of_many_pieces_send_each_piece_down,
);

/// Writes a checkpoint of `(name, dtype, shape)` with random contents.
fn write(dir: &Path, file: &str, specs: &[(&str, DType, Vec<u64>)], seed: u64) -> PathBuf {
    let path = dir.join(file);
    let mut rng = Rng::new(seed);
    let mut w = SafeTensorsWriter::create(
        &path,
        specs
            .iter()
            .map(|(n, d, s)| TensorSpec::new(*n, *d, s.clone())),
        None,
    )
    .unwrap();
    for (n, d, s) in specs {
        let elems: u64 = s.iter().product();
        let bytes = rng.bytes(d.bytes_for(elems).unwrap() as usize);
        w.write_tensor(n, &bytes).unwrap();
    }
    w.finish().unwrap()
}

/// A mixed checkpoint: small tensors (coalesced), tensors spanning several
/// 64 KiB ring buffers, a scalar, integers, f64.
fn mixed(dir: &Path) -> PathBuf {
    write(
        dir,
        "mixed.safetensors",
        &[
            ("a.bf16", DType::BF16, vec![3, 5]),
            ("b.big_bf16", DType::BF16, vec![300, 333]),
            ("c.f16", DType::F16, vec![1000]),
            ("d.f32", DType::F32, vec![70, 1001]),
            ("e.i32", DType::I32, vec![17]),
            ("f.f64", DType::F64, vec![33]),
            ("g.scalar", DType::BF16, vec![]),
            ("h.u8", DType::U8, vec![3]),
            ("i.empty", DType::BF16, vec![0, 4]),
        ],
        7,
    )
}

fn small(dtype: Option<DType>) -> LoadOptions {
    LoadOptions::default()
        .with_dtype(dtype)
        .with_ring_buffers(2)
        .with_buffer_bytes(64 * 1024)
        .with_small_chunk_bytes(16 * 1024)
}

fn faulty(plan: FaultPlan) -> (Device, FaultHandle) {
    let (f, h) = Faults::new(HostBackend::new(), plan);
    (Device::from_backend(Box::new(f)), h)
}

/// Every loaded tensor equals the CPU reader's result, byte for byte.
fn assert_exact(ckpt: &Checkpoint, loaded: &Loaded) {
    for t in &loaded.tensors {
        let info = ckpt.info(&t.name).unwrap();
        let want = if t.dtype == info.dtype {
            ckpt.read_bytes(&t.name).unwrap()
        } else {
            ckpt.read_converted_bytes(&t.name, t.dtype).unwrap()
        };
        assert_eq!(t.data.to_host().unwrap(), want, "tensor {}", t.name);
        let rep = loaded.report.tensor(&t.name).unwrap();
        assert_eq!(rep.out_bytes as usize, want.len());
        assert_eq!(t.data.is_device(), rep.rung != Rung::KeepOnHost);
        // Kept on the host means host memory; a buffer is host memory
        // exactly when its device is the host backend (or Faults over it).
        match t.data.device_buffer() {
            None => assert!(t.data.is_host_memory(), "tensor {}", t.name),
            Some(b) => assert_eq!(
                t.data.is_host_memory(),
                b.device().kind() == rocm_safe::device::BackendKind::Host,
                "tensor {}",
                t.name
            ),
        }
    }
}

#[test]
fn clean_load_is_exact_and_fast() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    for dtype in [None, Some(DType::F32), Some(DType::BF16), Some(DType::F16)] {
        for policy in [
            Policy::Fingerprint,
            Policy::FusedFingerprint,
            Policy::ReadBack,
            Policy::Off,
        ] {
            let dev = Device::host();
            let mut l = Loader::new(&dev, small(dtype).with_policy(policy)).unwrap();
            let loaded = l.load_all(&ckpt).unwrap();
            assert_exact(&ckpt, &loaded);
            // Pairs without a device kernel (f64 -> f32, f16 <-> bf16)
            // start on the CPU rung.
            for t in &loaded.report.tensors {
                let on_device = t.dtype == t.out_dtype
                    || ConvertOp {
                        from: t.dtype,
                        to: t.out_dtype,
                    }
                    .on_device();
                if on_device {
                    assert_eq!(t.rung, Rung::PinnedRing, "{} {dtype:?}", t.name);
                    assert!(t.attempts.is_empty());
                } else {
                    // Routed there on purpose: nothing was tried, nothing
                    // failed, and the report says why.
                    assert_eq!(t.rung, Rung::CpuConvert, "{} {dtype:?}", t.name);
                    assert!(t.attempts.is_empty(), "{t}");
                    let why = t.routed.as_deref().unwrap_or_default();
                    assert!(why.contains("no device kernel"), "{t}");
                }
            }
            assert!(
                loaded.report.ring_jobs >= 4,
                "big tensors span several buffers"
            );
            assert_eq!(
                loaded.report.file_bytes,
                loaded
                    .report
                    .tensors
                    .iter()
                    .map(|t| t.file_bytes)
                    .sum::<u64>()
            );
        }
    }
}

#[test]
fn row_slices_and_names() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let dev = Device::host();
    let mut l = Loader::new(&dev, small(Some(DType::F32))).unwrap();
    let reqs = [
        Request::rows("b.big_bf16", 100..250),
        Request::rows("d.f32", 3..4),
        Request::whole("c.f16"),
    ];
    let loaded = l.load(&ckpt, &reqs).unwrap();
    let b = loaded.get("b.big_bf16").unwrap();
    assert_eq!(b.shape, vec![150, 333]);
    assert_eq!(
        b.data.to_host().unwrap(),
        bytemuck::cast_slice::<f32, u8>(&ckpt.read_rows::<f32>("b.big_bf16", 100..250).unwrap())
    );
    let d = loaded.get("d.f32").unwrap();
    assert_eq!(
        d.data.to_host().unwrap(),
        ckpt.read_rows_bytes("d.f32", 3..4).unwrap()
    );
    let names = l.load_names(&ckpt, &["c.f16", "a.bf16"]).unwrap();
    assert_eq!(names.tensors.len(), 2);
    assert_exact(&ckpt, &names);
}

#[test]
fn bad_requests_and_options_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let dev = Device::host();
    let mut l = Loader::new(&dev, small(None)).unwrap();
    assert!(matches!(
        l.load_names(&ckpt, &["nope"]),
        Err(Error::TensorNotFound { .. })
    ));
    assert!(matches!(
        l.load(&ckpt, &[Request::rows("b.big_bf16", 5..301)]),
        Err(Error::RowRange { .. })
    ));
    assert!(matches!(
        l.load(&ckpt, &[Request::rows("g.scalar", 0..1)]),
        Err(Error::NoRows { .. })
    ));
    for bad in [
        small(None).with_ring_buffers(9),
        small(None).with_ring_buffers(1),
        small(None).with_concurrent_fills(Some(0)),
        small(None).with_concurrent_fills(Some(3)),
        small(None).with_buffer_bytes(65 * 1024 * 1024),
        small(None).with_buffer_bytes(100_000),
        small(None).with_small_chunk_bytes(128 * 1024),
        small(None).with_dtype(Some(DType::I32)),
    ] {
        assert!(matches!(
            Loader::new(&dev, bad),
            Err(Error::InvalidLoadOptions { .. })
        ));
    }
}

/// One fault kind, hitting one operation after the self-test: the pinned
/// ring sees it and the next rung serves, exactly.
fn one_fault(kind: FaultKind, when: When, stage: Option<Check>) {
    one_fault_on(Box::new(HostBackend::new()), kind, when, stage)
}

fn one_fault_on(inner: Box<dyn Backend>, kind: FaultKind, when: When, stage: Option<Check>) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let (f, h) = Faults::new(inner, FaultPlan::one(kind, when));
    let dev = Device::from_backend(Box::new(f));
    h.set_enabled(false);
    assert!(verify::self_test(&dev.stream().unwrap())
        .unwrap()
        .all_passed());
    let mut l = Loader::new(&dev, small(Some(DType::F32))).unwrap();
    h.set_enabled(true);
    let loaded = l.load_all(&ckpt).unwrap();
    assert!(!h.injected().is_empty(), "{kind:?} was injected");
    assert_exact(&ckpt, &loaded);
    let hit: Vec<_> = loaded
        .report
        .tensors
        .iter()
        .filter(|t| {
            t.attempts.iter().any(|a| {
                a.step == Rung::PinnedRing && !matches!(a.failure, Failure::NoTrustedKernel { .. })
            })
        })
        .collect();
    assert!(!hit.is_empty(), "{kind:?}: a tensor went down the ladder");
    for t in &hit {
        assert_eq!(t.rung, Rung::SmallChunks, "{kind:?} {}", t.name);
        let f = &t.attempts[0].failure;
        match stage {
            Some(s) => assert!(
                matches!(f, Failure::FingerprintMismatch { check, .. } if *check == s)
                    || matches!(f, Failure::JobFailed { .. }),
                "{kind:?}: {f}"
            ),
            None => assert!(
                matches!(f, Failure::Error(Error::InjectedFault { fault, .. }) if *fault == kind)
                    || matches!(f, Failure::JobFailed { .. }),
                "{kind:?}: {f}"
            ),
        }
    }
}

#[test]
fn copy_lands_zeros_goes_down_one_rung() {
    one_fault(FaultKind::CopyLandsZeros, When::Nth(1), Some(Check::Copy));
}

#[test]
fn copy_lands_stale_goes_down_one_rung() {
    one_fault(FaultKind::CopyLandsStale, When::Nth(0), Some(Check::Copy));
}

#[test]
fn copy_lands_garbage_goes_down_one_rung() {
    one_fault(FaultKind::CopyLandsGarbage, When::Nth(2), Some(Check::Copy));
}

#[test]
fn conversion_writes_zeros_goes_down_one_rung() {
    one_fault(
        FaultKind::ConvertWritesZeros,
        When::Nth(0),
        Some(Check::Output),
    );
}

#[test]
fn invalid_value_on_copy_goes_down_one_rung() {
    one_fault(FaultKind::InvalidValueOnCopy, When::Nth(1), None);
}

#[test]
fn launch_failure_goes_down_one_rung() {
    one_fault(FaultKind::LaunchFailure, When::Nth(3), None);
}

#[test]
fn every_device_rung_failing_ends_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let (dev, h) = faulty(FaultPlan::one(FaultKind::CopyLandsZeros, When::Always));
    let opts = small(Some(DType::F32)).with_self_test(false);
    let loaded = Loader::new(&dev, opts).unwrap().load_all(&ckpt).unwrap();
    assert!(!h.injected().is_empty());
    assert_exact(&ckpt, &loaded);
    for t in &loaded.report.tensors {
        if t.file_bytes == 0 {
            continue; // nothing to copy, nothing to corrupt
        }
        assert_eq!(t.rung, Rung::KeepOnHost, "{}", t.name);
        let rungs: Vec<Rung> = t.attempts.iter().map(|a| a.step).collect();
        let want: &[Rung] = if t.dtype == DType::F64 {
            // Routed to the CPU rung (no f64 kernel): only it failed.
            &[Rung::CpuConvert]
        } else {
            &[
                Rung::PinnedRing,
                Rung::SmallChunks,
                Rung::Pageable,
                Rung::CpuConvert,
            ]
        };
        assert_eq!(rungs, want, "{}", t.name);
    }
}

#[test]
fn out_of_memory_is_retried_once_then_goes_down() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    // One failed allocation, the first tensor's: the retry (after the
    // loader released its ring) serves it on the ring. A first load pins
    // its whole ring first: allocations 0-3 are the two slots' staging
    // and sums.
    let opts = small(Some(DType::F32)).with_self_test(false);
    let first_output = 2 * opts.ring_buffers as u64;
    let (dev, _h) = faulty(FaultPlan::one(
        FaultKind::OutOfMemoryOnAlloc,
        When::Nth(first_output),
    ));
    let loaded = Loader::new(&dev, opts.clone())
        .unwrap()
        .load_all(&ckpt)
        .unwrap();
    assert_exact(&ckpt, &loaded);
    let first = &loaded.report.tensors[0];
    assert!(first.oom_retried);
    assert_eq!(first.rung, Rung::PinnedRing);
    // Every allocation fails: everything stays on the host.
    let (dev, _h) = faulty(FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Always));
    let loaded = Loader::new(&dev, opts).unwrap().load_all(&ckpt).unwrap();
    assert_exact(&ckpt, &loaded);
    for t in &loaded.report.tensors {
        if t.out_bytes > 0 {
            assert_eq!(t.rung, Rung::KeepOnHost, "{}", t.name);
            assert!(t.oom_retried);
            assert!(t
                .attempts
                .iter()
                .any(|a| matches!(a.failure, Failure::Error(Error::OutOfMemory { .. }))));
        }
    }
}

#[test]
fn out_of_memory_releases_the_cached_ring_and_the_next_pass_makes_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let (dev, h) = faulty(FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Nth(0)));
    let opts = small(Some(DType::F32)).with_self_test(false);
    let mut loader = Loader::new(&dev, opts).unwrap();
    // The first load (no faults) leaves the ring cached in the loader.
    h.set_enabled(false);
    let warm = loader.load_all(&ckpt).unwrap();
    let rungs: Vec<Rung> = warm.report.tensors.iter().map(|t| t.rung).collect();
    drop(warm);
    // The dropped tensors' frees are done now: with frees still pending,
    // the device itself would free them and retry, and the loader would
    // never see the failure.
    dev.synchronize().unwrap();
    assert_eq!(dev.pending_free_bytes(), 0);
    // The second load's first allocation fails: the cached ring is
    // released, the retry succeeds and the ring pass builds a new ring.
    h.set_enabled(true);
    let loaded = loader.load_all(&ckpt).unwrap();
    assert_eq!(h.injected().len(), 1);
    assert_exact(&ckpt, &loaded);
    assert!(loaded.report.tensors[0].oom_retried);
    assert_eq!(loaded.report.tensors[0].rung, Rung::PinnedRing);
    // Every tensor is served where the fault-free load served it.
    let again: Vec<Rung> = loaded.report.tensors.iter().map(|t| t.rung).collect();
    assert_eq!(again, rungs);
}

#[test]
fn one_or_two_fills_at_a_time_load_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let dev = Device::host();
    for k in [1, 2] {
        let opts = small(Some(DType::F32)).with_concurrent_fills(Some(k));
        let mut l = Loader::new(&dev, opts).unwrap();
        for _ in 0..2 {
            let loaded = l.load_all(&ckpt).unwrap();
            assert_exact(&ckpt, &loaded);
            assert!(loaded.report.ring_jobs > 2, "{}", loaded.report.ring_jobs);
        }
    }
}

#[test]
fn a_budget_below_the_staging_keeps_everything_on_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let dev = Device::host();
    let mut loader = Loader::new(&dev, small(Some(DType::F32))).unwrap();
    let staging = loader.staging_device_bytes();
    // (2 ring buffers + 1 lower-rung buffer) x (64 KiB + accumulators).
    assert_eq!(staging, 3 * (64 * 1024 + 2 * 256 * 8));
    let loaded = Loader::new(
        &dev,
        small(Some(DType::F32)).with_memory_budget(Some(staging - 1)),
    )
    .unwrap()
    .load_all(&ckpt)
    .unwrap();
    assert_exact(&ckpt, &loaded);
    for t in &loaded.report.tensors {
        assert_eq!(t.rung, Rung::KeepOnHost, "{}", t.name);
        assert!(t.attempts.is_empty());
    }
    assert!(loaded
        .report
        .tensors
        .iter()
        .filter(|t| t.out_bytes > 0)
        .all(|t| t.offloaded));
    // A budget of the staging plus every tensor keeps them all on the device.
    let all: u64 = loaded.report.tensors.iter().map(|t| t.out_bytes).sum();
    let fits = Loader::new(
        &dev,
        small(Some(DType::F32)).with_memory_budget(Some(staging + all)),
    )
    .unwrap()
    .load_all(&ckpt)
    .unwrap();
    assert_exact(&ckpt, &fits);
    assert!(fits.report.tensors.iter().all(|t| !t.offloaded));
    let free = loader.load_all(&ckpt).unwrap();
    let rungs = |l: &rocm_safe::transfer::Loaded| -> Vec<Rung> {
        l.report.tensors.iter().map(|t| t.rung).collect()
    };
    assert_eq!(rungs(&fits), rungs(&free));
}

#[test]
fn forced_rungs_serve_everything_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    for rung in Rung::ALL {
        for dtype in [None, Some(DType::F32), Some(DType::BF16)] {
            let dev = Device::host();
            let opts = small(dtype).with_fallback(Fallback::Force(rung));
            let mut l = Loader::new(&dev, opts).unwrap();
            // Forcing a device rung on a pair without a device kernel is
            // a failure (tested in `forbidden_fallback_fails_fast`).
            let names: Vec<&str> = ckpt
                .tensors()
                .filter(|(_, t)| match dtype {
                    Some(to) if t.dtype.is_convertible_float() && t.dtype != to => {
                        !rung.converts_on_device() || ConvertOp { from: t.dtype, to }.on_device()
                    }
                    _ => true,
                })
                .map(|(_, t)| t.name.as_str())
                .collect();
            let loaded = l.load_names(&ckpt, &names).unwrap();
            assert_exact(&ckpt, &loaded);
            for t in &loaded.report.tensors {
                assert_eq!(t.rung, rung, "{} {dtype:?}", t.name);
            }
        }
    }
}

#[test]
fn forbidden_fallback_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let (dev, _h) = faulty(FaultPlan::one(FaultKind::CopyLandsGarbage, When::Always));
    let opts = small(None)
        .with_fallback(Fallback::Forbid)
        .with_self_test(false);
    let e = Loader::new(&dev, opts)
        .unwrap()
        .load_all(&ckpt)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::TransferFailed {
                rung: "pinned ring",
                ..
            }
        ),
        "{e}"
    );
    // A forced rung that fails is an error too (with the device error kept).
    let (dev, _h) = faulty(FaultPlan::one(FaultKind::InvalidValueOnCopy, When::Always));
    let opts = small(None)
        .with_fallback(Fallback::Force(Rung::Pageable))
        .with_self_test(false);
    let e = Loader::new(&dev, opts)
        .unwrap()
        .load_all(&ckpt)
        .unwrap_err();
    match e {
        Error::TransferFailed {
            rung,
            source: Some(s),
            ..
        } => {
            assert_eq!(rung, "pageable");
            assert!(matches!(
                *s,
                Error::InjectedFault {
                    fault: FaultKind::InvalidValueOnCopy,
                    ..
                }
            ));
        }
        other => panic!("{other}"),
    }
    // f64 -> f32 with fallback forbidden: no device kernel is a failure.
    let dev = Device::host();
    let opts = small(Some(DType::F32)).with_fallback(Fallback::Forbid);
    let e = Loader::new(&dev, opts)
        .unwrap()
        .load_names(&ckpt, &["f.f64"])
        .unwrap_err();
    assert!(matches!(e, Error::TransferFailed { .. }), "{e}");
}

#[test]
fn memory_budget_offloads_the_rest_to_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let dev = Device::host();
    let probe = Loader::new(&dev, small(Some(DType::F32))).unwrap();
    // The staging, then a.bf16 and b.big_bf16 fit (as f32).
    let budget = probe.staging_device_bytes() + 300 * 333 * 4 + 100;
    let opts = small(Some(DType::F32)).with_memory_budget(Some(budget));
    let loaded = Loader::new(&dev, opts).unwrap().load_all(&ckpt).unwrap();
    assert_exact(&ckpt, &loaded);
    let on_dev: u64 = loaded
        .report
        .tensors
        .iter()
        .filter(|t| t.rung != Rung::KeepOnHost)
        .map(|t| t.out_bytes)
        .sum();
    assert!(on_dev + probe.staging_device_bytes() <= budget);
    let off: Vec<&str> = loaded
        .report
        .tensors
        .iter()
        .filter(|t| t.offloaded)
        .map(|t| t.name.as_str())
        .collect();
    assert!(off.contains(&"d.f32"), "{off:?}");
    assert!(!off.contains(&"b.big_bf16"));
    for t in loaded.report.tensors.iter().filter(|t| t.offloaded) {
        assert_eq!(t.rung, Rung::KeepOnHost);
        assert!(t.attempts.is_empty());
    }
}

#[test]
fn progress_reaches_the_total() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let (dev, _h) = faulty(FaultPlan::one(FaultKind::CopyLandsZeros, When::Nth(2)));
    let mut l = Loader::new(&dev, small(Some(DType::F32)).with_self_test(false)).unwrap();
    let reqs: Vec<Request> = ckpt
        .tensors()
        .map(|(_, t)| Request::whole(t.name.clone()))
        .collect();
    let mut seen = Vec::new();
    let loaded = l
        .load_with_progress(&ckpt, &reqs, &mut |p| seen.push(*p))
        .unwrap();
    assert!(seen.len() > 3);
    assert!(seen.windows(2).all(|w| w[0].done_bytes <= w[1].done_bytes));
    let last = seen.last().unwrap();
    assert_eq!(last.done_bytes, last.total_bytes);
    assert_eq!(last.total_bytes, loaded.report.file_bytes);
    assert_eq!(last.done_tensors, last.total_tensors);
}

#[test]
fn concurrent_loads_from_several_threads() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let (dev, h) = faulty(FaultPlan {
        seed: 3,
        rules: vec![FaultRule {
            kind: FaultKind::CopyLandsGarbage,
            when: When::Random {
                per_million: 50_000,
            },
        }],
    });
    std::thread::scope(|s| {
        for k in 0..4 {
            let (dev, ckpt) = (&dev, &ckpt);
            s.spawn(move || {
                let dtype = [None, Some(DType::F32)][k % 2];
                let mut l = Loader::new(dev, small(dtype).with_self_test(false)).unwrap();
                for _ in 0..3 {
                    let loaded = l.load_all(ckpt).unwrap();
                    assert_exact(ckpt, &loaded);
                }
            });
        }
    });
    assert!(!h.injected().is_empty());
}

#[test]
fn a_file_truncated_during_the_load_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "t.safetensors",
        &[("x", DType::BF16, vec![1024, 1024])],
        9,
    );
    let ckpt = Checkpoint::open(&path).unwrap();
    for fallback in [
        Fallback::Ladder,
        Fallback::Force(Rung::SmallChunks),
        Fallback::Force(Rung::KeepOnHost),
    ] {
        std::fs::write(&path, std::fs::read(&path).unwrap()).ok();
        let ckpt2 = Checkpoint::open(&path).unwrap();
        let dev = Device::host();
        let mut l = Loader::new(&dev, small(Some(DType::F32)).with_fallback(fallback)).unwrap();
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut cut = false;
        let r = l.load_with_progress(&ckpt2, &[Request::whole("x")], &mut |p| {
            if !cut && (p.done_bytes > 0 || fallback != Fallback::Ladder) {
                file.set_len(1000).unwrap();
                cut = true;
            }
        });
        match r {
            Err(Error::FileShrunk { tensor, .. }) => assert_eq!(tensor, "x"),
            other => panic!("{fallback:?}: {other:?}"),
        }
        // Restore for the next round: written under another name and
        // renamed, since the writer refuses a file that a live reader of
        // this process holds (`ckpt`, `ckpt2`).
        let fresh = dir.path().join("fresh.safetensors");
        let mut w = SafeTensorsWriter::create(
            &fresh,
            [TensorSpec::new("x", DType::BF16, [1024u64, 1024])],
            None,
        )
        .unwrap();
        w.write_tensor("x", &Rng::new(9).bytes(2 << 20)).unwrap();
        w.finish().unwrap();
        std::fs::rename(&fresh, &path).unwrap();
    }
    drop(ckpt);
}

/// 1000 seeded trials mixing faults, sizes, dtypes and policies: no load
/// may return data that differs from the CPU reader's.
#[test]
fn campaign_of_seeded_trials_has_no_undetected_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let kinds = [
        FaultKind::CopyLandsZeros,
        FaultKind::CopyLandsStale,
        FaultKind::CopyLandsGarbage,
        FaultKind::InvalidValueOnCopy,
        FaultKind::ConvertWritesZeros,
        FaultKind::OutOfMemoryOnAlloc,
        FaultKind::LaunchFailure,
    ];
    let dtypes = [
        DType::BF16,
        DType::F16,
        DType::F32,
        DType::F64,
        DType::I16,
        DType::U8,
    ];
    let mut rng = Rng::new(2026);
    let (mut injected, mut fell_back, mut undetected) = (0usize, 0usize, 0usize);
    for trial in 0..1000u64 {
        let n = 1 + rng.below(4) as usize;
        let names: Vec<String> = (0..n).map(|i| format!("t{i}")).collect();
        let specs: Vec<(&str, DType, Vec<u64>)> = names
            .iter()
            .map(|nm| {
                let d = dtypes[rng.below(dtypes.len() as u64) as usize];
                let rows = rng.below(40);
                let wide = rng.below(8) == 0;
                let cols = 1 + rng.below(if wide { 3000 } else { 200 });
                (nm.as_str(), d, vec![rows, cols])
            })
            .collect();
        let path = write(
            dir.path(),
            &format!("c{}.safetensors", trial % 8),
            &specs,
            trial,
        );
        let ckpt = Checkpoint::open(&path).unwrap();
        let rules = (0..1 + rng.below(3))
            .map(|_| FaultRule {
                kind: kinds[rng.below(kinds.len() as u64) as usize],
                when: When::Random {
                    per_million: 50_000 + rng.below(400_000) as u32,
                },
            })
            .collect();
        let (dev, h) = faulty(FaultPlan { seed: trial, rules });
        let opts = small(None)
            .with_dtype(
                [None, Some(DType::F32), Some(DType::BF16), Some(DType::F16)]
                    [rng.below(4) as usize],
            )
            .with_policy(
                [
                    Policy::Fingerprint,
                    Policy::FusedFingerprint,
                    Policy::ReadBack,
                ][rng.below(3) as usize],
            )
            .with_self_test(false);
        let loaded = Loader::new(&dev, opts).unwrap().load_all(&ckpt).unwrap();
        injected += h.injected().len();
        for t in &loaded.tensors {
            let info = ckpt.info(&t.name).unwrap();
            let want = if t.dtype == info.dtype {
                ckpt.read_bytes(&t.name).unwrap()
            } else {
                ckpt.read_converted_bytes(&t.name, t.dtype).unwrap()
            };
            if t.data.to_host().unwrap() != want {
                undetected += 1;
            }
        }
        fell_back += loaded
            .report
            .tensors
            .iter()
            .filter(|t| !t.attempts.is_empty())
            .count();
    }
    assert_eq!(undetected, 0);
    assert!(injected > 1000, "faults injected: {injected}");
    assert!(
        fell_back > 300,
        "tensors that went down the ladder: {fell_back}"
    );
}

/// On every backend (a GPU with `--ignored`): a clean load in each policy
/// is exact and takes the pinned ring wherever a device kernel converts.
fn clean_load_is_exact(dev: &Device) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    for dtype in [None, Some(DType::F32), Some(DType::BF16)] {
        for policy in [
            Policy::Fingerprint,
            Policy::FusedFingerprint,
            Policy::ReadBack,
        ] {
            let mut l = Loader::new(dev, small(dtype).with_policy(policy)).unwrap();
            let loaded = l.load_all(&ckpt).unwrap();
            assert_exact(&ckpt, &loaded);
            assert!(loaded
                .report
                .tensors
                .iter()
                .all(|t| t.attempts.is_empty() || t.rung == Rung::CpuConvert));
        }
    }
}

/// On every backend: each copy/conversion fault is caught and the next
/// rung serves.
fn faults_are_caught(open: Open<'_>) {
    one_fault_on(
        open(),
        FaultKind::CopyLandsZeros,
        When::Nth(1),
        Some(Check::Copy),
    );
    one_fault_on(
        open(),
        FaultKind::CopyLandsStale,
        When::Nth(0),
        Some(Check::Copy),
    );
    one_fault_on(
        open(),
        FaultKind::CopyLandsGarbage,
        When::Nth(2),
        Some(Check::Copy),
    );
    one_fault_on(
        open(),
        FaultKind::ConvertWritesZeros,
        When::Nth(0),
        Some(Check::Output),
    );
    one_fault_on(open(), FaultKind::InvalidValueOnCopy, When::Nth(1), None);
}

/// A checkpoint of `n` tiny bf16 tensors (`t000`, ...: 2 to 5 elements
/// each), and their names in order.
fn tiny(dir: &Path, n: usize) -> (PathBuf, Vec<String>) {
    let names: Vec<String> = (0..n).map(|i| format!("t{i:03}")).collect();
    let specs: Vec<(&str, DType, Vec<u64>)> = names
        .iter()
        .enumerate()
        .map(|(i, nm)| (nm.as_str(), DType::BF16, vec![2 + i as u64 % 4]))
        .collect();
    (write(dir, "tiny.safetensors", &specs, 11), names)
}

/// bf16 -> f32 with slots of 1 MiB: room for 4096 tiny pieces (256 bytes
/// each, the piece alignment), so the limit of 256 pieces per slot is what
/// splits the jobs.
fn roomy() -> LoadOptions {
    LoadOptions::default()
        .with_dtype(Some(DType::F32))
        .with_ring_buffers(2)
        .with_buffer_bytes(1 << 20)
        .with_small_chunk_bytes(16 * 1024)
}

/// Each loaded tensor is the CPU's widening of its bf16 bits.
fn assert_widened(ckpt: &Checkpoint, loaded: &Loaded) {
    for t in &loaded.tensors {
        let raw = ckpt.read_bytes(&t.name).unwrap();
        let want: Vec<u8> = raw
            .chunks_exact(2)
            .flat_map(|b| {
                rocm_safe::convert::scalar::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
                    .to_le_bytes()
            })
            .collect();
        assert_eq!(t.data.to_host().unwrap(), want, "tensor {}", t.name);
    }
}

/// 256, 257 and 600 tiny tensors: one, two and three jobs (the slot's
/// piece limit splits them), every tensor bit-exact and served by the
/// pinned ring with no failure, under each checking policy.
fn tiny_tensors_past_256_per_slot_are_exact_on_the_ring(dev: &Device) {
    let dir = tempfile::tempdir().unwrap();
    let (path, names) = tiny(dir.path(), 600);
    let ckpt = Checkpoint::open(path).unwrap();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for policy in [
        Policy::Fingerprint,
        Policy::FusedFingerprint,
        Policy::ReadBack,
    ] {
        let mut l = Loader::new(dev, roomy().with_policy(policy)).unwrap();
        for (n, jobs) in [(256, 1), (257, 2), (600, 3)] {
            let loaded = l.load_names(&ckpt, &names[..n]).unwrap();
            let what = format!("{n} tensors, {policy:?}");
            assert_eq!(loaded.tensors.len(), n, "{what}");
            assert_eq!(loaded.report.ring_jobs, jobs, "{what}");
            assert_exact(&ckpt, &loaded);
            assert_widened(&ckpt, &loaded);
            for t in &loaded.report.tensors {
                assert_eq!(t.rung, Rung::PinnedRing, "{what}: {t}");
                assert!(t.attempts.is_empty(), "{what}: {t}");
            }
        }
    }
}

/// One copy landing zeros over a slot that carries a full job of tiny
/// tensors: every tensor of that job (and only those) fails its copy check
/// and is served by the next rung, exactly; none is lost.
fn zeros_in_a_slot_of_many_pieces_send_each_piece_down(open: Open<'_>) {
    let dir = tempfile::tempdir().unwrap();
    let (path, names) = tiny(dir.path(), 600);
    let ckpt = Checkpoint::open(path).unwrap();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let (f, h) = Faults::new(
        open(),
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Nth(0)),
    );
    let dev = Device::from_backend(Box::new(f));
    h.set_enabled(false);
    let mut l = Loader::new(&dev, roomy().with_self_test(false)).unwrap();
    h.set_enabled(true);
    let loaded = l.load_names(&ckpt, &names).unwrap();
    // One slot copy, of one of the three jobs, landed zeros.
    let injected = h.injected();
    assert_eq!(injected.len(), 1, "{injected:?}");
    assert_eq!(loaded.report.ring_jobs, 3);
    assert_eq!(loaded.tensors.len(), names.len());
    assert_exact(&ckpt, &loaded);
    assert_widened(&ckpt, &loaded);
    let hit: Vec<usize> = (0..names.len())
        .filter(|&i| !loaded.report.tensors[i].attempts.is_empty())
        .collect();
    let jobs = [0..256, 256..512, 512..600];
    assert!(
        jobs.iter().any(|j| hit == j.clone().collect::<Vec<_>>()),
        "the tensors sent down are not one job's: {hit:?}\n{}",
        loaded.report
    );
    for (i, t) in loaded.report.tensors.iter().enumerate() {
        assert_eq!(t.name, names[i]);
        if hit.contains(&i) {
            assert_eq!(t.rung, Rung::SmallChunks, "{t}");
            assert_eq!(t.attempts.len(), 1, "{t}");
            assert_eq!(t.attempts[0].step, Rung::PinnedRing);
            assert!(
                matches!(
                    t.attempts[0].failure,
                    Failure::FingerprintMismatch {
                        check: Check::Copy,
                        ..
                    }
                ),
                "{t}"
            );
        } else {
            assert_eq!(t.rung, Rung::PinnedRing, "{t}");
        }
    }
}

/// A subscriber that records the `rung` field of every span.
#[derive(Default, Clone)]
struct Rungs(std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>);

struct Field<'a>(&'a mut Option<String>);
impl tracing::field::Visit for Field<'_> {
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        if f.name() == "rung" {
            *self.0 = Some(v.to_owned());
        }
    }
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        if f.name() == "rung" {
            *self.0 = Some(format!("{v:?}").trim_matches('"').to_owned());
        }
    }
}

impl tracing::Subscriber for Rungs {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, a: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut rung = None;
        a.record(&mut Field(&mut rung));
        let mut v = self.0.lock().unwrap();
        if let Some(r) = rung {
            v.push((a.metadata().name().to_owned(), r));
        }
        tracing::span::Id::from_u64(v.len() as u64 + 1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// tracing caches each span callsite's interest process-wide, so spans
/// reached first by tests running in parallel without a subscriber can stay
/// disabled for this test's scoped subscriber. The check therefore runs in a
/// child process of this test binary that runs it alone.
#[test]
fn tracing_spans_name_each_rung_taken() {
    if std::env::var_os("ROCM_SAFE_TRACING_CHILD").is_some() {
        return tracing_check();
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tracing_spans_name_each_rung_taken",
            "--test-threads=1",
        ])
        .env("ROCM_SAFE_TRACING_CHILD", "1")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("1 passed"),
        "the child must run the check: {text}"
    );
}

fn tracing_check() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let (dev, _h) = faulty(FaultPlan::one(FaultKind::CopyLandsZeros, When::Always));
    let rec = Rungs::default();
    let loaded = tracing::subscriber::with_default(rec.clone(), || {
        let opts = small(Some(DType::F32)).with_self_test(false);
        Loader::new(&dev, opts)
            .unwrap()
            .load_names(&ckpt, &["a.bf16"])
            .unwrap()
    });
    assert_exact(&ckpt, &loaded);
    let spans = rec.0.lock().unwrap().clone();
    let rungs: Vec<&str> = spans.iter().map(|(_, r)| r.as_str()).collect();
    assert_eq!(
        rungs,
        [
            "pinned ring",
            "small chunks",
            "pageable",
            "cpu convert",
            "keep on host"
        ],
        "{spans:?}"
    );
    assert_eq!(spans[0].0, "transfer.ring");
    assert!(spans[1..].iter().all(|(n, _)| n == "transfer.rung"));
}

#[test]
fn a_file_removed_or_replaced_before_the_load_still_loads_what_was_opened() {
    let dir = tempfile::tempdir().unwrap();
    let path = mixed(dir.path());
    let ckpt = Checkpoint::open(&path).unwrap();
    let want: Vec<(String, Vec<u8>)> = ckpt
        .tensors()
        .map(|(_, t)| (t.name.clone(), ckpt.read_bytes(&t.name).unwrap()))
        .collect();
    // The loader reads through the descriptor the checkpoint validated (it
    // never opens a file again by name): removing the path, or renaming
    // another file over it, leaves those bytes alone, so the load gives
    // them, as `safetensors`' memory map would.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"not a safetensors file").unwrap();
    let dev = Device::host();
    let loaded = Loader::new(&dev, small(None))
        .unwrap()
        .load_all(&ckpt)
        .unwrap();
    assert_eq!(loaded.tensors.len(), want.len());
    for (name, bytes) in &want {
        let t = loaded.tensors.iter().find(|t| &t.name == name).unwrap();
        assert_eq!(&t.data.to_host().unwrap(), bytes, "tensor {name}");
    }
}

#[test]
fn a_declared_tensor_larger_than_memory_is_an_error_on_every_rung_not_an_abort() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.safetensors");
    // 1 TiB of bf16 (2 TiB as f32): beyond this machine's memory, so every
    // rung that would hold it on the host must refuse it, fallibly.
    sparse_bf16(&path, 1 << 39);
    let ckpt = Checkpoint::open(&path).unwrap();
    let dev = Device::host();
    let r = Loader::new(&dev, small(Some(DType::F32)))
        .unwrap()
        .load_all(&ckpt);
    match r {
        Err(e) => {
            let text = e.to_string();
            assert!(
                matches!(
                    e,
                    Error::AllocationFailed { .. } | Error::OutOfMemory { .. }
                ) || text.contains("larger than memory")
                    || text.contains("out of memory"),
                "{e:?}"
            );
        }
        Ok(loaded) => panic!("a 2 TiB tensor loaded?: {:?}", loaded.report),
    }
}
