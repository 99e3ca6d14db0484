//! Vendor libraries loaded at run time: the convolution libraries (MIOpen
//! on HIP, cuDNN on CUDA) with the [`VendorConv`] interface each binds, the
//! buffers kept between calls and the vendor calls both GPU runtimes make
//! ([`vendor_conv3d`], and for the data and weight gradients
//! `vendor_backward::vendor_conv3d_backward`); and NVRTC, CUDA's run-time compiler
//! (`nvrtc.rs`).
//!
//! Each library is bound here, function by function, with the C signatures
//! of its header (quoted in its file's docs), statuses as plain integers,
//! and opened through [`dynlib`](crate::device::dynlib): a copy already in the
//! process first, so that inside a PyTorch process the crate uses
//! PyTorch's cuDNN, NVRTC and MIOpen and never maps a second copy beside
//! them. Nothing here is ever unloaded.
#![cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]

#[cfg(any(feature = "cuda", test))]
pub(crate) mod cudnn;
pub(crate) mod libs;
#[cfg(any(feature = "hip", test))]
pub(crate) mod miopen;
#[cfg(any(feature = "cuda", test))]
pub(crate) mod nvrtc;
pub(crate) mod vendor_backward;

use crate::device::info::{DevicePtr, RawStream};
use crate::device::kernels::KernelCall;
use crate::device::raw::backend::Driver;
use crate::device::raw::conv3d::{Conv3dBackwardLaunch, Conv3dLaunch};
use crate::dtype::DType;
use crate::error::Result;

/// A vendor convolution library bound by a backend (MIOpen, cuDNN): plans
/// per (geometry, dtype) and a forward call writing the input's dtype;
/// plans per (backward op, geometry) and the data and weight gradients in
/// f32 (operands, result and accumulation).
pub(crate) trait VendorConv {
    /// The workspace bytes `a` needs (sets up its plan on first use).
    fn workspace(&mut self, a: &Conv3dLaunch) -> Result<usize>;
    /// Queues the convolution of `a` into `y` (of `a.dtype`) on `stream`.
    ///
    /// # Safety
    /// `a`'s input and weight are live device ranges of their shapes, `y`
    /// holds the output in `a.dtype` and is not accessed otherwise until
    /// the stream reaches the call, `workspace` holds at least
    /// `self.workspace(a)` bytes (unused when that is 0), `stream` is live.
    unsafe fn forward(
        &mut self,
        a: &Conv3dLaunch,
        stream: RawStream,
        y: DevicePtr,
        workspace: DevicePtr,
    ) -> Result<()>;
    /// The device buffers kept between calls ([`vendor_conv3d`]).
    fn buffers(&mut self) -> &mut VendorBuffers;
    /// The workspace bytes the f32 gradient `op` (Data or Weight) of the
    /// forward convolution `g` needs (sets up its plan on first use).
    fn backward_workspace(
        &mut self,
        op: crate::conv3d::Conv3dBackwardOp,
        g: &crate::conv3d::Conv3dGeometry,
    ) -> Result<usize>;
    /// Queues the gradient `a` (Data or Weight, every operand f32: `a.dtype`
    /// is F32; no bias) into `a.output` on `stream`.
    ///
    /// # Safety
    /// `a`'s operands are live device ranges of f32 of their shapes,
    /// `a.output` holds the f32 result and is not accessed otherwise until
    /// the stream reaches the call, `workspace` holds at least
    /// `self.backward_workspace(a.op, &a.geometry)` bytes (unused when that
    /// is 0), `stream` is live.
    unsafe fn backward(
        &mut self,
        a: &Conv3dBackwardLaunch,
        stream: RawStream,
        workspace: DevicePtr,
    ) -> Result<()>;
}

/// Largest buffer the vendor tier keeps between calls: smaller scratch
/// outputs and workspaces are reused by the next call instead of being
/// allocated and freed around each one; larger ones (a video VAE's
/// full-resolution layers) are freed at once so the device memory goes
/// back to the caller.
pub(crate) const VENDOR_KEEP_MAX: usize = 256 << 20;

/// A kept device buffer: its pointer and byte count.
type Kept = Option<(DevicePtr, usize)>;

/// The vendor tier's bf16 scratch output, library workspace and (backward
/// ops of bf16 operands) the two operands widened to f32, kept between
/// calls when at most [`VENDOR_KEEP_MAX`] bytes each. Owned by the library
/// state of one device; the backend frees them ([`VendorBuffers::release`])
/// before it drops that state.
#[derive(Debug, Default)]
pub(crate) struct VendorBuffers {
    scratch: Kept,
    workspace: Kept,
    widened: [Kept; 2],
}

impl VendorBuffers {
    /// Frees the kept buffers.
    ///
    /// # Safety
    /// They belong to `backend`'s device and no queued work uses them (every
    /// vendor call waits for its stream before it returns).
    pub(crate) unsafe fn release(&mut self, backend: &dyn Driver) -> Result<()> {
        let [c, d] = &mut self.widened;
        let mut result = Ok(());
        for slot in [&mut self.scratch, &mut self.workspace, c, d] {
            // SAFETY: the caller's guarantees.
            let r = unsafe { free_kept(backend, slot.take()) };
            result = result.and(r);
        }
        result
    }
}

/// After a vendor call queued on `s` with the buffers `taken` (each with the
/// slot it goes back to): waits for `s`, then keeps each buffer in its slot
/// (at most [`VENDOR_KEEP_MAX`] bytes) or frees it, and returns the call's
/// result `run` first, then any error of the wait or of a free. When the
/// wait fails the buffers are leaked, never freed or reused under a kernel
/// that may still run.
///
/// # Safety
/// Every taken buffer was allocated on `backend` with its byte count and is
/// used by no work but what was queued on `s`, which is live.
unsafe fn settle(
    backend: &dyn Driver,
    s: RawStream,
    taken: [(&mut Kept, Kept); 4],
    run: Result<()>,
) -> Result<()> {
    // SAFETY: `s` is live (caller).
    let synced = unsafe { backend.stream_synchronize(s) };
    if synced.is_err() {
        // Possibly still in use: leaked, neither freed nor kept.
        run?;
        return synced;
    }
    let mut kept = Ok(());
    for (slot, b) in taken {
        let r = match b {
            Some((p, n)) if n <= VENDOR_KEEP_MAX => {
                *slot = Some((p, n));
                Ok(())
            }
            // SAFETY: allocated on `backend` with `n` bytes; the stream
            // that used it is idle.
            other => unsafe { free_kept(backend, other) },
        };
        kept = kept.and(r);
    }
    run?;
    kept
}

/// # Safety
/// `kept` (when some) was allocated on `backend` with its byte count and
/// nothing queued uses it.
unsafe fn free_kept(backend: &dyn Driver, kept: Kept) -> Result<()> {
    match kept {
        // SAFETY: the caller's guarantees.
        Some((p, n)) => unsafe { backend.free(p, n) },
        None => Ok(()),
    }
}

/// A buffer of at least `bytes` (none for 0): the kept one when it is large
/// enough, else a new allocation (the kept one freed first, so both never
/// hold device memory at once). Returns the pointer and its byte count.
///
/// # Safety
/// As [`free_kept`] for `slot`'s buffer.
unsafe fn take_buffer(backend: &dyn Driver, slot: &mut Kept, bytes: usize) -> Result<Kept> {
    if bytes == 0 {
        return Ok(None);
    }
    match slot.take() {
        Some((p, n)) if n >= bytes => Ok(Some((p, n))),
        old => {
            // SAFETY: the caller's guarantees.
            unsafe { free_kept(backend, old) }?;
            Ok(Some((backend.alloc(bytes)?, bytes)))
        }
    }
}

/// The vendor call both GPU backends make: for bf16 a bf16 scratch output
/// (the libraries write the input's dtype), the workspace, the library's
/// forward, the epilogue kernel (`conv3d_widen_bias_bf16` for bf16, else
/// `conv3d_bias_f32` when there is a bias) through `launch`, then a wait
/// for `s`. The scratch and workspace are the library state's kept buffers
/// ([`VendorBuffers`]) when large enough; after the wait they are kept for
/// the next call (at most [`VENDOR_KEEP_MAX`] bytes each) or freed. When
/// the wait fails they are leaked, never freed or reused under a kernel
/// that may still run.
///
/// # Safety
/// As [`crate::device::raw::Backend::conv3d_vendor`] for `a` and `s` on `backend`;
/// `launch` queues a kernel call on `s` of `backend`, and `lib` belongs to
/// `backend`'s device, which is current.
pub(crate) unsafe fn vendor_conv3d(
    backend: &dyn Driver,
    lib: &mut dyn VendorConv,
    a: &Conv3dLaunch,
    s: RawStream,
    launch: &dyn Fn(KernelCall) -> Result<()>,
) -> Result<()> {
    let mps = backend.info().multiprocessors;
    let ws_bytes = lib.workspace(a)?;
    let scratch_bytes = match a.dtype {
        DType::BF16 => a.geometry.output_len() * 2,
        _ => 0,
    };
    let bufs = lib.buffers();
    // SAFETY: the kept buffers are this device's and idle (every call
    // waits for its stream before returning).
    let scratch = unsafe { take_buffer(backend, &mut bufs.scratch, scratch_bytes) }?;
    // SAFETY: as above.
    let ws = match unsafe { take_buffer(backend, &mut bufs.workspace, ws_bytes) } {
        Ok(w) => w,
        Err(e) => {
            // SAFETY: `scratch` came from `take_buffer` and nothing was
            // queued on it yet.
            let _ = unsafe { free_kept(backend, scratch) };
            return Err(e);
        }
    };
    let run = (|| {
        let y = scratch.map_or(a.output, |(p, _)| p);
        // SAFETY: input and weight are the caller's live ranges; `y` is the
        // caller's f32 output or a bf16 scratch of at least the output's
        // length; the workspace has at least the size the library asked
        // for; `s` is live.
        unsafe { lib.forward(a, s, y, ws.map_or(DevicePtr(0), |(p, _)| p)) }?;
        match (scratch, a.bias) {
            (Some((src, _)), _) => launch(KernelCall::conv3d_widen_bias(a, src, mps)),
            (None, Some(b)) => launch(KernelCall::conv3d_bias(a, b, mps)),
            (None, None) => Ok(()),
        }
    })();
    let bufs = lib.buffers();
    let [c, d] = &mut bufs.widened;
    let taken = [
        (&mut bufs.scratch, scratch),
        (&mut bufs.workspace, ws),
        (c, None),
        (d, None),
    ];
    // SAFETY: the buffers were taken above for this device and used only
    // by the work queued on `s`, which is live (caller).
    unsafe { settle(backend, s, taken, run) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_buffers_are_reused_when_large_enough_and_replaced_otherwise() {
        let b = crate::device::runtime::host::HostBackend::new();
        let mut kept = VendorBuffers::default();
        // SAFETY: host "device" memory of `b`, used by no queued work.
        let none = unsafe { take_buffer(&b, &mut kept.scratch, 0) }.unwrap();
        assert!(none.is_none());
        // SAFETY: host "device" memory of `b`, used by no queued work.
        let first = unsafe { take_buffer(&b, &mut kept.scratch, 1000) }
            .unwrap()
            .unwrap();
        assert_eq!(first.1, 1000);
        assert!(kept.scratch.is_none(), "taken, not kept, while in use");
        kept.scratch = Some(first);
        // Smaller: the same buffer.
        // SAFETY: host "device" memory of `b`, used by no queued work.
        let again = unsafe { take_buffer(&b, &mut kept.scratch, 600) }
            .unwrap()
            .unwrap();
        assert_eq!(again, first);
        kept.scratch = Some(again);
        // Larger: a new buffer of the new size (the old one freed first).
        // SAFETY: host "device" memory of `b`, used by no queued work.
        let bigger = unsafe { take_buffer(&b, &mut kept.scratch, 5000) }
            .unwrap()
            .unwrap();
        assert_eq!(bigger.1, 5000);
        assert!(kept.scratch.is_none());
        kept.scratch = Some(bigger);
        kept.workspace = Some((
            crate::device::raw::backend::Driver::alloc(&b, 64).unwrap(),
            64,
        ));
        // SAFETY: host "device" memory of `b`, used by no queued work.
        unsafe { kept.release(&b) }.unwrap();
        assert!(kept.scratch.is_none() && kept.workspace.is_none());
    }
}
