//! Staged, verified uploads of checkpoint tensors to a [`Device`], with an
//! explicit fallback ladder and a report (DESIGN.md contracts 2, 3, 6).
//!
//! A [`Loader`] owns a ring of 2-4 reusable pinned buffers (16-64 MiB each;
//! 4 x 32 MiB by default, allocated once per loader) and, on the device,
//! one staging buffer per ring slot. Tasks on the rayon pool fill the free
//! slots from the file with positioned reads (`pread` of
//! [`LoadOptions::read_bytes`], never a memory map) while the slots filled
//! before are copied to the device on a copy stream; an event orders the
//! conversion (bf16 crosses the bus as bf16 and is widened on a compute
//! stream) after each copy, and another event orders the next copy into a
//! slot after the conversion that read it. Small tensors share one slot:
//! one copy for all of them. The fast path never copies from mapped or
//! pageable memory.
//!
//! Every piece is checked (policy [`Policy::Fingerprint`] by default): the
//! fingerprint of the staged host bytes, computed while they are in cache,
//! against the device's fingerprint of the copied bytes, and the fingerprint
//! the host computes of the expected output against the device's
//! fingerprint of the actual output. A tensor that fails goes down the
//! ladder ([`Rung`]): pinned ring -> small synchronous chunks ->
//! synchronous pageable copy -> CPU conversion then copy -> kept on the
//! host. The [`LoadReport`] says which rung served each tensor and what
//! failed before. An allocation that runs out of memory is retried once
//! after the loader releases its own cached device memory.
//!
//! Progress goes to a callback; each rung taken is a `tracing` span
//! (`transfer.load`, `transfer.ring`, `transfer.rung`).
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

mod report;
mod source;

use std::ops::Range;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::convert::fingerprint::{self, finish};
use crate::device::{
    ConvertOp, Device, DeviceBuffer, DeviceView, DeviceViewMut, Event, PinnedBuffer, Stream,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::safetensors::Checkpoint;
use crate::verify::{self, Policy};

pub use report::{Attempt, Failure, LoadReport, LoadTiming, Rung, Stage, TensorReport};
use source::{Item, Source, Sums};

const MIB: usize = 1 << 20;
/// Most pieces (tensors or parts of one) in one ring slot.
const MAX_PIECES: usize = 256;
/// Alignment of pieces inside a slot (device convert kernels need aligned
/// sources; 256 keeps every piece on its own cache lines).
const PIECE_ALIGN: usize = 256;
/// Granularity at which a large tensor is split between slots.
const SPLIT_ALIGN: usize = 64 * 1024;

/// How far down the ladder a tensor may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub enum Fallback {
    /// The whole ladder (default).
    #[default]
    Ladder,
    /// Only the first rung that applies; its failure is
    /// [`Error::TransferFailed`] (fail fast).
    Forbid,
    /// Only this rung (tests, or to pin a known-good path); its failure is
    /// [`Error::TransferFailed`].
    Force(Rung),
}

/// Options of a [`Loader`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LoadOptions {
    /// Convert float tensors (F64, F32, F16, BF16) to this dtype (F32, F16
    /// or BF16); `None` loads every tensor as stored. Other dtypes are
    /// always loaded as stored.
    pub dtype: Option<DType>,
    /// The per-piece check ([`Policy::Off`], [`Policy::Fingerprint`],
    /// [`Policy::FusedFingerprint`], [`Policy::ReadBack`]).
    pub policy: Policy,
    /// Run the device's exhaustive conversion self-test before the first
    /// device conversion ([`verify::self_test`], cached per device).
    pub self_test: bool,
    /// Pinned buffers in the ring, 2..=4.
    pub ring_buffers: usize,
    /// Bytes of each pinned buffer, 16 MiB..=64 MiB (smaller values are
    /// accepted for tests, down to 64 KiB).
    pub buffer_bytes: usize,
    /// Chunk of the small-chunks rung (4 KiB..=buffer_bytes).
    pub small_chunk_bytes: usize,
    /// How far down the ladder a tensor may go.
    pub fallback: Fallback,
    /// Bytes of each positioned read (and CPU task that reads and sums
    /// them): a multiple of 64 KiB (capped at `buffer_bytes`). Small enough to
    /// stay in the CPU cache between the read and the two sums.
    pub read_bytes: usize,
    /// Ask the kernel to read the next jobs' file ranges ahead
    /// (`posix_fadvise(WILLNEED)`): keeps the disk busy when the page cache
    /// is cold; a page-cache walk when it is warm.
    pub readahead: bool,
    /// How many pinned buffers are filled at once (`Some(1..=ring_buffers)`;
    /// `None`, the default: all of them). Each fill is split into
    /// `read_bytes` tasks over the rayon pool; with fewer fills at once each
    /// one finishes sooner (its buffer goes to the copy engine earlier),
    /// with more the pool has more to choose from.
    pub concurrent_fills: Option<usize>,
    /// Device bytes the loader may use: its own staging
    /// ([`Loader::staging_device_bytes`]: the ring's device buffers and one
    /// more for the lower rungs) plus the loaded tensors. The tensors (in
    /// request order) that do not fit stay on the host (offloading); a
    /// budget smaller than the staging keeps every tensor on the host.
    pub memory_budget: Option<u64>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: None,
            policy: Policy::Fingerprint,
            self_test: true,
            ring_buffers: 4,
            buffer_bytes: 32 * MIB,
            readahead: true,
            read_bytes: MIB,
            small_chunk_bytes: MIB,
            fallback: Fallback::Ladder,
            memory_budget: None,
            concurrent_fills: None,
        }
    }
}

impl LoadOptions {
    /// The defaults, converting floats to `dtype`.
    pub fn to_dtype(dtype: DType) -> LoadOptions {
        LoadOptions {
            dtype: Some(dtype),
            ..LoadOptions::default()
        }
    }

    fn validate(&self) -> Result<()> {
        let bad = |field, reason| Err(Error::InvalidLoadOptions { field, reason });
        if !(2..=4).contains(&self.ring_buffers) {
            return bad("ring_buffers", "must be 2, 3 or 4");
        }
        if self
            .concurrent_fills
            .is_some_and(|k| !(1..=self.ring_buffers).contains(&k))
        {
            return bad("concurrent_fills", "must be 1..=ring_buffers");
        }
        if !(64 * 1024..=64 * MIB).contains(&self.buffer_bytes)
            || !self.buffer_bytes.is_multiple_of(SPLIT_ALIGN)
        {
            return bad(
                "buffer_bytes",
                "must be a multiple of 64 KiB between 64 KiB and 64 MiB",
            );
        }
        if !(4096..=self.buffer_bytes).contains(&self.small_chunk_bytes)
            || !self.small_chunk_bytes.is_multiple_of(4096)
        {
            return bad(
                "small_chunk_bytes",
                "must be a multiple of 4 KiB between 4 KiB and buffer_bytes",
            );
        }
        if self.read_bytes < SPLIT_ALIGN || !self.read_bytes.is_multiple_of(SPLIT_ALIGN) {
            return bad("read_bytes", "must be a multiple of 64 KiB");
        }
        if let Some(d) = self.dtype {
            if !matches!(d, DType::F32 | DType::F16 | DType::BF16) {
                return bad("dtype", "must be F32, F16 or BF16");
            }
        }
        Ok(())
    }
}

/// What to load of one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The tensor's name.
    pub name: String,
    /// Rows of the first dimension (all when `None`).
    pub rows: Option<Range<u64>>,
}

impl Request {
    /// The whole tensor.
    pub fn whole(name: impl Into<String>) -> Request {
        Request {
            name: name.into(),
            rows: None,
        }
    }

    /// Rows `rows` of the first dimension.
    pub fn rows(name: impl Into<String>, rows: Range<u64>) -> Request {
        Request {
            name: name.into(),
            rows: Some(rows),
        }
    }
}

/// Where a loaded tensor's bytes are.
#[derive(Debug)]
pub enum TensorData {
    /// Device memory (cast its views to the dtype:
    /// `buf.view().cast::<f32>()`).
    Device(DeviceBuffer<u8>),
    /// Host memory (the keep-on-host rung, or offloaded by the budget).
    Host(Vec<u8>),
}

impl TensorData {
    /// The device buffer, if on the device.
    pub fn device_buffer(&self) -> Option<&DeviceBuffer<u8>> {
        match self {
            TensorData::Device(b) => Some(b),
            TensorData::Host(_) => None,
        }
    }

    /// The bytes (copied back from the device when there).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        match self {
            TensorData::Device(b) => b.to_vec(),
            TensorData::Host(v) => Ok(v.clone()),
        }
    }

    /// Whether the data is on the device.
    pub fn is_device(&self) -> bool {
        matches!(self, TensorData::Device(_))
    }
}

/// One loaded tensor.
#[derive(Debug)]
pub struct LoadedTensor {
    /// The tensor's name.
    pub name: String,
    /// The dtype of `data`.
    pub dtype: DType,
    /// The shape of `data`.
    pub shape: Vec<u64>,
    /// The bytes.
    pub data: TensorData,
}

/// The result of a load.
#[derive(Debug)]
pub struct Loaded {
    /// The tensors, in request order.
    pub tensors: Vec<LoadedTensor>,
    /// What happened.
    pub report: LoadReport,
}

impl Loaded {
    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&LoadedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Progress of a load, passed to the callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// File bytes loaded and checked so far.
    pub done_bytes: u64,
    /// File bytes of the whole load.
    pub total_bytes: u64,
    /// Tensors finished.
    pub done_tensors: usize,
    /// Tensors in the load.
    pub total_tensors: usize,
}

/// The device side of one ring slot.
struct Slot {
    stage: DeviceBuffer<u8>,
    acc: DeviceBuffer<u64>,
    acc_host: PinnedBuffer<u64>,
    /// Recorded on the copy stream after the copy into `stage`.
    copied: Event,
    /// Recorded on the compute stream after the last read of `stage`.
    consumed: Event,
}

/// Device resources of the pinned ring, allocated on first use.
struct Ring {
    pinned: Vec<Option<PinnedBuffer<u8>>>,
    slots: Vec<Slot>,
}

/// Loads checkpoint tensors onto a device (see the module docs).
pub struct Loader {
    device: Device,
    copy: Stream,
    compute: Stream,
    opts: LoadOptions,
    ring: Option<Ring>,
    /// Staging of the small-chunks and pageable rungs (cached; released on
    /// out of memory).
    scratch: Option<Slot>,
    scratch_pinned: Option<PinnedBuffer<u8>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("device", &self.device)
            .field("opts", &self.opts)
            .field("ring", &self.ring.is_some())
            .finish()
    }
}

/// One piece of a job: bytes `src_off..src_off + len` of an item, staged
/// at `slot_off`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    item: usize,
    src_off: u64,
    len: usize,
    slot_off: usize,
}

/// One fill of a ring slot.
#[derive(Debug, Default)]
struct Job {
    pieces: Vec<Piece>,
    used: usize,
}

/// Per item state during a load.
struct State {
    start: Rung,
    failed: Option<Attempt>,
    attempts: Vec<Attempt>,
    out: Option<DeviceBuffer<u8>>,
    host: Option<Vec<u8>>,
    served: Option<Rung>,
    oom_retried: bool,
    offloaded: bool,
    t0: Option<Instant>,
    t1: Option<Instant>,
    counted: u64,
}

fn label(d: &Device) -> String {
    let i = d.info();
    format!("{}:{} {}", i.kind, i.ordinal, i.arch)
}

fn is_oom(e: &Error) -> bool {
    matches!(e, Error::OutOfMemory { .. })
}

fn round_up(x: usize, a: usize) -> usize {
    x.div_ceil(a) * a
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
        Ok(Loader {
            device: device.clone(),
            copy: device.stream()?,
            compute: device.stream()?,
            opts,
            ring: None,
            scratch: None,
            scratch_pinned: None,
        })
    }

    /// The options.
    pub fn options(&self) -> &LoadOptions {
        &self.opts
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

    /// [`Loader::load`], calling `progress` as bytes are loaded and checked.
    ///
    /// Errors: [`Error::TensorNotFound`], [`Error::NoRows`],
    /// [`Error::RowRange`] for bad requests; [`Error::FileShrunk`] /
    /// [`Error::Io`] when the file cannot be read (a file truncated during
    /// the load); [`Error::TransferFailed`] when a tensor fails and the
    /// fallback option forbids the next rung. Device failures and
    /// mismatches otherwise only move tensors down the ladder.
    pub fn load_with_progress(
        &mut self,
        ckpt: &Checkpoint,
        reqs: &[Request],
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Loaded> {
        let t0 = Instant::now();
        let (sources, items) = self.plan(ckpt, reqs)?;
        let total_bytes: u64 = items.iter().map(|i| i.src_bytes).sum();
        let span = tracing::info_span!(
            "transfer.load",
            tensors = items.len(),
            bytes = total_bytes,
            device = %label(&self.device)
        );
        let _g = span.enter();
        let mut states = self.initial_states(&items)?;
        let mut prog = Progress {
            done_bytes: 0,
            total_bytes,
            done_tensors: 0,
            total_tensors: items.len(),
        };
        progress(&prog);

        // Budget and allocations.
        let ta = Instant::now();
        self.allocate(&items, &mut states)?;
        let mut report = LoadReport {
            device: label(&self.device),
            ..LoadReport::default()
        };
        report.timing.alloc_ms = ta.elapsed().as_secs_f32() * 1e3;

        // The fast path.
        // Empty tensors need no copy: served as soon as allocated.
        for (item, st) in items.iter().zip(states.iter_mut()) {
            if item.src_bytes == 0 && st.start == Rung::PinnedRing && st.failed.is_none() {
                st.served = Some(Rung::PinnedRing);
                prog.done_tensors += 1;
            }
        }
        let ring_items: Vec<usize> = (0..items.len())
            .filter(|&i| {
                states.get(i).is_some_and(|s| {
                    s.start == Rung::PinnedRing && s.served.is_none() && s.failed.is_none()
                })
            })
            .collect();
        if !ring_items.is_empty() {
            let tr = Instant::now();
            report.ring_jobs = self.ring_pass(
                &sources,
                &items,
                &ring_items,
                &mut states,
                &mut prog,
                progress,
                &mut report.timing,
            )?;
            report.ring_ms = tr.elapsed().as_secs_f32() * 1e3;
        }

        // The ladder for everything else.
        for i in 0..items.len() {
            let (Some(item), Some(st)) = (items.get(i), states.get_mut(i)) else {
                continue;
            };
            if st.served.is_none() {
                self.ladder(&sources, item, st)?;
                let rest = item.src_bytes.saturating_sub(st.counted);
                st.counted = item.src_bytes;
                prog.done_bytes += rest;
                prog.done_tensors += 1;
                progress(&prog);
            }
        }

        // Results.
        let mut tensors = Vec::with_capacity(items.len());
        for (item, st) in items.into_iter().zip(states) {
            let data = match (st.host, st.out) {
                (Some(h), _) => TensorData::Host(h),
                (None, Some(b)) => TensorData::Device(b),
                (None, None) => TensorData::Host(Vec::new()),
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
                rung: st.served.unwrap_or(Rung::Host),
                attempts: st.attempts,
                oom_retried: st.oom_retried,
                offloaded: st.offloaded,
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
        tracing::info!(
            ms = report.ms,
            gb_per_s = report.bytes_per_s() / 1e9,
            "transfer.load done"
        );
        Ok(Loaded { tensors, report })
    }

    // ----- planning ---------------------------------------------------------

    fn plan(&self, ckpt: &Checkpoint, reqs: &[Request]) -> Result<(Vec<Source>, Vec<Item>)> {
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
                *slot = Some(Source::open(shard.path().to_owned(), shard.file_len())?);
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
                Some(t) if info.dtype.is_convertible_float() => t,
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
            .enumerate()
            .map(|(i, s)| match s {
                Some(s) => Ok(s),
                // Never read: a placeholder keeping indices aligned.
                None => Source::open(
                    shards
                        .get(i)
                        .map(|s| s.path().to_owned())
                        .unwrap_or_default(),
                    0,
                ),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((sources, items))
    }

    /// The first rung of each item: the forced one, or the pinned ring
    /// unless its conversion has no trusted device kernel.
    fn initial_states(&self, items: &[Item]) -> Result<Vec<State>> {
        let needs_kernel = items.iter().any(|i| i.op.is_some_and(|o| o.on_device()));
        let st = if self.opts.self_test && needs_kernel {
            Some(verify::self_test(&self.compute)?)
        } else {
            None
        };
        Ok(items
            .iter()
            .map(|item| {
                let mut attempts = Vec::new();
                let mut start = match self.opts.fallback {
                    Fallback::Force(r) => r,
                    _ => Rung::PinnedRing,
                };
                if let Some(op) = item.op {
                    let trusted = op.on_device() && st.as_ref().is_none_or(|s| s.trusted(op));
                    if !trusted && start.converts_on_device() {
                        attempts.push(Attempt {
                            rung: start,
                            failure: Failure::NoTrustedKernel {
                                from: op.from,
                                to: op.to,
                            },
                        });
                        start = Rung::CpuConvert;
                    }
                }
                State {
                    start,
                    failed: None,
                    attempts,
                    out: None,
                    host: None,
                    served: None,
                    oom_retried: false,
                    offloaded: false,
                    t0: None,
                    t1: None,
                    counted: 0,
                }
            })
            .collect())
    }

    /// The policy actually applied: without a trusted fingerprint kernel,
    /// fingerprints prove nothing, so the output is read back.
    fn policy(&self) -> Policy {
        let p = self.opts.policy;
        if p == Policy::Fingerprint || p == Policy::FusedFingerprint {
            if let Some(st) = self.device_self_test() {
                if !st.fingerprint_trusted() {
                    return Policy::ReadBack;
                }
            }
        }
        p
    }

    fn device_self_test(&self) -> Option<std::sync::Arc<verify::SelfTestReport>> {
        if self.opts.self_test {
            verify::self_test(&self.compute).ok()
        } else {
            None
        }
    }

    /// Device bytes of the loader's own staging, which
    /// [`LoadOptions::memory_budget`] counts: the pinned ring's device
    /// buffers and the one the lower rungs use, each `buffer_bytes` plus
    /// its fingerprint accumulators.
    pub fn staging_device_bytes(&self) -> u64 {
        let slot = self.opts.buffer_bytes as u64 + (2 * MAX_PIECES * 8) as u64;
        (self.opts.ring_buffers as u64 + 1).saturating_mul(slot)
    }

    /// Releases the loader's cached device memory (the pinned ring, when no
    /// pass is using it, and the lower rungs' staging: both are made again
    /// when needed) and waits for the device, so frees of dropped buffers
    /// are done.
    fn release_cached(&mut self) {
        self.scratch = None;
        self.ring = None;
        if let Err(e) = self.device.synchronize() {
            self.device.record_err(e);
        }
    }

    /// Allocates `bytes` on the compute stream; out of memory releases the
    /// cached memory and retries once. The bool says whether it retried.
    fn alloc_retry<T: bytemuck::Pod>(&mut self, len: usize) -> (Result<DeviceBuffer<T>>, bool) {
        match self.compute.alloc::<T>(len) {
            Err(e) if is_oom(&e) => {
                tracing::warn!(error = %e, "out of memory: releasing cached memory and retrying once");
                self.release_cached();
                (self.compute.alloc::<T>(len), true)
            }
            r => (r, false),
        }
    }

    /// Applies the memory budget and allocates the device outputs of the
    /// items that start on a device rung.
    fn allocate(&mut self, items: &[Item], states: &mut [State]) -> Result<()> {
        let mut used = self.staging_device_bytes();
        for (item, st) in items.iter().zip(states.iter_mut()) {
            if st.start == Rung::Host {
                continue;
            }
            if let Some(b) = self.opts.memory_budget {
                if used.saturating_add(item.out_bytes) > b {
                    st.offloaded = true;
                    st.start = Rung::Host;
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
                        rung: Rung::PinnedRing,
                        failure: Failure::Error(e),
                    });
                }
            }
        }
        Ok(())
    }

    // ----- the pinned ring --------------------------------------------------

    fn make_slot(&mut self, bytes: usize) -> Result<Slot> {
        let (stage, r1) = self.alloc_retry::<u8>(bytes);
        let (acc, r2) = self.alloc_retry::<u64>(2 * MAX_PIECES);
        let _ = (r1, r2);
        let slot = Slot {
            stage: stage?,
            acc: acc?,
            acc_host: self.device.alloc_pinned::<u64>(2 * MAX_PIECES)?,
            copied: self.device.event()?,
            consumed: self.device.event()?,
        };
        self.compute.record(&slot.consumed)?;
        self.copy.record(&slot.copied)?;
        Ok(slot)
    }

    fn ensure_ring(&mut self) -> Result<()> {
        if self.ring.is_some() {
            return Ok(());
        }
        let n = self.opts.ring_buffers;
        let bytes = self.opts.buffer_bytes;
        let mut pinned = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);
        for _ in 0..n {
            pinned.push(Some(self.device.alloc_pinned::<u8>(bytes)?));
            slots.push(self.make_slot(bytes)?);
        }
        self.ring = Some(Ring { pinned, slots });
        Ok(())
    }

    /// Packs the pieces of `ring_items` densely into jobs of at most
    /// `buffer_bytes` (pieces aligned to [`PIECE_ALIGN`]).
    fn pack(&self, items: &[Item], ring_items: &[usize]) -> Vec<Job> {
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

    /// Runs the pinned ring over `ring_items`; returns the number of jobs.
    #[allow(clippy::too_many_arguments)]
    fn ring_pass(
        &mut self,
        sources: &[Source],
        items: &[Item],
        ring_items: &[usize],
        states: &mut [State],
        prog: &mut Progress,
        progress: &mut dyn FnMut(&Progress),
        timing: &mut LoadTiming,
    ) -> Result<u64> {
        let span = tracing::info_span!(
            "transfer.ring",
            rung = Rung::PinnedRing.name(),
            tensors = ring_items.len()
        );
        let _g = span.enter();
        if let Err(e) = self.ensure_ring() {
            tracing::warn!(error = %e, "pinned ring unavailable");
            fail_shared(states, ring_items.iter().copied(), items, e);
            self.ring = None;
            return Ok(0);
        }
        let jobs = self.pack(items, ring_items);
        let policy = self.policy();
        let Some(mut ring) = self.ring.take() else {
            return Ok(0);
        };
        let r = self.run_jobs(
            &mut ring, sources, items, &jobs, policy, states, prog, progress, timing,
        );
        // Buffers not back from the filler (after an error) are gone:
        // replace them on the next load.
        if ring.pinned.iter().all(Option::is_some) {
            self.ring = Some(ring);
        }
        r.map(|_| jobs.len() as u64)
    }

    #[allow(clippy::too_many_arguments)]
    fn run_jobs(
        &self,
        ring: &mut Ring,
        sources: &[Source],
        items: &[Item],
        jobs: &[Job],
        policy: Policy,
        states: &mut [State],
        prog: &mut Progress,
        progress: &mut dyn FnMut(&Progress),
        timing: &mut LoadTiming,
    ) -> Result<()> {
        let n = ring.slots.len();
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
        rayon::in_place_scope(|scope| -> Result<()> {
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
            let mut free: std::collections::VecDeque<(usize, PinnedBuffer<u8>)> = (0..n)
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
                timing.wait_fill_ms += tw.elapsed().as_secs_f32() * 1e3;
                timing.fill_blocked_ms += blocked.as_secs_f32() * 1e3;
                timing.fill_busy_ms += busy.as_secs_f32() * 1e3;
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
                        self.check_job(
                            sources, slot, pjob, &sums, items, states, policy, prog, progress,
                            timing,
                        )?;
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
                    if let Some(st) = states.get_mut(p.item) {
                        st.t0.get_or_insert(t);
                    }
                }
                if let Err(e) = self.submit_job(slot, &mut buf, job, items, states, policy) {
                    tracing::warn!(job = j, error = %e, "pinned ring: job failed");
                    fail_shared(states, job.pieces.iter().map(|p| p.item), items, e);
                    // Leave the slot consumed so later jobs may use it.
                    let _ = self.compute.record(&slot.consumed);
                }
                if let Some(f) = in_flight.get_mut(s) {
                    *f = Some((j, sums));
                }
                // The next fill starts at once on the oldest free buffer: its
                // task waits for that buffer's copy first (the wait is
                // timed). Handing a buffer out only when its copy is done
                // was measured slower (BENCHMARKS.md, transfer, second
                // session): the wake-up latency adds to every turnaround.
                free.push_back((s, buf));
            }
            // Unused buffers go back to the ring.
            while let Some((s, buf)) = free.pop_front() {
                if let Some(p) = ring.pinned.get_mut(s) {
                    *p = Some(buf);
                }
            }
            for s in 0..n {
                if let (Some(Some((pj, sums))), Some(slot)) = (
                    in_flight.get_mut(s).map(Option::take),
                    ring.slots.get_mut(s),
                ) {
                    if let Some(pjob) = jobs.get(pj) {
                        self.check_job(
                            sources, slot, pjob, &sums, items, states, policy, prog, progress,
                            timing,
                        )?;
                    }
                }
            }
            result
        })
    }

    /// Queues one job: copy, checks, conversions.
    fn submit_job(
        &self,
        slot: &mut Slot,
        buf: &mut PinnedBuffer<u8>,
        job: &Job,
        items: &[Item],
        states: &mut [State],
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
            let (Some(item), Some(st)) = (items.get(p.item), states.get_mut(p.item)) else {
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
            piece_ops(
                &self.compute,
                item.op,
                policy,
                fp,
                &src,
                &mut dst,
                &mut a_copy,
                &mut a_out,
            )?;
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
    #[allow(clippy::too_many_arguments)]
    fn check_job(
        &self,
        sources: &[Source],
        slot: &mut Slot,
        job: &Job,
        sums: &[Sums],
        items: &[Item],
        states: &mut [State],
        policy: Policy,
        prog: &mut Progress,
        progress: &mut dyn FnMut(&Progress),
        timing: &mut LoadTiming,
    ) -> Result<()> {
        let fp = matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint);
        let tw = Instant::now();
        slot.consumed.synchronize()?;
        timing.wait_device_ms += tw.elapsed().as_secs_f32() * 1e3;
        let acc: Vec<u64> = if fp {
            slot.acc_host.as_slice()?.to_vec()
        } else {
            Vec::new()
        };
        let now = Instant::now();
        for (k, p) in job.pieces.iter().enumerate() {
            let (Some(item), Some(st)) = (items.get(p.item), states.get_mut(p.item)) else {
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
                        rung: Rung::PinnedRing,
                        failure,
                    });
                    continue;
                }
            }
            st.t1 = Some(now);
            st.counted += p.len as u64;
            prog.done_bytes += p.len as u64;
            if st.counted == item.src_bytes {
                if policy == Policy::ReadBack {
                    if let Some(f) = self.readback(sources, item, st.out.as_ref())? {
                        st.failed = Some(Attempt {
                            rung: Rung::PinnedRing,
                            failure: f,
                        });
                        continue;
                    }
                }
                st.served = Some(Rung::PinnedRing);
                prog.done_tensors += 1;
            }
        }
        progress(prog);
        Ok(())
    }

    // ----- the ladder -------------------------------------------------------

    /// Serves `item` on the rungs after the pinned ring (or from its start
    /// rung), recording every failure.
    fn ladder(&mut self, sources: &[Source], item: &Item, st: &mut State) -> Result<()> {
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
                Rung::Host => self.rung_host(sources, item, st),
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
            let a = Attempt { rung, failure };
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
    fn ensure_out(&mut self, item: &Item, st: &mut State) -> Result<()> {
        if st.out.is_none() {
            let (r, retried) = self.alloc_retry::<u8>(item.out_bytes as usize);
            st.oom_retried |= retried;
            st.out = Some(r?);
        }
        Ok(())
    }

    /// The small-chunks rung (`pinned`) or the pageable rung: stage a chunk,
    /// copy it synchronously, convert and check on the device, wait.
    fn rung_staged(
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
            self.scratch = Some(self.make_slot(self.opts.buffer_bytes)?);
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

    fn staged_chunks(
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
            piece_ops(
                &self.compute,
                item.op,
                policy,
                fp,
                &src,
                &mut dst,
                &mut a_copy,
                &mut a_out,
            )?;
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
    fn rung_cpu(
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
        let src = sources.get(item.source).ok_or(Error::OutOfBounds {
            op: "transfer source",
            start: item.source,
            end: item.source + 1,
            len: sources.len(),
        })?;
        let ss = item.dtype.size().unwrap_or(1).max(1);
        let chunk = self.opts.buffer_bytes / 8 * 8 / ss * ss;
        let mut off = 0u64;
        while off < item.src_bytes {
            let len = chunk.min((item.src_bytes - off) as usize);
            let mut raw = vec![0u8; len];
            src.pread(&item.name, &mut raw, item.file_off + off)?;
            let conv = source::cpu_output(item, raw)?;
            let o = item.out_off(off) as usize;
            let mut dst = out.slice_mut(o..o + conv.len())?;
            dst.copy_htod(&self.compute, &conv)?;
            if fp {
                let expected = fingerprint::fingerprint_bytes(&conv);
                let actual = self.compute.fingerprint(&dst.as_view())?;
                if expected != actual {
                    return Ok(Some(Failure::Mismatch {
                        stage: Stage::Copy,
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
    fn rung_host(
        &mut self,
        sources: &[Source],
        item: &Item,
        st: &mut State,
    ) -> Result<Option<Failure>> {
        let src = sources.get(item.source).ok_or(Error::OutOfBounds {
            op: "transfer source",
            start: item.source,
            end: item.source + 1,
            len: sources.len(),
        })?;
        let mut raw = vec![0u8; item.src_bytes as usize];
        src.pread(&item.name, &mut raw, item.file_off)?;
        st.host = Some(source::cpu_output(item, raw)?);
        st.out = None;
        Ok(None)
    }

    /// [`Policy::ReadBack`]: the device output against the CPU's, byte for
    /// byte (the source is read again from the file).
    fn readback(
        &self,
        sources: &[Source],
        item: &Item,
        out: Option<&DeviceBuffer<u8>>,
    ) -> Result<Option<Failure>> {
        let Some(out) = out else { return Ok(None) };
        let got = out.to_vec()?;
        let src = sources.get(item.source).ok_or(Error::OutOfBounds {
            op: "transfer source",
            start: item.source,
            end: item.source + 1,
            len: sources.len(),
        })?;
        let mut raw = vec![0u8; item.src_bytes as usize];
        src.pread(&item.name, &mut raw, item.file_off)?;
        let want = source::cpu_output(item, raw)?;
        if got == want {
            return Ok(None);
        }
        Ok(Some(Failure::Mismatch {
            stage: Stage::Output,
            expected: fingerprint::fingerprint_bytes(&want),
            actual: fingerprint::fingerprint_bytes(&got),
        }))
    }
}

trait IntoPair<'a> {
    fn into_pair(self, at: usize) -> Result<(DeviceViewMut<'a, u64>, DeviceViewMut<'a, u64>)>;
}

impl<'a> IntoPair<'a> for (DeviceViewMut<'a, u64>, DeviceViewMut<'a, u64>) {
    /// From `(..=at, rest)`: element `at` and the element after it.
    fn into_pair(self, at: usize) -> Result<(DeviceViewMut<'a, u64>, DeviceViewMut<'a, u64>)> {
        let (head, tail) = self;
        let (_, a) = head.split_at_mut(at)?;
        let (b, _) = tail.split_at_mut(1)?;
        Ok((a, b))
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
            rung: Rung::PinnedRing,
            failure,
        });
    }
}

/// The copy and output checks of one piece: host sums against the device's.
fn compare(sums: &Sums, item: &Item, len: usize, acc: [u64; 2]) -> Option<Failure> {
    let got_copy = finish(acc[0], len as u64);
    let got_out = finish(acc[1], item.out_len(len) as u64);
    if got_copy != sums.copy_fp(len) {
        return Some(Failure::Mismatch {
            stage: Stage::Copy,
            expected: sums.copy_fp(len),
            actual: got_copy,
        });
    }
    if got_out != sums.out_fp(item, len) {
        return Some(Failure::Mismatch {
            stage: Stage::Output,
            expected: sums.out_fp(item, len),
            actual: got_out,
        });
    }
    None
}

/// Errors that no rung can help with (the file cannot be read).
fn is_fatal(e: &Error) -> bool {
    matches!(e, Error::FileShrunk { .. } | Error::Io { .. })
}

/// The error a failed rung becomes when no fallback is allowed.
fn transfer_failed(item: &Item, a: Attempt) -> Error {
    let failure = a.failure.to_string();
    let source = match a.failure {
        Failure::Error(e) => Some(Box::new(e)),
        _ => None,
    };
    Error::TransferFailed {
        tensor: item.name.clone(),
        rung: a.rung.name(),
        failure,
        source,
    }
}

/// Queues the device work of one staged piece: the copy check, the
/// conversion (or device copy) into `dst`, the output check.
#[allow(clippy::too_many_arguments)]
fn piece_ops(
    s: &Stream,
    op: Option<ConvertOp>,
    policy: Policy,
    fp: bool,
    src: &DeviceView<'_, u8>,
    dst: &mut DeviceViewMut<'_, u8>,
    a_copy: &mut DeviceViewMut<'_, u64>,
    a_out: &mut DeviceViewMut<'_, u64>,
) -> Result<()> {
    if fp {
        s.fingerprint_sum_into(src, a_copy)?;
    }
    let mut fused_done = false;
    match op {
        None => dst.copy_dtod(s, src)?,
        Some(op) => {
            let fused = fp && policy == Policy::FusedFingerprint && op.to == DType::F32;
            device_convert(
                s,
                op,
                src,
                dst,
                if fused { Some(&mut *a_out) } else { None },
            )?;
            fused_done = fused;
        }
    }
    if fp && !fused_done {
        s.fingerprint_sum_into(&dst.as_view(), a_out)?;
    }
    Ok(())
}

/// Dispatches a device conversion on runtime dtypes.
fn device_convert(
    s: &Stream,
    op: ConvertOp,
    src: &DeviceView<'_, u8>,
    dst: &mut DeviceViewMut<'_, u8>,
    acc: Option<&mut DeviceViewMut<'_, u64>>,
) -> Result<()> {
    use half::{bf16, f16};
    match (op.from, op.to) {
        (DType::BF16, DType::F32) => {
            let sv = src.cast::<bf16>()?;
            let mut dv = dst.cast_mut::<f32>()?;
            match acc {
                Some(a) => s.convert_fingerprint_into(&sv, &mut dv, a),
                None => s.convert(&sv, &mut dv),
            }
        }
        (DType::F16, DType::F32) => {
            let sv = src.cast::<f16>()?;
            let mut dv = dst.cast_mut::<f32>()?;
            match acc {
                Some(a) => s.convert_fingerprint_into(&sv, &mut dv, a),
                None => s.convert(&sv, &mut dv),
            }
        }
        (DType::F32, DType::BF16) => s.convert(&src.cast::<f32>()?, &mut dst.cast_mut::<bf16>()?),
        (DType::F32, DType::F16) => s.convert(&src.cast::<f32>()?, &mut dst.cast_mut::<f16>()?),
        (from, to) => Err(Error::UnsupportedConversion {
            op: "transfer convert",
            from,
            to,
        }),
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
    regions
        .into_par_iter()
        .map(|(p, region)| match items.get(p.item) {
            Some(item) => source::read_piece(sources, item, p.src_off, region, read_bytes, check),
            None => Ok(Sums::default()),
        })
        .collect()
}
