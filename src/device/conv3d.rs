//! Conv3d on a device: the launch description the backends take
//! ([`Conv3dLaunch`]), which GPU kernel ([`Conv3dKernel`]), the safe entry
//! points [`Stream::conv3d`] and [`Stream::conv3d_vendor`], the weight
//! layout the tiled kernel reads ([`tiled_weight_layout`]), and the host
//! backend's emulation of the kernels.
//!
//! Every backend computes the same thing: input `[N, C, D, H, W]` and weight
//! `[K, C/G, KD, KH, KW]` in f32 or bf16 (widened exactly), an optional f32
//! bias `[K]`, an f32 output `[N, K, OD, OH, OW]`, f32 accumulation.

use std::borrow::Cow;

#[cfg(any(feature = "hip", feature = "cuda"))]
use super::RawStream;
use super::{DevicePtr, DeviceView, DeviceViewMut, Stream};
use crate::conv3d::{
    conv3d_cpu, conv3d_cpu_with, Conv3dData, Conv3dGeometry, Conv3dProblem, CpuKernel,
};
use crate::convert::Element;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Which GPU conv3d kernel of `hip-kernels/conv3d.hip` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Conv3dKernel {
    /// `conv3d_tiled_{f32,bf16}`: implicit GEMM on 128 x 128 output tiles.
    /// Its weight is in [`tiled_weight_layout`] (transposed per group).
    Tiled,
    /// `conv3d_naive_{f32,bf16}`: one thread per output point. A 256-thread
    /// block stages the input region and the weights its outputs read
    /// (4 output channels x 2 rows x 32 columns on large layers) in shared
    /// memory, a slice of input channels at a time; where a region does not
    /// fit (large strides or dilations) each thread reads global memory
    /// directly. Its weight is in the standard `[K, C/G, KD, KH, KW]`
    /// layout.
    Naive,
}

/// Tile sizes of `conv3d_tiled_*` (RS_TBM, RS_TBN) and its largest tap count
/// (RS_MAX_TAPS).
pub(crate) const TILE_M: usize = 128;
pub(crate) const TILE_N: usize = 128;
const MAX_TAPS: usize = 1024;

impl Conv3dKernel {
    /// `"tiled"` or `"naive"`.
    pub fn name(self) -> &'static str {
        match self {
            Conv3dKernel::Tiled => "tiled",
            Conv3dKernel::Naive => "naive",
        }
    }

    /// Why this kernel cannot take `g`, if it cannot: zero-size tensors
    /// (never sent to a device) and, for the tiled kernel, sizes its grid or
    /// tap table cannot hold, or fewer than 8 output channels per group
    /// (the naive kernel fits those better).
    pub fn unsupported(self, g: &Conv3dGeometry) -> Option<&'static str> {
        let zero =
            g.output_len() == 0 || g.input_shape().contains(&0) || g.weight_shape().contains(&0);
        if zero {
            return Some("zero-size tensors are not sent to a device");
        }
        if self == Conv3dKernel::Naive {
            return None;
        }
        let points = g.batch.saturating_mul(g.output.iter().product::<usize>());
        if points.div_ceil(TILE_N) > i32::MAX as usize {
            return Some("more output points than the grid's x dimension holds");
        }
        if g.out_per_group().div_ceil(TILE_M) > 65_535 || g.params.groups > 65_535 {
            return Some("more channel tiles or groups than the grid's y/z dimensions hold");
        }
        let taps: usize = g.kernel.iter().product();
        if taps > MAX_TAPS {
            return Some("more than 1024 kernel taps (KD * KH * KW)");
        }
        let fits = (0..3).all(|a| {
            (g.kernel[a] - 1)
                .checked_mul(g.params.dilation[a])
                .is_some_and(|v| v <= i32::MAX as usize)
        });
        if !fits {
            return Some("a dilated kernel offset does not fit 32 bits");
        }
        if u32::try_from(g.in_per_group()).is_err() {
            return Some("more than 2^32 input channels per group");
        }
        if g.out_per_group() < 8 {
            return Some(
                "fewer than 8 output channels per group (depthwise-like): the naive kernel fits better",
            );
        }
        None
    }

    /// The launch grid `(x, y, z)` for `g` (256 threads per block), or why
    /// the kernel cannot take it. Never truncates.
    pub(crate) fn grid(self, g: &Conv3dGeometry) -> Result<[u32; 3]> {
        if let Some(reason) = self.unsupported(g) {
            return Err(Error::Conv3dTier {
                tier: self.name(),
                reason,
            });
        }
        let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(match self {
            // Grid-stride: at most 2^20 blocks.
            Conv3dKernel::Naive => [clamp(g.output_len().div_ceil(256).min(1 << 20)), 1, 1],
            // Each fits (checked by `unsupported`).
            Conv3dKernel::Tiled => {
                let points = g.batch * g.output.iter().product::<usize>();
                [
                    clamp(points.div_ceil(TILE_N)),
                    clamp(g.out_per_group().div_ceil(TILE_M)),
                    clamp(g.params.groups),
                ]
            }
        })
    }
}

impl std::fmt::Display for Conv3dKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One conv3d call as a backend takes it: device addresses, dtype and the
/// validated geometry (only [`Conv3dProblem::new`] makes one, so every
/// element count fits `usize`).
///
/// - `input`: `geometry.input_shape()` elements of `dtype` (F32 or BF16);
/// - `weight`: the weight in `dtype`, in the layout the backend's
///   [`conv3d_weight_layout`](super::Backend::conv3d_weight_layout) gave for
///   the kernel ([`Conv3dWeightLayout::Standard`] for the vendor library);
/// - `bias`: `out_channels` f32, or `None`;
/// - `output`: `geometry.output_len()` f32, written (every element).
///
/// Every address is aligned to its element size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dLaunch {
    /// The sizes and parameters.
    pub geometry: Conv3dGeometry,
    /// The dtype of input and weight: F32 or BF16.
    pub dtype: DType,
    /// The input tensor.
    pub input: DevicePtr,
    /// The weight tensor.
    pub weight: DevicePtr,
    /// The bias (f32), if any.
    pub bias: Option<DevicePtr>,
    /// The output (f32).
    pub output: DevicePtr,
}

impl Conv3dLaunch {
    /// Bytes of the f32 output.
    pub fn output_bytes(&self) -> usize {
        self.geometry.output_len() * 4
    }
}

/// How a conv3d kernel wants its weight laid out in device memory. The
/// backend chooses ([`super::Backend::conv3d_weight_layout`]); the caller
/// lays the weight out so ([`Conv3dWeightLayout::arrange`]) before the
/// upload. `R = C/G * KD * KH * KW` below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Conv3dWeightLayout {
    /// `[K, C/G, KD, KH, KW]` as given (the naive kernel, vendor libraries).
    Standard,
    /// [`tiled_weight_layout`]: `[G][R][K/G]` (`conv3d_tiled_*`).
    TiledTransposed,
    /// `[G][rows][cols]`, each group's `[K/G][R]` block zero padded to
    /// `rows` (K/G rounded up to 128) by `cols` (R rounded up to 32): the
    /// tensor-core kernel `conv3d_tiled_bf16_mma` (CUDA, sm_80+).
    TiledPacked {
        /// Padded output channels per group (a multiple of 128).
        rows: usize,
        /// Padded reduction length (a multiple of 32).
        cols: usize,
    },
}

/// Largest KD * KH * KW of `conv3d_tiled_bf16_mma` (RS_TC_MAX_TAPS).
const MMA_MAX_TAPS: usize = 1 << 9;

impl Conv3dWeightLayout {
    /// The packed layout of `conv3d_tiled_bf16_mma` for `g`, when that
    /// kernel takes `g` (what the tiled kernel takes, at most 512 taps, the
    /// padded sizes within its grid and `usize`).
    pub fn packed_for(g: &Conv3dGeometry) -> Option<Conv3dWeightLayout> {
        if Conv3dKernel::Tiled.unsupported(g).is_some()
            || g.kernel.iter().product::<usize>() > MMA_MAX_TAPS
        {
            return None;
        }
        let r = g.in_per_group() * g.kernel.iter().product::<usize>();
        let rows = g.out_per_group().checked_next_multiple_of(TILE_M)?;
        let cols = r.checked_next_multiple_of(32)?;
        if rows / TILE_M > 65_535 {
            return None;
        }
        g.params.groups.checked_mul(rows)?.checked_mul(cols)?;
        Some(Conv3dWeightLayout::TiledPacked { rows, cols })
    }

    /// Elements of the weight in this layout.
    pub fn len(self, g: &Conv3dGeometry) -> usize {
        match self {
            Conv3dWeightLayout::Standard | Conv3dWeightLayout::TiledTransposed => {
                g.weight_shape().iter().product()
            }
            // Fits: checked by `packed_for`, the only maker of a valid one.
            Conv3dWeightLayout::TiledPacked { rows, cols } => {
                g.params.groups.saturating_mul(rows).saturating_mul(cols)
            }
        }
    }

    /// `w` (standard layout) laid out in this layout.
    ///
    /// Errors: [`Error::LengthMismatch`] when `w` is not the weight's
    /// length, or a packed layout smaller than the weight.
    pub fn arrange<'w, T: Copy + Default + Send + Sync>(
        self,
        g: &Conv3dGeometry,
        w: &'w [T],
    ) -> Result<Cow<'w, [T]>> {
        check_len(
            "conv3d weight layout",
            g.weight_shape().iter().product(),
            w.len(),
        )?;
        Ok(match self {
            Conv3dWeightLayout::Standard => Cow::Borrowed(w),
            Conv3dWeightLayout::TiledTransposed => Cow::Owned(tiled_weight_layout(g, w)),
            Conv3dWeightLayout::TiledPacked { rows, cols } => {
                let (kg, r) = (
                    g.out_per_group(),
                    g.in_per_group() * g.kernel.iter().product::<usize>(),
                );
                if rows < kg || cols < r {
                    return Err(Error::LengthMismatch {
                        op: "conv3d packed weight layout",
                        expected: kg * r,
                        actual: rows * cols,
                    });
                }
                let mut out = vec![T::default(); self.len(g)];
                if r > 0 {
                    for (row, src) in w.chunks_exact(r).enumerate() {
                        let (grp, m) = (row / kg, row % kg);
                        let at = (grp * rows + m) * cols;
                        if let Some(dst) = out.get_mut(at..at + r) {
                            dst.copy_from_slice(src);
                        }
                    }
                }
                Cow::Owned(out)
            }
        })
    }
}

/// `w` (`[K, C/G, KD, KH, KW]`, that is `[G][K/G][R]` with `R = C/G * KD *
/// KH * KW`) transposed per group into `[G][R][K/G]`: the layout
/// [`Conv3dKernel::Tiled`] reads (its weight loads are then coalesced).
/// Elements past `w`'s end (a short slice) are left at `T::default()`.
pub fn tiled_weight_layout<T: Copy + Default + Send + Sync>(g: &Conv3dGeometry, w: &[T]) -> Vec<T> {
    use rayon::prelude::*;
    let kg = g.out_per_group();
    let r_len = g.in_per_group() * g.kernel.iter().product::<usize>();
    let mut out = vec![T::default(); w.len()];
    if kg == 0 || r_len == 0 {
        return out;
    }
    // Each output row (group, r) gathers one column of the group's block.
    out.par_chunks_mut(kg).enumerate().for_each(|(row, dst)| {
        let (grp, r) = (row / r_len, row % r_len);
        for (m, d) in dst.iter_mut().enumerate() {
            if let Some(v) = w.get((grp * kg + m) * r_len + r) {
                *d = *v;
            }
        }
    });
    out
}

/// The inverse of [`tiled_weight_layout`].
fn standard_weight_layout<T: Copy + Default>(g: &Conv3dGeometry, wt: &[T]) -> Vec<T> {
    let kg = g.out_per_group();
    let r_len = g.in_per_group() * g.kernel.iter().product::<usize>();
    let mut out = vec![T::default(); wt.len()];
    if kg == 0 || r_len == 0 {
        return out;
    }
    for (i, d) in out.iter_mut().enumerate() {
        // i = (grp * kg + m) * r_len + r
        let (row, r) = (i / r_len, i % r_len);
        let (grp, m) = (row / kg, row % kg);
        if let Some(v) = wt.get((grp * r_len + r) * kg + m) {
            *d = *v;
        }
    }
    out
}

fn check_len(op: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            op,
            expected,
            actual,
        })
    }
}

impl Stream {
    /// The weight layout `kernel` reads on this stream's device for a call
    /// `g` with inputs of `dtype` (lay the weight out with
    /// [`Conv3dWeightLayout::arrange`] before uploading it).
    pub fn conv3d_weight_layout(
        &self,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &Conv3dGeometry,
    ) -> Conv3dWeightLayout {
        self.backend().conv3d_weight_layout(kernel, dtype, g)
    }

    /// Checks a conv3d call's operands and builds its launch description.
    #[allow(clippy::too_many_arguments)]
    fn conv3d_launch<T: Element>(
        &self,
        op: &'static str,
        layout: Conv3dWeightLayout,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: Option<DeviceView<'_, f32>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<Conv3dLaunch> {
        if !matches!(T::DTYPE, DType::F32 | DType::BF16) {
            return Err(Error::Conv3dDType {
                tensor: "input",
                dtype: T::DTYPE,
                expected: DType::F32,
            });
        }
        self.check_device(op, input.device)?;
        self.check_device(op, weight.device)?;
        self.check_device(op, out.device)?;
        if let Some(b) = &bias {
            self.check_device(op, b.device)?;
        }
        let product = |s: [usize; 5]| s.iter().product::<usize>();
        check_len("conv3d device input", product(g.input_shape()), input.len())?;
        check_len("conv3d device weight", layout.len(g), weight.len())?;
        if let Some(b) = &bias {
            check_len("conv3d device bias", g.out_channels, b.len())?;
        }
        check_len("conv3d device output", g.output_len(), out.len())?;
        Ok(Conv3dLaunch {
            geometry: *g,
            dtype: T::DTYPE,
            input: input.device_ptr(),
            weight: weight.device_ptr(),
            bias: bias.map(|b| b.device_ptr()),
            output: out.device_ptr(),
        })
    }

    /// Queues `kernel` computing the convolution `g` of `input` and `weight`
    /// (plus `bias`) into `out` on this stream (no synchronisation).
    /// `weight` is in the layout the backend asks for
    /// ([`Stream::conv3d_weight_layout`]).
    ///
    /// Errors: [`Error::Conv3dDType`] for a `T` other than f32 and bf16,
    /// [`Error::DeviceMismatch`], [`Error::LengthMismatch`] for a view whose
    /// length is not its shape's, [`Error::Conv3dTier`] for sizes the kernel
    /// does not take (see [`Conv3dKernel::unsupported`]; zero-size calls
    /// among them), or the backend's launch error.
    pub fn conv3d<T: Element>(
        &self,
        kernel: Conv3dKernel,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: Option<DeviceView<'_, f32>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let layout = self.backend().conv3d_weight_layout(kernel, T::DTYPE, g);
        let launch = self.conv3d_launch("conv3d", layout, g, input, weight, bias, out)?;
        // Refuses zero-size work and sizes the grid cannot hold.
        kernel.grid(g)?;
        // SAFETY: every view is a live range of this stream's device with
        // exactly its shape's length (checked above), typed views are
        // aligned to their element, `out` is borrowed mutably (nothing else
        // writes it) and the call is not zero-sized.
        unsafe { self.backend().conv3d(kernel, &launch, self.raw()) }
    }

    /// Queues the vendor library's convolution (MIOpen on HIP, cuDNN on
    /// CUDA) of `g` on this stream; `weight` is in the standard layout. The
    /// backend may wait for the stream before returning (it frees its
    /// workspace).
    ///
    /// Errors: as [`Stream::conv3d`]; [`Error::VendorUnavailable`] when the
    /// backend has no vendor library here; the library's own error
    /// ([`Error::Conv3dMiopen`], `Error::Conv3dCudnn`) when it refuses the
    /// call (no algorithm for these parameters, ...).
    pub fn conv3d_vendor<T: Element>(
        &self,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: Option<DeviceView<'_, f32>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let launch = self.conv3d_launch(
            "conv3d_vendor",
            Conv3dWeightLayout::Standard,
            g,
            input,
            weight,
            bias,
            out,
        )?;
        if let Some(reason) = Conv3dKernel::Naive.unsupported(g) {
            return Err(Error::Conv3dTier {
                tier: "vendor",
                reason,
            });
        }
        // SAFETY: as in `conv3d`.
        unsafe { self.backend().conv3d_vendor(&launch, self.raw()) }
    }
}

// ----- vendor libraries ------------------------------------------------------

/// A vendor convolution library bound by a backend (MIOpen, cuDNN): plans
/// per (geometry, dtype) and a forward call writing the input's dtype.
#[cfg(any(feature = "hip", feature = "cuda"))]
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
}

/// Largest buffer the vendor tier keeps between calls: smaller scratch
/// outputs and workspaces are reused by the next call instead of being
/// allocated and freed around each one; larger ones (a video VAE's
/// full-resolution layers) are freed at once so the device memory goes
/// back to the caller.
#[cfg(any(feature = "hip", feature = "cuda"))]
pub(crate) const VENDOR_KEEP_MAX: usize = 256 << 20;

/// The vendor tier's bf16 scratch output and library workspace, kept
/// between calls when at most [`VENDOR_KEEP_MAX`] bytes. Owned by the
/// library state of one device; the backend frees them
/// ([`VendorBuffers::release`]) before it drops that state.
#[cfg(any(feature = "hip", feature = "cuda", test))]
#[cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]
#[derive(Debug, Default)]
pub(crate) struct VendorBuffers {
    scratch: Option<(DevicePtr, usize)>,
    workspace: Option<(DevicePtr, usize)>,
}

#[cfg(any(feature = "hip", feature = "cuda", test))]
#[cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]
impl VendorBuffers {
    /// Frees the kept buffers.
    ///
    /// # Safety
    /// They belong to `backend`'s device and no queued work uses them (every
    /// vendor call waits for its stream before it returns).
    pub(crate) unsafe fn release(&mut self, backend: &dyn super::Backend) -> Result<()> {
        let a = self.scratch.take();
        let b = self.workspace.take();
        // SAFETY: the caller's guarantees.
        let ra = unsafe { free_kept(backend, a) };
        // SAFETY: as above.
        let rb = unsafe { free_kept(backend, b) };
        ra.and(rb)
    }
}

/// # Safety
/// `kept` (when some) was allocated on `backend` with its byte count and
/// nothing queued uses it.
#[cfg(any(feature = "hip", feature = "cuda", test))]
#[cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]
unsafe fn free_kept(backend: &dyn super::Backend, kept: Option<(DevicePtr, usize)>) -> Result<()> {
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
#[cfg(any(feature = "hip", feature = "cuda", test))]
#[cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]
unsafe fn take_buffer(
    backend: &dyn super::Backend,
    slot: &mut Option<(DevicePtr, usize)>,
    bytes: usize,
) -> Result<Option<(DevicePtr, usize)>> {
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
/// As [`super::Backend::conv3d_vendor`] for `a` and `s` on `backend`;
/// `launch` queues a kernel call on `s` of `backend`, and `lib` belongs to
/// `backend`'s device, which is current.
#[cfg(any(feature = "hip", feature = "cuda"))]
pub(crate) unsafe fn vendor_conv3d(
    backend: &dyn super::Backend,
    lib: &mut dyn VendorConv,
    a: &Conv3dLaunch,
    s: RawStream,
    launch: &dyn Fn(super::kernels::KernelCall) -> Result<()>,
) -> Result<()> {
    use super::kernels::KernelCall;
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
    // SAFETY: `s` is live (caller).
    let synced = unsafe { backend.stream_synchronize(s) };
    if synced.is_err() {
        // Possibly still in use: leaked, neither freed nor kept.
        run?;
        return synced;
    }
    let bufs = lib.buffers();
    let keep = |slot: &mut Option<(DevicePtr, usize)>, b: Option<(DevicePtr, usize)>| match b {
        Some((p, n)) if n <= VENDOR_KEEP_MAX => {
            *slot = Some((p, n));
            Ok(())
        }
        // SAFETY: allocated on `backend` with `n` bytes; the stream that
        // used it is idle.
        other => unsafe { free_kept(backend, other) },
    };
    let kept_scratch = keep(&mut bufs.scratch, scratch);
    let kept_ws = keep(&mut bufs.workspace, ws);
    run?;
    kept_scratch?;
    kept_ws
}

// ----- host emulation ------------------------------------------------------

/// # Safety
/// `p` points to `len` readable, aligned `T` that nothing writes meanwhile.
unsafe fn host_slice<'a, T>(p: DevicePtr, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller (host "device" addresses are host
    // addresses).
    unsafe { std::slice::from_raw_parts(p.0 as usize as *const T, len) }
}

/// The host backend's `conv3d`: the CPU implementation over host memory
/// ([`Conv3dKernel::Naive`] with the portable CPU kernel,
/// [`Conv3dKernel::Tiled`] with the fastest one after undoing the tiled
/// weight layout), refusing what the GPU kernel would refuse.
///
/// # Safety
/// As [`super::Backend::conv3d`]: the launch's addresses are live host
/// allocations of the documented lengths, `output` exclusive.
pub(crate) unsafe fn host_conv3d(kernel: Conv3dKernel, a: &Conv3dLaunch) -> Result<()> {
    let g = &a.geometry;
    kernel.grid(g)?;
    let in_len: usize = g.input_shape().iter().product();
    let w_len: usize = g.weight_shape().iter().product();
    // SAFETY: the caller guarantees the lengths, alignment and exclusivity.
    let (bias, out) = unsafe {
        (
            a.bias.map(|b| host_slice::<f32>(b, g.out_channels)),
            std::slice::from_raw_parts_mut(a.output.0 as usize as *mut f32, g.output_len()),
        )
    };
    match a.dtype {
        DType::F32 => {
            // SAFETY: as above.
            let (x, w) = unsafe {
                (
                    host_slice::<f32>(a.input, in_len),
                    host_slice::<f32>(a.weight, w_len),
                )
            };
            host_run(kernel, g, x, w, bias, out)
        }
        DType::BF16 => {
            // SAFETY: as above.
            let (x, w) = unsafe {
                (
                    host_slice::<half::bf16>(a.input, in_len),
                    host_slice::<half::bf16>(a.weight, w_len),
                )
            };
            host_run(kernel, g, x, w, bias, out)
        }
        other => Err(Error::Conv3dDType {
            tensor: "input",
            dtype: other,
            expected: DType::F32,
        }),
    }
}

/// The two element types conv3d takes.
trait HostElem: Copy + Default {
    fn wrap(s: &[Self]) -> Conv3dData<'_>;
}
impl HostElem for f32 {
    fn wrap(s: &[f32]) -> Conv3dData<'_> {
        Conv3dData::F32(s)
    }
}
impl HostElem for half::bf16 {
    fn wrap(s: &[half::bf16]) -> Conv3dData<'_> {
        Conv3dData::BF16(s)
    }
}

fn host_run<T: HostElem>(
    kernel: Conv3dKernel,
    g: &Conv3dGeometry,
    x: &[T],
    w: &[T],
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let wrap = T::wrap;
    let w: Cow<'_, [T]> = match kernel {
        Conv3dKernel::Tiled => Cow::Owned(standard_weight_layout(g, w)),
        Conv3dKernel::Naive => Cow::Borrowed(w),
    };
    let p = Conv3dProblem::new(
        g.params,
        wrap(x),
        &g.input_shape(),
        wrap(&w),
        &g.weight_shape(),
        bias.map(Conv3dData::F32),
    )?;
    match kernel {
        Conv3dKernel::Tiled => conv3d_cpu(&p, out),
        Conv3dKernel::Naive => conv3d_cpu_with(&p, out, CpuKernel::Portable),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d::Conv3dParams;

    #[test]
    fn vendor_buffers_are_reused_when_large_enough_and_replaced_otherwise() {
        let b = crate::device::host::HostBackend::new();
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
        kept.workspace = Some((crate::device::Backend::alloc(&b, 64).unwrap(), 64));
        // SAFETY: host "device" memory of `b`, used by no queued work.
        unsafe { kept.release(&b) }.unwrap();
        assert!(kept.scratch.is_none() && kept.workspace.is_none());
    }

    #[test]
    fn tiled_layout_round_trips() {
        let x = vec![0f32; 2 * 4 * 3 * 3 * 3];
        let w: Vec<f32> = (0..12 * 2 * 3 * 3 * 3).map(|i| i as f32).collect();
        let p = Conv3dProblem::new(
            Conv3dParams::default().with_groups(2),
            Conv3dData::F32(&x),
            &[2, 4, 3, 3, 3],
            Conv3dData::F32(&w),
            &[12, 2, 3, 3, 3],
            None,
        )
        .unwrap();
        let g = p.geometry;
        let t = tiled_weight_layout(&g, &w);
        assert_ne!(t, w);
        // wt[g][r][m] = w[g * K/G + m][r]
        let (kg, r_len) = (6, 2 * 27);
        assert_eq!(t[(r_len + 5) * kg + 3], w[(kg + 3) * r_len + 5]);
        assert_eq!(standard_weight_layout(&g, &t), w);
    }

    fn geometry(input: [usize; 5], weight: [usize; 5], groups: usize) -> Conv3dGeometry {
        let x = vec![0f32; input.iter().product()];
        let w = vec![0f32; weight.iter().product()];
        Conv3dProblem::new(
            Conv3dParams::default()
                .with_groups(groups)
                .with_padding([1; 3]),
            Conv3dData::F32(&x),
            &input,
            Conv3dData::F32(&w),
            &weight,
            None,
        )
        .unwrap()
        .geometry
    }

    #[test]
    fn weight_layouts_arrange_and_pad() {
        // 2 groups of 20 output channels, R = 3 * 27 = 81.
        let g = geometry([1, 6, 4, 4, 4], [40, 3, 3, 3, 3], 2);
        let w: Vec<u16> = (1..=40 * 81).map(|i| i as u16).collect();
        let packed = Conv3dWeightLayout::packed_for(&g).unwrap();
        assert_eq!(
            packed,
            Conv3dWeightLayout::TiledPacked {
                rows: 128,
                cols: 96
            }
        );
        assert_eq!(packed.len(&g), 2 * 128 * 96);
        let p = packed.arrange(&g, &w).unwrap();
        assert_eq!(p.len(), packed.len(&g));
        // wp[g][m][r] = w[(g * 20 + m) * 81 + r]; zero padding elsewhere.
        assert_eq!(p[(128 + 7) * 96 + 80], w[(20 + 7) * 81 + 80]);
        assert_eq!(p[(128 + 7) * 96 + 81], 0);
        assert_eq!(p[(128 + 20) * 96], 0);
        assert_eq!(p.iter().filter(|&&v| v != 0).count(), w.len());
        assert!(matches!(
            Conv3dWeightLayout::Standard.arrange(&g, &w).unwrap(),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            &*Conv3dWeightLayout::TiledTransposed.arrange(&g, &w).unwrap(),
            &tiled_weight_layout(&g, &w)[..]
        );
        assert_eq!(Conv3dWeightLayout::TiledTransposed.len(&g), w.len());
        let e = packed.arrange(&g, &w[1..]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::LengthMismatch {
                    op: "conv3d weight layout",
                    ..
                }
            ),
            "{e}"
        );
        let small = Conv3dWeightLayout::TiledPacked { rows: 8, cols: 96 };
        assert!(matches!(
            small.arrange(&g, &w),
            Err(Error::LengthMismatch {
                op: "conv3d packed weight layout",
                ..
            })
        ));
        // What the tensor-core kernel does not take: too few channels per
        // group (the tiled kernel declines), more than 512 taps.
        assert!(
            Conv3dWeightLayout::packed_for(&geometry([1, 6, 4, 4, 4], [6, 1, 3, 3, 3], 6))
                .is_none()
        );
        assert!(
            Conv3dWeightLayout::packed_for(&geometry([1, 2, 9, 9, 9], [16, 2, 9, 9, 9], 1))
                .is_none()
        );
        assert!(
            Conv3dWeightLayout::packed_for(&geometry([1, 2, 8, 8, 8], [16, 2, 8, 8, 8], 1))
                .is_some()
        );
    }
}
