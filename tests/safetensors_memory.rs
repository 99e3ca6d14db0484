//! Peak memory of reading a whole checkpoint tensor by tensor stays within
//! 2 x the largest output tensor + 128 MiB, whatever the file size.
//!
//! The test writes a 384 MiB checkpoint of F32, BF16 and F16 tensors (the
//! largest f32 output is 32 MiB), then re-runs this test binary as a child
//! process (env var `ROCM_SAFE_MEMTEST_FILE`) that reads every tensor as f32
//! and checks its own peak RSS (`VmHWM` in /proc/self/status), so the
//! parent's buffers do not count. F32 tensors take the direct path (pread
//! into the output), BF16/F16 the chunked converting one; 88 MiB are
//! converted, which keeps the test a few seconds in a debug build.

use std::path::Path;
use std::process::Command;

use rocm_safe::convert::scalar::{bf16_to_f32, f16_to_f32};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::DType;

const MIB: u64 = 1 << 20;
const ENV: &str = "ROCM_SAFE_MEMTEST_FILE";
const TEST_NAME: &str = "reading_every_tensor_keeps_peak_rss_bounded";

/// (count, dtype, bytes per tensor): 192 + 64 + 8 + 16 + 104 = 384 MiB.
const LAYOUT: [(u64, DType, u64); 5] = [
    (6, DType::F32, 32 * MIB),
    (4, DType::BF16, 16 * MIB),
    (8, DType::BF16, MIB),
    (16, DType::F16, MIB),
    (104, DType::F32, MIB),
];

fn pattern_byte(i: usize) -> u8 {
    // Any fixed, non-constant pattern; the child checks values against it.
    (i.wrapping_mul(31) ^ (i >> 9)) as u8
}

fn write_checkpoint(path: &Path) {
    let largest = LAYOUT.iter().map(|l| l.2).max().unwrap() as usize;
    let data: Vec<u8> = (0..largest).map(pattern_byte).collect();
    let mut specs = Vec::new();
    for (k, &(count, dtype, bytes)) in LAYOUT.iter().enumerate() {
        let row = 1024 * dtype.size().unwrap() as u64;
        for j in 0..count {
            // 2-D shapes: rows of 1024 elements.
            specs.push(TensorSpec::new(
                format!("t{k}.{j}"),
                dtype,
                vec![bytes / row, 1024],
            ));
        }
    }
    // A 3-byte tensor first: every other tensor starts at an odd offset.
    specs.insert(0, TensorSpec::new("odd", DType::U8, vec![3]));
    let mut w = SafeTensorsWriter::create(path, specs.clone(), None).unwrap();
    w.write_tensor("odd", &[1, 2, 3]).unwrap();
    for s in &specs[1..] {
        let n = (s.shape[0] * s.shape[1]) as usize * s.dtype.size().unwrap();
        w.write_tensor(&s.name, &data[..n]).unwrap();
    }
    w.finish().unwrap();
}

fn vm_hwm_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

fn child(path: &str) {
    let ckpt = Checkpoint::open(path).unwrap();
    let mut largest_out = 0u64;
    let mut total = 0u64;
    for (shard, t) in ckpt.tensors() {
        if t.dtype == DType::U8 {
            assert_eq!(shard.read_bytes(&t.name).unwrap(), [1, 2, 3]);
            continue;
        }
        let v: Vec<f32> = shard.read(&t.name).unwrap();
        assert_eq!(v.len() as u64, t.num_elements());
        // Spot-check values at both ends and the middle.
        for i in [0, v.len() / 2, v.len() - 1] {
            let p = pattern_byte;
            let want = match t.dtype {
                DType::F32 => {
                    u32::from_le_bytes([p(4 * i), p(4 * i + 1), p(4 * i + 2), p(4 * i + 3)])
                }
                DType::BF16 => bf16_to_f32(u16::from_le_bytes([p(2 * i), p(2 * i + 1)])),
                _ => f16_to_f32(u16::from_le_bytes([p(2 * i), p(2 * i + 1)])),
            };
            assert_eq!(v[i].to_bits(), want, "{} [{i}]", t.name);
        }
        largest_out = largest_out.max(v.len() as u64 * 4);
        total += t.num_bytes();
    }
    assert_eq!(total, 384 * MIB);
    let hwm = vm_hwm_bytes();
    let bound = 2 * largest_out + 128 * MIB;
    println!(
        "MEMTEST read {} MiB, largest f32 output {} MiB, VmHWM {} MiB, bound {} MiB",
        total / MIB,
        largest_out / MIB,
        hwm / MIB,
        bound / MIB
    );
    assert!(hwm <= bound, "VmHWM {hwm} > bound {bound}");
}

#[test]
fn reading_every_tensor_keeps_peak_rss_bounded() {
    if let Ok(path) = std::env::var(ENV) {
        child(&path);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.safetensors");
    let t0 = std::time::Instant::now();
    write_checkpoint(&path);
    println!("MEMTEST wrote the checkpoint in {:?}", t0.elapsed());
    assert!(std::fs::metadata(&path).unwrap().len() > 384 * MIB);
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            TEST_NAME,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ENV, &path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(out.status.success(), "child failed");
    // The child really ran the check (not a filtered-out no-op).
    assert!(
        stdout.contains("MEMTEST read 384 MiB"),
        "child did not run the check"
    );
}
