//! The float64 reference: the definition of conv3d, written plainly.
//!
//! Tests compare every tier with it; the chain's sampled verification
//! recomputes single output points with [`reference_point`].

use super::params::Conv3dProblem;

/// One output point computed in f64: the value and the sum of the absolute
/// values of its products (the scale a rounding-error bound is relative to).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RefPoint {
    /// The exact-as-f64 value of the output point (bias included).
    pub value: f64,
    /// `|bias| + sum |x * w|` over the point's products.
    pub magnitude: f64,
}

/// Output point at flat index `index` of `[N, K, OD, OH, OW]`, in f64.
/// `None` when `index` is past the output.
pub fn reference_point(p: &Conv3dProblem<'_>, index: usize) -> Option<RefPoint> {
    let g = &p.geometry;
    if index >= g.output_len() {
        return None;
    }
    let [od_n, oh_n, ow_n] = g.output;
    let ow = index % ow_n;
    let oh = index / ow_n % oh_n;
    let od = index / (ow_n * oh_n) % od_n;
    let k = index / (ow_n * oh_n * od_n) % g.out_channels;
    let n = index / (ow_n * oh_n * od_n * g.out_channels);
    let out = [od, oh, ow];

    let cg = g.in_per_group();
    let group = k / g.out_per_group();
    let [d_n, h_n, w_n] = g.input;
    let [kd_n, kh_n, kw_n] = g.kernel;
    let bias = f64::from(p.bias_f32(k));
    let mut value = bias;
    let mut magnitude = bias.abs();
    for ci in 0..cg {
        let c = group * cg + ci;
        for kd in 0..kd_n {
            for kh in 0..kh_n {
                for kw in 0..kw_n {
                    let tap = [kd, kh, kw];
                    // Input coordinate along each axis, or None in the padding.
                    let mut pos = [0usize; 3];
                    let mut inside = true;
                    for a in 0..3 {
                        let x = (out[a] * g.params.stride[a] + tap[a] * g.params.dilation[a])
                            as i64
                            - g.params.padding[a] as i64;
                        let size = [d_n, h_n, w_n][a] as i64;
                        if x < 0 || x >= size {
                            inside = false;
                        } else {
                            pos[a] = x as usize;
                        }
                    }
                    if !inside {
                        continue;
                    }
                    let xi =
                        (((n * g.in_channels + c) * d_n + pos[0]) * h_n + pos[1]) * w_n + pos[2];
                    let wi = (((k * cg + ci) * kd_n + kd) * kh_n + kh) * kw_n + kw;
                    let x = f64::from(p.input.get_f32(xi)?);
                    let w = f64::from(p.weight.get_f32(wi)?);
                    value += x * w;
                    magnitude += (x * w).abs();
                }
            }
        }
    }
    Some(RefPoint { value, magnitude })
}

/// The whole output in f64 (slow: for tests and small shapes).
pub fn reference(p: &Conv3dProblem<'_>) -> Vec<f64> {
    (0..p.geometry.output_len())
        .map_while(|i| reference_point(p, i).map(|r| r.value))
        .collect()
}

/// Sample `j` of the output points a result is checked at: `0`, then
/// `len - 1`, then a splitmix64 sequence of `seed` modulo `len`. `None`
/// for an empty output. The chain's sampled points on the host and the
/// device check kernel (`conv3d_check_*`) use this same sequence, so both
/// check the same points.
pub fn sample_index(len: usize, seed: u64, j: usize) -> Option<usize> {
    if len == 0 {
        return None;
    }
    Some(match j {
        0 => 0,
        1 => len - 1,
        _ => {
            let mut z = seed.wrapping_add((j as u64 - 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            (z % len as u64) as usize
        }
    })
}
