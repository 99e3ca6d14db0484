//! The conv3d chain's work on the device besides the convolution itself:
//! the sampled-point check ([`Conv3dCheckLaunch`], [`Stream::conv3d_check`])
//! and the weight layouts of the tiled kernels made on the device
//! ([`Conv3dLayoutLaunch`], [`Stream::conv3d_arrange_weight`]), with the
//! host backend's emulation of both.
//!
//! The check recomputes sampled output points in f64 (every product of two
//! f32 or widened bf16 values is exact in f64) from the operands where they
//! are, and reads the tier's value at each point, so one small read-back
//! per check replaces host copies of the operands and one read per point.

use super::layout::check_len;
use super::{Conv3dLaunch, Conv3dWeightLayout};
use crate::conv3d::{reference_point, sample_index, Conv3dData, Conv3dGeometry, Conv3dProblem};
use crate::convert::Element;
use crate::device::backend::KernelOp;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::info::DevicePtr;
use crate::device::stream::Stream;
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

/// The bias of a check, as the caller holds it (f32 or bf16).
pub type CheckBias<'r, 'v, B> = Option<&'r DeviceView<'v, B>>;

/// A check's operands and the output checked: input, weight, bias,
/// output (the input's and weight's dtype `T`, the bias's `B`, the
/// output's `Y`).
pub type CheckOperands<'r, 'v, T, B, Y> = (
    &'r DeviceView<'v, T>,
    &'r DeviceView<'v, T>,
    CheckBias<'r, 'v, B>,
    &'r DeviceView<'v, Y>,
);

impl Stream {
    /// Queues the device check of a conv3d's output on this stream (no
    /// synchronisation; read `results` back after it): `samples` points
    /// of [`sample_index`]`(output_len, seed, j)`, or with `locate` (one
    /// `u64`, zeroed here) the first non-finite output point. `weight` is
    /// in the standard layout; `bias` (f32 or bf16) as given; `output` f32,
    /// or bf16 (an output another library computed; not with `locate`).
    /// `results`
    /// holds [`CHECK_WORDS`] words per point (see [`Conv3dCheckLaunch`];
    /// decode with [`CheckedPoint::decode`]).
    ///
    /// Errors: [`Error::Conv3dDType`] for operands, a bias or an output
    /// other than f32 / bf16, or a bf16 output with `locate`;
    /// [`Error::DeviceMismatch`];
    /// [`Error::LengthMismatch`] for a view whose length is not its
    /// shape's, a `results` shorter than the points need, a `locate` slot
    /// that is not one element, or `samples` not 1 with `locate`;
    /// [`Error::Conv3dTier`] for zero-size calls or more than
    /// [`CHECK_MAX_SAMPLES`] points; the backend's launch error.
    #[allow(clippy::too_many_arguments)]
    pub fn conv3d_check<T: Element, B: Element, Y: Element>(
        &self,
        g: &Conv3dGeometry,
        input: &DeviceView<'_, T>,
        weight: &DeviceView<'_, T>,
        bias: CheckBias<'_, '_, B>,
        output: &DeviceView<'_, Y>,
        sampling: (usize, u64),
        locate: Option<&mut DeviceViewMut<'_, u64>>,
        results: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        let operands = (input, weight, bias, output);
        self.conv3d_check_gated(g, operands, sampling, locate, results, None)
    }

    /// [`Stream::conv3d_check`] with a `gate` (one `u64` of this device):
    /// the check runs only when the gate is non-zero as it starts (the
    /// guarded fallback's check of work it may skip; `None` runs always).
    /// Operands: input, weight, bias, output.
    ///
    /// Errors: as [`Stream::conv3d_check`], and [`Error::LengthMismatch`]
    /// for a gate that is not one element.
    pub fn conv3d_check_gated<T: Element, B: Element, Y: Element>(
        &self,
        g: &Conv3dGeometry,
        (input, weight, bias, output): CheckOperands<'_, '_, T, B, Y>,
        (samples, seed): (usize, u64),
        locate: Option<&mut DeviceViewMut<'_, u64>>,
        results: &mut DeviceViewMut<'_, u64>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "conv3d_check";
        let mut launch = self.check_launch(
            g,
            (input, weight, bias, output),
            (samples, seed),
            results,
            gate,
        )?;
        let slot = match locate {
            Some(_) if Y::DTYPE != DType::F32 => {
                return Err(Error::Conv3dDType {
                    tensor: "output",
                    dtype: Y::DTYPE,
                    expected: DType::F32,
                })
            }
            Some(slot) => {
                self.check_device(OP, slot.device())?;
                check_len("conv3d check locate slot", 1, slot.len())?;
                check_len("conv3d check located samples", 1, samples)?;
                slot.memset_zero(self)?;
                Some(slot.device_ptr())
            }
            None => None,
        };
        if samples == 0 {
            return Ok(());
        }
        launch.locate = slot;
        // SAFETY: every view is a live range of this stream's device with
        // its shape's length (checked above), aligned to its element;
        // `results` (at least `CHECK_WORDS * samples` words) and the slot
        // are borrowed mutably, so nothing else accesses them; the operands
        // and the output are only read; the call is not zero-sized.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dCheck { args: &launch }, self.raw())
        }
    }

    /// The launch of a check of `samples` points of the call `g` into
    /// `results` (no located point), every range validated as
    /// [`Stream::conv3d_check_gated`] documents; `samples` may be 0.
    pub(super) fn check_launch<T: Element, B: Element, Y: Element>(
        &self,
        g: &Conv3dGeometry,
        (input, weight, bias, output): CheckOperands<'_, '_, T, B, Y>,
        (samples, seed): (usize, u64),
        results: &DeviceViewMut<'_, u64>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<Conv3dCheckLaunch> {
        const OP: &str = "conv3d_check";
        let gate = self.gate_ptr((OP, "conv3d check gate"), gate)?;
        let checked = [
            ("input", T::DTYPE),
            ("bias", B::DTYPE),
            ("output", Y::DTYPE),
        ];
        for (tensor, dtype) in checked {
            if !matches!(dtype, DType::F32 | DType::BF16) {
                return Err(Error::Conv3dDType {
                    tensor,
                    dtype,
                    expected: DType::F32,
                });
            }
        }
        for d in [input.device(), weight.device(), output.device()] {
            self.check_device(OP, d)?;
        }
        self.check_device(OP, results.device())?;
        if let Some(b) = bias {
            self.check_device(OP, b.device())?;
            check_len("conv3d check bias", g.out_channels, b.len())?;
        }
        let product = |s: [usize; 5]| s.iter().product::<usize>();
        check_len("conv3d check input", product(g.input_shape()), input.len())?;
        check_len(
            "conv3d check weight",
            product(g.weight_shape()),
            weight.len(),
        )?;
        check_len("conv3d check output", g.output_len(), output.len())?;
        if let Some(reason) = super::Conv3dKernel::Naive.unsupported(g) {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason,
            });
        }
        if samples > CHECK_MAX_SAMPLES {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason: "more sampled points than one check launch takes",
            });
        }
        if results.len() < samples * CHECK_WORDS {
            return Err(Error::LengthMismatch {
                op: "conv3d check results",
                expected: samples * CHECK_WORDS,
                actual: results.len(),
                tensor: None,
            });
        }
        Ok(Conv3dCheckLaunch {
            conv: Conv3dLaunch {
                geometry: *g,
                dtype: T::DTYPE,
                input: input.device_ptr(),
                weight: weight.device_ptr(),
                bias: bias.map(|b| b.device_ptr()),
                output: output.device_ptr(),
                output_dtype: Y::DTYPE,
                gate,
            },
            bias_dtype: B::DTYPE,
            output_dtype: Y::DTYPE,
            samples,
            seed,
            locate: None,
            results: results.device_ptr(),
        })
    }

    /// Queues the rearrangement of `src` (a standard-layout weight of the
    /// call `g`) into `layout` at `dst` on this stream: the layout a tiled
    /// kernel reads ([`Stream::conv3d_weight_layout`]), made on the device.
    /// [`Conv3dWeightLayout::Standard`] is a device-to-device copy.
    ///
    /// Errors: [`Error::Conv3dDType`] for a `T` other than f32 and bf16, or
    /// a packed layout of f32; [`Error::DeviceMismatch`];
    /// [`Error::LengthMismatch`] for a `src` that is not the weight's length
    /// or a `dst` that is not the layout's; [`Error::Conv3dTier`] for a
    /// zero-size weight; the backend's launch error.
    pub fn conv3d_arrange_weight<T: Element>(
        &self,
        layout: Conv3dWeightLayout,
        g: &Conv3dGeometry,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        self.conv3d_arrange_weight_gated(layout, g, src, dst, None)
    }

    /// [`Stream::conv3d_arrange_weight`] behind a `gate` (one `u64` of this
    /// device: the layout is made only when it is non-zero as the kernel
    /// starts; the guarded fallback's repair). The standard layout (a
    /// copy) takes no gate.
    ///
    /// Errors: as [`Stream::conv3d_arrange_weight`];
    /// [`Error::LengthMismatch`] for a gate that is not one element;
    /// [`Error::Conv3dTier`] for a gate on the standard layout.
    pub fn conv3d_arrange_weight_gated<T: Element>(
        &self,
        layout: Conv3dWeightLayout,
        g: &Conv3dGeometry,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "conv3d_layout";
        let gate = self.gate_ptr((OP, "conv3d layout gate"), gate)?;
        if gate.is_some() && layout == Conv3dWeightLayout::Standard {
            return Err(Error::Conv3dTier {
                tier: "layout",
                reason: "the standard layout is a copy and takes no gate",
            });
        }
        let packed = matches!(layout, Conv3dWeightLayout::TiledPacked { .. });
        if !matches!(T::DTYPE, DType::F32 | DType::BF16) || (packed && T::DTYPE != DType::BF16) {
            return Err(Error::Conv3dDType {
                tensor: "weight",
                dtype: T::DTYPE,
                expected: if packed { DType::BF16 } else { DType::F32 },
            });
        }
        self.check_device(OP, src.device())?;
        self.check_device(OP, dst.device())?;
        check_len(
            "conv3d layout source",
            g.weight_shape().iter().product(),
            src.len(),
        )?;
        check_len("conv3d layout destination", layout.len(g), dst.len())?;
        if src.is_empty() || dst.is_empty() {
            return Err(Error::Conv3dTier {
                tier: "layout",
                reason: "zero-size tensors are not sent to a device",
            });
        }
        if layout == Conv3dWeightLayout::Standard {
            return dst.copy_dtod(self, src);
        }
        let launch = Conv3dLayoutLaunch {
            geometry: *g,
            dtype: T::DTYPE,
            layout,
            src: src.device_ptr(),
            dst: dst.device_ptr(),
            gate,
        };
        // SAFETY: `src` and `dst` are live ranges of this stream's device
        // of the weight's and the layout's lengths (checked), aligned to
        // their element; `dst` is borrowed mutably; the op is not empty.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dLayout { args: &launch }, self.raw())
        }
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
/// As [`crate::device::Backend::run`]: the launch's addresses are live
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
