//! The pinned ring's direct path: copies straight from the checkpoint's
//! page cache, registered read-only, with no CPU copy of the bytes.
//!
//! Each shard is mapped read-only (never read through the mapping by the
//! CPU: a file truncated meanwhile cannot raise `SIGBUS` here) and cut into
//! windows of [`WINDOW`] bytes of the file. A job whose pieces are large
//! enough ([`DIRECT_MIN_AVG`]) registers the windows it reads
//! ([`Driver::register_read_only`](crate::device::raw::Driver::register_read_only),
//! on the fill task, so registrations run beside the copies), and its
//! copy is one DMA per piece and window, straight from the registered pages
//! into the slot's device staging buffer (the raw landing area: the
//! conversion and the device fingerprints run from there as for a filled
//! buffer). The host's expectation is an independent pass that only reads
//! the same file bytes (`pread` into a small per-thread buffer that stays
//! in cache, then the fingerprint sums): a copy that lands other bytes than
//! the file holds is caught as on the ring.
//!
//! A window is unregistered (on the rayon pool) when every job reading it
//! has been checked, so the pages pinned at once stay near the ring's
//! reach. A refused registration (the runtime lacks the read-only flag, the
//! device reports no support, a file system whose pages the kernel will not
//! pin, the default [`Driver`](crate::device::raw::Driver) of a custom backend)
//! turns the direct path off for the rest of the load: the job, and every
//! later one, is filled by the ring's positioned reads, and the report says
//! why ([`DirectReport::refused`](super::DirectReport::refused)).
//!
//! On a unified-memory APU (gfx1151) the registered pages are already
//! memory the GPU reads: the copy is one read of the page cache and one
//! write of the output in the same DRAM, with no bounce through a pinned
//! buffer. The output is still a copy: a tensor aliasing the page cache
//! would change with the file.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::plan::Job;
use super::source::{self, Item, Source, Sums};
use crate::device::{DeviceBuffer, Stream};
use crate::error::{Error, Result};

/// Bytes of file per registered window (a multiple of every page size).
pub(super) const WINDOW: u64 = 64 << 20;
/// A job goes direct when its pieces average at least this many bytes:
/// jobs of many small tensors take one copy out of a filled buffer, not
/// one DMA each.
pub(super) const DIRECT_MIN_AVG: usize = 256 << 10;

/// One copy of a direct job: `len` bytes at file offset `file_off` of
/// source `source`, into the slot's staging at `stage_off`.
#[derive(Debug, Clone, Copy)]
struct Seg {
    source: usize,
    window: usize,
    file_off: u64,
    stage_off: usize,
    len: usize,
}

/// A direct job's copies and the windows they read (each once, in order).
#[derive(Debug)]
struct JobPlan {
    segs: Vec<Seg>,
    windows: Vec<usize>,
}

/// Where a window stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WinState {
    /// Not registered yet.
    Idle,
    /// Registered: copies may read it.
    Registered,
    /// Unregistered after its last job (or never to be registered).
    Released,
}

/// One registered range of a mapped shard.
#[derive(Debug)]
struct Window {
    /// Address of the first byte (inside the source's mapping).
    addr: usize,
    len: usize,
    state: Mutex<WinState>,
    /// Direct jobs not yet checked that read this window.
    pending: AtomicUsize,
}

/// The direct path of one ring pass (see the module docs).
pub(super) struct Direct {
    driver: crate::device::Device,
    /// Per source, its read-only mapping (`None`: not mapped, nothing of it
    /// goes direct).
    maps: Vec<Option<memmap2::Mmap>>,
    windows: Vec<Window>,
    /// Per job, its copies (`None`: the job is filled by reads).
    jobs: Vec<Option<JobPlan>>,
    /// Set at the first refusal: later jobs are filled by reads.
    refused: AtomicBool,
    refusal: Mutex<Option<String>>,
    /// A window the runtime would not unregister: its pages stay locked,
    /// so its mapping is never unmapped (leaked at drop).
    leak: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl Direct {
    /// The direct path for `jobs`, or `None` when no job qualifies or no
    /// shard can be mapped (the ring serves as before).
    pub fn plan(
        device: &crate::device::Device,
        sources: &[Source],
        items: &[Item],
        jobs: &[Job],
        share: f32,
    ) -> Option<Direct> {
        let wanted = chosen(jobs, share);
        if !wanted.iter().any(|&w| w) {
            return None;
        }
        let mut used = vec![false; sources.len()];
        for (job, _) in jobs.iter().zip(&wanted).filter(|(_, w)| **w) {
            for p in &job.pieces {
                if let Some(u) = items.get(p.item).and_then(|i| used.get_mut(i.source)) {
                    *u = true;
                }
            }
        }
        let mut maps = Vec::with_capacity(sources.len());
        let mut first_window = Vec::with_capacity(sources.len());
        let mut windows = Vec::new();
        for (src, used) in sources.iter().zip(used) {
            first_window.push(windows.len());
            let map = if used { map_source(src) } else { None };
            if let Some(m) = &map {
                let base = m.as_ptr() as usize;
                // The mapping covers whole pages: the last window ends at
                // the mapping's end, never past it.
                let mapped = m.len() as u64;
                let mut at = 0u64;
                while at < mapped {
                    let end = (at + WINDOW).min(round_up(mapped, page_size()));
                    windows.push(Window {
                        addr: base + at as usize,
                        len: (end - at) as usize,
                        state: Mutex::new(WinState::Idle),
                        pending: AtomicUsize::new(0),
                    });
                    at = end;
                }
            }
            maps.push(map);
        }
        let mut plans = Vec::with_capacity(jobs.len());
        for (job, want) in jobs.iter().zip(wanted) {
            let plan = want
                .then(|| job_segs(items, job, &maps, &first_window))
                .flatten()
                .map(|segs| {
                    let mut reads: Vec<usize> = segs.iter().map(|g| g.window).collect();
                    reads.sort_unstable();
                    reads.dedup();
                    JobPlan {
                        segs,
                        windows: reads,
                    }
                });
            for w in plan.iter().flat_map(|p| &p.windows) {
                if let Some(win) = windows.get(*w) {
                    win.pending.fetch_add(1, Ordering::Relaxed);
                }
            }
            plans.push(plan);
        }
        if plans.iter().all(Option::is_none) {
            return None;
        }
        Some(Direct {
            driver: device.clone(),
            maps,
            windows,
            jobs: plans,
            refused: AtomicBool::new(false),
            refusal: Mutex::new(None),
            leak: AtomicBool::new(false),
        })
    }

    /// Registers the windows job `j` reads; `true` when the job's copies
    /// can go direct, `false` when it is to be filled by reads (not
    /// planned direct, or a registration refused: the path is then off for
    /// the rest of the load).
    pub fn prepare(&self, j: usize) -> bool {
        let Some(Some(plan)) = self.jobs.get(j) else {
            return false;
        };
        if self.refused.load(Ordering::Relaxed) {
            return false;
        }
        for &wi in &plan.windows {
            let Some(w) = self.windows.get(wi) else {
                return false;
            };
            let mut st = lock(&w.state);
            match *st {
                WinState::Registered => {}
                WinState::Released => return false,
                WinState::Idle => {
                    // SAFETY: the window lies inside the source's live
                    // mapping, which is unmapped only in `Drop`, after
                    // every window is unregistered.
                    let r = unsafe {
                        self.driver
                            .backend()
                            .register_read_only(w.addr as *const u8, w.len)
                    };
                    match r {
                        Ok(()) => *st = WinState::Registered,
                        Err(e) => {
                            *st = WinState::Released;
                            self.refuse(&e);
                            return false;
                        }
                    }
                }
            }
        }
        true
    }

    fn refuse(&self, e: &Error) {
        if !self.refused.swap(true, Ordering::Relaxed) {
            tracing::info!(error = %e, "direct path: registration refused; the pinned ring's reads serve");
            *lock(&self.refusal) = Some(e.to_string());
        }
    }

    /// Why the direct path was turned off, if it was.
    pub fn refusal(&self) -> Option<String> {
        lock(&self.refusal).clone()
    }

    /// The host's sums of job `j`'s pieces, read from the file (never
    /// through the mapping), as a fill would return them; all zero without
    /// `check`.
    pub fn sums(
        &self,
        sources: &[Source],
        items: &[Item],
        job: &Job,
        sub: usize,
        check: bool,
    ) -> Result<Vec<Sums>> {
        if !check {
            return Ok(vec![Sums::default(); job.pieces.len()]);
        }
        job.pieces
            .iter()
            .map(|p| match items.get(p.item) {
                Some(item) => source::sum_piece(sources, item, p.src_off, p.len, sub),
                None => Ok(Sums::default()),
            })
            .collect()
    }

    /// Queues job `j`'s copies into `stage` on `copy` (after
    /// [`Direct::prepare`] returned `true` for it). The windows stay
    /// registered until [`Direct::done`] has been called for every job
    /// reading them, after their copies completed.
    pub fn copy(&self, j: usize, stage: &mut DeviceBuffer<u8>, copy: &Stream) -> Result<()> {
        let Some(Some(plan)) = self.jobs.get(j) else {
            return Ok(());
        };
        for g in &plan.segs {
            let (Some(Some(map)), Some(w)) = (self.maps.get(g.source), self.windows.get(g.window))
            else {
                continue;
            };
            let off = usize::try_from(g.file_off).unwrap_or(usize::MAX);
            let end = off.checked_add(g.len).filter(|&e| e <= map.len());
            let (Some(end), true) = (end, *lock(&w.state) == WinState::Registered) else {
                return Err(Error::OutOfBounds {
                    op: "direct copy",
                    start: off,
                    end: off.saturating_add(g.len),
                    len: map.len(),
                });
            };
            let src = map.as_ptr() as usize + off;
            let inside = src >= w.addr && src + g.len <= w.addr + w.len;
            if !inside {
                return Err(Error::OutOfBounds {
                    op: "direct copy window",
                    start: off,
                    end,
                    len: map.len(),
                });
            }
            let mut dst = stage.slice_mut(g.stage_off..g.stage_off + g.len)?;
            // SAFETY: `src..src + len` lies inside window `g.window`
            // (checked above), registered until `done` has been called for
            // this job, which the pass does only after the slot's
            // `consumed` event (recorded after this copy) completed; the
            // mapping lives until `Drop`, after every unregistration.
            unsafe { dst.copy_htod_async_registered(copy, src as *const u8)? };
        }
        Ok(())
    }

    /// Job `j` is checked (its copies are complete): the windows no other
    /// pending job reads, to be released with [`Direct::release`].
    pub fn done(&self, j: usize) -> Vec<usize> {
        let Some(Some(plan)) = self.jobs.get(j) else {
            return Vec::new();
        };
        (plan.windows.iter().copied())
            .filter(|&w| {
                self.windows
                    .get(w)
                    .is_some_and(|win| win.pending.fetch_sub(1, Ordering::AcqRel) == 1)
            })
            .collect()
    }

    /// Unregisters window `w` (no copy reads it any more: every job that
    /// did is checked, or the device was synchronized).
    pub fn release(&self, w: usize) {
        let Some(win) = self.windows.get(w) else {
            return;
        };
        let mut st = lock(&win.state);
        if *st != WinState::Registered {
            *st = WinState::Released;
            return;
        }
        // SAFETY: registered by `prepare` on this driver, unregistered once
        // (the state moves to Released under the lock), and idle (caller).
        let r = unsafe {
            self.driver
                .backend()
                .unregister_read_only(win.addr as *const u8)
        };
        if let Err(e) = r {
            tracing::warn!(error = %e, "direct path: unregistration failed; the mapping is kept");
            self.leak.store(true, Ordering::Relaxed);
        }
        *st = WinState::Released;
    }
}

impl Drop for Direct {
    fn drop(&mut self) {
        let registered = self
            .windows
            .iter()
            .any(|w| *lock(&w.state) == WinState::Registered);
        if registered {
            // A pass that stopped early may leave copies queued: none may
            // read a window after it is unregistered and unmapped.
            if let Err(e) = self.driver.backend().synchronize() {
                tracing::warn!(error = %e, "direct path: synchronize failed; the mappings are kept");
                self.leak.store(true, Ordering::Relaxed);
            } else {
                for w in 0..self.windows.len() {
                    self.release(w);
                }
            }
        }
        if self.leak.load(Ordering::Relaxed) {
            // Pages the runtime still holds (or copies that may still read
            // them) must stay mapped.
            for m in self.maps.drain(..).flatten() {
                std::mem::forget(m);
            }
        }
    }
}

/// The jobs that go direct: of those that qualify, `share` (0..=1) of
/// them, spread evenly (the others are filled by the reads at the same
/// time: the two paths draw on different limits, the registration's page
/// walk and the CPU's copy).
fn chosen(jobs: &[Job], share: f32) -> Vec<bool> {
    let share = f64::from(share.clamp(0.0, 1.0));
    let mut k = 0u64;
    jobs.iter()
        .map(|j| {
            if !qualifies(j) {
                return false;
            }
            let take = ((k + 1) as f64 * share).floor() > (k as f64 * share).floor();
            k += 1;
            take
        })
        .collect()
}

/// Whether `job` is worth copying piece by piece.
fn qualifies(job: &Job) -> bool {
    let n = job.pieces.len();
    n > 0 && job.pieces.iter().map(|p| p.len).sum::<usize>() / n >= DIRECT_MIN_AVG
}

/// The copies of `job`: each piece cut at window boundaries; `None` when a
/// piece's file has no mapping or lies outside it, or is a strided slice.
fn job_segs(
    items: &[Item],
    job: &Job,
    maps: &[Option<memmap2::Mmap>],
    first_window: &[usize],
) -> Option<Vec<Seg>> {
    let mut out = Vec::new();
    for p in &job.pieces {
        let item = items.get(p.item)?;
        if item.runs.is_some() {
            return None; // a strided slice: its bytes are not one range
        }
        let map = maps.get(item.source)?.as_ref()?;
        let first = *first_window.get(item.source)?;
        let start = item.file_off.checked_add(p.src_off)?;
        let end = start.checked_add(p.len as u64)?;
        if end > map.len() as u64 {
            return None;
        }
        let mut at = start;
        while at < end {
            let w = at / WINDOW;
            let stop = ((w + 1) * WINDOW).min(end);
            out.push(Seg {
                source: item.source,
                window: first + usize::try_from(w).ok()?,
                file_off: at,
                stage_off: p.slot_off + (at - start) as usize,
                len: (stop - at) as usize,
            });
            at = stop;
        }
    }
    Some(out)
}

/// A read-only shared mapping of `src`'s file, or `None` (logged) where it
/// cannot be made.
fn map_source(src: &Source) -> Option<memmap2::Mmap> {
    let file = match src.file.get(&src.path) {
        Ok(f) => f,
        Err(e) => {
            tracing::debug!(error = %e, "direct path: no file handle");
            return None;
        }
    };
    if src.len == 0 {
        return None;
    }
    // SAFETY: the mapping is never read by the CPU here (the host's sums
    // read the file with `pread`), so a file changed or truncated while
    // mapped cannot fault this process; the device reads it only through
    // registrations, which pin the pages they cover. Its length is the
    // length the checkpoint was validated with.
    let r = unsafe {
        memmap2::MmapOptions::new()
            .len(usize::try_from(src.len).ok()?)
            .map(&*file)
    };
    match r {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::debug!(error = %e, path = %src.path.display(), "direct path: no mapping");
            None
        }
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf only reads its argument.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::ConvertOp;
    use crate::dtype::DType;

    fn item(source: usize, file_off: u64, bytes: u64) -> Item {
        Item {
            name: "t".into(),
            source,
            file_off,
            src_bytes: bytes,
            dtype: DType::BF16,
            out_dtype: DType::F32,
            shape: vec![bytes / 2],
            out_bytes: bytes * 2,
            op: Some(ConvertOp {
                from: DType::BF16,
                to: DType::F32,
            }),
            runs: None,
        }
    }

    /// A piece that crosses window boundaries is cut at each, and the cuts
    /// tile the piece in file and in staging.
    #[test]
    fn pieces_are_cut_at_window_boundaries() {
        let items = [item(0, WINDOW - 100, 2 * WINDOW)];
        let job = Job {
            pieces: vec![super::super::plan::Piece {
                item: 0,
                src_off: 4,
                len: (WINDOW + 200) as usize,
                slot_off: 256,
            }],
            used: 0,
        };
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; (3 * WINDOW) as usize]).unwrap();
        let f = std::fs::File::open(&p).unwrap();
        // SAFETY: a private test file, unchanged while mapped.
        let m = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        let segs = job_segs(&items, &job, &[Some(m)], &[0]).unwrap();
        let lens: Vec<usize> = segs.iter().map(|s| s.len).collect();
        assert_eq!(lens, vec![96, WINDOW as usize, 104]);
        assert_eq!(segs.iter().map(|s| s.window).collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(segs[0].file_off, WINDOW - 96);
        assert_eq!(segs[1].stage_off, 256 + 96);
        assert_eq!(segs[2].file_off, 2 * WINDOW);
        // Past the mapping: no direct plan.
        let far = [item(0, 3 * WINDOW - 10, 20)];
        let job2 = Job {
            pieces: vec![super::super::plan::Piece {
                item: 0,
                src_off: 0,
                len: 20,
                slot_off: 0,
            }],
            used: 0,
        };
        // SAFETY: as above.
        let m2 = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        assert!(job_segs(&far, &job2, &[Some(m2)], &[0]).is_none());
    }

    /// Only jobs of large pieces go direct.
    #[test]
    fn small_pieces_stay_on_the_reads() {
        let piece = |len| super::super::plan::Piece {
            item: 0,
            src_off: 0,
            len,
            slot_off: 0,
        };
        let big = Job {
            pieces: vec![piece(DIRECT_MIN_AVG)],
            used: 0,
        };
        let small = Job {
            pieces: vec![piece(4096); 8],
            used: 0,
        };
        assert!(qualifies(&big));
        assert!(!qualifies(&small));
        assert!(!qualifies(&Job::default()));
        let jobs: Vec<Job> = (0..12)
            .map(|i| Job {
                pieces: vec![piece(if i % 4 == 3 { 4096 } else { DIRECT_MIN_AVG })],
                used: 0,
            })
            .collect();
        let n = |share| chosen(&jobs, share).iter().filter(|&&b| b).count();
        assert_eq!((n(1.0), n(0.0), n(1.0 / 3.0), n(0.5)), (9, 0, 3, 4));
        assert!(chosen(&jobs, 1.0)
            .iter()
            .zip(&jobs)
            .all(|(&c, j)| c == qualifies(j)));
    }
}
