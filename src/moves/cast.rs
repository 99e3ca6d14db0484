//! [`Mover::cast`]: a conversion of device-resident data, checked on the
//! device or served through the host.

use std::time::Instant;

use super::{element_count, exhausted, host_vec, MoveCheck, MoveKind, MoveReport, MoveRung, Mover};
use crate::convert::table;
use crate::device::{ConvertOp, DeviceView, DeviceViewMut, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fallback::{Attempt, Failure};

pub(super) fn cast(
    m: &mut Mover,
    stream: &Stream,
    src: &DeviceView<'_, u8>,
    from: DType,
    dst: &mut DeviceViewMut<'_, u8>,
    to: DType,
) -> Result<MoveReport> {
    const OP: &str = "cast";
    stream.check_device(OP, src.device())?;
    stream.check_device(OP, dst.device())?;
    let unsupported = || Error::UnsupportedConversion {
        op: OP,
        from,
        to,
        tensor: None,
    };
    let row = table::find(from, to).ok_or_else(unsupported)?;
    let n = element_count(OP, src.len(), row.src_size, dst.len(), row.dst_size)?;
    let t0 = Instant::now();
    let mut attempts: Vec<Attempt<MoveRung>> = Vec::new();
    let on_device = row.kernel.is_some() && from != to;
    if on_device {
        match device_rung(m, stream, src, from, dst, to, n) {
            Ok((None, check)) => {
                return Ok(report(src.len(), MoveRung::Device, check, attempts, t0));
            }
            Ok((Some(f), _)) => attempts.push(Attempt {
                step: MoveRung::Device,
                failure: f,
            }),
            Err(e) => attempts.push(Attempt {
                step: MoveRung::Device,
                failure: Failure::Error(e),
            }),
        }
        if let Some(a) = attempts.last() {
            tracing::warn!(from = %from, to = %to, failure = %a.failure, "device cast failed; serving it through the host");
        }
        if !m.opts.ladder {
            return Err(exhausted("cast", attempts));
        }
    }
    match via_host(m, stream, src, from, dst, to) {
        Ok(()) => Ok(report(
            src.len(),
            MoveRung::ViaHost,
            if m.opts.verify {
                MoveCheck::Fingerprint
            } else {
                MoveCheck::None
            },
            attempts,
            t0,
        )),
        Err(e) => {
            attempts.push(Attempt {
                step: MoveRung::ViaHost,
                failure: Failure::Error(e),
            });
            Err(exhausted("cast", attempts))
        }
    }
}

fn report(
    bytes: usize,
    rung: MoveRung,
    check: MoveCheck,
    attempts: Vec<Attempt<MoveRung>>,
    t0: Instant,
) -> MoveReport {
    MoveReport {
        kind: MoveKind::Cast,
        bytes: bytes as u64,
        pieces: 1,
        rung,
        check,
        attempts,
        elapsed: t0.elapsed(),
    }
}

/// The conversion kernel, then its check: `(None, how)` when it passed.
fn device_rung(
    m: &mut Mover,
    stream: &Stream,
    src: &DeviceView<'_, u8>,
    from: DType,
    dst: &mut DeviceViewMut<'_, u8>,
    to: DType,
    n: usize,
) -> Result<(Option<Failure>, MoveCheck)> {
    stream.convert_raw(src, from, dst, to)?;
    if !m.opts.verify || n == 0 {
        stream.synchronize()?;
        return Ok((None, MoveCheck::None));
    }
    let op = ConvertOp { from, to };
    if op.widen_check_available() {
        let wrong = m.widen_mismatches(stream, src, from, &dst.as_view())?;
        let failure = (wrong > 0).then(|| {
            Failure::Error(Error::VerificationFailed {
                op: format!(
                    "cast {from}->{to}: {wrong} of {n} elements differ from the exact widening"
                ),
                device: m.device.info().name.clone(),
                expected: crate::convert::fingerprint::finish(0, 0),
                actual: crate::convert::fingerprint::finish(wrong, 0),
            })
        });
        return Ok((failure, MoveCheck::Exact));
    }
    Ok((
        sampled(m, stream, src, from, &dst.as_view(), to, n)?,
        MoveCheck::Sampled,
    ))
}

/// The sampled indices of `n` elements: the first, the last and `k - 2`
/// spread by a hash of the position.
fn sample_indices(n: usize, k: usize) -> Vec<usize> {
    let k = k.min(n);
    let mut v: Vec<usize> = (0..k)
        .map(|i| match i {
            0 => 0,
            1 => n - 1,
            _ => {
                let h = crate::convert::fingerprint::mix64((n as u64) ^ ((i as u64) << 32));
                (h % n as u64) as usize
            }
        })
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Compares sampled elements of `dst` with the CPU's exact conversion of
/// the same elements of `src`.
fn sampled(
    m: &Mover,
    stream: &Stream,
    src: &DeviceView<'_, u8>,
    from: DType,
    dst: &DeviceView<'_, u8>,
    to: DType,
    n: usize,
) -> Result<Option<Failure>> {
    let row = table::find(from, to).ok_or(Error::UnsupportedConversion {
        op: "cast",
        from,
        to,
        tensor: None,
    })?;
    let (ss, ds) = (row.src_size, row.dst_size);
    for i in sample_indices(n, m.opts.samples) {
        let (mut s, mut d) = ([0u8; 8], [0u8; 8]);
        src.slice(i * ss..(i + 1) * ss)?
            .copy_dtoh(stream, &mut s[..ss])?;
        dst.slice(i * ds..(i + 1) * ds)?
            .copy_dtoh(stream, &mut d[..ds])?;
        let want = (row.scalar)(u64::from_le_bytes(s));
        let got = u64::from_le_bytes(d);
        if want != got {
            return Ok(Some(Failure::Error(Error::VerificationFailed {
                op: format!(
                    "cast {from}->{to}: element {i} is {got:#x}, the exact conversion of {:#x} is {want:#x}",
                    u64::from_le_bytes(s)
                ),
                device: m.device.info().name.clone(),
                expected: crate::convert::fingerprint::finish(want, ds as u64),
                actual: crate::convert::fingerprint::finish(got, ds as u64),
            })));
        }
    }
    Ok(None)
}

/// Verified download, exact CPU conversion, verified upload.
fn via_host(
    m: &mut Mover,
    stream: &Stream,
    src: &DeviceView<'_, u8>,
    from: DType,
    dst: &mut DeviceViewMut<'_, u8>,
    to: DType,
) -> Result<()> {
    let mut host = host_vec("cast via host", dst.len())?;
    m.download_into(stream, src, from, &mut host, to)?;
    m.upload_into(stream, &host, dst)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::sample_indices;

    #[test]
    fn samples_hold_the_ends_and_stay_in_range() {
        for n in [1usize, 2, 3, 10, 1000, 1 << 20] {
            let v = sample_indices(n, 64);
            assert_eq!(v[0], 0);
            assert_eq!(*v.last().unwrap(), n - 1);
            assert!(v.iter().all(|&i| i < n));
            assert!(v.len() <= 64.min(n));
        }
    }
}
