//! The tiled weight gradient on a device
//! ([`Conv3dOps::backward_weight_tiled`](crate::device::Conv3dOps::backward_weight_tiled),
//! `conv3d_bwd_weight_tiled_{f32,bf16}` in `kernels/conv3d_wgrad.hip`):
//! one implicit GEMM per group, `dw[g*Kg + m][(c, tap)] = sum over (n, o)
//! of dy[n][g*Kg + m][o] * x[n][g*Cg + c][o * stride + tap * dilation -
//! padding]`, on 64 x 64 tiles of `dw` with the reduction over the batch
//! and the output volume split into chunks (split-K,
//! [`tiled_wgrad_split`]) whose partial tiles are added into the zeroed
//! result with float atomics; the launch
//! ([`KernelOp::Conv3dBackwardWeightTiled`](crate::device::raw::KernelOp::Conv3dBackwardWeightTiled)) and its grid.

use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
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
const GRID_X_MAX: usize = (u32::MAX / WGRAD_BLOCK) as usize;
/// Threads per block of the kernel (every kernel's: `kernels.rs` checks
/// that its `BLOCK` is this).
pub(crate) const WGRAD_BLOCK: u32 = 256;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d::Conv3dParams;

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
