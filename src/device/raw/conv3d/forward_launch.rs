//! The forward convolution as a backend takes it: [`Conv3dLaunch`] and
//! which GPU kernel runs it ([`Conv3dKernel`]: its grid, what it refuses,
//! its tile sizes).

use crate::conv3d::Conv3dGeometry;
use crate::device::info::DevicePtr;
use crate::dtype::DType;
use crate::error::{Error, Result};

#[cfg(doc)]
use super::{tiled_weight_layout, Conv3dWeightLayout};

/// Which GPU conv3d kernel of `kernels/conv3d.hip` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum Conv3dKernel {
    /// `conv3d_tiled_{f32,bf16}`: implicit GEMM on 128 x 128 output tiles
    /// (96 x 128 where the output channels per group are a multiple of 96).
    /// Its weight is in [`tiled_weight_layout`] (transposed per group).
    Tiled,
    /// `conv3d_naive_{f32,bf16}`: one thread per output point. A 256-thread
    /// block stages the input region and the weights its outputs read
    /// (4 output channels x 2 rows x 32 columns on large layers) in shared
    /// memory, a slice of input channels at a time; where a region does not
    /// fit (large strides or dilations) each thread reads global memory
    /// directly. Its weight is in the standard `[K, C/G, KD, KH, KW]`
    /// layout.
    Naive,
}

/// Tile sizes of `conv3d_tiled_*` (RS_TBM, RS_TBN) and its largest tap count
/// (RS_MAX_TAPS).
pub(crate) const TILE_M: usize = 128;
pub(crate) const TILE_N: usize = 128;
const MAX_TAPS: usize = 1024;
/// The shorter tile of both tiled kernels (`rs_conv3d_*_bm96`).
const TILE_M_96: usize = 96;

/// Rows of a `conv3d_tiled_{f32,bf16}` output tile for `kg` output channels
/// per group: 96 where `kg` is a multiple of 96 (no padded rows for 96, 192
/// and 384 channels, and fewer registers), else [`TILE_M`]. The kernel
/// makes the same choice (`rs_conv3d_tiled_bm96`).
pub(crate) fn tiled_tile_m(kg: usize) -> usize {
    if kg.is_multiple_of(TILE_M_96) {
        TILE_M_96
    } else {
        TILE_M
    }
}

/// Rows of a `conv3d_tiled_bf16_mma` output tile for `kg` output channels
/// per group: 96 where `kg` is a multiple of 96 and not of 128, else
/// [`TILE_M`] (`rs_conv3d_mma_bm96`). Its 96-row tiles stage 128 rows of
/// the packed weight, which its padding to a multiple of 128 holds.
pub(crate) fn mma_tile_m(kg: usize) -> usize {
    if kg.is_multiple_of(TILE_M_96) && !kg.is_multiple_of(TILE_M) {
        TILE_M_96
    } else {
        TILE_M
    }
}

/// The channel tiles (grid y) of `conv3d_tiled_bf16_mma` for `kg` output
/// channels per group.
pub(crate) fn mma_tiles_m(kg: usize) -> usize {
    kg.div_ceil(mma_tile_m(kg))
}

impl Conv3dKernel {
    /// `"tiled"` or `"naive"`.
    pub fn name(self) -> &'static str {
        match self {
            Conv3dKernel::Tiled => "tiled",
            Conv3dKernel::Naive => "naive",
        }
    }

    /// Why the chain does not send `g` to this kernel, if it does not:
    /// what [`Conv3dKernel::cannot_take`] names, and for the tiled kernel
    /// fewer than 8 output channels per group (the naive kernel fits those
    /// better: a choice of speed, not of correctness).
    pub fn unsupported(self, g: &Conv3dGeometry) -> Option<&'static str> {
        if let Some(why) = self.cannot_take(g) {
            return Some(why);
        }
        if self == Conv3dKernel::Tiled && g.out_per_group() < 8 {
            return Some(
                "fewer than 8 output channels per group (depthwise-like): the naive kernel fits better",
            );
        }
        None
    }

    /// Why this kernel cannot compute `g` at all, if it cannot: zero-size
    /// tensors (never sent to a device) and, for the tiled kernel, sizes
    /// its grid or tap table cannot hold. What it computes slowly it still
    /// takes (the guard's repair, rare, takes any shape it can compute).
    pub fn cannot_take(self, g: &Conv3dGeometry) -> Option<&'static str> {
        let zero =
            g.output_len() == 0 || g.input_shape().contains(&0) || g.weight_shape().contains(&0);
        if zero {
            return Some("zero-size tensors are not sent to a device");
        }
        if self == Conv3dKernel::Naive {
            return None;
        }
        let points = g.batch.saturating_mul(g.output.iter().product::<usize>());
        if points.div_ceil(TILE_N) > i32::MAX as usize {
            return Some("more output points than the grid's x dimension holds");
        }
        if g.out_per_group().div_ceil(TILE_M_96) > 65_535 || g.params.groups > 65_535 {
            return Some("more channel tiles or groups than the grid's y/z dimensions hold");
        }
        let taps: usize = g.kernel.iter().product();
        if taps > MAX_TAPS {
            return Some("more than 1024 kernel taps (KD * KH * KW)");
        }
        let fits = (0..3).all(|a| {
            (g.kernel[a] - 1)
                .checked_mul(g.params.dilation[a])
                .is_some_and(|v| v <= i32::MAX as usize)
        });
        if !fits {
            return Some("a dilated kernel offset does not fit 32 bits");
        }
        if u32::try_from(g.in_per_group()).is_err() {
            return Some("more than 2^32 input channels per group");
        }
        None
    }

    /// The launch grid `(x, y, z)` for `g` (256 threads per block), or why
    /// the kernel cannot take it. Never truncates.
    pub(crate) fn grid(self, g: &Conv3dGeometry) -> Result<[u32; 3]> {
        if let Some(reason) = self.cannot_take(g) {
            return Err(Error::Conv3dTier {
                tier: self.name(),
                reason,
            });
        }
        let clamp = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Ok(match self {
            // Grid-stride: at most 2^20 blocks.
            Conv3dKernel::Naive => [clamp(g.output_len().div_ceil(256).min(1 << 20)), 1, 1],
            // Each fits (checked by `cannot_take`).
            Conv3dKernel::Tiled => {
                let points = g.batch * g.output.iter().product::<usize>();
                [
                    clamp(points.div_ceil(TILE_N)),
                    clamp(g.out_per_group().div_ceil(tiled_tile_m(g.out_per_group()))),
                    clamp(g.params.groups),
                ]
            }
        })
    }
}

impl std::fmt::Display for Conv3dKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One conv3d call as a backend takes it: device addresses, dtype and the
/// validated geometry (only [`Conv3dProblem::new`](crate::conv3d::Conv3dProblem::new) makes one, so every
/// element count fits `usize`).
///
/// - `input`: `geometry.input_shape()` elements of `dtype` (F32 or BF16);
/// - `weight`: the weight in `dtype`, in the layout the backend's
///   [`conv3d_weight_layout`](crate::device::raw::Backend::conv3d_weight_layout) gave for
///   the kernel ([`Conv3dWeightLayout::Standard`] for the vendor library);
/// - `bias`: `out_channels` f32, or `None`;
/// - `output`: `geometry.output_len()` f32, written (every element).
///
/// Every address is aligned to its element size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dLaunch {
    /// The sizes and parameters.
    pub geometry: Conv3dGeometry,
    /// The dtype of input and weight: F32 or BF16.
    pub dtype: DType,
    /// The input tensor.
    pub input: DevicePtr,
    /// The weight tensor.
    pub weight: DevicePtr,
    /// The bias (f32), if any.
    pub bias: Option<DevicePtr>,
    /// The output: f32, or BF16 (rounded to nearest even) where
    /// `output_dtype` says so (the tiled kernels only).
    pub output: DevicePtr,
    /// The output's dtype: F32 (every kernel), or BF16 (the tiled kernels,
    /// writing over another library's bf16 output: the guarded fallback).
    pub output_dtype: DType,
    /// A gate (one `u64` on the device): the kernel runs only when it is
    /// non-zero when the kernel starts (the tiled kernels and the check;
    /// see `conv3d_chain::guard`). `None` runs always.
    pub gate: Option<DevicePtr>,
}

impl Conv3dLaunch {
    /// Bytes of the output.
    pub fn output_bytes(&self) -> usize {
        self.geometry.output_len() * self.output_dtype.size().unwrap_or(4)
    }

    /// Refuses a gate or a non-f32 output on a launch that takes neither
    /// (the naive kernel, the vendor library, their epilogues).
    pub(crate) fn plain(&self, what: &'static str) -> Result<()> {
        if self.gate.is_some() || self.output_dtype != DType::F32 {
            return Err(Error::Conv3dTier {
                tier: what,
                reason: "only the tiled kernels take a gate or a bf16 output",
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d::Conv3dParams;

    #[test]
    fn tile_heights_follow_the_kernels_rules() {
        // (kg, SIMT rows, mma rows): 96 where kg is a multiple of 96 (the
        // mma kernel: and not of 128).
        for (kg, simt, mma) in [
            (16, 128, 128),
            (96, 96, 96),
            (128, 128, 128),
            (192, 96, 96),
            (288, 96, 96),
            (384, 96, 128),
            (512, 128, 128),
        ] {
            assert_eq!((tiled_tile_m(kg), mma_tile_m(kg)), (simt, mma), "kg {kg}");
        }
        // A 96-row mma tile stages 128 rows of the packed weight (K/G
        // rounded up to 128): the last tile's stay inside.
        for kg in (96..20_000).step_by(96) {
            if mma_tile_m(kg) == 96 {
                let rows = kg.next_multiple_of(TILE_M);
                assert!((mma_tiles_m(kg) - 1) * 96 + 128 <= rows, "kg {kg}");
            }
        }
        // The SIMT grid's y is the 96-row tile count for 192 channels.
        let params = Conv3dParams::default().with_padding([1; 3]);
        let g = Conv3dGeometry::new(params, &[1, 8, 3, 4, 5], &[192, 8, 3, 3, 3]).unwrap();
        assert_eq!(Conv3dKernel::Tiled.grid(&g).unwrap(), [1, 2, 1]);
        assert_eq!(mma_tiles_m(192), 2);
        let g = Conv3dGeometry::new(params, &[1, 8, 3, 4, 5], &[130, 8, 3, 3, 3]).unwrap();
        assert_eq!(Conv3dKernel::Tiled.grid(&g).unwrap(), [1, 2, 1]);
    }
}
