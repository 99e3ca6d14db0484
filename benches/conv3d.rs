//! conv3d benches.
//!
//! `cpu`: the CPU tier on 1x64x8x64x64, 64 out, k3 p1 (anchor: PyTorch's
//! CPU conv3d on the same machine, measured in the same run with
//! `benches/conv3d_anchor.py`). Throughput is counted in floating-point
//! operations (2 per multiply-add) as "elements".
//!
//! With `--features cuda` (or `hip`) and a device, the GPU tiers' device
//! work (tiled, naive, vendor library; data already on the device) runs on
//! 1x128x9x128x128, 128 out, k3 p1 (anchors, from the same script: cuDNN
//! with and without TF32, PyTorch's own fallback in f32 and bf16). Figures
//! and commands: BENCHMARKS.md, "conv3d tiers".
//!
//! `chain_overhead` (GPU builds with a device; issue 21): what the chain
//! costs around the kernel that serves it. On the Wan 2.1 VAE's large
//! layer (1x96x11x482x834, 96 out, k3 p1) and the shape above, f32 and
//! bf16, it times the tiled kernel alone (weight laid out beforehand) and
//! `Conv3dChain::run_device` with the vendor tier forbidden (the tiled
//! tier serves: on-device weight layout, kernel, device checks, one
//! read-back), each synchronised, and prints `outside-tier time / tier
//! time` (the goal: at most 0.10). `ROCM_SAFE_BENCH_SKIP_VAE=1`
//! leaves the large shape out (it needs about 4 GB of device memory).
//! Run: `cargo bench --features cuda --bench conv3d -- chain_overhead`.

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
/// `Conv3dOps::forward` / `Conv3dOps::vendor`, synchronised inside the
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
                let tiled_layout =
                    s.conv3d_ops()
                        .weight_layout(Conv3dKernel::Tiled, p.dtype(), &geo);
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
                            s.conv3d_ops()
                                .forward(
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
                                s.conv3d_ops()
                                    .vendor(
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

/// Mean seconds of `f` over `n` runs after two warm-up runs.
fn mean_secs(n: u32, mut f: impl FnMut()) -> f64 {
    f();
    f();
    let t = std::time::Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() / f64::from(n)
}

/// The chain's time outside the serving tier's kernel (see the module docs).
fn chain_overhead(c: &mut Criterion) {
    use rocm_safe::conv3d_chain::{Conv3dChain, DeviceConv3dData, TierKind};
    use rocm_safe::device::{BackendKind, Conv3dKernel, Device};
    let skip_vae = std::env::var("ROCM_SAFE_BENCH_SKIP_VAE").is_ok_and(|v| v == "1");
    for kind in [BackendKind::Hip, BackendKind::Cuda] {
        if !kind.is_built() {
            continue;
        }
        let dev = match Device::open(kind, 0) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("conv3d chain_overhead {kind} skipped: {e}");
                continue;
            }
        };
        let mut chain = Conv3dChain::for_device(&dev);
        chain.options_mut().forbid = vec![TierKind::Vendor];
        let shapes: [(&str, [usize; 5], [usize; 5]); 2] = [
            (
                "vae_1x96x11x482x834_k96",
                [1, 96, 11, 482, 834],
                [96, 96, 3, 3, 3],
            ),
            (
                "1x128x9x128x128_k128",
                [1, 128, 9, 128, 128],
                [128, 128, 3, 3, 3],
            ),
        ];
        for (shape, input, weight) in shapes {
            if skip_vae && shape.starts_with("vae") {
                continue;
            }
            let params = Conv3dParams::default().with_padding([1, 1, 1]);
            let s = dev.stream().unwrap();
            let x = values(input.iter().product(), 1);
            let w = values(weight.iter().product(), 2);
            let b = values(weight[0], 3);
            let bias = s.clone_htod(&b).unwrap();
            let mut g = c.benchmark_group(format!("conv3d_chain_overhead_{kind}_{shape}"));
            g.sample_size(10);
            g.warm_up_time(Duration::from_millis(500));
            g.measurement_time(Duration::from_secs(3));
            macro_rules! overhead {
                ($name:expr, $xs:expr, $ws:expr, $wrap:path, $dwrap:path) => {{
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
                    let xd = s.clone_htod(&$xs).unwrap();
                    let wd = s.clone_htod(&$ws).unwrap();
                    let layout = s
                        .conv3d_ops()
                        .weight_layout(Conv3dKernel::Tiled, p.dtype(), &geo);
                    let wt = s.clone_htod(&layout.arrange(&geo, &$ws).unwrap()).unwrap();
                    let mut y = s.alloc_zeros::<f32>(geo.output_len()).unwrap();
                    let mut kernel = || {
                        s.conv3d_ops()
                            .forward(
                                Conv3dKernel::Tiled,
                                &geo,
                                &xd.view(),
                                &wt.view(),
                                Some(bias.view()),
                                &mut y.view_mut(),
                            )
                            .unwrap();
                        s.synchronize().unwrap();
                    };
                    let tier = mean_secs(5, &mut kernel);
                    g.bench_function(format!("tiled_kernel/{}", $name), |bench| {
                        bench.iter(&mut kernel)
                    });
                    let mut run = || {
                        let r = chain
                            .run_device(
                                &s,
                                params,
                                $dwrap(xd.view()),
                                &input,
                                $dwrap(wd.view()),
                                &weight,
                                Some(DeviceConv3dData::F32(bias.view())),
                                &mut y.view_mut(),
                            )
                            .unwrap();
                        assert_eq!(r.served_by(), Some(TierKind::Tiled), "{r}");
                        s.synchronize().unwrap();
                    };
                    let total = mean_secs(5, &mut run);
                    g.bench_function(format!("chain_run_device/{}", $name), |bench| {
                        bench.iter(&mut run)
                    });
                    println!(
                        "conv3d chain overhead {kind} {shape} {}: tier {:.3} ms, chain {:.3} ms, \
                         outside-tier time / tier time = {:.3}",
                        $name,
                        tier * 1e3,
                        total * 1e3,
                        (total - tier) / tier
                    );
                }};
            }
            overhead!("f32", x, w, Conv3dData::F32, DeviceConv3dData::F32);
            let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
            let wb: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
            overhead!("bf16", xb, wb, Conv3dData::BF16, DeviceConv3dData::BF16);
            g.finish();
        }
    }
}

criterion_group!(benches, cpu, gpu, chain_overhead);
criterion_main!(benches);
