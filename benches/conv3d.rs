//! conv3d benches.
//!
//! `cpu`: the CPU tier on 1x64x8x64x64, 64 out, k3 p1 (ANCHORS.md: PyTorch's
//! CPU conv3d on the 16-core GPU machine, 6.8 ms; measure that anchor in the
//! same run with `scripts/conv3d_anchor.py`). Throughput is counted in
//! floating-point operations (2 per multiply-add) as "elements".
//!
//! With `--features cuda` (or `hip`) and a device, the GPU tiers' device
//! work (tiled, naive, vendor library; data already on the device) runs on
//! 1x128x9x128x128, 128 out, k3 p1 (anchors: cuDNN 0.49 ms f32, PyTorch's
//! own fallback 3.79 ms f32 / 1.43 ms bf16).

/// The tests' seeded generator (`tests/common/rng.rs`).
#[allow(dead_code)]
#[path = "../tests/common/rng.rs"]
mod rng;

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rocm_safe::conv3d::{conv3d_cpu, Conv3dData, Conv3dParams, Conv3dProblem};

/// Deterministic values in [-1, 1), varied per `salt` (the seed).
fn values(n: usize, salt: u64) -> Vec<f32> {
    rng::Rng::new(salt).f32s(n, -1.0, 1.0)
}

fn cpu(c: &mut Criterion) {
    let input = [1usize, 64, 8, 64, 64];
    let weight = [64usize, 64, 3, 3, 3];
    let x = values(input.iter().product(), 1);
    let w = values(weight.iter().product(), 2);
    let b = values(64, 3);
    let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let wb: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let params = Conv3dParams::default().with_padding([1, 1, 1]);

    let mut g = c.benchmark_group("conv3d_cpu_1x64x8x64x64_k64_k3p1");
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    for (name, xs, ws) in [
        ("f32", Conv3dData::F32(&x), Conv3dData::F32(&w)),
        ("bf16", Conv3dData::BF16(&xb), Conv3dData::BF16(&wb)),
    ] {
        let p =
            Conv3dProblem::new(params, xs, &input, ws, &weight, Some(Conv3dData::F32(&b))).unwrap();
        g.throughput(Throughput::Elements(2 * p.geometry.macs()));
        let mut out = vec![0f32; p.geometry.output_len()];
        g.bench_function(format!("cpu_tier/{name}"), |bench| {
            bench.iter(|| {
                conv3d_cpu(black_box(&p), &mut out).unwrap();
                black_box(&out);
            })
        });
    }
    g.finish();
}

/// The GPU tiers' device work (no copies) on every GPU this build and
/// machine have: tiled and naive kernels and the vendor library, through
/// `Stream::conv3d` / `Stream::conv3d_vendor`, synchronised inside the
/// timed closure.
fn gpu(c: &mut Criterion) {
    use rocm_safe::device::{BackendKind, Conv3dKernel, Device};
    for kind in [BackendKind::Hip, BackendKind::Cuda] {
        if !kind.is_built() {
            continue;
        }
        let dev = match Device::open(kind, 0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("conv3d {kind} benches skipped: {e}");
                continue;
            }
        };
        let input = [1usize, 128, 9, 128, 128];
        let weight = [128usize, 128, 3, 3, 3];
        let x = values(input.iter().product(), 1);
        let w = values(weight.iter().product(), 2);
        let b = values(128, 3);
        let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let wb: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
        let params = Conv3dParams::default().with_padding([1, 1, 1]);
        let s = dev.stream().unwrap();
        let bias = s.clone_htod(&b).unwrap();

        let mut g = c.benchmark_group(format!("conv3d_{kind}_1x128x9x128x128_k128_k3p1"));
        g.sample_size(10);
        g.warm_up_time(Duration::from_millis(500));
        g.measurement_time(Duration::from_secs(2));
        macro_rules! bench_dtype {
            ($name:expr, $xs:expr, $ws:expr, $wrap:path) => {{
                let p = Conv3dProblem::new(
                    params,
                    $wrap(&$xs),
                    &input,
                    $wrap(&$ws),
                    &weight,
                    Some(Conv3dData::F32(&b)),
                )
                .unwrap();
                let geo = p.geometry;
                g.throughput(Throughput::Elements(2 * geo.macs()));
                let xd = s.clone_htod(&$xs).unwrap();
                let wd = s.clone_htod(&$ws).unwrap();
                // The layout the tiled kernel reads here (packed for the
                // tensor-core kernel on CUDA sm_80+ in bf16).
                let tiled_layout = s.conv3d_weight_layout(Conv3dKernel::Tiled, p.dtype(), &geo);
                eprintln!("{kind} {}: tiled weight layout {tiled_layout:?}", $name);
                let wt = s
                    .clone_htod(&tiled_layout.arrange(&geo, &$ws).unwrap())
                    .unwrap();
                let mut y = s.alloc_zeros::<f32>(geo.output_len()).unwrap();
                for (kname, kernel, wv) in [
                    ("tiled", Conv3dKernel::Tiled, &wt),
                    ("naive", Conv3dKernel::Naive, &wd),
                ] {
                    g.bench_function(format!("{kname}/{}", $name), |bench| {
                        bench.iter(|| {
                            s.conv3d(
                                kernel,
                                &geo,
                                &xd.view(),
                                &wv.view(),
                                Some(bias.view()),
                                &mut y.view_mut(),
                            )
                            .unwrap();
                            s.synchronize().unwrap();
                        })
                    });
                }
                match dev.backend().conv3d_vendor_available() {
                    Ok(()) => {
                        g.bench_function(format!("vendor/{}", $name), |bench| {
                            bench.iter(|| {
                                s.conv3d_vendor(
                                    &geo,
                                    &xd.view(),
                                    &wd.view(),
                                    Some(bias.view()),
                                    &mut y.view_mut(),
                                )
                                .unwrap();
                                s.synchronize().unwrap();
                            })
                        });
                    }
                    Err(e) => eprintln!("vendor bench skipped: {e}"),
                }
            }};
        }
        bench_dtype!("f32", x, w, Conv3dData::F32);
        bench_dtype!("bf16", xb, wb, Conv3dData::BF16);
        g.finish();
    }
}

criterion_group!(benches, cpu, gpu);
criterion_main!(benches);
