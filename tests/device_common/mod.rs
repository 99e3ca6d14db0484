//! Shared helpers for the device tests: the per-backend test macro and a
//! tampering backend wrapper that corrupts conversion output on demand.
#![allow(dead_code)]

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use rocm_safe::device::{Backend, ConvertOp, DeviceInfo, DevicePtr, RawEvent, RawStream};
use rocm_safe::{DType, Result};

/// Makes `host::NAME` (always run), `cuda::NAME` and `hip::NAME` (feature
/// builds, `#[ignore = "needs a GPU"]`) from `fn NAME(dev: &Device)`.
#[macro_export]
macro_rules! device_tests {
    ($($name:ident),* $(,)?) => {
        mod host {
            $(#[test] fn $name() { super::$name(&rocm_safe::device::Device::host()) })*
        }
        #[cfg(feature = "cuda")]
        mod cuda {
            $(#[test] #[ignore = "needs a GPU"] fn $name() {
                let d = rocm_safe::device::Device::open(rocm_safe::device::BackendKind::Cuda, 0)
                    .expect("open cuda:0");
                super::$name(&d)
            })*
        }
        #[cfg(feature = "hip")]
        mod hip {
            $(#[test] #[ignore = "needs a GPU"] fn $name() {
                let d = rocm_safe::device::Device::open(rocm_safe::device::BackendKind::Hip, 0)
                    .expect("open hip:0");
                super::$name(&d)
            })*
        }
    };
}

/// What [`Tamper`] does to conversion output.
pub mod mode {
    /// Nothing.
    pub const OFF: u8 = 0;
    /// Overwrites output element 1 (4 or 2 bytes) with 0x5a bytes after
    /// every conversion (fused included).
    pub const CORRUPT_OUTPUT: u8 = 1;
}

/// A backend that delegates to another and, when armed, corrupts the output
/// of conversions after the kernel wrote it (a stand-in for memory that went
/// bad between the kernel and the check).
#[derive(Debug)]
pub struct Tamper {
    pub inner: Box<dyn Backend>,
    pub mode: Arc<AtomicU8>,
}

impl Tamper {
    /// # Safety
    /// `dst` holds `n` live elements of `op.to` on the wrapped backend.
    unsafe fn after(&self, op: ConvertOp, dst: DevicePtr, n: u64, s: RawStream) -> Result<()> {
        if self.mode.load(Ordering::SeqCst) == mode::CORRUPT_OUTPUT && n > 1 {
            let size = op.to.size().unwrap_or(4);
            let junk = vec![0x5au8; size];
            // SAFETY: forwards the caller's guarantees to the wrapped backend.
            unsafe {
                self.inner
                    .copy_htod(dst.offset(size as u64), junk.as_ptr(), size, s)?;
                self.inner.stream_synchronize(s)?;
            }
        }
        Ok(())
    }
}

// SAFETY: forwards to a correct backend; the only addition is a write
// inside the conversion's own output range.
unsafe impl Backend for Tamper {
    fn info(&self) -> &DeviceInfo {
        self.inner.info()
    }
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.inner.alloc(bytes)
    }
    unsafe fn free(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.free(ptr, bytes) }
    }
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.inner.alloc_pinned(bytes)
    }
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.free_pinned(ptr, bytes) }
    }
    fn stream_create(&self) -> Result<RawStream> {
        self.inner.stream_create()
    }
    unsafe fn stream_destroy(&self, s: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.stream_destroy(s) }
    }
    unsafe fn stream_synchronize(&self, s: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.stream_synchronize(s) }
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn event_create(&self) -> Result<RawEvent> {
        self.inner.event_create()
    }
    unsafe fn event_destroy(&self, e: RawEvent) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.event_destroy(e) }
    }
    unsafe fn event_record(&self, e: RawEvent, s: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.event_record(e, s) }
    }
    unsafe fn event_synchronize(&self, e: RawEvent) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.event_synchronize(e) }
    }
    unsafe fn stream_wait_event(&self, s: RawStream, e: RawEvent) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.stream_wait_event(s, e) }
    }
    unsafe fn event_elapsed_ms(&self, a: RawEvent, b: RawEvent) -> Result<f32> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.event_elapsed_ms(a, b) }
    }
    unsafe fn copy_htod(&self, d: DevicePtr, s: *const u8, n: usize, st: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.copy_htod(d, s, n, st) }
    }
    unsafe fn copy_dtoh(&self, d: *mut u8, s: DevicePtr, n: usize, st: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.copy_dtoh(d, s, n, st) }
    }
    unsafe fn copy_dtod(&self, d: DevicePtr, s: DevicePtr, n: usize, st: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.copy_dtod(d, s, n, st) }
    }
    unsafe fn memset_zero(&self, d: DevicePtr, n: usize, st: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.memset_zero(d, n, st) }
    }
    unsafe fn convert(
        &self,
        op: ConvertOp,
        src: DevicePtr,
        dst: DevicePtr,
        n: u64,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe {
            self.inner.convert(op, src, dst, n, s)?;
            self.after(op, dst, n, s)
        }
    }
    unsafe fn fingerprint_sum(
        &self,
        src: DevicePtr,
        bytes: u64,
        first_word: u64,
        acc: DevicePtr,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.fingerprint_sum(src, bytes, first_word, acc, s) }
    }
    unsafe fn convert_fingerprint(
        &self,
        op: ConvertOp,
        src: DevicePtr,
        dst: DevicePtr,
        n: u64,
        acc: DevicePtr,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe {
            self.inner.convert_fingerprint(op, src, dst, n, acc, s)?;
            self.after(op, dst, n, s)
        }
    }
    unsafe fn nonfinite(
        &self,
        dtype: DType,
        ptr: DevicePtr,
        n: u64,
        clamp: bool,
        counts: DevicePtr,
        s: RawStream,
    ) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend.
        unsafe { self.inner.nonfinite(dtype, ptr, n, clamp, counts, s) }
    }
}

/// A small deterministic generator (splitmix64) for test data.
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn u32s(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.next_u64() as u32).collect()
    }
    pub fn u16s(&mut self, n: usize) -> Vec<u16> {
        (0..n).map(|_| self.next_u64() as u16).collect()
    }
}
