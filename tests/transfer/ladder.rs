//! The transfer pipeline's ladder on the host backend and on
//! `Faults<host>`: every fault mode is detected and served by the next rung
//! with bit-exact data, out of memory, forced rungs, fail-fast, the rungs
//! named in tracing spans, and a seeded campaign of 1000 trials (clean
//! loads, requests, budgets, progress, concurrent loads and files changed
//! under a load: `tests/transfer/loads.rs`).

use crate::common;
use crate::common::faults::faulty;

use rocm_safe::device::faults::{FaultKind, FaultPlan, FaultRule, Faults, When};
use rocm_safe::device::{host::HostBackend, raw::Backend, ConvertOp, Device};
use rocm_safe::fallback::{Check, Failure};
use rocm_safe::safetensors::Checkpoint;
use rocm_safe::transfer::{Fallback, Loader, Rung};
use rocm_safe::verify::{self, Policy};
use rocm_safe::{DType, Error};

use common::transfer::{assert_exact, assert_widened, mixed, roomy, small, tiny, write};
use common::{Open, Rng};

per_device!(
    faults_are_caught,
    zeros_in_a_slot_of_many_pieces_send_each_piece_down,
);

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
    let (dev, h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Always),
    );
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
    let (dev, _h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Nth(first_output)),
    );
    let loaded = Loader::new(&dev, opts.clone())
        .unwrap()
        .load_all(&ckpt)
        .unwrap();
    assert_exact(&ckpt, &loaded);
    let first = &loaded.report.tensors[0];
    assert!(first.oom_retried);
    assert_eq!(first.rung, Rung::PinnedRing);
    // Every allocation fails: everything stays on the host.
    let (dev, _h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Always),
    );
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
    let (dev, h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::OutOfMemoryOnAlloc, When::Nth(0)),
    );
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
    let (dev, _h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::CopyLandsGarbage, When::Always),
    );
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
    let (dev, _h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::InvalidValueOnCopy, When::Always),
    );
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
        let (dev, h) = faulty(HostBackend::new(), FaultPlan { seed: trial, rules });
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
            &crate::common::listed(module_path!(), "tracing_spans_name_each_rung_taken"),
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
    let (dev, _h) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Always),
    );
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
