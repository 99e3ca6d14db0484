//! The conv3d chain's work on the device besides the convolution itself:
//! the sampled-point check ([`Conv3dCheckLaunch`], [`Conv3dOps::check`](crate::device::Conv3dOps::check))
//! and the weight layouts of the tiled kernels made on the device
//! ([`Conv3dLayoutLaunch`], [`Conv3dOps::arrange_weight`](crate::device::Conv3dOps::arrange_weight)), with the
//! host backend's emulation of both.
//!
//! The check recomputes sampled output points in f64 (every product of two
//! f32 or widened bf16 values is exact in f64) from the operands where they
//! are, and reads the tier's value at each point, so one small read-back
//! per check replaces host copies of the operands and one read per point.

use super::layout::check_len;
use super::{Conv3dLaunch, Conv3dWeightLayout};
use crate::conv3d::{reference_point, sample_index, Conv3dData, Conv3dGeometry, Conv3dProblem};
use crate::device::info::DevicePtr;
#[cfg(doc)]
use crate::device::raw::backend::KernelOp;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// `u64` words of [`Conv3dCheckLaunch::results`] per sampled point.
pub const CHECK_WORDS: usize = 4;

/// Most sampled points of one check launch (its grid's x dimension).
pub const CHECK_MAX_SAMPLES: usize = 1 << 16;

/// One launch of the device check ([`KernelOp::Conv3dCheck`]).
///
/// Sample `j < samples` is the flat output index
/// [`sample_index`]`(output_len, seed, j)`; with `locate`, the single
/// sample is the first output point holding a NaN or an infinity, found on
/// the device. For each, `results[4j..4j + 4]` receives `(index, value,
/// reference, magnitude)`: the index as a `u64` (`u64::MAX` when there is
/// no such point), the other three as the bits of `f64`s (the tier's f32
/// value widened, the f64 recomputation, and `|bias| + sum |x * w|`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dCheckLaunch {
    /// The convolution checked: input, weight in the standard layout,
    /// output (of `output_dtype`); `conv.bias` is the bias as the caller
    /// gave it, of `bias_dtype`.
    pub conv: Conv3dLaunch,
    /// The bias's dtype (F32 or BF16; ignored without a bias).
    pub bias_dtype: DType,
    /// The output's dtype: F32 (every tier's), or BF16 (another library's
    /// bf16 result; not with `locate`).
    pub output_dtype: DType,
    /// Sampled points (`1` with `locate`), at most [`CHECK_MAX_SAMPLES`].
    pub samples: usize,
    /// The seed of the sampled points.
    pub seed: u64,
    /// `Some(slot)`: one `u64` the caller zeroed, where the device first
    /// stores `output_len - i` for the first non-finite output point `i`
    /// (0 when none); the check then recomputes that point.
    pub locate: Option<DevicePtr>,
    /// `CHECK_WORDS * samples` `u64`s, written.
    pub results: DevicePtr,
}

/// One rearrangement of a conv3d weight ([`KernelOp::Conv3dLayout`]): the
/// standard-layout weight at `src` (`geometry.weight_shape()` elements of
/// `dtype`) into `layout` at `dst` (`layout.len(geometry)` elements, every
/// one written: zero padding included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dLayoutLaunch {
    /// The convolution's sizes.
    pub geometry: Conv3dGeometry,
    /// The elements' dtype (F32 or BF16).
    pub dtype: DType,
    /// The layout made: [`Conv3dWeightLayout::TiledTransposed`] or
    /// [`Conv3dWeightLayout::TiledPacked`].
    pub layout: Conv3dWeightLayout,
    /// The standard-layout weight.
    pub src: DevicePtr,
    /// The destination.
    pub dst: DevicePtr,
    /// A gate (one `u64`): the layout is made only when it is non-zero as
    /// the kernel starts (the guarded fallback's repair); `None` always.
    pub gate: Option<DevicePtr>,
}

/// One sampled point as the device check read it back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckedPoint {
    /// The flat output index; `None` when there was no such point (nothing
    /// located).
    pub index: Option<usize>,
    /// The tier's value there.
    pub value: f32,
    /// The f64 recomputation.
    pub reference: f64,
    /// `|bias| + sum |x * w|` of the point.
    pub magnitude: f64,
}

impl CheckedPoint {
    /// The points of a read-back results buffer ([`CHECK_WORDS`] words
    /// each; a trailing partial point is ignored).
    pub fn decode(words: &[u64]) -> Vec<CheckedPoint> {
        words
            .chunks_exact(CHECK_WORDS)
            .map(|w| CheckedPoint {
                index: usize::try_from(w[0]).ok().filter(|_| w[0] != u64::MAX),
                value: f64::from_bits(w[1]) as f32,
                reference: f64::from_bits(w[2]),
                magnitude: f64::from_bits(w[3]),
            })
            .collect()
    }
}

/// # Safety
/// `p` holds `len` readable `T`s that nothing writes meanwhile.
unsafe fn host_slice<'a, T>(p: DevicePtr, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller (host "device" addresses are host
    // addresses).
    unsafe { std::slice::from_raw_parts(p.0 as usize as *const T, len) }
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

/// # Safety
/// `p` holds `len` readable elements of `dtype` (F32 or BF16).
unsafe fn host_data<'a>(p: DevicePtr, dtype: DType, len: usize) -> Result<Conv3dData<'a>> {
    // SAFETY: the caller's guarantees.
    unsafe {
        Ok(match dtype {
            DType::F32 => Conv3dData::F32(host_slice(p, len)),
            DType::BF16 => Conv3dData::BF16(host_slice(p, len)),
            other => {
                return Err(Error::Conv3dDType {
                    tensor: "input",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        })
    }
}

/// The host backend's [`KernelOp::Conv3dCheck`]: [`reference_point`] at
/// each point, as the kernel computes it.
///
/// # Safety
/// As [`crate::device::raw::Backend::run`]: the launch's addresses are live
/// host allocations of the documented lengths, `results` (and the slot)
/// exclusive.
pub(crate) unsafe fn host_conv3d_check(a: &Conv3dCheckLaunch) -> Result<()> {
    let c = &a.conv;
    // SAFETY: a gate is one live u64 (the caller's guarantee).
    if unsafe { super::gate::host_gate_closed(c.gate) } {
        return Ok(());
    }
    let g = &c.geometry;
    let total = g.output_len();
    // SAFETY: the caller guarantees the lengths and exclusivity.
    let (x, w, bias, y, results) = unsafe {
        (
            host_data(c.input, c.dtype, g.input_shape().iter().product())?,
            host_data(c.weight, c.dtype, g.weight_shape().iter().product())?,
            c.bias
                .map(|b| host_data(b, a.bias_dtype, g.out_channels))
                .transpose()?,
            host_data(c.output, a.output_dtype, total)?,
            host_slice_mut::<u64>(a.results, a.samples * CHECK_WORDS),
        )
    };
    let p = Conv3dProblem::new(g.params, x, &g.input_shape(), w, &g.weight_shape(), bias)?;
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
        let point = index.and_then(|i| Some((i, reference_point(&p, i)?, y.get_f32(i)?)));
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

/// The host backend's [`KernelOp::Conv3dLayout`]: [`Conv3dWeightLayout::arrange`].
///
/// # Safety
/// As [`host_conv3d_check`]: `src` holds the weight, `dst` the layout's
/// length, exclusive.
pub(crate) unsafe fn host_conv3d_layout(a: &Conv3dLayoutLaunch) -> Result<()> {
    // SAFETY: a gate is one live u64 (the caller's guarantee).
    if unsafe { super::gate::host_gate_closed(a.gate) } {
        return Ok(());
    }
    let g = &a.geometry;
    let (n, m) = (g.weight_shape().iter().product(), a.layout.len(g));
    match a.dtype {
        // SAFETY: the caller's guarantees.
        DType::F32 => unsafe { arrange_into::<f32>(a, n, m) },
        // SAFETY: the caller's guarantees.
        DType::BF16 => unsafe { arrange_into::<half::bf16>(a, n, m) },
        other => Err(Error::Conv3dDType {
            tensor: "weight",
            dtype: other,
            expected: DType::F32,
        }),
    }
}

/// # Safety
/// As [`host_conv3d_layout`], with `n` source and `m` destination elements.
unsafe fn arrange_into<T: Copy + Default + Send + Sync>(
    a: &Conv3dLayoutLaunch,
    n: usize,
    m: usize,
) -> Result<()> {
    // SAFETY: the caller's guarantees.
    let (src, dst) = unsafe { (host_slice::<T>(a.src, n), host_slice_mut::<T>(a.dst, m)) };
    let arranged = a.layout.arrange(&a.geometry, src)?;
    check_len("conv3d layout destination", dst.len(), arranged.len())?;
    dst.copy_from_slice(&arranged);
    Ok(())
}
