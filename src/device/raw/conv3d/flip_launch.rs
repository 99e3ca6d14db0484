//! The flipped weight on a device ([`Conv3dFlipLaunch`],
//! [`Conv3dOps::flip_weight`](crate::device::Conv3dOps::flip_weight)): a conv3d weight as the weight of the
//! forward convolution that computes its input gradient at stride 1
//! ([`Conv3dGeometry::data_grad_as_forward`]), made by
//! `conv3d_flip_weight_{u32,u16}` (the host backend runs
//! [`flip_weight`]); and `dy` spread by the stride
//! ([`Conv3dZeroInsertLaunch`], [`Conv3dOps::zero_insert`](crate::device::Conv3dOps::zero_insert),
//! `conv3d_zero_insert_{u32,u16}`; the host runs [`zero_insert`]), which
//! makes a strided input gradient a stride-1 one
//! ([`Conv3dGeometry::data_grad_unstrided`]).
//!
//! The flip is its own [`KernelOp`](crate::device::raw::KernelOp) rather than another
//! [`super::Conv3dWeightLayout`]:
//! a layout is the same convolution's weight arranged for a kernel, chosen
//! by the backend per call and reversible; the flip belongs to another
//! convolution (other shape, other geometry), is chosen by the tiled tier
//! for a backward op only, and is faulted as a backward kernel
//! (`device::faults`).

use crate::conv3d::Conv3dGeometry;
#[cfg(doc)]
use crate::conv3d::{flip_weight, zero_insert};
use crate::device::info::DevicePtr;
use crate::dtype::DType;

/// One flip of a conv3d weight ([`KernelOp::Conv3dFlipWeight`](crate::device::raw::KernelOp::Conv3dFlipWeight)): the
/// standard-layout weight at `src` (`geometry.weight_shape()` elements of
/// `dtype`, `[K, C/G, KD, KH, KW]`) into `[C, K/G, KD, KH, KW]` at `dst`
/// (as many elements, every one written): `dst[g*Cg + c, k, a, b, e] =
/// src[g*Kg + k, c, KD-1-a, KH-1-b, KW-1-e]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dFlipLaunch {
    /// The forward convolution whose weight is flipped.
    pub geometry: Conv3dGeometry,
    /// The elements' dtype (F32 or BF16).
    pub dtype: DType,
    /// The standard-layout weight.
    pub src: DevicePtr,
    /// The flipped weight.
    pub dst: DevicePtr,
}

impl Conv3dFlipLaunch {
    /// Elements of the weight (source and destination alike).
    pub fn len(&self) -> usize {
        self.geometry.weight_shape().iter().product()
    }

    /// Whether the weight has no elements (never launched).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One zero insertion ([`KernelOp::Conv3dZeroInsert`](crate::device::raw::KernelOp::Conv3dZeroInsert)): `dy` at `src`
/// (`geometry.output_len()` elements of `dtype`, `[N, K, OD, OH, OW]`)
/// spread by `geometry`'s stride into `[N, K, ZD, ZH, ZW]` at `dst`
/// (`expanded` = `[ZD, ZH, ZW]`, every element written):
/// `dst[n, k, z, y, x] = src[n, k, z/sd, y/sh, x/sw]` where each
/// coordinate is a multiple of its stride and the quotient inside `dy`,
/// else zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dZeroInsertLaunch {
    /// The forward convolution whose `dy` is spread (its output and stride).
    pub geometry: Conv3dGeometry,
    /// The destination's spatial size, each at least `(O - 1) * s + 1`.
    pub expanded: [usize; 3],
    /// The elements' dtype (F32 or BF16).
    pub dtype: DType,
    /// `dy`.
    pub src: DevicePtr,
    /// The spread `dy`.
    pub dst: DevicePtr,
}

impl Conv3dZeroInsertLaunch {
    /// Elements of the destination.
    pub fn len(&self) -> usize {
        let g = &self.geometry;
        g.batch * g.out_channels * self.expanded.iter().product::<usize>()
    }

    /// Whether the destination has no elements (never launched).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
