//! Convolution parameters, input data, and shape validation.

use crate::convert::scalar::bf16_to_f32;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Stride, padding, dilation and groups of a 3-D convolution (PyTorch's
/// `nn.functional.conv3d` semantics, zero padding). Axes are `[d, h, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Conv3dParams {
    /// Step between output points, per axis (each >= 1).
    pub stride: [usize; 3],
    /// Zeros added on both sides of the input, per axis.
    pub padding: [usize; 3],
    /// Spacing between kernel taps, per axis (each >= 1).
    pub dilation: [usize; 3],
    /// Channel groups (>= 1); input and output channels are both divisible
    /// by it. `groups == in_channels` is a depthwise convolution.
    pub groups: usize,
}

impl Default for Conv3dParams {
    /// Stride 1, no padding, dilation 1, one group.
    fn default() -> Self {
        Conv3dParams {
            stride: [1; 3],
            padding: [0; 3],
            dilation: [1; 3],
            groups: 1,
        }
    }
}

impl Conv3dParams {
    /// These parameters with another stride.
    pub fn with_stride(mut self, stride: [usize; 3]) -> Self {
        self.stride = stride;
        self
    }
    /// These parameters with another padding.
    pub fn with_padding(mut self, padding: [usize; 3]) -> Self {
        self.padding = padding;
        self
    }
    /// These parameters with another dilation.
    pub fn with_dilation(mut self, dilation: [usize; 3]) -> Self {
        self.dilation = dilation;
        self
    }
    /// These parameters with another number of groups.
    pub fn with_groups(mut self, groups: usize) -> Self {
        self.groups = groups;
        self
    }
}

/// A borrowed tensor of one of the two input dtypes conv3d takes.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Conv3dData<'a> {
    /// 32-bit floats.
    F32(&'a [f32]),
    /// bfloat16, widened exactly (bit pattern shifted left by 16) to f32.
    BF16(&'a [half::bf16]),
}

impl Conv3dData<'_> {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            Conv3dData::F32(_) => DType::F32,
            Conv3dData::BF16(_) => DType::BF16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Conv3dData::F32(s) => s.len(),
            Conv3dData::BF16(s) => s.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened exactly to f32, `None` past the end.
    #[inline]
    pub fn get_f32(&self, i: usize) -> Option<f32> {
        match self {
            Conv3dData::F32(s) => s.get(i).copied(),
            Conv3dData::BF16(s) => s.get(i).map(|b| f32::from_bits(bf16_to_f32(b.to_bits()))),
        }
    }

    /// Copies `dst.len()` elements starting at `start`, widened exactly to
    /// f32. Returns `None` (writing nothing) when the range is out of bounds.
    pub fn widen_into(&self, start: usize, dst: &mut [f32]) -> Option<()> {
        let end = start.checked_add(dst.len())?;
        match self {
            Conv3dData::F32(s) => dst.copy_from_slice(s.get(start..end)?),
            Conv3dData::BF16(s) => {
                for (d, b) in dst.iter_mut().zip(s.get(start..end)?) {
                    *d = f32::from_bits(bf16_to_f32(b.to_bits()));
                }
            }
        }
        Some(())
    }

    /// Whether every element is finite (neither NaN nor infinite).
    pub fn all_finite(&self) -> bool {
        match self {
            Conv3dData::F32(s) => s.iter().all(|x| x.is_finite()),
            Conv3dData::BF16(s) => s.iter().all(|x| x.is_finite()),
        }
    }
}

/// The validated sizes of one convolution: what every tier computes from.
///
/// Built only by [`Conv3dGeometry::new`] (which [`Conv3dProblem::new`]
/// calls); all products of these sizes (element counts of input, weight and
/// output) fit in `usize`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Conv3dGeometry {
    /// Batch size N.
    pub batch: usize,
    /// Input channels C.
    pub in_channels: usize,
    /// Input spatial size `[D, H, W]`.
    pub input: [usize; 3],
    /// Output channels K.
    pub out_channels: usize,
    /// Kernel size `[KD, KH, KW]` (each >= 1).
    pub kernel: [usize; 3],
    /// Output spatial size `[OD, OH, OW]`.
    pub output: [usize; 3],
    /// The parameters.
    pub params: Conv3dParams,
}

impl Conv3dGeometry {
    /// Input channels per group.
    pub fn in_per_group(&self) -> usize {
        self.in_channels / self.params.groups
    }
    /// Output channels per group.
    pub fn out_per_group(&self) -> usize {
        self.out_channels / self.params.groups
    }
    /// Input shape `[N, C, D, H, W]`.
    pub fn input_shape(&self) -> [usize; 5] {
        let [d, h, w] = self.input;
        [self.batch, self.in_channels, d, h, w]
    }
    /// Weight shape `[K, C / groups, KD, KH, KW]`.
    pub fn weight_shape(&self) -> [usize; 5] {
        let [d, h, w] = self.kernel;
        [self.out_channels, self.in_per_group(), d, h, w]
    }
    /// Output shape `[N, K, OD, OH, OW]`.
    pub fn output_shape(&self) -> [usize; 5] {
        let [d, h, w] = self.output;
        [self.batch, self.out_channels, d, h, w]
    }
    /// Elements of the output (fits in `usize`).
    pub fn output_len(&self) -> usize {
        self.output_shape().iter().product()
    }
    /// Multiply-adds of the whole convolution (saturating).
    pub fn macs(&self) -> u64 {
        let per_point = (self.in_per_group() as u64)
            .saturating_mul(self.kernel.iter().map(|&k| k as u64).product());
        (self.output_len() as u64).saturating_mul(per_point)
    }
}

/// One convolution call: validated geometry and borrowed data.
///
/// Input `[N, C, D, H, W]`, weight `[K, C / groups, KD, KH, KW]`, optional
/// bias `[K]`, all contiguous (NCDHW). Input and weight have the same dtype
/// (f32 or bf16); the bias may be either. Every tier accumulates in f32 and
/// writes an f32 output `[N, K, OD, OH, OW]`.
#[derive(Debug, Clone, Copy)]
pub struct Conv3dProblem<'a> {
    /// The validated sizes.
    pub geometry: Conv3dGeometry,
    /// The input tensor.
    pub input: Conv3dData<'a>,
    /// The weight tensor.
    pub weight: Conv3dData<'a>,
    /// The bias, one value per output channel.
    pub bias: Option<Conv3dData<'a>>,
}

fn shape_err(tensor: &'static str, shape: &[usize], reason: &'static str) -> Error {
    Error::Conv3dShape {
        tensor,
        shape: shape.to_vec(),
        reason,
    }
}

fn product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// An element of a shape: `usize` (in memory), `u64` (as the safetensors
/// reader and the loader give shapes: `TensorInfo::shape`,
/// `LoadedTensor::shape`), `i64` (DLPack, PyTorch), so that a shape passes
/// from reader to loader to conv3d with no conversion. A negative size or
/// one beyond `usize` is a shape error.
pub trait ShapeDim: Copy {
    /// The size as `usize`, `None` when it does not fit.
    fn to_usize(self) -> Option<usize>;
}

macro_rules! shape_dims {
    ($($t:ty),*) => {
        $(impl ShapeDim for $t {
            fn to_usize(self) -> Option<usize> {
                usize::try_from(self).ok()
            }
        })*
    };
}
// u64: the reader's and loader's shapes; i64: DLPack's and PyTorch's; i32
// and u32: integer literals.
shape_dims!(usize, u64, u32, i64, i32);

/// `shape` as `usize`s; a size that does not fit is a shape error.
fn dims<D: ShapeDim>(tensor: &'static str, shape: &[D]) -> Result<Vec<usize>> {
    shape
        .iter()
        .map(|d| d.to_usize())
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| {
            let lossy: Vec<usize> = shape
                .iter()
                .map(|d| d.to_usize().unwrap_or(usize::MAX))
                .collect();
            shape_err(
                tensor,
                &lossy,
                "sizes must be non-negative and fit in memory",
            )
        })
}

impl Conv3dGeometry {
    /// Validates shapes and parameters (no data: operands that live on a
    /// device are checked by shape alone; [`Conv3dProblem::new`] adds the
    /// data's dtype and lengths).
    ///
    /// Errors: [`Error::Conv3dParam`] for a zero stride, dilation or group
    /// count; [`Error::Conv3dShape`] for a shape that is not 5-D, channels
    /// not divisible by groups, a weight whose input channels are not
    /// `C / groups`, a zero kernel size, a kernel larger than the padded
    /// input, or sizes overflowing `usize`; [`Error::Conv3dTooLarge`] when
    /// the output plus the CPU tier's padded input copy would not fit in
    /// this machine's memory (RAM plus swap).
    pub fn new<D: ShapeDim>(
        params: Conv3dParams,
        input_shape: &[D],
        weight_shape: &[D],
    ) -> Result<Self> {
        let input_shape = &dims("input", input_shape)?[..];
        let weight_shape = &dims("weight", weight_shape)?[..];
        for (param, v) in [("stride", params.stride), ("dilation", params.dilation)] {
            if v.contains(&0) {
                return Err(Error::Conv3dParam {
                    param,
                    value: v.to_vec(),
                    reason: "every axis must be at least 1",
                });
            }
        }
        if params.groups == 0 {
            return Err(Error::Conv3dParam {
                param: "groups",
                value: vec![0],
                reason: "must be at least 1",
            });
        }
        let &[n, c, d, h, w] = input_shape else {
            return Err(shape_err(
                "input",
                input_shape,
                "must be 5-d [N, C, D, H, W]",
            ));
        };
        let &[k, cg, kd, kh, kw] = weight_shape else {
            return Err(shape_err(
                "weight",
                weight_shape,
                "must be 5-d [K, C/groups, KD, KH, KW]",
            ));
        };
        let g = params.groups;
        if c % g != 0 {
            return Err(shape_err(
                "input",
                input_shape,
                "channels not divisible by groups",
            ));
        }
        if k % g != 0 {
            return Err(shape_err(
                "weight",
                weight_shape,
                "output channels not divisible by groups",
            ));
        }
        if cg != c / g {
            return Err(shape_err(
                "weight",
                weight_shape,
                "second dimension must be input channels / groups",
            ));
        }
        if kd == 0 || kh == 0 || kw == 0 {
            return Err(shape_err(
                "weight",
                weight_shape,
                "kernel size must be at least 1",
            ));
        }
        let overflow = |t| {
            shape_err(
                t,
                if t == "input" {
                    input_shape
                } else {
                    weight_shape
                },
                "size overflows usize",
            )
        };
        let mut output = [0usize; 3];
        let mut padded_dims = [0u64; 3];
        for (axis, (&x, &kx)) in [d, h, w].iter().zip(&[kd, kh, kw]).enumerate() {
            let padded = params.padding[axis]
                .checked_mul(2)
                .and_then(|p| p.checked_add(x))
                .ok_or_else(|| overflow("input"))?;
            let span = (kx - 1)
                .checked_mul(params.dilation[axis])
                .and_then(|s| s.checked_add(1))
                .ok_or_else(|| overflow("weight"))?;
            if span > padded {
                return Err(shape_err(
                    "weight",
                    weight_shape,
                    "dilated kernel larger than the padded input",
                ));
            }
            output[axis] = (padded - span) / params.stride[axis] + 1;
            padded_dims[axis] = padded as u64;
        }
        product(input_shape).ok_or_else(|| overflow("input"))?;
        product(weight_shape).ok_or_else(|| overflow("weight"))?;
        // The output and the per-point work must be addressable too.
        product(&[n, k, output[0], output[1], output[2]]).ok_or_else(|| overflow("input"))?;
        product(&[cg, kd, kh, kw, 2]).ok_or_else(|| overflow("weight"))?;
        // What a call allocates before any tier runs: the f32 output, and
        // the CPU tier's padded copy of one batch item. A size beyond the
        // machine's memory (a huge padding) is refused here, never tried.
        let out_elems = [n, k, output[0], output[1], output[2]]
            .iter()
            .fold(1u64, |a, &x| a.saturating_mul(x as u64));
        let padded_elems = padded_dims
            .iter()
            .fold(c as u64, |a, &x| a.saturating_mul(x));
        let bytes = out_elems.saturating_add(padded_elems).saturating_mul(4);
        let limit = crate::alloc::memory_limit();
        if bytes > limit {
            return Err(Error::Conv3dTooLarge {
                what: "output and padded input",
                bytes,
                limit,
            });
        }
        Ok(Conv3dGeometry {
            batch: n,
            in_channels: c,
            input: [d, h, w],
            out_channels: k,
            kernel: [kd, kh, kw],
            output,
            params,
        })
    }
}

impl<'a> Conv3dProblem<'a> {
    /// Validates shapes, parameters and data lengths.
    ///
    /// Errors: those of [`Conv3dGeometry::new`];
    /// [`Error::Conv3dDType`] when input and weight dtypes differ;
    /// [`Error::LengthMismatch`] when a buffer's length (the bias's
    /// included) is not its shape's.
    pub fn new<D: ShapeDim>(
        params: Conv3dParams,
        input: Conv3dData<'a>,
        input_shape: &[D],
        weight: Conv3dData<'a>,
        weight_shape: &[D],
        bias: Option<Conv3dData<'a>>,
    ) -> Result<Self> {
        let geometry = Conv3dGeometry::new(params, input_shape, weight_shape)?;
        let in_len: usize = geometry.input_shape().iter().product();
        let w_len: usize = geometry.weight_shape().iter().product();
        let k = geometry.out_channels;
        if weight.dtype() != input.dtype() {
            return Err(Error::Conv3dDType {
                tensor: "weight",
                dtype: weight.dtype(),
                expected: input.dtype(),
            });
        }
        for (op, expected, actual) in [
            ("conv3d input", in_len, input.len()),
            ("conv3d weight", w_len, weight.len()),
            ("conv3d bias", k, bias.map_or(k, |b| b.len())),
        ] {
            if expected != actual {
                return Err(Error::LengthMismatch {
                    op,
                    expected,
                    actual,
                    tensor: None,
                });
            }
        }
        Ok(Conv3dProblem {
            geometry,
            input,
            weight,
            bias,
        })
    }

    /// The dtype of input and weight.
    pub fn dtype(&self) -> DType {
        self.input.dtype()
    }

    /// Bias of output channel `k` (0 without a bias), widened to f32.
    #[inline]
    pub fn bias_f32(&self, k: usize) -> f32 {
        self.bias.and_then(|b| b.get_f32(k)).unwrap_or(0.0)
    }
}
