//! The conv3d chain: tier order, skip-vs-fail, fall-through on errors and
//! failed checks (each counted by kind), force/forbid options, reports,
//! statistics, and typed errors for calls no tier serves. Misbehaving tiers
//! are the real device tiers of the host device under `Faults` where a
//! fault kind exists (tests/conv3d/faults.rs has one per tier), and test
//! doubles wrapping the CPU tier for the precise corruptions (an infinity
//! at the last point, one zeroed point) the chain's checks must catch.

use crate::common;
use crate::common::faults::faulty;

use common::conv3d::{cases, Data};
use rocm_safe::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::conv3d_chain::{
    device_tiers, Conv3dChain, Conv3dOptions, Conv3dReport, Conv3dTier, CpuTier, Support, TierKind,
    UnavailableTier,
};
use rocm_safe::device::faults::{FaultKind, When};
use rocm_safe::device::host::HostBackend;
use rocm_safe::device::{Conv3dKernel, Device};
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::{DType, Error};

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// Computes correctly (the CPU tier under another kind).
    Good,
    /// Returns an error.
    Fails,
    /// Writes a NaN at the middle point.
    Nan,
    /// Writes an infinity at the last point.
    Inf,
    /// Adds 1 to every point.
    OffByOne,
    /// Zeroes the last point only.
    LastZero,
    /// Says it does not support the call.
    Unsupported,
}

struct Fake {
    kind: TierKind,
    name: &'static str,
    mode: Mode,
}

impl Conv3dTier for Fake {
    fn kind(&self) -> TierKind {
        self.kind
    }
    fn name(&self) -> &str {
        self.name
    }
    fn support(&self, _: &Conv3dProblem<'_>) -> Support {
        match self.mode {
            Mode::Unsupported => Support::Unsupported("the fake takes nothing".into()),
            _ => Support::Yes,
        }
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> rocm_safe::Result<()> {
        if let Mode::Fails = self.mode {
            return Err(Error::Conv3dTier {
                tier: "fake",
                reason: "injected failure",
            });
        }
        CpuTier.run(p, out)?;
        let n = out.len();
        match self.mode {
            Mode::Nan => out[n / 2] = f32::NAN,
            Mode::Inf => out[n - 1] = f32::INFINITY,
            Mode::OffByOne => out.iter_mut().for_each(|v| *v += 1.0),
            Mode::LastZero => out[n - 1] = 0.0,
            _ => {}
        }
        Ok(())
    }
}

fn fake(kind: TierKind, name: &'static str, mode: Mode) -> Box<dyn Conv3dTier> {
    Box::new(Fake { kind, name, mode })
}

/// "k3 p1": bias, 3 output channels, 630 points.
fn data() -> (common::conv3d::Case, Data) {
    let case = cases()[0].clone();
    let data = Data::new(&case);
    (case, data)
}

/// The default chain's order; without a GPU tier in the build (default
/// features) every GPU tier is skipped as unavailable and the CPU serves.
/// With `cuda`, tests/conv3d/tiers.rs covers the GPU serving.
#[test]
fn default_chain_order_and_cpu_serves_without_gpu() {
    let (case, data) = data();
    let mut chain = Conv3dChain::first_gpu();
    let kinds: Vec<TierKind> = chain.tiers().into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds, TierKind::ALL);
    if cfg!(feature = "cuda") {
        // Behave as a machine without a GPU would: GPU kinds forbidden.
        chain.options_mut().forbid = vec![TierKind::Vendor, TierKind::Tiled, TierKind::Naive];
    }
    let p = data.problem(&case, false);
    let (out, report) = chain.run(&p).unwrap();
    common::conv3d::assert_close("chain", &p, &out, 1e-5);
    assert_eq!(report.served_by(), Some(TierKind::Cpu));
    assert_eq!(report.attempts.len(), 4);
    for a in &report.attempts[..3] {
        assert!(
            matches!(&a.outcome, Outcome::Skipped(why) if why.starts_with("unavailable") || why.starts_with("forbidden")),
            "{:?}",
            a.outcome
        );
    }
    assert_eq!(report.failures().count(), 0);
    let stats = chain.stats();
    assert_eq!(stats.len(), 4);
    assert_eq!((stats[0].skips, stats[0].attempts), (1, 0));
    assert_eq!((stats[3].attempts, stats[3].successes), (1, 1));
    let text = report.to_string();
    assert!(
        text.contains(": skipped (") && text.contains("cpu: served"),
        "{text}"
    );
    if cfg!(feature = "hip") && !cfg!(feature = "cuda") {
        // The hip build (no AMD device here) says why its GPU tiers are
        // missing.
        assert!(text.contains("unavailable: no gpu device (hip: "), "{text}");
    } else if !cfg!(feature = "cuda") {
        assert!(
            text.contains("built without the `hip` and `cuda` features"),
            "{text}"
        );
    }
}

#[test]
fn every_failure_falls_through_and_is_counted_by_kind() {
    let (case, data) = data();
    let chain = Conv3dChain::with_tiers(
        vec![
            fake(TierKind::Vendor, "failing", Mode::Fails),
            fake(TierKind::Vendor, "unsupported", Mode::Unsupported),
            fake(TierKind::Tiled, "nan", Mode::Nan),
            fake(TierKind::Tiled, "inf", Mode::Inf),
            fake(TierKind::Naive, "off-by-one", Mode::OffByOne),
            fake(TierKind::Naive, "last-zero", Mode::LastZero),
            Box::new(CpuTier),
        ],
        Conv3dOptions::default(),
    );
    for bf16 in [false, true] {
        let p = data.problem(&case, bf16);
        let (out, report) = chain.run(&p).unwrap();
        common::conv3d::assert_close("fall-through", &p, &out, 1e-5);
        assert_eq!(report.served_by(), Some(TierKind::Cpu));
        let failures: Vec<(&str, &Failure)> = report
            .failures()
            .map(|(a, f)| (a.name.as_str(), f))
            .collect();
        assert_eq!(failures.len(), 5, "{report}");
        assert!(matches!(
            failures[0],
            ("failing", Failure::Error(Error::Conv3dTier { .. }))
        ));
        let n = p.geometry.output_len();
        assert!(
            matches!(failures[1], ("nan", Failure::NonFinite { index, .. }) if *index == n / 2)
        );
        assert!(
            matches!(failures[2], ("inf", Failure::NonFinite { index, value }) if *index == n - 1 && value.is_infinite())
        );
        assert!(matches!(
            failures[3],
            ("off-by-one", Failure::ValueMismatch { .. })
        ));
        assert!(
            matches!(failures[4], ("last-zero", Failure::ValueMismatch { index, .. }) if *index == n - 1)
        );
        assert!(
            matches!(&report.attempts[1].outcome, Outcome::Skipped(w) if w.starts_with("unsupported"))
        );
    }
    let s = chain.stats();
    let by_name = |n: &str| s.iter().find(|t| t.name == n).unwrap().clone();
    assert_eq!(
        (by_name("failing").attempts, by_name("failing").errors),
        (2, 2)
    );
    assert_eq!(
        (
            by_name("unsupported").attempts,
            by_name("unsupported").skips
        ),
        (0, 2)
    );
    assert_eq!(by_name("nan").non_finite, 2);
    assert_eq!(by_name("inf").non_finite, 2);
    assert_eq!(by_name("off-by-one").mismatches, 2);
    assert_eq!(by_name("last-zero").mismatches, 2);
    assert_eq!((by_name("cpu").attempts, by_name("cpu").successes), (2, 2));
    assert!(by_name("cpu").time > std::time::Duration::ZERO);
    assert_eq!(by_name("failing").successes + by_name("nan").successes, 0);
}

#[test]
fn checks_off_let_a_corrupt_tier_serve() {
    // Shows the checks are what catches corruption: the naive kernel's NaN
    // (3 output channels: the tiled kernel declines) is served.
    let (case, data) = data();
    let options = Conv3dOptions::default()
        .with_verify_samples(0)
        .with_scan_non_finite(false);
    let dev = faulty(
        HostBackend::new(),
        (FaultKind::Conv3dWritesNonFinite, When::Always),
    )
    .0;
    let chain = Conv3dChain::with_tiers(device_tiers(&dev), options);
    let p = data.problem(&case, false);
    let (out, report) = chain.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
    assert_eq!(out.iter().filter(|v| v.is_nan()).count(), 1);
}

#[test]
fn non_finite_inputs_are_not_a_tier_failure() {
    let (case, mut data) = data();
    data.x[0] = f32::NAN;
    let chain = Conv3dChain::for_device(&Device::host());
    let p = data.problem(&case, false);
    let (out, report) = chain.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
    assert_eq!(report.failures().count(), 0);
    assert!(out[0].is_nan());
}

#[test]
fn force_runs_only_that_kind() {
    let (case, data) = data();
    let p = data.problem(&case, false);
    let dev = faulty(
        HostBackend::new(),
        (FaultKind::Conv3dLaunchFailure, When::Always),
    )
    .0;
    let mut chain = Conv3dChain::for_device(&dev);
    chain.options_mut().force = Some(TierKind::Cpu);
    let (_, report) = chain.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Cpu));
    for a in &report.attempts[..3] {
        assert!(
            matches!(&a.outcome, Outcome::Skipped(w) if w == "not the forced tier"),
            "{report}"
        );
    }

    // Forcing a failing tier fails fast: no fallback to the CPU.
    chain.options_mut().force = Some(TierKind::Naive);
    let e = chain.run(&p).unwrap_err();
    let Some(report) = Conv3dReport::of(&e) else {
        panic!("{e}")
    };
    assert_eq!(report.failures().count(), 1);
    assert!(
        matches!(&report.attempts[3].outcome, Outcome::Skipped(w) if w == "not the forced tier")
    );
    assert!(
        e.to_string()
            .contains("naive: failed (error: conv3d: injected fault: conv3d launch failure)"),
        "{e}"
    );
    let stats = chain.stats();
    assert_eq!((stats[2].attempts, stats[2].errors), (1, 1));
    assert_eq!((stats[3].attempts, stats[3].successes), (1, 1));

    // Test doubles: a forced tier is the only one run, whatever its kind.
    let tiers = vec![
        fake(TierKind::Vendor, "failing", Mode::Fails),
        fake(TierKind::Tiled, "good", Mode::Good),
        Box::new(CpuTier) as Box<dyn Conv3dTier>,
    ];
    let mut chain = Conv3dChain::with_tiers(tiers, Conv3dOptions::default());
    chain.options_mut().force = Some(TierKind::Tiled);
    let (_, report) = chain.run(&p).unwrap();
    assert_eq!(report.served().unwrap().name, "good");
    chain.options_mut().force = Some(TierKind::Vendor);
    let e = chain.run(&p).unwrap_err();
    assert!(
        e.to_string()
            .contains("failing: failed (error: conv3d tier fake: injected failure)"),
        "{e}"
    );
}

/// The chain of the host device serves every case of the table in both
/// dtypes: the tiled kernel where it takes the parameters, else the naive
/// one, the CPU only for zero-size calls; the vendor tier is skipped.
#[test]
fn host_device_chain_serves_every_case() {
    let chain = Conv3dChain::for_device(&Device::host());
    let names: Vec<String> = chain.tiers().into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["vendor", "tiled", "naive", "cpu"]);
    let mut served = std::collections::HashMap::new();
    for case in cases() {
        let data = Data::new(&case);
        for bf16 in [false, true] {
            let p = data.problem(&case, bf16);
            let (out, report) = chain.run(&p).unwrap();
            common::conv3d::assert_close(case.name, &p, &out, 1e-5);
            let by = report.served_by().unwrap();
            let expected = if Conv3dKernel::Naive.unsupported(&p.geometry).is_some() {
                TierKind::Cpu
            } else if Conv3dKernel::Tiled.unsupported(&p.geometry).is_none() {
                TierKind::Tiled
            } else {
                TierKind::Naive
            };
            assert_eq!(by, expected, "{}: {report}", case.name);
            assert!(
                matches!(&report.attempts[0].outcome, Outcome::Skipped(w) if w.starts_with("unavailable"))
            );
            *served.entry(by).or_insert(0) += 1;
        }
    }
    assert!(
        served[&TierKind::Tiled] >= 12 && served[&TierKind::Naive] >= 12,
        "{served:?}"
    );
    assert_eq!(served[&TierKind::Cpu], 6);
    assert_eq!(chain.stats()[0].skips, 2 * cases().len() as u64);
}

#[test]
fn forbid_skips_kinds_and_no_tier_left_is_a_typed_error() {
    let (case, data) = data();
    let p = data.problem(&case, true);
    let mut chain = Conv3dChain::first_gpu();
    // Every kind forbidden (on a default build the GPU tiers would be
    // skipped as unavailable anyway).
    chain.options_mut().forbid = TierKind::ALL.to_vec();
    let e = chain.run(&p).unwrap_err();
    let Some(report) = Conv3dReport::of(&e) else {
        panic!("{e}")
    };
    assert!(report.served().is_none());
    assert!(
        matches!(&report.attempts[3].outcome, Outcome::Skipped(w) if w == "forbidden by the options")
    );
    assert_eq!(chain.stats()[3].skips, 1);
}

#[test]
fn parameters_no_tier_supports_are_a_typed_error() {
    let (case, data) = data();
    let p = data.problem(&case, false);
    let chain = Conv3dChain::with_tiers(
        vec![
            fake(TierKind::Tiled, "unsupported", Mode::Unsupported),
            Box::new(UnavailableTier {
                kind: TierKind::Naive,
                reason: "no device".into(),
            }),
        ],
        Conv3dOptions::default(),
    );
    let e = chain.run(&p).unwrap_err();
    assert!(
        Conv3dReport::of(&e).is_some_and(|r| r.failures().count() == 0),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("unsupported: skipped (unsupported: the fake takes nothing)"),
        "{text}"
    );
    assert!(
        text.contains("naive: skipped (unavailable: no device)"),
        "{text}"
    );
    assert!(UnavailableTier {
        kind: TierKind::Naive,
        reason: String::new()
    }
    .run(&p, &mut [])
    .is_err());
    let empty = Conv3dChain::with_tiers(Vec::new(), Conv3dOptions::default());
    let e = empty.run(&p).unwrap_err();
    assert!(e.to_string().contains("no tiers"), "{e}");
}

#[test]
fn run_into_checks_the_output_length() {
    let (case, data) = data();
    let p = data.problem(&case, false);
    let mut out = vec![0f32; 3];
    let e = Conv3dChain::first_gpu().run_into(&p, &mut out).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d output",
                expected: 630,
                actual: 3,
                tensor: None,
            }
        ),
        "{e}"
    );
}

#[test]
fn empty_outputs_are_served() {
    for case in cases()
        .iter()
        .filter(|c| c.name.starts_with("empty") || c.name.starts_with("no output"))
    {
        let data = Data::new(case);
        let p = data.problem(case, false);
        let (out, report) = Conv3dChain::first_gpu().run(&p).unwrap();
        assert!(out.is_empty());
        assert_eq!(report.served_by(), Some(TierKind::Cpu), "{}", case.name);
    }
}

#[test]
fn tier_kind_names_round_trip() {
    for k in TierKind::ALL {
        assert_eq!(k.name().parse::<TierKind>(), Ok(k));
        assert_eq!(k.to_string(), k.name());
    }
    assert!("gpu".parse::<TierKind>().is_err());
    let custom = TierKind::Custom("winograd");
    assert_eq!(custom.name(), "winograd");
    assert_eq!(custom.to_string(), "winograd");
    assert!(!custom.is_builtin() && TierKind::ALL.iter().all(|k| k.is_builtin()));
    // A custom kind's name does not parse: its `&'static str` is the tier's.
    assert!("winograd".parse::<TierKind>().is_err());
}

/// A tier written outside the crate claims no built-in kind: forced,
/// forbidden, counted and reported as itself, the built-in tiers unaffected.
#[test]
fn custom_tiers_are_forced_forbidden_counted_and_reported_by_their_own_kind() {
    let (case, data) = data();
    let p = data.problem(&case, false);
    let wino = TierKind::Custom("winograd");
    let tiers = || {
        vec![
            fake(TierKind::Custom("fft"), "fft-broken", Mode::Fails),
            fake(wino, "winograd-v1", Mode::Good),
            Box::new(CpuTier) as Box<dyn Conv3dTier>,
        ]
    };
    let chain = Conv3dChain::with_tiers(tiers(), Conv3dOptions::default());
    assert_eq!(
        chain.tiers()[..2],
        [
            (TierKind::Custom("fft"), "fft-broken".to_owned()),
            (wino, "winograd-v1".to_owned())
        ]
    );
    let (_, report) = chain.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(wino));
    assert_eq!(report.served().unwrap().name, "winograd-v1");
    assert!(
        report.to_string().contains("fft-broken: failed"),
        "{report}"
    );
    let stats = chain.stats();
    assert_eq!(stats[0].name, "fft-broken");
    assert_eq!((stats[0].attempts, stats[0].errors), (1, 1));
    assert_eq!(stats[1].name, "winograd-v1");
    assert_eq!((stats[1].attempts, stats[1].successes), (1, 1));
    assert_eq!(stats[2].attempts, 0);

    // Forbidding the custom kind falls through to the CPU; the other
    // custom kind still runs (and fails).
    let chain = Conv3dChain::with_tiers(tiers(), Conv3dOptions::default().with_forbid(wino));
    let (_, report) = chain.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Cpu));
    assert!(
        matches!(&report.attempts[1].outcome, Outcome::Skipped(w) if w == "forbidden by the options"),
        "{report}"
    );
    assert_eq!(report.failures().count(), 1);

    // Forcing it runs it alone; forcing a built-in kind skips both custom tiers.
    let chain = Conv3dChain::with_tiers(tiers(), Conv3dOptions::default().with_force(wino));
    let (_, report) = chain.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(wino));
    assert_eq!(report.failures().count(), 0);
    let chain =
        Conv3dChain::with_tiers(tiers(), Conv3dOptions::default().with_force(TierKind::Cpu));
    let (_, report) = chain.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Cpu));
    for a in &report.attempts[..2] {
        assert!(matches!(&a.outcome, Outcome::Skipped(w) if w == "not the forced tier"));
    }
}

// ----- validation: one test per error path -------------------------------

fn try_new(
    params: Conv3dParams,
    input: &[usize],
    weight: &[usize],
    bias: Option<usize>,
) -> rocm_safe::Result<()> {
    let x = vec![
        0f32;
        input
            .iter()
            .fold(1usize, |a, &d| a.saturating_mul(d))
            .min(1 << 20)
    ];
    let w = vec![
        0f32;
        weight
            .iter()
            .fold(1usize, |a, &d| a.saturating_mul(d))
            .min(1 << 20)
    ];
    let b = vec![0f32; bias.unwrap_or(0)];
    Conv3dProblem::new(
        params,
        Conv3dData::F32(&x),
        input,
        Conv3dData::F32(&w),
        weight,
        bias.map(|_| Conv3dData::F32(&b)),
    )
    .map(|_| ())
}

#[test]
fn invalid_parameters_are_typed_errors() {
    let d = Conv3dParams::default();
    let (i, w) = ([1, 2, 4, 4, 4], [2, 2, 3, 3, 3]);
    let param = |e: Error| match e {
        Error::Conv3dParam { param, .. } => param,
        other => panic!("{other}"),
    };
    assert_eq!(
        param(try_new(d.with_stride([1, 0, 1]), &i, &w, None).unwrap_err()),
        "stride"
    );
    assert_eq!(
        param(try_new(d.with_dilation([0, 1, 1]), &i, &w, None).unwrap_err()),
        "dilation"
    );
    assert_eq!(
        param(try_new(d.with_groups(0), &i, &w, None).unwrap_err()),
        "groups"
    );
}

#[test]
fn invalid_shapes_are_typed_errors() {
    let d = Conv3dParams::default();
    let reason = |r: rocm_safe::Result<()>| match r.unwrap_err() {
        Error::Conv3dShape { tensor, reason, .. } => (tensor, reason),
        other => panic!("{other}"),
    };
    let i = [1, 4, 4, 4, 4];
    assert_eq!(
        reason(try_new(d, &[1, 4, 4, 4], &[2, 4, 1, 1, 1], None)).0,
        "input"
    );
    assert_eq!(reason(try_new(d, &i, &[2, 4, 1, 1], None)).0, "weight");
    assert!(reason(try_new(
        d.with_groups(3),
        &[1, 4, 2, 2, 2],
        &[3, 1, 1, 1, 1],
        None
    ))
    .1
    .contains("channels not divisible"));
    assert!(
        reason(try_new(d.with_groups(2), &i, &[3, 2, 1, 1, 1], None))
            .1
            .contains("output channels")
    );
    assert!(
        reason(try_new(d.with_groups(2), &i, &[2, 4, 1, 1, 1], None))
            .1
            .contains("input channels / groups")
    );
    assert!(reason(try_new(d, &i, &[2, 4, 0, 1, 1], None))
        .1
        .contains("at least 1"));
    assert!(reason(try_new(d, &i, &[2, 4, 5, 1, 1], None))
        .1
        .contains("larger than the padded"));
    assert!(reason(try_new(
        d.with_dilation([1, 1, 2]),
        &i,
        &[2, 4, 1, 1, 3],
        None
    ))
    .1
    .contains("larger than the padded"));
    assert!(reason(try_new(
        d.with_padding([usize::MAX, 0, 0]),
        &i,
        &[2, 4, 1, 1, 1],
        None
    ))
    .1
    .contains("overflow"));
    assert!(reason(try_new(
        d.with_dilation([usize::MAX, 1, 1]),
        &i,
        &[2, 4, 3, 1, 1],
        None
    ))
    .1
    .contains("overflow"));
    assert!(reason(try_new(
        d,
        &[usize::MAX, 4, 4, 4, 4],
        &[2, 4, 1, 1, 1],
        None
    ))
    .1
    .contains("overflow"));
    // Padding makes a kernel larger than the input fit (PyTorch agrees).
    try_new(d.with_padding([2, 0, 0]), &i, &[2, 4, 5, 1, 1], None).unwrap();
}

#[test]
fn wrong_lengths_and_dtypes_are_typed_errors() {
    let x = vec![0f32; 8];
    let w = vec![0f32; 2];
    let wb = vec![half::bf16::ZERO; 2];
    let b = vec![0f32; 3];
    let new = |xs: Conv3dData<'_>, ws: Conv3dData<'_>, bs: Option<Conv3dData<'_>>| {
        Conv3dProblem::new(
            Conv3dParams::default(),
            xs,
            &[1, 1, 2, 2, 2],
            ws,
            &[2, 1, 1, 1, 1],
            bs,
        )
        .map(|_| ())
    };
    let e = new(Conv3dData::F32(&x), Conv3dData::BF16(&wb), None).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dDType {
                tensor: "weight",
                dtype: DType::BF16,
                expected: DType::F32
            }
        ),
        "{e}"
    );
    let e = new(Conv3dData::F32(&x[..7]), Conv3dData::F32(&w), None).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d input",
                expected: 8,
                actual: 7,
                tensor: None,
            }
        ),
        "{e}"
    );
    let e = new(Conv3dData::F32(&x), Conv3dData::F32(&w[..1]), None).unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d weight",
                ..
            }
        ),
        "{e}"
    );
    let e = new(
        Conv3dData::F32(&x),
        Conv3dData::F32(&w),
        Some(Conv3dData::F32(&b)),
    )
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::LengthMismatch {
                op: "conv3d bias",
                expected: 2,
                actual: 3,
                tensor: None,
            }
        ),
        "{e}"
    );
    // A bf16 bias with f32 data is fine (widened exactly).
    let bb = vec![half::bf16::from_f32(0.5); 2];
    new(
        Conv3dData::F32(&x),
        Conv3dData::F32(&w),
        Some(Conv3dData::BF16(&bb)),
    )
    .unwrap();
}

#[test]
fn the_cpu_chain_serves_on_the_cpu_tier_and_names_say_where_they_look() {
    let x: Vec<f32> = (0..2 * 4 * 4 * 4).map(|i| (i % 7) as f32 * 0.25).collect();
    let w: Vec<f32> = (0..3 * 2 * 27)
        .map(|i| (i % 5) as f32 * 0.1 - 0.2)
        .collect();
    let p = Conv3dProblem::new(
        Conv3dParams::default().with_padding([1, 1, 1]),
        Conv3dData::F32(&x),
        &[1, 2, 4, 4, 4],
        Conv3dData::F32(&w),
        &[3, 2, 3, 3, 3],
        None,
    )
    .unwrap();
    let cpu = Conv3dChain::cpu();
    assert_eq!(cpu.tiers(), vec![(TierKind::Cpu, "cpu".to_owned())]);
    let (out, report) = cpu.run(&p).unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Cpu));
    let want = rocm_safe::conv3d::reference(&p);
    for (o, r) in out.iter().zip(&want) {
        assert!(
            (f64::from(*o) - r).abs() <= 1e-5 * (1.0 + r.abs()),
            "{o} vs {r}"
        );
    }
    // The first-GPU chain has the GPU tiers first (unavailable without a
    // GPU, so the CPU tier serves here) and the CPU tier last.
    let first = Conv3dChain::first_gpu();
    let kinds: Vec<TierKind> = first.tiers().into_iter().map(|(k, _)| k).collect();
    assert_eq!(kinds.first(), Some(&TierKind::Vendor));
    assert_eq!(kinds.last(), Some(&TierKind::Cpu));
}
