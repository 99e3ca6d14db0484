//! Host memory that pins fast: 2 MiB-aligned anonymous mappings on
//! transparent huge pages, faulted in on the rayon pool, for the GPU
//! runtimes to register ([`Gpu`](crate::device::runtime::gpu::Gpu)'s `alloc_pinned`).
//!
//! Why: the runtimes' own pinned allocators (`cuMemHostAlloc`,
//! `hipHostMalloc`) fault, zero and lock every 4 KiB page on the calling
//! thread. Measured on the H100 host (BENCHMARKS.md, "Pinning
//! methods"): 128 MiB took 45-75 ms that way (1.8-3.0 GB/s), which was the
//! whole gap between a process's first load and its later ones. The same
//! 128 MiB mapped here (huge pages, touched on 8 threads) and registered
//! with `cuMemHostRegister` is usable in 10-11 ms, and the device reads it
//! as fast (50-54 GB/s). The loader pins its ring this way on a thread of
//! its own while its first load runs (`transfer/grow.rs`), so even those
//! 10 ms are off the load's path.
#![cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]

use crate::error::{Error, Result};

/// Allocations from this size up are mapped and registered; smaller ones
/// (accumulators, a few KiB) use the runtime's allocator, where a 2 MiB
/// mapping would waste memory.
pub(crate) const REGISTER_MIN: usize = 1 << 20;
/// A transparent huge page.
pub(crate) const HUGE_PAGE: usize = 2 << 20;
/// An anonymous private mapping, 2 MiB-aligned and a whole number of
/// 2 MiB pages long, every page faulted in (so zeroed) before it is
/// returned; unmapped when dropped.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is owned memory with no thread affinity; `Mapping`
// hands out only its address and length.
unsafe impl Send for Mapping {}
// SAFETY: as above: no method mutates through `&self`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// At least `bytes` (> 0) bytes, zeroed.
    ///
    /// Errors: [`Error::OutOfMemory`] when the kernel refuses the mapping
    /// (or `bytes` rounds past the address space).
    pub(crate) fn new(bytes: usize) -> Result<Mapping> {
        let oom = || Error::OutOfMemory {
            backend: "host",
            op: "mmap (pinned host memory)",
            bytes: bytes as u64,
        };
        let len = bytes
            .max(1)
            .checked_next_multiple_of(HUGE_PAGE)
            .ok_or_else(oom)?;
        let over = len.checked_add(HUGE_PAGE).ok_or_else(oom)?;
        // SAFETY: a fresh anonymous private mapping: no file, no fixed
        // address, so it aliases nothing of this process.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                over,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(oom());
        }
        // Trim to a 2 MiB boundary so every page of it can be a huge page.
        let start = raw as usize;
        let head = start.next_multiple_of(HUGE_PAGE) - start;
        let tail = over - head - len;
        // SAFETY: both ranges are inside the mapping just made and outside
        // the part kept; unmapping them cannot fail for a valid range (a
        // failure leaves them mapped, which only wastes address space).
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((start + head + len) as *mut libc::c_void, tail);
            }
        }
        let m = Mapping {
            ptr: (start + head) as *mut u8,
            len,
        };
        // A hint: where huge pages are off (or not built in) this fails and
        // the pages are 4 KiB, which works, only slower to pin.
        // SAFETY: the range is exactly the mapping kept.
        let _ = unsafe { libc::madvise(m.ptr.cast::<libc::c_void>(), m.len, libc::MADV_HUGEPAGE) };
        m.fault_in();
        Ok(m)
    }

    /// Writes one zero byte per 4 KiB page, 2 MiB per rayon task: the kernel
    /// allocates (and zeroes) the pages on the pool's threads at once
    /// instead of one page at a time inside the runtime's registration.
    fn fault_in(&self) {
        use rayon::prelude::*;
        let base = self.ptr as usize;
        crate::par::install(|| {
            (0..self.len / HUGE_PAGE).into_par_iter().for_each(|i| {
                for at in (i * HUGE_PAGE..(i + 1) * HUGE_PAGE).step_by(4096) {
                    // SAFETY: `at < self.len`, inside the mapping, which is
                    // writable and not yet shared; the tasks' ranges are
                    // disjoint. Volatile: the write exists for its page fault.
                    unsafe { std::ptr::write_volatile((base + at) as *mut u8, 0) };
                }
            })
        });
    }

    /// The first byte (2 MiB-aligned).
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// The mapped length (a multiple of 2 MiB).
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; nothing
        // borrows it (the owner unregistered it before dropping).
        let _ = unsafe { libc::munmap(self.ptr.cast::<libc::c_void>(), self.len) };
    }
}

/// Zeroes `bytes` fresh bytes at `p`, on the rayon pool in 4 MiB pieces
/// for large buffers (a runtime's pinned allocation of 32 MiB is zeroed in
/// about a millisecond rather than ten).
pub(crate) fn zero_parallel(p: *mut u8, bytes: usize) {
    use rayon::prelude::*;
    const PIECE: usize = 4 << 20;
    let base = p as usize;
    crate::par::install(|| {
        (0..bytes.div_ceil(PIECE)).into_par_iter().for_each(|i| {
            let at = i * PIECE;
            let len = PIECE.min(bytes - at);
            // SAFETY: `base..base + bytes` is a fresh allocation of `bytes`
            // bytes (the caller's), writable from the host and not shared yet;
            // the pieces are disjoint and inside it.
            unsafe { std::ptr::write_bytes((base + at) as *mut u8, 0, len) };
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_aligned_whole_huge_pages_and_zeroed() {
        for bytes in [
            1usize,
            4096,
            HUGE_PAGE - 1,
            HUGE_PAGE,
            HUGE_PAGE + 1,
            9 << 20,
        ] {
            let m = Mapping::new(bytes).unwrap();
            assert_eq!(m.ptr() as usize % HUGE_PAGE, 0, "{bytes}");
            assert!(
                m.len() >= bytes && m.len().is_multiple_of(HUGE_PAGE),
                "{bytes}"
            );
            assert!(m.len() < bytes + HUGE_PAGE, "{bytes}");
            // SAFETY: the mapping is `m.len()` readable bytes, ours alone.
            let s = unsafe { std::slice::from_raw_parts_mut(m.ptr(), m.len()) };
            assert!(s.iter().all(|&b| b == 0), "{bytes}");
            s.fill(0xA5);
            assert!(s.iter().all(|&b| b == 0xA5));
        }
    }

    #[test]
    fn a_size_past_the_address_space_is_out_of_memory() {
        for bytes in [usize::MAX, usize::MAX - HUGE_PAGE, 1usize << 62] {
            let e = Mapping::new(bytes).unwrap_err();
            assert!(matches!(e, Error::OutOfMemory { .. }), "{bytes}: {e:?}");
        }
    }

    #[test]
    fn zero_parallel_zeroes_every_piece() {
        let n = (9 << 20) + 5;
        let mut v = vec![7u8; n];
        zero_parallel(v.as_mut_ptr(), n);
        assert!(v.iter().all(|&b| b == 0));
    }
}
