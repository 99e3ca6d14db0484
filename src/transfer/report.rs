//! What a load did: the load and tensor reports, and the ladder's rungs.

use std::fmt;

use crate::dtype::DType;
use crate::fallback::Attempt;

/// A rung of the transfer ladder (crate [contract 3](crate#contracts)),
/// fastest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum Rung {
    /// Reusable pinned buffers filled by CPU threads, asynchronous copies on
    /// a copy stream, conversion on a compute stream, fingerprint checks.
    PinnedRing,
    /// The same steps in small chunks, with a synchronize after each.
    SmallChunks,
    /// A synchronous copy from pageable (ordinary) host memory, then the
    /// conversion on the device.
    Pageable,
    /// Conversion on the CPU, then a synchronous copy of the result.
    CpuConvert,
    /// The tensor is kept in host memory (converted there when asked):
    /// the last rung, or where the memory budget is spent.
    KeepOnHost,
}

impl Rung {
    /// Every rung, in ladder order.
    pub const ALL: [Rung; 5] = [
        Rung::PinnedRing,
        Rung::SmallChunks,
        Rung::Pageable,
        Rung::CpuConvert,
        Rung::KeepOnHost,
    ];

    /// The rung's name (`"pinned ring"`, ..., `"keep on host"`).
    pub const fn name(self) -> &'static str {
        match self {
            Rung::PinnedRing => "pinned ring",
            Rung::SmallChunks => "small chunks",
            Rung::Pageable => "pageable",
            Rung::CpuConvert => "cpu convert",
            Rung::KeepOnHost => "keep on host",
        }
    }

    /// Whether the rung converts on the device (needs a trusted kernel).
    pub const fn converts_on_device(self) -> bool {
        matches!(self, Rung::PinnedRing | Rung::SmallChunks | Rung::Pageable)
    }

    /// The next rung down, if any.
    pub fn next(self) -> Option<Rung> {
        let i = Rung::ALL.iter().position(|r| *r == self)?;
        Rung::ALL.get(i + 1).copied()
    }
}

impl fmt::Display for Rung {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What happened to one tensor.
#[derive(Debug)]
pub struct TensorReport {
    /// The tensor's name.
    pub name: String,
    /// Stored dtype.
    pub dtype: DType,
    /// Dtype of the loaded data.
    pub out_dtype: DType,
    /// Shape of the loaded data (rows of a slice).
    pub shape: Vec<u64>,
    /// Bytes read from the file.
    pub file_bytes: u64,
    /// Bytes of the loaded data.
    pub out_bytes: u64,
    /// The rung that served it.
    pub rung: Rung,
    /// Rungs that failed before, in order, each with its
    /// [`Failure`](crate::fallback::Failure) (the vocabulary of
    /// [`crate::fallback`], shared with the conv3d chain).
    pub attempts: Vec<Attempt<Rung>>,
    /// Whether an allocation ran out of memory once and succeeded after the
    /// loader released its cached device memory.
    pub oom_retried: bool,
    /// Whether the tensor stayed on the host because the device memory
    /// budget was spent (offloading), not because of a failure.
    pub offloaded: bool,
    /// Why the tensor started below the pinned ring when nothing failed:
    /// its conversion has no device kernel (`f64 -> f32` is done on the
    /// CPU), or a forced rung. `None` when it started on the pinned ring.
    pub routed: Option<String>,
    /// Wall time from the tensor's first operation to its last check
    /// (pinned-ring tensors overlap with each other).
    pub ms: f32,
}

/// What a whole load did.
#[derive(Debug, Default)]
pub struct LoadReport {
    /// The device (`"cuda:0 sm_90"`).
    pub device: String,
    /// Per tensor, in request order.
    pub tensors: Vec<TensorReport>,
    /// Bytes read from the files.
    pub file_bytes: u64,
    /// Bytes of loaded data.
    pub out_bytes: u64,
    /// Wall time of the load.
    pub ms: f32,
    /// Of which: the pinned-ring pass.
    pub ring_ms: f32,
    /// Jobs (pinned-buffer fills) of the pinned-ring pass.
    pub ring_jobs: u64,
    /// Where the time went: allocating the device outputs, and the pinned
    /// ring's stalls (what a slow load is waiting for).
    pub timing: LoadTiming,
    /// The ring's jobs whose copies came straight from the file's
    /// registered pages ([`LoadOptions::direct`](super::LoadOptions::direct)).
    pub direct: DirectReport,
}

/// What the pinned ring's direct path served in one load: its jobs were
/// copied by DMA straight from the checkpoint's page cache (registered
/// read-only), with no CPU copy, and checked as every ring job is.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct DirectReport {
    /// Ring jobs copied from registered pages.
    pub jobs: u64,
    /// File bytes of those jobs.
    pub bytes: u64,
    /// Why the path was turned off during the load (the first refused
    /// registration), after which the ring's reads served the rest;
    /// `None` when nothing was refused.
    pub refused: Option<String>,
}

/// A load's time split, in milliseconds. The ring's three waits tell which
/// side holds the pipeline: the queueing thread waiting for filled buffers
/// (the file reads and host sums are slower than the device), waiting for
/// a slot's device work (the copies or kernels are slower), and the fill
/// tasks waiting for their buffer's previous copy (the ring is too short to
/// hide the copy).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct LoadTiming {
    /// Allocating the device outputs (with the budget applied), and then
    /// waiting for the device's self-test where this load ran it beside
    /// the allocations (a device's first load).
    pub alloc_ms: f32,
    /// The queueing thread waiting for a filled pinned buffer.
    pub wait_fill_ms: f32,
    /// The queueing thread waiting for a slot's device work to finish
    /// before checking and reusing it.
    pub wait_device_ms: f32,
    /// Summed over fill tasks: time blocked on the previous copy out of
    /// their pinned buffer before reading into it.
    pub fill_blocked_ms: f32,
    /// Summed over fill tasks: time reading (and summing) into buffers.
    pub fill_busy_ms: f32,
    /// The queueing thread waiting, with no buffer free and no fill
    /// running, for the ring's next buffer to be pinned (a loader's first
    /// load, whose ring is pinned while the load runs).
    pub wait_pin_ms: f32,
}

impl LoadReport {
    /// The report of tensor `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorReport> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Tensors and file bytes served by each rung.
    pub fn by_rung(&self) -> Vec<(Rung, usize, u64)> {
        Rung::ALL
            .iter()
            .map(|&r| {
                let it = self.tensors.iter().filter(|t| t.rung == r);
                (r, it.clone().count(), it.map(|t| t.file_bytes).sum())
            })
            .collect()
    }

    /// Whether nothing fell back: every tensor was served by the pinned
    /// ring, or by the rung it was routed to on purpose
    /// ([`TensorReport::routed`]: no device kernel for its conversion, a
    /// forced rung), with no failed attempt and no offloading.
    pub fn all_fast(&self) -> bool {
        self.tensors.iter().all(|t| {
            (t.rung == Rung::PinnedRing || t.routed.is_some())
                && t.attempts.is_empty()
                && !t.offloaded
        })
    }

    /// File bytes per second of wall time.
    pub fn bytes_per_s(&self) -> f64 {
        if self.ms <= 0.0 {
            return 0.0;
        }
        self.file_bytes as f64 / (f64::from(self.ms) / 1e3)
    }

    /// [`bytes_per_s`](Self::bytes_per_s) for a person: in GB/s, MB/s or
    /// kB/s, whichever keeps three significant digits (a first load of a
    /// few kilobytes reads "80.0 kB/s", not "0.00 GB/s").
    pub fn throughput_text(&self) -> String {
        rate_text(self.bytes_per_s())
    }
}

/// `bytes_per_s` in the largest decimal unit that is at least 1.
pub(crate) fn rate_text(bytes_per_s: f64) -> String {
    let (v, unit) = if bytes_per_s >= 1e9 {
        (bytes_per_s / 1e9, "GB/s")
    } else if bytes_per_s >= 1e6 {
        (bytes_per_s / 1e6, "MB/s")
    } else if bytes_per_s >= 1e3 {
        (bytes_per_s / 1e3, "kB/s")
    } else {
        (bytes_per_s, "B/s")
    };
    if v >= 100.0 {
        format!("{v:.0} {unit}")
    } else if v >= 10.0 {
        format!("{v:.1} {unit}")
    } else {
        format!("{v:.2} {unit}")
    }
}

impl fmt::Display for TensorReport {
    /// `name: rung` and, before it, every failed rung with its failure:
    /// `w: small chunks (pinned ring failed: ...)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.name, self.rung)?;
        if self.offloaded {
            f.write_str(" (memory budget spent)")?;
        }
        if let Some(why) = &self.routed {
            write!(f, " ({why})")?;
        }
        if !self.attempts.is_empty() {
            f.write_str(" (")?;
            for (i, a) in self.attempts.iter().enumerate() {
                if i > 0 {
                    f.write_str("; ")?;
                }
                write!(f, "{} failed: {}", a.step, a.failure)?;
            }
            f.write_str(")")?;
        }
        Ok(())
    }
}

impl fmt::Display for LoadReport {
    /// One summary line (tensors and bytes per rung, time, throughput on
    /// `device`), then one line per tensor that did not take the pinned
    /// ring without failure.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tensors, {} file bytes on {} in {:.1} ms ({}):",
            self.tensors.len(),
            self.file_bytes,
            self.device,
            self.ms,
            self.throughput_text()
        )?;
        let mut first = true;
        for (rung, n, bytes) in self.by_rung() {
            if n > 0 {
                let sep = if first { " " } else { ", " };
                first = false;
                write!(f, "{sep}{rung}: {n} ({bytes} bytes)")?;
            }
        }
        for t in &self.tensors {
            if t.rung != Rung::PinnedRing || !t.attempts.is_empty() {
                write!(f, "\n  {t}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn throughput_reads_in_a_unit_a_person_can_use() {
        assert_eq!(super::rate_text(27.4e9), "27.4 GB/s");
        assert_eq!(super::rate_text(4.0e3), "4.00 kB/s");
        assert_eq!(super::rate_text(81_234.0), "81.2 kB/s");
        assert_eq!(super::rate_text(350e6), "350 MB/s");
        assert_eq!(super::rate_text(0.0), "0.00 B/s");
    }

    use super::*;
    use crate::fallback::Failure;

    fn tensor(name: &str, rung: Rung, attempts: Vec<Attempt<Rung>>) -> TensorReport {
        TensorReport {
            name: name.into(),
            dtype: DType::BF16,
            out_dtype: DType::F32,
            shape: vec![2],
            file_bytes: 4,
            out_bytes: 8,
            rung,
            attempts,
            oom_retried: false,
            offloaded: false,
            routed: None,
            ms: 0.0,
        }
    }

    #[test]
    fn display_sums_up_by_rung_and_lists_what_fell_back() {
        let report = LoadReport {
            device: "host:0 cpu".into(),
            tensors: vec![
                tensor("a", Rung::PinnedRing, Vec::new()),
                tensor(
                    "b",
                    Rung::SmallChunks,
                    vec![Attempt {
                        step: Rung::PinnedRing,
                        failure: Failure::JobFailed { with: "a".into() },
                    }],
                ),
            ],
            file_bytes: 8,
            out_bytes: 16,
            ms: 2.0,
            ..LoadReport::default()
        };
        assert_eq!(
            report.to_string(),
            "2 tensors, 8 file bytes on host:0 cpu in 2.0 ms (4.00 kB/s): \
             pinned ring: 1 (4 bytes), small chunks: 1 (4 bytes)\n  \
             b: small chunks (pinned ring failed: its pinned-buffer job failed \
             (error recorded on \"a\"))"
        );
        let mut kept = tensor("c", Rung::KeepOnHost, Vec::new());
        kept.offloaded = true;
        assert_eq!(kept.to_string(), "c: keep on host (memory budget spent)");
    }
}
