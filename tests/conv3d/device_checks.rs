//! Issue 21: the chain over device memory checks on the device.
//!
//! `Conv3dChain::run_device` copies no operand or output to the host while
//! a GPU tier of the stream's device serves: the sampled f64 points and the
//! non-finite scan run on the device and come back in one small copy. These
//! tests make every failure path of those checks happen (wrong finite
//! values, NaN from finite inputs, overflow, non-finite inputs, a check
//! that cannot run) and count the copies (the check and layout kernels
//! themselves against the host's f64 reference:
//! `tests/conv3d/device_kernels.rs`). Each runs on the host backend here
//! and, with `--include-ignored`, on a CUDA or HIP device.

use crate::common;
use crate::common::faults::faulty;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::conv3d::assert_close;
use common::conv3d_device::{
    chain, run_device, tiled_case, upload, with_bf16_bias, DeviceData, Uploaded,
};
use common::Open;
use half::bf16;
use rocm_safe::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::conv3d_chain::TierKind;
use rocm_safe::device::faults::{FaultKind, When};
use rocm_safe::device::{
    raw::{Backend, CopyOp, Driver, RawStream, Wrap},
    Device,
};
use rocm_safe::fallback::Failure;
use rocm_safe::{Error, Result};
/// Every dtype and bias kind through the device chain: the tiled kernel
/// serves, the output is the f64 reference's within f32 accumulation.
fn device_chain_serves_every_dtype_and_bias(dev: &Device) {
    let (case, data) = tiled_case();
    let chain = chain(dev);
    let hb: Vec<bf16> = data.b.iter().map(|&v| bf16::from_f32(v)).collect();
    for bf16_in in [false, true] {
        for bias_bf16 in [false, true] {
            let p = data.problem(&case, bf16_in);
            let s = dev.stream().unwrap();
            let u = upload(&s, &p, bias_bf16);
            let (r, out) = run_device(&chain, dev, &p, &u);
            let report = r.unwrap();
            assert_eq!(report.served_by(), Some(TierKind::Tiled), "{report}");
            assert_eq!(report.failures().count(), 0, "{report}");
            let expect = if bias_bf16 {
                with_bf16_bias(&p, &hb)
            } else {
                p
            };
            assert_close("device chain", &expect, &out, 1e-5);
        }
    }
}

/// A tier that returns finite but wrong values is caught by the sampled
/// points (ValueMismatch), and the next tier serves.
fn wrong_finite_values_fail_the_tier(open: Open<'_>) {
    for kind in [FaultKind::Conv3dWritesGarbage, FaultKind::Conv3dWritesZeros] {
        let (case, data) = tiled_case();
        let (dev, h) = faulty(open, &[(kind, When::Nth(0))]);
        let chain = chain(&dev);
        let p = data.problem(&case, false);
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, false);
        let (r, out) = run_device(&chain, &dev, &p, &u);
        let report = r.unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
        let failures: Vec<_> = report.failures().collect();
        assert_eq!(failures.len(), 1, "{report}");
        assert_eq!(failures[0].0.kind, TierKind::Tiled);
        assert!(
            matches!(failures[0].1, Failure::ValueMismatch { got, expected, tolerance, .. }
                if got.is_finite() && (f64::from(*got) - expected).abs() > *tolerance),
            "{kind}: {report}"
        );
        assert_eq!(h.injected().len(), 1);
        assert_close("naive after a wrong tiled output", &p, &out, 1e-5);
        let stats = chain.stats();
        assert_eq!((stats[1].mismatches, stats[2].successes), (1, 1));
    }
}

/// A NaN written from finite inputs fails the tier (NonFinite, at the
/// NaN's index), and the next tier serves.
fn nan_from_finite_inputs_fails_the_tier(open: Open<'_>) {
    let (case, data) = tiled_case();
    for bf16_in in [false, true] {
        let (dev, h) = faulty(open, &[(FaultKind::Conv3dWritesNonFinite, When::Nth(0))]);
        let chain = chain(&dev);
        let p = data.problem(&case, bf16_in);
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, true);
        let (r, out) = run_device(&chain, &dev, &p, &u);
        let report = r.unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
        let failures: Vec<_> = report.failures().collect();
        assert_eq!(failures.len(), 1, "{report}");
        assert!(
            matches!(failures[0].1, Failure::NonFinite { index, value }
                if value.is_nan() && *index < p.geometry.output_len()),
            "{report}"
        );
        assert_eq!(h.injected().len(), 1);
        assert_eq!(chain.stats()[1].non_finite, 1);
        assert!(out.iter().all(|v| v.is_finite()));
    }
}

/// Finite inputs whose exact result is beyond f32: the infinity is the
/// correctly rounded result, so the call ends with Conv3dOverflow (no
/// other tier would do better), naming the tier and the first index.
fn overflow_is_reported_not_retried(dev: &Device) {
    let x = vec![3.0e38f32; 2 * 2 * 2 * 2];
    let w = vec![2.0f32; 8 * 2];
    let (xs, ws) = ([1usize, 2, 2, 2, 2], [8usize, 2, 1, 1, 1]);
    let p = Conv3dProblem::new(
        Conv3dParams::default(),
        Conv3dData::F32(&x),
        &xs,
        Conv3dData::F32(&w),
        &ws,
        None,
    )
    .unwrap();
    let chain = chain(dev);
    let s = dev.stream().unwrap();
    let u = upload(&s, &p, false);
    let (r, out) = run_device(&chain, dev, &p, &u);
    match r {
        Err(Error::Conv3dOverflow {
            index,
            reference,
            value,
            tier,
        }) => {
            assert_eq!(index, 0);
            assert_eq!(reference, 4.0 * f64::from(3.0e38f32));
            assert!(value.is_infinite());
            assert_eq!(tier, "tiled");
        }
        other => panic!("{other:?}"),
    }
    assert!(out.iter().all(|v| v.is_infinite()));
    assert_eq!(chain.stats()[1].successes, 1);
    assert_eq!(chain.stats()[2].attempts, 0, "no other tier was tried");
}

/// A NaN or infinity in the input or bias makes non-finite output points
/// that are no tier's fault: the call is served, nothing fails.
fn non_finite_inputs_are_no_failure(dev: &Device) {
    let (case, data) = tiled_case();
    let chain = chain(dev);
    for which in 0..3 {
        let (mut x, w, mut b) = (data.x.clone(), data.w.clone(), data.b.clone());
        match which {
            0 => x[5] = f32::NAN,
            1 => x[9] = f32::INFINITY,
            _ => b[1] = f32::NAN,
        }
        let p = Conv3dProblem::new(
            case.params,
            Conv3dData::F32(&x),
            &case.input,
            Conv3dData::F32(&w),
            &case.weight,
            Some(Conv3dData::F32(&b)),
        )
        .unwrap();
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, false);
        let (r, out) = run_device(&chain, dev, &p, &u);
        let report = r.unwrap();
        assert_eq!(
            report.served_by(),
            Some(TierKind::Tiled),
            "{which}: {report}"
        );
        assert_eq!(report.failures().count(), 0, "{which}: {report}");
        assert!(out.iter().any(|v| !v.is_finite()), "{which}");
    }
}

/// A check that cannot run fails the tier it was checking: the output is
/// not trusted unchecked, and the next tier (checked) serves.
fn a_failed_check_fails_its_tier(open: Open<'_>) {
    let (case, data) = tiled_case();
    let (dev, h) = faulty(open, &[(FaultKind::Conv3dCheckFailure, When::Nth(0))]);
    let chain = chain(&dev);
    let p = data.problem(&case, false);
    let s = dev.stream().unwrap();
    let u = upload(&s, &p, false);
    let (r, out) = run_device(&chain, &dev, &p, &u);
    let report = r.unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Naive), "{report}");
    let failures: Vec<_> = report.failures().collect();
    assert!(
        matches!(
            failures[..],
            [(
                a,
                Failure::Error(Error::InjectedFault {
                    fault: FaultKind::Conv3dCheckFailure,
                    op: "conv3d_check"
                })
            )] if a.kind == TierKind::Tiled
        ),
        "{report}"
    );
    assert_eq!(h.injected().len(), 1);
    assert_close("naive after a failed check", &p, &out, 1e-5);
}

/// Both kernels failing: the CPU tier copies the operands to the host
/// (only then), and its output is checked on the device like any other.
fn cpu_tier_serves_device_calls(open: Open<'_>) {
    let (case, data) = tiled_case();
    let (dev, _h) = faulty(open, &[(FaultKind::Conv3dLaunchFailure, When::Always)]);
    let chain = chain(&dev);
    let p = data.problem(&case, true);
    let s = dev.stream().unwrap();
    let u = upload(&s, &p, false);
    let (r, out) = run_device(&chain, &dev, &p, &u);
    let report = r.unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Cpu), "{report}");
    assert_close("cpu tier on a device call", &p, &out, 1e-5);
}

/// A weight changed in place between two calls (same address, shape and
/// dtype) is laid out again: the second output is the new weight's.
fn a_changed_weight_never_meets_a_stale_layout(dev: &Device) {
    let (case, data) = tiled_case();
    let chain = chain(dev);
    let s = dev.stream().unwrap();
    let p = data.problem(&case, false);
    let u = upload(&s, &p, false);
    let (r, _) = run_device(&chain, dev, &p, &u);
    assert_eq!(r.unwrap().served_by(), Some(TierKind::Tiled));
    let w2: Vec<f32> = data.w.iter().map(|v| -2.0 * v + 0.125).collect();
    let DeviceData::F32(mut wd) = u.w else {
        panic!("f32 weight")
    };
    wd.copy_htod(&w2).unwrap();
    let u = Uploaded {
        w: DeviceData::F32(wd),
        ..u
    };
    let p2 = Conv3dProblem::new(
        case.params,
        Conv3dData::F32(&data.x),
        &case.input,
        Conv3dData::F32(&w2),
        &case.weight,
        Some(Conv3dData::F32(&data.b)),
    )
    .unwrap();
    let (r, out) = run_device(&chain, dev, &p2, &u);
    let report = r.unwrap();
    assert_eq!(report.served_by(), Some(TierKind::Tiled), "{report}");
    assert_close("after the weight changed", &p2, &out, 1e-5);
}
per_device!(
    device_chain_serves_every_dtype_and_bias,
    wrong_finite_values_fail_the_tier,
    nan_from_finite_inputs_fails_the_tier,
    overflow_is_reported_not_retried,
    non_finite_inputs_are_no_failure,
    a_failed_check_fails_its_tier,
    cpu_tier_serves_device_calls,
    a_changed_weight_never_meets_a_stale_layout,
);

/// A backend that counts host<->device copies and their bytes.
#[derive(Debug)]
struct CountCopies {
    inner: Box<dyn Backend>,
    htod: Arc<AtomicUsize>,
    dtoh: Arc<AtomicUsize>,
    dtoh_bytes: Arc<AtomicUsize>,
}

impl Wrap for CountCopies {
    type Inner = dyn Backend;
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
}

// SAFETY: forwards every call unchanged to a correct backend.
unsafe impl Driver for CountCopies {
    rocm_safe::forward_driver!(
        info,
        alloc,
        free,
        alloc_pinned,
        free_pinned,
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
        memset_zero,
        mem_info,
        register_read_only,
        unregister_read_only,
    );
    unsafe fn copy(&self, op: CopyOp, bytes: usize, s: RawStream) -> Result<()> {
        match op {
            CopyOp::HtoD { .. } => {
                self.htod.fetch_add(1, Ordering::SeqCst);
            }
            CopyOp::DtoH { .. } => {
                self.dtoh.fetch_add(1, Ordering::SeqCst);
                self.dtoh_bytes.fetch_add(bytes, Ordering::SeqCst);
            }
            _ => {}
        }
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { self.inner.copy(op, bytes, s) }
    }
}

// SAFETY: as above.
unsafe impl Backend for CountCopies {
    rocm_safe::forward_backend!(all);
}

/// The point of the issue: a served call copies no operand to the device
/// or the host and reads back one small buffer (the checks' results),
/// whatever the dtype or bias; a bad output costs one more small read.
#[test]
fn a_served_device_call_reads_back_one_small_buffer() {
    let (htod, dtoh, bytes) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let counting = CountCopies {
        inner: Box::new(rocm_safe::device::host::HostBackend::new()),
        htod: htod.clone(),
        dtoh: dtoh.clone(),
        dtoh_bytes: bytes.clone(),
    };
    let dev = Device::from_backend(Box::new(counting));
    let (case, data) = tiled_case();
    let chain = chain(&dev);
    for (bf16_in, bias_bf16) in [(false, false), (true, true)] {
        let p = data.problem(&case, bf16_in);
        let s = dev.stream().unwrap();
        let u = upload(&s, &p, bias_bf16);
        let g = p.geometry;
        let mut out = s.alloc_zeros::<f32>(g.output_len()).unwrap();
        let before = (htod.load(Ordering::SeqCst), dtoh.load(Ordering::SeqCst));
        let bytes0 = bytes.load(Ordering::SeqCst);
        let report = chain
            .run_device(
                &s,
                g.params,
                u.x.data(),
                &g.input_shape(),
                u.w.data(),
                &g.weight_shape(),
                u.b.as_ref().map(DeviceData::data),
                &mut out.view_mut(),
            )
            .unwrap();
        assert_eq!(report.served_by(), Some(TierKind::Tiled), "{report}");
        assert_eq!(htod.load(Ordering::SeqCst), before.0, "no upload");
        assert_eq!(dtoh.load(Ordering::SeqCst), before.1 + 1, "one read-back");
        let read = bytes.load(Ordering::SeqCst) - bytes0;
        assert!(read <= 8 * (16 + 4 * 16), "{read} bytes read back");
    }
}
