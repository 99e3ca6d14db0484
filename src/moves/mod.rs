//! Verified moves of data a program already holds: host memory to a
//! device, device memory to the host, and dtype conversions of data whose
//! only copy is on the device.
//!
//! The [`transfer`](crate::transfer) loader checks what comes from a
//! checkpoint file; a trainer's batches, models, latents and casts never
//! touch a file, and that is where the reported zeros happen (a small
//! pageable copy the runtime dropped, a bf16 -> f32 cast that returned
//! zeros, a large download that arrived in part). A [`Mover`] serves those
//! moves with the same contracts (crate [contracts](crate#contracts) 2
//! and 3): each is checked by a path independent of the copy, and a move
//! that fails goes down a ladder ([`MoveRung`]) whose every rung is
//! checked again, so wrong data is never returned.
//!
//! | move | check |
//! | --- | --- |
//! | [`Mover::upload_into`], [`Mover::upload_packed`], [`Mover::upload`] | the host's fingerprint of the staged bytes against the device's fingerprint of what landed |
//! | [`Mover::download_into`] | the device's fingerprint of the source, taken before the copy, against the host's fingerprint of what arrived |
//! | [`Mover::cast`], widening (bf16/f16/fp8 -> f32) | every element, bit for bit, by an integer check of the exact relation on the device |
//! | [`Mover::cast`], narrowing (f32 -> bf16/f16) | sampled elements against the CPU's exact conversion |
//!
//! Uploads and downloads go `Staged` (two pinned buffers: the CPU fills
//! one while the other is copied) -> `SmallChunks` (a synchronize after
//! each piece) -> `Pageable` (the caller's memory, synchronously); an owned
//! [`Mover::upload`] then keeps the data on the host. Casts go `Device` ->
//! `ViaHost` (verified download, exact CPU conversion, verified upload).
//! Every failure a rung meets is in the [`MoveReport`]; runtime errors the
//! ladder handles are cleared by the backends as they are met (HIP 7's
//! sticky last error included, see [`device::hip`](crate::device)).
//!
//! Many small host buffers (a batch's timesteps, masks, labels) travel as
//! one packed span ([`Mover::upload_packed`], [`packed_layout`]): one
//! staging copy, one copy to the device and one check for all of them.
//!
//! # Example
//!
//! ```
//! use rocm_safe::device::Device;
//! use rocm_safe::moves::{packed_layout, MoveOptions, MoveRung, Mover};
//!
//! # fn main() -> rocm_safe::Result<()> {
//! let dev = Device::host(); // Device::open(BackendKind::Hip, 0)? on a GPU
//! let stream = dev.stream()?;
//! let mut mover = Mover::new(&dev, MoveOptions::default())?;
//! let (t, mask) = (vec![7u8; 4], vec![1u8; 300]);
//! let (offsets, total) = packed_layout(&[t.len(), mask.len()], 256);
//! let mut dst = stream.alloc::<u8>(total)?;
//! let report = mover.upload_packed(&stream, &[&t, &mask], &offsets, &mut dst.view_mut())?;
//! assert_eq!(report.rung, MoveRung::Staged);
//! assert_eq!(dst.to_vec()?[offsets[1]..offsets[1] + 300], mask[..]);
//! # Ok(())
//! # }
//! ```

mod cast;
mod report;
mod span;

use std::time::Instant;

use crate::convert::fingerprint::{finish, Fingerprint};
use crate::device::{Device, DeviceBuffer, DeviceView, DeviceViewMut, PinnedBuffer, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fallback::{Attempt, Check, Failure};

pub use report::{MoveCheck, MoveKind, MoveReport, MoveRung};
use span::{par_copy, par_sum_at, Span};

/// Options of a [`Mover`]: [`MoveOptions::default`] and the `with_*`
/// setters (non-exhaustive: options may be added).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct MoveOptions {
    /// Check every move (default `true`). Off, a move is only copied and
    /// reported as unchecked ([`MoveCheck::None`]).
    pub verify: bool,
    /// Bytes of each of the two pinned staging buffers (default 8 MiB; a
    /// multiple of 256, at least 64 KiB).
    pub chunk_bytes: usize,
    /// Bytes of one piece of the `SmallChunks` rung (default 1 MiB; a
    /// multiple of 256, at most `chunk_bytes`).
    pub small_chunk_bytes: usize,
    /// Go down the ladder when a rung fails (default `true`); `false`
    /// fails fast with the first rung's failure.
    pub ladder: bool,
    /// Elements a narrowing cast compares with the CPU (default 64, at
    /// least 2: the first and the last are always among them).
    pub samples: usize,
}

impl Default for MoveOptions {
    fn default() -> Self {
        MoveOptions {
            verify: true,
            chunk_bytes: 8 << 20,
            small_chunk_bytes: 1 << 20,
            ladder: true,
            samples: 64,
        }
    }
}

impl MoveOptions {
    /// With verification on or off.
    pub fn with_verify(mut self, verify: bool) -> Self {
        self.verify = verify;
        self
    }
    /// With staging buffers of `bytes`.
    pub fn with_chunk_bytes(mut self, bytes: usize) -> Self {
        self.chunk_bytes = bytes;
        self
    }
    /// With `SmallChunks` pieces of `bytes`.
    pub fn with_small_chunk_bytes(mut self, bytes: usize) -> Self {
        self.small_chunk_bytes = bytes;
        self
    }
    /// With the ladder on or off.
    pub fn with_ladder(mut self, ladder: bool) -> Self {
        self.ladder = ladder;
        self
    }
    /// With `n` sampled elements per narrowing cast.
    pub fn with_samples(mut self, n: usize) -> Self {
        self.samples = n;
        self
    }

    fn validate(&self) -> Result<()> {
        let bad = |field, reason| Err(Error::InvalidLoadOptions { field, reason });
        if self.chunk_bytes < 64 << 10 || !self.chunk_bytes.is_multiple_of(256) {
            return bad(
                "chunk_bytes",
                "must be a multiple of 256 and at least 64 KiB",
            );
        }
        if self.small_chunk_bytes == 0
            || !self.small_chunk_bytes.is_multiple_of(256)
            || self.small_chunk_bytes > self.chunk_bytes
        {
            return bad(
                "small_chunk_bytes",
                "must be a non-zero multiple of 256, at most chunk_bytes",
            );
        }
        if self.samples < 2 {
            return bad("samples", "must be at least 2");
        }
        Ok(())
    }
}

/// The byte offsets at which [`Mover::upload_packed`] places buffers of
/// `lens` bytes, each aligned to `align` (a power of two; 0 or 1 packs
/// them tightly), and the span's total length.
pub fn packed_layout(lens: &[usize], align: usize) -> (Vec<usize>, usize) {
    let a = align.max(1).next_power_of_two();
    let mut at = 0usize;
    let offsets = lens
        .iter()
        .map(|&n| {
            let off = at.div_ceil(a).saturating_mul(a);
            at = off.saturating_add(n);
            off
        })
        .collect();
    (offsets, at)
}

/// What an owned [`Mover::upload`] returns: the device copy, or the host
/// bytes when no rung served (the report says why).
#[derive(Debug)]
#[non_exhaustive]
pub enum Uploaded {
    /// The verified copy on the device.
    Device(DeviceBuffer<u8>),
    /// The bytes kept in host memory.
    Host(Vec<u8>),
}

/// Serves verified moves on one device (see the module docs). Keeps two
/// pinned staging buffers and a fingerprint accumulator between moves;
/// each call takes the stream its work is ordered on (a stream of the
/// caller's, such as PyTorch's current stream) and waits for that work
/// before it returns.
pub struct Mover {
    device: Device,
    opts: MoveOptions,
    /// The two staging buffers (made at the first staged move).
    staging: Vec<PinnedBuffer<u8>>,
    /// The device fingerprint accumulator (one `u64`).
    acc: DeviceBuffer<u64>,
}

impl std::fmt::Debug for Mover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mover")
            .field("device", &self.device)
            .field("opts", &self.opts)
            .field("staging", &self.staging.len())
            .finish()
    }
}

/// A rung's outcome: `Ok(None)` served (checked), `Ok(Some(f))` its result
/// failed a check, `Err(e)` an operation failed.
type Tried = Result<Option<Failure>>;

impl Mover {
    /// A mover for `device` with `opts`.
    ///
    /// Errors: [`Error::InvalidLoadOptions`] for an option out of range.
    pub fn new(device: &Device, opts: MoveOptions) -> Result<Mover> {
        opts.validate()?;
        let acc = device.stream()?.alloc::<u64>(1)?;
        Ok(Mover {
            device: device.clone(),
            opts,
            staging: Vec::new(),
            acc,
        })
    }

    /// The options.
    pub fn options(&self) -> &MoveOptions {
        &self.opts
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Drops the pinned staging buffers (made again at the next staged move).
    pub fn release(&mut self) {
        self.staging.clear();
    }

    /// Copies `src` into `dst` (the same length) on `stream`, checked, and
    /// waits for it.
    ///
    /// Errors: [`Error::LengthMismatch`] for different lengths,
    /// [`Error::DeviceMismatch`], and [`Error::TransferFailed`] when no
    /// rung served (with the ladder off: the first rung's failure); `dst`
    /// then holds no trustworthy data.
    pub fn upload_into(
        &mut self,
        stream: &Stream,
        src: &[u8],
        dst: &mut DeviceViewMut<'_, u8>,
    ) -> Result<MoveReport> {
        if src.len() != dst.len() {
            return Err(Error::LengthMismatch {
                op: "upload_into",
                expected: dst.len(),
                actual: src.len(),
                tensor: None,
            });
        }
        let span = Span::new(vec![(0, src)], src.len())?;
        self.upload_span(stream, &span, dst, 1)
    }

    /// Copies the buffers `srcs` into `dst` at `offsets` (bytes; from
    /// [`packed_layout`], or any sorted, disjoint placement) as one span:
    /// one staging copy, one copy to the device and one check for all of
    /// them. The bytes of `dst` between the buffers are zeroed.
    ///
    /// Errors: as [`Mover::upload_into`], and [`Error::OutOfBounds`] when
    /// a buffer passes the end of `dst` or two overlap,
    /// [`Error::LengthMismatch`] when `offsets` and `srcs` differ in length.
    pub fn upload_packed(
        &mut self,
        stream: &Stream,
        srcs: &[&[u8]],
        offsets: &[usize],
        dst: &mut DeviceViewMut<'_, u8>,
    ) -> Result<MoveReport> {
        if srcs.len() != offsets.len() {
            return Err(Error::LengthMismatch {
                op: "upload_packed: offsets",
                expected: srcs.len(),
                actual: offsets.len(),
                tensor: None,
            });
        }
        let parts = offsets.iter().copied().zip(srcs.iter().copied()).collect();
        let span = Span::new(parts, dst.len())?;
        self.upload_span(stream, &span, dst, srcs.len())
    }

    /// Uploads `src` into a new buffer allocated on `stream`, checked. When
    /// no rung serves (or the allocation fails), the bytes are kept on the
    /// host ([`Uploaded::Host`], rung [`MoveRung::KeptOnHost`]) and the
    /// report lists what failed: never wrong data on the device.
    ///
    /// Errors: [`Error::OutOfMemory`] when the host copy cannot be made
    /// either.
    pub fn upload(&mut self, stream: &Stream, src: &[u8]) -> Result<(Uploaded, MoveReport)> {
        let t0 = Instant::now();
        let failed = match stream.alloc::<u8>(src.len()) {
            Ok(mut buf) => match self.upload_into(stream, src, &mut buf.view_mut()) {
                Ok(r) => return Ok((Uploaded::Device(buf), r)),
                Err(e) => Failure::Error(e),
            },
            Err(e) => Failure::Error(e),
        };
        let mut host = host_vec("upload: keep on host", src.len())?;
        host.copy_from_slice(src);
        tracing::warn!(bytes = src.len(), failure = %failed, "upload kept on the host");
        let report = MoveReport {
            kind: MoveKind::Upload,
            bytes: src.len() as u64,
            pieces: 1,
            rung: MoveRung::KeptOnHost,
            check: MoveCheck::None,
            attempts: vec![Attempt {
                step: MoveRung::Staged,
                failure: failed,
            }],
            elapsed: t0.elapsed(),
        };
        Ok((Uploaded::Host(host), report))
    }

    /// Copies the device bytes `src` (elements of `from`) into the host
    /// buffer `dst` (elements of `to`), checked, converting exactly on the
    /// CPU as the bytes arrive when `to != from` (the conversion table's
    /// pairs, [`crate::convert::supported`]). Waits for it.
    ///
    /// Errors: [`Error::UnsupportedConversion`], [`Error::LengthMismatch`]
    /// when `dst` has room for a different count of elements,
    /// [`Error::DeviceMismatch`], and [`Error::TransferFailed`] when no
    /// rung served; `dst` then holds no trustworthy data.
    pub fn download_into(
        &mut self,
        stream: &Stream,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &mut [u8],
        to: DType,
    ) -> Result<MoveReport> {
        const OP: &str = "download_into";
        stream.check_device(OP, src.device())?;
        let (ss, ds) = element_sizes(OP, from, to)?;
        element_count(OP, src.len(), ss, dst.len(), ds)?;
        let t0 = Instant::now();
        let rungs = [MoveRung::Staged, MoveRung::SmallChunks, MoveRung::Pageable];
        let mut attempts = Vec::new();
        for rung in self.rungs(&rungs) {
            let tried = self.try_download(stream, rung, src, from, dst, to);
            if let Some(report) = self.settle(
                MoveKind::Download,
                rung,
                tried,
                &mut attempts,
                (src.len(), 1, t0),
            ) {
                return Ok(report);
            }
        }
        Err(exhausted("download", attempts))
    }

    /// Converts the device bytes `src` (elements of `from`) into `dst`
    /// (elements of `to`, same count) on `stream`, checked: a widening
    /// (bf16/f16/fp8 -> f32) element by element against the exact relation,
    /// a narrowing at sampled elements against the CPU. A pair without a
    /// device kernel, or a conversion that fails its check, is served
    /// through the host (verified download, exact CPU conversion, verified
    /// upload). Waits for it.
    ///
    /// Errors: [`Error::UnsupportedConversion`] for a pair the crate does
    /// not convert, [`Error::LengthMismatch`], [`Error::Misaligned`],
    /// [`Error::DeviceMismatch`], [`Error::TransferFailed`] when no rung
    /// served.
    pub fn cast(
        &mut self,
        stream: &Stream,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &mut DeviceViewMut<'_, u8>,
        to: DType,
    ) -> Result<MoveReport> {
        cast::cast(self, stream, src, from, dst, to)
    }

    // ------------------------------------------------------------ internals

    /// The rungs to try: all of `rungs`, or the first alone without the
    /// ladder.
    fn rungs(&self, rungs: &[MoveRung]) -> Vec<MoveRung> {
        let n = if self.opts.ladder { rungs.len() } else { 1 };
        rungs[..n.min(rungs.len())].to_vec()
    }

    /// Records a rung's outcome: the report when it served, else the
    /// attempt (and `None`).
    fn settle(
        &self,
        kind: MoveKind,
        rung: MoveRung,
        tried: Tried,
        attempts: &mut Vec<Attempt<MoveRung>>,
        (bytes, pieces, t0): (usize, usize, Instant),
    ) -> Option<MoveReport> {
        let failure = match tried {
            Ok(None) => {
                return Some(MoveReport {
                    kind,
                    bytes: bytes as u64,
                    pieces,
                    rung,
                    check: if self.opts.verify {
                        MoveCheck::Fingerprint
                    } else {
                        MoveCheck::None
                    },
                    attempts: std::mem::take(attempts),
                    elapsed: t0.elapsed(),
                })
            }
            Ok(Some(f)) => f,
            Err(e) => Failure::Error(e),
        };
        tracing::warn!(kind = kind.name(), rung = rung.name(), failure = %failure, "move rung failed");
        attempts.push(Attempt {
            step: rung,
            failure,
        });
        None
    }

    fn upload_span(
        &mut self,
        stream: &Stream,
        span: &Span<'_>,
        dst: &mut DeviceViewMut<'_, u8>,
        pieces: usize,
    ) -> Result<MoveReport> {
        stream.check_device("upload", dst.device())?;
        let t0 = Instant::now();
        let rungs = [MoveRung::Staged, MoveRung::SmallChunks, MoveRung::Pageable];
        let mut attempts = Vec::new();
        for rung in self.rungs(&rungs) {
            let tried = self.try_upload(stream, rung, span, dst);
            if let Some(r) = self.settle(
                MoveKind::Upload,
                rung,
                tried,
                &mut attempts,
                (span.len(), pieces, t0),
            ) {
                return Ok(r);
            }
        }
        Err(exhausted("upload", attempts))
    }

    /// Makes the two staging buffers when missing.
    fn ensure_staging(&mut self) -> Result<()> {
        while self.staging.len() < 2 {
            self.staging
                .push(self.device.alloc_pinned::<u8>(self.opts.chunk_bytes)?);
        }
        Ok(())
    }

    /// The device's fingerprint sum of `v`, queued on `stream` into the
    /// accumulator (zeroed first); read with [`Mover::read_acc`].
    fn queue_sum(&mut self, stream: &Stream, v: &DeviceView<'_, u8>) -> Result<()> {
        let mut acc = self.acc.view_mut();
        acc.memset_zero(stream)?;
        stream.fingerprint_sum_into(v, &mut acc)
    }

    /// The elements of `dst` that differ from the exact widening of `src`
    /// (the device's check, into the accumulator; waits).
    fn widen_mismatches(
        &mut self,
        stream: &Stream,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &DeviceView<'_, u8>,
    ) -> Result<u64> {
        let mut acc = self.acc.view_mut();
        acc.memset_zero(stream)?;
        stream.widen_check_into(src, from, dst, &mut acc)?;
        self.read_acc(stream)
    }

    /// Waits for `stream` and reads the accumulator.
    fn read_acc(&self, stream: &Stream) -> Result<u64> {
        let mut s = [0u64];
        self.acc.view().copy_dtoh(stream, &mut s)?;
        Ok(s[0])
    }

    /// `None` when the fingerprints of `len` bytes agree, else the failure.
    fn compare(check: Check, host: u64, device: u64, len: usize) -> Option<Failure> {
        let (expected, actual): (Fingerprint, Fingerprint) =
            (finish(host, len as u64), finish(device, len as u64));
        (expected != actual).then_some(Failure::FingerprintMismatch {
            check,
            expected,
            actual,
        })
    }

    fn try_upload(
        &mut self,
        stream: &Stream,
        rung: MoveRung,
        span: &Span<'_>,
        dst: &mut DeviceViewMut<'_, u8>,
    ) -> Tried {
        let len = span.len();
        let host_sum = match rung {
            MoveRung::Staged | MoveRung::SmallChunks => {
                self.ensure_staging()?;
                let (chunk, sync_each) = if rung == MoveRung::Staged {
                    (self.opts.chunk_bytes, false)
                } else {
                    (self.opts.small_chunk_bytes, true)
                };
                let mut sum = 0u64;
                let mut start = 0usize;
                let mut i = 0usize;
                while start < len {
                    let n = chunk.min(len - start);
                    let buf = &mut self.staging[i % 2];
                    // Waits for this buffer's previous copy.
                    let staged = buf.as_mut_slice()?;
                    sum = sum.wrapping_add(span.fill_and_sum(start, &mut staged[..n]));
                    let mut piece = dst.slice_mut(start..start + n)?;
                    piece.copy_htod_async_range(stream, buf, 0)?;
                    if sync_each {
                        stream.synchronize()?;
                    }
                    start += n;
                    i += 1;
                }
                sum
            }
            _ => {
                // Pageable.
                if span.has_gaps() {
                    dst.memset_zero(stream)?;
                }
                for &(off, b) in span.parts() {
                    dst.slice_mut(off..off + b.len())?.copy_htod(stream, b)?;
                }
                if self.opts.verify {
                    span.sum()
                } else {
                    0
                }
            }
        };
        if !self.opts.verify {
            stream.synchronize()?;
            return Ok(None);
        }
        self.queue_sum(stream, &dst.as_view())?;
        let device_sum = self.read_acc(stream)?;
        Ok(Self::compare(Check::Copy, host_sum, device_sum, len))
    }

    fn try_download(
        &mut self,
        stream: &Stream,
        rung: MoveRung,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &mut [u8],
        to: DType,
    ) -> Tried {
        let len = src.len();
        if self.opts.verify {
            // Taken before the copy, on the same stream.
            self.queue_sum(stream, src)?;
        }
        let ratio = element_sizes("download_into", from, to)?;
        let host_sum = match rung {
            MoveRung::Staged | MoveRung::SmallChunks => {
                self.ensure_staging()?;
                let (chunk, sync_each) = if rung == MoveRung::Staged {
                    (self.opts.chunk_bytes, false)
                } else {
                    (self.opts.small_chunk_bytes, true)
                };
                // Chunks hold whole elements of both dtypes (256 | chunk).
                let mut sum = 0u64;
                let mut pending: Option<(usize, usize, usize)> = None;
                let mut start = 0usize;
                let mut i = 0usize;
                while start < len {
                    let n = chunk.min(len - start);
                    let b = i % 2;
                    src.slice(start..start + n)?.copy_dtoh_async_range(
                        stream,
                        &mut self.staging[b],
                        0,
                    )?;
                    if sync_each {
                        stream.synchronize()?;
                    }
                    if let Some(p) = pending.take() {
                        sum = sum.wrapping_add(self.arrive(p, from, dst, to, ratio)?);
                    }
                    pending = Some((b, start, n));
                    start += n;
                    i += 1;
                }
                if let Some(p) = pending {
                    sum = sum.wrapping_add(self.arrive(p, from, dst, to, ratio)?);
                }
                sum
            }
            _ => {
                // Pageable.
                if from == to {
                    src.copy_dtoh(stream, dst)?;
                    par_sum_at(0, dst)
                } else {
                    let mut tmp = host_vec("download: pageable", len)?;
                    src.copy_dtoh(stream, &mut tmp)?;
                    crate::convert::convert_bytes(from, &tmp, to, dst)?;
                    par_sum_at(0, &tmp)
                }
            }
        };
        if !self.opts.verify {
            stream.synchronize()?;
            return Ok(None);
        }
        let device_sum = self.read_acc(stream)?;
        Ok(Self::compare(Check::Copy, host_sum, device_sum, len))
    }

    /// Takes a downloaded piece out of staging buffer `b` (waiting for its
    /// copy): its fingerprint sum, and its bytes (converted when `to !=
    /// from`) into their place in `dst`.
    fn arrive(
        &mut self,
        (b, start, n): (usize, usize, usize),
        from: DType,
        dst: &mut [u8],
        to: DType,
        (ss, ds): (usize, usize),
    ) -> Result<u64> {
        let staged = &self.staging[b].as_slice()?[..n];
        let sum = if self.opts.verify {
            par_sum_at(start, staged)
        } else {
            0
        };
        let (d0, dn) = (start / ss * ds, n / ss * ds);
        let out = &mut dst[d0..d0 + dn];
        if from == to {
            par_copy(out, staged);
        } else {
            crate::convert::convert_bytes(from, staged, to, out)?;
        }
        Ok(sum)
    }
}

/// The element sizes of `from` and `to`, checking that the pair converts
/// (or is the same dtype).
fn element_sizes(op: &'static str, from: DType, to: DType) -> Result<(usize, usize)> {
    let sizes = |d: DType| d.size().filter(|&s| s > 0);
    let unsupported = || Error::UnsupportedConversion {
        op,
        from,
        to,
        tensor: None,
    };
    if from != to && crate::convert::table::find(from, to).is_none() {
        return Err(unsupported());
    }
    match (sizes(from), sizes(to)) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ if from == to => Ok((1, 1)),
        _ => Err(unsupported()),
    }
}

/// The elements of a source of `src_bytes` bytes of `ss`-byte elements,
/// checking that it holds whole elements and that the destination's
/// `dst_bytes` hold as many of `ds` bytes.
fn element_count(
    op: &'static str,
    src_bytes: usize,
    ss: usize,
    dst_bytes: usize,
    ds: usize,
) -> Result<usize> {
    let n = src_bytes / ss;
    if n * ss != src_bytes || dst_bytes != n * ds {
        return Err(Error::LengthMismatch {
            op,
            expected: n * ds,
            actual: dst_bytes,
            tensor: None,
        });
    }
    Ok(n)
}

/// `n` zeroed host bytes for `op` ([`crate::alloc::try_zeroed_vec`]), or
/// [`Error::OutOfMemory`] when the host cannot hold them.
pub(super) fn host_vec(op: &'static str, n: usize) -> Result<Vec<u8>> {
    crate::alloc::try_zeroed_vec(n).map_err(|_| Error::OutOfMemory {
        backend: "host",
        op,
        bytes: n as u64,
    })
}

/// The error of a move whose every rung failed.
fn exhausted(what: &str, mut attempts: Vec<Attempt<MoveRung>>) -> Error {
    let last = attempts.pop();
    let rung = last.as_ref().map_or("none", |a| a.step.name());
    let (failure, source) = match last.map(|a| a.failure) {
        Some(Failure::Error(e)) => (e.to_string(), Some(Box::new(e))),
        Some(f) => (f.to_string(), None),
        None => ("no rung ran".to_string(), None),
    };
    let earlier: Vec<String> = attempts
        .iter()
        .map(|a| format!("{}: {}", a.step, a.failure))
        .collect();
    Error::TransferFailed {
        tensor: if earlier.is_empty() {
            what.to_string()
        } else {
            format!("{what} (before: {})", earlier.join("; "))
        },
        rung,
        failure,
        source,
    }
}
