//! `fork()` after use: a child (PyTorch DataLoader workers, gunicorn,
//! `multiprocessing` on Linux) inherits rayon's pool without its threads.
//! The library's parallel sections must still finish there, and in a
//! grandchild, and a loader made before the fork must not wait for its
//! pinning thread, which the child does not have.

use std::time::{Duration, Instant};

use half::bf16;
use rocm_safe::conv3d::{conv3d_cpu, Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::convert::{convert_slice, expected_fingerprint, fingerprint_bytes};
use rocm_safe::device::Device;
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{LoadOptions, Loader};
use rocm_safe::DType;

/// Large enough for every parallel path (well above their thresholds).
const N: usize = 512 << 10;

fn source() -> Vec<bf16> {
    (0..N)
        .map(|i| bf16::from_bits((i as u16) ^ 0x3c00))
        .collect()
}

/// The parallel work: a conversion, a fingerprint, a CPU conv3d, and a
/// load through `loader` (made in an ancestor, or here). True when every
/// result equals the serial reference.
fn work(src: &[bf16], loader: &mut Loader, ckpt: &Checkpoint) -> bool {
    let mut out = vec![0f32; src.len()];
    if convert_slice(src, &mut out).is_err() {
        return false;
    }
    // bf16 -> f32 is exact: the 16 bits, shifted (NaN payloads kept).
    let exact = src
        .iter()
        .zip(&out)
        .all(|(s, o)| u32::from(s.to_bits()) << 16 == o.to_bits());
    let bytes: &[u8] = bytemuck::cast_slice(&out);
    // Two parallel paths that must agree: the output's sum, and the sum
    // of the source converted piece by piece.
    let fp = expected_fingerprint(DType::BF16, bytemuck::cast_slice(src), DType::F32)
        .is_ok_and(|want| fingerprint_bytes(bytes) == want);
    let x = vec![1.0f32; 16 * 8 * 8 * 8];
    let w = vec![0.5f32; 16 * 16 * 27];
    let conv = Conv3dProblem::new(
        Conv3dParams::default().with_padding([1, 1, 1]),
        Conv3dData::F32(&x),
        &[1usize, 16, 8, 8, 8],
        Conv3dData::F32(&w),
        &[16usize, 16, 3, 3, 3],
        None,
    )
    .ok()
    .and_then(|p| {
        let mut y = vec![0f32; 16 * 8 * 8 * 8];
        conv3d_cpu(&p, &mut y).ok()?;
        // The centre point sees every tap: 16 channels x 27 taps x 0.5.
        Some(y[4 * 64 + 4 * 8 + 4] == 216.0)
    })
    .unwrap_or(false);
    let loaded = loader
        .load_all(ckpt)
        .ok()
        .and_then(|l| l.tensors.first().and_then(|t| t.data.to_host().ok()))
        .map(|b| b.len() == 4 * (256 << 10))
        .unwrap_or(false);
    if !(exact && fp && conv && loaded) {
        eprintln!("exact {exact} fingerprint {fp} conv3d {conv} load {loaded}");
    }
    exact && fp && conv && loaded
}

/// Forks; the child runs `child` and exits 0 when it returns true. The
/// parent waits at most `limit`; a child still running then is killed and
/// the test fails (the hang this file is about).
fn in_child(limit: Duration, child: impl FnOnce() -> bool) -> Result<(), String> {
    // SAFETY: fork in a test process; the child only runs `child` (library
    // code that must work after fork) and leaves with _exit, never
    // returning into the test harness.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err("fork failed".into());
    }
    if pid == 0 {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or(false);
        // SAFETY: ends the child without running the parent's atexit
        // handlers or the harness.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: `pid` is our child; `status` is writable.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                Ok(())
            } else {
                Err(format!("child failed (status {status:#x})"))
            };
        }
        if start.elapsed() > limit {
            // SAFETY: `pid` is our child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            // SAFETY: as above; reaps it.
            unsafe { libc::waitpid(pid, &mut status, 0) };
            return Err(format!("child hung: no exit within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn parallel_work_and_loads_finish_in_a_forked_child_and_grandchild() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.safetensors");
    let mut wr = SafeTensorsWriter::create(
        &path,
        [TensorSpec::new("x", DType::BF16, [256u64 << 10])],
        None,
    )
    .unwrap();
    wr.write_tensor("x", &vec![0x3fu8; 512 << 10]).unwrap();
    wr.finish().unwrap();
    let ckpt = Checkpoint::open(&path).unwrap();
    let dev = Device::host();
    let mut loader = Loader::new(&dev, LoadOptions::to_dtype(DType::F32)).unwrap();
    let src = source();
    // The parent uses everything first: rayon's global pool is started,
    // the loader's ring and pinning thread exist.
    assert!(work(&src, &mut loader, &ckpt));
    let limit = Duration::from_secs(120);
    let r = in_child(limit, || {
        // The parent's loader, then a new one, then a grandchild.
        work(&src, &mut loader, &ckpt)
            && Loader::new(&dev, LoadOptions::to_dtype(DType::F32))
                .map(|mut l| work(&src, &mut l, &ckpt))
                .unwrap_or(false)
            && in_child(limit, || work(&src, &mut loader, &ckpt)).is_ok()
    });
    r.unwrap();
    // The parent is unaffected.
    assert!(work(&src, &mut loader, &ckpt));
}
