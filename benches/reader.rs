//! Reading a whole 256 MiB bf16 checkpoint tensor by tensor (warm page
//! cache): raw bytes and converted to f32, against the `safetensors` crate
//! (`SafeTensors::deserialize` over a memory map, each tensor's data copied
//! out).

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rocm_safe::safetensors::{SafeTensors, SafeTensorsWriter, TensorSpec};
use rocm_safe::DType;

const MIB: u64 = 1 << 20;

/// Mixed sizes: 4 x 32 + 12 x 8 + 30 x 1 MiB + 512 x 4 KiB + 2 bytes = 256 MiB.
fn write_file(path: &Path) -> u64 {
    let layout: [(u64, u64); 4] = [(4, 32 * MIB), (12, 8 * MIB), (30, MIB), (512, 4096)];
    let mut specs = vec![TensorSpec::new("bias", DType::BF16, vec![1])]; // odd offsets after it
    for (k, &(count, bytes)) in layout.iter().enumerate() {
        for j in 0..count {
            specs.push(TensorSpec::new(
                format!("t{k}.{j}"),
                DType::BF16,
                vec![bytes / 2],
            ));
        }
    }
    let data: Vec<u8> = (0..32 * MIB as usize)
        .map(|i| (i * 7 + (i >> 11)) as u8)
        .collect();
    let mut w = SafeTensorsWriter::create(path, specs.clone(), None).unwrap();
    let mut total = 0;
    for s in &specs {
        let n = s.shape[0] as usize * 2;
        w.write_tensor(&s.name, &data[..n]).unwrap();
        total += n as u64;
    }
    w.finish().unwrap();
    total
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.safetensors");
    let total = write_file(&path);
    let names: Vec<String> = SafeTensors::open(&path)
        .unwrap()
        .tensors()
        .iter()
        .map(|t| t.name.clone())
        .collect();

    let mut g = c.benchmark_group("reader_256MiB_bf16");
    g.throughput(Throughput::Bytes(total));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(6));

    g.bench_function("rocm_safe/raw_bytes", |b| {
        b.iter(|| {
            let f = SafeTensors::open(&path).unwrap();
            for n in &names {
                black_box(f.read_bytes(n).unwrap());
            }
        })
    });
    g.bench_function("rocm_safe/to_f32", |b| {
        b.iter(|| {
            let f = SafeTensors::open(&path).unwrap();
            for n in &names {
                black_box(f.read::<f32>(n).unwrap());
            }
        })
    });
    g.bench_function("safetensors_crate_mmap/raw_bytes_copied", |b| {
        b.iter(|| {
            let file = std::fs::File::open(&path).unwrap();
            // SAFETY: the file is this benchmark's own temporary file; nothing
            // truncates or writes it while the map is alive.
            let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
            let st = safetensors::SafeTensors::deserialize(&map).unwrap();
            for n in &names {
                black_box(st.tensor(n).unwrap().data().to_vec());
            }
        })
    });
    g.bench_function("safetensors_crate_mmap/to_f32_half", |b| {
        b.iter(|| {
            let file = std::fs::File::open(&path).unwrap();
            // SAFETY: as above, the file does not change while mapped.
            let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
            let st = safetensors::SafeTensors::deserialize(&map).unwrap();
            for n in &names {
                let d = st.tensor(n).unwrap().data();
                let v: Vec<f32> = d
                    .chunks_exact(2)
                    .map(|b| f32::from_bits((u16::from_le_bytes([b[0], b[1]]) as u32) << 16))
                    .collect();
                black_box(v);
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
