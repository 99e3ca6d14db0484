//! A tampering backend wrapper that corrupts conversion output, or the
//! fingerprint kernel's sums, on demand.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use rocm_safe::device::{
    raw::{Backend, CopyOp, DevicePtr, Driver, KernelOp, RawStream, Wrap},
    ConvertOp,
};
use rocm_safe::Result;

/// What [`Tamper`] does to conversion output.
pub mod mode {
    /// Nothing.
    pub const OFF: u8 = 0;
    /// Overwrites output element 1 (4 or 2 bytes) with 0x5a bytes after
    /// every conversion (fused included).
    pub const CORRUPT_OUTPUT: u8 = 1;
    /// Adds 1 to the accumulator after every fingerprint pass (a broken
    /// fingerprint kernel). A bit: may be combined with the others.
    pub const WRONG_FINGERPRINT: u8 = 2;
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
        if self.mode.load(Ordering::SeqCst) & mode::CORRUPT_OUTPUT != 0 && n > 1 {
            let size = op.to.size().unwrap_or(4);
            let junk = vec![0x5au8; size];
            // SAFETY: forwards the caller's guarantees to the wrapped backend.
            unsafe {
                let op = CopyOp::HtoD {
                    dst: dst.offset(size as u64),
                    src: junk.as_ptr(),
                };
                self.inner.copy(op, size, s)?;
                self.inner.stream_synchronize(s)?;
            }
        }
        Ok(())
    }

    /// # Safety
    /// `acc` is a live, exclusive `u64` on the wrapped backend.
    unsafe fn bump(&self, acc: DevicePtr, s: RawStream) -> Result<()> {
        if self.mode.load(Ordering::SeqCst) & mode::WRONG_FINGERPRINT == 0 {
            return Ok(());
        }
        let mut v = 0u64;
        // SAFETY: forwards the caller's guarantees to the wrapped backend;
        // `v` lives across both synchronous copies.
        unsafe {
            self.inner.stream_synchronize(s)?;
            let down = CopyOp::DtoH {
                dst: (&mut v as *mut u64).cast(),
                src: acc,
            };
            self.inner.copy(down, 8, s)?;
            self.inner.stream_synchronize(s)?;
            v = v.wrapping_add(1);
            let up = CopyOp::HtoD {
                dst: acc,
                src: (&v as *const u64).cast(),
            };
            self.inner.copy(up, 8, s)?;
            self.inner.stream_synchronize(s)
        }
    }
}

impl Wrap for Tamper {
    type Inner = dyn Backend;
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
}

// SAFETY: forwards every call to a correct backend.
unsafe impl Driver for Tamper {
    rocm_safe::forward_driver!(all);
}

// SAFETY: forwards to a correct backend; the only additions are a write
// inside the conversion's own output range and one to the fingerprint
// pass's own accumulator.
unsafe impl Backend for Tamper {
    rocm_safe::forward_backend!(
        caps,
        kernel_source,
        conv3d_weight_layout,
        conv3d_vendor_available,
        conv3d_vendor_backward_available
    );
    unsafe fn run(&self, op: &KernelOp<'_>, s: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend;
        // `after` writes inside the conversion's own output.
        unsafe {
            self.inner.run(op, s)?;
            match *op {
                KernelOp::Convert { op, dst, n, .. }
                | KernelOp::ConvertFingerprint { op, dst, n, .. } => self.after(op, dst, n, s),
                KernelOp::FingerprintSum { acc, .. } => self.bump(acc, s),
                _ => Ok(()),
            }
        }
    }
}
