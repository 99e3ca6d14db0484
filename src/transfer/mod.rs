//! Staged, verified uploads of checkpoint tensors to a device, with a fallback ladder.
//!
//! Staged, verified uploads of checkpoint tensors to a [`Device`], with an
//! explicit fallback ladder and a report (crate [contracts](crate#contracts)
//! 2, 3, 6).
//!
//! A [`Loader`] owns a ring of 2-8 reusable pinned buffers (16-64 MiB each;
//! 8 x 16 MiB by default, made once per loader, at its first load, where a
//! thread of their own pins them while that load runs: its fills start on
//! the first buffer pinned) and, on the device, one staging buffer per ring
//! slot. Tasks on the rayon pool fill the free
//! slots from the file with positioned reads (`pread` of
//! [`LoadOptions::read_bytes`], never a memory map) while the slots filled
//! before are copied to the device on a copy stream; an event orders the
//! conversion (bf16 crosses the bus as bf16 and is widened on a compute
//! stream) after each copy, and another event orders the next copy into a
//! slot after the conversion that read it. Small tensors share one slot:
//! one copy for all of them. The fast path never copies from mapped or
//! pageable memory.
//!
//! Every piece is checked (policy
//! [`Policy::Fingerprint`](crate::verify::Policy::Fingerprint) by default): the
//! fingerprint of the staged host bytes, computed while they are in cache,
//! against the device's fingerprint of the copied bytes, and the fingerprint
//! the host computes of the expected output against the device's
//! fingerprint of the actual output. A tensor that fails goes down the
//! ladder ([`Rung`]): pinned ring -> small synchronous chunks ->
//! synchronous pageable copy -> CPU conversion then copy -> kept on the
//! host. The [`LoadReport`] says which rung served each tensor and what
//! failed before (in the vocabulary of [`crate::fallback`]). An allocation
//! that runs out of memory is retried once after the loader releases its
//! own cached device memory.
//!
//! Progress goes to a callback; each rung taken is a `tracing` span
//! (`transfer.load`, `transfer.ring`, `transfer.rung`).
//!
// Files (for readers of the source, not of the rustdoc):
// A load is plan -> pass -> ladder -> report, one file each: `plan.rs`
// (a pure function: what goes where, decided once), `pass.rs` (the pinned
// ring's pass), `ladder.rs` (the rungs below it, functions over the
// staging state), `report.rs` (what happened). Around them: `options.rs`
// (what is asked), `staging.rs` (what a loader keeps between loads, and
// each tensor's state during one), `ring.rs` and `grow.rs` (the ring, and
// its buffers pinned on a thread of their own), `checks.rs` (host sums
// against the device's, read-back), `source.rs` (positioned reads and host
// sums), `loaded.rs` (what a load returns). This file: [`Loader`], the
// public calls and the driver that runs a plan.
//!
//! # Example
//!
//! ```
//! use rocm_safe::device::Device;
//! use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
//! use rocm_safe::transfer::{LoadOptions, Loader, Rung};
//! use rocm_safe::DType;
//!
//! # fn main() -> rocm_safe::Result<()> {
//! # let dir = tempfile::tempdir().map_err(|e| rocm_safe::Error::Io { path: ".".into(), op: "tempdir", source: e })?;
//! # let path = dir.path().join("m.safetensors");
//! # let w: Vec<u8> = (0..4096u32).flat_map(|i| (i as u16).to_le_bytes()).collect();
//! # let mut wr = SafeTensorsWriter::create(&path, [TensorSpec::new("w", DType::BF16, [64u64, 64])], None)?;
//! # wr.write_tensor("w", &w)?;
//! # wr.finish()?;
//! let ckpt = Checkpoint::open(&path)?;
//! let dev = Device::host(); // Device::open(BackendKind::Hip, 0)? on a GPU
//! let mut loader = Loader::new(&dev, LoadOptions::to_dtype(DType::F32))?;
//! let loaded = loader.load_all(&ckpt)?;
//! let w = loaded.get("w").expect("loaded");
//! assert_eq!((w.dtype, w.shape.as_slice()), (DType::F32, &[64u64, 64][..]));
//! assert!(w.data.is_device());
//! let bytes = w.data.to_host()?; // or w.data.device_buffer()?.view().cast::<f32>()
//! // bf16 pattern 1 widened exactly: its bits shifted left by 16.
//! assert_eq!(u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]), 1 << 16);
//! assert_eq!(loaded.report.tensor("w").map(|t| t.rung), Some(Rung::PinnedRing));
//! # Ok(())
//! # }
//! ```

mod checks;
mod direct;
mod grow;
mod ladder;
mod loaded;
mod options;
mod pass;
mod plan;
pub mod replicate;
mod report;
mod ring;
mod source;
mod staging;

use std::time::Instant;

use crate::device::{Device, DeviceBuffer, DeviceViewMut};
use crate::error::{Error, Result};
use crate::safetensors::Checkpoint;

use crate::fallback::{Attempt, Check, Failure};
pub use loaded::{LoadProgress, Loaded, LoadedTensor, TensorData};
pub use options::{Fallback, LoadOptions, Request, DIRECT_VAR};
pub use report::{DirectReport, LoadReport, LoadTiming, Rung, TensorReport};

use plan::Plan;
use source::{Item, Source};
use staging::{LoadCtx, Staging, State};

/// Loads checkpoint tensors onto a device (see the module docs).
pub struct Loader {
    /// The options, the device, its streams and the cached staging.
    stg: Staging,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("device", &self.stg.device)
            .field("opts", &self.stg.opts)
            .field("ring", &self.stg.ring.is_some())
            .finish()
    }
}

// A loader may be shared between threads (behind a lock) and moved to one.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Loader>();
};

fn label(d: &Device) -> String {
    let i = d.info();
    format!("{}:{} {}", i.kind, i.ordinal, i.arch)
}

impl Loader {
    /// A loader for `device` (no memory is allocated until the first load).
    ///
    /// Errors: [`Error::InvalidLoadOptions`], stream creation errors.
    pub fn new(device: &Device, opts: LoadOptions) -> Result<Loader> {
        opts.validate()?;
        let opts = LoadOptions {
            read_bytes: opts.read_bytes.min(opts.buffer_bytes),
            ..opts
        };
        let (direct, direct_share) = options::direct_by_env(opts.direct, opts.direct_share);
        let opts = LoadOptions {
            direct,
            direct_share,
            ..opts
        };
        Ok(Loader {
            stg: Staging::new(device, opts)?,
        })
    }

    /// The options.
    pub fn options(&self) -> &LoadOptions {
        &self.stg.opts
    }

    /// Loads every tensor of `ckpt`.
    pub fn load_all(&mut self, ckpt: &Checkpoint) -> Result<Loaded> {
        let reqs: Vec<Request> = ckpt
            .tensors()
            .map(|(_, t)| Request::whole(t.name.clone()))
            .collect();
        self.load(ckpt, &reqs)
    }

    /// Loads the named tensors.
    pub fn load_names(&mut self, ckpt: &Checkpoint, names: &[&str]) -> Result<Loaded> {
        let reqs: Vec<Request> = names.iter().map(|n| Request::whole(*n)).collect();
        self.load(ckpt, &reqs)
    }

    /// Loads `reqs` (whole tensors or row slices).
    pub fn load(&mut self, ckpt: &Checkpoint, reqs: &[Request]) -> Result<Loaded> {
        self.load_with_progress(ckpt, reqs, &mut |_| {})
    }

    /// Loads `req` into device memory the caller provides (a trainer
    /// allocates, rocm-safe fills and verifies): `dst` holds exactly the
    /// loaded bytes (the tensor, or its rows, in the loader's output dtype:
    /// [`LoadOptions::dtype`]). The same pipeline, checks and ladder as
    /// [`Loader::load`]; where a lower rung served the tensor from the host
    /// (CPU conversion, keep on host) its bytes are copied into `dst` and
    /// checked there against their fingerprint. Work is complete when this
    /// returns.
    ///
    /// Errors: as [`Loader::load`]; [`Error::DeviceMismatch`] when `dst`
    /// is on another device, [`Error::LengthMismatch`] when its length is
    /// not the output's, [`Error::VerificationFailed`] when the bytes copied
    /// from the host do not check out.
    pub fn load_into(
        &mut self,
        ckpt: &Checkpoint,
        req: &Request,
        dst: &mut DeviceViewMut<'_, u8>,
    ) -> Result<TensorReport> {
        let t0 = Instant::now();
        if !dst.device().same(&self.stg.device) {
            return Err(Error::DeviceMismatch { op: "load_into" });
        }
        let compute = self.stg.compute.clone();
        // SAFETY: the stand-in lives in this call's plan and then in its
        // load's states, all dropped before this call returns; the compute
        // stream is on `dst`'s device (checked above).
        let stand_in = unsafe { DeviceBuffer::lent(dst, compute.clone()) };
        let reqs = std::slice::from_ref(req);
        let plan = Plan::new(
            ckpt,
            reqs,
            &self.stg.opts,
            self.staging_device_bytes(),
            vec![Some(stand_in)],
        )?;
        let want = plan.items.first().map_or(0, |i| i.out_bytes);
        if want != dst.len() as u64 {
            return Err(Error::LengthMismatch {
                op: "load_into",
                expected: usize::try_from(want).unwrap_or(usize::MAX),
                actual: dst.len(),
                tensor: None,
            });
        }
        let mut loaded = self.run(t0, ckpt, plan, &mut |_| {})?;
        let (Some(t), Some(rep)) = (loaded.tensors.pop(), loaded.report.tensors.pop()) else {
            return Err(Error::TensorNotFound {
                path: ckpt.path().to_owned(),
                tensor: req.name.clone(),
            });
        };
        match t.data {
            TensorData::Buffer(b) if b.device_ptr() == dst.device_ptr() => {}
            TensorData::Buffer(b) => {
                dst.copy_dtod(&compute, &b.view())?;
                compute.synchronize()?;
            }
            TensorData::KeptOnHost(v) => {
                dst.copy_htod(&compute, &v)?;
                let expected = crate::convert::fingerprint::fingerprint_bytes(&v);
                let actual = compute.fingerprint(&dst.as_view())?;
                if expected != actual {
                    return Err(Error::VerificationFailed {
                        op: format!("load_into {} (host copy)", req.name),
                        device: label(&self.stg.device),
                        expected,
                        actual,
                    });
                }
            }
        }
        Ok(rep)
    }

    /// [`Loader::load`], calling `progress` as bytes are loaded and checked.
    ///
    /// Errors: [`Error::TensorNotFound`], [`Error::NoRows`],
    /// [`Error::RowRange`] for bad requests; [`Error::FileShrunk`] /
    /// [`Error::Io`] when the file cannot be read (a file truncated during
    /// the load); [`Error::TransferFailed`] when a tensor fails and the
    /// fallback option forbids the next rung. Device failures and
    /// mismatches otherwise only move tensors down the ladder.
    /// [`Error::FileChanged`] when a shard or the index changed while it was
    /// read (checked after the last read).
    pub fn load_with_progress(
        &mut self,
        ckpt: &Checkpoint,
        reqs: &[Request],
        progress: &mut dyn FnMut(&LoadProgress),
    ) -> Result<Loaded> {
        let t0 = Instant::now();
        let plan = Plan::new(
            ckpt,
            reqs,
            &self.stg.opts,
            self.staging_device_bytes(),
            Vec::new(),
        )?;
        self.run(t0, ckpt, plan, progress)
    }

    /// Device bytes of the loader's own staging, which
    /// [`LoadOptions::memory_budget`] counts: the pinned ring's device
    /// buffers and the one the lower rungs use, each `buffer_bytes` plus
    /// its fingerprint accumulators.
    pub fn staging_device_bytes(&self) -> u64 {
        self.stg.device_bytes()
    }

    /// Carries out `plan` (started at `t0`): the tensors prepared, served
    /// (the ring's pass, the ladder for the rest), the check that no shard
    /// changed, the results.
    fn run(
        &mut self,
        t0: Instant,
        ckpt: &Checkpoint,
        plan: Plan,
        progress: &mut dyn FnMut(&LoadProgress),
    ) -> Result<Loaded> {
        let sources = ckpt
            .shards()
            .iter()
            .map(Source::of)
            .collect::<Result<Vec<_>>>()?;
        let total_bytes = plan.file_bytes();
        let span = tracing::info_span!(
            "transfer.load",
            tensors = plan.items.len(),
            bytes = total_bytes,
            device = %label(&self.stg.device)
        );
        let _g = span.enter();
        let ta = Instant::now();
        let (items, states, ring) = self.prepare(plan)?;
        let alloc_ms = ta.elapsed().as_secs_f32() * 1e3;
        let mut cx = LoadCtx {
            sources: &sources,
            items: &items,
            states,
            prog: LoadProgress {
                done_bytes: 0,
                total_bytes,
                done_tensors: 0,
                total_tensors: items.len(),
            },
            progress,
            timing: LoadTiming {
                alloc_ms,
                ..LoadTiming::default()
            },
            direct: DirectReport::default(),
        };
        cx.report_progress();
        let mut report = LoadReport {
            device: label(&self.stg.device),
            ..LoadReport::default()
        };
        self.serve(&mut cx, &ring, &mut report)?;
        report.timing = cx.timing;
        report.direct = std::mem::take(&mut cx.direct);
        let states = cx.states;
        // Every byte was read: a shard changed meanwhile (same size, other
        // bytes; truncated and regrown) fails the load, naming the file.
        ckpt.check_unchanged()?;
        let loaded = results(items, states, report, t0);
        tracing::info!(
            ms = loaded.report.ms,
            gb_per_s = loaded.report.bytes_per_s() / 1e9,
            "transfer.load done"
        );
        Ok(loaded)
    }

    /// The plan's tensors in their first states: the ring started (its
    /// pinning, 128 MiB in about 10 ms, overlaps the rest; its errors are
    /// left for the pass to meet and report), the outputs allocated while
    /// the device's self-test runs (once per device), its verdict applied.
    /// Returns the items, their states and the ring's tensors.
    fn prepare(&mut self, mut plan: Plan) -> Result<(Vec<Item>, Vec<State>, Vec<usize>)> {
        if plan.ring_early {
            let _ = self.stg.ensure_ring();
        }
        let (outputs, st) = self
            .stg
            .during_self_test(plan.self_test, |s| s.allocate(&plan))?;
        if let Some(st) = st {
            plan.trust(|op| st.trusted(op));
        }
        let ring = plan.ring_items();
        let (items, states) = staging::states(plan, outputs);
        Ok((items, states, ring))
    }

    /// Serves every tensor: empty ones at once, the ring's pass over
    /// `ring` (those still pending), the ladder for the rest.
    fn serve(
        &mut self,
        cx: &mut LoadCtx<'_>,
        ring: &[usize],
        report: &mut LoadReport,
    ) -> Result<()> {
        // Empty tensors need no copy: served as soon as allocated.
        for (item, st) in cx.items.iter().zip(cx.states.iter_mut()) {
            if item.src_bytes == 0 && st.ring_pending() {
                st.served = Some(Rung::PinnedRing);
                cx.prog.done_tensors += 1;
            }
        }
        let ring: Vec<usize> = (ring.iter().copied())
            .filter(|&i| cx.states.get(i).is_some_and(State::ring_pending))
            .collect();
        if !ring.is_empty() {
            let tr = Instant::now();
            report.ring_jobs = pass::run(&mut self.stg, cx, &ring)?;
            report.ring_ms = tr.elapsed().as_secs_f32() * 1e3;
        }
        for (item, st) in cx.items.iter().zip(cx.states.iter_mut()) {
            if st.served.is_none() {
                ladder::serve(&mut self.stg, cx.sources, item, st)?;
                let rest = item.src_bytes.saturating_sub(st.counted);
                st.counted = item.src_bytes;
                cx.prog.done_bytes += rest;
                cx.prog.done_tensors += 1;
                (cx.progress)(&cx.prog);
            }
        }
        Ok(())
    }
}

/// What a load returns: each tensor's data and report, in request order.
fn results(items: Vec<Item>, states: Vec<State>, mut report: LoadReport, t0: Instant) -> Loaded {
    let mut tensors = Vec::with_capacity(items.len());
    for (item, st) in items.into_iter().zip(states) {
        let data = match (st.host, st.out) {
            (Some(h), _) => TensorData::KeptOnHost(h),
            (None, Some(b)) => TensorData::Buffer(b),
            (None, None) => TensorData::KeptOnHost(Vec::new()),
        };
        report.file_bytes += item.src_bytes;
        report.out_bytes += item.out_bytes;
        let ms = match (st.t0, st.t1) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_secs_f32() * 1e3,
            _ => 0.0,
        };
        report.tensors.push(TensorReport {
            name: item.name.clone(),
            dtype: item.dtype,
            out_dtype: item.out_dtype,
            shape: item.shape.clone(),
            file_bytes: item.src_bytes,
            out_bytes: item.out_bytes,
            rung: st.served.unwrap_or(Rung::KeepOnHost),
            attempts: st.attempts,
            oom_retried: st.oom_retried,
            offloaded: st.offloaded,
            routed: st.routed,
            ms,
        });
        tensors.push(LoadedTensor {
            name: item.name,
            dtype: item.out_dtype,
            shape: item.shape,
            data,
        });
    }
    report.ms = t0.elapsed().as_secs_f32() * 1e3;
    Loaded { tensors, report }
}
