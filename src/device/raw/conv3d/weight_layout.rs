//! How the conv3d kernels want their weight laid out in device memory:
//! [`Conv3dWeightLayout`], its choice from a backend's [`KernelCaps`], and the
//! transposition the tiled kernel reads ([`tiled_weight_layout`]), and the
//! launch that lays a weight out on the device ([`Conv3dLayoutLaunch`],
//! [`Conv3dOps::arrange_weight`](crate::device::Conv3dOps::arrange_weight)).

use std::borrow::Cow;

use super::{mma_tiles_m, Conv3dKernel, TILE_M};
use crate::conv3d::Conv3dGeometry;
use crate::device::info::DevicePtr;
use crate::device::info::KernelCaps;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// How a conv3d kernel wants its weight laid out in device memory. The
/// backend chooses ([`crate::device::raw::Backend::conv3d_weight_layout`]); the caller
/// lays the weight out so ([`Conv3dWeightLayout::arrange`]) before the
/// upload. `R = C/G * KD * KH * KW` below.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum Conv3dWeightLayout {
    /// `[K, C/G, KD, KH, KW]` as given (the naive kernel, vendor libraries).
    Standard,
    /// [`tiled_weight_layout`]: `[G][R][K/G]` (`conv3d_tiled_*`).
    TiledTransposed,
    /// `[G][rows][cols]`, each group's `[K/G][R]` block zero padded to
    /// `rows` (K/G rounded up to 128) by `cols` (R rounded up to 32): the
    /// tensor-core kernel `conv3d_tiled_bf16_mma` (CUDA, sm_80+).
    TiledPacked {
        /// Padded output channels per group (a multiple of 128).
        rows: usize,
        /// Padded reduction length (a multiple of 32).
        cols: usize,
    },
}

/// Largest KD * KH * KW of `conv3d_tiled_bf16_mma` (RS_TC_MAX_TAPS).
const MMA_MAX_TAPS: usize = 1 << 9;

impl Conv3dWeightLayout {
    /// The layout `kernel` reads for a call `g` with inputs of `dtype` on a
    /// backend with `caps`: [`Conv3dWeightLayout::Standard`] for the naive
    /// kernel; for the tiled one [`Conv3dWeightLayout::TiledPacked`] when
    /// the backend has bf16 tensor cores and the call is bf16 and fits the
    /// tensor-core kernel, else [`Conv3dWeightLayout::TiledTransposed`].
    pub fn choose(
        caps: KernelCaps,
        kernel: Conv3dKernel,
        dtype: DType,
        g: &Conv3dGeometry,
    ) -> Conv3dWeightLayout {
        match kernel {
            Conv3dKernel::Naive => Conv3dWeightLayout::Standard,
            Conv3dKernel::Tiled if dtype == DType::BF16 && caps.bf16_tensor_cores => {
                Self::packed_for(g).unwrap_or(Conv3dWeightLayout::TiledTransposed)
            }
            Conv3dKernel::Tiled => Conv3dWeightLayout::TiledTransposed,
        }
    }

    /// The packed layout of `conv3d_tiled_bf16_mma` for `g`, when that
    /// kernel takes `g` (what the tiled kernel takes, at most 512 taps, the
    /// padded sizes within its grid and `usize`).
    pub fn packed_for(g: &Conv3dGeometry) -> Option<Conv3dWeightLayout> {
        if Conv3dKernel::Tiled.cannot_take(g).is_some()
            || g.kernel.iter().product::<usize>() > MMA_MAX_TAPS
        {
            return None;
        }
        let r = g.in_per_group() * g.kernel.iter().product::<usize>();
        let rows = g.out_per_group().checked_next_multiple_of(TILE_M)?;
        let cols = r.checked_next_multiple_of(32)?;
        if mma_tiles_m(g.out_per_group()) > 65_535 {
            return None;
        }
        g.params.groups.checked_mul(rows)?.checked_mul(cols)?;
        Some(Conv3dWeightLayout::TiledPacked { rows, cols })
    }

    /// Elements of the weight in this layout.
    pub fn len(self, g: &Conv3dGeometry) -> usize {
        match self {
            Conv3dWeightLayout::Standard | Conv3dWeightLayout::TiledTransposed => {
                g.weight_shape().iter().product()
            }
            // Fits: checked by `packed_for`, the only maker of a valid one.
            Conv3dWeightLayout::TiledPacked { rows, cols } => {
                g.params.groups.saturating_mul(rows).saturating_mul(cols)
            }
        }
    }

    /// `w` (standard layout) laid out in this layout.
    ///
    /// Errors: [`Error::LengthMismatch`] when `w` is not the weight's
    /// length, or a packed layout smaller than the weight.
    pub fn arrange<'w, T: Copy + Default + Send + Sync>(
        self,
        g: &Conv3dGeometry,
        w: &'w [T],
    ) -> Result<Cow<'w, [T]>> {
        check_len(
            "conv3d weight layout",
            g.weight_shape().iter().product(),
            w.len(),
        )?;
        Ok(match self {
            Conv3dWeightLayout::Standard => Cow::Borrowed(w),
            Conv3dWeightLayout::TiledTransposed => Cow::Owned(tiled_weight_layout(g, w)),
            Conv3dWeightLayout::TiledPacked { rows, cols } => {
                let (kg, r) = (
                    g.out_per_group(),
                    g.in_per_group() * g.kernel.iter().product::<usize>(),
                );
                if rows < kg || cols < r {
                    return Err(Error::LengthMismatch {
                        op: "conv3d packed weight layout",
                        expected: kg * r,
                        actual: rows * cols,
                        tensor: None,
                    });
                }
                let mut out = vec![T::default(); self.len(g)];
                if r > 0 {
                    for (row, src) in w.chunks_exact(r).enumerate() {
                        let (grp, m) = (row / kg, row % kg);
                        let at = (grp * rows + m) * cols;
                        if let Some(dst) = out.get_mut(at..at + r) {
                            dst.copy_from_slice(src);
                        }
                    }
                }
                Cow::Owned(out)
            }
        })
    }
}

/// One rearrangement of a conv3d weight ([`KernelOp::Conv3dLayout`](crate::device::raw::KernelOp::Conv3dLayout)): the
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

/// `w` (`[K, C/G, KD, KH, KW]`, that is `[G][K/G][R]` with `R = C/G * KD *
/// KH * KW`) transposed per group into `[G][R][K/G]`: the layout
/// [`Conv3dKernel::Tiled`] reads (its weight loads are then coalesced).
/// Elements past `w`'s end (a short slice) are left at `T::default()`.
pub fn tiled_weight_layout<T: Copy + Default + Send + Sync>(g: &Conv3dGeometry, w: &[T]) -> Vec<T> {
    use rayon::prelude::*;
    let kg = g.out_per_group();
    let r_len = g.in_per_group() * g.kernel.iter().product::<usize>();
    let mut out = vec![T::default(); w.len()];
    if kg == 0 || r_len == 0 {
        return out;
    }
    // Each output row (group, r) gathers one column of the group's block.
    crate::par::install(|| {
        out.par_chunks_mut(kg).enumerate().for_each(|(row, dst)| {
            let (grp, r) = (row / r_len, row % r_len);
            for (m, d) in dst.iter_mut().enumerate() {
                if let Some(v) = w.get((grp * kg + m) * r_len + r) {
                    *d = *v;
                }
            }
        })
    });
    out
}

/// The inverse of [`tiled_weight_layout`].
pub(crate) fn standard_weight_layout<T: Copy + Default>(g: &Conv3dGeometry, wt: &[T]) -> Vec<T> {
    let kg = g.out_per_group();
    let r_len = g.in_per_group() * g.kernel.iter().product::<usize>();
    let mut out = vec![T::default(); wt.len()];
    if kg == 0 || r_len == 0 {
        return out;
    }
    for (i, d) in out.iter_mut().enumerate() {
        // i = (grp * kg + m) * r_len + r
        let (row, r) = (i / r_len, i % r_len);
        let (grp, m) = (row / kg, row % kg);
        if let Some(v) = wt.get((grp * r_len + r) * kg + m) {
            *d = *v;
        }
    }
    out
}

/// [`Error::LengthMismatch`] of `op` unless `expected == actual`.
pub(crate) fn check_len(op: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            op,
            expected,
            actual,
            tensor: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};

    #[test]
    fn tiled_layout_round_trips() {
        let x = vec![0f32; 2 * 4 * 3 * 3 * 3];
        let w: Vec<f32> = (0..12 * 2 * 3 * 3 * 3).map(|i| i as f32).collect();
        let p = Conv3dProblem::new(
            Conv3dParams::default().with_groups(2),
            Conv3dData::F32(&x),
            &[2, 4, 3, 3, 3],
            Conv3dData::F32(&w),
            &[12, 2, 3, 3, 3],
            None,
        )
        .unwrap();
        let g = p.geometry;
        let t = tiled_weight_layout(&g, &w);
        assert_ne!(t, w);
        // wt[g][r][m] = w[g * K/G + m][r]
        let (kg, r_len) = (6, 2 * 27);
        assert_eq!(t[(r_len + 5) * kg + 3], w[(kg + 3) * r_len + 5]);
        assert_eq!(standard_weight_layout(&g, &t), w);
    }

    fn geometry(input: [usize; 5], weight: [usize; 5], groups: usize) -> Conv3dGeometry {
        let x = vec![0f32; input.iter().product()];
        let w = vec![0f32; weight.iter().product()];
        Conv3dProblem::new(
            Conv3dParams::default()
                .with_groups(groups)
                .with_padding([1; 3]),
            Conv3dData::F32(&x),
            &input,
            Conv3dData::F32(&w),
            &weight,
            None,
        )
        .unwrap()
        .geometry
    }

    #[test]
    fn weight_layouts_arrange_and_pad() {
        // 2 groups of 20 output channels, R = 3 * 27 = 81.
        let g = geometry([1, 6, 4, 4, 4], [40, 3, 3, 3, 3], 2);
        let w: Vec<u16> = (1..=40 * 81).map(|i| i as u16).collect();
        let packed = Conv3dWeightLayout::packed_for(&g).unwrap();
        assert_eq!(
            packed,
            Conv3dWeightLayout::TiledPacked {
                rows: 128,
                cols: 96
            }
        );
        assert_eq!(packed.len(&g), 2 * 128 * 96);
        let p = packed.arrange(&g, &w).unwrap();
        assert_eq!(p.len(), packed.len(&g));
        // wp[g][m][r] = w[(g * 20 + m) * 81 + r]; zero padding elsewhere.
        assert_eq!(p[(128 + 7) * 96 + 80], w[(20 + 7) * 81 + 80]);
        assert_eq!(p[(128 + 7) * 96 + 81], 0);
        assert_eq!(p[(128 + 20) * 96], 0);
        assert_eq!(p.iter().filter(|&&v| v != 0).count(), w.len());
        assert!(matches!(
            Conv3dWeightLayout::Standard.arrange(&g, &w).unwrap(),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            &*Conv3dWeightLayout::TiledTransposed.arrange(&g, &w).unwrap(),
            &tiled_weight_layout(&g, &w)[..]
        );
        assert_eq!(Conv3dWeightLayout::TiledTransposed.len(&g), w.len());
        let e = packed.arrange(&g, &w[1..]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::LengthMismatch {
                    op: "conv3d weight layout",
                    ..
                }
            ),
            "{e}"
        );
        let small = Conv3dWeightLayout::TiledPacked { rows: 8, cols: 96 };
        assert!(matches!(
            small.arrange(&g, &w),
            Err(Error::LengthMismatch {
                op: "conv3d packed weight layout",
                ..
            })
        ));
        // Depthwise: the chain gives it to the naive kernel, but the tiled
        // one computes it (the guard's repair), rows padded to a tile.
        assert_eq!(
            Conv3dWeightLayout::packed_for(&geometry([1, 6, 4, 4, 4], [6, 1, 3, 3, 3], 6)),
            Some(Conv3dWeightLayout::TiledPacked {
                rows: 128,
                cols: 32
            })
        );
        // What the tensor-core kernel does not take: more than 512 taps.
        assert!(
            Conv3dWeightLayout::packed_for(&geometry([1, 2, 9, 9, 9], [16, 2, 9, 9, 9], 1))
                .is_none()
        );
        assert!(
            Conv3dWeightLayout::packed_for(&geometry([1, 2, 8, 8, 8], [16, 2, 8, 8, 8], 1))
                .is_some()
        );
    }
}
