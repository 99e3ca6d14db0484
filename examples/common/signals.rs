//! Shared by the `convert` and `conv3d` examples: SIGINT, SIGTERM and SIGHUP
//! set a cancellation flag instead of ending the process, so that the
//! writer removes its temporary file and the example exits with
//! `128 + signal` (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP).
//!
//! The handler only stores to atomics (async-signal-safe). A second signal
//! while the first is being handled is the same store again.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The flag the handler sets; given to the writer (`WriteOptions::cancel`).
static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// The signal received (0: none).
static SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    if let Some(flag) = FLAG.get() {
        flag.store(true, Ordering::SeqCst);
    }
}

/// Installs the handler for SIGINT, SIGTERM and SIGHUP and returns the
/// flag it sets.
pub fn install() -> Arc<AtomicBool> {
    let flag = FLAG
        .get_or_init(|| Arc::new(AtomicBool::new(false)))
        .clone();
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: `sigaction` is plain old data; all-zero is a valid value
        // (empty mask, no flags) that the fields below complete.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        // SAFETY: `sa.sa_mask` is a valid, writable signal set.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: `sa` is fully initialised and outlives the call; the
        // handler only stores to atomics, which is async-signal-safe; the
        // old action is not asked for (null).
        unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) };
    }
    flag
}

/// The signal received so far, if any.
pub fn received() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Exit status for a signal: `128 + signal`, as a shell reports it.
pub fn exit_status(sig: i32) -> u8 {
    u8::try_from(128 + sig).unwrap_or(1)
}

/// Test hook: `ROCM_SAFE_EXAMPLE_WRITE_DELAY_MS=N` sleeps N ms after every
/// chunk written, so a test can signal the process in the middle of a
/// write without a large input. Unset (the normal case): no delay.
pub fn write_delay() -> Option<Duration> {
    std::env::var("ROCM_SAFE_EXAMPLE_WRITE_DELAY_MS")
        .ok()?
        .parse::<u64>()
        .ok()
        .map(Duration::from_millis)
}
