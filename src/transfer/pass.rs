//! The pinned ring's pass: fills on the rayon pool, each filled buffer's
//! copy, conversions and checks queued on the device, each slot's previous
//! job checked when the slot comes round again.
//!
//! [`run`] makes (or grows) the ring, packs the jobs and drives a [`Pass`]
//! turn by turn: take the buffers pinned since, start fills on the free
//! ones, wait for one fill, check the job its slot held before, queue its
//! job ([`Queue`]). A fill that cannot read the file aborts the pass (no
//! rung can help); a device failure or a mismatch fails only the tensors
//! of that job, which then go down the ladder.

use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::checks::{compare, readback, IntoPair};
use super::direct::Direct;
use super::plan::{self, Job, Piece};
use super::ring::{Ring, Slot};
use super::source::{self, Item, Source, Sums};
use super::staging::{LoadCtx, Staging, State};
use super::{Attempt, Failure, Rung};
use crate::device::{PinnedBuffer, Stream};
use crate::error::{Error, Result};
use crate::verify::{staged, Policy};

/// Runs the pinned ring over `ring_items`; returns the number of jobs.
/// Errors only where the file cannot be read or a check cannot run.
pub(super) fn run(stg: &mut Staging, cx: &mut LoadCtx<'_>, ring_items: &[usize]) -> Result<u64> {
    let span = tracing::info_span!(
        "transfer.ring",
        rung = Rung::PinnedRing.name(),
        tensors = ring_items.len()
    );
    let _g = span.enter();
    if let Err(e) = stg.ensure_ring() {
        tracing::warn!(error = %e, "pinned ring unavailable");
        fail_shared(&mut cx.states, ring_items.iter().copied(), cx.items, e);
        stg.ring = None;
        return Ok(0);
    }
    let jobs = plan::pack(cx.items, ring_items, stg.opts.buffer_bytes);
    let policy = stg.policy();
    let Some(mut ring) = stg.ring.take() else {
        return Ok(0);
    };
    let direct = if stg.opts.direct {
        Direct::plan(
            &stg.device,
            cx.sources,
            cx.items,
            &jobs,
            stg.opts.direct_share,
        )
    } else {
        None
    };
    let r = Pass::new(stg, &mut ring, cx, &jobs, policy, direct.as_ref()).run();
    if let Some(d) = &direct {
        cx.direct.refused = d.refusal();
    }
    // Windows still registered are released here (after a synchronize).
    drop(direct);
    // Buffers not back from the filler (after an error) are gone: replace
    // them on the next load.
    if ring.whole() {
        stg.ring = Some(ring);
    }
    r.map(|_| jobs.len() as u64)
}

/// A finished fill.
struct Filled {
    job: usize,
    slot: usize,
    buf: PinnedBuffer<u8>,
    sums: Result<Vec<Sums>>,
    /// Waiting for the buffer's previous copy.
    blocked: Duration,
    /// Reading and summing.
    busy: Duration,
    /// The job's bytes stay in the file's registered pages: its copy is
    /// the direct path's.
    direct: bool,
}

/// What a fill task needs: the jobs, the files, how to read.
struct Fills<'s> {
    sources: &'s [Source],
    items: &'s [Item],
    jobs: &'s [Job],
    /// Slots in the ring (how far ahead to read).
    slots: usize,
    readahead: bool,
    read_bytes: usize,
    /// Host sums only where fingerprints are compared.
    check: bool,
    tx: mpsc::Sender<Filled>,
    direct: Option<&'s Direct>,
}

impl<'s> Fills<'s> {
    /// Fills buffer `buf` of slot `s` with job `j` on a rayon task (after
    /// advising the job a ring's length ahead); the result comes back on
    /// the channel.
    fn spawn(&self, scope: &rayon::Scope<'s>, j: usize, s: usize, mut buf: PinnedBuffer<u8>) {
        let (sources, items, jobs, tx) = (self.sources, self.items, self.jobs, self.tx.clone());
        let direct = self.direct;
        let (ahead, read_bytes, check) = (
            self.readahead.then_some(j + self.slots),
            self.read_bytes,
            self.check,
        );
        scope.spawn(move |_| {
            if let Some(job) = ahead.and_then(|a| jobs.get(a)) {
                advise(sources, items, job);
            }
            // The direct path: register the job's windows and sum its bytes
            // from the file; the buffer is not touched.
            if let (Some(d), Some(job)) = (direct, jobs.get(j)) {
                let t0 = Instant::now();
                if d.prepare(j) {
                    let sums = d.sums(sources, items, job, read_bytes, check);
                    let _ = tx.send(Filled {
                        job: j,
                        slot: s,
                        buf,
                        sums,
                        blocked: Duration::ZERO,
                        busy: t0.elapsed(),
                        direct: true,
                    });
                    return;
                }
            }
            // Wait for the buffer's previous copy here, timed, so the fill
            // below never blocks.
            let t0 = Instant::now();
            let waited = buf.wait();
            let t1 = Instant::now();
            let sums = match (waited, jobs.get(j)) {
                (Err(e), _) => Err(e),
                (Ok(()), Some(job)) => fill(sources, items, job, &mut buf, read_bytes, check),
                (Ok(()), None) => Ok(Vec::new()),
            };
            let (blocked, busy) = (t1 - t0, t1.elapsed());
            let _ = tx.send(Filled {
                job: j,
                slot: s,
                buf,
                sums,
                blocked,
                busy,
                direct: false,
            });
        });
    }
}

/// The device side of the pass: queues a job's work, checks a finished one.
struct Queue<'p> {
    copy: &'p Stream,
    compute: &'p Stream,
    policy: Policy,
}

/// One pass of the ring over a load's jobs (see the module docs).
struct Pass<'p, 'a> {
    q: Queue<'p>,
    ring: &'p mut Ring,
    cx: &'p mut LoadCtx<'a>,
    jobs: &'p [Job],
    readahead: bool,
    read_bytes: usize,
    /// Most fills at once.
    max_fills: usize,
    /// The next job to fill.
    next: usize,
    /// Fills running.
    outstanding: usize,
    /// Buffers free for the next fill, in the order they were submitted
    /// (each fill first waits for its buffer's copy).
    free: VecDeque<(usize, PinnedBuffer<u8>)>,
    /// Per slot: the job queued on it and its host sums, not yet checked.
    in_flight: Vec<Option<(usize, Vec<Sums>)>>,
    /// The direct path, where the load takes it.
    direct: Option<&'p Direct>,
    /// Windows of the direct path no pending job reads: unregistered on the
    /// pool at the next turn.
    release: Vec<usize>,
    /// A fill's read error: the pass stops starting fills, collects the
    /// running ones' buffers and returns it.
    result: Result<()>,
}

impl<'p, 'a> Pass<'p, 'a> {
    fn new(
        stg: &'p Staging,
        ring: &'p mut Ring,
        cx: &'p mut LoadCtx<'a>,
        jobs: &'p [Job],
        policy: Policy,
        direct: Option<&'p Direct>,
    ) -> Self {
        // Slots whose buffers are still being pinned count: their buffers
        // join the pass as they come (`Ring::take_grown`).
        let n = ring.slots.len();
        let free = ring.take_pinned().into();
        Pass {
            q: Queue {
                copy: &stg.copy,
                compute: &stg.compute,
                policy,
            },
            ring,
            cx,
            jobs,
            readahead: stg.opts.readahead,
            read_bytes: stg.opts.read_bytes,
            max_fills: stg.opts.concurrent_fills.unwrap_or(n).clamp(1, n.max(1)),
            next: 0,
            outstanding: 0,
            free,
            in_flight: (0..n).map(|_| None).collect(),
            direct,
            release: Vec::new(),
            result: Ok(()),
        }
    }

    /// Runs the pass: fills as tasks on the rayon pool (each also split
    /// into sub-pieces), several jobs at once, so no job's tail leaves the
    /// pool idle; this thread only queues device work and checks. On a pool
    /// that works in this process (a fork()ed child too).
    fn run(mut self) -> Result<()> {
        let (tx, rx) = mpsc::channel::<Filled>();
        let fills = Fills {
            sources: self.cx.sources,
            items: self.cx.items,
            jobs: self.jobs,
            slots: self.ring.slots.len(),
            readahead: self.readahead,
            read_bytes: self.read_bytes,
            check: fingerprints(self.q.policy),
            tx,
            direct: self.direct,
        };
        if self.readahead {
            for job in self.jobs.iter().take(fills.slots) {
                advise(fills.sources, fills.items, job);
            }
        }
        crate::par::in_place_scope(|scope| -> Result<()> {
            while self.turn(scope, &fills, &rx)? {}
            self.finish()
        })
    }

    /// One turn: buffers pinned since, new fills, one finished fill
    /// handled. `false` when the pass is over.
    fn turn<'s>(
        &mut self,
        scope: &rayon::Scope<'s>,
        fills: &Fills<'s>,
        rx: &mpsc::Receiver<Filled>,
    ) -> Result<bool> {
        if !self.take_grown() {
            return Ok(false);
        }
        // Start fills on free buffers (none once aborting).
        while self.result.is_ok()
            && self.outstanding < self.max_fills
            && self.next < self.jobs.len()
        {
            let Some((s, buf)) = self.free.pop_front() else {
                break;
            };
            fills.spawn(scope, self.next, s, buf);
            self.next += 1;
            self.outstanding += 1;
        }
        if self.outstanding == 0 {
            return Ok(false);
        }
        let tw = Instant::now();
        let Ok(done) = rx.recv() else {
            return Ok(false);
        };
        let t = &mut self.cx.timing;
        t.wait_fill_ms += tw.elapsed().as_secs_f32() * 1e3;
        t.fill_blocked_ms += done.blocked.as_secs_f32() * 1e3;
        t.fill_busy_ms += done.busy.as_secs_f32() * 1e3;
        self.outstanding -= 1;
        self.filled(done)?;
        if let Some(d) = fills.direct {
            for w in self.release.drain(..) {
                scope.spawn(move |_| d.release(w));
            }
        }
        Ok(true)
    }

    /// Buffers pinned since join the free ones; with nothing free and no
    /// fill running, waits for the next. `false` when not one buffer could
    /// be pinned: no job has started, the rest fail on the ring.
    fn take_grown(&mut self) -> bool {
        let idle = self.free.is_empty() && self.outstanding == 0 && self.next < self.jobs.len();
        let tp = Instant::now();
        let free = &mut self.free;
        let failed = self
            .ring
            .take_grown(idle && self.result.is_ok(), &mut |s, b| {
                free.push_back((s, b))
            });
        if idle {
            self.cx.timing.wait_pin_ms += tp.elapsed().as_secs_f32() * 1e3;
        }
        let Some(e) = failed else { return true };
        tracing::warn!(error = %e, "pinned ring unavailable");
        let rest = self
            .jobs
            .iter()
            .skip(self.next)
            .flat_map(|j| j.pieces.iter());
        fail_shared(&mut self.cx.states, rest.map(|p| p.item), self.cx.items, e);
        false
    }

    /// A fill is done: check the job its slot held before, then queue this
    /// one (or, aborting, keep its buffer).
    fn filled(&mut self, done: Filled) -> Result<()> {
        let Filled {
            job: j,
            slot: s,
            mut buf,
            sums,
            direct,
            ..
        } = done;
        let (Some(job), Some(slot)) = (self.jobs.get(j), self.ring.slots.get_mut(s)) else {
            return Ok(());
        };
        if self.result.is_err() {
            // Aborting: collect the buffers of the fills still running.
            self.ring.put_back(s, buf);
            return Ok(());
        }
        // The job that used this slot before is done with it.
        if let Some((pj, psums)) = self.in_flight.get_mut(s).and_then(Option::take) {
            if let Some(pjob) = self.jobs.get(pj) {
                self.q.check(self.cx, slot, pjob, &psums)?;
            }
            if let Some(d) = self.direct {
                self.release.extend(d.done(pj));
            }
        }
        let sums = match sums {
            Ok(v) => v,
            Err(e) => {
                // The file cannot be read: no rung can help.
                self.result = Err(e);
                self.ring.put_back(s, buf);
                return Ok(());
            }
        };
        let t = Instant::now();
        for p in &job.pieces {
            if let Some(st) = self.cx.states.get_mut(p.item) {
                st.t0.get_or_insert(t);
            }
        }
        let from = match (direct, self.direct) {
            (true, Some(d)) => {
                self.cx.direct.jobs += 1;
                self.cx.direct.bytes += job.pieces.iter().map(|p| p.len as u64).sum::<u64>();
                From::Direct(d, j)
            }
            _ => From::Buffer(&mut buf),
        };
        if let Err(e) = self.q.submit(self.cx, slot, from, job) {
            tracing::warn!(job = j, error = %e, "pinned ring: job failed");
            fail_shared(
                &mut self.cx.states,
                job.pieces.iter().map(|p| p.item),
                self.cx.items,
                e,
            );
            // Leave the slot consumed so later jobs may use it.
            let _ = self.q.compute.record(&slot.consumed);
        }
        if let Some(f) = self.in_flight.get_mut(s) {
            *f = Some((j, sums));
        }
        // The next fill starts at once on the oldest free buffer: its task
        // waits for that buffer's copy first (the wait is timed). Handing
        // a buffer out only when its copy is done was measured slower
        // (BENCHMARKS.md, "Verified load"): the wake-up latency adds to
        // every turnaround.
        self.free.push_back((s, buf));
        Ok(())
    }

    /// The end of the pass: unused buffers (with those pinned since) go
    /// back to the ring, the jobs still on the device are checked; the
    /// pass's read error, if any, is its result.
    fn finish(mut self) -> Result<()> {
        let free = &mut self.free;
        let _ = self
            .ring
            .take_grown(false, &mut |s, b| free.push_back((s, b)));
        while let Some((s, buf)) = self.free.pop_front() {
            self.ring.put_back(s, buf);
        }
        for (s, slot) in self.ring.slots.iter_mut().enumerate() {
            if let Some((pj, sums)) = self.in_flight.get_mut(s).and_then(Option::take) {
                if let Some(pjob) = self.jobs.get(pj) {
                    self.q.check(self.cx, slot, pjob, &sums)?;
                }
                if let Some(d) = self.direct {
                    for w in d.done(pj) {
                        d.release(w);
                    }
                }
            }
        }
        self.result
    }
}

/// Where a job's bytes are copied from.
enum From<'b> {
    /// Its filled pinned buffer.
    Buffer(&'b mut PinnedBuffer<u8>),
    /// The file's registered pages (the direct path), job index.
    Direct(&'b Direct, usize),
}

/// Whether `policy` compares fingerprints (the host sums them).
fn fingerprints(policy: Policy) -> bool {
    matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint)
}

impl Queue<'_> {
    /// Queues one job: copy (out of its filled buffer, or the direct
    /// path's copies from the file's registered pages), checks,
    /// conversions.
    fn submit(
        &self,
        cx: &mut LoadCtx<'_>,
        slot: &mut Slot,
        from: From<'_>,
        job: &Job,
    ) -> Result<()> {
        if job.used == 0 {
            return Ok(());
        }
        self.copy.wait(&slot.consumed)?;
        match from {
            From::Buffer(buf) => slot
                .stage
                .slice_mut(0..job.used)?
                .copy_htod_async_range(self.copy, buf, 0)?,
            From::Direct(d, j) => d.copy(j, &mut slot.stage, self.copy)?,
        }
        self.copy.record(&slot.copied)?;
        self.compute.wait(&slot.copied)?;
        slot.acc.memset_zero()?;
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
            staged::queue(self.compute, item.op, self.policy, &src, &mut dst, acc)?;
        }
        if fingerprints(self.policy) {
            slot.acc
                .view_mut()
                .copy_dtoh_async(self.compute, &mut slot.acc_host)?;
        }
        self.compute.record(&slot.consumed)?;
        Ok(())
    }

    /// Checks a finished job's fingerprints and marks its tensors.
    fn check(&self, cx: &mut LoadCtx<'_>, slot: &mut Slot, job: &Job, sums: &[Sums]) -> Result<()> {
        let fp = fingerprints(self.policy);
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
                let a = [0, 1].map(|i| acc.get(2 * k + i).copied().unwrap_or(0));
                if let Some(failure) = compare(&want, item, p.len, a) {
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
                self.served(cx.sources, item, st)?;
                if st.served.is_some() {
                    cx.prog.done_tensors += 1;
                }
            }
        }
        cx.report_progress();
        Ok(())
    }

    /// Every piece of `item` checked out: served, or under
    /// [`Policy::ReadBack`] first read back and compared.
    fn served(&self, sources: &[Source], item: &Item, st: &mut State) -> Result<()> {
        if self.policy == Policy::ReadBack {
            if let Some(failure) = readback(sources, item, st.out.as_ref())? {
                st.failed = Some(Attempt {
                    step: Rung::PinnedRing,
                    failure,
                });
                return Ok(());
            }
        }
        st.served = Some(Rung::PinnedRing);
        Ok(())
    }
}

/// Marks `which` items failed on the pinned ring by one error: the first
/// (in request order) gets the error, the others point to it.
pub(super) fn fail_shared(
    states: &mut [State],
    which: impl Iterator<Item = usize>,
    items: &[Item],
    e: Error,
) {
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
                // A strided piece: the file span from its first byte to its last.
                let first = item.file_at(p.src_off);
                let last = item.file_at(p.src_off + (p.len as u64).max(1) - 1);
                src.advise_willneed(first, last + 1 - first);
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
