//! What a move did: the rung that served, what failed before it, the bytes
//! and the time.

use std::fmt;
use std::time::Duration;

use crate::fallback::Attempt;

/// What kind of move a [`MoveReport`] describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum MoveKind {
    /// Host memory to the device ([`Mover::upload_into`](super::Mover::upload_into),
    /// [`Mover::upload_packed`](super::Mover::upload_packed), [`Mover::upload`](super::Mover::upload)).
    Upload,
    /// Device memory to the host ([`Mover::download_into`](super::Mover::download_into)).
    Download,
    /// A dtype conversion of device-resident data ([`Mover::cast`](super::Mover::cast)).
    Cast,
}

impl MoveKind {
    /// `"upload"`, `"download"` or `"cast"`.
    pub const fn name(self) -> &'static str {
        match self {
            MoveKind::Upload => "upload",
            MoveKind::Download => "download",
            MoveKind::Cast => "cast",
        }
    }
}

/// A rung of a move's ladder, fastest first. Uploads and downloads go
/// `Staged -> SmallChunks -> Pageable` (an owned upload then keeps the
/// data on the host); casts go `Device -> ViaHost`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum MoveRung {
    /// Two reusable pinned buffers, the CPU filling one while the other is
    /// copied asynchronously; one fingerprint check at the end.
    Staged,
    /// The same through small pieces, with a synchronize after each.
    SmallChunks,
    /// Synchronous copies from or to the caller's pageable memory.
    Pageable,
    /// The upload did not serve: the data stays in host memory
    /// ([`Mover::upload`](super::Mover::upload) only).
    KeptOnHost,
    /// The conversion kernel on the device, its output checked.
    Device,
    /// Download (verified), exact conversion on the CPU, upload (verified).
    ViaHost,
}

impl MoveRung {
    /// The rung's name (`"staged"`, `"small chunks"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            MoveRung::Staged => "staged",
            MoveRung::SmallChunks => "small chunks",
            MoveRung::Pageable => "pageable",
            MoveRung::KeptOnHost => "kept on host",
            MoveRung::Device => "device",
            MoveRung::ViaHost => "via host",
        }
    }
}

impl fmt::Display for MoveRung {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a move's result was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum MoveCheck {
    /// Not checked (verification off).
    None,
    /// The host's fingerprint of the bytes against the device's.
    Fingerprint,
    /// Every element of the output against the exact widening of its
    /// source, by an integer comparison on the device.
    Exact,
    /// Sampled elements against the CPU's exact conversion.
    Sampled,
}

impl MoveCheck {
    /// `"none"`, `"fingerprint"`, `"exact"` or `"sampled"`.
    pub const fn name(self) -> &'static str {
        match self {
            MoveCheck::None => "none",
            MoveCheck::Fingerprint => "fingerprint",
            MoveCheck::Exact => "exact",
            MoveCheck::Sampled => "sampled",
        }
    }
}

/// What one move did.
#[derive(Debug)]
#[non_exhaustive]
pub struct MoveReport {
    /// Upload, download or cast.
    pub kind: MoveKind,
    /// Bytes moved (the source's bytes; for a packed upload, the packed
    /// span's).
    pub bytes: u64,
    /// Host buffers packed into the move (1 unless packed).
    pub pieces: usize,
    /// The rung that served.
    pub rung: MoveRung,
    /// How the served result was checked.
    pub check: MoveCheck,
    /// The rungs that ran and did not serve, in order: what was caught.
    pub attempts: Vec<Attempt<MoveRung>>,
    /// Wall time of the whole move, checks and retries included.
    pub elapsed: Duration,
}

impl MoveReport {
    /// Bytes per second of the whole move.
    pub fn bytes_per_s(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s
        } else {
            0.0
        }
    }

    /// Whether the first rung served with nothing caught.
    pub fn clean(&self) -> bool {
        self.attempts.is_empty()
    }
}

impl fmt::Display for MoveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} of {} bytes ({} piece{}): {} in {:.3} ms ({:.2} GB/s), check {}",
            self.kind.name(),
            self.bytes,
            self.pieces,
            if self.pieces == 1 { "" } else { "s" },
            self.rung,
            self.elapsed.as_secs_f64() * 1e3,
            self.bytes_per_s() / 1e9,
            self.check.name()
        )?;
        for a in &self.attempts {
            write!(f, "; {} failed: {}", a.step, a.failure)?;
        }
        Ok(())
    }
}
