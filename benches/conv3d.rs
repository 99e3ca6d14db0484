//! conv3d benches.
//!
//! `cpu`: the CPU tier on 1x64x8x64x64, 64 out, k3 p1 (ANCHORS.md: PyTorch's
//! CPU conv3d on the 16-core GPU machine, 6.8 ms; measure that anchor in the
//! same run with `scripts/conv3d_anchor.py`). Throughput is counted in
//! floating-point operations (2 per multiply-add) as "elements".
//!
//! With `--features cuda` (or `hip`) and a device, the GPU tiers run on
//! 1x128x9x128x128, 128 out, k3 p1 (anchors: cuDNN 0.49 ms f32, PyTorch's
//! own fallback 3.79 ms f32 / 1.43 ms bf16).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rocm_safe::conv3d::{conv3d_cpu, Conv3dData, Conv3dParams, Conv3dProblem};

fn values(n: usize, salt: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let z = (i ^ salt).wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            (z % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
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

#[cfg(feature = "cuda")]
fn gpu(c: &mut Criterion) {
    use rocm_safe::conv3d::cuda::{kernel_resources, CudaConv3d, CudnnConv, GpuKernel};
    let engine = match CudaConv3d::open(0) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("conv3d gpu benches skipped: {e}");
            return;
        }
    };
    for (name, regs, local) in kernel_resources(&engine) {
        eprintln!("{name}: {regs} registers, {local} local bytes per thread");
    }
    let input = [1usize, 128, 9, 128, 128];
    let weight = [128usize, 128, 3, 3, 3];
    let x = values(input.iter().product(), 1);
    let w = values(weight.iter().product(), 2);
    let b = values(128, 3);
    let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let wb: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let params = Conv3dParams::default().with_padding([1, 1, 1]);

    let mut g = c.benchmark_group("conv3d_gpu_1x128x9x128x128_k128_k3p1");
    g.sample_size(10);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    for (name, xs, ws) in [
        ("f32", Conv3dData::F32(&x), Conv3dData::F32(&w)),
        ("bf16", Conv3dData::BF16(&xb), Conv3dData::BF16(&wb)),
    ] {
        let p =
            Conv3dProblem::new(params, xs, &input, ws, &weight, Some(Conv3dData::F32(&b))).unwrap();
        g.throughput(Throughput::Elements(2 * p.geometry.macs()));
        let dp = engine.upload(&p).unwrap();
        let mut y = engine.alloc_output(&dp).unwrap();
        for (kname, kernel) in [("tiled", GpuKernel::Tiled), ("naive", GpuKernel::Naive)] {
            g.bench_function(format!("{kname}/{name}"), |bench| {
                bench.iter(|| {
                    engine.forward(kernel, &dp, &mut y).unwrap();
                    engine.synchronize().unwrap();
                })
            });
        }
        match CudnnConv::new(&engine, &dp) {
            Ok(mut conv) => {
                g.bench_function(format!("cudnn/{name}"), |bench| {
                    bench.iter(|| {
                        conv.forward(&engine, &dp, &mut y).unwrap();
                        engine.synchronize().unwrap();
                    })
                });
            }
            Err(e) => eprintln!("cudnn bench skipped: {e}"),
        }
    }
    g.finish();
}

#[cfg(not(feature = "cuda"))]
fn gpu(_: &mut Criterion) {}

criterion_group!(benches, cpu, gpu);
criterion_main!(benches);
