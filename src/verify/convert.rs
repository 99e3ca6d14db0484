//! One verified conversion: the device kernel, the host's expected
//! fingerprint, the check the policy asks for, the CPU fallback.

use std::time::Instant;

use super::selftest::self_test;
use super::{device_label, expected_fingerprint, staged, ConvertReport, Policy, VerifyOptions};
use crate::convert::fingerprint::finish;
use crate::convert::Element;
use crate::device::{ConvertOp, DeviceView, DeviceViewMut, Stream};
use crate::error::{Error, Result};
use crate::fallback::{Check, Failure, Outcome};

// ---------------------------------------------------------------------------

/// The CPU fallback: converts on the host and uploads the result, then
/// reads the upload back and compares it (independent of any kernel), so a
/// copy that lands zeros or stale data cannot slip through here either.
fn cpu_convert_into<S: Element, D: Element>(
    stream: &Stream,
    host_src: &[S],
    dst: &mut DeviceViewMut<'_, D>,
    label: &str,
) -> Result<()> {
    let mut out = vec![D::zeroed(); host_src.len()];
    crate::convert::convert_slice(host_src, &mut out)?;
    dst.copy_htod(stream, &out)?;
    let mut back = vec![D::zeroed(); out.len()];
    dst.as_view().copy_dtoh(stream, &mut back)?;
    let (ob, bb): (&[u8], &[u8]) = (bytemuck::cast_slice(&out), bytemuck::cast_slice(&back));
    if ob != bb {
        let expected = crate::convert::fingerprint_bytes(ob);
        let actual = crate::convert::fingerprint_bytes(bb);
        return Err(Error::VerificationFailed {
            op: format!(
                "upload of the cpu fallback of convert {}->{}",
                S::DTYPE,
                D::DTYPE
            ),
            device: label.to_owned(),
            expected,
            actual,
        });
    }
    Ok(())
}

/// Converts `src` (on the device; `host_src` is the same data on the host,
/// from which the expectation is computed) into `dst`, checked as `opts`
/// says. Returns which path served and the timings.
///
/// Errors: length/device mismatches, device errors,
/// [`Error::KernelUntrusted`] / [`Error::VerificationFailed`] when the
/// fallback is off.
pub fn convert_verified<S: Element, D: Element>(
    stream: &Stream,
    host_src: &[S],
    src: &DeviceView<'_, S>,
    dst: &mut DeviceViewMut<'_, D>,
    opts: &VerifyOptions,
) -> Result<ConvertReport> {
    let t0 = Instant::now();
    let op = ConvertOp {
        from: S::DTYPE,
        to: D::DTYPE,
    };
    if !op.on_device() {
        return Err(Error::UnsupportedConversion {
            op: "convert_verified",
            from: op.from,
            to: op.to,
            tensor: None,
        });
    }
    if host_src.len() != src.len() || src.len() != dst.len() {
        return Err(Error::LengthMismatch {
            op: "convert_verified",
            expected: host_src.len(),
            actual: if host_src.len() != src.len() {
                src.len()
            } else {
                dst.len()
            },
            tensor: None,
        });
    }
    let dev = stream.device();
    let label = device_label(dev);
    let mut report = ConvertReport {
        op,
        elements: src.len() as u64,
        device: label.clone(),
        policy: opts.policy,
        outcome: Outcome::Served,
        expected: None,
        actual: None,
        kernel_ms: None,
        verify_ms: None,
        host_expected_ms: 0.0,
        total_ms: 0.0,
    };
    let st = if opts.self_test {
        Some(self_test(stream)?)
    } else {
        None
    };
    if let Some(st) = st.as_deref().filter(|st| !st.trusted(op)) {
        if !opts.allow_cpu_fallback {
            let k = st.find(&format!("convert {op}"));
            return Err(Error::KernelUntrusted {
                op: format!("convert {op}"),
                device: label,
                mismatches: k.map_or(0, |k| k.mismatches),
                tested: k.map_or(0, |k| k.tested),
            });
        }
        cpu_convert_into(stream, host_src, dst, &label)?;
        report.outcome = Outcome::Failed(Failure::NoTrustedKernel {
            from: op.from,
            to: op.to,
        });
        report.total_ms = t0.elapsed().as_secs_f32() * 1e3;
        return Ok(report);
    }
    // The one rule of every staged check (`staged.rs`): an untrusted
    // fingerprint kernel makes this a read-back, decided before any work.
    let policy = staged::applied_policy(opts.policy, st.as_deref(), Some(op));
    report.policy = policy;
    let src_bytes: &[u8] = bytemuck::cast_slice(host_src);
    let e0 = dev.event()?;
    let e1 = dev.event()?;
    let e2 = dev.event()?;
    let mut acc = stream.alloc_zeros::<u64>(1)?;
    stream.record(&e0)?;
    let queued = staged::queue(
        stream,
        Some(op),
        policy,
        &src.cast::<u8>()?,
        &mut dst.cast_mut::<u8>()?,
        staged::Accumulators {
            copy: None,
            out: &mut acc.view_mut(),
            between: Some(&e1),
        },
    )?;
    stream.record(&e2)?;
    // The host's share, overlapped with the device work queued above.
    let th = Instant::now();
    let check = if staged::fingerprints(policy) {
        Some(expected_fingerprint(op.from, src_bytes, op.to)?)
    } else {
        None
    };
    report.host_expected_ms = th.elapsed().as_secs_f32() * 1e3;
    stream.synchronize()?;
    report.kernel_ms = e0.elapsed_ms(&e1).ok();
    if queued.separate {
        report.verify_ms = e1.elapsed_ms(&e2).ok();
    }
    let mismatch = match (policy, check) {
        (Policy::ReadBack, _) => {
            let th = Instant::now();
            let mut want = vec![D::zeroed(); host_src.len()];
            crate::convert::convert_slice(host_src, &mut want)?;
            let mut got = vec![D::zeroed(); host_src.len()];
            dst.as_view().copy_dtoh(stream, &mut got)?;
            report.host_expected_ms = th.elapsed().as_secs_f32() * 1e3;
            let wb: &[u8] = bytemuck::cast_slice(&want);
            let gb: &[u8] = bytemuck::cast_slice(&got);
            let (e, a) = (
                crate::convert::fingerprint_bytes(wb),
                crate::convert::fingerprint_bytes(gb),
            );
            report.expected = Some(e);
            report.actual = Some(a);
            (wb != gb).then_some((e, a))
        }
        (_, Some(expected)) => {
            let s = acc.to_vec()?;
            let actual = finish(s.first().copied().unwrap_or(0), dst.num_bytes() as u64);
            report.expected = Some(expected);
            report.actual = Some(actual);
            (expected != actual).then_some((expected, actual))
        }
        (_, None) => None,
    };
    if let Some((expected, actual)) = mismatch {
        if !opts.allow_cpu_fallback {
            return Err(Error::VerificationFailed {
                op: format!("convert {op}"),
                device: label,
                expected,
                actual,
            });
        }
        cpu_convert_into(stream, host_src, dst, &label)?;
        report.outcome = Outcome::Failed(Failure::FingerprintMismatch {
            check: Check::Output,
            expected,
            actual,
        });
    }
    report.total_ms = t0.elapsed().as_secs_f32() * 1e3;
    Ok(report)
}

/// Uploads `host_src` into a temporary device buffer on `stream` and
/// converts it into `dst` with [`convert_verified`] (so the check also
/// covers the copy).
pub fn upload_convert<S: Element, D: Element>(
    stream: &Stream,
    host_src: &[S],
    dst: &mut DeviceViewMut<'_, D>,
    opts: &VerifyOptions,
) -> Result<ConvertReport> {
    let src = stream.clone_htod(host_src)?;
    convert_verified(stream, host_src, &src.view(), dst, opts)
}
