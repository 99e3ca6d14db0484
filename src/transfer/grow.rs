//! The ring's pinned buffers, pinned on a thread of their own while the
//! load goes on.
//!
//! Why: a process's first load used to pin its whole ring (8 x 16 MiB)
//! before its first fill, 12-18 ms on a 135-145 ms load of 4.3 GiB on the
//! H100 (BENCHMARKS.md, "First load of a process"), most of the 10% by which
//! a first load may trail the later ones; pinning inside the job loop was
//! worse, because the loader's thread then waited for the busy rayon pool
//! to fault the pages in. Here a [`Grower`] pins the buffers one by one on
//! a thread and a small rayon pool of its own (so the faults never queue
//! behind fills), while the loader's thread allocates the outputs and runs
//! the self-test, and the job loop fills the buffers already pinned; each
//! new buffer joins the ring at the loop's next turn.
//!
//! The grower knows slots by number only: the ring (`ring.rs`) owns it and
//! turns what [`Grower::take`] says into its own state.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use crate::device::{Device, PinnedBuffer};
use crate::error::{Error, Result};

/// Threads of the grower's own rayon pool, which faults each buffer's
/// pages in (`device/hostmem.rs`). On the H100 host one, two and four
/// threads all had the first buffer ready within 0.3 ms of the job loop's
/// start; in alternating processes two gave the steadiest first loads (10
/// of 10 at 0.9x the later ones or more), four 9 of 10, eight 7 of 10, its
/// extra threads taken from the fills (BENCHMARKS.md, "First load of a
/// process").
const PIN_THREADS: usize = 2;

/// One buffer's pinning, by slot.
type Pinned = (usize, Result<PinnedBuffer<u8>>);

/// Pins buffers for a range of ring slots, in slot order, on a thread of
/// its own; stops at the first failure. Dropping it stops the thread after
/// the buffer it is pinning and waits for it (buffers pinned but not taken
/// are freed), so no thread outlives its loader.
pub(super) struct Grower {
    /// In a mutex only so the loader stays `Sync` (taken through `&mut`,
    /// never locked).
    rx: Mutex<Receiver<Pinned>>,
    /// The next slot a buffer is owed for; `owed.end` is past the last.
    owed: Range<usize>,
    /// Each buffer's size.
    bytes: usize,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// The process that started the thread: in a `fork()` child the thread
    /// does not exist (see [`Grower::orphaned`]).
    pid: u32,
}

impl Grower {
    /// Starts pinning `bytes`-byte buffers for `slots`. Where no thread can
    /// be started, pins them here before returning (slower, same result).
    pub(super) fn start(device: &Device, slots: Range<usize>, bytes: usize) -> Grower {
        let (tx, rx) = mpsc::channel::<Pinned>();
        let stop = Arc::new(AtomicBool::new(false));
        let spawned = {
            let (device, stop, slots, tx) =
                (device.clone(), stop.clone(), slots.clone(), tx.clone());
            std::thread::Builder::new()
                .name("rocm-safe-pin".into())
                .spawn(move || pin_all(&device, slots, bytes, &stop, &tx))
        };
        let thread = match spawned {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::debug!(error = %e, "pinned ring: no pinning thread; pinning here");
                pin_all(device, slots.clone(), bytes, &stop, &tx);
                None
            }
        };
        Grower {
            rx: Mutex::new(rx),
            owed: slots,
            bytes,
            stop,
            thread,
            pid: std::process::id(),
        }
    }
}

impl Grower {
    /// Whether this grower's thread belongs to another process: a loader
    /// made before `fork()` and used in the child. Its thread was not
    /// copied into the child, so nothing will ever come from it: the ring
    /// treats it as stopped (and grows again at the next load, in this
    /// process), and dropping it does not wait for it.
    pub(super) fn orphaned(&self) -> bool {
        self.pid != std::process::id()
    }
}

impl Drop for Grower {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if self.orphaned() {
            // Joining a thread of the parent process would wait for ever.
            std::mem::forget(self.thread.take());
            return;
        }
        if let Some(t) = self.thread.take() {
            // A panic in the thread was caught there; nothing to report.
            let _ = t.join();
        }
    }
}

/// The grower's thread: pins each slot's buffer on a small pool of its own
/// (the global one is busy with fills), sends it, stops at the first
/// failure, at `stop`, or when nobody receives.
fn pin_all(
    device: &Device,
    slots: Range<usize>,
    bytes: usize,
    stop: &AtomicBool,
    tx: &mpsc::Sender<Pinned>,
) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(PIN_THREADS)
        .thread_name(|i| format!("rocm-safe-pin-{i}"))
        .build()
        .ok();
    for s in slots {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let pin = || device.alloc_pinned::<u8>(bytes);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &pool {
            Some(p) => p.install(pin),
            None => pin(),
        }))
        .unwrap_or_else(|_| Err(stopped(bytes)));
        let failed = r.is_err();
        if tx.send((s, r)).is_err() || failed {
            return;
        }
    }
}

/// The error of a pinning that stopped without saying why (its thread
/// panicked, or ended before the buffer).
fn stopped(bytes: usize) -> Error {
    Error::OutOfMemory {
        backend: "host",
        op: "pin a ring buffer (the pinning thread stopped)",
        bytes: bytes as u64,
    }
}

/// What a [`Grower::take`] found.
#[derive(Debug)]
pub(super) enum Grown {
    /// Buffers are still owed; nothing more has come yet.
    Pending,
    /// Every owed buffer was handed out: the grower is done.
    Done,
    /// The pinning stopped: the slots from `at` on get no buffer.
    Stopped {
        /// The first slot left without a buffer.
        at: usize,
        /// Why.
        error: Error,
    },
}

impl Grower {
    /// Whether a buffer for slot `s` is still owed.
    pub(super) fn owes(&self, s: usize) -> bool {
        self.owed.contains(&s)
    }

    /// Hands each buffer pinned since the last call to `put` with its
    /// slot; with `wait` (nothing else to do), first blocks until one
    /// comes, where one is owed.
    pub(super) fn take(
        &mut self,
        wait: bool,
        put: &mut dyn FnMut(usize, PinnedBuffer<u8>),
    ) -> Grown {
        let mut block = wait;
        loop {
            if self.owed.is_empty() {
                return Grown::Done;
            }
            if self.orphaned() {
                return self.stopped_at(self.owed.start);
            }
            let rx = self.rx.get_mut().unwrap_or_else(PoisonError::into_inner);
            let msg = if block {
                block = false;
                rx.recv().map_err(|_| TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            match msg {
                // One thread pins in slot order: `s` is `owed.start`.
                Ok((s, Ok(buf))) => {
                    self.owed.start = s + 1;
                    put(s, buf);
                }
                Ok((s, Err(error))) => {
                    return Grown::Stopped {
                        at: s.min(self.owed.start),
                        error,
                    }
                }
                Err(TryRecvError::Empty) => return Grown::Pending,
                Err(TryRecvError::Disconnected) => return self.stopped_at(self.owed.start),
            }
        }
    }

    /// [`Grown::Stopped`] at `at`, for a thread that ended without saying why.
    fn stopped_at(&self, at: usize) -> Grown {
        Grown::Stopped {
            at,
            error: stopped(self.bytes),
        }
    }
}
