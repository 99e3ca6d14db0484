//! The ladder below the pinned ring, each rung's failure recorded.
//!
//! Small chunks, pageable copy, CPU conversion, keep on host: each rung a
//! function over the staging state ([`Staging`]: streams, the lower rungs'
//! cached slot) and the tensor's [`State`], tried in turn by [`serve`],
//! each failure recorded.

use std::time::Instant;

use super::checks::{compare, readback, IntoPair};
use super::ring::Slot;
use super::source::{self, Item, Source};
use super::staging::{Staging, State};
use super::{Attempt, Check, Failure, Fallback, Rung};
use crate::convert::fingerprint;
use crate::device::{DeviceBuffer, PinnedBuffer};
use crate::error::{Error, ErrorKind, Result};
use crate::verify::staged;
use crate::verify::Policy;

/// Serves `item` on the rungs after the pinned ring (or from its start
/// rung), recording every failure.
///
/// Errors: [`Error::TransferFailed`] when a rung fails and the fallback
/// option forbids the next; what no rung can help with (`is_fatal`).
pub(super) fn serve(
    stg: &mut Staging,
    sources: &[Source],
    item: &Item,
    st: &mut State,
) -> Result<()> {
    if let Some(a) = st.failed.take() {
        st.attempts.push(a);
    }
    let ladder = stg.opts.fallback == Fallback::Ladder;
    let mut rung = st.start;
    if let Some(last) = st.attempts.pop() {
        if !ladder && !st.offloaded {
            return Err(transfer_failed(item, last));
        }
        st.attempts.push(last);
        if rung == Rung::PinnedRing {
            rung = Rung::SmallChunks;
        }
    }
    loop {
        let span = tracing::info_span!("transfer.rung", rung = rung.name(), tensor = %item.name);
        let _g = span.enter();
        st.t0.get_or_insert_with(Instant::now);
        let failure = match try_rung(stg, rung, sources, item, st) {
            Ok(None) => {
                tracing::debug!("served");
                st.served = Some(rung);
                st.t1 = Some(Instant::now());
                return Ok(());
            }
            Ok(Some(f)) => f,
            Err(e) if is_fatal(&e) => return Err(e),
            Err(e) => Failure::Error(e),
        };
        tracing::warn!(failure = %failure, "rung failed");
        let a = Attempt {
            step: rung,
            failure,
        };
        match (ladder, rung.next()) {
            (true, Some(next)) => {
                st.attempts.push(a);
                rung = next;
            }
            _ => return Err(transfer_failed(item, a)),
        }
    }
}

/// One rung: `Ok(None)` served, `Ok(Some(_))` a check failed, `Err` an
/// operation failed.
fn try_rung(
    stg: &mut Staging,
    rung: Rung,
    sources: &[Source],
    item: &Item,
    st: &mut State,
) -> Result<Option<Failure>> {
    match rung {
        Rung::PinnedRing | Rung::SmallChunks => staged_rung(stg, sources, item, st, true),
        Rung::Pageable => staged_rung(stg, sources, item, st, false),
        Rung::CpuConvert => cpu_convert(stg, sources, item, st),
        Rung::KeepOnHost => keep_on_host(sources, item, st),
    }
}

/// The small-chunks rung (`pinned`) or the pageable rung: stage a chunk,
/// copy it synchronously, convert and check on the device, wait.
fn staged_rung(
    stg: &mut Staging,
    sources: &[Source],
    item: &Item,
    st: &mut State,
    pinned: bool,
) -> Result<Option<Failure>> {
    if let Some(op) = item.op {
        if !op.on_device() {
            return Ok(Some(Failure::NoTrustedKernel {
                from: op.from,
                to: op.to,
            }));
        }
    }
    stg.ensure_out(item, st)?;
    let chunk = if pinned {
        stg.opts.small_chunk_bytes
    } else {
        stg.opts.buffer_bytes
    };
    if stg.scratch.is_none() {
        stg.scratch = Some(stg.make_slot(stg.opts.buffer_bytes, true)?);
    }
    if pinned && stg.scratch_pinned.is_none() {
        stg.scratch_pinned = Some(stg.device.alloc_pinned::<u8>(stg.opts.small_chunk_bytes)?);
    }
    let (Some(mut slot), Some(out)) = (stg.scratch.take(), st.out.as_mut()) else {
        return Ok(None);
    };
    let mut pbuf = stg.scratch_pinned.take();
    let r = staged_chunks(stg, sources, item, out, &mut slot, pbuf.as_mut(), chunk);
    stg.scratch = Some(slot);
    stg.scratch_pinned = pbuf;
    let f = r?;
    if f.is_some() {
        return Ok(f);
    }
    if stg.policy() == Policy::ReadBack {
        return readback(sources, item, st.out.as_ref());
    }
    Ok(None)
}

/// Stages `item` through `slot` in chunks of `chunk` bytes (through
/// `pinned` memory, or pageable memory without it), each converted and
/// checked on the device before the next.
fn staged_chunks(
    stg: &Staging,
    sources: &[Source],
    item: &Item,
    out: &mut DeviceBuffer<u8>,
    slot: &mut Slot,
    mut pinned: Option<&mut PinnedBuffer<u8>>,
    chunk: usize,
) -> Result<Option<Failure>> {
    let policy = stg.policy();
    let fp = matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint);
    let mut host = Vec::new();
    let mut off = 0u64;
    while off < item.src_bytes {
        let len = chunk.min((item.src_bytes - off) as usize);
        let via = match pinned.as_deref_mut() {
            Some(buf) => Via::Pinned(buf),
            None => Via::Pageable(&mut host),
        };
        let sums = stage_chunk(stg, sources, item, off..off + len as u64, slot, via, fp)?;
        slot.acc.memset_zero()?;
        let src = slot.stage.slice(0..len)?;
        let o = item.out_off(off) as usize;
        let mut dst = out.slice_mut(o..o + item.out_len(len))?;
        let (mut a_copy, mut a_out) = slot.acc.view_mut().split_at_mut(1)?.into_pair(0)?;
        // The copy check, the conversion and the output check of the
        // piece, as the staged check queues them.
        let acc = staged::Accumulators {
            copy: Some(&mut a_copy),
            out: &mut a_out,
            between: None,
        };
        staged::queue(&stg.compute, item.op, policy, &src, &mut dst, acc)?;
        stg.compute.synchronize()?;
        if fp {
            let mut a = [0u64; 2];
            slot.acc.slice(0..2)?.copy_dtoh(&stg.compute, &mut a)?;
            if let Some(f) = compare(&sums, item, len, a) {
                return Ok(Some(f));
            }
        }
        off += len as u64;
    }
    Ok(None)
}

/// The host memory a chunk is staged in.
enum Via<'b> {
    /// The small-chunks rung's pinned buffer.
    Pinned(&'b mut PinnedBuffer<u8>),
    /// Pageable memory (the pageable rung), reused between chunks.
    Pageable(&'b mut Vec<u8>),
}

/// Reads bytes `range` of `item` into host memory (`via`) and copies them
/// into `slot`'s staging, synchronously; returns their host sums (`fp`:
/// where fingerprints are compared).
fn stage_chunk(
    stg: &Staging,
    sources: &[Source],
    item: &Item,
    range: std::ops::Range<u64>,
    slot: &mut Slot,
    via: Via<'_>,
    fp: bool,
) -> Result<source::Sums> {
    let (off, len) = (range.start, (range.end - range.start) as usize);
    let read_bytes = stg.opts.read_bytes;
    let mut stage = slot.stage.slice_mut(0..len)?;
    match via {
        Via::Pinned(buf) => {
            let mem = buf.as_mut_slice()?;
            let have = mem.len();
            let region = mem.get_mut(..len).ok_or(Error::OutOfBounds {
                op: "small chunk",
                start: 0,
                end: len,
                len: have,
            })?;
            let sums = source::read_piece(sources, item, off, region, read_bytes, fp)?;
            stage.copy_htod_async_range(&stg.copy, buf, 0)?;
            stg.copy.synchronize()?;
            Ok(sums)
        }
        Via::Pageable(host) => {
            host.resize(len, 0);
            let sums = source::read_piece(sources, item, off, host, read_bytes, fp)?;
            // Synchronous copy from pageable memory.
            stage.copy_htod(&stg.copy, host)?;
            Ok(sums)
        }
    }
}

/// The CPU-convert rung: convert each chunk on the CPU, copy the result
/// synchronously, check the device's fingerprint of it.
fn cpu_convert(
    stg: &mut Staging,
    sources: &[Source],
    item: &Item,
    st: &mut State,
) -> Result<Option<Failure>> {
    stg.ensure_out(item, st)?;
    let policy = stg.policy();
    let fp = matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint);
    let Some(out) = st.out.as_mut() else {
        return Ok(None);
    };
    let src = source::of_item(sources, item)?;
    let ss = item.dtype.size().unwrap_or(1).max(1);
    let chunk = stg.opts.buffer_bytes / 8 * 8 / ss * ss;
    let mut off = 0u64;
    while off < item.src_bytes {
        let len = chunk.min((item.src_bytes - off) as usize);
        let mut raw = vec![0u8; len];
        item.pread(src, &mut raw, off)?;
        let conv = source::cpu_output(&src.path, item, raw)?;
        let o = item.out_off(off) as usize;
        let mut dst = out.slice_mut(o..o + conv.len())?;
        dst.copy_htod(&stg.compute, &conv)?;
        if fp {
            let expected = fingerprint::fingerprint_bytes(&conv);
            let actual = stg.compute.fingerprint(&dst.as_view())?;
            if expected != actual {
                return Ok(Some(Failure::FingerprintMismatch {
                    check: Check::Copy,
                    expected,
                    actual,
                }));
            }
        }
        off += len as u64;
    }
    if policy == Policy::ReadBack {
        return readback(sources, item, st.out.as_ref());
    }
    Ok(None)
}

/// The keep-on-host rung: the tensor read (and converted) on the host.
fn keep_on_host(sources: &[Source], item: &Item, st: &mut State) -> Result<Option<Failure>> {
    let src = source::of_item(sources, item)?;
    let mut raw = crate::alloc::tensor_bytes(&src.path, &item.name, item.src_bytes)?;
    item.pread(src, &mut raw, 0)?;
    st.host = Some(source::cpu_output(&src.path, item, raw)?);
    st.out = None;
    Ok(None)
}

/// Errors that no rung can help with: every rung reads the file, and it
/// cannot be read ([`ErrorKind::Io`]) or changed since it was opened
/// ([`ErrorKind::Changed`]).
fn is_fatal(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Io | ErrorKind::Changed)
}

/// The error a failed rung becomes when no fallback is allowed.
fn transfer_failed(item: &Item, a: Attempt<Rung>) -> Error {
    let failure = a.failure.to_string();
    let source = match a.failure {
        Failure::Error(e) => Some(Box::new(e)),
        _ => None,
    };
    Error::TransferFailed {
        tensor: item.name.clone(),
        rung: a.step.name(),
        failure,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ladder stops on what no rung can help with: a file that cannot
    /// be read or that changed since it was opened (each rung reads it
    /// again); memory, device and check failures go down the ladder.
    #[test]
    fn fatal_errors_are_the_files() {
        let path = || std::path::PathBuf::from("m.safetensors");
        let fatal = [
            Error::Io {
                path: path(),
                op: "read",
                source: std::io::Error::from_raw_os_error(5),
            },
            Error::FileShrunk {
                path: path(),
                tensor: "w".into(),
                expected: 10,
                actual: 5,
            },
            Error::FileChanged {
                path: path(),
                tensor: Some("w".into()),
                what: "size",
            },
        ];
        for e in &fatal {
            assert!(is_fatal(e), "{e}");
        }
        let rung_failures = [
            Error::OutOfMemory {
                backend: "host",
                op: "alloc",
                bytes: 1,
            },
            Error::InjectedFault {
                fault: crate::device::fault_kind::FaultKind::LaunchFailure,
                op: "convert",
            },
            Error::VerificationFailed {
                op: "convert".into(),
                device: "host:0".into(),
                expected: crate::convert::Fingerprint(1),
                actual: crate::convert::Fingerprint(2),
            },
        ];
        for e in &rung_failures {
            assert!(!is_fatal(e), "{e}");
        }
    }
}
