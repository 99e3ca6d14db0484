//! The host backend: device memory is host memory (256-aligned, zeroed
//! allocations), streams run every operation at once, kernels are the CPU
//! implementations of `crate::convert` and `crate::conv3d` (the conv3d
//! kernels' emulation: `conv3d_emulation.rs`, `check_emulation.rs`).
//! Always available, so every pipeline also runs in CI.

use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use rayon::prelude::*;

use crate::conv3d::Conv3dGeometry;
use crate::convert::fingerprint::term;
use crate::device::info::{
    BackendKind, ConvertOp, DeviceInfo, DevicePtr, KernelCaps, KernelSource, RawEvent, RawStream,
};
use crate::device::raw::backend::{no_vendor, Backend, CopyOp, Driver, KernelOp};
use crate::device::raw::conv3d::{Conv3dKernel, Conv3dWeightLayout};
use crate::dtype::DType;
use crate::error::{Error, Result};

mod check_emulation;
mod conv3d_emulation;

use check_emulation::{
    host_conv3d_backward_check, host_conv3d_check, host_guard_check, host_guard_decide,
};
use conv3d_emulation::{
    host_conv3d, host_conv3d_backward, host_conv3d_backward_weight_tiled, host_conv3d_flip,
    host_conv3d_layout, host_conv3d_zero_insert, host_gate_closed,
};

const ALIGN: usize = 256;

/// The host backend.
#[derive(Debug)]
pub struct HostBackend {
    info: DeviceInfo,
    next: AtomicU64,
    events: Mutex<HashMap<u64, Option<Instant>>>,
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl HostBackend {
    /// A new host "device".
    pub fn new() -> HostBackend {
        HostBackend {
            info: DeviceInfo {
                kind: BackendKind::Host,
                ordinal: 0,
                name: "host".into(),
                arch: "host".into(),
                total_memory: 0,
                multiprocessors: u32::try_from(rayon::current_num_threads()).unwrap_or(1),
                visible: crate::device::VisibleDevices::none(),
            },
            next: AtomicU64::new(1),
            events: Mutex::new(HashMap::new()),
        }
    }

    fn layout(op: &'static str, bytes: usize) -> Result<Layout> {
        Layout::from_size_align(bytes, ALIGN).map_err(|_| Error::OutOfMemory {
            backend: "host",
            op,
            bytes: bytes as u64,
        })
    }

    fn raw_alloc(op: &'static str, bytes: usize) -> Result<*mut u8> {
        let layout = Self::layout(op, bytes)?;
        // "Device" memory here is host memory: more than RAM + swap can
        // never be backed. Refused up front, whatever the kernel's
        // overcommit policy (with `vm.overcommit_memory = 1` the allocation
        // would succeed and the first writes end the process).
        if bytes as u64 > crate::alloc::memory_limit() {
            return Err(Error::OutOfMemory {
                backend: "host",
                op,
                bytes: bytes as u64,
            });
        }
        // SAFETY: `bytes > 0` (the trait's contract), so the layout is not
        // zero-sized.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(Error::OutOfMemory {
                backend: "host",
                op,
                bytes: bytes as u64,
            });
        }
        Ok(p)
    }

    /// # Safety
    /// `p` came from `raw_alloc(_, bytes)` and is freed once.
    unsafe fn raw_free(op: &'static str, p: *mut u8, bytes: usize) -> Result<()> {
        let layout = Self::layout(op, bytes)?;
        // SAFETY: same pointer and layout as the allocation (caller).
        unsafe { std::alloc::dealloc(p, layout) };
        Ok(())
    }

    fn event_state(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Option<Instant>>> {
        match self.events.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }
}

/// Host-side fingerprint sum of `bytes` whose first byte is word `first_word`.
pub(crate) fn sum_bytes(first_word: u64, bytes: &[u8]) -> u64 {
    const CHUNK: usize = 1 << 20; // bytes per rayon task (a multiple of 4)
    let full = bytes.len() / 4 * 4;
    let (body, rest) = bytes.split_at(full);
    let mut s = crate::par::install(|| {
        body.par_chunks(CHUNK)
            .enumerate()
            .map(|(c, chunk)| {
                let base = first_word + (c * CHUNK / 4) as u64;
                chunk.chunks_exact(4).enumerate().fold(0u64, |acc, (k, w)| {
                    let w = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                    acc.wrapping_add(term(base + k as u64, w))
                })
            })
            .reduce(|| 0u64, u64::wrapping_add)
    });
    if !rest.is_empty() {
        let mut last = [0u8; 4];
        last[..rest.len()].copy_from_slice(rest);
        s = s.wrapping_add(term(
            first_word + (full / 4) as u64,
            u32::from_le_bytes(last),
        ));
    }
    s
}

/// # Safety
/// `p` points to `len` readable bytes that nothing writes meanwhile.
unsafe fn bytes<'a>(p: DevicePtr, len: u64) -> &'a [u8] {
    // SAFETY: guaranteed by the caller; host "device" addresses are host
    // addresses.
    unsafe { std::slice::from_raw_parts(p.0 as usize as *const u8, len as usize) }
}

/// # Safety
/// `p` points to `len` writable bytes that nothing else accesses meanwhile.
unsafe fn bytes_mut<'a>(p: DevicePtr, len: u64) -> &'a mut [u8] {
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(p.0 as usize as *mut u8, len as usize) }
}

/// # Safety
/// `p` is an 8-aligned u64 that nothing else accesses meanwhile.
unsafe fn add_u64(p: DevicePtr, v: u64) {
    let q = p.0 as usize as *mut u64;
    // SAFETY: guaranteed by the caller.
    unsafe { *q = (*q).wrapping_add(v) };
}

fn elem_size(t: DType) -> u64 {
    t.size().unwrap_or(1) as u64
}

// SAFETY: allocations come from the global allocator with the requested size
// and 256-byte alignment (Layout align 256), and every operation is the documented runtime
// call (or CPU routine) on exactly the ranges given.
unsafe impl Driver for HostBackend {
    fn info(&self) -> &DeviceInfo {
        &self.info
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        Ok(DevicePtr(Self::raw_alloc("alloc", bytes)? as usize as u64))
    }

    unsafe fn free(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the caller passes an allocation of ours with its size.
        unsafe { Self::raw_free("free", ptr.0 as usize as *mut u8, bytes) }
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        Self::raw_alloc("alloc_pinned", bytes)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: the caller passes an allocation of ours with its size.
        unsafe { Self::raw_free("free_pinned", ptr, bytes) }
    }

    fn stream_create(&self) -> Result<RawStream> {
        Ok(RawStream(self.next.fetch_add(1, Ordering::Relaxed)))
    }

    unsafe fn stream_destroy(&self, _s: RawStream) -> Result<()> {
        Ok(())
    }

    unsafe fn stream_synchronize(&self, _s: RawStream) -> Result<()> {
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn event_create(&self) -> Result<RawEvent> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.event_state().insert(id, None);
        Ok(RawEvent(id))
    }

    unsafe fn event_destroy(&self, e: RawEvent) -> Result<()> {
        self.event_state().remove(&e.0);
        Ok(())
    }

    unsafe fn event_record(&self, e: RawEvent, _s: RawStream) -> Result<()> {
        self.event_state().insert(e.0, Some(Instant::now()));
        Ok(())
    }

    unsafe fn event_synchronize(&self, _e: RawEvent) -> Result<()> {
        Ok(())
    }

    unsafe fn stream_wait_event(&self, _s: RawStream, _e: RawEvent) -> Result<()> {
        Ok(())
    }

    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        let st = self.event_state();
        match (st.get(&start.0), st.get(&end.0)) {
            (Some(Some(a)), Some(Some(b))) => {
                Ok(b.saturating_duration_since(*a).as_secs_f32() * 1e3)
            }
            _ => Err(Error::EventNotRecorded { op: "elapsed_ms" }),
        }
    }

    unsafe fn copy(&self, op: CopyOp, bytes: usize, _s: RawStream) -> Result<()> {
        let (dst, src) = match op {
            CopyOp::HtoD { dst, src } => (dst.0 as usize as *mut u8, src),
            CopyOp::DtoH { dst, src } => (dst, src.0 as usize as *const u8),
            CopyOp::DtoD { dst, src } => (dst.0 as usize as *mut u8, src.0 as usize as *const u8),
        };
        // SAFETY: the caller guarantees both ranges are valid for `bytes`
        // (host "device" addresses are host addresses).
        unsafe { std::ptr::copy(src, dst, bytes) };
        Ok(())
    }

    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, _s: RawStream) -> Result<()> {
        // SAFETY: the caller guarantees the range is valid for `bytes`.
        unsafe { std::ptr::write_bytes(dst.0 as usize as *mut u8, 0, bytes) };
        Ok(())
    }

    // ----- memory figures and versions (diagnostics) ---------------------
    /// The host's `MemAvailable` and `MemTotal` (`/proc/meminfo`): the host
    /// device's memory is host memory.
    fn mem_info(&self) -> Result<(u64, u64)> {
        host_mem_info("/proc/meminfo")
    }

    /// Refused: the host's "copies" are CPU reads, which a file truncated
    /// while mapped would turn into `SIGBUS` (a GPU's registration pins the
    /// pages instead). The loader's pinned ring serves.
    unsafe fn register_read_only(&self, _p: *const u8, _bytes: usize) -> Result<()> {
        Err(Error::BackendUnsupported {
            backend: "host",
            op: "register_read_only",
        })
    }

    unsafe fn unregister_read_only(&self, _p: *const u8) -> Result<()> {
        Err(Error::BackendUnsupported {
            backend: "host",
            op: "unregister_read_only",
        })
    }
}

// SAFETY: every kernel operation is the CPU implementation on exactly the
// ranges given (host "device" addresses are host addresses).
unsafe impl Backend for HostBackend {
    fn caps(&self) -> KernelCaps {
        KernelCaps::HOST
    }

    fn kernel_source(&self) -> Result<KernelSource> {
        Ok(KernelSource::Cpu)
    }

    unsafe fn run(&self, op: &KernelOp<'_>, _s: RawStream) -> Result<()> {
        match *op {
            // SAFETY: the caller guarantees `n` elements of each dtype at
            // `src` (read) and `dst` (written, exclusive).
            KernelOp::Convert { op, src, dst, n } => unsafe { host_convert(op, src, dst, n) },
            KernelOp::WidenCheck {
                op,
                src,
                dst,
                n,
                count,
            } => {
                // SAFETY: the caller guarantees `n` elements of each dtype
                // at `src` and `dst` (read) and an exclusive u64 at `count`.
                unsafe { add_u64(count, host_widen_check(op, src, dst, n)?) };
                Ok(())
            }
            KernelOp::FingerprintSum {
                src,
                bytes,
                first_word,
                acc,
            } => {
                // SAFETY: the caller guarantees `bytes` readable bytes at
                // `src` and an exclusive u64 at `acc`.
                unsafe { add_u64(acc, sum_bytes(first_word, self::bytes(src, bytes))) };
                Ok(())
            }
            KernelOp::ConvertFingerprint {
                op,
                src,
                dst,
                n,
                acc,
            } => {
                // SAFETY: as for the two ops above; the output is read back
                // only after the conversion wrote it.
                unsafe {
                    host_convert(op, src, dst, n)?;
                    let out = sum_bytes(0, bytes(dst, n * elem_size(op.to)));
                    add_u64(acc, out);
                }
                Ok(())
            }
            KernelOp::CountNonFinite {
                dtype,
                ptr,
                n,
                counts,
                gate,
            } => {
                // SAFETY: the caller's guarantees are `scan_nonfinite`'s
                // and a gate that is one live u64.
                unsafe {
                    if host_gate_closed(gate) {
                        return Ok(());
                    }
                    scan_nonfinite(dtype, ptr, n, false, counts)
                }
            }
            KernelOp::ClampNonFinite {
                dtype,
                ptr,
                n,
                counts,
            } => {
                // SAFETY: the caller's guarantees are `scan_nonfinite`'s.
                unsafe { scan_nonfinite(dtype, ptr, n, true, counts) }
            }
            // SAFETY: the caller's guarantees are host_conv3d's.
            KernelOp::Conv3d { kernel, args } => unsafe { host_conv3d(kernel, args) },
            KernelOp::Conv3dVendor { .. } | KernelOp::Conv3dBackwardVendor { .. } => {
                Err(no_vendor(BackendKind::Host))
            }
            // SAFETY: the caller's guarantees are host_conv3d_check's.
            KernelOp::Conv3dCheck { args } => unsafe { host_conv3d_check(args) },
            // SAFETY: the caller's guarantees are host_conv3d_layout's.
            KernelOp::Conv3dLayout { args } => unsafe { host_conv3d_layout(args) },
            // SAFETY: the caller's guarantees are host_conv3d_backward's.
            KernelOp::Conv3dBackward { args } => unsafe { host_conv3d_backward(args) },
            // SAFETY: the caller's guarantees are host_guard_decide's.
            KernelOp::Conv3dGuardDecide { args } => unsafe { host_guard_decide(args) },
            // SAFETY: the caller's guarantees are host_guard_check's.
            KernelOp::Conv3dGuardCheck { args } => unsafe { host_guard_check(args) },
            // SAFETY: the caller's guarantees are host_conv3d_backward_check's.
            KernelOp::Conv3dBackwardCheck { args } => unsafe { host_conv3d_backward_check(args) },
            // SAFETY: the caller's guarantees are
            // host_conv3d_backward_weight_tiled's.
            KernelOp::Conv3dBackwardWeightTiled { args } => unsafe {
                host_conv3d_backward_weight_tiled(args)
            },
            // SAFETY: the caller's guarantees are host_conv3d_flip's.
            KernelOp::Conv3dFlipWeight { args } => unsafe { host_conv3d_flip(args) },
            // SAFETY: the caller's guarantees are host_conv3d_zero_insert's.
            KernelOp::Conv3dZeroInsert { args } => unsafe { host_conv3d_zero_insert(args) },
        }
    }

    fn conv3d_weight_layout(
        &self,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &Conv3dGeometry,
    ) -> Conv3dWeightLayout {
        Conv3dWeightLayout::choose(self.caps(), kernel, dtype, g)
    }

    fn conv3d_vendor_available(&self) -> Result<()> {
        Err(no_vendor(BackendKind::Host))
    }

    fn conv3d_vendor_backward_available(&self) -> Result<()> {
        Err(no_vendor(BackendKind::Host))
    }
}

/// Converts `n` elements `op.from` at `src` into `op.to` at `dst`.
///
/// # Safety
/// `n` elements of each dtype are valid at `src` (read) and `dst` (written,
/// exclusive).
unsafe fn host_convert(op: ConvertOp, src: DevicePtr, dst: DevicePtr, n: u64) -> Result<()> {
    // SAFETY: the caller's guarantees.
    let (s, d) = unsafe {
        (
            bytes(src, n * elem_size(op.from)),
            bytes_mut(dst, n * elem_size(op.to)),
        )
    };
    crate::convert::convert_bytes(op.from, s, op.to, d)
}

/// The elements of the f32 output at `dst` that differ from the scalar
/// reference's widening of `src` (the CPU side of `widen_check_*`).
///
/// # Safety
/// `src` holds `n` elements of `op.from`, `dst` `n` f32.
unsafe fn host_widen_check(op: ConvertOp, src: DevicePtr, dst: DevicePtr, n: u64) -> Result<u64> {
    let row = match crate::convert::table::find(op.from, op.to) {
        Some(r) if op.widen_check_available() => r,
        _ => {
            return Err(Error::UnsupportedConversion {
                op: "widen_check",
                from: op.from,
                to: op.to,
                tensor: None,
            })
        }
    };
    let ss = elem_size(op.from);
    // SAFETY: the caller's guarantees.
    let (s, d) = unsafe { (bytes(src, n * ss), bytes(dst, n * 4)) };
    let mut bad = 0u64;
    for (e, w) in s.chunks_exact(ss as usize).zip(d.chunks_exact(4)) {
        let mut b = [0u8; 8];
        b[..e.len()].copy_from_slice(e);
        let want = (row.scalar)(u64::from_le_bytes(b)) as u32;
        let got = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        bad += u64::from(want != got);
    }
    Ok(bad)
}

/// NaN and Inf among `n` elements of `dtype` at `ptr`, added to the two
/// `u64` at `counts`; with `clamp`, NaN becomes 0 and +-Inf +-max finite.
///
/// # Safety
/// `ptr` holds `n` elements of `dtype`, exclusively the caller's when
/// `clamp`; `counts` is two aligned, exclusive `u64`s.
unsafe fn scan_nonfinite(
    dtype: DType,
    ptr: DevicePtr,
    n: u64,
    clamp: bool,
    counts: DevicePtr,
) -> Result<()> {
    // (exponent mask, mantissa mask, max finite, sign, size)
    let (em, mm, maxf, sign, size): (u32, u32, u32, u32, u64) = match dtype {
        DType::F32 => (0x7f80_0000, 0x007f_ffff, 0x7f7f_ffff, 0x8000_0000, 4),
        DType::BF16 => (0x7f80, 0x007f, 0x7f7f, 0x8000, 2),
        DType::F16 => (0x7c00, 0x03ff, 0x7bff, 0x8000, 2),
        other => {
            return Err(Error::UnsupportedConversion {
                op: "nonfinite",
                from: other,
                to: other,
                tensor: None,
            })
        }
    };
    // SAFETY: the caller guarantees `n` exclusive elements at `ptr`.
    let buf = unsafe { bytes_mut(ptr, n * size) };
    let (mut nan, mut inf) = (0u64, 0u64);
    for e in buf.chunks_exact_mut(size as usize) {
        let x = if size == 4 {
            u32::from_le_bytes([e[0], e[1], e[2], e[3]])
        } else {
            u32::from(u16::from_le_bytes([e[0], e[1]]))
        };
        if x & em != em {
            continue;
        }
        let y = if x & mm != 0 {
            nan += 1;
            0
        } else {
            inf += 1;
            (x & sign) | maxf
        };
        if clamp {
            e.copy_from_slice(&y.to_le_bytes()[..size as usize]);
        }
    }
    // SAFETY: the caller guarantees two exclusive u64s at `counts`.
    unsafe {
        add_u64(counts, nan);
        add_u64(counts.offset(8), inf);
    }
    Ok(())
}

/// Parses a `/proc/meminfo` field given in kB into bytes.
pub(crate) fn meminfo_field(meminfo: &str, key: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// `(MemAvailable, MemTotal)` in bytes from a `/proc/meminfo`-format file;
/// [`Error::BackendUnsupported`] when it cannot be read or lacks a field.
fn host_mem_info(path: &str) -> Result<(u64, u64)> {
    let unsupported = Error::BackendUnsupported {
        backend: "host",
        op: "mem_info (/proc/meminfo unreadable)",
    };
    let Ok(text) = std::fs::read_to_string(path) else {
        return Err(unsupported);
    };
    match (
        meminfo_field(&text, "MemAvailable:"),
        meminfo_field(&text, "MemTotal:"),
    ) {
        (Some(free), Some(total)) => Ok((free, total)),
        _ => Err(unsupported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_info_reads_meminfo_or_says_unsupported() {
        let d = tempfile::tempdir().unwrap();
        let good = d.path().join("good");
        std::fs::write(
            &good,
            "MemTotal: 2048 kB\nMemFree: 1 kB\nMemAvailable: 1024 kB\n",
        )
        .unwrap();
        assert_eq!(
            host_mem_info(good.to_str().unwrap()).unwrap(),
            (1024 * 1024, 2048 * 1024)
        );
        let partial = d.path().join("partial");
        std::fs::write(&partial, "MemTotal: 2048 kB\n").unwrap();
        for p in [partial, d.path().join("missing")] {
            let e = host_mem_info(p.to_str().unwrap()).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::BackendUnsupported {
                        backend: "host",
                        ..
                    }
                ),
                "{e}"
            );
        }
        if cfg!(target_os = "linux") {
            let (free, total) = HostBackend::new().mem_info().unwrap();
            assert!(total > 0 && free <= total, "{free} {total}");
        }
    }
}
