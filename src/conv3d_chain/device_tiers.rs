//! The GPU tiers of one device (vendor, tiled, naive), run through its backend.
//!
//! The GPU tiers, per [`Device`]: each uploads the problem, runs one
//! conv3d on the device through the [`Backend`](crate::device::raw::Backend)
//! trait ([`Conv3dOps::forward`](crate::device::Conv3dOps::forward) or [`Conv3dOps::vendor`](crate::device::Conv3dOps::vendor); for the backward
//! ops the naive tier's kernels and the vendor tier's library), and
//! downloads the output. So they run on every backend: HIP, CUDA, the host backend
//! (whose "kernels" are the CPU code, so the whole path runs in CI), and
//! [`Faults`](crate::device::faults::Faults) wrapping any of them.
//!
//! On operands already on their device ([`Conv3dTier::run_device`]) they
//! copy nothing: the tiled kernel's weight layout is made on the device,
//! on the caller's stream, every call, into a buffer the tier keeps
//! ([`LayoutScratch`]). Re-laying out every call rather than caching one
//! layout per weight means a changed weight can never meet a stale
//! layout, whatever the caller does with its memory; it costs one read and
//! one write of the weight (for the largest Wan 2.1 VAE layer, 384 x 384 x
//! 27 f32 = 16 MB, about 10 us of H100 bandwidth against tens of ms of
//! convolution), and no host work. The tiled tier's input gradient
//! flips the weight on the device the same way, every call, into a second
//! kept buffer ([`TiledTier`]); its weight gradient needs no buffer (the
//! split-K kernel adds into the caller's zeroed result).

use std::sync::Mutex;

use super::backward_chain::{run_backward_on_host_then_copy, run_backward_views};
use super::device_run::run_on_host_then_copy;
use super::{
    Conv3dTier, CpuTier, DeviceBackwardOperands, DeviceConv3dData, DeviceOperands, Support,
    TierKind,
};
use crate::conv3d::{
    Conv3dBackwardOp, Conv3dBackwardProblem, Conv3dData, Conv3dGeometry, Conv3dProblem,
};
use crate::convert::Element;
use crate::device::{
    raw::Conv3dWeightLayout, Conv3dKernel, Device, DeviceBuffer, DeviceView, DeviceViewMut, Event,
    Stream,
};
use crate::error::Result;

/// What a GPU tier runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Vendor,
    Kernel(Conv3dKernel),
}

fn zero_size(g: &Conv3dGeometry) -> Option<Support> {
    Conv3dKernel::Naive
        .unsupported(g)
        .map(|why| Support::Unsupported(why.into()))
}

/// A device buffer a tier keeps across calls (the weight layout; the
/// tiled tier's flipped weight and spread `dy` have one each), and the
/// event after the last kernel that read it: a call on another stream
/// waits for that event on the device (never on the host) before it
/// overwrites the buffer.
#[derive(Debug, Default)]
pub(super) struct LayoutScratch {
    inner: Mutex<Option<(DeviceBuffer<u32>, Option<Event>)>>,
}

impl LayoutScratch {
    /// Calls `run` with the first `len` elements of the kept buffer (grown
    /// when needed), typed as `T`, after `s` waited (on the device) for the
    /// last call that used it; then records that the buffer is in use up
    /// to here on `s`.
    fn with_buffer<T: Element>(
        &self,
        s: &Stream,
        len: usize,
        run: impl FnOnce(&mut DeviceViewMut<'_, T>) -> Result<()>,
    ) -> Result<()> {
        let mut guard = self
            .inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let words = (len * std::mem::size_of::<T>()).div_ceil(4);
        let fits = guard
            .as_ref()
            .is_some_and(|(b, _)| b.len() >= words && b.device().same(s.device()));
        if !fits {
            // The old buffer is freed at the device's next sync point, after
            // any kernel still reading it.
            *guard = Some((s.device().stream()?.alloc::<u32>(words)?, None));
        }
        let Some((buf, last)) = guard.as_mut() else {
            return Err(crate::Error::Conv3dTier {
                tier: "tiled",
                reason: "no kept device buffer",
            });
        };
        if let Some(ev) = last.as_ref() {
            s.wait(ev)?;
        }
        let mut all = buf.view_mut();
        let mut typed = all.cast_mut::<T>()?;
        let mut dst = typed.slice_mut(..len)?;
        let result = run(&mut dst);
        let ev = match last.take() {
            Some(ev) => ev,
            None => s.device().event()?,
        };
        s.record(&ev)?;
        *last = Some(ev);
        result
    }

    /// Lays `w` out in `layout` on `s` into the kept buffer (grown when
    /// needed) and calls `run` with the laid-out weight, then records that
    /// the buffer is in use up to here on `s`.
    fn with_layout<T: Element>(
        &self,
        s: &Stream,
        layout: Conv3dWeightLayout,
        g: &Conv3dGeometry,
        w: &DeviceView<'_, T>,
        run: impl FnOnce(&DeviceView<'_, T>) -> Result<()>,
    ) -> Result<()> {
        self.with_buffer(s, layout.len(g), |dst| {
            s.conv3d_ops().arrange_weight(layout, g, w, dst)?;
            run(&dst.as_view())
        })
    }
}

/// Upload, run `op`, download into `out` (which has the output's length).
fn run_on(device: &Device, op: Op, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
    let s = device.stream()?;
    match (p.input, p.weight) {
        (Conv3dData::F32(x), Conv3dData::F32(w)) => run_typed(&s, op, p, x, w, out),
        (Conv3dData::BF16(x), Conv3dData::BF16(w)) => run_typed(&s, op, p, x, w, out),
        (x, w) => Err(crate::Error::Conv3dDType {
            tensor: "weight",
            dtype: w.dtype(),
            expected: x.dtype(),
        }),
    }
}

fn run_typed<T: Element + Default>(
    s: &Stream,
    op: Op,
    p: &Conv3dProblem<'_>,
    x: &[T],
    w: &[T],
    out: &mut [f32],
) -> Result<()> {
    let g = &p.geometry;
    let layout = match op {
        Op::Vendor => Conv3dWeightLayout::Standard,
        Op::Kernel(k) => s.conv3d_ops().weight_layout(k, T::DTYPE, g),
    };
    let w = layout.arrange(g, w)?;
    let xd = s.clone_htod(x)?;
    let wd = s.clone_htod(&w)?;
    let bd = match p.bias {
        Some(_) => {
            let b: Vec<f32> = (0..g.out_channels).map(|k| p.bias_f32(k)).collect();
            Some(s.clone_htod(&b)?)
        }
        None => None,
    };
    let mut y = s.alloc_zeros::<f32>(g.output_len())?;
    let bias = bd.as_ref().map(|b| b.view());
    match op {
        Op::Vendor => s
            .conv3d_ops()
            .vendor(g, &xd.view(), &wd.view(), bias, &mut y.view_mut())?,
        Op::Kernel(k) => {
            s.conv3d_ops()
                .forward(k, g, &xd.view(), &wd.view(), bias, &mut y.view_mut())?
        }
    }
    // Waits for the stream.
    y.copy_dtoh(out)
}

/// Runs `op` on operands already on the device, on `ops.stream`, into
/// `out`; on another device's stream, the host path
/// ([`Conv3dTier::run_device`]'s default).
fn run_device_on(
    device: &Device,
    op: Op,
    tier: &dyn Conv3dTier,
    layouts: &LayoutScratch,
    ops: &DeviceOperands<'_, '_>,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    if !ops.stream.device().same(device) {
        return run_on_host_then_copy(tier, ops, out);
    }
    let s = ops.stream;
    let g = &ops.geometry;
    match (ops.input, ops.weight) {
        (DeviceConv3dData::F32(x), DeviceConv3dData::F32(w)) => {
            run_views(s, op, g, layouts, (&x, &w), ops.bias, out)
        }
        (DeviceConv3dData::BF16(x), DeviceConv3dData::BF16(w)) => {
            run_views(s, op, g, layouts, (&x, &w), ops.bias, out)
        }
        (x, w) => Err(crate::Error::Conv3dDType {
            tensor: "weight",
            dtype: w.dtype(),
            expected: x.dtype(),
        }),
    }
}

/// Input and weight (standard layout) on the device.
type ViewOperands<'r, 'v, T> = (&'r DeviceView<'v, T>, &'r DeviceView<'v, T>);

fn run_views<T: Element + Default>(
    s: &Stream,
    op: Op,
    g: &Conv3dGeometry,
    layouts: &LayoutScratch,
    (x, w): ViewOperands<'_, '_, T>,
    bias: Option<DeviceView<'_, f32>>,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    let layout = match op {
        Op::Vendor => Conv3dWeightLayout::Standard,
        Op::Kernel(k) => s.conv3d_ops().weight_layout(k, T::DTYPE, g),
    };
    let mut call = |wv: &DeviceView<'_, T>| match op {
        Op::Vendor => s.conv3d_ops().vendor(g, x, wv, bias, out),
        Op::Kernel(k) => s.conv3d_ops().forward(k, g, x, wv, bias, out),
    };
    match layout {
        Conv3dWeightLayout::Standard => call(w),
        other => layouts.with_layout(s, other, g, w, call),
    }
}

/// Upload, run the backward op of `p` on `device` (by its vendor library
/// with `vendor`, else the naive kernels), download into `out`.
fn run_backward_on(
    device: &Device,
    vendor: bool,
    p: &Conv3dBackwardProblem<'_>,
    out: &mut [f32],
) -> Result<()> {
    let s = device.stream()?;
    let s = (&s, vendor);
    match (p.grad_output, p.other) {
        (Conv3dData::F32(dy), Some(Conv3dData::F32(o))) => backward_typed(s, p, dy, Some(o), out),
        (Conv3dData::F32(dy), None) => backward_typed::<f32>(s, p, dy, None, out),
        (Conv3dData::BF16(dy), Some(Conv3dData::BF16(o))) => backward_typed(s, p, dy, Some(o), out),
        (Conv3dData::BF16(dy), None) => backward_typed::<half::bf16>(s, p, dy, None, out),
        (dy, Some(o)) => Err(crate::Error::Conv3dDType {
            tensor: "input",
            dtype: o.dtype(),
            expected: dy.dtype(),
        }),
    }
}

fn backward_typed<T: Element + Default>(
    (s, vendor): (&Stream, bool),
    p: &Conv3dBackwardProblem<'_>,
    dy: &[T],
    other: Option<&[T]>,
    out: &mut [f32],
) -> Result<()> {
    let g = &p.geometry;
    let dyd = s.clone_htod(dy)?;
    let od = other.map(|o| s.clone_htod(o)).transpose()?;
    let bd = match p.bias {
        Some(b) => {
            let v: Vec<f32> = (0..g.in_channels)
                .map(|c| b.get_f32(c).unwrap_or(0.0))
                .collect();
            Some(s.clone_htod(&v)?)
        }
        None => None,
    };
    let mut y = s.alloc_zeros::<f32>(p.output_len())?;
    let (dyv, ov) = (dyd.view(), od.as_ref().map(|o| o.view()));
    let (bias, mut yv) = (bd.as_ref().map(|b| b.view()), y.view_mut());
    match (p.op, ov, vendor) {
        (Conv3dBackwardOp::Data, Some(w), false) => {
            s.conv3d_ops().backward_data(g, &dyv, &w, bias, &mut yv)?
        }
        (Conv3dBackwardOp::Data, Some(w), true) => s
            .conv3d_ops()
            .backward_data_vendor(g, &dyv, &w, bias, &mut yv)?,
        (Conv3dBackwardOp::Weight, Some(x), false) => {
            s.conv3d_ops().backward_weight(g, &x, &dyv, &mut yv)?
        }
        (Conv3dBackwardOp::Weight, Some(x), true) => s
            .conv3d_ops()
            .backward_weight_vendor(g, &x, &dyv, &mut yv)?,
        (Conv3dBackwardOp::Bias, None, false) => s.conv3d_ops().backward_bias(g, &dyv, &mut yv)?,
        _ => {
            return Err(crate::Error::Conv3dTier {
                tier: "naive",
                reason: "a backward op without its operands",
            })
        }
    }
    // Waits for the stream.
    y.copy_dtoh(out)
}

/// Why the vendor tier takes no `conv_transpose3d` whose output_padding
/// reaches the stride ([`Conv3dGeometry::output_is_forward`]).
const VENDOR_NOT_FORWARD: &str = concat!(
    "dy is not the forward output of the input (a conv_transpose3d output_padding at or ",
    "past the stride): the vendor libraries refuse it, the naive tier serves"
);

/// Why the vendor tier takes no bias gradient.
const VENDOR_NO_BIAS_GRAD: &str =
    "the bias gradient is a reduction of dy, not a vendor call: the naive tier's kernel serves";

/// The vendor library of a device as a tier: MIOpen (HIP), cuDNN (CUDA).
/// Skipped as unavailable where the library is not installed (and always
/// on the host backend, which has none). Serves the forward call, and the
/// data and weight gradients (so `conv_transpose3d` too) where the
/// library has its backward calls ([`Conv3dOps::backward_data_vendor`](crate::device::Conv3dOps::backward_data_vendor),
/// [`Conv3dOps::backward_weight_vendor`](crate::device::Conv3dOps::backward_weight_vendor): f32 results, bf16 operands
/// widened to f32 on the device); not the bias gradient.
#[derive(Debug)]
pub struct VendorTier {
    device: Device,
    layouts: LayoutScratch,
}

impl VendorTier {
    /// The vendor tier of `device`.
    pub fn new(device: Device) -> Self {
        VendorTier {
            device,
            layouts: LayoutScratch::default(),
        }
    }

    fn support_geometry(&self, g: &Conv3dGeometry) -> Support {
        if let Err(e) = self.device.backend().conv3d_vendor_available() {
            return Support::Unavailable(e.to_string());
        }
        zero_size(g).unwrap_or(Support::Yes)
    }
}

impl Conv3dTier for VendorTier {
    fn kind(&self) -> TierKind {
        TierKind::Vendor
    }
    /// The library's name as the backend declares it
    /// ([`crate::device::KernelCaps::vendor_library`]: `"miopen"`,
    /// `"cudnn"`), `"vendor"` where it has none.
    fn name(&self) -> &str {
        self.device
            .backend()
            .caps()
            .vendor_library
            .unwrap_or("vendor")
    }
    fn support(&self, p: &Conv3dProblem<'_>) -> Support {
        self.support_geometry(&p.geometry)
    }
    fn support_device(&self, ops: &DeviceOperands<'_, '_>) -> Support {
        self.support_geometry(&ops.geometry)
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        run_on(&self.device, Op::Vendor, p, out)
    }
    fn run_device(
        &self,
        ops: &DeviceOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        run_device_on(&self.device, Op::Vendor, self, &self.layouts, ops, out)
    }
    /// Data and Weight where the library and its backward calls are
    /// loaded (unavailable otherwise); the bias gradient, zero-size calls
    /// and a `conv_transpose3d` whose output_padding reaches the stride
    /// ([`Conv3dGeometry::output_is_forward`]) are unsupported.
    fn support_backward(&self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Support {
        if let Err(e) = self.device.backend().conv3d_vendor_backward_available() {
            return Support::Unavailable(e.to_string());
        }
        if op == Conv3dBackwardOp::Bias {
            return Support::Unsupported(VENDOR_NO_BIAS_GRAD.into());
        }
        if !g.output_is_forward() {
            return Support::Unsupported(VENDOR_NOT_FORWARD.into());
        }
        match op.unsupported(g) {
            Some(why) => Support::Unsupported(why.into()),
            None => Support::Yes,
        }
    }
    fn run_backward(&self, p: &Conv3dBackwardProblem<'_>, out: &mut [f32]) -> Result<()> {
        run_backward_on(&self.device, true, p, out)
    }
    /// On operands of this device: the library reads and writes in place on
    /// the caller's stream (bf16 operands widened into its kept buffers);
    /// otherwise the host path.
    fn run_backward_device(
        &self,
        ops: &DeviceBackwardOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        if ops.stream.device().same(&self.device) {
            run_backward_views(ops, true, out)
        } else {
            run_backward_on_host_then_copy(self, ops, out)
        }
    }
}

/// The tiled implicit-GEMM kernel on a device as a tier. Skips what the
/// kernel does not take ([`Conv3dKernel::unsupported`]: depthwise-like
/// calls, grid limits, zero sizes).
///
/// Of the backward ops it serves the input gradient (and so
/// `conv_transpose3d`) as the forward convolution of `dy` with the flipped
/// weight ([`Conv3dGeometry::data_grad_as_forward`]):
/// `conv3d_flip_weight_*` flips the weight into a buffer the tier keeps,
/// then the forward path lays it out and runs the tiled kernel (SIMT f32
/// and bf16, or the bf16 tensor-core kernel), the transposed
/// convolution's bias added by the kernel; all on the caller's stream,
/// with no host copy and no wait. With a stride above 1, or a transposed
/// convolution's `output_padding`, `conv3d_zero_insert_*` first spreads
/// `dy` by the stride into a second kept buffer, zeros between and after
/// ([`Conv3dGeometry::data_grad_unstrided`]): the tiled kernel then does
/// `stride product` times the multiply-adds the gather needs, so strides
/// whose product is above [`TILED_MAX_STRIDE_PRODUCT`] are left to the
/// naive tier. A padding above `dilation * (k - 1)` and what the tiled
/// kernel does not take of the flipped convolution (fewer than 8 input
/// channels per group of the forward one, ...) are unsupported too: the
/// naive tier's gather kernel serves them.
///
/// The weight gradient is the split-K tiled kernel's
/// ([`Conv3dOps::backward_weight_tiled`](crate::device::Conv3dOps::backward_weight_tiled): one implicit GEMM per group
/// on 64 x 64 tiles of `dw`, the reduction over the batch and the output
/// volume split into chunks whose partial sums are added with float atomics
/// into `dw`, zeroed first on the caller's stream; no host copy, no wait).
/// Its result is therefore not bit-reproducible run to run; the chain's
/// sampled f64 check applies to it as to every tier. Fewer than 8 output
/// channels per group (depthwise-like) and grids past their limits
/// ([`crate::device::raw::tiled_wgrad_unsupported`]) are left to the naive tier,
/// and so is the bias gradient (a reduction of `dy`, not a GEMM).
#[derive(Debug)]
pub struct TiledTier {
    device: Device,
    layouts: LayoutScratch,
    flips: LayoutScratch,
    inserted: LayoutScratch,
}

impl TiledTier {
    /// The tiled tier of `device`.
    pub fn new(device: Device) -> Self {
        TiledTier {
            device,
            layouts: LayoutScratch::default(),
            flips: LayoutScratch::default(),
            inserted: LayoutScratch::default(),
        }
    }

    /// The input gradient of `g` into `out` on `s` (this device's): `dy`
    /// spread by the stride into a kept buffer where `g` needs it, then
    /// [`Self::flipped`] (see the type's docs).
    fn data_views<T: Element + Default>(
        &self,
        s: &Stream,
        g: &Conv3dGeometry,
        (dy, w): ViewOperands<'_, '_, T>,
        bias: Option<DeviceView<'_, f32>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let g1 = g
            .data_grad_unstrided()
            .map_err(|reason| crate::Error::Conv3dTier {
                tier: "tiled",
                reason,
            })?;
        if g1 == *g {
            return self.flipped(s, g, (dy, w), bias, out);
        }
        self.inserted
            .with_buffer::<T>(s, g1.output_len(), |spread| {
                s.conv3d_ops().zero_insert(g, g1.output, dy, spread)?;
                self.flipped(s, &g1, (&spread.as_view(), w), bias, out)
            })
    }

    /// The input gradient of `g` (stride 1, its output the forward
    /// formula's) into `out` on `s`: the weight flipped into the kept
    /// buffer, then the tiled forward convolution of `dy` with it.
    fn flipped<T: Element + Default>(
        &self,
        s: &Stream,
        g: &Conv3dGeometry,
        (dy, w): ViewOperands<'_, '_, T>,
        bias: Option<DeviceView<'_, f32>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let fwd = g
            .data_grad_as_forward()
            .map_err(|reason| crate::Error::Conv3dTier {
                tier: "tiled",
                reason,
            })?;
        let op = Op::Kernel(Conv3dKernel::Tiled);
        self.flips.with_buffer::<T>(s, w.len(), |flipped| {
            s.conv3d_ops().flip_weight(g, w, flipped)?;
            let operands = (dy, &flipped.as_view());
            run_views(s, op, &fwd, &self.layouts, operands, bias, out)
        })
    }

    /// Uploads the operands of an input gradient, runs [`Self::data_views`]
    /// on a stream of this device and downloads the result into `out`.
    fn data_host<T: Element + Default>(
        &self,
        p: &Conv3dBackwardProblem<'_>,
        (dy, w): (&[T], &[T]),
        out: &mut [f32],
    ) -> Result<()> {
        let s = self.device.stream()?;
        let g = &p.geometry;
        let dyd = s.clone_htod(dy)?;
        let wd = s.clone_htod(w)?;
        let bd = match p.bias {
            Some(b) => {
                let v: Vec<f32> = (0..g.in_channels)
                    .map(|c| b.get_f32(c).unwrap_or(0.0))
                    .collect();
                Some(s.clone_htod(&v)?)
            }
            None => None,
        };
        let mut y = s.alloc_zeros::<f32>(p.output_len())?;
        let bias = bd.as_ref().map(|b| b.view());
        self.data_views(&s, g, (&dyd.view(), &wd.view()), bias, &mut y.view_mut())?;
        // Waits for the stream.
        y.copy_dtoh(out)
    }
}

fn tiled_support(g: &Conv3dGeometry) -> Support {
    match Conv3dKernel::Tiled.unsupported(g) {
        Some(why) => Support::Unsupported(why.into()),
        None => Support::Yes,
    }
}

/// The largest product of the strides whose input gradient the tiled tier
/// takes: zero insertion makes the tiled kernel do that many times the
/// multiply-adds of the gather form (2 x 2 x 2: 8).
pub const TILED_MAX_STRIDE_PRODUCT: usize = 8;

/// Why the tiled tier takes no bias gradient.
const TILED_NO_BIAS: &str = concat!(
    "the bias gradient is a reduction of dy, not a GEMM: the naive tier's kernel serves ",
    "(the tiled tier serves the input and weight gradients)"
);

/// Whether the tiled tier takes backward `op` of `g` (see [`TiledTier`]).
fn tiled_backward_support(op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Support {
    match op {
        Conv3dBackwardOp::Bias => return Support::Unsupported(TILED_NO_BIAS.into()),
        Conv3dBackwardOp::Weight => return super::tiled_wgrad::weight_support(g),
        _ => {}
    }
    if let Some(why) = op.unsupported(g) {
        return Support::Unsupported(why.into());
    }
    let strides = g
        .params
        .stride
        .iter()
        .try_fold(1usize, |p, &v| p.checked_mul(v));
    if strides.is_none_or(|p| p > TILED_MAX_STRIDE_PRODUCT) {
        return Support::Unsupported(format!(
            "a stride product above {TILED_MAX_STRIDE_PRODUCT} (zero insertion would make the tiled \
             kernel do that many times the gather's multiply-adds): the naive tier serves"
        ));
    }
    let fwd = match g
        .data_grad_unstrided()
        .and_then(|g1| g1.data_grad_as_forward())
    {
        Ok(fwd) => fwd,
        Err(why) => {
            return Support::Unsupported(format!(
                "the input gradient as a forward convolution: {why} (the naive tier serves)"
            ))
        }
    };
    match Conv3dKernel::Tiled.unsupported(&fwd) {
        Some(why) => Support::Unsupported(format!(
            "the input gradient's flipped forward convolution: {why} (the naive tier serves)"
        )),
        None => Support::Yes,
    }
}

/// The refusal of backward operands the tiled tier does not take.
fn tiled_backward_refused(op: Conv3dBackwardOp) -> crate::Error {
    crate::Error::Conv3dTier {
        tier: "tiled",
        reason: match op {
            Conv3dBackwardOp::Data => {
                "the input gradient takes dy and the weight of one dtype (f32 or bf16)"
            }
            Conv3dBackwardOp::Weight => {
                "the weight gradient takes the input and dy of one dtype (f32 or bf16)"
            }
            _ => "the tiled tier serves the input and weight gradients, not the bias gradient",
        },
    }
}

impl Conv3dTier for TiledTier {
    fn kind(&self) -> TierKind {
        TierKind::Tiled
    }
    fn name(&self) -> &str {
        "tiled"
    }
    fn support(&self, p: &Conv3dProblem<'_>) -> Support {
        tiled_support(&p.geometry)
    }
    fn support_device(&self, ops: &DeviceOperands<'_, '_>) -> Support {
        tiled_support(&ops.geometry)
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        run_on(&self.device, Op::Kernel(Conv3dKernel::Tiled), p, out)
    }
    fn run_device(
        &self,
        ops: &DeviceOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let op = Op::Kernel(Conv3dKernel::Tiled);
        run_device_on(&self.device, op, self, &self.layouts, ops, out)
    }
    /// The input gradient (strides whose product is at most
    /// [`TILED_MAX_STRIDE_PRODUCT`], padding at most `dilation * (k - 1)`,
    /// a flipped convolution the tiled kernel takes) and the weight
    /// gradient (at least 8 output channels per group, grids within their
    /// limits); the bias gradient is unsupported (see [`TiledTier`]).
    fn support_backward(&self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Support {
        tiled_backward_support(op, g)
    }
    /// Through the device: uploads, spreads `dy` (strided), flips, runs
    /// the tiled kernel (the input gradient) or the split-K kernel (the
    /// weight gradient), downloads.
    fn run_backward(&self, p: &Conv3dBackwardProblem<'_>, out: &mut [f32]) -> Result<()> {
        use Conv3dData::{BF16, F32};
        match (p.op, p.grad_output, p.other) {
            (Conv3dBackwardOp::Data, F32(dy), Some(F32(w))) => self.data_host(p, (dy, w), out),
            (Conv3dBackwardOp::Data, BF16(dy), Some(BF16(w))) => self.data_host(p, (dy, w), out),
            (Conv3dBackwardOp::Weight, _, _) => {
                super::tiled_wgrad::weight_on_host(&self.device, p, out)
            }
            (op, _, _) => Err(tiled_backward_refused(op)),
        }
    }
    /// On operands of this device: the zero insertion (strided), the flip,
    /// the layout and the tiled kernel (the input gradient), or the memset
    /// and the split-K kernel (the weight gradient), on the caller's stream,
    /// in place; otherwise the host path.
    fn run_backward_device(
        &self,
        ops: &DeviceBackwardOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        if !ops.stream.device().same(&self.device) {
            return run_backward_on_host_then_copy(self, ops, out);
        }
        use DeviceConv3dData::{BF16, F32};
        let (s, g) = (ops.stream, &ops.geometry);
        match (ops.op, ops.grad_output, ops.other) {
            (Conv3dBackwardOp::Data, F32(dy), Some(F32(w))) => {
                self.data_views(s, g, (&dy, &w), ops.bias, out)
            }
            (Conv3dBackwardOp::Data, BF16(dy), Some(BF16(w))) => {
                self.data_views(s, g, (&dy, &w), ops.bias, out)
            }
            (Conv3dBackwardOp::Weight, _, _) => super::tiled_wgrad::weight_on_device(ops, out),
            (op, _, _) => Err(tiled_backward_refused(op)),
        }
    }
}

/// The naive kernel (one thread per output point) on a device as a tier.
#[derive(Debug)]
pub struct NaiveTier {
    device: Device,
    layouts: LayoutScratch,
}

impl NaiveTier {
    /// The naive tier of `device`.
    pub fn new(device: Device) -> Self {
        NaiveTier {
            device,
            layouts: LayoutScratch::default(),
        }
    }
}

impl Conv3dTier for NaiveTier {
    fn kind(&self) -> TierKind {
        TierKind::Naive
    }
    fn name(&self) -> &str {
        "naive"
    }
    fn support(&self, p: &Conv3dProblem<'_>) -> Support {
        zero_size(&p.geometry).unwrap_or(Support::Yes)
    }
    fn support_device(&self, ops: &DeviceOperands<'_, '_>) -> Support {
        zero_size(&ops.geometry).unwrap_or(Support::Yes)
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        run_on(&self.device, Op::Kernel(Conv3dKernel::Naive), p, out)
    }
    fn run_device(
        &self,
        ops: &DeviceOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        let op = Op::Kernel(Conv3dKernel::Naive);
        run_device_on(&self.device, op, self, &self.layouts, ops, out)
    }
    /// The gather kernels `conv3d_bwd_*` take every backward op but
    /// zero-size ones.
    fn support_backward(&self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Support {
        match op.unsupported(g) {
            Some(why) => Support::Unsupported(why.into()),
            None => Support::Yes,
        }
    }
    fn run_backward(&self, p: &Conv3dBackwardProblem<'_>, out: &mut [f32]) -> Result<()> {
        run_backward_on(&self.device, false, p, out)
    }
    /// On operands of this device: the kernels read and write in place on
    /// the caller's stream; otherwise the host path.
    fn run_backward_device(
        &self,
        ops: &DeviceBackwardOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        if ops.stream.device().same(&self.device) {
            run_backward_views(ops, false, out)
        } else {
            run_backward_on_host_then_copy(self, ops, out)
        }
    }
}

/// The default order on `device`: vendor, tiled, naive, then the CPU.
pub fn device_tiers(device: &Device) -> Vec<Box<dyn Conv3dTier>> {
    vec![
        Box::new(VendorTier::new(device.clone())),
        Box::new(TiledTier::new(device.clone())),
        Box::new(NaiveTier::new(device.clone())),
        Box::new(CpuTier),
    ]
}
