//! The GPU tiers of one device (vendor, tiled, naive), run through its backend.
//!
//! The GPU tiers, per [`Device`]: each uploads the problem, runs one
//! conv3d on the device through the [`Backend`](crate::device::Backend)
//! trait ([`Stream::conv3d`] or [`Stream::conv3d_vendor`]), and downloads
//! the output. So they run on every backend: HIP, CUDA, the host backend
//! (whose "kernels" are the CPU code, so the whole path runs in CI), and
//! [`Faults`](crate::device::faults::Faults) wrapping any of them.

use super::device_run::run_on_host_then_copy;
use super::{Conv3dTier, CpuTier, DeviceConv3dData, DeviceOperands, Support, TierKind};
use crate::conv3d::{Conv3dData, Conv3dProblem};
use crate::convert::Element;
use crate::device::{Conv3dKernel, Conv3dWeightLayout, Device, DeviceView, DeviceViewMut, Stream};
use crate::error::Result;

/// What a GPU tier runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Vendor,
    Kernel(Conv3dKernel),
}

fn zero_size(p: &Conv3dProblem<'_>) -> Option<Support> {
    Conv3dKernel::Naive
        .unsupported(&p.geometry)
        .map(|why| Support::Unsupported(why.into()))
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
        Op::Kernel(k) => s.conv3d_weight_layout(k, T::DTYPE, g),
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
        Op::Vendor => s.conv3d_vendor(g, &xd.view(), &wd.view(), bias, &mut y.view_mut())?,
        Op::Kernel(k) => s.conv3d(k, g, &xd.view(), &wd.view(), bias, &mut y.view_mut())?,
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
    p: &Conv3dProblem<'_>,
    ops: &DeviceOperands<'_, '_>,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    if !ops.stream.device().same(device) {
        return run_on_host_then_copy(tier, p, ops, out);
    }
    let s = ops.stream;
    match (ops.input, ops.weight, p.weight) {
        (DeviceConv3dData::F32(x), DeviceConv3dData::F32(w), Conv3dData::F32(hw)) => {
            run_views(s, op, p, (&x, &w, hw), ops.bias, out)
        }
        (DeviceConv3dData::BF16(x), DeviceConv3dData::BF16(w), Conv3dData::BF16(hw)) => {
            run_views(s, op, p, (&x, &w, hw), ops.bias, out)
        }
        (x, w, _) => Err(crate::Error::Conv3dDType {
            tensor: "weight",
            dtype: w.dtype(),
            expected: x.dtype(),
        }),
    }
}

/// Input and weight on the device, and the weight's host copy (laid out
/// for kernels that want another layout).
type ViewOperands<'r, 'v, T> = (&'r DeviceView<'v, T>, &'r DeviceView<'v, T>, &'r [T]);

fn run_views<T: Element + Default>(
    s: &Stream,
    op: Op,
    p: &Conv3dProblem<'_>,
    (x, w, host_w): ViewOperands<'_, '_, T>,
    bias: Option<DeviceView<'_, f32>>,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    let g = &p.geometry;
    let layout = match op {
        Op::Vendor => Conv3dWeightLayout::Standard,
        Op::Kernel(k) => s.conv3d_weight_layout(k, T::DTYPE, g),
    };
    let arranged = match layout {
        Conv3dWeightLayout::Standard => None,
        other => Some(s.clone_htod(&other.arrange(g, host_w)?)?),
    };
    let wv = match &arranged {
        Some(b) => b.view(),
        None => *w,
    };
    match op {
        Op::Vendor => s.conv3d_vendor(g, x, &wv, bias, out),
        Op::Kernel(k) => s.conv3d(k, g, x, &wv, bias, out),
    }
}

/// The vendor library of a device as a tier: MIOpen (HIP), cuDNN (CUDA).
/// Skipped as unavailable where the library is not installed (and always
/// on the host backend, which has none).
#[derive(Debug, Clone)]
pub struct VendorTier {
    device: Device,
}

impl VendorTier {
    /// The vendor tier of `device`.
    pub fn new(device: Device) -> Self {
        VendorTier { device }
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
        if let Err(e) = self.device.backend().conv3d_vendor_available() {
            return Support::Unavailable(e.to_string());
        }
        zero_size(p).unwrap_or(Support::Yes)
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        run_on(&self.device, Op::Vendor, p, out)
    }
    fn run_device(
        &self,
        p: &Conv3dProblem<'_>,
        ops: &DeviceOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        run_device_on(&self.device, Op::Vendor, self, p, ops, out)
    }
}

/// The tiled implicit-GEMM kernel on a device as a tier. Skips what the
/// kernel does not take ([`Conv3dKernel::unsupported`]: depthwise-like
/// calls, grid limits, zero sizes).
#[derive(Debug, Clone)]
pub struct TiledTier {
    device: Device,
}

impl TiledTier {
    /// The tiled tier of `device`.
    pub fn new(device: Device) -> Self {
        TiledTier { device }
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
        match Conv3dKernel::Tiled.unsupported(&p.geometry) {
            Some(why) => Support::Unsupported(why.into()),
            None => Support::Yes,
        }
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        run_on(&self.device, Op::Kernel(Conv3dKernel::Tiled), p, out)
    }
    fn run_device(
        &self,
        p: &Conv3dProblem<'_>,
        ops: &DeviceOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        run_device_on(
            &self.device,
            Op::Kernel(Conv3dKernel::Tiled),
            self,
            p,
            ops,
            out,
        )
    }
}

/// The naive kernel (one thread per output point) on a device as a tier.
#[derive(Debug, Clone)]
pub struct NaiveTier {
    device: Device,
}

impl NaiveTier {
    /// The naive tier of `device`.
    pub fn new(device: Device) -> Self {
        NaiveTier { device }
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
        zero_size(p).unwrap_or(Support::Yes)
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        run_on(&self.device, Op::Kernel(Conv3dKernel::Naive), p, out)
    }
    fn run_device(
        &self,
        p: &Conv3dProblem<'_>,
        ops: &DeviceOperands<'_, '_>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<()> {
        run_device_on(
            &self.device,
            Op::Kernel(Conv3dKernel::Naive),
            self,
            p,
            ops,
            out,
        )
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
