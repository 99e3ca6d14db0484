//! Device conversion benches (criterion). On a GPU build (`--features cuda`
//! or `hip`) with a device present they run there; otherwise on the host
//! backend (so the bench builds and runs everywhere).
//!
//! Groups (Throughput::Bytes = bytes read + written):
//! - `bf16_to_f32/<n>`: the conversion kernel, a device-to-device memcpy
//!   moving the same number of bytes (3n bytes copied = 6n read + written),
//!   conversion + separate fingerprint pass, fused conversion + fingerprint.
//! - `narrow_and_f16/<n>`: the other three kernels.
//! - `host_expected_fingerprint`: the host half of a verification.
//! - `convert_verified/<n>`: the whole verified call per policy.
//! - `self_test`: the exhaustive self-test (uncached).
//!
//! Every timed closure synchronizes the stream before returning.

/// The tests' seeded generator (`tests/common/rng.rs`).
#[allow(dead_code)]
#[path = "../tests/common/rng.rs"]
mod rng;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use half::{bf16, f16};
use rocm_safe::device::{BackendKind, Device};
use rocm_safe::verify::{self, Policy, VerifyOptions};
use rocm_safe::DType;

fn device() -> Device {
    for kind in [BackendKind::Cuda, BackendKind::Hip] {
        if let Ok(d) = Device::open(kind, 0) {
            return d;
        }
    }
    Device::host()
}

fn pattern(n: usize) -> Vec<u16> {
    rng::Rng::new(1).u16s(n)
}

fn benches(c: &mut Criterion) {
    let dev = device();
    let gpu = dev.kind() != BackendKind::Host;
    let s = dev.stream().expect("stream");
    eprintln!("device: {:?}", dev.info());
    let lg = if gpu { 28 } else { 22 };
    let n = 1usize << lg;
    let h: Vec<bf16> = pattern(n).into_iter().map(bf16::from_bits).collect();
    let src = s.clone_htod(&h).expect("upload");
    let mut out = s.alloc::<f32>(n).expect("alloc");
    let mut acc = s.alloc_zeros::<u64>(1).expect("alloc");
    let copy_src = s.alloc_zeros::<u8>(3 * n).expect("alloc");
    let mut copy_dst = s.alloc::<u8>(3 * n).expect("alloc");

    let mut g = c.benchmark_group(format!("bf16_to_f32/2^{lg}"));
    g.throughput(Throughput::Bytes(6 * n as u64));
    g.sample_size(30);
    g.bench_function("dtod_memcpy_same_bytes", |b| {
        b.iter(|| {
            copy_dst.copy_dtod(&copy_src.view()).expect("copy");
            s.synchronize().expect("sync");
        })
    });
    g.bench_function("convert", |b| {
        b.iter(|| {
            s.convert(&src.view(), &mut out.view_mut())
                .expect("convert");
            s.synchronize().expect("sync");
        })
    });
    g.bench_function("convert+fingerprint_pass", |b| {
        b.iter(|| {
            s.convert(&src.view(), &mut out.view_mut())
                .expect("convert");
            s.fingerprint_sum_into(&out.view(), &mut acc.view_mut())
                .expect("fp");
            s.synchronize().expect("sync");
        })
    });
    g.bench_function("convert_fused_fingerprint", |b| {
        b.iter(|| {
            s.convert_fingerprint_into(&src.view(), &mut out.view_mut(), &mut acc.view_mut())
                .expect("fused");
            s.synchronize().expect("sync");
        })
    });
    g.finish();

    // A transfer-pipeline chunk (16 MiB of bf16): the f32 output (32 MiB)
    // fits in an H100's 50 MB L2, so the separate fingerprint pass rereads
    // it mostly from cache.
    let lc = if gpu { 23 } else { lg - 1 };
    let nc = 1usize << lc;
    let mut g = c.benchmark_group(format!("bf16_to_f32_chunk/2^{lc}"));
    g.throughput(Throughput::Bytes(6 * nc as u64));
    g.sample_size(50);
    let csrc = src.slice(..nc).expect("slice");
    g.bench_function("convert", |b| {
        b.iter(|| {
            let mut o = out.slice_mut(..nc).expect("slice");
            s.convert(&csrc, &mut o).expect("convert");
            s.synchronize().expect("sync");
        })
    });
    g.bench_function("convert+fingerprint_pass", |b| {
        b.iter(|| {
            let mut o = out.slice_mut(..nc).expect("slice");
            s.convert(&csrc, &mut o).expect("convert");
            s.fingerprint_sum_into(&o.as_view(), &mut acc.view_mut())
                .expect("fp");
            s.synchronize().expect("sync");
        })
    });
    g.bench_function("convert_fused_fingerprint", |b| {
        b.iter(|| {
            let mut o = out.slice_mut(..nc).expect("slice");
            s.convert_fingerprint_into(&csrc, &mut o, &mut acc.view_mut())
                .expect("fused");
            s.synchronize().expect("sync");
        })
    });
    g.finish();

    let mut g = c.benchmark_group(format!("narrow_and_f16/2^{lg}"));
    g.sample_size(20);
    g.throughput(Throughput::Bytes(6 * n as u64));
    let hf: Vec<f16> = pattern(n).into_iter().map(f16::from_bits).collect();
    let srcf = s.clone_htod(&hf).expect("upload");
    g.bench_function("f16_to_f32", |b| {
        b.iter(|| {
            s.convert(&srcf.view(), &mut out.view_mut())
                .expect("convert");
            s.synchronize().expect("sync");
        })
    });
    let mut ob = s.alloc::<bf16>(n).expect("alloc");
    let mut oh = s.alloc::<f16>(n).expect("alloc");
    g.bench_function("f32_to_bf16", |b| {
        b.iter(|| {
            s.convert(&out.view(), &mut ob.view_mut()).expect("convert");
            s.synchronize().expect("sync");
        })
    });
    g.bench_function("f32_to_f16", |b| {
        b.iter(|| {
            s.convert(&out.view(), &mut oh.view_mut()).expect("convert");
            s.synchronize().expect("sync");
        })
    });
    g.finish();
    drop((ob, oh, srcf, copy_src, copy_dst));

    let mut g = c.benchmark_group("host_expected_fingerprint");
    g.sample_size(10);
    let m = n.min(1usize << 24);
    g.throughput(Throughput::Bytes(2 * m as u64));
    let bytes: &[u8] = bytemuck::cast_slice(&h[..m]);
    g.bench_function(format!("bf16_to_f32/{m} (source bytes)"), |b| {
        b.iter(|| verify::expected_fingerprint(DType::BF16, bytes, DType::F32).expect("fp"))
    });
    g.finish();

    let mut g = c.benchmark_group(format!("convert_verified/{m}"));
    g.sample_size(10);
    g.throughput(Throughput::Bytes(6 * m as u64));
    let dsrc = s.clone_htod(&h[..m]).expect("upload");
    let mut dout = s.alloc::<f32>(m).expect("alloc");
    let first = verify::self_test(&s).expect("self-test");
    eprintln!(
        "first self-test in this process: {:.2} ms (cpu reference {:.2} ms, upload {:.2} ms, device {:.2} ms), all passed: {}",
        first.elapsed_ms, first.reference_ms, first.upload_ms, first.device_ms, first.all_passed()
    );
    for policy in [Policy::Off, Policy::Fingerprint, Policy::FusedFingerprint] {
        let opts = VerifyOptions::default().with_policy(policy);
        g.bench_function(format!("{policy:?}"), |b| {
            b.iter(|| {
                verify::convert_verified(&s, &h[..m], &dsrc.view(), &mut dout.view_mut(), &opts)
                    .expect("verified")
            })
        });
    }
    g.finish();

    for _ in 0..2 {
        let r = verify::self_test_uncached(&s).expect("self-test");
        eprintln!(
            "self-test: {:.2} ms (cpu reference {:.2} ms, upload {:.2} ms, device {:.2} ms)",
            r.elapsed_ms, r.reference_ms, r.upload_ms, r.device_ms
        );
    }
    // Dropping a temporary while another stream is busy: the drop hands the
    // memory to the device (freed at its next sync point) and returns; the
    // baseline is what a drop did before (wait for the whole device, then
    // free). Each iteration queues a 2^lg conversion on `s` first, so the
    // device is busy when the temporary goes.
    let other = dev.stream().expect("stream");
    let mut g = c.benchmark_group(format!("drop_temporary_while_busy/2^{lg}"));
    g.sample_size(20);
    g.bench_function("drop (deferred free)", |b| {
        b.iter_custom(|iters| {
            let mut spent = std::time::Duration::ZERO;
            for _ in 0..iters {
                let tmp = other.alloc::<f32>(1 << 20).expect("alloc");
                s.convert(&src.view(), &mut out.view_mut())
                    .expect("convert");
                let t = std::time::Instant::now();
                drop(tmp);
                spent += t.elapsed();
                dev.synchronize().expect("sync");
            }
            spent
        })
    });
    g.bench_function("baseline: device synchronize + free (the old drop)", |b| {
        b.iter_custom(|iters| {
            let mut spent = std::time::Duration::ZERO;
            for _ in 0..iters {
                let tmp = other.alloc::<f32>(1 << 20).expect("alloc");
                s.convert(&src.view(), &mut out.view_mut())
                    .expect("convert");
                let t = std::time::Instant::now();
                dev.synchronize().expect("sync");
                drop(tmp);
                dev.synchronize().expect("sync");
                spent += t.elapsed();
            }
            spent
        })
    });
    g.finish();

    let mut g = c.benchmark_group("self_test");
    g.sample_size(20);
    g.bench_function("exhaustive", |b| {
        b.iter(|| {
            let r = verify::self_test_uncached(&s).expect("self-test");
            assert!(r.all_passed());
            r
        })
    });
    g.finish();
}

criterion_group!(gpu_convert, benches);
criterion_main!(gpu_convert);
