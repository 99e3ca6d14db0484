//! The plan of a load: items from requests, first rungs, budget, jobs.
//!
//! Each request becomes an item (file range, dtypes, shape); each item gets
//! its first rung; the memory budget decides what stays on the host; the
//! device outputs are allocated; the ring items are packed into jobs (one
//! fill of a ring slot each).

use super::options::SPLIT_ALIGN;
use super::source::{Item, Source};
use super::{Attempt, Failure, Fallback, Loader, Request, Rung};
use crate::device::{ConvertOp, DeviceBuffer};
use crate::error::{Error, Result};
use crate::safetensors::Checkpoint;
use crate::verify;
use std::time::Instant;

/// Most pieces (tensors or parts of one) in one ring slot.
pub(super) const MAX_PIECES: usize = 256;
/// Alignment of pieces inside a slot (device convert kernels need aligned
/// sources; 256 keeps every piece on its own cache lines).
pub(super) const PIECE_ALIGN: usize = 256;

/// One piece of a job: bytes `src_off..src_off + len` of an item, staged
/// at `slot_off`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Piece {
    pub item: usize,
    pub src_off: u64,
    pub len: usize,
    pub slot_off: usize,
}

/// One fill of a ring slot.
#[derive(Debug, Default)]
pub(super) struct Job {
    pub pieces: Vec<Piece>,
    pub used: usize,
}

/// Per item state during a load.
pub(super) struct State {
    /// The first rung tried.
    pub start: Rung,
    /// The pinned ring's failure, not yet moved to `attempts`.
    pub failed: Option<Attempt<Rung>>,
    /// The rungs that failed, in order.
    pub attempts: Vec<Attempt<Rung>>,
    /// The device output.
    pub out: Option<DeviceBuffer<u8>>,
    /// The host output (keep-on-host rung).
    pub host: Option<Vec<u8>>,
    /// The rung that served.
    pub served: Option<Rung>,
    /// Whether an allocation ran out of memory and was retried.
    pub oom_retried: bool,
    /// Whether the budget kept it on the host.
    pub offloaded: bool,
    /// Why it starts below the pinned ring with nothing failed.
    pub routed: Option<String>,
    /// First operation.
    pub t0: Option<Instant>,
    /// Last check.
    pub t1: Option<Instant>,
    /// File bytes checked so far.
    pub counted: u64,
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

impl Loader {
    pub(super) fn plan(
        &self,
        ckpt: &Checkpoint,
        reqs: &[Request],
    ) -> Result<(Vec<Source>, Vec<Item>)> {
        let shards = ckpt.shards();
        let mut sources: Vec<Option<Source>> = (0..shards.len()).map(|_| None).collect();
        let mut items = Vec::with_capacity(reqs.len());
        for r in reqs {
            let (shard, info) = ckpt.get(&r.name).ok_or_else(|| Error::TensorNotFound {
                path: ckpt.path().to_owned(),
                tensor: r.name.clone(),
            })?;
            let si = shards
                .iter()
                .position(|s| std::ptr::eq(s, shard))
                .unwrap_or(0);
            if let Some(slot @ None) = sources.get_mut(si) {
                *slot = Some(Source::of(shard)?);
            }
            let mut shape = info.shape.clone();
            let mut start = shard.data_start() + info.data_offsets.0;
            let mut bytes = info.num_bytes();
            let mut elems = info.num_elements();
            if let Some(rows) = &r.rows {
                let (Some(nrows), Some(rb)) = (info.rows(), info.row_bytes()) else {
                    return Err(Error::NoRows {
                        path: shard.path().to_owned(),
                        tensor: info.name.clone(),
                        shape: info.shape.clone(),
                    });
                };
                if rows.start > rows.end || rows.end > nrows {
                    return Err(Error::RowRange {
                        path: shard.path().to_owned(),
                        tensor: info.name.clone(),
                        start: rows.start,
                        end: rows.end,
                        rows: nrows,
                    });
                }
                let n = rows.end - rows.start;
                start += rows.start * rb;
                bytes = n * rb;
                elems = elems.checked_div(nrows).map_or(0, |per| per * n);
                if let Some(d) = shape.first_mut() {
                    *d = n;
                }
            }
            let out_dtype = match self.opts.dtype {
                Some(t) if crate::convert::table::converts_from(info.dtype) => t,
                _ => info.dtype,
            };
            let op = (out_dtype != info.dtype).then_some(ConvertOp {
                from: info.dtype,
                to: out_dtype,
            });
            let out_bytes = out_dtype.bytes_for(elems).unwrap_or(bytes);
            items.push(Item {
                name: r.name.clone(),
                source: si,
                file_off: start,
                src_bytes: bytes,
                dtype: info.dtype,
                out_dtype,
                shape,
                out_bytes,
                op,
            });
        }
        let sources = sources
            .into_iter()
            .zip(shards)
            .map(|(s, shard)| match s {
                Some(s) => Ok(s),
                // Never read: a placeholder keeping indices aligned (a
                // duplicate descriptor, no new open).
                None => Source::of(shard),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((sources, items))
    }

    /// Whether loading `items` runs the device's self-test first: it is
    /// asked for and some item converts with a device kernel.
    pub(super) fn self_test_due(&self, items: &[Item]) -> bool {
        self.opts.self_test && items.iter().any(|i| i.op.is_some_and(|o| o.on_device()))
    }

    /// The first rung of each item: the forced one, or the pinned ring
    /// unless its conversion has no device kernel (the self-test's verdict
    /// on the kernels that exist comes after: [`Loader::apply_self_test`]).
    pub(super) fn initial_states(
        &self,
        items: &[Item],
        lent: Vec<Option<DeviceBuffer<u8>>>,
    ) -> Result<Vec<State>> {
        let mut lent = lent.into_iter();
        Ok(items
            .iter()
            .map(|item| {
                let mut attempts = Vec::new();
                let (mut start, mut routed) = match self.opts.fallback {
                    Fallback::Force(r) if r != Rung::PinnedRing => {
                        (r, Some(format!("forced: {r}")))
                    }
                    Fallback::Force(r) => (r, None),
                    _ => (Rung::PinnedRing, None),
                };
                if let Some(op) = item.op {
                    let forbid = matches!(self.opts.fallback, Fallback::Forbid);
                    if !op.on_device() && start.converts_on_device() && !forbid {
                        // No kernel exists: nothing to try, nothing failed.
                        routed = Some(format!("no device kernel for {op}: converted on the CPU"));
                        start = Rung::CpuConvert;
                    }
                    if !op.on_device() && start.converts_on_device() {
                        untrusted(&mut start, &mut attempts, op);
                    }
                }
                State {
                    start,
                    failed: None,
                    attempts,
                    out: lent.next().flatten(),
                    host: None,
                    served: None,
                    oom_retried: false,
                    offloaded: false,
                    routed,
                    t0: None,
                    t1: None,
                    counted: 0,
                }
            })
            .collect())
    }

    /// The self-test's verdict: an item whose device kernel it does not
    /// trust starts on the CPU conversion rung (its output, if allocated
    /// already, is what that rung fills).
    pub(super) fn apply_self_test(
        &self,
        items: &[Item],
        states: &mut [State],
        st: &verify::SelfTestReport,
    ) {
        for (item, state) in items.iter().zip(states.iter_mut()) {
            if let Some(op) = item.op {
                if op.on_device() && !st.trusted(op) && state.start.converts_on_device() {
                    untrusted(&mut state.start, &mut state.attempts, op);
                }
            }
        }
    }

    /// Applies the memory budget and allocates the device outputs of the
    /// items that start on a device rung.
    pub(super) fn allocate(&mut self, items: &[Item], states: &mut [State]) -> Result<()> {
        let mut used = self.staging_device_bytes();
        for (item, st) in items.iter().zip(states.iter_mut()) {
            // Kept on the host by choice, or filling memory the caller lent
            // (never offloaded, nothing to allocate).
            if st.start == Rung::KeepOnHost || st.out.is_some() {
                continue;
            }
            if let Some(b) = self.opts.memory_budget {
                if used.saturating_add(item.out_bytes) > b {
                    st.offloaded = true;
                    st.start = Rung::KeepOnHost;
                    // No device rung is tried: nothing failed.
                    st.attempts.clear();
                    continue;
                }
            }
            used = used.saturating_add(item.out_bytes);
            if st.start != Rung::PinnedRing {
                continue; // the rung allocates when it runs
            }
            let (r, retried) = self.alloc_retry::<u8>(item.out_bytes as usize);
            st.oom_retried |= retried;
            match r {
                Ok(b) => st.out = Some(b),
                Err(e) => {
                    tracing::warn!(tensor = %item.name, error = %e, "pinned ring: allocation failed");
                    st.failed = Some(Attempt {
                        step: Rung::PinnedRing,
                        failure: Failure::Error(e),
                    });
                }
            }
        }
        Ok(())
    }

    /// Packs the pieces of `ring_items` densely into jobs of at most
    /// `buffer_bytes` (pieces aligned to [`PIECE_ALIGN`]).
    pub(super) fn pack(&self, items: &[Item], ring_items: &[usize]) -> Vec<Job> {
        let cap = self.opts.buffer_bytes;
        let mut jobs = Vec::new();
        let mut job = Job::default();
        for &i in ring_items {
            let Some(item) = items.get(i) else { continue };
            let mut off = 0u64;
            while off < item.src_bytes {
                let at = round_up(job.used, PIECE_ALIGN);
                let room = cap.saturating_sub(at);
                let left = item.src_bytes - off;
                let take = if left as usize <= room {
                    left as usize
                } else {
                    room / SPLIT_ALIGN * SPLIT_ALIGN
                };
                if take == 0 || job.pieces.len() >= MAX_PIECES {
                    jobs.push(std::mem::take(&mut job));
                    continue;
                }
                job.pieces.push(Piece {
                    item: i,
                    src_off: off,
                    len: take,
                    slot_off: at,
                });
                job.used = at + take;
                off += take as u64;
            }
        }
        if !job.pieces.is_empty() {
            jobs.push(job);
        }
        jobs
    }
}

/// Moves a rung that converts on the device to the CPU conversion, with the
/// missing trusted kernel recorded as its failure.
fn untrusted(start: &mut Rung, attempts: &mut Vec<Attempt<Rung>>, op: ConvertOp) {
    attempts.push(Attempt {
        step: *start,
        failure: Failure::NoTrustedKernel {
            from: op.from,
            to: op.to,
        },
    });
    *start = Rung::CpuConvert;
}
