//! The input gradient at stride 1 as a forward convolution: the geometry
//! ([`Conv3dGeometry::data_grad_as_forward`]) and the weight it reads
//! ([`flip_weight`], the CPU definition of the device kernel
//! `conv3d_flip_weight_*`); and a strided one as a stride-1 one of `dy`
//! spread by the stride ([`Conv3dGeometry::data_grad_unstrided`],
//! [`zero_insert`], the CPU definition of `conv3d_zero_insert_*`).
//!
//! For a forward convolution `g` with stride 1 on every axis, input
//! `[N, C, D, H, W]`, weight `W` `[K, C/G, KD, KH, KW]` and `dy`
//! `[N, K, OD, OH, OW]`, the input gradient
//! ([`Conv3dBackwardOp::Data`](super::Conv3dBackwardOp::Data), and so
//! `conv_transpose3d` with stride 1) is the forward convolution of `dy`
//! with `W'`, padding `dilation * (k - 1) - padding` per axis, the same
//! dilation, stride 1 and groups, where `W'` `[C, K/G, KD, KH, KW]` swaps
//! the input and output channels within each group and flips every tap:
//! `W'[g*Cg + c, k, a, b, e] = W[g*Kg + k, c, KD-1-a, KH-1-b, KW-1-e]`
//! (`Cg = C/G`, `Kg = K/G`). Tap `a` of output point `z` reads
//! `dy[z - (dil*(k-1) - pad) + a*dil] = dy[z + pad - (k-1-a)*dil]`: the
//! gather of the input gradient at tap `k-1-a`.
//!
//! With a stride `s`, `dx[z] = sum over taps t of dy[o] * W[t]` where `o *
//! s = z + pad - t * dil`: the stride-1 input gradient of `dy` with zeros
//! inserted (`dyz[o * s] = dy[o]`, zero elsewhere), its size the stride-1
//! output `D + 2 * pad - dil * (k - 1)` (which also covers a transposed
//! convolution's `output_padding`: the extra positions are zeros).

use rayon::prelude::*;

use super::params::{Conv3dGeometry, Conv3dParams};
use crate::error::{Error, Result};

impl Conv3dGeometry {
    /// The forward convolution whose output is the input gradient of this
    /// one (see the module docs): input `dy` `[N, K, OD, OH, OW]`, weight
    /// [`flip_weight`] of this one's `[C, K/G, KD, KH, KW]`, output `[N, C,
    /// D, H, W]`, padding `dilation * (k - 1) - padding`, the same dilation
    /// and groups, stride 1.
    ///
    /// Errors (the reason, for a tier's `Unsupported`): a stride above 1 on
    /// some axis; a padding above `dilation * (k - 1)` on some axis (the
    /// flipped padding would be negative); an output smaller than the
    /// forward formula gives (`conv_transpose3d` with an `output_padding`:
    /// the flipped convolution would need padding on one side only); a
    /// zero size or a size that overflows.
    pub fn data_grad_as_forward(&self) -> std::result::Result<Conv3dGeometry, &'static str> {
        let p = &self.params;
        if p.stride != [1; 3] {
            return Err(
                "a stride above 1 (the input gradient is a forward convolution at stride 1 only)",
            );
        }
        if self.kernel.contains(&0) || self.output.contains(&0) || self.input.contains(&0) {
            return Err("zero-size tensors are not sent to a device");
        }
        let mut padding = [0usize; 3];
        for (a, flipped) in padding.iter_mut().enumerate() {
            let reach = (self.kernel[a] - 1)
                .checked_mul(p.dilation[a])
                .ok_or("a dilated kernel offset overflows")?;
            *flipped = reach.checked_sub(p.padding[a]).ok_or(
                "a padding above dilation * (kernel - 1) (the flipped padding would be negative)",
            )?;
            // Stride 1: the forward formula's output is input + 2 pad - reach.
            let covered = self.output[a].checked_add(reach);
            let spans = p.padding[a]
                .checked_mul(2)
                .and_then(|v| v.checked_add(self.input[a]));
            if covered != spans {
                return Err("an output smaller than the forward formula gives (conv_transpose3d with output_padding)");
            }
        }
        let params = Conv3dParams {
            stride: [1; 3],
            padding,
            dilation: p.dilation,
            groups: p.groups,
        };
        let [kd, kh, kw] = self.kernel;
        let dy = self.output_shape();
        let weight = [self.in_channels, self.out_per_group(), kd, kh, kw];
        let fwd = Conv3dGeometry::new(params, &dy, &weight)
            .map_err(|_| "the flipped convolution's shapes are not valid")?;
        if fwd.output != self.input || fwd.out_channels != self.in_channels {
            // Cannot happen by the formula; refused rather than trusted.
            return Err("the flipped convolution does not produce the input's shape");
        }
        Ok(fwd)
    }
}

impl Conv3dGeometry {
    /// The stride-1 convolution whose input gradient, of `dy` spread by the
    /// stride ([`zero_insert`] into this geometry's output size), is this
    /// one's: the same input, weight, padding, dilation and groups, stride
    /// 1, so its output is `D + 2 * padding - dilation * (k - 1)` per axis
    /// (at least `(OD - 1) * stride + 1`; more where the forward formula
    /// rounded down or the transposed convolution has an `output_padding`,
    /// the extra positions zero). For a stride-1 geometry without
    /// `output_padding` it is the geometry itself.
    ///
    /// Errors (the reason): a zero size; shapes that do not make a valid
    /// stride-1 convolution; an output whose zero-inserted size exceeds
    /// the stride-1 output (cannot happen for a validated geometry).
    pub fn data_grad_unstrided(&self) -> std::result::Result<Conv3dGeometry, &'static str> {
        if self.output.contains(&0) || self.input.contains(&0) || self.kernel.contains(&0) {
            return Err("zero-size tensors are not sent to a device");
        }
        let params = Conv3dParams {
            stride: [1; 3],
            ..self.params
        };
        let g1 = Conv3dGeometry::new(params, &self.input_shape(), &self.weight_shape())
            .map_err(|_| "the unstrided convolution's shapes are not valid")?;
        for a in 0..3 {
            let last = (self.output[a] - 1).checked_mul(self.params.stride[a]);
            if last.is_none_or(|v| v >= g1.output[a]) {
                return Err("the zero-inserted dy does not fit the unstrided output");
            }
        }
        Ok(g1)
    }
}

/// `dy` (`[N, K, OD, OH, OW]` of the forward convolution `g`) spread by
/// `g`'s stride into `out` (`[N, K, ZD, ZH, ZW]`, `expanded` = `[ZD, ZH,
/// ZW]`): `out[n, k, z, y, x] = dy[n, k, z/sd, y/sh, x/sw]` where each
/// coordinate is a multiple of its stride and the quotient inside `dy`,
/// else zero. What `conv3d_zero_insert_*` computes on a device.
///
/// Errors: [`Error::LengthMismatch`] when `dy` or `out` is not its shape's
/// length.
pub fn zero_insert<T: Copy + Default + Send + Sync>(
    g: &Conv3dGeometry,
    expanded: [usize; 3],
    dy: &[T],
    out: &mut [T],
) -> Result<()> {
    let planes = g.batch * g.out_channels;
    let zvol: usize = expanded.iter().product();
    for (op, expected, actual) in [
        ("conv3d zero insertion source", g.output_len(), dy.len()),
        (
            "conv3d zero insertion destination",
            planes * zvol,
            out.len(),
        ),
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
    let [od, oh, ow] = g.output;
    let [zh, zw] = [expanded[1], expanded[2]];
    let [sd, sh, sw] = g.params.stride;
    if zvol == 0 {
        return Ok(());
    }
    crate::par::install(|| {
        out.par_chunks_mut(zvol)
            .enumerate()
            .for_each(|(nk, plane)| {
                plane.fill(T::default());
                let src = &dy[nk * od * oh * ow..][..od * oh * ow];
                for (i, &v) in src.iter().enumerate() {
                    let (z, y, x) = (i / (oh * ow), i / ow % oh, i % ow);
                    let at = (z * sd * zh + y * sh) * zw + x * sw;
                    if let Some(d) = plane.get_mut(at) {
                        *d = v;
                    }
                }
            })
    });
    Ok(())
}

/// `w` (`[K, C/G, KD, KH, KW]` of the forward convolution `g`) flipped
/// into `out` (`[C, K/G, KD, KH, KW]`): `out[g*Cg + c, k, a, b, e] =
/// w[g*Kg + k, c, KD-1-a, KH-1-b, KW-1-e]` (see the module docs). What
/// `conv3d_flip_weight_*` computes on a device.
///
/// Errors: [`Error::LengthMismatch`] when `w` or `out` is not the weight's
/// length.
pub fn flip_weight<T: Copy + Send + Sync>(
    g: &Conv3dGeometry,
    w: &[T],
    out: &mut [T],
) -> Result<()> {
    let len: usize = g.weight_shape().iter().product();
    for (op, actual) in [
        ("conv3d flip source", w.len()),
        ("conv3d flip destination", out.len()),
    ] {
        if actual != len {
            return Err(Error::LengthMismatch {
                op,
                expected: len,
                actual,
                tensor: None,
            });
        }
    }
    let [kd, kh, kw] = g.kernel;
    let taps = kd * kh * kw;
    let (cg, kg) = (g.in_per_group(), g.out_per_group());
    if len == 0 || taps == 0 || cg == 0 || kg == 0 {
        return Ok(());
    }
    // One destination row of taps per (g*Cg + c, k): the source row
    // (g*Kg + k, c) read backwards.
    crate::par::install(|| {
        out.par_chunks_mut(taps).enumerate().for_each(|(row, dst)| {
            let (cc, k) = (row / kg, row % kg);
            let (grp, c) = (cc / cg, cc % cg);
            let src = &w[((grp * kg + k) * cg + c) * taps..][..taps];
            for (d, s) in dst.iter_mut().zip(src.iter().rev()) {
                *d = *s;
            }
        })
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flip_reverses_taps_and_swaps_channels_per_group() {
        let params = Conv3dParams::default()
            .with_groups(2)
            .with_padding([1, 0, 2])
            .with_dilation([1, 2, 1]);
        let g = Conv3dGeometry::new(params, &[1, 4, 5, 6, 7], &[6, 2, 3, 2, 3]).unwrap();
        let w: Vec<u32> = (0..6 * 2 * 18).collect();
        let mut f = vec![0u32; w.len()];
        flip_weight(&g, &w, &mut f).unwrap();
        let (cg, kg) = (2, 3);
        for grp in 0..2 {
            for c in 0..cg {
                for k in 0..kg {
                    for a in 0..3 {
                        for b in 0..2 {
                            for e in 0..3 {
                                let dst = ((((grp * cg + c) * kg + k) * 3 + a) * 2 + b) * 3 + e;
                                let src = ((((grp * kg + k) * cg + c) * 3 + (2 - a)) * 2 + (1 - b))
                                    * 3
                                    + (2 - e);
                                assert_eq!(f[dst], w[src]);
                            }
                        }
                    }
                }
            }
        }
        let fwd = g.data_grad_as_forward().unwrap();
        assert_eq!(fwd.input_shape(), [1, 6, 5, 4, 9]);
        assert_eq!(fwd.weight_shape(), [4, 3, 3, 2, 3]);
        assert_eq!(fwd.output_shape(), g.input_shape());
        assert_eq!(fwd.params.padding, [1, 2, 0]);
        assert!(flip_weight(&g, &w[1..], &mut f).is_err());
    }

    #[test]
    fn data_grad_as_forward_refuses_what_it_cannot_express() {
        let g = |params: Conv3dParams| {
            Conv3dGeometry::new(params, &[1, 8, 6, 6, 6], &[8, 8, 3, 3, 3]).unwrap()
        };
        let base = Conv3dParams::default().with_padding([1; 3]);
        assert!(g(base).data_grad_as_forward().is_ok());
        let e = g(base.with_stride([1, 2, 1]))
            .data_grad_as_forward()
            .unwrap_err();
        assert!(e.contains("stride"), "{e}");
        let e = g(base.with_padding([0, 3, 0]))
            .data_grad_as_forward()
            .unwrap_err();
        assert!(e.contains("padding"), "{e}");
        // conv_transpose3d with output_padding 1 (dilation 2 allows it).
        let params = Conv3dParams::default()
            .with_dilation([2; 3])
            .with_padding([1; 3]);
        let t = Conv3dGeometry::transposed(params, [1, 0, 0], &[1, 8, 4, 4, 4], &[8, 8, 3, 3, 3])
            .unwrap();
        let e = t.data_grad_as_forward().unwrap_err();
        assert!(e.contains("output_padding"), "{e}");
        let t =
            Conv3dGeometry::transposed(params, [0; 3], &[1, 8, 4, 4, 4], &[8, 8, 3, 3, 3]).unwrap();
        assert_eq!(t.data_grad_as_forward().unwrap().output, t.input);
    }

    #[test]
    fn data_grad_unstrided_keeps_every_dy_point_and_the_input() {
        let params = Conv3dParams::default()
            .with_stride([2, 3, 1])
            .with_padding([1, 0, 1]);
        // The stride-1 output D + 2p - (k - 1): 7 + 2 - 2 = 7 = (4 - 1) * 2 + 1
        // (d); 9 - 1 = 8 = (3 - 1) * 3 + 2 (h: the forward formula rounded down).
        let g = Conv3dGeometry::new(params, &[1, 8, 7, 9, 5], &[4, 8, 3, 2, 3]).unwrap();
        assert_eq!(g.output, [4, 3, 5]);
        let g1 = g.data_grad_unstrided().unwrap();
        assert_eq!(g1.params.stride, [1; 3]);
        assert_eq!(g1.output, [7, 8, 5]);
        assert_eq!((g1.input, g1.kernel), (g.input, g.kernel));
        for a in 0..3 {
            assert!((g.output[a] - 1) * g.params.stride[a] < g1.output[a]);
        }
        // A stride-1 geometry is its own.
        let s1 = Conv3dGeometry::new(Conv3dParams::default(), &[1, 8, 4, 4, 4], &[8, 8, 3, 3, 3])
            .unwrap();
        assert_eq!(s1.data_grad_unstrided().unwrap(), s1);
        let dy: Vec<u16> = (1..=g.output_len() as u16).collect();
        let mut out = vec![9u16; 4 * 7 * 8 * 5];
        zero_insert(&g, g1.output, &dy, &mut out).unwrap();
        assert_eq!(out.iter().filter(|&&v| v != 0).count(), dy.len());
        // dy[k=1, 2, 1, 3] at (4, 3, 3).
        assert_eq!(
            out[((7 + 4) * 8 + 3) * 5 + 3],
            dy[((4 + 2) * 3 + 1) * 5 + 3]
        );
        assert!(zero_insert(&g, g1.output, &dy[1..], &mut out).is_err());
    }
}
