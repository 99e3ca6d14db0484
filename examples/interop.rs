//! What a trainer does with rocm-safe: load a (sharded) checkpoint onto the
//! first available device, verified; hand every tensor to another framework
//! through DLPack; take one back; run a verified conversion and a conv3d on
//! that borrowed memory, on a stream the "trainer" owns; print the reports.
//!
//! ```sh
//! cargo run --release --example interop                    # a demo checkpoint
//! cargo run --release --example interop -- model.safetensors.index.json
//! ```
//!
//! Without an argument it writes a small sharded demo checkpoint (bf16
//! weights of a 3-D convolution and its input) into a temporary folder.
//! Exit status: 0 when everything checked out, 1 on any error.

use std::path::{Path, PathBuf};

use half::bf16;
use rocm_safe::conv3d::{conv3d_cpu, Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::device::{Conv3dKernel, Device, Stream};
use rocm_safe::dlpack::{Export, Imported};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{LoadOptions, Loader};
use rocm_safe::verify::{self, VerifyOptions};
use rocm_safe::DType;

fn main() {
    if let Err(e) = run() {
        eprintln!("interop: {e}");
        std::process::exit(1);
    }
}

/// A two-shard checkpoint: `conv.weight` [8, 4, 3, 3, 3] and `x` [1, 4, 4,
/// 8, 8] in bf16, plus an integer tensor a trainer would not convert.
fn demo(dir: &Path) -> Res<PathBuf> {
    let tensors: [(&str, &str, Vec<u64>); 3] = [
        ("model-1.safetensors", "conv.weight", vec![8, 4, 3, 3, 3]),
        ("model-2.safetensors", "x", vec![1, 4, 4, 8, 8]),
        ("model-2.safetensors", "step", vec![1]),
    ];
    let mut map = serde_json::Map::new();
    for shard in ["model-1.safetensors", "model-2.safetensors"] {
        let mine: Vec<_> = tensors.iter().filter(|t| t.0 == shard).collect();
        let specs = mine.iter().map(|(_, n, s)| {
            let dtype = if *n == "step" {
                DType::I64
            } else {
                DType::BF16
            };
            TensorSpec::new(*n, dtype, s.clone())
        });
        let mut w = SafeTensorsWriter::create(dir.join(shard), specs, None)?;
        for (_, name, shape) in &mine {
            let n: u64 = shape.iter().product();
            let bytes: Vec<u8> = if *name == "step" {
                1000i64.to_le_bytes().to_vec()
            } else {
                (0..n)
                    .flat_map(|i| {
                        bf16::from_f32(((i * 37 % 23) as f32 - 11.0) / 16.0).to_le_bytes()
                    })
                    .collect()
            };
            w.write_tensor(name, &bytes)?;
            map.insert((*name).into(), serde_json::Value::String(shard.into()));
        }
        w.finish()?;
    }
    let index = dir.join("model.safetensors.index.json");
    let json = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(&index, json.to_string())?;
    Ok(index)
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn run() -> Res<()> {
    let tmp = std::env::temp_dir().join(format!("rocm-safe-interop-{}", std::process::id()));
    let path = match std::env::args_os().nth(1) {
        Some(p) => PathBuf::from(p),
        None => {
            std::fs::create_dir_all(&tmp)?;
            demo(&tmp)?
        }
    };
    let r = interop(&path);
    let _ = std::fs::remove_dir_all(&tmp);
    r
}

fn interop(path: &Path) -> Res<()> {
    // 1. Load onto the first device that opens (HIP, CUDA, else the host),
    //    converted to f32 and verified piece by piece.
    let dev = Device::first_available();
    println!(
        "device: {} {} ({})",
        dev.kind(),
        dev.info().ordinal,
        dev.info().name
    );
    let ckpt = Checkpoint::open(path)?;
    let mut loader = Loader::new(&dev, LoadOptions::to_dtype(DType::F32))?;
    let loaded = loader.load_all(&ckpt)?;
    println!("load report:\n{}", loaded.report);

    // 2. Hand every tensor to "another framework" through DLPack: the
    //    capsules own the memory now; their deleters give it back.
    let mut capsules = Vec::new();
    for t in loaded.tensors {
        let name = t.name.clone();
        let managed = Export::from_loaded(t)?.into_managed()?;
        capsules.push((name, managed));
    }
    for (name, m) in &capsules {
        // SAFETY: `m` owns a live managed tensor; it is only read here.
        let t = unsafe { &(*m.as_ptr()).dl_tensor };
        println!(
            "exported {name}: device type {:?} id {}, dtype code {:?} bits {}, {} dims",
            t.device.device_type, t.device.device_id, t.dtype.code, t.dtype.bits, t.ndim
        );
    }

    // 3. Take the input and the weight back as borrowed views (the
    //    "framework" hands its tensors to rocm-safe).
    let mut imported = Vec::new();
    for (name, m) in capsules {
        if name == "x" || name == "conv.weight" {
            // SAFETY: `into_raw` gives up a managed tensor this process made
            // and nothing else holds; `from_raw` takes it over once.
            let im = unsafe { Imported::from_raw(&dev, m.into_raw())? };
            imported.push((name, im));
        }
        // Others: dropping the capsule runs its deleter (memory freed at the
        // device's next sync point).
    }
    let get = |n: &str| {
        imported
            .iter()
            .find(|(name, _)| name == n)
            .map(|(_, im)| im)
    };
    let (Some(x), Some(w)) = (get("x"), get("conv.weight")) else {
        println!("no x / conv.weight in this checkpoint: the conv3d part is skipped");
        return Ok(());
    };

    // 4. A stream the trainer owns: rocm-safe runs on it, never destroys it.
    let raw = dev.backend().stream_create()?;
    // SAFETY: `raw` is a live stream of `dev`, destroyed below by its owner
    // (this function) after every user is gone.
    let trainer = unsafe { Stream::from_raw(&dev, raw) };
    let r = work(&dev, &trainer, &ckpt, x, w);
    drop(trainer);
    // SAFETY: created above, destroyed once, no user left.
    unsafe { dev.backend().stream_destroy(raw) }?;
    dev.synchronize()?;
    if let Some(e) = dev.take_errors().into_iter().next() {
        return Err(e.into());
    }
    r
}

/// A verified f32 -> bf16 conversion of the borrowed weight and a conv3d of
/// the borrowed input and weight, both on the trainer's stream, each checked
/// against the CPU.
fn work(dev: &Device, s: &Stream, ckpt: &Checkpoint, x: &Imported, w: &Imported) -> Res<()> {
    let wv = w.view::<f32>()?;
    let host_w: Vec<f32> = ckpt.read("conv.weight")?;
    let mut wb = s.alloc::<bf16>(wv.len())?;
    let report = verify::convert_verified(
        s,
        &host_w,
        &wv,
        &mut wb.view_mut(),
        &VerifyOptions::default(),
    )?;
    println!("verified conversion of conv.weight on the trainer's stream: {report}");

    let xv = x.view::<f32>()?;
    let host_x: Vec<f32> = ckpt.read("x")?;
    let p = Conv3dProblem::new(
        Conv3dParams::default().with_padding([1; 3]),
        Conv3dData::F32(&host_x),
        x.shape(),
        Conv3dData::F32(&host_w),
        w.shape(),
        None,
    )?;
    let g = p.geometry;
    let mut out = s.alloc::<f32>(g.output_len())?;
    s.conv3d_ops()
        .forward(Conv3dKernel::Naive, &g, &xv, &wv, None, &mut out.view_mut())?;
    let got = out.view().to_vec(s)?;
    let mut want = vec![0f32; g.output_len()];
    conv3d_cpu(&p, &mut want)?;
    let worst = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs() / (1.0 + b.abs()))
        .fold(0f32, f32::max);
    println!(
        "conv3d of borrowed x {:?} and conv.weight {:?} on the trainer's stream: output {:?}, largest relative difference to the CPU {worst:.2e}",
        x.shape(),
        w.shape(),
        g.output_shape()
    );
    if worst > 1e-4 {
        return Err(format!("conv3d differs from the CPU by {worst:.2e}").into());
    }
    println!(
        "owned by rocm-safe on {}: {} bytes",
        dev.kind(),
        dev.owned_bytes()
    );
    Ok(())
}
