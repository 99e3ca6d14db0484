//! A tampering backend wrapper that corrupts conversion output on demand.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use rocm_safe::device::{Backend, ConvertOp, CopyOp, DevicePtr, Driver, KernelOp, RawStream, Wrap};
use rocm_safe::Result;

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

// SAFETY: forwards to a correct backend; the only addition is a write
// inside the conversion's own output range.
unsafe impl Backend for Tamper {
    rocm_safe::forward_backend!(
        caps,
        kernel_source,
        conv3d_weight_layout,
        conv3d_vendor_available
    );
    unsafe fn run(&self, op: &KernelOp<'_>, s: RawStream) -> Result<()> {
        // SAFETY: forwards the caller's guarantees to the wrapped backend;
        // `after` writes inside the conversion's own output.
        unsafe {
            self.inner.run(op, s)?;
            match *op {
                KernelOp::Convert { op, dst, n, .. }
                | KernelOp::ConvertFingerprint { op, dst, n, .. } => self.after(op, dst, n, s),
                _ => Ok(()),
            }
        }
    }
}
