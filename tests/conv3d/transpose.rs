//! Issue 21, item 5: `conv_transpose3d` through the chain (the gradients:
//! `tests/conv3d/backward.rs`).
//!
//! The transposed convolution's f64 reference is tested against its
//! scatter definition written here; the chain's result (the naive GPU
//! kernels, the vendor tier forbidden; and separately the vendor tier:
//! cuDNN or MIOpen on a GPU, a stand-in library on the host backend)
//! against both, on the host (`run_backward`) and on device memory
//! (`conv_transpose3d_device`), with groups, stride, dilation, padding and
//! output_padding; and the verify mode's check of an output something else
//! computed. Each device test runs on the host backend here
//! and, with `--include-ignored`, on a CUDA or HIP device.

use crate::common;

use common::conv3d::values;
use common::conv3d_backward::{assert_backward_close, chain, to_bf16, Buf};
use common::vendor_standin::{vendor_served, with_vendor_backward};
use common::Open;
use half::bf16;
use rocm_safe::conv3d::{backward_reference, Conv3dBackwardProblem, Conv3dData, Conv3dParams};
use rocm_safe::conv3d_chain::{Conv3dChain, Conv3dReport, TierKind};
use rocm_safe::device::Device;
use rocm_safe::fallback::{Failure, Outcome};
use rocm_safe::Error;

/// One transposed-convolution case.
struct Tcase {
    name: &'static str,
    input: [usize; 5],
    weight: [usize; 5],
    params: Conv3dParams,
    output_padding: [usize; 3],
    bias: bool,
}

fn tcases() -> Vec<Tcase> {
    let p = |stride, padding, dilation, groups| Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    let t = |name, input, weight, params, output_padding, bias| Tcase {
        name,
        input,
        weight,
        params,
        output_padding,
        bias,
    };
    vec![
        t(
            "stride 2 k3 p1",
            [1, 3, 3, 4, 5],
            [3, 2, 3, 3, 3],
            p([2; 3], [1; 3], [1; 3], 1),
            [0; 3],
            true,
        ),
        t(
            "output padding 1",
            [2, 2, 3, 3, 4],
            [2, 3, 3, 3, 3],
            p([2; 3], [1; 3], [1; 3], 1),
            [1, 0, 1],
            true,
        ),
        t(
            "groups 2, stride per axis",
            [1, 4, 3, 4, 3],
            [4, 3, 2, 3, 1],
            p([1, 2, 3], [0, 1, 0], [1; 3], 2),
            [0, 1, 2],
            false,
        ),
        t(
            "dilation 2, padding 2",
            [1, 2, 4, 4, 4],
            [2, 2, 3, 3, 3],
            p([1; 3], [2; 3], [2; 3], 1),
            [0; 3],
            true,
        ),
        t(
            "output padding >= stride (dilation 3)",
            [1, 2, 3, 3, 3],
            [2, 2, 2, 2, 2],
            p([1; 3], [0; 3], [3; 3], 1),
            [2, 1, 0],
            true,
        ),
        t(
            "depthwise stride 2",
            [1, 3, 3, 3, 3],
            [3, 1, 3, 3, 3],
            p([2; 3], [1; 3], [1; 3], 3),
            [1; 3],
            true,
        ),
        t(
            "tiny 1x1",
            [1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1],
            p([1; 3], [0; 3], [1; 3], 1),
            [0; 3],
            true,
        ),
    ]
}

/// conv_transpose3d by its scatter definition, in f64: every input value
/// times every weight tap lands at `i * stride + t * dilation - padding`.
fn scatter_transpose(c: &Tcase, x: &[f32], w: &[f32], b: Option<&[f32]>) -> (Vec<usize>, Vec<f64>) {
    let [n, cin, d, h, wd] = c.input;
    let [_, coutg, kd, kh, kw] = c.weight;
    let g = c.params.groups;
    let cout = coutg * g;
    let cing = cin / g;
    let (s, p, dl, op) = (
        c.params.stride,
        c.params.padding,
        c.params.dilation,
        c.output_padding,
    );
    let size =
        |a: usize, x: usize, k: usize| (x - 1) * s[a] + dl[a] * (k - 1) + op[a] + 1 - 2 * p[a];
    let out = [size(0, d, kd), size(1, h, kh), size(2, wd, kw)];
    let mut y = vec![0f64; n * cout * out.iter().product::<usize>()];
    let at = |nn: usize, co: usize, z: usize, yy: usize, xx: usize| {
        (((nn * cout + co) * out[0] + z) * out[1] + yy) * out[2] + xx
    };
    for nn in 0..n {
        for ci in 0..cin {
            let grp = ci / cing;
            for z in 0..d {
                for yy in 0..h {
                    for xx in 0..wd {
                        let v = f64::from(x[(((nn * cin + ci) * d + z) * h + yy) * wd + xx]);
                        for o in 0..coutg {
                            for a in 0..kd {
                                for bb in 0..kh {
                                    for cc in 0..kw {
                                        let pos = [
                                            (z * s[0] + a * dl[0]) as i64 - p[0] as i64,
                                            (yy * s[1] + bb * dl[1]) as i64 - p[1] as i64,
                                            (xx * s[2] + cc * dl[2]) as i64 - p[2] as i64,
                                        ];
                                        if (0..3).any(|q| pos[q] < 0 || pos[q] >= out[q] as i64) {
                                            continue;
                                        }
                                        let wi = (((ci * coutg + o) * kd + a) * kh + bb) * kw + cc;
                                        let co = grp * coutg + o;
                                        y[at(
                                            nn,
                                            co,
                                            pos[0] as usize,
                                            pos[1] as usize,
                                            pos[2] as usize,
                                        )] += v * f64::from(w[wi]);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    if let Some(b) = b {
        let vol: usize = out.iter().product();
        for (i, v) in y.iter_mut().enumerate() {
            *v += f64::from(b[i / vol % cout]);
        }
    }
    (vec![n, cout, out[0], out[1], out[2]], y)
}

struct Tdata {
    x: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
    xb: Vec<bf16>,
    wb: Vec<bf16>,
}

impl Tdata {
    fn new(c: &Tcase) -> Tdata {
        let x = values(c.input.iter().product(), 21);
        let w = values(c.weight.iter().product(), 22);
        let b = values(c.weight[1] * c.params.groups, 23);
        Tdata {
            xb: to_bf16(&x),
            wb: to_bf16(&w),
            x,
            w,
            b,
        }
    }
    fn problem(&self, c: &Tcase, bf: bool) -> Conv3dBackwardProblem<'_> {
        let (x, w) = if bf {
            (Conv3dData::BF16(&self.xb), Conv3dData::BF16(&self.wb))
        } else {
            (Conv3dData::F32(&self.x), Conv3dData::F32(&self.w))
        };
        let b = c.bias.then_some(Conv3dData::F32(&self.b));
        Conv3dBackwardProblem::conv_transpose3d(
            c.params,
            c.output_padding,
            x,
            &c.input,
            w,
            &c.weight,
            b,
        )
        .unwrap()
    }
}

/// The transposed convolution as the Data op of `Conv3dGeometry::transposed`
/// is its scatter definition (shape and values), output_padding at and
/// beyond the stride included.
#[test]
fn conv_transpose3d_reference_is_the_scatter_definition() {
    for c in tcases() {
        let t = Tdata::new(&c);
        let p = t.problem(&c, false);
        let (shape, want) = scatter_transpose(&c, &t.x, &t.w, c.bias.then_some(&t.b[..]));
        assert_eq!(p.output_shape(), shape, "{}", c.name);
        let got = backward_reference(&p);
        for (i, (g, e)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - e).abs() <= 1e-12 * (1.0 + e.abs()),
                "{}: {i}: {g} vs {e}",
                c.name
            );
        }
    }
}
/// conv_transpose3d through the chain (host and device; f32 and bf16
/// operands; f32 and bf16 biases on the device) equals its scatter
/// definition.
fn conv_transpose3d_through_the_chain(dev: &Device) {
    let chain = chain(dev);
    for c in tcases() {
        let t = Tdata::new(&c);
        for bf in [false, true] {
            let p = t.problem(&c, bf);
            let what = format!("{} bf16={bf}", c.name);
            let (out, report) = chain.run_backward(&p).unwrap();
            assert_eq!(
                report.served_by(),
                Some(TierKind::Naive),
                "{what}: {report}"
            );
            assert_backward_close(&what, &p, &out, 1e-5);
            let (x, w) = if bf {
                (
                    t.xb.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
                    t.wb.iter().map(|v| v.to_f32()).collect(),
                )
            } else {
                (t.x.clone(), t.w.clone())
            };
            let (_, want) = scatter_transpose(&c, &x, &w, c.bias.then_some(&t.b[..]));
            for (i, (g, e)) in out.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - e).abs() <= 1e-4 * (1.0 + e.abs()),
                    "{what}: {i}: {g} vs {e}"
                );
            }
            for bias_bf16 in [false, true] {
                let s = dev.stream().unwrap();
                let xd = Buf::up(&s, p.grad_output);
                let wd = Buf::up(&s, p.other.unwrap());
                let bb = to_bf16(&t.b);
                let bd = match (c.bias, bias_bf16) {
                    (false, _) => None,
                    (true, false) => Some(Buf::up(&s, Conv3dData::F32(&t.b))),
                    (true, true) => Some(Buf::up(&s, Conv3dData::BF16(&bb))),
                };
                let mut y = s.alloc_zeros::<f32>(out.len()).unwrap();
                let report = chain
                    .conv_transpose3d_device(
                        &s,
                        c.params,
                        c.output_padding,
                        xd.data(),
                        &c.input,
                        wd.data(),
                        &c.weight,
                        bd.as_ref().map(Buf::data),
                        &mut y.view_mut(),
                    )
                    .unwrap();
                assert_eq!(
                    report.served_by(),
                    Some(TierKind::Naive),
                    "{what}: {report}"
                );
                let got = y.to_vec().unwrap();
                let bias_b: Vec<f32> = if bias_bf16 {
                    bb.iter().map(|v| v.to_f32()).collect()
                } else {
                    t.b.clone()
                };
                let (_, want) = scatter_transpose(&c, &x, &w, c.bias.then_some(&bias_b[..]));
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(*g) - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{what} device bias_bf16={bias_bf16}: {i}: {g} vs {e}"
                    );
                }
            }
        }
    }
}
/// `verify_conv_transpose3d_device` (the verify mode's check of torch's
/// own output): the chain's output passes; one a little off, or with a NaN
/// at a sampled point, is a mismatch.
fn conv_transpose3d_verify(dev: &Device) {
    let chain = chain(dev);
    for c in tcases() {
        let t = Tdata::new(&c);
        let p = t.problem(&c, false);
        let (out, _) = chain.run_backward(&p).unwrap();
        let s = dev.stream().unwrap();
        let xd = Buf::up(&s, p.grad_output);
        let wd = Buf::up(&s, p.other.unwrap());
        let bd = c.bias.then(|| Buf::up(&s, Conv3dData::F32(&t.b)));
        let verify = |y: &[f32]| {
            let yd = s.clone_htod(y).unwrap();
            chain
                .verify_conv_transpose3d_device(
                    &s,
                    c.params,
                    c.output_padding,
                    xd.data(),
                    &c.input,
                    wd.data(),
                    &c.weight,
                    bd.as_ref().map(Buf::data),
                    yd.view(),
                )
                .unwrap()
        };
        assert!(verify(&out).is_ok(), "{}", c.name);
        let off: Vec<f32> = out.iter().map(|v| v * 1.01 + 0.05).collect();
        assert!(
            matches!(verify(&off), Err(Failure::ValueMismatch { .. })),
            "{}",
            c.name
        );
        let mut nan = out.clone();
        nan[0] = f32::NAN; // sampled point 0 is always index 0
        assert!(
            matches!(verify(&nan), Err(Failure::ValueMismatch { index: 0, .. })),
            "{}",
            c.name
        );
        let yd = s.clone_htod(&out[1..]).unwrap();
        let e = chain
            .verify_conv_transpose3d_device(
                &s,
                c.params,
                c.output_padding,
                xd.data(),
                &c.input,
                wd.data(),
                &c.weight,
                None,
                yd.view(),
            )
            .unwrap_err();
        assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    }
}
/// conv_transpose3d through the vendor tier (cuDNN's or MIOpen's backward
/// data call on a GPU, which it requires there; the stand-in library of
/// `common/vendor_standin.rs` on the host backend): every case, f32 and
/// bf16 operands, host and device entry points, f32 and bf16 biases (added
/// after the library's call), equal to the scatter definition; served by
/// the vendor tier, except where output_padding reaches the stride (the
/// libraries refuse it: skipped as unsupported, the naive tier serves).
fn conv_transpose3d_through_the_vendor_tier(open: Open<'_>) {
    let (b, name) = with_vendor_backward(open);
    let dev = Device::from_backend(b);
    let chain = Conv3dChain::for_device(&dev);
    let mut served = 0;
    for c in tcases() {
        let t = Tdata::new(&c);
        for bf in [false, true] {
            let p = t.problem(&c, bf);
            let what = format!("{} bf16={bf}", c.name);
            // Served by the vendor tier (or, printed, the naive tier where
            // the library refuses the call), except where it is skipped.
            let expect = |report: &Conv3dReport, what: &str| {
                if p.geometry.output_is_forward() {
                    return usize::from(vendor_served(what, report, &name));
                }
                assert_eq!(
                    report.served_by(),
                    Some(TierKind::Naive),
                    "{what}: {report}"
                );
                assert!(
                    matches!(&report.attempts[0].outcome, Outcome::Skipped(w) if w.contains("not the forward output")),
                    "{what}: {report}"
                );
                assert_eq!(report.failures().count(), 0, "{what}: {report}");
                0
            };
            let (out, report) = chain.run_backward(&p).unwrap();
            served += expect(&report, &what);
            assert_backward_close(&what, &p, &out, 1e-4);
            let (x, w) = if bf {
                (
                    t.xb.iter().map(|v| v.to_f32()).collect::<Vec<_>>(),
                    t.wb.iter().map(|v| v.to_f32()).collect(),
                )
            } else {
                (t.x.clone(), t.w.clone())
            };
            for bias_bf16 in [false, true] {
                let s = dev.stream().unwrap();
                let xd = Buf::up(&s, p.grad_output);
                let wd = Buf::up(&s, p.other.unwrap());
                let bb = to_bf16(&t.b);
                let bd = match (c.bias, bias_bf16) {
                    (false, _) => None,
                    (true, false) => Some(Buf::up(&s, Conv3dData::F32(&t.b))),
                    (true, true) => Some(Buf::up(&s, Conv3dData::BF16(&bb))),
                };
                let mut y = s.alloc_zeros::<f32>(out.len()).unwrap();
                let report = chain
                    .conv_transpose3d_device(
                        &s,
                        c.params,
                        c.output_padding,
                        xd.data(),
                        &c.input,
                        wd.data(),
                        &c.weight,
                        bd.as_ref().map(Buf::data),
                        &mut y.view_mut(),
                    )
                    .unwrap();
                let what = format!("{what} device bias_bf16={bias_bf16}");
                served += expect(&report, &what);
                let got = y.to_vec().unwrap();
                let bias_b: Vec<f32> = if bias_bf16 {
                    bb.iter().map(|v| v.to_f32()).collect()
                } else {
                    t.b.clone()
                };
                let (_, want) = scatter_transpose(&c, &x, &w, c.bias.then_some(&bias_b[..]));
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (f64::from(*g) - e).abs() <= 1e-4 * (1.0 + e.abs()),
                        "{what}: {i}: {g} vs {e}"
                    );
                }
            }
        }
    }
    // 6 cases the libraries take, 6 calls each.
    assert!(served >= 6 * 6 * 3 / 4, "{name} served only {served} calls");
    assert!(dev.take_errors().is_empty());
}

per_device!(
    conv_transpose3d_verify,
    conv_transpose3d_through_the_chain,
    conv_transpose3d_through_the_vendor_tier,
);
