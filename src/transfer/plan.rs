//! The plan of a load: what goes where, decided once, before any device work.
//!
//! A pure function of the checkpoint's header (where each tensor is, its
//! dtype and shape), the requests, the [`LoadOptions`], the memory budget's
//! figures (passed in as data) and the outputs a caller lends
//! ([`Loader::load_into`](super::Loader::load_into)): for each tensor its
//! file range, output dtype and bytes, its conversion, and its route (the
//! pinned ring pass, a rung of the ladder to start at, or kept on the host
//! by the budget). The self-test's verdict, which comes while the outputs
//! are allocated, narrows the plan ([`Plan::trust`]); the ring's tensors
//! are packed into jobs ([`pack`]). Nothing here touches a file or a
//! device.

use std::path::Path;

use super::options::SPLIT_ALIGN;
use super::source::{Item, Runs};
use super::{Attempt, Failure, Fallback, LoadOptions, Request, Rung};
use crate::device::{ConvertOp, DeviceBuffer};
use crate::error::{Error, Result};
use crate::safetensors::{Checkpoint, TensorInfo};

/// Most pieces (tensors or parts of one) in one ring slot.
pub(super) const MAX_PIECES: usize = 256;
/// Alignment of pieces inside a slot (device convert kernels need aligned
/// sources; 256 keeps every piece on its own cache lines).
pub(super) const PIECE_ALIGN: usize = 256;

/// Where a checkpoint keeps one tensor: what the plan reads of it.
pub(super) struct Stored<'a> {
    /// The shard's index in the checkpoint.
    pub shard: usize,
    /// The shard's file.
    pub path: &'a Path,
    /// File offset of the shard's data section.
    pub data_start: u64,
    /// The tensor's header entry.
    pub info: &'a TensorInfo,
}

/// A checkpoint as the plan sees it: its path and its tensors' entries
/// (a [`Checkpoint`]; a table in the tests).
pub(super) trait Catalog {
    /// The checkpoint's path (named by [`Error::TensorNotFound`]).
    fn path(&self) -> &Path;
    /// Where `name` is stored.
    fn find(&self, name: &str) -> Option<Stored<'_>>;
}

impl Catalog for Checkpoint {
    fn path(&self) -> &Path {
        Checkpoint::path(self)
    }

    fn find(&self, name: &str) -> Option<Stored<'_>> {
        let (shard, info) = self.get(name)?;
        let index = self.shards().iter().position(|s| std::ptr::eq(s, shard));
        Some(Stored {
            shard: index.unwrap_or(0),
            path: shard.path(),
            data_start: shard.data_start(),
            info,
        })
    }
}

/// The way a tensor takes through the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    /// The pinned ring's pass (then the ladder, if it fails there).
    Ring,
    /// The ladder, from this rung (forced, or no trusted device kernel).
    Ladder(Rung),
    /// Kept on the host: the memory budget has no room for it.
    Offloaded,
}

/// The plan's decision for one tensor.
#[derive(Debug)]
pub(super) struct Step {
    /// The first rung tried.
    pub start: Rung,
    /// The rungs ruled out before anything ran (no trusted kernel), in
    /// order: the report's first attempts.
    pub attempts: Vec<Attempt<Rung>>,
    /// Why it starts below the pinned ring with nothing failed.
    pub routed: Option<String>,
    /// Whether the budget kept it on the host.
    pub offloaded: bool,
    /// The output the caller lent ([`Loader::load_into`](super::Loader::load_into)).
    pub lent: Option<DeviceBuffer<u8>>,
}

impl Step {
    /// The way this tensor takes.
    pub fn route(&self) -> Route {
        match (self.offloaded, self.start) {
            (true, _) => Route::Offloaded,
            (false, Rung::PinnedRing) => Route::Ring,
            (false, r) => Route::Ladder(r),
        }
    }
}

/// What goes where in one load (see the module docs).
#[derive(Debug)]
pub(super) struct Plan {
    /// What is loaded, in request order.
    pub items: Vec<Item>,
    /// Each item's decision (parallel to `items`).
    pub steps: Vec<Step>,
    /// Whether the device's self-test runs first: asked for, and some item
    /// converts with a device kernel.
    pub self_test: bool,
    /// Whether the ring is started as the load begins (its pinning
    /// overlaps the allocations and the self-test): not when another rung
    /// is forced, nor under a memory budget (a budget below the staging
    /// keeps every tensor on the host, and the pass that makes the ring
    /// does not run), nor for empty tensors only.
    pub ring_early: bool,
}

impl Plan {
    /// Plans `reqs` of `ckpt` under `opts`. `staging` is the loader's own
    /// device bytes, which [`LoadOptions::memory_budget`] counts first;
    /// `lent` the caller's outputs by request index (filled, never
    /// allocated nor offloaded).
    ///
    /// Errors: [`Error::TensorNotFound`], [`Error::NoRows`],
    /// [`Error::SliceDim`], [`Error::RowRange`].
    pub fn new(
        ckpt: &impl Catalog,
        reqs: &[Request],
        opts: &LoadOptions,
        staging: u64,
        lent: Vec<Option<DeviceBuffer<u8>>>,
    ) -> Result<Plan> {
        let items = reqs
            .iter()
            .map(|r| item(ckpt, r, opts))
            .collect::<Result<Vec<_>>>()?;
        let mut lent = lent.into_iter();
        let mut steps: Vec<Step> = items
            .iter()
            .map(|i| first_step(i, opts.fallback, lent.next().flatten()))
            .collect();
        budget(&items, &mut steps, opts.memory_budget, staging);
        let ring_first = !matches!(opts.fallback, Fallback::Force(r) if r != Rung::PinnedRing);
        Ok(Plan {
            self_test: opts.self_test && items.iter().any(|i| i.op.is_some_and(|o| o.on_device())),
            ring_early: ring_first
                && opts.memory_budget.is_none()
                && items.iter().any(|i| i.src_bytes > 0),
            items,
            steps,
        })
    }

    /// The self-test's verdict: a tensor whose device kernel is not
    /// `trusted` starts on the CPU conversion rung, the kernel's absence
    /// recorded as the failure of the rung it would have started on.
    pub fn trust(&mut self, trusted: impl Fn(ConvertOp) -> bool) {
        for (item, step) in self.items.iter().zip(self.steps.iter_mut()) {
            if let Some(op) = item.op {
                if op.on_device() && !trusted(op) && step.start.converts_on_device() {
                    untrusted(step, op);
                }
            }
        }
    }

    /// The tensors of the ring's pass: routed to it, with bytes to copy
    /// (an empty tensor is served as soon as its output exists).
    pub fn ring_items(&self) -> Vec<usize> {
        (self.items.iter().zip(&self.steps).enumerate())
            .filter(|(_, (i, s))| s.route() == Route::Ring && i.src_bytes > 0)
            .map(|(k, _)| k)
            .collect()
    }

    /// File bytes of the whole load.
    pub fn file_bytes(&self) -> u64 {
        self.items.iter().map(|i| i.src_bytes).sum()
    }
}

/// The item of one request: its file range, dtypes, shape, output bytes.
fn item(ckpt: &impl Catalog, r: &Request, opts: &LoadOptions) -> Result<Item> {
    let found = ckpt.find(&r.name).ok_or_else(|| Error::TensorNotFound {
        path: ckpt.path().to_owned(),
        tensor: r.name.clone(),
    })?;
    let info = found.info;
    let mut shape = info.shape.clone();
    let mut start = found.data_start + info.data_offsets.0;
    let mut bytes = info.num_bytes();
    let mut elems = info.num_elements();
    let mut runs = None;
    if let Some(rows) = &r.rows {
        let no_rows = || Error::NoRows {
            path: found.path.to_owned(),
            tensor: info.name.clone(),
            shape: info.shape.clone(),
        };
        if r.dim > 0 && r.dim >= shape.len() {
            return Err(Error::SliceDim {
                path: found.path.to_owned(),
                tensor: info.name.clone(),
                dim: r.dim,
                shape: info.shape.clone(),
            });
        }
        let nrows = *shape.get(r.dim).ok_or_else(no_rows)?;
        // Elements of one index of `dim` (the dimensions after it), and the
        // runs before it (the dimensions before it).
        let inner = shape[r.dim + 1..]
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(no_rows)?;
        let outer = shape[..r.dim]
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(no_rows)?;
        let rb = info.dtype.bytes_for(inner).ok_or_else(no_rows)?;
        if rows.start > rows.end || rows.end > nrows {
            return Err(Error::RowRange {
                path: found.path.to_owned(),
                tensor: info.name.clone(),
                start: rows.start,
                end: rows.end,
                rows: nrows,
            });
        }
        let n = rows.end - rows.start;
        // Within the tensor's bytes and elements (the header checked that
        // every prefix of its shape multiplies without overflow); saturating
        // only for a catalog that did not.
        start += rows.start.saturating_mul(rb);
        bytes = outer.saturating_mul(n).saturating_mul(rb);
        elems = outer.saturating_mul(n).saturating_mul(inner);
        if outer > 1 && n < nrows && n > 0 && rb > 0 {
            runs = Some(Runs {
                run: n * rb,
                stride: nrows * rb,
            });
        }
        shape[r.dim] = n;
    }
    let out_dtype = match opts.dtype {
        Some(t) if crate::convert::table::converts_from(info.dtype) => t,
        _ => info.dtype,
    };
    let op = (out_dtype != info.dtype).then_some(ConvertOp {
        from: info.dtype,
        to: out_dtype,
    });
    Ok(Item {
        name: r.name.clone(),
        source: found.shard,
        file_off: start,
        src_bytes: bytes,
        dtype: info.dtype,
        out_dtype,
        shape,
        out_bytes: out_dtype.bytes_for(elems).unwrap_or(bytes),
        op,
        runs,
    })
}

/// The first rung of an item: the forced one, or the pinned ring unless
/// its conversion has no device kernel (the self-test's verdict on the
/// kernels that exist comes later: [`Plan::trust`]).
fn first_step(item: &Item, fallback: Fallback, lent: Option<DeviceBuffer<u8>>) -> Step {
    let (start, routed) = match fallback {
        Fallback::Force(r) if r != Rung::PinnedRing => (r, Some(format!("forced: {r}"))),
        Fallback::Force(r) => (r, None),
        _ => (Rung::PinnedRing, None),
    };
    let mut step = Step {
        start,
        attempts: Vec::new(),
        routed,
        offloaded: false,
        lent,
    };
    if let Some(op) = item.op {
        if !op.on_device() && step.start.converts_on_device() {
            if fallback != Fallback::Forbid {
                // No kernel exists: nothing to try, nothing failed.
                step.routed = Some(format!("no device kernel for {op}: converted on the CPU"));
                step.start = Rung::CpuConvert;
            } else {
                untrusted(&mut step, op);
            }
        }
    }
    step
}

/// The memory budget: counting `staging` first, then the outputs in
/// request order, those that do not fit are kept on the host (nothing
/// tried, nothing failed). Tensors kept on the host by choice and outputs
/// the caller lent take no device memory of the loader's.
fn budget(items: &[Item], steps: &mut [Step], budget: Option<u64>, staging: u64) {
    let Some(b) = budget else { return };
    let mut used = staging;
    for (item, step) in items.iter().zip(steps.iter_mut()) {
        if step.start == Rung::KeepOnHost || step.lent.is_some() {
            continue;
        }
        if used.saturating_add(item.out_bytes) > b {
            step.offloaded = true;
            step.start = Rung::KeepOnHost;
            step.attempts.clear();
            continue;
        }
        used = used.saturating_add(item.out_bytes);
    }
}

/// Moves a rung that converts on the device to the CPU conversion, with the
/// missing trusted kernel recorded as its failure.
fn untrusted(step: &mut Step, op: ConvertOp) {
    step.attempts.push(Attempt {
        step: step.start,
        failure: Failure::NoTrustedKernel {
            from: op.from,
            to: op.to,
        },
    });
    step.start = Rung::CpuConvert;
}

/// One piece of a job: bytes `src_off..src_off + len` of an item, staged
/// at `slot_off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
}

/// Packs the pieces of `ring_items` densely into jobs of at most `cap`
/// bytes (pieces aligned to [`PIECE_ALIGN`], at most [`MAX_PIECES`] a job;
/// a tensor split between jobs at multiples of 64 KiB).
pub(super) fn pack(items: &[Item], ring_items: &[usize], cap: usize) -> Vec<Job> {
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

#[cfg(test)]
mod tests;
