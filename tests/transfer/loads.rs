//! The loader on the host backend (and, for the `per_device!` tests, on a
//! GPU with `--ignored`): clean loads exact in every policy, row slices and
//! names, bad requests and options, fills at a time, memory budgets and
//! offloading, progress, concurrent loads, tiny tensors past a slot's piece
//! limit, and files truncated, removed or replaced, or declaring more than
//! memory (faults and the ladder's rungs: `tests/transfer/ladder.rs`).

use crate::common;
use crate::common::faults::faulty;
use rocm_safe::device::host::HostBackend;

use rocm_safe::device::faults::{FaultKind, FaultPlan, FaultRule, When};
use rocm_safe::device::{ConvertOp, Device};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{Fallback, Loader, Request, Rung};
use rocm_safe::verify::Policy;
use rocm_safe::{DType, Error};

use common::transfer::{assert_exact, assert_widened, mixed, roomy, small, tiny, write};
use common::{sparse_bf16, Rng};

per_device!(
    clean_load_is_exact,
    slices_of_later_dimensions_are_exact,
    tiny_tensors_past_256_per_slot_are_exact_on_the_ring,
);

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

/// The CPU's answer for a slice: the whole tensor's bytes cut to indices
/// `range` of dimension `dim` (outer runs of the slice's bytes), then
/// converted to `to`.
fn sliced(
    ckpt: &Checkpoint,
    name: &str,
    dim: usize,
    range: std::ops::Range<u64>,
    to: DType,
) -> Vec<u8> {
    let info = ckpt.info(name).unwrap();
    let size = info.dtype.size().unwrap() as u64;
    let inner: u64 = info.shape[dim + 1..].iter().product();
    let outer: u64 = info.shape[..dim].iter().product();
    let (row, run) = (
        info.shape[dim] * inner * size,
        (range.end - range.start) * inner * size,
    );
    let all = ckpt.read_bytes(name).unwrap();
    let mut raw = Vec::new();
    for o in 0..outer {
        let at = (o * row + range.start * inner * size) as usize;
        raw.extend_from_slice(&all[at..at + run as usize]);
    }
    if to == info.dtype {
        return raw;
    }
    let n = raw.len() / size as usize;
    let mut out = vec![0u8; n * to.size().unwrap()];
    rocm_safe::convert::convert_bytes(info.dtype, &raw, to, &mut out).unwrap();
    out
}

/// A checkpoint for slices, and the slices asked of it.
type Ask = (&'static str, usize, std::ops::Range<u64>);
fn sliceable(dir: &std::path::Path) -> (Checkpoint, Vec<Ask>) {
    let path = write(
        dir,
        "tp.safetensors",
        &[
            ("w", DType::BF16, vec![96, 1000]),
            ("c", DType::F32, vec![3, 5, 40, 7]),
            ("h", DType::F16, vec![4, 2048]),
        ],
        5,
    );
    let asks = vec![
        ("w", 1, 250..750),
        ("c", 2, 10..31),
        ("c", 3, 6..7),
        ("h", 1, 1024..2048),
        ("w", 0, 3..9),
        ("c", 1, 0..5),
    ];
    (Checkpoint::open(&path).unwrap(), asks)
}

fn slice_requests(asks: &[Ask]) -> Vec<Request> {
    asks.iter()
        .map(|(n, d, r)| Request::slice(*n, *d, r.clone()))
        .collect()
}

/// Each loaded slice has the slice's shape and the CPU's bytes.
fn assert_sliced(ckpt: &Checkpoint, asks: &[Ask], loaded: &rocm_safe::transfer::Loaded) {
    assert_eq!(loaded.tensors.len(), asks.len());
    for (t, (n, d, r)) in loaded.tensors.iter().zip(asks) {
        let mut shape = ckpt.info(n).unwrap().shape.clone();
        shape[*d] = r.end - r.start;
        assert_eq!((t.name.as_str(), &t.shape), (*n, &shape));
        let want = sliced(ckpt, n, *d, r.clone(), t.dtype);
        assert_eq!(
            t.data.to_host().unwrap(),
            want,
            "{n} dim {d} {r:?} as {:?}",
            t.dtype
        );
    }
}

/// Slices of later dimensions (a tensor-parallel rank's columns) load as
/// contiguous tensors of the slice's shape, exact in every policy, as
/// stored or converted, with runs that cross the ring's buffers.
fn slices_of_later_dimensions_are_exact(dev: &Device) {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, asks) = sliceable(dir.path());
    let reqs = slice_requests(&asks);
    for dtype in [None, Some(DType::F32), Some(DType::BF16)] {
        for policy in [
            Policy::Fingerprint,
            Policy::FusedFingerprint,
            Policy::ReadBack,
            Policy::Off,
        ] {
            let mut l = Loader::new(dev, small(dtype).with_policy(policy)).unwrap();
            let loaded = l.load(&ckpt, &reqs).unwrap();
            assert_sliced(&ckpt, &asks, &loaded);
            for t in &loaded.report.tensors {
                // f16 -> bf16 has no device kernel: the CPU rung, routed.
                let want = match t.routed {
                    None => Rung::PinnedRing,
                    Some(_) => Rung::CpuConvert,
                };
                assert_eq!(t.rung, want, "{} {dtype:?} {policy:?}", t.name);
                assert!(t.attempts.is_empty(), "{t}");
            }
            assert!(
                loaded.report.ring_jobs >= 3,
                "the runs span several buffers"
            );
        }
    }
}

/// Faults that zero every copy send slices down the ladder, each rung
/// reading the runs again: still exact. Bad slices are their errors.
#[test]
fn slices_under_faults_and_bad_slices() {
    let dir = tempfile::tempdir().unwrap();
    let (ckpt, asks) = sliceable(dir.path());
    let reqs = slice_requests(&asks);
    let (dev, h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Always),
    );
    let opts = small(Some(DType::F32)).with_self_test(false);
    let loaded = Loader::new(&dev, opts).unwrap().load(&ckpt, &reqs).unwrap();
    assert!(!h.injected().is_empty());
    assert_sliced(&ckpt, &asks, &loaded);
    for t in &loaded.report.tensors {
        assert_eq!(t.rung, Rung::KeepOnHost, "{}", t.name);
        assert!(!t.attempts.is_empty(), "{t}");
    }
    // Bad slices: a dimension the tensor lacks, a range past it.
    let mut l = Loader::new(&Device::host(), small(None)).unwrap();
    assert!(matches!(
        l.load(&ckpt, &[Request::slice("w", 2, 0..1)]),
        Err(Error::SliceDim { dim: 2, .. })
    ));
    assert!(matches!(
        l.load(&ckpt, &[Request::slice("c", 3, 6..8)]),
        Err(Error::RowRange {
            end: 8,
            rows: 7,
            ..
        })
    ));
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
    let (dev, _h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Nth(2)),
    );
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
    let (dev, h) = faulty(
        HostBackend::new(),
        FaultPlan {
            seed: 3,
            rules: vec![FaultRule {
                kind: FaultKind::CopyLandsGarbage,
                when: When::Random {
                    per_million: 50_000,
                },
            }],
        },
    );
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
