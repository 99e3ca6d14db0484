//! The tiled weight gradient on a device
//! ([`Conv3dOps::backward_weight_tiled`](crate::device::Conv3dOps::backward_weight_tiled),
//! `conv3d_bwd_weight_tiled_{f32,bf16}` in `kernels/conv3d_wgrad.hip`):
//! one implicit GEMM per group, `dw[g*Kg + m][(c, tap)] = sum over (n, o)
//! of dy[n][g*Kg + m][o] * x[n][g*Cg + c][o * stride + tap * dilation -
//! padding]`, on 64 x 64 tiles of `dw` with the reduction over the batch
//! and the output volume split into chunks (split-K,
//! [`tiled_wgrad_split`]) whose partial tiles are added into the zeroed
//! result with float atomics; the launch
//! ([`KernelOp::Conv3dBackwardWeightTiled`]), its grid, and the host
//! backend's emulation (the CPU kernels).

use super::backward_launch::{host_conv3d_backward, Conv3dBackwardLaunch};
use super::launch::{by_dtype, Conv3dArgs};
use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
use crate::device::kernels::{Kernel, KernelArg, KernelCall, BLOCK};
use crate::error::{Error, Result};

/// Rows (output channels) and columns (input channel x tap) of a tile of
/// `dw` (`RS_WG_TM`, `RS_WG_TN`).
const TILE: usize = 64;
/// Depth of one staged slice of the reduction (`RS_WG_TK`): every chunk is
/// a multiple of it.
const SLICE: usize = 16;
/// The fewest reduction elements (output points) a split-K chunk takes:
/// 16 slices, so a block's 4096 atomic adds follow at least 65536
/// multiply-adds per thread-tile.
const MIN_CHUNK: usize = 256;
/// Blocks per multiprocessor the split count aims for.
const BLOCKS_PER_MP: usize = 4;
/// The most blocks along grid y and z.
const GRID_YZ_MAX: usize = 65_535;
/// The most blocks along grid x: HIP counts a grid in threads (below
/// 2^32), CUDA allows 2^31 - 1 blocks.
const GRID_X_MAX: usize = (u32::MAX / BLOCK) as usize;
/// The fewest output channels per group the tiled weight gradient takes.
const MIN_OUT_PER_GROUP: usize = 8;

/// The grid of one `conv3d_bwd_weight_tiled_*` launch: `[column tiles, row
/// tiles * groups, chunks]`, and the chunk of the reduction each block
/// along z sums (a multiple of 16 elements; the last may be shorter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiledWgradSplit {
    /// The launch's grid.
    pub grid: [u32; 3],
    /// Reduction elements (output points over the batch) per block along z.
    pub chunk: u64,
}

/// Why the tiled weight gradient cannot take `g`, if it cannot: zero-size
/// tensors, fewer than 8 output channels per group (depthwise-like: a 64-row
/// tile would be mostly padding; the naive kernel's block per element fits
/// better), more column tiles than the grid's x dimension holds (2^24 - 1:
/// HIP counts a grid's threads in 32 bits), or more row tiles times groups
/// than its y dimension (65535).
pub fn tiled_wgrad_unsupported(g: &Conv3dGeometry) -> Option<&'static str> {
    if let Some(why) = Conv3dBackwardOp::Weight.unsupported(g) {
        return Some(why);
    }
    if g.out_per_group() < MIN_OUT_PER_GROUP {
        return Some(
            "fewer than 8 output channels per group: the naive weight-gradient kernel fits better",
        );
    }
    let taps: usize = g.kernel.iter().product();
    let cols = g.in_per_group().checked_mul(taps);
    if cols.is_none_or(|c| c.div_ceil(TILE) > GRID_X_MAX) {
        return Some("more weight-gradient columns (C/G x taps) than the grid's x dimension holds");
    }
    let rows = g
        .out_per_group()
        .div_ceil(TILE)
        .checked_mul(g.params.groups);
    if rows.is_none_or(|r| r > GRID_YZ_MAX) {
        return Some("more row tiles times groups than the grid's y dimension holds");
    }
    let points = g.output.iter().try_fold(g.batch, |p, &o| p.checked_mul(o));
    if points.is_none() {
        return Some("more output points than 64 bits hold");
    }
    None
}

/// The grid and split-K chunk of the tiled weight gradient of `g` on a
/// device of `mps` multiprocessors: the tiles of `dw` times enough chunks
/// of the reduction for about 4 blocks per multiprocessor, each chunk at
/// least 256 output points (fewer chunks where the reduction is short),
/// at most 65535 chunks. [`Error::Conv3dTier`] where
/// [`tiled_wgrad_unsupported`] refuses `g`.
pub fn tiled_wgrad_split(g: &Conv3dGeometry, mps: u32) -> Result<TiledWgradSplit> {
    if let Some(reason) = tiled_wgrad_unsupported(g) {
        return Err(Error::Conv3dTier {
            tier: "tiled",
            reason,
        });
    }
    let taps: usize = g.kernel.iter().product();
    let col_tiles = (g.in_per_group() * taps).div_ceil(TILE);
    let row_tiles = g.out_per_group().div_ceil(TILE) * g.params.groups;
    let total = g.batch * g.output.iter().product::<usize>();
    let tiles = col_tiles.saturating_mul(row_tiles).max(1);
    let target = BLOCKS_PER_MP.saturating_mul((mps as usize).max(1));
    let by_work = total.div_ceil(MIN_CHUNK).max(1);
    let splits = target.div_ceil(tiles).clamp(1, by_work.min(GRID_YZ_MAX));
    let chunk = total.div_ceil(splits).div_ceil(SLICE) * SLICE;
    let splits = total.div_ceil(chunk).max(1);
    let dim = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    Ok(TiledWgradSplit {
        // Each within its limit (checked above; splits at most 65535).
        grid: [dim(col_tiles), dim(row_tiles), dim(splits)],
        chunk: chunk as u64,
    })
}

impl KernelCall {
    /// `conv3d_bwd_weight_tiled_{f32,bf16}(const T* x, const T* dy, float*
    /// dw, rs_conv3d_args a, u64 chunk)` on the grid of
    /// [`tiled_wgrad_split`]: the kernel ADDS into `dw`, which the caller
    /// zeroes first on the same stream.
    pub(crate) fn conv3d_bwd_weight_tiled(
        a: &Conv3dBackwardLaunch,
        mps: u32,
    ) -> Result<KernelCall> {
        let kernel = by_dtype(
            a.dtype,
            [
                Kernel::Conv3dBwdWeightTiledF32,
                Kernel::Conv3dBwdWeightTiledBf16,
            ],
            "grad_output",
        )?;
        let (Conv3dBackwardOp::Weight, Some(x)) = (a.op, a.other) else {
            return Err(Error::Conv3dTier {
                tier: "tiled",
                reason: "the tiled backward kernel computes the weight gradient only",
            });
        };
        let split = tiled_wgrad_split(&a.geometry, mps)?;
        Ok(KernelCall {
            kernel,
            grid: split.grid,
            block: BLOCK,
            shared_bytes: 0,
            args: vec![
                KernelArg::U64(x.0),
                KernelArg::U64(a.grad_output.0),
                KernelArg::U64(a.output.0),
                KernelArg::Conv3d(Conv3dArgs::of(&a.geometry, false)),
                KernelArg::U64(split.chunk),
            ],
        })
    }
}

/// The host backend's [`KernelOp::Conv3dBackwardWeightTiled`]: the CPU
/// kernels, as [`KernelOp::Conv3dBackward`] (the result written whole, as
/// the GPU backends' memset and atomic adds leave it).
///
/// # Safety
/// As [`crate::device::raw::Backend::run`]: the launch's addresses are live host
/// allocations of the documented lengths, `output` exclusive.
pub(crate) unsafe fn host_conv3d_backward_weight_tiled(a: &Conv3dBackwardLaunch) -> Result<()> {
    if a.op != Conv3dBackwardOp::Weight {
        return Err(Error::Conv3dTier {
            tier: "tiled",
            reason: "the tiled backward kernel computes the weight gradient only",
        });
    }
    if let Some(reason) = tiled_wgrad_unsupported(&a.geometry) {
        return Err(Error::Conv3dTier {
            tier: "tiled",
            reason,
        });
    }
    // SAFETY: the caller's guarantees, forwarded.
    unsafe { host_conv3d_backward(a) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d::Conv3dParams;
    use crate::dtype::DType;

    fn geom(x: [usize; 5], w: [usize; 5], p: Conv3dParams) -> Conv3dGeometry {
        Conv3dGeometry::new(p, &x, &w).unwrap()
    }

    #[test]
    fn the_split_aims_for_four_blocks_per_multiprocessor() {
        // Wan-VAE-like: 96 -> 96, k3, pad 1 over 5 x 40 x 52.
        let p = Conv3dParams::default().with_padding([1; 3]);
        let g = geom([1, 96, 5, 40, 52], [96, 96, 3, 3, 3], p);
        let s = tiled_wgrad_split(&g, 132).unwrap();
        // 96 * 27 / 64 -> 41 column tiles, 2 row tiles.
        assert_eq!(&s.grid[..2], &[41, 2]);
        let blocks = s.grid.iter().map(|&v| v as u64).product::<u64>();
        assert!(blocks >= 4 * 132, "{s:?}");
        assert_eq!(s.chunk % 16, 0);
        let total = 5 * 40 * 52u64;
        assert!(u64::from(s.grid[2] - 1) * s.chunk < total);
        assert!(u64::from(s.grid[2]) * s.chunk >= total);
        // A short reduction: one chunk.
        let g = geom([1, 64, 2, 4, 4], [64, 64, 3, 3, 3], p);
        let s = tiled_wgrad_split(&g, 132).unwrap();
        assert_eq!(s.grid[2], 1);
        assert_eq!(s.chunk, 32);
        // Many tiles already: no split.
        let g = geom([1, 512, 2, 30, 30], [512, 512, 3, 3, 3], p);
        assert_eq!(tiled_wgrad_split(&g, 132).unwrap().grid[2], 1);
    }

    #[test]
    fn the_launch_takes_the_weight_gradient_only() {
        use crate::device::info::DevicePtr;
        let p = Conv3dParams::default().with_padding([1; 3]).with_groups(2);
        let g = geom([2, 16, 4, 5, 6], [16, 8, 3, 3, 3], p);
        let mut a = Conv3dBackwardLaunch {
            op: Conv3dBackwardOp::Weight,
            geometry: g,
            dtype: DType::BF16,
            grad_output: DevicePtr(0x1000),
            other: Some(DevicePtr(0x2000)),
            bias: None,
            output: DevicePtr(0x3000),
        };
        let call = KernelCall::conv3d_bwd_weight_tiled(&a, 8).unwrap();
        let split = tiled_wgrad_split(&g, 8).unwrap();
        assert_eq!(call.kernel, Kernel::Conv3dBwdWeightTiledBf16);
        assert_eq!(call.grid, split.grid);
        // 8 * 27 columns: 4 tiles; one row tile per group.
        assert_eq!(&call.grid[..2], &[4, 2]);
        assert_eq!(call.args.len(), 5);
        assert!(matches!(call.args[0], KernelArg::U64(0x2000)));
        assert!(matches!(call.args[1], KernelArg::U64(0x1000)));
        assert!(matches!(call.args[2], KernelArg::U64(0x3000)));
        assert!(matches!(call.args[4], KernelArg::U64(c) if c == split.chunk));
        a.dtype = DType::F32;
        let call = KernelCall::conv3d_bwd_weight_tiled(&a, 8).unwrap();
        assert_eq!(call.kernel, Kernel::Conv3dBwdWeightTiledF32);
        a.op = Conv3dBackwardOp::Data;
        assert!(KernelCall::conv3d_bwd_weight_tiled(&a, 8).is_err());
        a.op = Conv3dBackwardOp::Weight;
        a.dtype = DType::F16;
        assert!(KernelCall::conv3d_bwd_weight_tiled(&a, 8).is_err());
    }

    #[test]
    fn refusals_name_their_reason() {
        let p = Conv3dParams::default().with_groups(16);
        let g = geom([1, 16, 4, 4, 4], [16, 1, 3, 3, 3], p);
        let why = tiled_wgrad_unsupported(&g).unwrap();
        assert!(why.contains("fewer than 8 output channels"), "{why}");
        assert!(matches!(
            tiled_wgrad_split(&g, 4),
            Err(Error::Conv3dTier { tier: "tiled", .. })
        ));
        let g = geom([1, 8, 4, 4, 4], [8, 8, 3, 3, 3], Conv3dParams::default());
        assert_eq!(tiled_wgrad_unsupported(&g), None);
        // Grid limits (shapes only: nothing is allocated).
        let p = Conv3dParams::default().with_groups(65_536);
        let g = geom([1, 1 << 19, 1, 1, 1], [1 << 19, 8, 1, 1, 1], p);
        let why = tiled_wgrad_unsupported(&g).unwrap();
        assert!(why.contains("y dimension"), "{why}");
        let g = geom(
            [1, 1 << 20, 16, 8, 8],
            [8, 1 << 20, 16, 8, 8],
            Conv3dParams::default(),
        );
        let why = tiled_wgrad_unsupported(&g).unwrap();
        assert!(why.contains("x dimension"), "{why}");
    }
}
