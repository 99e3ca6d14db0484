//! Transfer pipeline benchmarks.
//!
//! * Without `TRANSFER_CKPT`: criterion, on the host backend, a synthetic
//!   16 MiB bf16 checkpoint loaded to f32 (pinned ring, fingerprint checks)
//!   against the plain CPU reader (`Checkpoint::read_converted_bytes`) as baseline.
//! * With `TRANSFER_CKPT=path` (a `.safetensors` file or an index): loads
//!   the whole checkpoint `TRANSFER_REPEAT` times (default 3) onto
//!   `TRANSFER_BACKEND` (`cuda`, `hip` or `host`; default cuda when built)
//!   converting to f32 with `TRANSFER_POLICY` (`fingerprint`, `fused`,
//!   `off`), `TRANSFER_RING` x `TRANSFER_BUFFER_MIB`, `TRANSFER_FILLS` (fills
//!   at once), `TRANSFER_READAHEAD=0|1`, `TRANSFER_DTYPE=keep`,
//!   `TRANSFER_COLD=1` (no self-test before the loads: load 0 runs it, as a
//!   process's first load does), and prints file bytes/s and the peak RSS
//!   growth of each load
//!   (`/proc/self/status` VmHWM after resetting it through
//!   `/proc/self/clear_refs`, minus VmRSS before the load), the CPU time and
//!   the load's [`rocm_safe::transfer::LoadTiming`] split.
//! * `TRANSFER_READ_ONLY=1`: the page-cache read ceiling (1 MiB reads into
//!   per-thread buffers that stay in cache, no device).
//! * `TRANSFER_MODE=fill|copy|fillcopy`: the ring without the loader: reads
//!   into `TRANSFER_RING` pinned buffers, copies of them to the device, or
//!   both (`fillmmap`, `fillcopymmap`: copies out of a mapping instead of
//!   reads); `TRANSFER_MODE=memory`: the host's memory copy and read rates.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, Criterion, Throughput};
use rocm_safe::device::{BackendKind, Device};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{LoadOptions, Loader, Rung};
use rocm_safe::verify::{self, Policy};
use rocm_safe::DType;

fn status_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// User + system CPU seconds of the process so far.
fn cpu_secs() -> f64 {
    // SAFETY: rusage is plain integers, for which all-zero bytes are valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// A self-test's time and its parts.
fn self_test_split(st: &verify::SelfTestReport) -> String {
    format!(
        "{:.1} ms: reference {:.1}, upload {:.1}, device {:.1}",
        st.elapsed_ms, st.reference_ms, st.upload_ms, st.device_ms
    )
}

fn env_or(key: &str, default: &str) -> String {
    std::env::var(key).unwrap_or_else(|_| default.to_owned())
}

/// The page-cache read ceiling: every shard read with positioned reads of
/// `TRANSFER_READ_KIB` on the rayon pool into per-task buffers, no device.
fn read_only(path: &str) {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    let read_kib: usize = env_or("TRANSFER_READ_KIB", "1024").parse().unwrap_or(1024);
    let ckpt = Checkpoint::open(path).expect("open checkpoint");
    let chunk = read_kib << 10;
    for run in 0..3 {
        let t = Instant::now();
        let mut total = 0u64;
        for shard in ckpt.shards() {
            let f = std::fs::File::open(shard.path()).expect("open");
            let len = shard.file_len();
            let n = len.div_ceil(chunk as u64);
            (0..n).into_par_iter().for_each_init(
                || vec![0u8; chunk],
                |buf, k| {
                    let off = k * chunk as u64;
                    let l = (len - off).min(chunk as u64) as usize;
                    f.read_exact_at(&mut buf[..l], off).expect("read");
                    black_box(&buf[..l]);
                },
            );
            total += len;
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "read only {run}: {:.3} GiB with {} threads, reads of {read_kib} KiB: {:.2} GB/s",
            total as f64 / (1u64 << 30) as f64,
            rayon::current_num_threads(),
            total as f64 / secs / 1e9
        );
    }
}

/// The ring-fill ceiling: the shards read with positioned reads of 1 MiB on
/// the rayon pool into a ring of `TRANSFER_RING` pinned buffers of
/// `TRANSFER_BUFFER_MIB` (what the loader's fills do, with no device copy);
/// `TRANSFER_MODE=fillcopy` also copies each filled buffer to the device on
/// one stream (no conversion, no checks), `copy` only copies.
fn ring_modes(path: &str, mode: &str) {
    use rayon::prelude::*;
    use std::os::unix::fs::FileExt;
    let d = LoadOptions::default();
    let ring: usize = env_or("TRANSFER_RING", &d.ring_buffers.to_string())
        .parse()
        .unwrap_or(d.ring_buffers);
    let mib: usize = env_or("TRANSFER_BUFFER_MIB", &(d.buffer_bytes >> 20).to_string())
        .parse()
        .unwrap_or(d.buffer_bytes >> 20);
    let dev = Device::open(BackendKind::Cuda, 0).expect("open device");
    let stream = dev.stream().expect("stream");
    let ckpt = Checkpoint::open(path).expect("open checkpoint");
    let cap = mib << 20;
    let mut bufs: Vec<_> = (0..ring)
        .map(|_| dev.alloc_pinned::<u8>(cap).expect("pinned"))
        .collect();
    let mut dst: Vec<_> = (0..ring)
        .map(|_| stream.alloc::<u8>(cap).expect("device buffer"))
        .collect();
    let files: Vec<(std::fs::File, u64)> = ckpt
        .shards()
        .iter()
        .map(|s| (std::fs::File::open(s.path()).expect("open"), s.file_len()))
        .collect();
    let total: u64 = files.iter().map(|f| f.1).sum();
    let (do_fill, do_copy) = match mode {
        "fill" | "fillmmap" => (true, false),
        "copy" => (false, true),
        _ => (true, true),
    };
    let mmap = mode.ends_with("mmap");
    // SAFETY: the bench's files are not modified while it runs.
    let maps: Vec<memmap2::Mmap> = if mmap {
        files
            .iter()
            .map(|(f, _)| unsafe { memmap2::Mmap::map(f) }.expect("mmap"))
            .collect()
    } else {
        Vec::new()
    };
    for run in 0..3 {
        let t = Instant::now();
        let mut k = 0usize;
        for (fi, (f, len)) in files.iter().enumerate() {
            let mut off = 0u64;
            while off < *len {
                let l = ((*len - off) as usize).min(cap);
                let slot = k % ring;
                let buf = &mut bufs[slot];
                if do_fill {
                    let s = &mut buf.as_mut_slice().expect("wait")[..l];
                    s.par_chunks_mut(1 << 20).enumerate().for_each(|(i, part)| {
                        let at = off + (i as u64) * (1 << 20);
                        if mmap {
                            let a = at as usize;
                            part.copy_from_slice(&maps[fi][a..a + part.len()]);
                        } else {
                            f.read_exact_at(part, at).expect("read");
                        }
                    });
                }
                if do_copy {
                    dst[slot]
                        .view_mut()
                        .copy_htod_async(&stream, buf)
                        .expect("copy");
                }
                off += l as u64;
                k += 1;
            }
        }
        stream.synchronize().expect("sync");
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{mode} {run}: {:.3} GiB through {ring} x {mib} MiB pinned, {} threads: {:.2} GB/s",
            total as f64 / (1u64 << 30) as f64,
            rayon::current_num_threads(),
            total as f64 / secs / 1e9
        );
    }
}

/// The host's memory ceilings, no file and no device: 16 threads copying
/// a 2 GiB buffer into a 128 MiB ring of ordinary memory in 1 MiB pieces
/// (what a fill does once the page cache is in memory), and reading it
/// (summing words).
fn memory_ceiling() {
    use rayon::prelude::*;
    let src: Vec<u64> = (0..(2usize << 30) / 8).map(|i| i as u64).collect();
    let mut ring = vec![0u64; (128usize << 20) / 8];
    let piece = (1usize << 20) / 8;
    for run in 0..3 {
        let t = Instant::now();
        for (k, chunk) in src.chunks(ring.len()).enumerate() {
            ring.par_chunks_mut(piece)
                .zip(chunk.par_chunks(piece))
                .for_each(|(d, s)| d[..s.len()].copy_from_slice(s));
            black_box((k, &ring));
        }
        let copy = (src.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9;
        let t = Instant::now();
        let sum: u64 = src
            .par_chunks(piece)
            .map(|c| c.iter().fold(0u64, |a, &w| a.wrapping_add(w)))
            .reduce(|| 0, u64::wrapping_add);
        black_box(sum);
        let read = (src.len() * 8) as f64 / t.elapsed().as_secs_f64() / 1e9;
        println!(
            "memory {run}: {} threads, copy 2 GiB into a 128 MiB ring {copy:.2} GB/s, read {read:.2} GB/s",
            rayon::current_num_threads()
        );
    }
}

fn figures(path: &str) {
    let backend = match env_or(
        "TRANSFER_BACKEND",
        if cfg!(feature = "cuda") {
            "cuda"
        } else {
            "host"
        },
    )
    .as_str()
    {
        "cuda" => BackendKind::Cuda,
        "hip" => BackendKind::Hip,
        _ => BackendKind::Host,
    };
    let policy = match env_or("TRANSFER_POLICY", "fingerprint").as_str() {
        "off" => Policy::Off,
        "fused" => Policy::FusedFingerprint,
        _ => Policy::Fingerprint,
    };
    let repeat: usize = env_or("TRANSFER_REPEAT", "3").parse().unwrap_or(3);
    let d = LoadOptions::default();
    let ring: usize = env_or("TRANSFER_RING", &d.ring_buffers.to_string())
        .parse()
        .unwrap_or(d.ring_buffers);
    let readahead = env_or("TRANSFER_READAHEAD", "1") != "0";
    let read_kib: usize = env_or("TRANSFER_READ_KIB", "1024").parse().unwrap_or(1024);
    let mib: usize = env_or("TRANSFER_BUFFER_MIB", &(d.buffer_bytes >> 20).to_string())
        .parse()
        .unwrap_or(d.buffer_bytes >> 20);
    let t_open = Instant::now();
    let dev = Device::open(backend, 0).expect("open device");
    let open_ms = t_open.elapsed().as_secs_f64() * 1e3;
    // TRANSFER_COLD=1: no self-test before the loads, so load 0 runs it
    // (and loads the kernel modules) as a trainer's first load does.
    let cold = env_or("TRANSFER_COLD", "0") == "1";
    let t_st = Instant::now();
    let st = if cold {
        "run by load 0".to_owned()
    } else {
        let st = verify::self_test(&dev.stream().expect("stream")).expect("self-test");
        format!(
            "passed: {} in {:.1} ms (kernel modules loaded; {})",
            st.all_passed(),
            t_st.elapsed().as_secs_f64() * 1e3,
            self_test_split(&st)
        )
    };
    println!(
        "device {} ({}), opened in {open_ms:.1} ms, self-test {st}, threads {}, policy {policy:?}, ring {ring} x {mib} MiB, reads of {read_kib} KiB, readahead {readahead}",
        dev.info().name,
        dev.info().arch,
        rayon::current_num_threads()
    );
    let ckpt = Checkpoint::open(path).expect("open checkpoint");
    let keep = env_or("TRANSFER_DTYPE", "f32") == "keep";
    let fills: Option<usize> = std::env::var("TRANSFER_FILLS")
        .ok()
        .and_then(|v| v.parse().ok());
    let opts = LoadOptions::to_dtype(DType::F32)
        .with_dtype(if keep { None } else { Some(DType::F32) })
        .with_concurrent_fills(fills)
        .with_policy(policy)
        .with_ring_buffers(ring)
        .with_buffer_bytes(mib << 20)
        .with_readahead(readahead)
        .with_read_bytes(read_kib << 10);
    let mut loader = Loader::new(&dev, opts).expect("loader");
    for run in 0..repeat {
        let _ = std::fs::write("/proc/self/clear_refs", "5");
        let rss0 = status_kib("VmRSS:");
        let cpu0 = cpu_secs();
        let t = Instant::now();
        let loaded = loader.load_all(&ckpt).expect("load");
        let secs = t.elapsed().as_secs_f64();
        let cpu = cpu_secs() - cpu0;
        let hwm = status_kib("VmHWM:");
        let r = &loaded.report;
        let fell: usize = r.tensors.iter().filter(|t| !t.attempts.is_empty()).count();
        let by: Vec<String> = r
            .by_rung()
            .into_iter()
            .filter(|(_, n, _)| *n > 0)
            .map(|(rung, n, b)| {
                format!(
                    "{rung}: {n} tensors {:.2} GiB",
                    b as f64 / (1u64 << 30) as f64
                )
            })
            .collect();
        println!(
            "load {run}: {:.3} GiB file -> {:.3} GiB f32 in {:.3} s = {:.2} GB/s of file bytes; ring {:.3} s, {} jobs; \
             peak RSS growth {:.1} MiB (VmRSS before {:.1} MiB, VmHWM {:.1} MiB); fell back: {fell}; {}",
            r.file_bytes as f64 / (1u64 << 30) as f64,
            r.out_bytes as f64 / (1u64 << 30) as f64,
            secs,
            r.file_bytes as f64 / secs / 1e9,
            r.ring_ms / 1e3,
            r.ring_jobs,
            hwm.saturating_sub(rss0) as f64 / 1024.0,
            rss0 as f64 / 1024.0,
            hwm as f64 / 1024.0,
            by.join(", ")
        );
        let tm = &r.timing;
        println!(
            "  cpu {:.2} s = {:.1} cores; timing: before the ring {:.1} ms (alloc {:.1} ms), waiting for pinning {:.1} ms, for fills {:.1} ms, for the device {:.1} ms; fills blocked {:.1} ms, busy {:.1} ms (summed over tasks)",
            cpu,
            cpu / secs,
            secs * 1e3 - f64::from(r.ring_ms),
            tm.alloc_ms,
            tm.wait_pin_ms,
            tm.wait_fill_ms,
            tm.wait_device_ms,
            tm.fill_blocked_ms,
            tm.fill_busy_ms
        );
        if cold && run == 0 {
            // The report load 0 cached: how long its own self-test took.
            let st = verify::self_test(&dev.stream().expect("stream")).expect("self-test");
            println!("  self-test inside load 0: {}", self_test_split(&st));
        }
        assert!(r.tensors.iter().all(|t| t.rung == Rung::PinnedRing));
        let tf = Instant::now();
        drop(loaded);
        println!(
            "  dropping the loaded tensors: {:.1} ms",
            tf.elapsed().as_secs_f64() * 1e3
        );
    }
}

fn host_load(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("b.safetensors");
    let specs: Vec<TensorSpec> = (0..8)
        .map(|i| TensorSpec::new(format!("t{i}"), DType::BF16, [1024u64, 1024]))
        .collect();
    let mut w = SafeTensorsWriter::create(&path, specs, None).expect("create");
    let data: Vec<u8> = (0..2u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    for i in 0..8 {
        w.write_tensor(&format!("t{i}"), &data).expect("write");
    }
    w.finish().expect("finish");
    let ckpt = Checkpoint::open(&path).expect("open");
    let mut g = c.benchmark_group("transfer_host_16MiB_bf16_to_f32");
    g.throughput(Throughput::Bytes(16 << 20));
    g.sample_size(20);
    let dev = Device::host();
    let mut loader = Loader::new(&dev, LoadOptions::to_dtype(DType::F32)).expect("loader");
    g.bench_function("loader_pinned_ring_fingerprint", |b| {
        b.iter(|| black_box(loader.load_all(&ckpt).expect("load")))
    });
    let mut off = Loader::new(
        &dev,
        LoadOptions::to_dtype(DType::F32).with_policy(Policy::Off),
    )
    .expect("loader");
    g.bench_function("loader_pinned_ring_unchecked", |b| {
        b.iter(|| black_box(off.load_all(&ckpt).expect("load")))
    });
    g.bench_function("baseline_cpu_reader_read_as_f32", |b| {
        b.iter(|| {
            for (_, t) in ckpt.tensors() {
                black_box(
                    ckpt.read_converted_bytes(&t.name, DType::F32)
                        .expect("read"),
                );
            }
        })
    });
    g.finish();
}

criterion_group!(benches, host_load);

fn main() {
    if let Ok(p) = std::env::var("TRANSFER_CKPT") {
        if std::env::var("TRANSFER_READ_ONLY").is_ok() {
            read_only(&p);
            return;
        }
        if std::env::var("TRANSFER_MODE").is_ok_and(|m| m == "memory") {
            memory_ceiling();
            return;
        }
        if let Ok(m) = std::env::var("TRANSFER_MODE") {
            ring_modes(&p, &m);
            return;
        }
        figures(&p);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
