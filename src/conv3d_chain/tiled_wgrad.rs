//! The tiled tier's weight gradient: the split-K tiled kernel
//! ([`Conv3dOps::backward_weight_tiled`](crate::device::Conv3dOps::backward_weight_tiled)) on host operands (uploaded,
//! run, downloaded) and on device operands (in place on the caller's
//! stream), and which geometries it takes.

use super::{DeviceBackwardOperands, DeviceConv3dData, Support};
use crate::conv3d::{Conv3dBackwardProblem, Conv3dData, Conv3dGeometry};
use crate::convert::Element;
use crate::device::{raw::tiled_wgrad_unsupported, Device, DeviceViewMut, Stream};
use crate::error::{Error, Result};

/// Whether the tiled tier takes the weight gradient of `g`
/// ([`tiled_wgrad_unsupported`]).
pub(super) fn weight_support(g: &Conv3dGeometry) -> Support {
    match tiled_wgrad_unsupported(g) {
        Some(why) => Support::Unsupported(format!(
            "the tiled weight gradient: {why} (the naive tier serves)"
        )),
        None => Support::Yes,
    }
}

fn refused() -> Error {
    Error::Conv3dTier {
        tier: "tiled",
        reason: "the weight gradient takes the input and dy of one dtype (f32 or bf16)",
    }
}

/// The weight gradient of `p` on a stream of `device`: uploads the input
/// and `dy`, runs the tiled kernel, downloads into `out` (waits).
pub(super) fn weight_on_host(
    device: &Device,
    p: &Conv3dBackwardProblem<'_>,
    out: &mut [f32],
) -> Result<()> {
    fn typed<T: Element>(
        s: &Stream,
        g: &Conv3dGeometry,
        (x, dy): (&[T], &[T]),
        out: &mut [f32],
    ) -> Result<()> {
        let xd = s.clone_htod(x)?;
        let dyd = s.clone_htod(dy)?;
        let mut dw = s.alloc_zeros::<f32>(out.len())?;
        s.conv3d_ops()
            .backward_weight_tiled(g, &xd.view(), &dyd.view(), &mut dw.view_mut())?;
        // Waits for the stream.
        dw.copy_dtoh(out)
    }
    let s = device.stream()?;
    match (p.grad_output, p.other) {
        (Conv3dData::F32(dy), Some(Conv3dData::F32(x))) => typed(&s, &p.geometry, (x, dy), out),
        (Conv3dData::BF16(dy), Some(Conv3dData::BF16(x))) => typed(&s, &p.geometry, (x, dy), out),
        _ => Err(refused()),
    }
}

/// The weight gradient of operands on the stream's device, in place on
/// the caller's stream (no host copy, no wait).
pub(super) fn weight_on_device(
    ops: &DeviceBackwardOperands<'_, '_>,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    use DeviceConv3dData::{BF16, F32};
    let (s, g) = (ops.stream, &ops.geometry);
    match (ops.grad_output, ops.other) {
        (F32(dy), Some(F32(x))) => s.conv3d_ops().backward_weight_tiled(g, &x, &dy, out),
        (BF16(dy), Some(BF16(x))) => s.conv3d_ops().backward_weight_tiled(g, &x, &dy, out),
        _ => Err(refused()),
    }
}
