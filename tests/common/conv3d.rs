//! Shared by the conv3d tests: a table of cases, deterministic data, and a
//! comparison of a tier's output with the float64 reference.

use super::Rng;
use rocm_safe::conv3d::{reference_point, Conv3dData, Conv3dParams, Conv3dProblem};

/// One conv3d case: shapes, parameters, bias or not.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    pub input: [usize; 5],
    pub weight: [usize; 5],
    pub params: Conv3dParams,
    pub bias: bool,
}

fn p(stride: [usize; 3], padding: [usize; 3], dilation: [usize; 3], groups: usize) -> Conv3dParams {
    Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    }
}

/// The table every tier is tested over.
pub fn cases() -> Vec<Case> {
    let c = |name, input, weight, params, bias| Case {
        name,
        input,
        weight,
        params,
        bias,
    };
    vec![
        c(
            "k3 p1",
            [1, 2, 5, 6, 7],
            [3, 2, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 1),
            true,
        ),
        c(
            "stride 2",
            [2, 3, 6, 7, 9],
            [4, 3, 3, 3, 3],
            p([2; 3], [1; 3], [1; 3], 1),
            true,
        ),
        c(
            "stride and padding per axis",
            [1, 2, 7, 8, 9],
            [3, 2, 3, 3, 3],
            p([1, 2, 3], [0, 1, 2], [1; 3], 1),
            true,
        ),
        c(
            "dilation 2",
            [1, 2, 7, 7, 7],
            [2, 2, 3, 3, 3],
            p([1; 3], [2; 3], [2; 3], 1),
            false,
        ),
        c(
            "dilation per axis",
            [1, 2, 6, 9, 12],
            [2, 2, 3, 3, 3],
            p([1; 3], [1; 3], [1, 2, 3], 1),
            true,
        ),
        c(
            "groups 2",
            [1, 4, 4, 5, 6],
            [6, 2, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 2),
            true,
        ),
        c(
            "depthwise",
            [2, 5, 4, 4, 20],
            [5, 1, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 5),
            true,
        ),
        c(
            "depthwise multiplier 2",
            [1, 3, 3, 5, 5],
            [6, 1, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 3),
            false,
        ),
        c(
            "kernel 1",
            [2, 8, 3, 4, 5],
            [5, 8, 1, 1, 1],
            p([1; 3], [0; 3], [1; 3], 1),
            true,
        ),
        c(
            "asymmetric kernel",
            [1, 3, 5, 6, 7],
            [2, 3, 1, 3, 5],
            p([1; 3], [0, 1, 2], [1; 3], 1),
            true,
        ),
        c(
            "batch 3 no bias",
            [3, 2, 4, 4, 4],
            [3, 2, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 1),
            false,
        ),
        c(
            "tiny 1x1x1",
            [1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1],
            p([1; 3], [0; 3], [1; 3], 1),
            true,
        ),
        c(
            "kernel as large as input",
            [1, 2, 3, 3, 3],
            [4, 2, 3, 3, 3],
            p([1; 3], [0; 3], [1; 3], 1),
            true,
        ),
        c(
            "padding wider than kernel",
            [1, 2, 2, 3, 2],
            [2, 2, 1, 1, 1],
            p([1; 3], [2, 1, 3], [1; 3], 1),
            true,
        ),
        c(
            "empty batch",
            [0, 2, 3, 3, 3],
            [2, 2, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 1),
            true,
        ),
        c(
            "no output channels",
            [1, 2, 3, 3, 3],
            [0, 2, 1, 1, 1],
            p([1; 3], [0; 3], [1; 3], 1),
            false,
        ),
        c(
            "no input channels",
            [1, 0, 3, 3, 3],
            [2, 0, 1, 1, 1],
            p([1; 3], [0; 3], [1; 3], 1),
            true,
        ),
        c(
            "wide rows, 6 out",
            [1, 3, 2, 3, 37],
            [6, 3, 2, 3, 3],
            p([1; 3], [1; 3], [1; 3], 1),
            true,
        ),
        c(
            "width stride and dilation 2",
            [1, 2, 3, 4, 40],
            [5, 2, 3, 3, 3],
            p([1, 1, 2], [1; 3], [1, 1, 2], 1),
            true,
        ),
        c(
            "groups 3, 9 out",
            [1, 6, 3, 4, 18],
            [9, 2, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 3),
            true,
        ),
        // At least 8 output channels per group: cases the tiled GPU kernel takes.
        c(
            "tiled: stride 2, dilation, 16 out",
            [2, 6, 7, 9, 11],
            [16, 6, 3, 3, 3],
            p([2; 3], [2; 3], [1, 2, 1], 1),
            true,
        ),
        c(
            "tiled: groups 2, kernel 1",
            [1, 8, 3, 5, 7],
            [32, 4, 1, 1, 1],
            p([1; 3], [0; 3], [1; 3], 2),
            true,
        ),
        c(
            "tiled: 130 out, asymmetric kernel",
            [1, 3, 3, 4, 5],
            [130, 3, 1, 2, 3],
            p([1; 3], [0, 1, 1], [1; 3], 1),
            true,
        ),
        c(
            "tiled: batch 3, many points",
            [3, 4, 5, 9, 13],
            [12, 4, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 1),
            false,
        ),
        c(
            "tiled: kernel 5, stride 3",
            [1, 2, 9, 9, 9],
            [9, 2, 5, 5, 5],
            p([3; 3], [2; 3], [1; 3], 1),
            true,
        ),
        c(
            "large channels",
            [1, 40, 3, 5, 33],
            [20, 40, 3, 3, 3],
            p([1; 3], [1; 3], [1; 3], 1),
            true,
        ),
    ]
}

/// Deterministic values in [-1, 1), varied per `salt` (the seed).
pub fn values(n: usize, salt: u64) -> Vec<f32> {
    Rng::new(salt).f32s(n, -1.0, 1.0)
}

/// The data of one case, in f32 and in bf16.
pub struct Data {
    pub x: Vec<f32>,
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub xb: Vec<half::bf16>,
    pub wb: Vec<half::bf16>,
}

impl Data {
    pub fn new(case: &Case) -> Self {
        let x = values(case.input.iter().product(), 1);
        let w = values(case.weight.iter().product(), 2);
        let b = values(case.weight[0], 3);
        let xb = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let wb = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
        Data { x, w, b, xb, wb }
    }

    pub fn problem(&self, case: &Case, bf16: bool) -> Conv3dProblem<'_> {
        let bias = case.bias.then_some(Conv3dData::F32(&self.b));
        let (x, w) = if bf16 {
            (Conv3dData::BF16(&self.xb), Conv3dData::BF16(&self.wb))
        } else {
            (Conv3dData::F32(&self.x), Conv3dData::F32(&self.w))
        };
        Conv3dProblem::new(case.params, x, &case.input, w, &case.weight, bias).unwrap()
    }
}

/// Asserts `out` equals the f64 reference within `rel` of each point's
/// magnitude (`|bias| + sum |x * w|`), at every point.
pub fn assert_close(what: &str, p: &Conv3dProblem<'_>, out: &[f32], rel: f64) {
    let g = p.geometry;
    assert_eq!(out.len(), g.output_len(), "{what}: output length");
    for (i, &got) in out.iter().enumerate() {
        let r = reference_point(p, i).unwrap();
        let tol = rel * r.magnitude + 1e-30;
        assert!(
            (f64::from(got) - r.value).abs() <= tol,
            "{what}: index {i} of {:?}: got {got}, expected {} (tolerance {tol:e})",
            g.output_shape(),
            r.value
        );
    }
}
