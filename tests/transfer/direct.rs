//! The pinned ring's direct path (`LoadOptions::direct`): jobs of large
//! tensors copied straight from the checkpoint's registered page cache,
//! checked as every ring job, and served by the ring's reads where the
//! registration is refused. Over the host backend and `Faults` (the CUDA
//! runs are in `BENCHMARKS.md`, "Verified load").

use crate::common;

use rocm_safe::device::faults::{FaultKind, FaultPlan, FaultRule, When};
use rocm_safe::device::Device;
use rocm_safe::fallback::Failure;
use rocm_safe::safetensors::Checkpoint;
use rocm_safe::transfer::{LoadOptions, Loader, Rung};
use rocm_safe::DType;

use crate::common::faults::faulty;
use common::transfer::{assert_exact, dma, write, Dma};
use rocm_safe::device::host::HostBackend;

/// Large bf16 tensors (one spans several 2 MiB jobs), a mid-sized f32,
/// and small ones that share a job.
fn large(dir: &std::path::Path) -> std::path::PathBuf {
    write(
        dir,
        "large.safetensors",
        &[
            ("a.small", DType::BF16, vec![7, 9]),
            ("b.big", DType::BF16, vec![1024, 2600]),
            ("c.f32", DType::F32, vec![512, 700]),
            ("d.tiny", DType::F16, vec![33]),
            ("e.big", DType::BF16, vec![3000, 700]),
        ],
        5,
    )
}

fn opts(dtype: Option<DType>) -> LoadOptions {
    LoadOptions::default()
        .with_direct(true)
        .with_dtype(dtype)
        .with_ring_buffers(3)
        .with_buffer_bytes(2 << 20)
        .with_small_chunk_bytes(64 * 1024)
}

/// The big tensors' bytes: what the direct path should carry.
fn big_bytes(ckpt: &Checkpoint) -> u64 {
    ["b.big", "c.f32", "e.big"]
        .iter()
        .map(|n| ckpt.info(n).unwrap().num_bytes())
        .sum()
}

#[test]
fn large_tensors_go_direct_and_arrive_exact() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(large(dir.path())).unwrap();
    for dtype in [None, Some(DType::F32), Some(DType::F16)] {
        let mut l = Loader::new(&dma(), opts(dtype)).unwrap();
        let loaded = l.load_all(&ckpt).unwrap();
        assert_exact(&ckpt, &loaded);
        let d = &loaded.report.direct;
        // The big tensors the ring serves (a conversion without a device
        // kernel starts lower on the ladder) went direct, but for the
        // pieces that share a job with small tensors.
        let ring_big: u64 = (loaded.report.tensors.iter())
            .filter(|t| t.rung == Rung::PinnedRing && t.file_bytes >= 1 << 20)
            .map(|t| t.file_bytes)
            .sum();
        assert!(ring_big > 0 && ring_big <= big_bytes(&ckpt), "{dtype:?}");
        assert!(d.jobs >= 1, "{dtype:?}: {d:?}");
        assert!(
            d.bytes >= ring_big * 3 / 4,
            "{dtype:?}: {d:?} of {ring_big}"
        );
        assert!(d.bytes <= ckpt_bytes(&ckpt), "{dtype:?}: {d:?}");
        assert_eq!(d.refused, None);
        for t in &loaded.report.tensors {
            assert!(
                t.attempts.iter().all(|a| a.step != Rung::PinnedRing),
                "{}",
                t.name
            );
        }
        // A second load of the same loader goes direct again.
        let again = l.load_all(&ckpt).unwrap();
        assert_exact(&ckpt, &again);
        assert_eq!(again.report.direct.jobs, d.jobs);
    }
}

fn ckpt_bytes(ckpt: &Checkpoint) -> u64 {
    ["a.small", "b.big", "c.f32", "d.tiny", "e.big"]
        .iter()
        .map(|n| ckpt.info(n).unwrap().num_bytes())
        .sum()
}

#[test]
fn turned_off_or_small_tensors_only_take_the_reads() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(large(dir.path())).unwrap();
    let mut l = Loader::new(&dma(), opts(Some(DType::F32)).with_direct(false)).unwrap();
    let loaded = l.load_all(&ckpt).unwrap();
    assert_exact(&ckpt, &loaded);
    assert_eq!(loaded.report.direct.jobs, 0);
    // The default: off.
    let mut l = Loader::new(&dma(), LoadOptions::default()).unwrap();
    assert_eq!(l.load_all(&ckpt).unwrap().report.direct.jobs, 0);
    // A share: some jobs direct, the others read, all exact.
    let all = Loader::new(&dma(), opts(None))
        .unwrap()
        .load_all(&ckpt)
        .unwrap();
    let half = (Loader::new(&dma(), opts(None).with_direct_share(0.5)).unwrap())
        .load_all(&ckpt)
        .unwrap();
    assert_exact(&ckpt, &half);
    assert!(half.report.direct.jobs > 0, "{:?}", half.report.direct);
    assert!(
        half.report.direct.jobs < all.report.direct.jobs,
        "{:?}",
        half.report.direct
    );
    assert!(Loader::new(&dma(), opts(None).with_direct_share(1.5)).is_err());
    let (path, _) = common::transfer::tiny(dir.path(), 40);
    let tiny = Checkpoint::open(path).unwrap();
    let mut l = Loader::new(&dma(), opts(Some(DType::F32))).unwrap();
    let loaded = l.load_all(&tiny).unwrap();
    assert_exact(&tiny, &loaded);
    assert_eq!(loaded.report.direct.jobs, 0);
}

/// Every registration refused (a runtime without the read-only flag): the
/// ring's reads serve everything, exactly, and the report says why.
#[test]
fn a_refused_registration_falls_back_to_the_reads() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(large(dir.path())).unwrap();
    let (dev, h) = faulty(
        Dma(HostBackend::new()),
        FaultPlan::one(FaultKind::RegistrationRefused, When::Always),
    );
    let mut l = Loader::new(&dev, opts(Some(DType::F32))).unwrap();
    let loaded = l.load_all(&ckpt).unwrap();
    assert!(!h.injected().is_empty());
    assert_exact(&ckpt, &loaded);
    let d = &loaded.report.direct;
    assert_eq!((d.jobs, d.bytes), (0, 0));
    let why = d.refused.as_deref().unwrap_or_default();
    assert!(why.contains("read-only registration refused"), "{why}");
    for t in &loaded.report.tensors {
        assert_eq!(t.rung, Rung::PinnedRing, "{}", t.name);
        assert!(t.attempts.is_empty(), "{}", t.name);
    }
}

/// The first window registers, a later registration is refused: the jobs
/// already direct stay direct, the rest are read; all exact. (One window
/// here: a refusal on the second call can only come from a second load.)
#[test]
fn a_refusal_in_a_later_load_serves_that_load_by_reads() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(large(dir.path())).unwrap();
    let (dev, h) = faulty(
        Dma(HostBackend::new()),
        FaultPlan::one(FaultKind::RegistrationRefused, When::Nth(1)),
    );
    let mut l = Loader::new(&dev, opts(None)).unwrap();
    let first = l.load_all(&ckpt).unwrap();
    assert_exact(&ckpt, &first);
    assert!(first.report.direct.jobs > 0);
    assert!(first.report.direct.refused.is_none());
    let second = l.load_all(&ckpt).unwrap();
    assert!(!h.injected().is_empty());
    assert_exact(&ckpt, &second);
    assert_eq!(second.report.direct.jobs, 0);
    assert!(second.report.direct.refused.is_some());
}

/// Copies out of the registered pages that land zeros, garbage or stale
/// data, or that fail, are caught by the fingerprints and served by the
/// ladder, exactly.
#[test]
fn a_bad_direct_copy_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(large(dir.path())).unwrap();
    for kind in [
        FaultKind::CopyLandsZeros,
        FaultKind::CopyLandsGarbage,
        FaultKind::CopyZeroedRange,
        FaultKind::InvalidValueOnLargeCopy,
    ] {
        // Copies of more than 1 MiB are the direct path's (the ring's
        // reads serve only the small tensors here, in one copy).
        let (dev, h) = faulty(
            Dma(HostBackend::new()),
            FaultPlan {
                seed: 3,
                rules: vec![FaultRule {
                    kind,
                    when: When::Nth(1),
                }],
            },
        );
        let mut l = Loader::new(&dev, opts(Some(DType::F32))).unwrap();
        let loaded = l.load_all(&ckpt).unwrap();
        assert!(!h.injected().is_empty(), "{kind:?}");
        assert_exact(&ckpt, &loaded);
        assert!(loaded.report.direct.jobs > 0, "{kind:?}");
        let hit: Vec<_> = loaded
            .report
            .tensors
            .iter()
            .filter(|t| !t.attempts.is_empty())
            .collect();
        assert!(!hit.is_empty(), "{kind:?}: caught");
        for t in hit {
            assert_eq!(t.attempts[0].step, Rung::PinnedRing, "{kind:?}");
            assert!(
                matches!(
                    t.attempts[0].failure,
                    Failure::FingerprintMismatch { .. }
                        | Failure::Error(_)
                        | Failure::JobFailed { .. }
                ),
                "{kind:?}: {}",
                t.attempts[0].failure
            );
            assert_ne!(t.rung, Rung::PinnedRing, "{kind:?}: {}", t.name);
        }
    }
}

/// The host backend refuses registrations (its copies would read the
/// mapping with the CPU): the reads serve, the report says why, and a file
/// truncated after `open` is an error naming it, never `SIGBUS`. (On a GPU
/// a registration pins the pages, and one past the end is refused.)
#[test]
fn the_host_backend_refuses_and_a_truncated_file_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(large(dir.path())).unwrap();
    let mut l = Loader::new(&Device::host(), opts(Some(DType::F32))).unwrap();
    let loaded = l.load_all(&ckpt).unwrap();
    assert_exact(&ckpt, &loaded);
    assert_eq!(loaded.report.direct.jobs, 0);
    let why = loaded.report.direct.refused.clone().unwrap_or_default();
    assert!(why.contains("register_read_only"), "{why}");
    truncated();
}

fn truncated() {
    let dir = tempfile::tempdir().unwrap();
    let path = large(dir.path());
    let ckpt = Checkpoint::open(&path).unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len / 3).unwrap();
    let mut l = Loader::new(&Device::host(), opts(Some(DType::F32))).unwrap();
    let e = l.load_all(&ckpt).unwrap_err().to_string();
    assert!(e.contains("large.safetensors"), "{e}");
}

/// Tensors that cross the 64 MiB registration windows (and a 16 MiB job's
/// worth of small ones), for the GPU runs.
fn windows(dir: &std::path::Path) -> std::path::PathBuf {
    write(
        dir,
        "windows.safetensors",
        &[
            ("a.small", DType::BF16, vec![7, 9]),
            ("b.big", DType::BF16, vec![8192, 5000]),
            ("c.f32", DType::F32, vec![4096, 3000]),
            ("d.tiny", DType::F16, vec![33]),
            ("e.big", DType::BF16, vec![3000, 7001]),
        ],
        9,
    )
}

/// On a GPU: the default options take the direct path through several
/// windows, exactly, with nothing refused (the runtime has the read-only
/// flag: CUDA 11.1+, HIP where `hostRegisterReadOnlySupported`).
fn direct_on_a_gpu(dev: &Device) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(windows(dir.path())).unwrap();
    for dtype in [None, Some(DType::F32)] {
        let mut l = Loader::new(
            dev,
            LoadOptions::default().with_direct(true).with_dtype(dtype),
        )
        .unwrap();
        let loaded = l.load_all(&ckpt).unwrap();
        assert_exact(&ckpt, &loaded);
        let d = &loaded.report.direct;
        assert_eq!(d.refused, None, "{dtype:?}");
        assert!(d.bytes >= big_bytes_of(&ckpt) * 9 / 10, "{dtype:?}: {d:?}");
        for t in &loaded.report.tensors {
            assert_eq!(t.rung, Rung::PinnedRing, "{}", t.name);
            assert!(t.attempts.is_empty(), "{}", t.name);
        }
    }
}

fn big_bytes_of(ckpt: &Checkpoint) -> u64 {
    ["b.big", "c.f32", "e.big"]
        .iter()
        .map(|n| ckpt.info(n).unwrap().num_bytes())
        .sum()
}

/// On a GPU, through `Faults`: a refused registration is served by the
/// reads, and a direct copy that lands zeros is caught; exact either way.
fn direct_faults_on_a_gpu(open: common::Open<'_>) {
    use rocm_safe::device::faults::Faults;
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(windows(dir.path())).unwrap();
    for (kind, when) in [
        (FaultKind::RegistrationRefused, When::Always),
        (FaultKind::CopyLandsZeros, When::Nth(3)),
    ] {
        let (f, h) = Faults::new(open(), FaultPlan::one(kind, when));
        let dev = Device::from_backend(Box::new(f));
        let mut l = Loader::new(&dev, LoadOptions::to_dtype(DType::F32).with_direct(true)).unwrap();
        let loaded = l.load_all(&ckpt).unwrap();
        assert!(!h.injected().is_empty(), "{kind:?}");
        assert_exact(&ckpt, &loaded);
        let d = &loaded.report.direct;
        match kind {
            FaultKind::RegistrationRefused => {
                assert_eq!(d.jobs, 0);
                assert!(d.refused.is_some());
            }
            _ => {
                assert!(d.jobs > 0);
                let caught = loaded
                    .report
                    .tensors
                    .iter()
                    .any(|t| t.attempts.iter().any(|a| a.step == Rung::PinnedRing));
                assert!(caught, "{kind:?}");
            }
        }
    }
}

per_device!(gpu_only: direct_on_a_gpu, direct_faults_on_a_gpu);
