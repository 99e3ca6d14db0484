//! Conversion and fingerprint benches.
//!
//! `cargo bench --bench convert` (about two minutes on 2 cores). Groups:
//! - `bf16_to_f32`: 32 Mi elements, `Throughput::Bytes(6 n)` (2 read, 4
//!   written per element); `rocm_safe` on all threads, `rocm_safe_1thread`
//!   in a 1-thread rayon pool, the baselines `half`
//!   (`HalfFloatSliceExt::convert_to_f32_slice`, one thread) and `memcpy`
//!   (`copy_from_slice` of the 4 n output bytes).
//! - `fingerprint`: a 128 MiB buffer, all threads and 1 thread, and the
//!   baseline `read_sum` (a plain parallel sum of the same buffer: the
//!   memory read bandwidth).
//! - `expected_fingerprint`: bf16 -> f32 of 32 Mi elements (the hash of the
//!   128 MiB output, without writing it), `Throughput::Bytes(6 n)` as above.
//! - `raw_widened_sums`: the transfer loader's two host sums of a bf16 or
//!   f16 piece (the fingerprint partial sum of the bytes and that of their
//!   f32 widening), `two_passes` (`sum_bytes`, then the widened sum as
//!   `expected_fingerprint` computes it) against `fused`
//!   (`sum_raw_and_widened`, one pass); weight-like data,
//!   `Throughput::Bytes` of the source. `1MiB_1thread`: one 1 MiB piece
//!   (the loader's read size, in cache) in a 1-thread pool;
//!   `128MiB_1thread`: a 128 MiB buffer in 1 MiB pieces in a 1-thread
//!   pool; `128MiB_rayon`: the same pieces over the whole pool (as the
//!   loader runs them).
//! - `pairs`: every converting pair on 4 Mi weight-like elements (uniform
//!   in [-0.1, 0.1]), all threads, `Throughput::Bytes` of source plus
//!   destination.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use half::slice::HalfFloatSliceExt;
use rocm_safe::convert::{self, fingerprint};
use rocm_safe::DType;

/// The splitmix64 finaliser.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Deterministic pseudo-random bytes (splitmix64).
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        out.extend_from_slice(&mix64(s).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn one_thread_pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a 1-thread rayon pool")
}

fn configure(g: &mut BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(1000))
        .measurement_time(Duration::from_secs(3));
}

fn bf16_to_f32(c: &mut Criterion) {
    let n = 32 << 20;
    let src: Vec<half::bf16> = bytes(2 * n, 1)
        .chunks_exact(2)
        .map(|b| half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])))
        .collect();
    let mut dst = vec![1.0f32; n];
    let copy_src = vec![2.0f32; n];
    let pool = one_thread_pool();

    let mut g = c.benchmark_group("bf16_to_f32");
    configure(&mut g);
    g.throughput(Throughput::Bytes(6 * n as u64));
    g.bench_function("rocm_safe", |b| {
        b.iter(|| convert::convert_slice(black_box(&src), black_box(&mut dst)).unwrap())
    });
    g.bench_function("rocm_safe_1thread", |b| {
        pool.install(|| {
            b.iter(|| convert::convert_slice(black_box(&src), black_box(&mut dst)).unwrap())
        })
    });
    g.bench_function("half", |b| {
        b.iter(|| black_box(&src).convert_to_f32_slice(black_box(&mut dst)))
    });
    g.bench_function("memcpy", |b| {
        b.iter(|| black_box(&mut dst).copy_from_slice(black_box(&copy_src)))
    });
    g.finish();
}

fn fingerprint_group(c: &mut Criterion) {
    let len = 128 << 20;
    let data = bytes(len, 2);
    let pool = one_thread_pool();

    let mut g = c.benchmark_group("fingerprint");
    configure(&mut g);
    g.throughput(Throughput::Bytes(len as u64));
    g.bench_function("parallel", |b| {
        b.iter(|| fingerprint::fingerprint_bytes(black_box(&data)))
    });
    g.bench_function("1thread", |b| {
        pool.install(|| b.iter(|| fingerprint::fingerprint_bytes(black_box(&data))))
    });
    // Baseline: the memory read bandwidth (a plain wrapping sum of u64
    // words, split over the pool the same way).
    g.bench_function("read_sum", |b| {
        b.iter(|| {
            use rayon::prelude::*;
            black_box(&data)
                .par_chunks(256 << 10)
                .map(|c| {
                    c.chunks_exact(8).fold(0u64, |s, w| {
                        s.wrapping_add(u64::from_le_bytes(w.try_into().unwrap()))
                    })
                })
                .reduce(|| 0, u64::wrapping_add)
        })
    });
    g.finish();

    let n = 32 << 20;
    let src = bytes(2 * n, 3);
    let mut g = c.benchmark_group("expected_fingerprint");
    configure(&mut g);
    g.throughput(Throughput::Bytes(6 * n as u64));
    g.bench_function("bf16_to_f32", |b| {
        b.iter(|| convert::expected_fingerprint(DType::BF16, black_box(&src), DType::F32).unwrap())
    });
    g.bench_function("bf16_to_f32_1thread", |b| {
        pool.install(|| {
            b.iter(|| {
                convert::expected_fingerprint(DType::BF16, black_box(&src), DType::F32).unwrap()
            })
        })
    });
    g.finish();
}

/// Weight-like values: uniform in [-0.1, 0.1], as f32 bit patterns (almost
/// all normal numbers, as in real tensors).
fn weights(n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| (mix64(i) as i32) as f32 * 2f32.powi(-31) * 0.1)
        .collect()
}

fn pairs(c: &mut Criterion) {
    let n = 4 << 20;
    let vals = weights(n);
    let mut g = c.benchmark_group("pairs");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1000));
    let mut dst = vec![0u8; 4 * n];
    for from in [DType::F64, DType::F32, DType::F16, DType::BF16] {
        let ss = from.size().unwrap();
        let src: Vec<u8> = match from {
            DType::F64 => vals
                .iter()
                .flat_map(|v| (*v as f64).to_le_bytes())
                .collect(),
            _ => {
                let mut o = vec![0u8; ss * n];
                convert::convert_bytes(DType::F32, bytemuck::cast_slice(&vals), from, &mut o)
                    .unwrap();
                o
            }
        };
        for to in [DType::F32, DType::F16, DType::BF16] {
            if from == to {
                continue;
            }
            let ds = to.size().unwrap();
            let d = &mut dst[..ds * n];
            g.throughput(Throughput::Bytes(((ss + ds) * n) as u64));
            g.bench_function(format!("{}_to_{}", from.name(), to.name()), |b| {
                b.iter(|| {
                    convert::convert_bytes(from, black_box(&src), to, black_box(&mut *d)).unwrap()
                })
            });
        }
    }
    g.finish();
}

/// Both sums of the piece starting at a byte offset.
type PieceSums = dyn Fn(usize, &[u8]) -> (u64, u64) + Sync;

fn raw_widened_sums(c: &mut Criterion) {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 20;
    let n = 64 << 20;
    let vals = weights(n);
    let pool = one_thread_pool();
    let mut g = c.benchmark_group("raw_widened_sums");
    configure(&mut g);
    for from in [DType::BF16, DType::F16] {
        let mut src = vec![0u8; 2 * n];
        convert::convert_bytes(DType::F32, bytemuck::cast_slice(&vals), from, &mut src).unwrap();
        // The loader's pieces: word position of each piece's start.
        let two_passes = move |start: usize, piece: &[u8]| {
            let raw = fingerprint::sum_bytes((start / 4) as u64, piece);
            let conv = convert::expected_fingerprint(from, piece, DType::F32).unwrap();
            (raw, conv.0)
        };
        let fused = move |start: usize, piece: &[u8]| {
            let s = fingerprint::sum_raw_and_widened(from, (start / 4) as u64, piece).unwrap();
            (s.raw, s.widened)
        };
        let one = &src[..PIECE];
        let all = &src[..];
        let name = from.name();
        g.throughput(Throughput::Bytes(PIECE as u64));
        g.bench_function(format!("{name}/two_passes/1MiB_1thread"), |b| {
            pool.install(|| b.iter(|| two_passes(0, black_box(one))))
        });
        g.bench_function(format!("{name}/fused/1MiB_1thread"), |b| {
            pool.install(|| b.iter(|| fused(0, black_box(one))))
        });
        g.throughput(Throughput::Bytes(all.len() as u64));
        let serial = |f: &PieceSums| {
            all.chunks(PIECE)
                .enumerate()
                .map(|(k, p)| f(k * PIECE, p))
                .fold(0u64, |s, (r, w)| s.wrapping_add(r ^ w))
        };
        let parallel = |f: &PieceSums| {
            all.par_chunks(PIECE)
                .enumerate()
                .map(|(k, p)| f(k * PIECE, p))
                .map(|(r, w)| r ^ w)
                .reduce(|| 0, u64::wrapping_add)
        };
        g.bench_function(format!("{name}/two_passes/128MiB_1thread"), |b| {
            pool.install(|| b.iter(|| serial(&two_passes)))
        });
        g.bench_function(format!("{name}/fused/128MiB_1thread"), |b| {
            pool.install(|| b.iter(|| serial(&fused)))
        });
        g.bench_function(format!("{name}/two_passes/128MiB_rayon"), |b| {
            b.iter(|| parallel(&two_passes))
        });
        g.bench_function(format!("{name}/fused/128MiB_rayon"), |b| {
            b.iter(|| parallel(&fused))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    bf16_to_f32,
    fingerprint_group,
    raw_widened_sums,
    pairs
);
criterion_main!(benches);
