//! Gradients of a conv3d and the transposed convolution: the problem
//! ([`Conv3dBackwardProblem`]), the f64 references and the CPU kernels.
//!
//! Every backward op is described by the *forward* convolution's
//! [`Conv3dGeometry`] `g`: input `x` `[N, C, D, H, W]`, weight `w`
//! `[K, C/G, KD, KH, KW]`, output gradient `dy` `[N, K, OD, OH, OW]`:
//!
//! - [`Conv3dBackwardOp::Data`]: `dx[n, c, z, y, x] = sum dy[n, k, o] *
//!   w[k, c - g*C/G, t]` over the output channels `k` of `c`'s group and the
//!   taps `t` with `o * stride + t * dilation - padding = (z, y, x)`: the
//!   transposed convolution of `dy` with `w` (so `conv_transpose3d` is
//!   this op, [`Conv3dGeometry::transposed`], with an optional bias per
//!   output channel).
//! - [`Conv3dBackwardOp::Weight`]: `dw[k, ci, t] = sum over n and o of
//!   dy[n, k, o] * x[n, g*C/G + ci, o * stride + t * dilation - padding]`
//!   (zero in the padding).
//! - [`Conv3dBackwardOp::Bias`]: `db[k] = sum over n and o of dy[n, k, o]`.
//!
//! A geometry's output may be smaller than the forward formula gives (the
//! transposed convolution with `output_padding >= stride`): every formula
//! above only ranges over the output the geometry has.

use std::borrow::Cow;

use rayon::prelude::*;

use super::params::{Conv3dData, Conv3dGeometry, Conv3dParams, ShapeDim};
use super::reference::RefPoint;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Which gradient of a forward convolution (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum Conv3dBackwardOp {
    /// The input's gradient `[N, C, D, H, W]` from `dy` and the weight (the
    /// transposed convolution).
    Data,
    /// The weight's gradient `[K, C/G, KD, KH, KW]` from the input and `dy`.
    Weight,
    /// The bias's gradient `[K]` from `dy`.
    Bias,
}

impl Conv3dBackwardOp {
    /// `"data"`, `"weight"` or `"bias"`.
    pub fn name(self) -> &'static str {
        match self {
            Conv3dBackwardOp::Data => "data",
            Conv3dBackwardOp::Weight => "weight",
            Conv3dBackwardOp::Bias => "bias",
        }
    }

    /// Elements of this op's (f32) result for the forward convolution `g`.
    pub fn output_len(self, g: &Conv3dGeometry) -> usize {
        match self {
            Conv3dBackwardOp::Data => g.input_shape().iter().product(),
            Conv3dBackwardOp::Weight => g.weight_shape().iter().product(),
            Conv3dBackwardOp::Bias => g.out_channels,
        }
    }

    /// Elements of the operand besides `dy` (the weight for `Data`, the
    /// input for `Weight`; none for `Bias`).
    pub fn other_len(self, g: &Conv3dGeometry) -> Option<usize> {
        match self {
            Conv3dBackwardOp::Data => Some(g.weight_shape().iter().product()),
            Conv3dBackwardOp::Weight => Some(g.input_shape().iter().product()),
            Conv3dBackwardOp::Bias => None,
        }
    }

    /// Why a device kernel cannot take this op on `g`, if it cannot:
    /// zero-size tensors are never sent to a device.
    pub fn unsupported(self, g: &Conv3dGeometry) -> Option<&'static str> {
        let zero = g.output_len() == 0 || self.output_len(g) == 0 || {
            let other = self.other_len(g);
            other == Some(0)
        };
        zero.then_some("zero-size tensors are not sent to a device")
    }
}

impl std::fmt::Display for Conv3dBackwardOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn shape_err(tensor: &'static str, shape: Vec<usize>, reason: &'static str) -> Error {
    Error::Conv3dShape {
        tensor,
        shape,
        reason,
    }
}

fn five<D: ShapeDim>(tensor: &'static str, shape: &[D], what: &'static str) -> Result<[usize; 5]> {
    let dims: Vec<usize> = shape
        .iter()
        .map(|d| d.to_usize().unwrap_or(usize::MAX))
        .collect();
    if dims.contains(&usize::MAX) {
        return Err(shape_err(
            tensor,
            dims,
            "sizes must be non-negative and fit in memory",
        ));
    }
    <[usize; 5]>::try_from(dims.as_slice()).map_err(|_| shape_err(tensor, dims, what))
}

impl Conv3dGeometry {
    /// The geometry of `conv_transpose3d` (PyTorch's semantics) of an
    /// input `[N, Cin, D, H, W]` with a weight `[Cin, Cout/G, KD, KH, KW]`:
    /// the forward convolution whose [`Conv3dBackwardOp::Data`] it is. Its
    /// input is the transposed convolution's output `[N, Cout, OD, OH, OW]`,
    /// `OD = (D - 1) * stride - 2 * padding + dilation * (KD - 1) +
    /// output_padding + 1`; its output is the transposed convolution's input
    /// `[D, H, W]` (at most what the forward formula gives: less when
    /// `output_padding >= stride`); its weight is the given one.
    ///
    /// Errors: [`Error::Conv3dParam`] for a zero stride, dilation or group
    /// count, or an `output_padding` not below the stride or the dilation
    /// of its axis (PyTorch's rule); [`Error::Conv3dShape`] for shapes that
    /// are not 5-d, input channels not divisible by groups, a weight whose
    /// first dimension is not the input channels, a zero spatial size, or
    /// an output size below 1; those of [`Conv3dGeometry::new`].
    pub fn transposed<D: ShapeDim>(
        params: Conv3dParams,
        output_padding: [usize; 3],
        input_shape: &[D],
        weight_shape: &[D],
    ) -> Result<Conv3dGeometry> {
        let [n, cin, d, h, w] = five("input", input_shape, "must be 5-d [N, C, D, H, W]")?;
        let wshape = five(
            "weight",
            weight_shape,
            "must be 5-d [C_in, C_out/groups, KD, KH, KW]",
        )?;
        let [wc, coutg, kd, kh, kw] = wshape;
        for (param, v) in [("stride", params.stride), ("dilation", params.dilation)] {
            if v.contains(&0) {
                return Err(Error::Conv3dParam {
                    param,
                    value: v.to_vec(),
                    reason: "every axis must be at least 1",
                });
            }
        }
        let g = params.groups;
        if g == 0 {
            return Err(Error::Conv3dParam {
                param: "groups",
                value: vec![0],
                reason: "must be at least 1",
            });
        }
        let ishape = vec![n, cin, d, h, w];
        if cin % g != 0 {
            return Err(shape_err(
                "input",
                ishape,
                "channels not divisible by groups",
            ));
        }
        if wc != cin {
            return Err(shape_err(
                "weight",
                wshape.to_vec(),
                "first dimension must be the input channels",
            ));
        }
        if [d, h, w].contains(&0) {
            return Err(shape_err(
                "input",
                ishape,
                "spatial sizes must be at least 1",
            ));
        }
        for a in 0..3 {
            let op = output_padding[a];
            if op >= params.stride[a] && op >= params.dilation[a] {
                return Err(Error::Conv3dParam {
                    param: "output_padding",
                    value: output_padding.to_vec(),
                    reason: "must be smaller than the stride or the dilation of its axis",
                });
            }
        }
        let overflow = || shape_err("input", vec![n, cin, d, h, w], "size overflows usize");
        let mut out = [0usize; 3];
        for (a, (&x, &k)) in [d, h, w].iter().zip(&[kd, kh, kw]).enumerate() {
            let grow = (x - 1)
                .checked_mul(params.stride[a])
                .and_then(|v| v.checked_add(k.saturating_sub(1).checked_mul(params.dilation[a])?))
                .and_then(|v| v.checked_add(output_padding[a] + 1))
                .ok_or_else(overflow)?;
            let pad = params.padding[a].checked_mul(2).ok_or_else(overflow)?;
            if k == 0 || grow <= pad {
                return Err(shape_err(
                    "weight",
                    wshape.to_vec(),
                    "the transposed convolution's output size is below 1",
                ));
            }
            out[a] = grow - pad;
        }
        let cout = coutg.checked_mul(g).ok_or_else(overflow)?;
        let fwd = Conv3dGeometry::new(
            params,
            &[n, cout, out[0], out[1], out[2]],
            &[cin, coutg, kd, kh, kw],
        )?;
        if (0..3).any(|a| fwd.output[a] < [d, h, w][a]) {
            // Cannot happen by the formula; refused rather than trusted.
            return Err(shape_err(
                "input",
                vec![n, cin, d, h, w],
                "the transposed convolution does not cover its input",
            ));
        }
        Ok(Conv3dGeometry {
            output: [d, h, w],
            ..fwd
        })
    }

    /// Whether `output` is what the forward formula gives for `input`
    /// (`(D + 2 * padding - dilation * (KD - 1) - 1) / stride + 1` per
    /// axis): true for every geometry of [`Conv3dGeometry::new`], false for
    /// a [`Conv3dGeometry::transposed`] one whose `output_padding` reaches
    /// the stride (its output is then shorter). The vendor libraries take
    /// only the first kind: their `dy` must be the forward output of `dx`.
    pub fn output_is_forward(&self) -> bool {
        Conv3dGeometry::new(self.params, &self.input_shape(), &self.weight_shape())
            .is_ok_and(|f| f.output == self.output)
    }

    /// The geometry a bias gradient of `dy` `[N, K, OD, OH, OW]` is computed
    /// over (only `batch`, `out_channels` and `output` matter: a 1x1x1
    /// depthwise convolution whose output is `dy`'s shape).
    pub fn for_bias_grad<D: ShapeDim>(grad_output_shape: &[D]) -> Result<Conv3dGeometry> {
        let [n, k, od, oh, ow] = five(
            "grad_output",
            grad_output_shape,
            "must be 5-d [N, K, OD, OH, OW]",
        )?;
        let groups = k.max(1);
        Conv3dGeometry::new(
            Conv3dParams::default().with_groups(groups),
            &[n, k, od, oh, ow],
            &[k, k / groups, 1, 1, 1],
        )
    }
}

/// One backward call: the forward geometry, the op and borrowed data.
///
/// `grad_output` is `dy` `[N, K, OD, OH, OW]`; `other` the weight
/// (standard layout) for [`Conv3dBackwardOp::Data`], the forward input for
/// [`Conv3dBackwardOp::Weight`], `None` for [`Conv3dBackwardOp::Bias`];
/// `bias` (Data only) one value per channel of the result, added to it
/// (the transposed convolution's bias; `None` for a gradient). `dy` and
/// `other` have one dtype (f32 or bf16); every result is f32.
#[derive(Debug, Clone, Copy)]
pub struct Conv3dBackwardProblem<'a> {
    /// Which gradient.
    pub op: Conv3dBackwardOp,
    /// The forward convolution's sizes.
    pub geometry: Conv3dGeometry,
    /// `dy`.
    pub grad_output: Conv3dData<'a>,
    /// The weight (Data) or the input (Weight).
    pub other: Option<Conv3dData<'a>>,
    /// Data only: a bias per result channel.
    pub bias: Option<Conv3dData<'a>>,
}

impl<'a> Conv3dBackwardProblem<'a> {
    /// Checks dtypes and lengths of a problem over a validated geometry.
    ///
    /// Errors: [`Error::Conv3dDType`] when `other`'s dtype is not
    /// `grad_output`'s; [`Error::LengthMismatch`] for a length that is not
    /// its shape's (a missing `other`, a bias on another op than Data,
    /// are refused as [`Error::Conv3dParam`]).
    pub fn new(
        op: Conv3dBackwardOp,
        geometry: Conv3dGeometry,
        grad_output: Conv3dData<'a>,
        other: Option<Conv3dData<'a>>,
        bias: Option<Conv3dData<'a>>,
    ) -> Result<Self> {
        let g = &geometry;
        if other.is_some() != op.other_len(g).is_some()
            || (bias.is_some() && op != Conv3dBackwardOp::Data)
        {
            return Err(Error::Conv3dParam {
                param: "backward operands",
                value: vec![usize::from(other.is_some()), usize::from(bias.is_some())],
                reason: "data takes dy, the weight and an optional bias; weight takes dy and the input; bias takes dy",
            });
        }
        if let Some(o) = other {
            if o.dtype() != grad_output.dtype() {
                return Err(Error::Conv3dDType {
                    tensor: if op == Conv3dBackwardOp::Data {
                        "weight"
                    } else {
                        "input"
                    },
                    dtype: o.dtype(),
                    expected: grad_output.dtype(),
                });
            }
        }
        let checks = [
            (
                "conv3d backward grad_output",
                g.output_len(),
                grad_output.len(),
            ),
            (
                if op == Conv3dBackwardOp::Data {
                    "conv3d backward weight"
                } else {
                    "conv3d backward input"
                },
                op.other_len(g).unwrap_or(0),
                other.map_or(0, |o| o.len()),
            ),
            (
                "conv3d backward bias",
                g.in_channels,
                bias.map_or(g.in_channels, |b| b.len()),
            ),
        ];
        for (what, expected, actual) in checks {
            if expected != actual {
                return Err(Error::LengthMismatch {
                    op: what,
                    expected,
                    actual,
                    tensor: None,
                });
            }
        }
        Ok(Conv3dBackwardProblem {
            op,
            geometry,
            grad_output,
            other,
            bias,
        })
    }

    /// The input gradient of the forward convolution `params` of an input
    /// of `input_shape` with a weight of `weight_shape`, from `dy` and the
    /// weight. Errors: those of [`Conv3dGeometry::new`] and
    /// [`Conv3dBackwardProblem::new`].
    pub fn data<D: ShapeDim>(
        params: Conv3dParams,
        input_shape: &[D],
        weight_shape: &[D],
        grad_output: Conv3dData<'a>,
        weight: Conv3dData<'a>,
    ) -> Result<Self> {
        let g = Conv3dGeometry::new(params, input_shape, weight_shape)?;
        Self::new(Conv3dBackwardOp::Data, g, grad_output, Some(weight), None)
    }

    /// The weight gradient of the forward convolution `params` from its
    /// input and `dy`. Errors as [`Conv3dBackwardProblem::data`].
    pub fn weight<D: ShapeDim>(
        params: Conv3dParams,
        input: Conv3dData<'a>,
        input_shape: &[D],
        weight_shape: &[D],
        grad_output: Conv3dData<'a>,
    ) -> Result<Self> {
        let g = Conv3dGeometry::new(params, input_shape, weight_shape)?;
        Self::new(Conv3dBackwardOp::Weight, g, grad_output, Some(input), None)
    }

    /// The bias gradient of `dy` `[N, K, OD, OH, OW]`. Errors: a shape that
    /// is not 5-d; a length that is not the shape's.
    pub fn bias<D: ShapeDim>(grad_output: Conv3dData<'a>, grad_output_shape: &[D]) -> Result<Self> {
        let g = Conv3dGeometry::for_bias_grad(grad_output_shape)?;
        Self::new(Conv3dBackwardOp::Bias, g, grad_output, None, None)
    }

    /// `conv_transpose3d(input, weight, bias, stride, padding,
    /// output_padding, groups, dilation)` (PyTorch's semantics; `params`
    /// holds stride, padding, dilation and groups) as the
    /// [`Conv3dBackwardOp::Data`] of [`Conv3dGeometry::transposed`]: the
    /// result is `[N, Cout, OD, OH, OW]` f32. Errors: those of
    /// [`Conv3dGeometry::transposed`] and [`Conv3dBackwardProblem::new`].
    pub fn conv_transpose3d<D: ShapeDim>(
        params: Conv3dParams,
        output_padding: [usize; 3],
        input: Conv3dData<'a>,
        input_shape: &[D],
        weight: Conv3dData<'a>,
        weight_shape: &[D],
        bias: Option<Conv3dData<'a>>,
    ) -> Result<Self> {
        let g = Conv3dGeometry::transposed(params, output_padding, input_shape, weight_shape)?;
        Self::new(Conv3dBackwardOp::Data, g, input, Some(weight), bias)
    }

    /// The dtype of `dy` (and of the other operand).
    pub fn dtype(&self) -> DType {
        self.grad_output.dtype()
    }

    /// Elements of the result.
    pub fn output_len(&self) -> usize {
        self.op.output_len(&self.geometry)
    }

    /// The shape of the result.
    pub fn output_shape(&self) -> Vec<usize> {
        let g = &self.geometry;
        match self.op {
            Conv3dBackwardOp::Data => g.input_shape().to_vec(),
            Conv3dBackwardOp::Weight => g.weight_shape().to_vec(),
            Conv3dBackwardOp::Bias => vec![g.out_channels],
        }
    }

    /// Whether every operand is finite.
    pub fn inputs_finite(&self) -> bool {
        self.grad_output.all_finite()
            && self.other.is_none_or(|o| o.all_finite())
            && self.bias.is_none_or(|b| b.all_finite())
    }
}

/// Result point at flat `index` of a backward problem, in f64: the value
/// and `|bias| + sum |a * b|` over its products. `None` past the result.
pub fn backward_reference_point(p: &Conv3dBackwardProblem<'_>, index: usize) -> Option<RefPoint> {
    let g = &p.geometry;
    if index >= p.output_len() {
        return None;
    }
    let [d_n, h_n, w_n] = g.input;
    let [od_n, oh_n, ow_n] = g.output;
    let [kd_n, kh_n, kw_n] = g.kernel;
    let (cg, kg) = (g.in_per_group(), g.out_per_group());
    let (s, pd, dl) = (g.params.stride, g.params.padding, g.params.dilation);
    let dy = |n: usize, k: usize, o: [usize; 3]| {
        p.grad_output
            .get_f32((((n * g.out_channels + k) * od_n + o[0]) * oh_n + o[1]) * ow_n + o[2])
    };
    let mut value = 0f64;
    let mut magnitude = 0f64;
    let mut add = |a: f32, b: f32| {
        let v = f64::from(a) * f64::from(b);
        value += v;
        magnitude += v.abs();
    };
    match p.op {
        Conv3dBackwardOp::Data => {
            let w = p.other?;
            let x = index % w_n;
            let y = index / w_n % h_n;
            let z = index / (w_n * h_n) % d_n;
            let c = index / (w_n * h_n * d_n) % g.in_channels;
            let n = index / (w_n * h_n * d_n * g.in_channels);
            let (group, ci) = (c / cg, c % cg);
            let pos = [z, y, x];
            let sizes = [od_n, oh_n, ow_n];
            // The output coordinate of tap t along axis a, if any.
            let out_of = |a: usize, t: usize| -> Option<usize> {
                let v = (pos[a] + pd[a]).checked_sub(t * dl[a])?;
                (v % s[a] == 0 && v / s[a] < sizes[a]).then_some(v / s[a])
            };
            for k in group * kg..(group + 1) * kg {
                for kd in 0..kd_n {
                    let Some(od) = out_of(0, kd) else { continue };
                    for kh in 0..kh_n {
                        let Some(oh) = out_of(1, kh) else { continue };
                        for kw in 0..kw_n {
                            let Some(ow) = out_of(2, kw) else { continue };
                            let wi = (((k * cg + ci) * kd_n + kd) * kh_n + kh) * kw_n + kw;
                            add(dy(n, k, [od, oh, ow])?, w.get_f32(wi)?);
                        }
                    }
                }
            }
            if let Some(b) = p.bias {
                let b = f64::from(b.get_f32(c)?);
                value += b;
                magnitude += b.abs();
            }
        }
        Conv3dBackwardOp::Weight => {
            let x = p.other?;
            let kw = index % kw_n;
            let kh = index / kw_n % kh_n;
            let kd = index / (kw_n * kh_n) % kd_n;
            let ci = index / (kw_n * kh_n * kd_n) % cg;
            let k = index / (kw_n * kh_n * kd_n * cg);
            let c = (k / kg) * cg + ci;
            let tap = [kd, kh, kw];
            let sizes = [d_n, h_n, w_n];
            let in_of = |a: usize, o: usize| -> Option<usize> {
                let v = (o * s[a] + tap[a] * dl[a]).checked_sub(pd[a])?;
                (v < sizes[a]).then_some(v)
            };
            for n in 0..g.batch {
                for od in 0..od_n {
                    let Some(iz) = in_of(0, od) else { continue };
                    for oh in 0..oh_n {
                        let Some(iy) = in_of(1, oh) else { continue };
                        for ow in 0..ow_n {
                            let Some(ix) = in_of(2, ow) else { continue };
                            let xi = (((n * g.in_channels + c) * d_n + iz) * h_n + iy) * w_n + ix;
                            add(dy(n, k, [od, oh, ow])?, x.get_f32(xi)?);
                        }
                    }
                }
            }
        }
        Conv3dBackwardOp::Bias => {
            let k = index;
            for n in 0..g.batch {
                for od in 0..od_n {
                    for oh in 0..oh_n {
                        for ow in 0..ow_n {
                            add(dy(n, k, [od, oh, ow])?, 1.0);
                        }
                    }
                }
            }
        }
    }
    Some(RefPoint { value, magnitude })
}

/// The whole result in f64 (slow: tests and small shapes).
pub fn backward_reference(p: &Conv3dBackwardProblem<'_>) -> Vec<f64> {
    (0..p.output_len())
        .map_while(|i| backward_reference_point(p, i).map(|r| r.value))
        .collect()
}

/// An operand widened to f32 (borrowed when it is f32 already).
fn widened<'a>(d: Conv3dData<'a>) -> Result<Cow<'a, [f32]>> {
    match d {
        Conv3dData::F32(s) => Ok(Cow::Borrowed(s)),
        Conv3dData::BF16(_) => {
            let mut v = Vec::new();
            v.try_reserve_exact(d.len())
                .map_err(|_| Error::OutOfMemory {
                    backend: "host",
                    op: "conv3d backward widened operand",
                    bytes: (d.len() as u64).saturating_mul(4),
                })?;
            v.resize(d.len(), 0f32);
            d.widen_into(0, &mut v).ok_or(Error::Conv3dTier {
                tier: "cpu",
                reason: "an operand is shorter than its shape",
            })?;
            Ok(Cow::Owned(v))
        }
    }
}

/// The CPU kernels of the backward ops (rayon), f32 products. Data: one
/// task per `(n, c)` plane, gather form, f32 accumulation (output channel,
/// then taps, as the GPU kernel); Weight: one task per `(k, ci)` row of
/// taps, f64 accumulation over `n` and the output volume; Bias: one task
/// per channel, f64 accumulation. `out` has the result's length.
///
/// Errors: [`Error::LengthMismatch`] for another `out` length;
/// [`Error::OutOfMemory`] when a bf16 operand cannot be widened.
pub fn conv3d_backward_cpu(p: &Conv3dBackwardProblem<'_>, out: &mut [f32]) -> Result<()> {
    if out.len() != p.output_len() {
        return Err(Error::LengthMismatch {
            op: "conv3d backward output",
            expected: p.output_len(),
            actual: out.len(),
            tensor: None,
        });
    }
    // Re-checked: the fields are public, and the loops index by the shapes.
    let p = &Conv3dBackwardProblem::new(p.op, p.geometry, p.grad_output, p.other, p.bias)?;
    if out.is_empty() {
        return Ok(());
    }
    let dy = widened(p.grad_output)?;
    let other = p.other.map(widened).transpose()?;
    let bias = p.bias.map(widened).transpose()?;
    crate::par::install(|| {
        match (p.op, other.as_deref()) {
            (Conv3dBackwardOp::Data, Some(w)) => {
                cpu_data(&p.geometry, &dy, w, bias.as_deref(), out)
            }
            (Conv3dBackwardOp::Weight, Some(x)) => cpu_weight(&p.geometry, x, &dy, out),
            (Conv3dBackwardOp::Bias, _) => cpu_bias(&p.geometry, &dy, out),
            _ => {
                return Err(Error::Conv3dTier {
                    tier: "cpu",
                    reason: "a backward op without its second operand",
                })
            }
        }
        Ok(())
    })
}

fn cpu_data(g: &Conv3dGeometry, dy: &[f32], w: &[f32], bias: Option<&[f32]>, dx: &mut [f32]) {
    let [d_n, h_n, w_n] = g.input;
    let [od_n, oh_n, ow_n] = g.output;
    let [kd_n, kh_n, kw_n] = g.kernel;
    let (cg, kg, kk) = (g.in_per_group(), g.out_per_group(), g.out_channels);
    let (s, pd, dl) = (g.params.stride, g.params.padding, g.params.dilation);
    let plane = d_n * h_n * w_n;
    let out_of = |a: usize, pos: usize, t: usize, size: usize| -> Option<usize> {
        let v = (pos + pd[a]).checked_sub(t * dl[a])?;
        (v % s[a] == 0 && v / s[a] < size).then_some(v / s[a])
    };
    dx.par_chunks_mut(plane).enumerate().for_each(|(nc, dst)| {
        let (n, c) = (nc / g.in_channels, nc % g.in_channels);
        let (group, ci) = (c / cg, c % cg);
        let b = bias.and_then(|b| b.get(c).copied()).unwrap_or(0.0);
        for (i, v) in dst.iter_mut().enumerate() {
            let (z, y, x) = (i / (h_n * w_n), i / w_n % h_n, i % w_n);
            let mut acc = b;
            for k in group * kg..(group + 1) * kg {
                let dyk = &dy[(n * kk + k) * od_n * oh_n * ow_n..];
                let wk = &w[(k * cg + ci) * kd_n * kh_n * kw_n..];
                for kd in 0..kd_n {
                    let Some(od) = out_of(0, z, kd, od_n) else {
                        continue;
                    };
                    for kh in 0..kh_n {
                        let Some(oh) = out_of(1, y, kh, oh_n) else {
                            continue;
                        };
                        for kw in 0..kw_n {
                            let Some(ow) = out_of(2, x, kw, ow_n) else {
                                continue;
                            };
                            acc = dyk[(od * oh_n + oh) * ow_n + ow]
                                .mul_add(wk[(kd * kh_n + kh) * kw_n + kw], acc);
                        }
                    }
                }
            }
            *v = acc;
        }
    });
}

fn cpu_weight(g: &Conv3dGeometry, x: &[f32], dy: &[f32], dw: &mut [f32]) {
    let [d_n, h_n, w_n] = g.input;
    let [od_n, oh_n, ow_n] = g.output;
    let [kd_n, kh_n, kw_n] = g.kernel;
    let (cg, kg) = (g.in_per_group(), g.out_per_group());
    let (s, pd, dl) = (g.params.stride, g.params.padding, g.params.dilation);
    let taps = kd_n * kh_n * kw_n;
    let in_of = |a: usize, o: usize, t: usize, size: usize| -> Option<usize> {
        let v = (o * s[a] + t * dl[a]).checked_sub(pd[a])?;
        (v < size).then_some(v)
    };
    dw.par_chunks_mut(taps).enumerate().for_each(|(kci, dst)| {
        let (k, ci) = (kci / cg, kci % cg);
        let c = (k / kg) * cg + ci;
        for (t, v) in dst.iter_mut().enumerate() {
            let (kd, kh, kw) = (t / (kh_n * kw_n), t / kw_n % kh_n, t % kw_n);
            let mut acc = 0f64;
            for n in 0..g.batch {
                let xc = &x[(n * g.in_channels + c) * d_n * h_n * w_n..];
                let dyk = &dy[(n * g.out_channels + k) * od_n * oh_n * ow_n..];
                for od in 0..od_n {
                    let Some(iz) = in_of(0, od, kd, d_n) else {
                        continue;
                    };
                    for oh in 0..oh_n {
                        let Some(iy) = in_of(1, oh, kh, h_n) else {
                            continue;
                        };
                        let row = &dyk[(od * oh_n + oh) * ow_n..];
                        let xrow = &xc[(iz * h_n + iy) * w_n..];
                        for (ow, &d) in row[..ow_n].iter().enumerate() {
                            let Some(ix) = in_of(2, ow, kw, w_n) else {
                                continue;
                            };
                            acc += f64::from(d) * f64::from(xrow[ix]);
                        }
                    }
                }
            }
            *v = acc as f32;
        }
    });
}

fn cpu_bias(g: &Conv3dGeometry, dy: &[f32], db: &mut [f32]) {
    let spatial: usize = g.output.iter().product();
    db.par_iter_mut().enumerate().for_each(|(k, v)| {
        let mut acc = 0f64;
        for n in 0..g.batch {
            let start = (n * g.out_channels + k) * spatial;
            acc += dy[start..start + spatial]
                .iter()
                .map(|&x| f64::from(x))
                .sum::<f64>();
        }
        *v = acc as f32;
    });
}
