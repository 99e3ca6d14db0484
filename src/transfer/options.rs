//! What a load is asked to do: options, fallback policy, requests.

use std::ops::Range;

use super::Rung;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::verify::Policy;

pub(super) const MIB: usize = 1 << 20;
/// Granularity at which a large tensor is split between slots.
pub(super) const SPLIT_ALIGN: usize = 64 * 1024;

/// How far down the ladder a tensor may go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
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

/// Options of a [`Loader`](super::Loader).
///
/// Start from [`LoadOptions::default`] or [`LoadOptions::to_dtype`] and
/// change what you need with the `with_*` setters (the struct is
/// `#[non_exhaustive]`: options may be added; its fields stay readable and
/// assignable):
///
/// ```
/// use rocm_safe::transfer::{Fallback, LoadOptions};
/// use rocm_safe::DType;
///
/// let opts = LoadOptions::to_dtype(DType::F32)
///     .with_ring_buffers(4)
///     .with_buffer_bytes(32 << 20)
///     .with_fallback(Fallback::Forbid);
/// assert_eq!((opts.ring_buffers, opts.dtype), (4, Some(DType::F32)));
/// ```
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct LoadOptions {
    /// Convert float tensors (F64, F32, F16, BF16, F8_E4M3, F8_E5M2: the
    /// sources of `convert::table`) to this dtype (F32, F16
    /// or BF16); `None` loads every tensor as stored. Other dtypes are
    /// always loaded as stored.
    pub dtype: Option<DType>,
    /// The per-piece check ([`Policy::Off`], [`Policy::Fingerprint`],
    /// [`Policy::FusedFingerprint`], [`Policy::ReadBack`]).
    pub policy: Policy,
    /// Run the device's exhaustive conversion self-test before the first
    /// device conversion ([`verify::self_test`](crate::verify::self_test), cached per device).
    pub self_test: bool,
    /// Pinned buffers in the ring, 2..=8 (default 8 of 16 MiB: measured
    /// 3-24% faster than 4 of 32 MiB, the earlier default, in alternating
    /// runs on the H100 host, BENCHMARKS.md, "Ring shape").
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
    /// ([`Loader::staging_device_bytes`](super::Loader::staging_device_bytes): the ring's device buffers and one
    /// more for the lower rungs) plus the loaded tensors. The tensors (in
    /// request order) that do not fit stay on the host (offloading); a
    /// budget smaller than the staging keeps every tensor on the host.
    pub memory_budget: Option<u64>,
    /// Copy the ring's jobs of large tensors (pieces of 256 KiB or more on
    /// average) straight from the checkpoint's page cache, registered
    /// read-only with the runtime, instead of through the pinned buffers
    /// (default `false`). Checked as the ring's jobs are; a runtime that
    /// refuses the registration turns it off for the rest of the load
    /// ([`LoadReport::direct`](super::LoadReport::direct) says so).
    /// Off by default: on the H200 host the registration itself runs at
    /// 11-23 GB/s (it pins every page), below the ring's 38-41 GB/s
    /// (BENCHMARKS.md, "Direct path"). [`DIRECT_VAR`] sets it for the
    /// whole process.
    pub direct: bool,
    /// Of the jobs that qualify for the direct path, the share that takes
    /// it (0.0..=1.0, spread evenly; default 1.0); the others are read by
    /// the ring at the same time.
    pub direct_share: f32,
}

/// The environment variable that sets the direct path
/// ([`LoadOptions::direct`]) for every loader of the process: `0`, `off`,
/// `false` or `no` turn it off (an escape hatch for a runtime that
/// misbehaves with registered file pages); `1`, `on`, `true` or `yes` turn
/// it on; a number between 0 and 1 turns it on for that share of the jobs
/// ([`LoadOptions::direct_share`]). Unset or anything else: the options
/// decide.
pub const DIRECT_VAR: &str = "ROCM_SAFE_LOAD_DIRECT";

/// `(direct, direct_share)` after [`DIRECT_VAR`].
pub(super) fn direct_by_env(direct: bool, share: f32) -> (bool, f32) {
    direct_setting(std::env::var(DIRECT_VAR).ok().as_deref(), direct, share)
}

fn direct_setting(v: Option<&str>, direct: bool, share: f32) -> (bool, f32) {
    let Some(v) = v.map(|s| s.trim().to_ascii_lowercase()) else {
        return (direct, share);
    };
    match v.as_str() {
        "0" | "off" | "false" | "no" => (false, share),
        "1" | "on" | "true" | "yes" => (true, 1.0),
        other => match other.parse::<f32>() {
            Ok(x) if x > 0.0 && x < 1.0 => (true, x),
            _ => (direct, share),
        },
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            dtype: None,
            policy: Policy::Fingerprint,
            self_test: true,
            ring_buffers: 8,
            buffer_bytes: 16 * MIB,
            readahead: true,
            read_bytes: MIB,
            small_chunk_bytes: MIB,
            fallback: Fallback::Ladder,
            memory_budget: None,
            concurrent_fills: None,
            direct: false,
            direct_share: 1.0,
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

    /// With [`LoadOptions::dtype`]: the dtype floats are converted to (`None`: as stored).
    #[must_use]
    pub fn with_dtype(self, dtype: Option<DType>) -> LoadOptions {
        LoadOptions { dtype, ..self }
    }

    /// With [`LoadOptions::policy`]: the per-piece check.
    #[must_use]
    pub fn with_policy(self, policy: Policy) -> LoadOptions {
        LoadOptions { policy, ..self }
    }

    /// With [`LoadOptions::self_test`]: run the device's conversion self-test first.
    #[must_use]
    pub fn with_self_test(self, self_test: bool) -> LoadOptions {
        LoadOptions { self_test, ..self }
    }

    /// With [`LoadOptions::ring_buffers`]: pinned buffers in the ring, 2..=8.
    #[must_use]
    pub fn with_ring_buffers(self, ring_buffers: usize) -> LoadOptions {
        LoadOptions {
            ring_buffers,
            ..self
        }
    }

    /// With [`LoadOptions::buffer_bytes`]: bytes of each pinned buffer.
    #[must_use]
    pub fn with_buffer_bytes(self, buffer_bytes: usize) -> LoadOptions {
        LoadOptions {
            buffer_bytes,
            ..self
        }
    }

    /// With [`LoadOptions::small_chunk_bytes`]: the small-chunks rung's chunk.
    #[must_use]
    pub fn with_small_chunk_bytes(self, small_chunk_bytes: usize) -> LoadOptions {
        LoadOptions {
            small_chunk_bytes,
            ..self
        }
    }

    /// With [`LoadOptions::fallback`]: how far down the ladder a tensor may go.
    #[must_use]
    pub fn with_fallback(self, fallback: Fallback) -> LoadOptions {
        LoadOptions { fallback, ..self }
    }

    /// With [`LoadOptions::read_bytes`]: bytes of each positioned read.
    #[must_use]
    pub fn with_read_bytes(self, read_bytes: usize) -> LoadOptions {
        LoadOptions { read_bytes, ..self }
    }

    /// With [`LoadOptions::readahead`]: ask the kernel to read ahead.
    #[must_use]
    pub fn with_readahead(self, readahead: bool) -> LoadOptions {
        LoadOptions { readahead, ..self }
    }

    /// With [`LoadOptions::concurrent_fills`]: pinned buffers filled at once (`None`: all).
    #[must_use]
    pub fn with_concurrent_fills(self, concurrent_fills: Option<usize>) -> LoadOptions {
        LoadOptions {
            concurrent_fills,
            ..self
        }
    }

    /// With [`LoadOptions::direct`]: copy large tensors straight from the
    /// registered page cache.
    #[must_use]
    pub fn with_direct(self, direct: bool) -> LoadOptions {
        LoadOptions { direct, ..self }
    }

    /// With [`LoadOptions::direct_share`]: the share of qualifying jobs
    /// that take the direct path.
    #[must_use]
    pub fn with_direct_share(self, direct_share: f32) -> LoadOptions {
        LoadOptions {
            direct_share,
            ..self
        }
    }

    /// With [`LoadOptions::memory_budget`]: device bytes the loader may use (`None`: no limit).
    #[must_use]
    pub fn with_memory_budget(self, memory_budget: Option<u64>) -> LoadOptions {
        LoadOptions {
            memory_budget,
            ..self
        }
    }

    /// Checked by [`Loader::new`](super::Loader::new): each field's range.
    pub(super) fn validate(&self) -> Result<()> {
        let bad = |field, reason| Err(Error::InvalidLoadOptions { field, reason });
        if !(2..=8).contains(&self.ring_buffers) {
            return bad("ring_buffers", "must be 2..=8");
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
        if !(0.0..=1.0).contains(&self.direct_share) {
            return bad("direct_share", "must be 0.0..=1.0");
        }
        if let Some(d) = self.dtype {
            if !matches!(d, DType::F32 | DType::F16 | DType::BF16) {
                return bad("dtype", "must be F32, F16 or BF16");
            }
        }
        Ok(())
    }
}

/// What to load of one tensor: all of it, or the indices `rows` of one
/// dimension (`dim`; a tensor-parallel rank's slice).
///
/// A slice of the first dimension is one contiguous range of the file. A
/// slice of a later dimension is `outer` runs of bytes (one per index of
/// the dimensions before it), read run by run into a contiguous output of
/// the slice's shape; it goes through the pinned ring like any tensor
/// (never through the direct path, whose copies are whole ranges).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Request {
    /// The tensor's name.
    pub name: String,
    /// Indices of dimension `dim` (all of the tensor when `None`).
    pub rows: Option<Range<u64>>,
    /// The dimension `rows` selects along: 0 (the rows) unless made by
    /// [`Request::slice`].
    pub dim: usize,
}

impl Request {
    /// The whole tensor.
    pub fn whole(name: impl Into<String>) -> Request {
        Request {
            name: name.into(),
            rows: None,
            dim: 0,
        }
    }

    /// Rows `rows` of the first dimension.
    pub fn rows(name: impl Into<String>, rows: Range<u64>) -> Request {
        Request::slice(name, 0, rows)
    }

    /// Indices `range` of dimension `dim`: for a `[K, C]` weight split by
    /// columns across two ranks, rank 1 asks for `slice(name, 1, C/2..C)`
    /// and gets a contiguous `[K, C/2]` tensor. Errors at load time:
    /// [`Error::SliceDim`](crate::Error::SliceDim) for a dimension the
    /// tensor lacks, [`Error::RowRange`](crate::Error::RowRange) for a
    /// range past it, [`Error::NoRows`](crate::Error::NoRows) where its
    /// elements are not byte-addressable.
    pub fn slice(name: impl Into<String>, dim: usize, range: Range<u64>) -> Request {
        Request {
            name: name.into(),
            rows: Some(range),
            dim,
        }
    }
}

#[cfg(test)]
mod tests {
    /// `ROCM_SAFE_LOAD_DIRECT`: off for `0`, `off`, `false`, `no`; on
    /// for `1`, `on`, `true`, `yes` (any case, spaces trimmed); a share for
    /// a number strictly between 0 and 1; the options otherwise.
    #[test]
    fn the_direct_variable_sets_the_path() {
        use super::direct_setting as d;
        for off in ["0", "off", " OFF ", "false", "No"] {
            assert_eq!(d(Some(off), true, 0.5), (false, 0.5), "{off}");
        }
        for on in ["1", "on", "True", " yes"] {
            assert_eq!(d(Some(on), false, 0.5), (true, 1.0), "{on}");
        }
        assert_eq!(d(Some("0.25"), false, 1.0), (true, 0.25));
        for other in [None, Some(""), Some("maybe"), Some("1.5"), Some("-0.2")] {
            assert_eq!(d(other, true, 0.75), (true, 0.75), "{other:?}");
            assert_eq!(d(other, false, 1.0), (false, 1.0), "{other:?}");
        }
    }
}
