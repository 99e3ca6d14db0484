//! Data parallelism that survives `fork()`.
//!
//! The library's parallel loops (conversions, fingerprints, the CPU conv3d,
//! page faulting, the ring's reads) run on rayon. A child made by `fork()`
//! (PyTorch DataLoader workers, gunicorn, `multiprocessing` on Linux)
//! inherits the memory of rayon's global pool but none of its threads:
//! work queued there waits for ever. So every parallel section goes through
//! [`install`]: in the process that loaded the library it runs on rayon's
//! global pool as usual (sharing it with the caller's own rayon work); in a
//! forked child it runs on a pool made for that process (made on its first
//! parallel section, with rayon's default size, `RAYON_NUM_THREADS`
//! included). A grandchild gets a pool of its own again. The pool of a
//! parent is never dropped in a child (its threads do not exist there);
//! the few bytes it holds are left behind.
//!
//! The process that loaded the library is recorded when the library is
//! loaded (an ELF initialiser), so a fork before any rocm-safe call is seen
//! too. The check is lock-free: a child forked while another thread of the
//! parent was inside [`install`] cannot inherit a held lock from here.

use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

/// The process id that loaded the library (0 until recorded).
static LOAD_PID: AtomicU32 = AtomicU32::new(0);

fn pid() -> u32 {
    std::process::id()
}

/// Records the loading process; run by the dynamic loader (or the
/// program's start-up) through `.init_array`, before `main` or `dlopen`
/// returns.
extern "C" fn record_load_pid() {
    LOAD_PID.store(pid(), Ordering::SeqCst);
}

#[cfg(target_os = "linux")]
#[used]
#[link_section = ".init_array"]
static RECORD_LOAD_PID: extern "C" fn() = record_load_pid;

/// Whether this process is a `fork()` child of the one that loaded the
/// library (or of one of its children).
pub(crate) fn forked() -> bool {
    let now = pid();
    match LOAD_PID.compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst) {
        // Not recorded at load (no ELF initialiser ran): this process is
        // taken as the loader.
        Ok(_) => false,
        Err(loaded) => loaded != now,
    }
}

/// A pool made for one forked process.
struct ChildPool {
    pid: u32,
    pool: rayon::ThreadPool,
}

/// The pool of the current forked process, if one was made.
static CHILD_POOL: AtomicPtr<ChildPool> = AtomicPtr::new(std::ptr::null_mut());

/// The pool of this (forked) process: the one made for it, or a new one.
/// `None` when no thread can be started.
fn child_pool() -> Option<&'static rayon::ThreadPool> {
    let now = pid();
    let mut fresh: Option<*mut ChildPool> = None;
    loop {
        let current = CHILD_POOL.load(Ordering::Acquire);
        // SAFETY: a non-null pointer in CHILD_POOL came from `Box::leak`
        // below and is never freed, so it is valid for 'static.
        if let Some(p) = unsafe { current.as_ref() } {
            if p.pid == now {
                // Another thread of this process stored one first; a pool
                // made here meanwhile stays unused (it cannot be dropped
                // without waiting for its idle threads; leaking it costs
                // only them).
                return Some(&p.pool);
            }
        }
        let ours = match fresh {
            Some(p) => p,
            None => {
                let pool = rayon::ThreadPoolBuilder::new()
                    .thread_name(|i| format!("rocm-safe-{i}"))
                    .build()
                    .ok()?;
                let leaked: *mut ChildPool = Box::leak(Box::new(ChildPool { pid: now, pool }));
                fresh = Some(leaked);
                leaked
            }
        };
        if CHILD_POOL
            .compare_exchange(current, ours, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            // SAFETY: `ours` is a leaked box, never freed.
            return Some(unsafe { &(*ours).pool });
        }
    }
}

/// Runs `f`, whose parallel loops then use a pool that works in this
/// process (see the module docs). Call it around every rayon section.
pub(crate) fn install<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if !forked() {
        return f();
    }
    match child_pool() {
        Some(pool) => pool.install(f),
        // No thread could be started: rayon then runs the section on this
        // thread alone only if its global pool was never started in the
        // parent; there is nothing better to do.
        None => f(),
    }
}

/// `rayon::in_place_scope` on a pool that works in this process: `op`
/// runs on the calling thread (it need not be `Send`), the tasks it spawns
/// on the global pool, or in a forked child on that process's pool.
pub(crate) fn in_place_scope<'scope, R>(op: impl FnOnce(&rayon::Scope<'scope>) -> R) -> R {
    if forked() {
        if let Some(pool) = child_pool() {
            return pool.in_place_scope(op);
        }
    }
    rayon::in_place_scope(op)
}

/// The number of threads a parallel section started here would use.
pub(crate) fn threads() -> usize {
    install(rayon::current_num_threads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loading_process_is_not_a_fork() {
        assert!(!forked());
        assert_eq!(install(|| 6 * 7), 42);
        assert!(threads() >= 1);
    }
}
