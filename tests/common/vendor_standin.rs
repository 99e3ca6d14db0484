//! A stand-in vendor library over any backend, so that the vendor tier's
//! backward path (the chain's support, run, checks and fault handling)
//! runs in CI on the host backend: [`VendorStandin`] declares the vendor
//! backward calls available and serves
//! [`KernelOp::Conv3dBackwardVendor`] with the wrapped backend's own
//! backward kernels (the host backend's: the CPU code), refusing what the
//! real libraries refuse (the bias gradient). Everything else is
//! forwarded; the forward vendor call stays the wrapped backend's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rocm_safe::conv3d_chain::{Conv3dReport, TierKind};
use rocm_safe::device::{
    raw::{Backend, Driver, KernelOp, RawStream, Wrap},
    BackendKind, KernelCaps,
};
use rocm_safe::fallback::Failure;
use rocm_safe::{Error, Result};

/// The library name the stand-in declares (the vendor tier's name).
pub const STANDIN: &str = "standin";

/// See the module docs.
pub struct VendorStandin {
    inner: Box<dyn Backend>,
    /// Vendor backward calls served.
    pub calls: Arc<AtomicUsize>,
}

impl std::fmt::Debug for VendorStandin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VendorStandin").finish_non_exhaustive()
    }
}

impl VendorStandin {
    pub fn new(inner: Box<dyn Backend>) -> VendorStandin {
        VendorStandin {
            inner,
            calls: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// `open()`'s backend where its vendor library has backward calls (a GPU
/// with cuDNN or MIOpen: required there, the test panics saying why not),
/// else (the host backend) that backend under the stand-in; and the vendor
/// tier's name to expect.
pub fn with_vendor_backward(open: &dyn Fn() -> Box<dyn Backend>) -> (Box<dyn Backend>, String) {
    let b = open();
    match b.conv3d_vendor_backward_available() {
        Ok(()) => {
            let name = b.caps().vendor_library.unwrap_or("vendor").to_owned();
            (b, name)
        }
        Err(e) if b.info().kind != BackendKind::Host => {
            panic!("the vendor library's backward calls are not available on this GPU: {e}")
        }
        Err(_) => (Box::new(VendorStandin::new(b)), STANDIN.to_owned()),
    }
}

impl Wrap for VendorStandin {
    type Inner = dyn Backend;
    fn inner(&self) -> &dyn Backend {
        &*self.inner
    }
}

// SAFETY: forwards every call to a correct backend.
unsafe impl Driver for VendorStandin {
    rocm_safe::forward_driver!(all);
}

// SAFETY: forwards to a correct backend; the vendor backward call is the
// wrapped backend's backward kernel over the same ranges.
unsafe impl Backend for VendorStandin {
    rocm_safe::forward_backend!(kernel_source, conv3d_weight_layout, conv3d_vendor_available);

    fn caps(&self) -> KernelCaps {
        let mut caps = self.inner.caps();
        caps.vendor_library = Some(STANDIN);
        caps
    }

    fn conv3d_vendor_backward_available(&self) -> Result<()> {
        Ok(())
    }

    unsafe fn run(&self, op: &KernelOp<'_>, s: RawStream) -> Result<()> {
        match *op {
            KernelOp::Conv3dBackwardVendor { args } => {
                if args.op == rocm_safe::conv3d::Conv3dBackwardOp::Bias {
                    return Err(Error::Conv3dTier {
                        tier: "vendor",
                        reason: "the bias gradient is not a vendor call",
                    });
                }
                self.calls.fetch_add(1, Ordering::Relaxed);
                // SAFETY: the caller's guarantees, forwarded: the same
                // ranges, computed by the wrapped backend's kernel.
                unsafe { self.inner.run(&KernelOp::Conv3dBackward { args }, s) }
            }
            // SAFETY: the caller's guarantees, forwarded unchanged.
            _ => unsafe { self.inner.run(op, s) },
        }
    }
}

/// What one call's report says of the vendor tier (named `name`): `true`
/// when it served (and nothing failed before), `false` when the library
/// refused the call (a typed library error: cuDNN's or MIOpen's status, or
/// a refusal before the call) and a later GPU tier (tiled or naive) served
/// instead, which is printed. Anything else panics: a wrong or non-finite vendor result, a
/// fault, another tier serving.
pub fn vendor_served(what: &str, report: &Conv3dReport, name: &str) -> bool {
    let failures: Vec<_> = report.failures().collect();
    match (report.served_by(), &failures[..]) {
        (Some(TierKind::Vendor), []) => {
            assert_eq!(report.served().map(|a| a.name.as_str()), Some(name));
            true
        }
        (
            Some(by @ (TierKind::Tiled | TierKind::Naive)),
            [(a, Failure::Error(e @ (Error::Conv3dCudnn { .. } | Error::Conv3dMiopen { .. })))],
        ) if a.kind == TierKind::Vendor && name != STANDIN => {
            eprintln!("{what}: the library refused the call ({e}); the {by:?} tier served");
            false
        }
        _ => panic!("{what}: {report}"),
    }
}
