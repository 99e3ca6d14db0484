//! The pinned ring: its slots, the job loop, the fill of one pinned buffer.
//!
//! Fills run as tasks on the rayon pool; the loop queues each filled
//! buffer's copy, conversions and checks on the device, and checks a slot's
//! previous job when the slot comes round again. The ring's device slots
//! are made at once; its pinned buffers come from a [`Grower`] (`grow.rs`)
//! and join the loop as they are pinned.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::checks::{compare, IntoPair};
use super::grow::Grower;
use super::plan::{Job, Piece, State, MAX_PIECES};
use super::source::{self, Item, Source, Sums};
use super::{Attempt, Failure, LoadCtx, Loader, Rung};
use crate::device::{DeviceBuffer, Event, PinnedBuffer};
use crate::error::{Error, Result};
use crate::verify::staged;
use crate::verify::Policy;

/// The device side of one ring slot.
pub(super) struct Slot {
    /// The staged bytes, copied from a pinned buffer.
    pub stage: DeviceBuffer<u8>,
    /// Fingerprint sums of each piece: copy, output.
    pub acc: DeviceBuffer<u64>,
    /// `acc` copied back.
    pub acc_host: PinnedBuffer<u64>,
    /// Recorded on the copy stream after the copy into `stage`.
    pub copied: Event,
    /// Recorded on the compute stream after the last read of `stage`.
    pub consumed: Event,
}

/// Device resources of the pinned ring, allocated on first use.
pub(super) struct Ring {
    /// The pinned buffers (`None` while a fill holds one, or while the
    /// grower still pins it).
    pub pinned: Vec<Option<PinnedBuffer<u8>>>,
    /// Their device slots.
    pub slots: Vec<Slot>,
    /// Pins the buffers of the slots still without one.
    pub grower: Option<Grower>,
}

impl Loader {
    /// A slot over `bytes` of device staging; the ring's first is retried
    /// once after releasing cached memory, the others are not (a ring that
    /// cannot grow works with the slots it has).
    pub(super) fn make_slot(&mut self, bytes: usize, retry: bool) -> Result<Slot> {
        if !retry {
            let stage = self.compute.alloc::<u8>(bytes)?;
            return self.slot_from(stage, self.compute.alloc::<u64>(2 * MAX_PIECES)?);
        }
        let (stage, r1) = self.alloc_retry::<u8>(bytes);
        let (acc, r2) = self.alloc_retry::<u64>(2 * MAX_PIECES);
        let _ = (r1, r2);
        self.slot_from(stage?, acc?)
    }

    /// A slot over its device staging buffer and accumulators: the pinned
    /// copy of the sums and the two events, recorded so the slot starts
    /// free.
    fn slot_from(&self, stage: DeviceBuffer<u8>, acc: DeviceBuffer<u64>) -> Result<Slot> {
        let slot = Slot {
            stage,
            acc,
            acc_host: self.device.alloc_pinned::<u64>(2 * MAX_PIECES)?,
            copied: self.device.event()?,
            consumed: self.device.event()?,
        };
        self.compute.record(&slot.consumed)?;
        self.copy.record(&slot.copied)?;
        Ok(slot)
    }

    /// The ring: all of its device slots at once (as far as device memory
    /// allows), and a [`Grower`] pinning their host buffers on a thread of
    /// its own, so the load goes on (outputs, self-test, the first fills)
    /// while they are pinned. A ring left short (an allocation or a pinning
    /// failed) grows again here, at the next load. Errors only when not
    /// even one slot can be made.
    pub(super) fn ensure_ring(&mut self) -> Result<()> {
        let (bytes, want) = (self.opts.buffer_bytes, self.opts.ring_buffers);
        let mut ring = self.ring.take().unwrap_or(Ring {
            pinned: Vec::new(),
            slots: Vec::new(),
            grower: None,
        });
        let from = ring.slots.len();
        if ring.grower.is_none() {
            while ring.slots.len() < want {
                match self.make_slot(bytes, ring.slots.is_empty()) {
                    Ok(slot) => {
                        ring.slots.push(slot);
                        ring.pinned.push(None);
                    }
                    Err(e) if ring.slots.is_empty() => return Err(e),
                    Err(e) => {
                        tracing::debug!(error = %e, slots = ring.slots.len(), "pinned ring: short");
                        break;
                    }
                }
            }
        }
        if ring.slots.len() > from {
            ring.grower = Some(Grower::start(&self.device, from..ring.slots.len(), bytes));
        }
        self.ring = Some(ring);
        Ok(())
    }

    /// Starts the ring as a load begins, before its outputs are allocated
    /// and its self-test runs, so that the ring's pinning (128 MiB, about
    /// 10 ms) overlaps them and the first fills. Not when the ring will not
    /// be used (another rung forced, only empty tensors), nor under a
    /// memory budget (a budget below the staging keeps every tensor on the
    /// host: the ring pass, which makes the ring, does not run). Errors are
    /// left for the ring pass to meet and report.
    pub(super) fn start_ring(&mut self, items: &[Item]) {
        let ring_first =
            !matches!(self.opts.fallback, super::Fallback::Force(r) if r != Rung::PinnedRing);
        if ring_first && self.opts.memory_budget.is_none() && items.iter().any(|i| i.src_bytes > 0)
        {
            let _ = self.ensure_ring();
        }
    }

    /// Runs the pinned ring over `ring_items`; returns the number of jobs.
    pub(super) fn ring_pass(&mut self, cx: &mut LoadCtx<'_>, ring_items: &[usize]) -> Result<u64> {
        let span = tracing::info_span!(
            "transfer.ring",
            rung = Rung::PinnedRing.name(),
            tensors = ring_items.len()
        );
        let _g = span.enter();
        if let Err(e) = self.ensure_ring() {
            tracing::warn!(error = %e, "pinned ring unavailable");
            fail_shared(&mut cx.states, ring_items.iter().copied(), cx.items, e);
            self.ring = None;
            return Ok(0);
        }
        let jobs = self.pack(cx.items, ring_items);
        let policy = self.policy();
        let Some(mut ring) = self.ring.take() else {
            return Ok(0);
        };
        let r = self.run_jobs(&mut ring, cx, &jobs, policy);
        // Buffers not back from the filler (after an error) are gone:
        // replace them on the next load.
        if ring.whole() {
            self.ring = Some(ring);
        }
        r.map(|_| jobs.len() as u64)
    }

    /// The job loop: starts fills, queues each filled buffer's device work,
    /// checks each slot's previous job before its next.
    fn run_jobs(
        &self,
        ring: &mut Ring,
        cx: &mut LoadCtx<'_>,
        jobs: &[Job],
        policy: Policy,
    ) -> Result<()> {
        // Slots whose buffers are still being pinned count: their buffers
        // join the loop as they come (`Ring::take_grown`).
        let n = ring.slots.len();
        let (sources, items) = (cx.sources, cx.items);
        /// A finished fill: job, slot, buffer, sums, (blocked, busy) time.
        type Done = (
            usize,
            usize,
            PinnedBuffer<u8>,
            Result<Vec<Sums>>,
            (Duration, Duration),
        );
        let (tx, rx) = mpsc::channel::<Done>();
        let readahead = self.opts.readahead;
        let read_bytes = self.opts.read_bytes;
        // Host sums only where fingerprints are compared.
        let check = matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint);
        // Fills run as tasks on the rayon pool (each also split into
        // sub-pieces), several jobs at once, so no job's tail leaves the
        // pool idle; this thread only queues device work and checks.
        // On a pool that works in this process (a fork()ed child too).
        crate::par::in_place_scope(|scope| -> Result<()> {
            let spawn = |j: usize, s: usize, mut buf: PinnedBuffer<u8>| {
                let tx = tx.clone();
                scope.spawn(move |_| {
                    if readahead {
                        if let Some(ahead) = jobs.get(j + n) {
                            advise(sources, items, ahead);
                        }
                    }
                    // Wait for the buffer's previous copy here, timed, so
                    // the fill below never blocks.
                    let t0 = Instant::now();
                    let waited = buf.wait();
                    let t1 = Instant::now();
                    let r = match (waited, jobs.get(j)) {
                        (Err(e), _) => Err(e),
                        (Ok(()), Some(job)) => {
                            fill(sources, items, job, &mut buf, read_bytes, check)
                        }
                        (Ok(()), None) => Ok(Vec::new()),
                    };
                    let times = (t1 - t0, t1.elapsed());
                    let _ = tx.send((j, s, buf, r, times));
                });
            };
            let mut next = 0usize;
            let mut outstanding = 0usize;
            if readahead {
                for job in jobs.iter().take(n) {
                    advise(sources, items, job);
                }
            }
            // Buffers free for the next fill, in the order they were
            // submitted (each fill first waits for its buffer's copy).
            let max_fills = self.opts.concurrent_fills.unwrap_or(n).clamp(1, n.max(1));
            let mut free: std::collections::VecDeque<(usize, PinnedBuffer<u8>)> =
                (0..ring.slots.len())
                    .filter_map(|s| {
                        ring.pinned
                            .get_mut(s)
                            .and_then(Option::take)
                            .map(|b| (s, b))
                    })
                    .collect();
            let mut in_flight: Vec<Option<(usize, Vec<Sums>)>> = (0..n).map(|_| None).collect();
            let mut result = Ok(());
            loop {
                // Buffers pinned since join the free ones; with nothing free
                // and no fill running, wait for the next.
                let idle = free.is_empty() && outstanding == 0 && next < jobs.len();
                let tp = Instant::now();
                let failed = ring.take_grown(idle && result.is_ok(), &mut |s, b| {
                    free.push_back((s, b));
                });
                if idle {
                    cx.timing.wait_pin_ms += tp.elapsed().as_secs_f32() * 1e3;
                }
                if let Some(e) = failed {
                    // Not one buffer could be pinned: no job has started.
                    tracing::warn!(error = %e, "pinned ring unavailable");
                    let rest = jobs.iter().skip(next).flat_map(|j| j.pieces.iter());
                    fail_shared(&mut cx.states, rest.map(|p| p.item), items, e);
                    break;
                }
                // Start fills on free buffers (none once aborting).
                while result.is_ok() && outstanding < max_fills && next < jobs.len() {
                    let Some((s, buf)) = free.pop_front() else {
                        break;
                    };
                    spawn(next, s, buf);
                    next += 1;
                    outstanding += 1;
                }
                if outstanding == 0 {
                    break;
                }
                let tw = Instant::now();
                let Ok((j, s, mut buf, filled, (blocked, busy))) = rx.recv() else {
                    break;
                };
                cx.timing.wait_fill_ms += tw.elapsed().as_secs_f32() * 1e3;
                cx.timing.fill_blocked_ms += blocked.as_secs_f32() * 1e3;
                cx.timing.fill_busy_ms += busy.as_secs_f32() * 1e3;
                outstanding -= 1;
                let (Some(job), Some(slot)) = (jobs.get(j), ring.slots.get_mut(s)) else {
                    continue;
                };
                if result.is_err() {
                    // Aborting: collect the buffers of the fills still running.
                    if let Some(p) = ring.pinned.get_mut(s) {
                        *p = Some(buf);
                    }
                    continue;
                }
                // The job that used this slot before is done with it.
                if let Some((pj, sums)) = in_flight.get_mut(s).and_then(Option::take) {
                    if let Some(pjob) = jobs.get(pj) {
                        self.check_job(cx, slot, pjob, &sums, policy)?;
                    }
                }
                let sums = match filled {
                    Ok(v) => v,
                    Err(e) => {
                        // The file cannot be read: no rung can help.
                        result = Err(e);
                        if let Some(p) = ring.pinned.get_mut(s) {
                            *p = Some(buf);
                        }
                        continue;
                    }
                };
                let t = Instant::now();
                for p in &job.pieces {
                    if let Some(st) = cx.states.get_mut(p.item) {
                        st.t0.get_or_insert(t);
                    }
                }
                if let Err(e) = self.submit_job(cx, slot, &mut buf, job, policy) {
                    tracing::warn!(job = j, error = %e, "pinned ring: job failed");
                    fail_shared(&mut cx.states, job.pieces.iter().map(|p| p.item), items, e);
                    // Leave the slot consumed so later jobs may use it.
                    let _ = self.compute.record(&slot.consumed);
                }
                if let Some(f) = in_flight.get_mut(s) {
                    *f = Some((j, sums));
                }
                // The next fill starts at once on the oldest free buffer: its
                // task waits for that buffer's copy first (the wait is
                // timed). Handing a buffer out only when its copy is done
                // was measured slower (BENCHMARKS.md, "Verified load"): the
                // wake-up latency adds to every turnaround.
                free.push_back((s, buf));
            }
            // Unused buffers go back to the ring, with those pinned since.
            let _ = ring.take_grown(false, &mut |s, b| free.push_back((s, b)));
            while let Some((s, buf)) = free.pop_front() {
                if let Some(p) = ring.pinned.get_mut(s) {
                    *p = Some(buf);
                }
            }
            for s in 0..ring.slots.len() {
                if let (Some(Some((pj, sums))), Some(slot)) = (
                    in_flight.get_mut(s).map(Option::take),
                    ring.slots.get_mut(s),
                ) {
                    if let Some(pjob) = jobs.get(pj) {
                        self.check_job(cx, slot, pjob, &sums, policy)?;
                    }
                }
            }
            result
        })
    }

    /// Queues one job: copy, checks, conversions.
    fn submit_job(
        &self,
        cx: &mut LoadCtx<'_>,
        slot: &mut Slot,
        buf: &mut PinnedBuffer<u8>,
        job: &Job,
        policy: Policy,
    ) -> Result<()> {
        if job.used == 0 {
            return Ok(());
        }
        self.copy.wait(&slot.consumed)?;
        slot.stage
            .slice_mut(0..job.used)?
            .copy_htod_async_range(&self.copy, buf, 0)?;
        self.copy.record(&slot.copied)?;
        self.compute.wait(&slot.copied)?;
        slot.acc.memset_zero()?;
        let fp = matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint);
        for (k, p) in job.pieces.iter().enumerate() {
            let (Some(item), Some(st)) = (cx.items.get(p.item), cx.states.get_mut(p.item)) else {
                continue;
            };
            if st.failed.is_some() {
                continue;
            }
            let Some(out) = st.out.as_mut() else { continue };
            let src = slot.stage.slice(p.slot_off..p.slot_off + p.len)?;
            let o = item.out_off(p.src_off) as usize;
            let mut dst = out.slice_mut(o..o + item.out_len(p.len))?;
            let (mut a_copy, mut a_out) = slot
                .acc
                .view_mut()
                .split_at_mut(2 * k + 1)?
                .into_pair(2 * k)?;
            // The copy check, the conversion and the output check of the
            // piece, as the staged check queues them.
            let acc = staged::Accumulators {
                copy: Some(&mut a_copy),
                out: &mut a_out,
                between: None,
            };
            staged::queue(&self.compute, item.op, policy, &src, &mut dst, acc)?;
        }
        if fp {
            slot.acc
                .view_mut()
                .copy_dtoh_async(&self.compute, &mut slot.acc_host)?;
        }
        self.compute.record(&slot.consumed)?;
        Ok(())
    }

    /// Checks a finished job's fingerprints and marks its tensors.
    fn check_job(
        &self,
        cx: &mut LoadCtx<'_>,
        slot: &mut Slot,
        job: &Job,
        sums: &[Sums],
        policy: Policy,
    ) -> Result<()> {
        let fp = matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint);
        let tw = Instant::now();
        slot.consumed.synchronize()?;
        cx.timing.wait_device_ms += tw.elapsed().as_secs_f32() * 1e3;
        let acc: Vec<u64> = if fp {
            slot.acc_host.as_slice()?.to_vec()
        } else {
            Vec::new()
        };
        let now = Instant::now();
        for (k, p) in job.pieces.iter().enumerate() {
            let (Some(item), Some(st)) = (cx.items.get(p.item), cx.states.get_mut(p.item)) else {
                continue;
            };
            if st.failed.is_some() || st.out.is_none() {
                continue;
            }
            if fp {
                let want = sums.get(k).copied().unwrap_or_default();
                let a = [
                    acc.get(2 * k).copied().unwrap_or(0),
                    acc.get(2 * k + 1).copied().unwrap_or(0),
                ];
                let mismatch = compare(&want, item, p.len, a);
                if let Some(failure) = mismatch {
                    tracing::warn!(tensor = %item.name, %failure, "pinned ring: mismatch");
                    st.failed = Some(Attempt {
                        step: Rung::PinnedRing,
                        failure,
                    });
                    continue;
                }
            }
            st.t1 = Some(now);
            st.counted += p.len as u64;
            cx.prog.done_bytes += p.len as u64;
            if st.counted == item.src_bytes {
                if policy == Policy::ReadBack {
                    if let Some(f) = self.readback(cx.sources, item, st.out.as_ref())? {
                        st.failed = Some(Attempt {
                            step: Rung::PinnedRing,
                            failure: f,
                        });
                        continue;
                    }
                }
                st.served = Some(Rung::PinnedRing);
                cx.prog.done_tensors += 1;
            }
        }
        cx.report_progress();
        Ok(())
    }
}

/// Marks `which` items failed on the pinned ring by one error: the first
/// (in request order) gets the error, the others point to it.
fn fail_shared(states: &mut [State], which: impl Iterator<Item = usize>, items: &[Item], e: Error) {
    let mut first: Option<Error> = Some(e);
    let mut holder = String::new();
    for i in which {
        let (Some(st), Some(item)) = (states.get_mut(i), items.get(i)) else {
            continue;
        };
        if st.failed.is_some() {
            continue;
        }
        let failure = match first.take() {
            Some(e) => {
                holder = item.name.clone();
                Failure::Error(e)
            }
            None => Failure::JobFailed {
                with: holder.clone(),
            },
        };
        st.failed = Some(Attempt {
            step: Rung::PinnedRing,
            failure,
        });
    }
}

/// Asks the kernel to read a job's file ranges ahead (a cold page cache).
fn advise(sources: &[Source], items: &[Item], job: &Job) {
    for p in &job.pieces {
        if let Some(item) = items.get(p.item) {
            if let Some(src) = sources.get(item.source) {
                src.advise_willneed(item.file_off + p.src_off, p.len as u64);
            }
        }
    }
}

/// Fills a pinned buffer with a job's pieces; returns each piece's sums.
fn fill(
    sources: &[Source],
    items: &[Item],
    job: &Job,
    buf: &mut PinnedBuffer<u8>,
    read_bytes: usize,
    check: bool,
) -> Result<Vec<Sums>> {
    use rayon::prelude::*;
    let mut rest: &mut [u8] = buf.as_mut_slice()?;
    let total = rest.len();
    let mut regions: Vec<(&Piece, &mut [u8])> = Vec::with_capacity(job.pieces.len());
    let mut at = 0usize;
    for p in &job.pieces {
        let skip = p.slot_off.checked_sub(at);
        let r = std::mem::take(&mut rest);
        let (Some(skip), true) = (skip, skip.unwrap_or(0) + p.len <= r.len()) else {
            return Err(Error::OutOfBounds {
                op: "transfer fill",
                start: p.slot_off,
                end: p.slot_off + p.len,
                len: total,
            });
        };
        let (_, r) = r.split_at_mut(skip);
        let (region, r) = r.split_at_mut(p.len);
        rest = r;
        at = p.slot_off + p.len;
        regions.push((p, region));
    }
    crate::par::install(|| {
        regions
            .into_par_iter()
            .map(|(p, region)| match items.get(p.item) {
                Some(item) => {
                    source::read_piece(sources, item, p.src_off, region, read_bytes, check)
                }
                None => Ok(Sums::default()),
            })
            .collect()
    })
}
