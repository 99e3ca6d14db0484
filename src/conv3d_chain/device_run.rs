//! The chain over device memory: operands and output another framework
//! owns (DLPack imports), on the caller's stream.
//!
//! [`Conv3dChain::run_device`] runs the same tiers, in the same order, with
//! the same skips, checks, statistics and report as
//! [`Conv3dChain::run_into`], but the GPU tiers of the operands' device read
//! the input and weight where they are and write the output in place, on
//! the caller's stream ([`Conv3dTier::run_device`]); the other tiers (the
//! CPU tier, a chain of another device) compute on the host and copy the
//! output in. The checks run on the device output: the non-finite scan on
//! the device ([`Stream::count_nonfinite`]), the sampled f64 points from
//! host copies of the operands, made once per call (the CPU tier and the
//! tiled kernel's weight layout use them too).

use half::bf16;

use super::chain::sample_points;
use super::{Conv3dChain, Conv3dReport, Conv3dTier};
use crate::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem, ShapeDim};
use crate::device::{DeviceView, DeviceViewMut, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fallback::Failure;

/// An input, weight or bias of a conv3d in device memory, compact
/// row-major.
#[derive(Debug, Clone, Copy)]
pub enum DeviceConv3dData<'a> {
    /// f32 elements.
    F32(DeviceView<'a, f32>),
    /// bf16 elements (widened exactly by every tier).
    BF16(DeviceView<'a, bf16>),
}

impl DeviceConv3dData<'_> {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            DeviceConv3dData::F32(_) => DType::F32,
            DeviceConv3dData::BF16(_) => DType::BF16,
        }
    }

    fn check_device(&self, stream: &Stream, op: &'static str) -> Result<()> {
        let same = match self {
            DeviceConv3dData::F32(v) => stream.device().same(v.device()),
            DeviceConv3dData::BF16(v) => stream.device().same(v.device()),
        };
        if same {
            Ok(())
        } else {
            Err(Error::DeviceMismatch { op })
        }
    }

    fn to_host(self, stream: &Stream) -> Result<HostData> {
        Ok(match self {
            DeviceConv3dData::F32(v) => HostData::F32(v.to_vec(stream)?),
            DeviceConv3dData::BF16(v) => HostData::BF16(v.to_vec(stream)?),
        })
    }
}

/// A host copy of a device operand.
enum HostData {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
}

impl HostData {
    fn data(&self) -> Conv3dData<'_> {
        match self {
            HostData::F32(v) => Conv3dData::F32(v),
            HostData::BF16(v) => Conv3dData::BF16(v),
        }
    }
}

/// What [`Conv3dTier::run_device`] gets besides the problem: the stream,
/// the operands on the device (the values of the problem's host copies)
/// and the bias widened to f32 on the device.
#[derive(Debug)]
pub struct DeviceOperands<'r, 'a> {
    /// The caller's stream: every tier's device work is queued on it.
    pub stream: &'r Stream,
    /// The input `[N, C, D, H, W]`.
    pub input: DeviceConv3dData<'a>,
    /// The weight `[K, C/G, KD, KH, KW]`, standard layout.
    pub weight: DeviceConv3dData<'a>,
    /// The bias `[K]` in f32, if any.
    pub bias: Option<DeviceView<'r, f32>>,
}

/// The default [`Conv3dTier::run_device`]: the tier's host `run`, then a
/// copy of the output into `out` on the operands' stream (waits).
pub(super) fn run_on_host_then_copy(
    tier: &(impl Conv3dTier + ?Sized),
    problem: &Conv3dProblem<'_>,
    ops: &DeviceOperands<'_, '_>,
    out: &mut DeviceViewMut<'_, f32>,
) -> Result<()> {
    let mut host = Vec::new();
    host.try_reserve_exact(out.len())
        .map_err(|_| Error::OutOfMemory {
            backend: "host",
            op: "conv3d host output",
            bytes: (out.len() as u64).saturating_mul(4),
        })?;
    host.resize(out.len(), 0f32);
    tier.run(problem, &mut host)?;
    out.copy_htod(ops.stream, &host)
}

impl Conv3dChain {
    /// Computes a conv3d whose operands and output are device memory of
    /// `stream`'s device (tensors borrowed from PyTorch through DLPack, say),
    /// on `stream`, returning the report. Input `[N, C, D, H, W]` and weight
    /// `[K, C/G, KD, KH, KW]` of one dtype (f32 or bf16), bias `[K]` of
    /// either; `out` is the f32 output `[N, K, OD, OH, OW]`, written in
    /// place.
    ///
    /// Work the caller queued on `stream` before the call (what wrote the
    /// operands) is ordered before the chain reads them: the host copies of
    /// the operands are taken on `stream`. The output is complete when this
    /// returns: every tier's work runs on `stream` and the checks wait for
    /// it. GPU tiers of another device, and the CPU tier, compute on the
    /// host and copy the output in.
    ///
    /// Errors: [`Error::DeviceMismatch`] when an operand is not on
    /// `stream`'s device; the shape and parameter errors of
    /// [`Conv3dProblem::new`]; [`Error::LengthMismatch`] for an `out` of
    /// another length; [`Error::Conv3dNoTier`] and [`Error::Conv3dOverflow`]
    /// as [`Conv3dChain::run_into`]; errors of the host copies.
    #[allow(clippy::too_many_arguments)]
    pub fn run_device<D: ShapeDim>(
        &self,
        stream: &Stream,
        params: Conv3dParams,
        input: DeviceConv3dData<'_>,
        input_shape: &[D],
        weight: DeviceConv3dData<'_>,
        weight_shape: &[D],
        bias: Option<DeviceConv3dData<'_>>,
        out: &mut DeviceViewMut<'_, f32>,
    ) -> Result<Conv3dReport> {
        input.check_device(stream, "conv3d_device input")?;
        weight.check_device(stream, "conv3d_device weight")?;
        if let Some(b) = &bias {
            b.check_device(stream, "conv3d_device bias")?;
        }
        if !stream.device().same(out.device()) {
            return Err(Error::DeviceMismatch {
                op: "conv3d_device output",
            });
        }
        let hx = input.to_host(stream)?;
        let hw = weight.to_host(stream)?;
        let hb = bias.map(|b| b.to_host(stream)).transpose()?;
        let problem = Conv3dProblem::new(
            params,
            hx.data(),
            input_shape,
            hw.data(),
            weight_shape,
            hb.as_ref().map(HostData::data),
        )?;
        let expected = problem.geometry.output_len();
        if out.len() != expected {
            return Err(Error::LengthMismatch {
                op: "conv3d device output",
                expected,
                actual: out.len(),
            });
        }
        let bias_f32 = match problem.bias {
            Some(_) => {
                let b: Vec<f32> = (0..problem.geometry.out_channels)
                    .map(|k| problem.bias_f32(k))
                    .collect();
                Some(stream.clone_htod(&b)?)
            }
            None => None,
        };
        let ops = DeviceOperands {
            stream,
            input,
            weight,
            bias: bias_f32.as_ref().map(|b| b.view()),
        };
        let samples = sample_points(expected, self.options().verify_samples, self.options().seed);
        self.run_tiers(&problem, |tier| {
            tier.run_device(&problem, &ops, out)
                .map_err(Failure::Error)?;
            let first_bad = || first_non_finite_on_device(stream, out);
            let value_at = |i: usize| -> std::result::Result<Option<f32>, Failure> {
                let one = out
                    .as_view()
                    .slice(i..i + 1)
                    .and_then(|v| v.to_vec(stream))
                    .map_err(Failure::Error)?;
                Ok(one.first().copied())
            };
            self.check(&problem, &samples, first_bad, value_at)
        })
    }
}

/// The first NaN or infinity of a device output: a count on the device,
/// and only when there is one, a host copy to find it.
fn first_non_finite_on_device(
    stream: &Stream,
    out: &DeviceViewMut<'_, f32>,
) -> std::result::Result<Option<(usize, f32)>, Failure> {
    let n = stream
        .count_nonfinite(&out.as_view())
        .map_err(Failure::Error)?;
    if n.nan == 0 && n.inf == 0 {
        return Ok(None);
    }
    let host = out.as_view().to_vec(stream).map_err(Failure::Error)?;
    Ok(host
        .iter()
        .enumerate()
        .find(|(_, v)| !v.is_finite())
        .map(|(i, &v)| (i, v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d_chain::TierKind;
    use crate::device::Device;

    #[test]
    fn device_run_matches_host_run_on_the_host_backend() -> Result<()> {
        let dev = Device::host();
        let s = dev.stream()?;
        let x: Vec<f32> = (0..2 * 4 * 5 * 6 * 7)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
            .collect();
        let w: Vec<f32> = (0..8 * 4 * 3 * 3 * 3)
            .map(|i| ((i * 13 % 29) as f32 - 14.0) / 30.0)
            .collect();
        let b: Vec<f32> = (0..8).map(|k| k as f32 / 4.0).collect();
        let params = Conv3dParams::default()
            .with_padding([1, 0, 1])
            .with_stride([1, 2, 1]);
        let (xs, ws) = ([2usize, 4, 5, 6, 7], [8usize, 4, 3, 3, 3]);
        let p = Conv3dProblem::new(
            params,
            Conv3dData::F32(&x),
            &xs,
            Conv3dData::F32(&w),
            &ws,
            Some(Conv3dData::F32(&b)),
        )?;
        let chain = Conv3dChain::for_device(&dev);
        let (expected, _) = chain.run(&p)?;
        let (xd, wd, bd) = (s.clone_htod(&x)?, s.clone_htod(&w)?, s.clone_htod(&b)?);
        let mut out = s.alloc_zeros::<f32>(expected.len())?;
        let report = chain.run_device(
            &s,
            params,
            DeviceConv3dData::F32(xd.view()),
            &xs,
            DeviceConv3dData::F32(wd.view()),
            &ws,
            Some(DeviceConv3dData::F32(bd.view())),
            &mut out.view_mut(),
        )?;
        assert_eq!(report.served_by(), Some(TierKind::Tiled));
        let got = out.to_vec()?;
        for (g, e) in got.iter().zip(&expected) {
            assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
        }
        // A wrong output length is refused before any tier runs.
        let mut short = s.alloc_zeros::<f32>(3)?;
        assert!(chain
            .run_device(
                &s,
                params,
                DeviceConv3dData::F32(xd.view()),
                &xs,
                DeviceConv3dData::F32(wd.view()),
                &ws,
                None,
                &mut short.view_mut(),
            )
            .is_err());
        Ok(())
    }
}
