//! Issue 21: the guarded conv3d (`Conv3dGuard`): another library's output
//! checked on the device and, where wrong, rewritten by the tiled kernel
//! behind a device-side gate, with the verdicts read back later.
//!
//! Every outcome is made to happen: a right output left alone (bit for
//! bit), NaN and wrong finite outputs repaired (f32 and bf16), a NaN input
//! that is no failure, wrong values the count alone cannot see, a repair
//! that fails its own check, a check that cannot launch, calls the tiled
//! kernel cannot take, and more calls than the verdict ring holds. Each
//! runs on the host backend here and, with `--include-ignored`, on a CUDA
//! or HIP device.

use crate::common;
use crate::common::faults::faulty;

use common::conv3d::assert_close;
use common::conv3d_device::{chain, tiled_case, upload, DeviceData};
use common::Open;
use half::bf16;
use rocm_safe::conv3d::{reference_point, Conv3dGeometry, Conv3dParams, Conv3dProblem};
use rocm_safe::conv3d_chain::{Conv3dGuard, GuardRecord, Guarded, GuardedOutput, GUARD_SLOTS};
use rocm_safe::convert::Element;
use rocm_safe::device::faults::{FaultKind, When};
use rocm_safe::device::{
    raw::{
        GuardStage, CHECK_WORDS, GUARD_ACC_WORDS, GUARD_RECORD_WORDS, GUARD_REPAIR_WORDS,
        VERDICT_WORDS,
    },
    Device, DeviceBuffer, DeviceView, Stream,
};
use rocm_safe::Error;

/// The f64 reference of every output point, as f32.
fn reference(p: &Conv3dProblem<'_>) -> Vec<f32> {
    (0..p.geometry.output_len())
        .map(|i| reference_point(p, i).unwrap().value as f32)
        .collect()
}

/// What the "other library" wrote.
enum Written {
    Right,
    Nan,
    Zeros,
}

fn written(p: &Conv3dProblem<'_>, how: &Written) -> Vec<f32> {
    let mut v = reference(p);
    match how {
        Written::Right => {}
        Written::Nan => {
            let at = v.len() / 3;
            v[at] = f32::NAN;
        }
        Written::Zeros => v.iter_mut().for_each(|x| *x = 0.0),
    }
    v
}

enum Out {
    F32(DeviceBuffer<f32>),
    BF16(DeviceBuffer<bf16>),
}

impl Out {
    fn new(s: &Stream, v: &[f32], as_bf16: bool) -> Out {
        if as_bf16 {
            let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            Out::BF16(s.clone_htod(&h).unwrap())
        } else {
            Out::F32(s.clone_htod(v).unwrap())
        }
    }
    fn guarded(&mut self) -> GuardedOutput<'_> {
        match self {
            Out::F32(b) => GuardedOutput::F32(b.view_mut()),
            Out::BF16(b) => GuardedOutput::BF16(b.view_mut()),
        }
    }
    fn read(&self) -> Vec<f32> {
        match self {
            Out::F32(b) => b.to_vec().unwrap(),
            Out::BF16(b) => b.to_vec().unwrap().iter().map(|v| v.to_f32()).collect(),
        }
    }
}

/// One guarded call of `p` over an output holding `v` (f32, or bf16 when
/// the problem is), `samples` points checked; the ticket, the record
/// (harvested) and the output read back.
fn guard_once(
    dev: &Device,
    p: &Conv3dProblem<'_>,
    v: &[f32],
    samples: usize,
) -> (Guarded, Vec<GuardRecord>, Vec<f32>) {
    let s = dev.stream().unwrap();
    let bf16_in = p.input.dtype() == rocm_safe::DType::BF16;
    let u = upload(&s, p, false);
    let mut out = Out::new(&s, v, bf16_in);
    let g = p.geometry;
    let guard = Conv3dGuard::new(dev);
    let c = chain(dev);
    let r = guard
        .guard(
            &c,
            &s,
            g.params,
            (u.x.data(), &g.input_shape()),
            (u.w.data(), &g.weight_shape()),
            u.b.as_ref().map(DeviceData::data),
            out.guarded(),
            // The chain's tolerances: a bf16 output is rounded once.
            (samples, if bf16_in { 1e-2 } else { 1e-4 }),
        )
        .unwrap();
    let records = guard.harvest().unwrap();
    (r, records, out.read())
}

fn only(records: &[GuardRecord]) -> GuardRecord {
    assert_eq!(records.len(), 1, "{records:?}");
    records[0]
}

/// A right output is left as it was, bit for bit, and judged right.
fn a_right_output_is_left_alone(dev: &Device) {
    let (case, data) = tiled_case();
    for bf16_in in [false, true] {
        let p = data.problem(&case, bf16_in);
        let v = written(&p, &Written::Right);
        let (r, records, out) = guard_once(dev, &p, &v, 16);
        assert!(matches!(r, Guarded::Queued { ticket: 0, .. }), "{r:?}");
        let rec = only(&records);
        assert!(
            !rec.output.failed() && !rec.repaired && !rec.repair_failed(),
            "{rec:?}"
        );
        let expect: Vec<f32> = if bf16_in {
            v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect()
        } else {
            v
        };
        assert_eq!(
            out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            expect.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }
}

/// A NaN from finite operands, or finite wrong values at the sampled
/// points, are repaired in place by the tiled kernel (f32 and bf16), and
/// the record says why and that the repair passed its own check.
fn wrong_outputs_are_repaired(dev: &Device) {
    let (case, data) = tiled_case();
    for bf16_in in [false, true] {
        let p = data.problem(&case, bf16_in);
        for how in [Written::Nan, Written::Zeros] {
            let v = written(&p, &how);
            let (_, records, out) = guard_once(dev, &p, &v, 16);
            let rec = only(&records);
            assert!(rec.output_failed() && rec.repaired, "{rec:?}");
            assert!(!rec.repair_failed(), "{rec:?}");
            match how {
                Written::Nan => assert!(rec.output.non_finite && rec.operands_finite),
                _ => {
                    let (i, got, reference, tol) = rec.output.off.unwrap();
                    assert!(i < p.geometry.output_len() && got == 0.0, "{rec:?}");
                    assert!((got - reference).abs() > tol, "{rec:?}");
                }
            }
            // bf16: each point rounded once from the f32 accumulation.
            let rel = if bf16_in { 1.0 / 128.0 } else { 1e-5 };
            assert_close("repaired", &p, &out, rel);
        }
    }
}

/// Fewer than 8 output channels per group (a VAE's last conv3d, 96 -> 3;
/// depthwise): the chain gives such calls to the naive kernel, but the
/// guard repairs them with the tiled one, which computes them, so they are
/// guarded like the rest instead of checked with a host wait.
fn few_output_channels_are_repaired_too(dev: &Device) {
    for name in ["kernel 1", "depthwise", "groups 2"] {
        let case = common::conv3d::cases()
            .into_iter()
            .find(|c| c.name == name)
            .unwrap();
        let data = common::conv3d::Data::new(&case);
        for bf16_in in [false, true] {
            let p = data.problem(&case, bf16_in);
            assert!(p.geometry.out_per_group() < 8, "{name}");
            for how in [Written::Nan, Written::Zeros] {
                let v = written(&p, &how);
                let (r, records, out) = guard_once(dev, &p, &v, 16);
                assert!(matches!(r, Guarded::Queued { .. }), "{name}: {r:?}");
                let rec = only(&records);
                assert!(rec.output_failed() && rec.repaired, "{name}: {rec:?}");
                assert!(!rec.repair_failed(), "{name}: {rec:?}");
                let rel = if bf16_in { 1.0 / 128.0 } else { 1e-5 };
                assert_close(name, &p, &out, rel);
            }
        }
    }
}

/// Without sampled points the count alone decides: wrong finite values
/// pass (what `samples = 0` gives up), a NaN does not.
fn the_count_alone_sees_only_non_finite(dev: &Device) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let (_, records, out) = guard_once(dev, &p, &written(&p, &Written::Zeros), 0);
    assert!(!only(&records).output_failed());
    assert!(out.iter().all(|&x| x == 0.0));
    let (_, records, out) = guard_once(dev, &p, &written(&p, &Written::Nan), 0);
    assert!(only(&records).repaired);
    assert_close("repaired", &p, &out, 1e-5);
}

/// A NaN in the input gives a NaN out: the record says the operands were
/// not finite, so no failure is counted against the library.
fn a_nan_input_is_no_failure(dev: &Device) {
    let (case, mut data) = tiled_case();
    data.x[5] = f32::NAN;
    let p = data.problem(&case, false);
    let v: Vec<f32> = (0..p.geometry.output_len())
        .map(|i| reference_point(&p, i).unwrap().value as f32)
        .collect();
    assert!(v.iter().any(|x| x.is_nan()));
    let (_, records, _) = guard_once(dev, &p, &v, 16);
    let rec = only(&records);
    assert!(rec.output.non_finite && !rec.operands_finite, "{rec:?}");
    assert!(!rec.output_failed() && !rec.repair_failed(), "{rec:?}");
}

/// More calls than the ring holds: the oldest records come back from the
/// calls that reuse their slots, in ticket order, and `harvest` returns
/// the rest; none is lost or repeated.
fn the_ring_returns_every_record_once(dev: &Device) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let s = dev.stream().unwrap();
    let u = upload(&s, &p, false);
    let g = p.geometry;
    let guard = Conv3dGuard::new(dev);
    let c = chain(dev);
    let right = written(&p, &Written::Right);
    let wrong = written(&p, &Written::Nan);
    let calls = GUARD_SLOTS + 5;
    let mut outs = Vec::new();
    let mut seen = Vec::new();
    for i in 0..calls {
        // Every seventh call is wrong.
        let v = if i % 7 == 3 { &wrong } else { &right };
        outs.push(Out::new(&s, v, false));
        let out = outs.last_mut().unwrap();
        let r = guard
            .guard(
                &c,
                &s,
                g.params,
                (u.x.data(), &g.input_shape()),
                (u.w.data(), &g.weight_shape()),
                u.b.as_ref().map(DeviceData::data),
                out.guarded(),
                (4, 1e-4),
            )
            .unwrap();
        let Guarded::Queued { ticket, records } = r else {
            panic!("not queued: {r:?}")
        };
        assert_eq!(ticket, i as u64);
        if i < GUARD_SLOTS {
            assert!(records.is_empty());
        } else {
            assert_eq!(records.len(), 1);
            assert_eq!(records[0].ticket, (i - GUARD_SLOTS) as u64);
        }
        seen.extend(records);
    }
    seen.extend(guard.harvest().unwrap());
    assert!(guard.harvest().unwrap().is_empty(), "harvested twice");
    assert_eq!(
        seen.iter().map(|r| r.ticket).collect::<Vec<_>>(),
        (0..calls as u64).collect::<Vec<_>>()
    );
    for r in &seen {
        assert_eq!(r.repaired, r.ticket % 7 == 3, "{r:?}");
    }
    for o in &outs {
        assert_close("ring", &p, &o.read(), 1e-5);
    }
}

/// Calls the tiled kernel cannot take queue nothing; an output of another
/// dtype than the input is refused.
fn what_the_guard_refuses(dev: &Device) {
    let s = dev.stream().unwrap();
    // 11^3 = 1331 taps: more than the tiled kernel's 1024.
    let x = s.clone_htod(&vec![0.5f32; 11 * 11 * 11]).unwrap();
    let w = s.clone_htod(&vec![0.5f32; 2 * 11 * 11 * 11]).unwrap();
    let mut y = s.alloc_zeros::<f32>(2).unwrap();
    let mut yb = s.alloc_zeros::<bf16>(2).unwrap();
    let guard = Conv3dGuard::new(dev);
    let c = chain(dev);
    let call = |out: GuardedOutput<'_>| {
        guard.guard(
            &c,
            &s,
            Conv3dParams::default(),
            (
                rocm_safe::conv3d_chain::DeviceConv3dData::F32(x.view()),
                &[1usize, 1, 11, 11, 11][..],
            ),
            (
                rocm_safe::conv3d_chain::DeviceConv3dData::F32(w.view()),
                &[2usize, 1, 11, 11, 11][..],
            ),
            None,
            out,
            (4, 1e-4),
        )
    };
    match call(GuardedOutput::F32(y.view_mut())).unwrap() {
        Guarded::Unguardable(why) => assert!(why.contains("taps"), "{why}"),
        other => panic!("{other:?}"),
    }
    let e = call(GuardedOutput::BF16(yb.view_mut())).unwrap_err();
    assert!(matches!(e, Error::Conv3dDType { .. }), "{e}");
    assert!(guard.harvest().unwrap().is_empty());
}
/// A repair that writes garbage fails its own check: the record says so
/// (the caller reports it and computes later calls through the chain).
fn a_failed_repair_is_reported(open: Open<'_>) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let dev = faulty(
        open,
        (11, &[(FaultKind::Conv3dWritesGarbage, When::Always)]),
    )
    .0;
    let (_, records, _) = guard_once(&dev, &p, &written(&p, &Written::Nan), 16);
    let rec = only(&records);
    assert!(rec.repaired && rec.repair_failed(), "{rec:?}");
    // A right output never opens the gate: the faulty kernel never runs.
    let (_, records, out) = guard_once(&dev, &p, &written(&p, &Written::Right), 16);
    assert!(!only(&records).repaired);
    assert_close("untouched", &p, &out, 1e-5);
}

/// A check that cannot launch is an error of the call (nothing reliable
/// was queued).
fn a_check_that_cannot_run_is_an_error(open: Open<'_>) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let dev = faulty(open, (11, &[(FaultKind::Conv3dCheckFailure, When::Always)])).0;
    let s = dev.stream().unwrap();
    let u = upload(&s, &p, false);
    let mut out = Out::new(&s, &written(&p, &Written::Right), false);
    let g = p.geometry;
    let guard = Conv3dGuard::new(&dev);
    let e = guard
        .guard(
            &chain(&dev),
            &s,
            g.params,
            (u.x.data(), &g.input_shape()),
            (u.w.data(), &g.weight_shape()),
            None,
            out.guarded(),
            (16, 1e-4),
        )
        .unwrap_err();
    assert!(matches!(e, Error::InjectedFault { .. }), "{e}");
}

/// Input, weight, f32 bias, output.
type Ops<'r, 'v, T, Y> = (
    &'r DeviceView<'v, T>,
    &'r DeviceView<'v, T>,
    Option<&'r DeviceView<'v, f32>>,
    &'r DeviceView<'v, Y>,
);

/// The words the separate launches write for one fused check: the output's
/// counts, the operands' (for a repair), the points and the verdict.
#[allow(clippy::too_many_arguments)]
fn separate<T: Element, Y: Element>(
    s: &Stream,
    g: &Conv3dGeometry,
    (x, w, b, y): Ops<'_, '_, T, Y>,
    samples: usize,
    rel: f64,
    repair: bool,
) -> (Vec<u64>, Vec<u64>) {
    let mut oc = s.alloc_zeros::<u64>(2).unwrap();
    s.count_nonfinite_into(y, &mut oc.view_mut()).unwrap();
    let mut ic = s.alloc_zeros::<u64>(6).unwrap();
    if repair {
        s.count_nonfinite_into(x, &mut ic.slice_mut(0..2).unwrap())
            .unwrap();
        s.count_nonfinite_into(w, &mut ic.slice_mut(2..4).unwrap())
            .unwrap();
        if let Some(b) = b {
            s.count_nonfinite_into(b, &mut ic.slice_mut(4..6).unwrap())
                .unwrap();
        }
    }
    let mut res = s.alloc_zeros::<u64>(CHECK_WORDS * samples.max(1)).unwrap();
    let mut res = res.slice_mut(..CHECK_WORDS * samples).unwrap();
    s.conv3d_ops()
        .check(g, x, w, b, y, (samples, 5), None, &mut res)
        .unwrap();
    let mut verdict = s.alloc_zeros::<u64>(VERDICT_WORDS).unwrap();
    let ic_view = ic.view();
    let words = (&oc.view(), repair.then_some(&ic_view), &res.as_view());
    s.conv3d_ops()
        .guard_decide(words, rel, &mut verdict.view_mut(), None)
        .unwrap();
    let mut record = oc.to_vec().unwrap();
    if repair {
        record = [ic.to_vec().unwrap(), record].concat();
    }
    record.extend(verdict.to_vec().unwrap());
    (record, res.as_view().to_vec(s).unwrap())
}

/// One fused check (`conv3d_guard_check`) behind `gate`: the record
/// (pre-filled with a sentinel), the points and the accumulators read back.
#[allow(clippy::too_many_arguments)]
fn fused<T: Element, Y: Element>(
    s: &Stream,
    g: &Conv3dGeometry,
    ops: Ops<'_, '_, T, Y>,
    samples: usize,
    rel: f64,
    stage: GuardStage,
    gate: Option<u64>,
) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let words = match stage {
        GuardStage::Output => GUARD_RECORD_WORDS,
        _ => GUARD_REPAIR_WORDS,
    };
    let mut record = s.clone_htod(&vec![0xdead_u64; words]).unwrap();
    let mut res = s.alloc_zeros::<u64>(CHECK_WORDS * samples.max(1)).unwrap();
    let mut res = res.slice_mut(..CHECK_WORDS * samples).unwrap();
    let mut acc = s.alloc_zeros::<u64>(GUARD_ACC_WORDS).unwrap();
    let gate = gate.map(|v| s.clone_htod(&[v]).unwrap());
    // Twice: the accumulators the first launch leaves must be zero again,
    // or the second launch's record would differ.
    for _ in 0..2 {
        s.conv3d_ops()
            .guard_check(
                g,
                ops,
                (samples, 5, rel),
                stage,
                (&mut res, &mut acc.view_mut(), &mut record.view_mut()),
                gate.as_ref().map(|b| b.view()).as_ref(),
            )
            .unwrap();
    }
    (
        record.to_vec().unwrap(),
        res.as_view().to_vec(s).unwrap(),
        acc.to_vec().unwrap(),
    )
}

/// Compares the fused check of `y` with the separate launches, at both
/// stages, and a closed gate with nothing written.
fn fused_matches<T: Element, Y: Element>(
    s: &Stream,
    g: &Conv3dGeometry,
    ops: Ops<'_, '_, T, Y>,
    samples: usize,
    rel: f64,
) {
    for (stage, repair) in [(GuardStage::Output, false), (GuardStage::Repair, true)] {
        let (want, want_res) = separate(s, g, ops, samples, rel, repair);
        let gate = repair.then_some(1);
        let (got, got_res, acc) = fused(s, g, ops, samples, rel, stage, gate);
        assert_eq!(
            acc,
            vec![0; GUARD_ACC_WORDS],
            "{stage:?}: accumulators left"
        );
        assert_eq!(got_res, want_res, "{stage:?}: points");
        if repair {
            assert_eq!(got, want, "{stage:?}");
        } else {
            assert_eq!(got[..2 + VERDICT_WORDS], want[..], "{stage:?}");
            assert!(got[2 + VERDICT_WORDS..].iter().all(|&w| w == 0), "{got:?}");
        }
        let (closed, _, acc) = fused(s, g, ops, samples, rel, stage, Some(0));
        assert!(closed.iter().all(|&w| w == 0xdead), "{stage:?}: {closed:?}");
        assert_eq!(acc, vec![0; GUARD_ACC_WORDS]);
    }
}

/// The fused check (one launch: counts, points, verdict) writes what the
/// separate count, check and verdict launches write, for the output and
/// for a repair (with the operands' counts), f32 and bf16, right, NaN and
/// wrong outputs, a NaN input, and an output large enough for hundreds of
/// blocks; a closed gate writes nothing; the accumulators are left zero.
fn the_fused_check_matches_the_separate_launches(dev: &Device) {
    let s = dev.stream().unwrap();
    let (case, mut data) = tiled_case();
    for nan_input in [false, true] {
        if nan_input {
            data.x[5] = f32::NAN;
            data.xb[5] = bf16::NAN;
        }
        for bf16_in in [false, true] {
            let p = data.problem(&case, bf16_in);
            let g = p.geometry;
            let u = upload(&s, &p, false);
            let b = u.b.as_ref().map(|b| match b {
                DeviceData::F32(b) => b.view(),
                DeviceData::BF16(_) => unreachable!("an f32 bias"),
            });
            for how in [Written::Right, Written::Nan, Written::Zeros] {
                let out = Out::new(&s, &written(&p, &how), bf16_in);
                for samples in [0, 16, 300] {
                    match (&u.x, &u.w, &out) {
                        (DeviceData::F32(x), DeviceData::F32(w), Out::F32(y)) => {
                            let ops = (&x.view(), &w.view(), b.as_ref(), &y.view());
                            fused_matches(&s, &g, ops, samples, 1e-4);
                        }
                        (DeviceData::BF16(x), DeviceData::BF16(w), Out::BF16(y)) => {
                            let ops = (&x.view(), &w.view(), b.as_ref(), &y.view());
                            fused_matches(&s, &g, ops, samples, 1e-2);
                        }
                        _ => unreachable!("one dtype"),
                    }
                }
            }
        }
    }
    // Hundreds of blocks of counts: 8 x 14 x 30 x 30 outputs (zeros, two
    // NaNs and an infinity: wrong at every point the check samples).
    let g = Conv3dGeometry::new(
        Conv3dParams::default(),
        &[1, 4, 16, 32, 32],
        &[8, 4, 3, 3, 3],
    )
    .unwrap();
    let xv: Vec<f32> = (0..4 * 16 * 32 * 32)
        .map(|i| (i % 7) as f32 - 3.0)
        .collect();
    let wv: Vec<f32> = (0..8 * 4 * 27).map(|i| (i % 5) as f32 * 0.25).collect();
    let mut yv = vec![0f32; g.output_len()];
    yv[17] = f32::NAN;
    yv[g.output_len() - 3] = f32::NAN;
    yv[g.output_len() / 2] = f32::INFINITY;
    let (x, w, y) = (
        s.clone_htod(&xv).unwrap(),
        s.clone_htod(&wv).unwrap(),
        s.clone_htod(&yv).unwrap(),
    );
    for samples in [0, 64] {
        let ops = (&x.view(), &w.view(), None, &y.view());
        fused_matches(&s, &g, ops, samples, 1e-4);
    }
}

/// Guarded calls alternating between two streams share the guard's
/// buffers (each waits for the last call's event on the other stream):
/// every record is its own call's, every output right.
fn calls_on_two_streams_keep_their_verdicts(dev: &Device) {
    let (case, data) = tiled_case();
    let p = data.problem(&case, false);
    let streams = [dev.stream().unwrap(), dev.stream().unwrap()];
    let u = upload(&streams[0], &p, false);
    streams[0].synchronize().unwrap();
    let g = p.geometry;
    let guard = Conv3dGuard::new(dev);
    let c = chain(dev);
    let right = written(&p, &Written::Right);
    let wrong = written(&p, &Written::Zeros);
    let mut outs = Vec::new();
    let mut seen = Vec::new();
    let calls = 12;
    for i in 0..calls {
        let s = &streams[i % 2];
        let v = if i % 3 == 1 { &wrong } else { &right };
        outs.push(Out::new(s, v, false));
        let out = outs.last_mut().unwrap();
        let r = guard
            .guard(
                &c,
                s,
                g.params,
                (u.x.data(), &g.input_shape()),
                (u.w.data(), &g.weight_shape()),
                u.b.as_ref().map(DeviceData::data),
                out.guarded(),
                (16, 1e-4),
            )
            .unwrap();
        let Guarded::Queued { records, .. } = r else {
            panic!("not queued: {r:?}")
        };
        seen.extend(records);
    }
    seen.extend(guard.harvest().unwrap());
    assert_eq!(seen.len(), calls);
    for r in &seen {
        let wrong = r.ticket % 3 == 1;
        assert_eq!(r.repaired, wrong, "{r:?}");
        assert_eq!(r.output_failed(), wrong, "{r:?}");
        assert!(!r.repair_failed(), "{r:?}");
    }
    for o in &outs {
        assert_close("two streams", &p, &o.read(), 1e-5);
    }
}

per_device!(
    a_right_output_is_left_alone,
    wrong_outputs_are_repaired,
    few_output_channels_are_repaired_too,
    the_count_alone_sees_only_non_finite,
    a_nan_input_is_no_failure,
    the_ring_returns_every_record_once,
    what_the_guard_refuses,
    a_failed_repair_is_reported,
    a_check_that_cannot_run_is_an_error,
    the_fused_check_matches_the_separate_launches,
    calls_on_two_streams_keep_their_verdicts,
);

/// A gated weight layout is made only when its gate is open; the standard
/// layout (a copy) refuses a gate.
#[test]
fn gated_layouts_run_only_when_open() {
    use rocm_safe::conv3d::Conv3dGeometry;
    use rocm_safe::device::raw::Conv3dWeightLayout;
    let dev = Device::open(rocm_safe::device::BackendKind::Host, 0).unwrap();
    let s = dev.stream().unwrap();
    let g =
        Conv3dGeometry::new(Conv3dParams::default(), &[1, 4, 3, 3, 3], &[6, 4, 3, 3, 3]).unwrap();
    let w: Vec<f32> = (0..6 * 4 * 27).map(|i| i as f32).collect();
    let wd = s.clone_htod(&w).unwrap();
    let layout = Conv3dWeightLayout::TiledTransposed;
    let want = layout.arrange(&g, &w).unwrap();
    for open in [0u64, 1] {
        let gate = s.clone_htod(&[open]).unwrap();
        let mut dst = s.alloc_zeros::<f32>(layout.len(&g)).unwrap();
        s.conv3d_ops()
            .arrange_weight_gated(
                layout,
                &g,
                &wd.view(),
                &mut dst.view_mut(),
                Some(&gate.view()),
            )
            .unwrap();
        let got = dst.to_vec().unwrap();
        if open == 1 {
            assert_eq!(&got[..], &*want);
        } else {
            assert!(got.iter().all(|&v| v == 0.0));
        }
        let mut std_dst = s.alloc_zeros::<f32>(w.len()).unwrap();
        let e = s
            .conv3d_ops()
            .arrange_weight_gated(
                Conv3dWeightLayout::Standard,
                &g,
                &wd.view(),
                &mut std_dst.view_mut(),
                Some(&gate.view()),
            )
            .unwrap_err();
        assert!(matches!(e, Error::Conv3dTier { .. }), "{e}");
    }
}
