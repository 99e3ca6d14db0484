//! The backward ops of a conv3d on a device ([`Conv3dBackwardLaunch`]:
//! the input's gradient, which is also the transposed convolution, the
//! weight's and the bias's; the first two also by the vendor library),
//! their sampled-point check
//! ([`Conv3dBackwardCheckLaunch`]), the safe entry points on [`Stream`],
//! and the host backend's emulation of both (the CPU kernels and the f64
//! references of [`crate::conv3d`]).

use super::CHECK_WORDS;
use crate::conv3d::{
    backward_reference_point, conv3d_backward_cpu, sample_index, Conv3dBackwardOp,
    Conv3dBackwardProblem, Conv3dData, Conv3dGeometry,
};
use crate::device::info::DevicePtr;
#[cfg(doc)]
use crate::device::{conv3d::CHECK_MAX_SAMPLES, raw::backend::KernelOp};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One backward call as a backend takes it (`conv3d_bwd_*` kernels), for
/// the forward convolution `geometry` (see [`crate::conv3d`]'s backward
/// docs for what each op computes):
///
/// - `grad_output`: `dy`, `geometry.output_len()` elements of `dtype`;
/// - `other`: the weight (standard layout) for [`Conv3dBackwardOp::Data`],
///   the forward input for [`Conv3dBackwardOp::Weight`], `None` for
///   [`Conv3dBackwardOp::Bias`], of `dtype`;
/// - `bias`: Data only, `in_channels` f32 added to the result (the
///   transposed convolution's bias), or `None`;
/// - `output`: `op.output_len(geometry)` f32, every element written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dBackwardLaunch {
    /// Which gradient.
    pub op: Conv3dBackwardOp,
    /// The forward convolution's sizes.
    pub geometry: Conv3dGeometry,
    /// The operands' dtype: F32 or BF16.
    pub dtype: DType,
    /// `dy`.
    pub grad_output: DevicePtr,
    /// The weight (Data) or the input (Weight).
    pub other: Option<DevicePtr>,
    /// Data only: the f32 bias.
    pub bias: Option<DevicePtr>,
    /// The f32 result.
    pub output: DevicePtr,
}

impl Conv3dBackwardLaunch {
    /// Elements of the f32 result.
    pub fn output_len(&self) -> usize {
        self.op.output_len(&self.geometry)
    }
}

/// One launch of the backward check ([`KernelOp::Conv3dBackwardCheck`]):
/// as [`super::Conv3dCheckLaunch`], for the result of `conv` (its `bias`
/// as the caller gave it, of `bias_dtype`). Sample `j` is the flat result
/// index [`sample_index`]`(result_len, seed, j)`, or with `locate` the
/// first non-finite result element; `results[4j..4j + 4]` receives
/// `(index, value, reference, magnitude)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dBackwardCheckLaunch {
    /// The backward call checked (its `output` is the result read).
    pub conv: Conv3dBackwardLaunch,
    /// The bias's dtype (F32 or BF16; ignored without a bias).
    pub bias_dtype: DType,
    /// Sampled points (`1` with `locate`), at most [`CHECK_MAX_SAMPLES`].
    pub samples: usize,
    /// The seed of the sampled points.
    pub seed: u64,
    /// `Some(slot)`: one zeroed `u64` where the device first stores
    /// `result_len - i` for the first non-finite result element `i`.
    pub locate: Option<DevicePtr>,
    /// `CHECK_WORDS * samples` `u64`s, written.
    pub results: DevicePtr,
}

pub(crate) fn operand_name(op: Conv3dBackwardOp) -> &'static str {
    match op {
        Conv3dBackwardOp::Data => "conv3d backward weight",
        _ => "conv3d backward input",
    }
}

pub(crate) fn bias_refused() -> Error {
    Error::Conv3dParam {
        param: "backward bias",
        value: vec![1],
        reason: "only the data op (the transposed convolution) takes a bias",
    }
}

/// # Safety
/// `p` holds `len` readable elements of `dtype` (F32 or BF16) that nothing
/// writes meanwhile.
unsafe fn host_data<'a>(p: DevicePtr, dtype: DType, len: usize) -> Result<Conv3dData<'a>> {
    if len == 0 {
        return Ok(match dtype {
            DType::BF16 => Conv3dData::BF16(&[]),
            _ => Conv3dData::F32(&[]),
        });
    }
    let addr = p.0 as usize;
    // SAFETY: the caller's guarantees (host "device" addresses are host
    // addresses).
    unsafe {
        Ok(match dtype {
            DType::F32 => Conv3dData::F32(std::slice::from_raw_parts(addr as *const f32, len)),
            DType::BF16 => {
                Conv3dData::BF16(std::slice::from_raw_parts(addr as *const half::bf16, len))
            }
            other => {
                return Err(Error::Conv3dDType {
                    tensor: "grad_output",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        })
    }
}

/// # Safety
/// `p` holds `len` writable `T`s that nothing else accesses meanwhile.
unsafe fn host_slice_mut<'a, T>(p: DevicePtr, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(p.0 as usize as *mut T, len) }
}

/// The problem a launch describes, over host memory.
///
/// # Safety
/// The launch's operand addresses hold their documented lengths, unwritten
/// meanwhile; `bias_dtype` is the bias's.
unsafe fn host_problem<'a>(
    a: &Conv3dBackwardLaunch,
    bias_dtype: DType,
) -> Result<Conv3dBackwardProblem<'a>> {
    let g = &a.geometry;
    // SAFETY: the caller's guarantees.
    unsafe {
        let dy = host_data(a.grad_output, a.dtype, g.output_len())?;
        let other = match (a.other, a.op.other_len(g)) {
            (Some(p), Some(n)) => Some(host_data(p, a.dtype, n)?),
            _ => None,
        };
        let bias = a
            .bias
            .map(|b| host_data(b, bias_dtype, g.in_channels))
            .transpose()?;
        Conv3dBackwardProblem::new(a.op, *g, dy, other, bias)
    }
}

/// The host backend's [`KernelOp::Conv3dBackward`]: the CPU kernels
/// ([`conv3d_backward_cpu`]).
///
/// # Safety
/// As [`crate::device::raw::Backend::run`]: the launch's addresses are live host
/// allocations of the documented lengths, `output` exclusive.
pub(crate) unsafe fn host_conv3d_backward(a: &Conv3dBackwardLaunch) -> Result<()> {
    if let Some(reason) = a.op.unsupported(&a.geometry) {
        return Err(Error::Conv3dTier {
            tier: "naive",
            reason,
        });
    }
    // SAFETY: the caller's guarantees; the output does not overlap the
    // operands (it is borrowed mutably by the safe entry point).
    unsafe {
        let p = host_problem(a, DType::F32)?;
        let out = host_slice_mut::<f32>(a.output, a.output_len());
        conv3d_backward_cpu(&p, out)
    }
}

/// The host backend's [`KernelOp::Conv3dBackwardCheck`]:
/// [`backward_reference_point`] at each point, as the kernel computes it.
///
/// # Safety
/// As [`host_conv3d_backward`], `results` (and the slot) exclusive.
pub(crate) unsafe fn host_conv3d_backward_check(a: &Conv3dBackwardCheckLaunch) -> Result<()> {
    let c = &a.conv;
    let total = c.output_len();
    // SAFETY: the caller's guarantees.
    let (p, y, results) = unsafe {
        (
            host_problem(c, a.bias_dtype)?,
            host_data(c.output, DType::F32, total)?,
            host_slice_mut::<u64>(a.results, a.samples * CHECK_WORDS),
        )
    };
    let located = match a.locate {
        Some(slot) => {
            let first = (0..total).find(|&i| y.get_f32(i).is_some_and(|v| !v.is_finite()));
            // SAFETY: the caller guarantees one exclusive u64 at `slot`.
            let s = unsafe { host_slice_mut::<u64>(slot, 1) };
            s[0] = first.map_or(0, |i| (total - i) as u64);
            Some(first)
        }
        None => None,
    };
    for (j, out) in results.chunks_exact_mut(CHECK_WORDS).enumerate() {
        let index = match located {
            Some(first) => first,
            None => sample_index(total, a.seed, j),
        };
        let point = index.and_then(|i| Some((i, backward_reference_point(&p, i)?, y.get_f32(i)?)));
        match point {
            Some((i, r, v)) => {
                out[0] = i as u64;
                out[1] = f64::from(v).to_bits();
                out[2] = r.value.to_bits();
                out[3] = r.magnitude.to_bits();
            }
            None => {
                out[0] = u64::MAX;
                for o in &mut out[1..] {
                    *o = f64::NAN.to_bits();
                }
            }
        }
    }
    Ok(())
}
