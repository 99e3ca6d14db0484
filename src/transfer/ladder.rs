//! The ladder below the pinned ring, each rung's failure recorded.
//!
//! Small chunks, pageable copy, CPU conversion, keep on host: each rung
//! tried in turn, each failure recorded.

use std::time::Instant;

use super::checks::{compare, IntoPair};
use super::plan::State;
use super::ring::Slot;
use super::source::{self, Item, Source};
use super::{Attempt, Check, Failure, Fallback, Loader, Rung};
use crate::convert::fingerprint;
use crate::device::{DeviceBuffer, PinnedBuffer};
use crate::error::{Error, ErrorKind, Result};
use crate::verify::staged;
use crate::verify::Policy;

impl Loader {
    /// Serves `item` on the rungs after the pinned ring (or from its start
    /// rung), recording every failure.
    pub(super) fn ladder(&mut self, sources: &[Source], item: &Item, st: &mut State) -> Result<()> {
        if let Some(a) = st.failed.take() {
            st.attempts.push(a);
        }
        let ladder = self.opts.fallback == Fallback::Ladder;
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
            let span =
                tracing::info_span!("transfer.rung", rung = rung.name(), tensor = %item.name);
            let _g = span.enter();
            st.t0.get_or_insert_with(Instant::now);
            let r = match rung {
                Rung::PinnedRing | Rung::SmallChunks => self.rung_staged(sources, item, st, true),
                Rung::Pageable => self.rung_staged(sources, item, st, false),
                Rung::CpuConvert => self.rung_cpu(sources, item, st),
                Rung::KeepOnHost => self.rung_host(sources, item, st),
            };
            let failure = match r {
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

    /// The tensor's device buffer (allocated, with the out-of-memory retry).
    pub(super) fn ensure_out(&mut self, item: &Item, st: &mut State) -> Result<()> {
        if st.out.is_none() {
            let (r, retried) = self.alloc_retry::<u8>(item.out_bytes as usize);
            st.oom_retried |= retried;
            st.out = Some(r?);
        }
        Ok(())
    }

    /// The small-chunks rung (`pinned`) or the pageable rung: stage a chunk,
    /// copy it synchronously, convert and check on the device, wait.
    pub(super) fn rung_staged(
        &mut self,
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
        self.ensure_out(item, st)?;
        let chunk = if pinned {
            self.opts.small_chunk_bytes
        } else {
            self.opts.buffer_bytes
        };
        if self.scratch.is_none() {
            self.scratch = Some(self.make_slot(self.opts.buffer_bytes, true)?);
        }
        if pinned && self.scratch_pinned.is_none() {
            self.scratch_pinned = Some(
                self.device
                    .alloc_pinned::<u8>(self.opts.small_chunk_bytes)?,
            );
        }
        let (Some(mut slot), Some(out)) = (self.scratch.take(), st.out.as_mut()) else {
            return Ok(None);
        };
        let mut pbuf = self.scratch_pinned.take();
        let r = self.staged_chunks(sources, item, out, &mut slot, pbuf.as_mut(), chunk);
        self.scratch = Some(slot);
        self.scratch_pinned = pbuf;
        let f = r?;
        if f.is_some() {
            return Ok(f);
        }
        if self.policy() == Policy::ReadBack {
            return self.readback(sources, item, st.out.as_ref());
        }
        Ok(None)
    }

    pub(super) fn staged_chunks(
        &self,
        sources: &[Source],
        item: &Item,
        out: &mut DeviceBuffer<u8>,
        slot: &mut Slot,
        mut pinned: Option<&mut PinnedBuffer<u8>>,
        chunk: usize,
    ) -> Result<Option<Failure>> {
        let policy = self.policy();
        let fp = matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint);
        let mut host = Vec::new();
        let mut off = 0u64;
        while off < item.src_bytes {
            let len = chunk.min((item.src_bytes - off) as usize);
            let mut stage = slot.stage.slice_mut(0..len)?;
            let sums = match pinned.as_deref_mut() {
                Some(buf) => {
                    let mem = buf.as_mut_slice()?;
                    let have = mem.len();
                    let region = mem.get_mut(..len).ok_or(Error::OutOfBounds {
                        op: "small chunk",
                        start: 0,
                        end: len,
                        len: have,
                    })?;
                    let sums =
                        source::read_piece(sources, item, off, region, self.opts.read_bytes, fp)?;
                    stage.copy_htod_async_range(&self.copy, buf, 0)?;
                    self.copy.synchronize()?;
                    sums
                }
                None => {
                    host.resize(len, 0);
                    let sums = source::read_piece(
                        sources,
                        item,
                        off,
                        &mut host,
                        self.opts.read_bytes,
                        fp,
                    )?;
                    // Synchronous copy from pageable memory.
                    stage.copy_htod(&self.copy, &host)?;
                    sums
                }
            };
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
            staged::queue(&self.compute, item.op, policy, &src, &mut dst, acc)?;
            self.compute.synchronize()?;
            if fp {
                let mut a = [0u64; 2];
                slot.acc.slice(0..2)?.copy_dtoh(&self.compute, &mut a)?;
                if let Some(f) = compare(&sums, item, len, a) {
                    return Ok(Some(f));
                }
            }
            off += len as u64;
        }
        Ok(None)
    }

    /// The CPU-convert rung: convert each chunk on the CPU, copy the result
    /// synchronously, check the device's fingerprint of it.
    pub(super) fn rung_cpu(
        &mut self,
        sources: &[Source],
        item: &Item,
        st: &mut State,
    ) -> Result<Option<Failure>> {
        self.ensure_out(item, st)?;
        let policy = self.policy();
        let fp = matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint);
        let Some(out) = st.out.as_mut() else {
            return Ok(None);
        };
        let src = source::of_item(sources, item)?;
        let ss = item.dtype.size().unwrap_or(1).max(1);
        let chunk = self.opts.buffer_bytes / 8 * 8 / ss * ss;
        let mut off = 0u64;
        while off < item.src_bytes {
            let len = chunk.min((item.src_bytes - off) as usize);
            let mut raw = vec![0u8; len];
            src.pread(&item.name, &mut raw, item.file_off + off)?;
            let conv = source::cpu_output(&src.path, item, raw)?;
            let o = item.out_off(off) as usize;
            let mut dst = out.slice_mut(o..o + conv.len())?;
            dst.copy_htod(&self.compute, &conv)?;
            if fp {
                let expected = fingerprint::fingerprint_bytes(&conv);
                let actual = self.compute.fingerprint(&dst.as_view())?;
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
            return self.readback(sources, item, st.out.as_ref());
        }
        Ok(None)
    }

    /// The keep-on-host rung.
    pub(super) fn rung_host(
        &mut self,
        sources: &[Source],
        item: &Item,
        st: &mut State,
    ) -> Result<Option<Failure>> {
        let src = source::of_item(sources, item)?;
        let mut raw = crate::alloc::tensor_bytes(&src.path, &item.name, item.src_bytes)?;
        src.pread(&item.name, &mut raw, item.file_off)?;
        st.host = Some(source::cpu_output(&src.path, item, raw)?);
        st.out = None;
        Ok(None)
    }
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
                fault: crate::error::FaultKind::LaunchFailure,
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
