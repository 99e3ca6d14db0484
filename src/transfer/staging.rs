//! The staging state: what a loader keeps between loads (its options, its
//! device, streams, the pinned ring and the lower rungs' staging), and what
//! one load keeps per tensor.
//!
//! The pass (`pass.rs`) and the rungs (`ladder.rs`) are functions over a
//! [`Staging`] and a [`LoadCtx`]; out of memory anywhere releases the
//! cached staging and retries once ([`Staging::alloc_retry`]).

use std::sync::Arc;
use std::time::Instant;

use super::plan::{Plan, Step};
use super::ring::{Ring, Slot};
use super::source::{Item, Source};
use super::{Attempt, Failure, LoadOptions, LoadProgress, LoadTiming, Rung};
use crate::device::{Device, DeviceBuffer, PinnedBuffer, Stream};
use crate::error::{ErrorKind, Result};
use crate::verify::{self, staged, Policy};

/// A loader's device-side state, kept between loads.
pub(super) struct Staging {
    /// The options (`read_bytes` capped at `buffer_bytes`).
    pub opts: LoadOptions,
    pub device: Device,
    /// Uploads.
    pub copy: Stream,
    /// Conversions, checks, allocations.
    pub compute: Stream,
    /// The pinned ring (cached; released on out of memory).
    pub ring: Option<Ring>,
    /// Staging of the small-chunks and pageable rungs (cached; released on
    /// out of memory).
    pub scratch: Option<Slot>,
    /// The small-chunks rung's pinned buffer.
    pub scratch_pinned: Option<PinnedBuffer<u8>>,
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

/// A ring output allocated before the pass: the buffer or the ring's
/// failure, and whether out of memory was retried.
pub(super) struct Output {
    buf: Option<DeviceBuffer<u8>>,
    failed: Option<Attempt<Rung>>,
    oom_retried: bool,
}

impl State {
    /// The state a plan's step starts a tensor in, with its output (lent
    /// by the caller, or allocated for the ring).
    fn new(step: Step, out: Output) -> State {
        State {
            start: step.start,
            failed: out.failed,
            attempts: step.attempts,
            out: step.lent.or(out.buf),
            host: None,
            served: None,
            oom_retried: out.oom_retried,
            offloaded: step.offloaded,
            routed: step.routed,
            t0: None,
            t1: None,
            counted: 0,
        }
    }

    /// Whether the ring pass still has this tensor to serve.
    pub fn ring_pending(&self) -> bool {
        self.start == Rung::PinnedRing && self.served.is_none() && self.failed.is_none()
    }
}

/// The states a plan's tensors start in, with the ring outputs allocated
/// before (parallel to the plan's items).
pub(super) fn states(plan: Plan, outputs: Vec<Output>) -> (Vec<Item>, Vec<State>) {
    let states = plan
        .steps
        .into_iter()
        .zip(outputs)
        .map(|(s, o)| State::new(s, o));
    (plan.items, states.collect())
}

/// One load in progress: what is loaded from where, each item's state,
/// the progress reported, and the time split. Every stage of the pipeline
/// (the ring pass, its checks, the ladder) takes it.
pub(super) struct LoadCtx<'a> {
    /// The shard files, opened for positioned reads.
    pub sources: &'a [Source],
    /// What is loaded, in request order.
    pub items: &'a [Item],
    /// Per item state (parallel to `items`).
    pub states: Vec<State>,
    /// Progress so far.
    pub prog: LoadProgress,
    /// The caller's progress callback.
    pub progress: &'a mut dyn FnMut(&LoadProgress),
    /// Where the time goes.
    pub timing: LoadTiming,
    /// What the direct path served.
    pub direct: super::DirectReport,
}

impl LoadCtx<'_> {
    /// Reports the progress so far.
    pub fn report_progress(&mut self) {
        (self.progress)(&self.prog);
    }
}

impl Staging {
    /// The staging of a loader for `device` (streams only: the memory is
    /// allocated when a load needs it).
    pub fn new(device: &Device, opts: LoadOptions) -> Result<Staging> {
        Ok(Staging {
            opts,
            device: device.clone(),
            copy: device.stream()?,
            compute: device.stream()?,
            ring: None,
            scratch: None,
            scratch_pinned: None,
        })
    }

    /// Device bytes of the staging (see `Loader::staging_device_bytes`).
    pub fn device_bytes(&self) -> u64 {
        let slot = self.opts.buffer_bytes as u64 + (Slot::ACC_LEN * 8) as u64;
        (self.opts.ring_buffers as u64 + 1).saturating_mul(slot)
    }

    /// Releases the cached device memory (the pinned ring, when no pass is
    /// using it, and the lower rungs' staging: both are made again when
    /// needed) and waits for the device, so frees of dropped buffers are
    /// done.
    pub fn release_cached(&mut self) {
        self.scratch = None;
        self.ring = None;
        if let Err(e) = self.device.synchronize() {
            self.device.record_err(e);
        }
    }

    /// Allocates `len` elements on the compute stream; out of memory
    /// releases the cached memory and retries once. The bool says whether
    /// it retried.
    pub fn alloc_retry<T: bytemuck::Pod>(&mut self, len: usize) -> (Result<DeviceBuffer<T>>, bool) {
        match self.compute.alloc::<T>(len) {
            Err(e) if e.kind() == ErrorKind::OutOfMemory => {
                tracing::warn!(error = %e, "out of memory: releasing cached memory and retrying once");
                self.release_cached();
                (self.compute.alloc::<T>(len), true)
            }
            r => (r, false),
        }
    }

    /// A slot over `bytes` of device staging; with `retry` (the ring's
    /// first slot, the lower rungs' one) each allocation is retried once
    /// after releasing cached memory, otherwise not (a ring that cannot
    /// grow works with the slots it has).
    pub fn make_slot(&mut self, bytes: usize, retry: bool) -> Result<Slot> {
        let (stage, acc) = if retry {
            let (stage, _) = self.alloc_retry::<u8>(bytes);
            let (acc, _) = self.alloc_retry::<u64>(Slot::ACC_LEN);
            (stage?, acc?)
        } else {
            let stage = self.compute.alloc::<u8>(bytes)?;
            (stage, self.compute.alloc::<u64>(Slot::ACC_LEN)?)
        };
        Slot::new(&self.device, &self.copy, &self.compute, stage, acc)
    }

    /// The ring, grown to [`LoadOptions::ring_buffers`] ([`Ring::grow`]).
    /// Errors only when not even one slot can be made (then there is no
    /// ring).
    pub fn ensure_ring(&mut self) -> Result<()> {
        let (bytes, want) = (self.opts.buffer_bytes, self.opts.ring_buffers);
        let mut ring = self.ring.take().unwrap_or_default();
        let device = self.device.clone();
        ring.grow(&device, want, bytes, &mut |first| {
            self.make_slot(bytes, first)
        })?;
        self.ring = Some(ring);
        Ok(())
    }

    /// The tensor's device buffer (allocated, with the out-of-memory retry).
    pub fn ensure_out(&mut self, item: &Item, st: &mut State) -> Result<()> {
        if st.out.is_none() {
            let (r, retried) = self.alloc_retry::<u8>(item.out_bytes as usize);
            st.oom_retried |= retried;
            st.out = Some(r?);
        }
        Ok(())
    }

    /// The outputs of the tensors the plan routes to the ring (a lent
    /// output is the caller's; the others get theirs on the rung that
    /// serves them): a failed allocation is the ring's failure.
    pub fn allocate(&mut self, plan: &Plan) -> Vec<Output> {
        let outputs = plan.items.iter().zip(&plan.steps).map(|(item, step)| {
            if step.start != Rung::PinnedRing || step.lent.is_some() {
                return Output {
                    buf: None,
                    failed: None,
                    oom_retried: false,
                };
            }
            let (r, oom_retried) = self.alloc_retry::<u8>(item.out_bytes as usize);
            let (buf, failed) = match r {
                Ok(b) => (Some(b), None),
                Err(e) => {
                    tracing::warn!(tensor = %item.name, error = %e, "pinned ring: allocation failed");
                    let failure = Failure::Error(e);
                    (None, Some(Attempt { step: Rung::PinnedRing, failure }))
                }
            };
            Output { buf, failed, oom_retried }
        });
        outputs.collect()
    }

    /// The policy actually applied: the staged check's one rule
    /// (`verify::staged`) over every conversion of the load (without a
    /// trusted fingerprint kernel, fingerprints prove nothing, so the
    /// output is read back; without trusted fused kernels, the separate
    /// pass fingerprints it).
    pub fn policy(&self) -> Policy {
        let st = if self.opts.self_test {
            verify::self_test(&self.compute).ok()
        } else {
            None
        };
        staged::applied_policy(self.opts.policy, st.as_deref(), None)
    }

    /// Runs `work` while the device's self-test, when the load calls for
    /// it (`due`) and it has not run on this device yet, runs on a thread
    /// (and a stream) of its own: its few milliseconds (module loads, the
    /// patterns) overlap a first load's allocations. Returns `work`'s
    /// result with the self-test's report (`None` when the load does not
    /// call for one). Its error is the load's, as if it had run first.
    /// Where it ran already, or no thread or stream can be had, it runs (or
    /// is looked up) first, here.
    pub fn during_self_test<R>(
        &mut self,
        due: bool,
        work: impl FnOnce(&mut Self) -> R,
    ) -> Result<(R, Option<Arc<verify::SelfTestReport>>)> {
        if !due {
            return Ok((work(self), None));
        }
        let stream = if verify::self_test_cached(&self.device) {
            None
        } else {
            self.device.stream().ok()
        };
        std::thread::scope(|sc| {
            let test = stream.and_then(|s| {
                std::thread::Builder::new()
                    .name("rocm-safe-self-test".into())
                    .spawn_scoped(sc, move || verify::self_test(&s))
                    .ok()
            });
            let Some(test) = test else {
                let st = verify::self_test(&self.compute)?;
                return Ok((work(self), Some(st)));
            };
            let r = work(self);
            let st = match test.join() {
                Ok(t) => t?,
                // The thread panicked: run it again here.
                Err(_) => verify::self_test(&self.compute)?,
            };
            Ok((r, Some(st)))
        })
    }
}
