//! Loads a checkpoint onto a device with the verified transfer pipeline,
//! with a progress bar, and prints what each rung served.
//!
//! ```text
//! cargo run --release --example load -- CHECKPOINT [--backend host|cuda|hip]
//!     [--dtype f32|bf16|f16|as-stored] [--policy fingerprint|fused|readback|off]
//!     [--budget-mib N] [--verbose]
//! ```
//! `CHECKPOINT` is a `.safetensors` file or a `*.safetensors.index.json`.

use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use rocm_safe::device::{BackendKind, Device};
use rocm_safe::safetensors::Checkpoint;
use rocm_safe::transfer::{LoadOptions, Loader, Request};
use rocm_safe::verify::Policy;
use rocm_safe::DType;

fn usage() -> ExitCode {
    eprintln!(
        "usage: load CHECKPOINT [--backend host|cuda|hip] [--dtype f32|bf16|f16|as-stored] \
         [--policy fingerprint|fused|readback|off] [--budget-mib N] [--verbose]"
    );
    ExitCode::from(2)
}

fn main() -> ExitCode {
    // The checkpoint's path may be any bytes (a valid Linux file name need
    // not be UTF-8); the options are text.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let Some(path) = args
        .first()
        .filter(|a| !a.as_encoded_bytes().starts_with(b"--"))
        .map(std::path::PathBuf::from)
    else {
        return usage();
    };
    let mut options = Vec::new();
    for a in args.iter().skip(1) {
        match a.to_str() {
            Some(s) => options.push(s.to_owned()),
            None => {
                eprintln!("load: argument {a:?} is not UTF-8 text");
                return usage();
            }
        }
    }
    let args = options;
    let mut backend = BackendKind::Host;
    let mut opts = LoadOptions::to_dtype(DType::F32);
    let mut verbose = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().cloned().unwrap_or_default();
        match a.as_str() {
            "--backend" => {
                backend = match val().as_str() {
                    "cuda" => BackendKind::Cuda,
                    "hip" => BackendKind::Hip,
                    "host" => BackendKind::Host,
                    _ => return usage(),
                }
            }
            "--dtype" => {
                opts.dtype = match val().as_str() {
                    "f32" => Some(DType::F32),
                    "bf16" => Some(DType::BF16),
                    "f16" => Some(DType::F16),
                    "as-stored" => None,
                    _ => return usage(),
                }
            }
            "--policy" => {
                opts.policy = match val().as_str() {
                    "fingerprint" => Policy::Fingerprint,
                    "fused" => Policy::FusedFingerprint,
                    "readback" => Policy::ReadBack,
                    "off" => Policy::Off,
                    _ => return usage(),
                }
            }
            "--budget-mib" => {
                let v = val();
                // Checked: a value whose byte count overflows u64 is a
                // usage error, never a wrapped (tiny) budget.
                match v.parse::<u64>().ok().and_then(|m| m.checked_mul(1 << 20)) {
                    Some(bytes) => opts.memory_budget = Some(bytes),
                    None => {
                        eprintln!(
                            "load: --budget-mib {v:?}: not a number of MiB that fits in 64 bits of bytes"
                        );
                        return usage();
                    }
                }
            }
            "--verbose" => verbose = true,
            _ => return usage(),
        }
    }
    match run(&path, backend, opts, verbose) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(
    path: &std::path::Path,
    backend: BackendKind,
    opts: LoadOptions,
    verbose: bool,
) -> rocm_safe::Result<()> {
    let ckpt = Checkpoint::open(path)?;
    let dev = Device::open(backend, 0)?;
    let mut loader = Loader::new(&dev, opts)?;
    let reqs: Vec<Request> = ckpt
        .tensors()
        .map(|(_, t)| Request::whole(t.name.clone()))
        .collect();
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let loaded = loader.load_with_progress(&ckpt, &reqs, &mut |p| {
        bar.set_length(p.total_bytes);
        bar.set_position(p.done_bytes);
        bar.set_message(format!("{}/{} tensors", p.done_tensors, p.total_tensors));
    })?;
    bar.finish();
    let r = &loaded.report;
    println!(
        "{} tensors, {} bytes read, {} bytes loaded on {} in {:.1} ms ({})",
        r.tensors.len(),
        r.file_bytes,
        r.out_bytes,
        r.device,
        r.ms,
        r.throughput_text()
    );
    for (rung, n, bytes) in r.by_rung() {
        if n > 0 {
            println!("  {rung:>12}: {n} tensors, {bytes} bytes");
        }
    }
    for t in &r.tensors {
        if verbose || !t.attempts.is_empty() || t.offloaded {
            let why: Vec<String> = t
                .attempts
                .iter()
                .map(|a| format!("{}: {}", a.step, a.failure))
                .collect();
            println!(
                "  {} -> {}{}{}",
                t.name,
                t.rung,
                if t.offloaded { " (over budget)" } else { "" },
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" after [{}]", why.join("; "))
                }
            );
        }
    }
    Ok(())
}
