//! `cargo run --release --example conv3d -- INPUT.safetensors OUTPUT.safetensors
//!   --input NAME --weight NAME [--bias NAME] [--stride a,b,c] [--padding a,b,c]
//!   [--dilation a,b,c] [--groups g] [--tier auto|vendor|tiled|naive|cpu]
//!   [--device auto|host|hip|cuda]`
//!
//! Runs one 3-D convolution through rocm-safe's fallback chain and writes
//! its result as the F32 tensor `output` of OUTPUT. Input and weight are
//! NCDHW; when both are BF16 they stay bf16 (widened exactly inside the
//! tiers), otherwise every float dtype is read as f32. `--tier` forces one
//! tier (no fallback); `auto` runs the chain. `--device` picks whose GPU
//! tiers the chain has: `auto` the first GPU (else none), `host` the host
//! backend (the GPU code path with the CPU standing in), `hip`/`cuda`
//! device 0 of that backend. The report (which tier
//! served, what failed before it) and the per-tier statistics go to
//! stdout.
//!
//! Contract: exit 0 on success. Bad shapes, parameters or tensor names, or
//! no tier serving: exit 1 with one line on stderr, and OUTPUT is not
//! created. Exit 2 on a usage error.
//!
//! Also exit 1, nothing written: an OUTPUT that is the INPUT file (through
//! `..`, symlinks or hard links) or an existing non-regular file; an INPUT
//! that is not a regular file; buffers larger than this machine's memory
//! (a huge padding); a result that overflows f32 although every input is
//! finite (`Conv3dOverflow`, a fact about the inputs: no tier is blamed).
//! SIGINT, SIGTERM and SIGHUP remove the temporary file and exit with
//! 128 + the signal.

#[path = "common/signals.rs"]
mod signals;

use std::path::PathBuf;
use std::process::ExitCode;

use rocm_safe::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::conv3d_chain::{Conv3dChain, TierKind};
use rocm_safe::device::{BackendKind, Device};
use rocm_safe::safetensors::{SafeTensors, SafeTensorsWriter, TensorSpec, WriteOptions};
use rocm_safe::{DType, Error};

const USAGE: &str =
    "usage: conv3d INPUT.safetensors OUTPUT.safetensors --input NAME --weight NAME \
[--bias NAME] [--stride a,b,c] [--padding a,b,c] [--dilation a,b,c] [--groups g] \
[--tier auto|vendor|tiled|naive|cpu] [--device auto|host|hip|cuda]";

struct Args {
    file: PathBuf,
    output: PathBuf,
    input: String,
    weight: String,
    bias: Option<String>,
    params: Conv3dParams,
    tier: Option<TierKind>,
    device: Option<BackendKind>,
}

fn triple(flag: &str, v: &str) -> Result<[usize; 3], String> {
    let parts: Vec<&str> = v.split(',').collect();
    let nums: Result<Vec<usize>, _> = parts.iter().map(|p| p.trim().parse::<usize>()).collect();
    match nums.as_deref() {
        Ok(&[a]) => Ok([a; 3]),
        Ok(&[a, b, c]) => Ok([a, b, c]),
        _ => Err(format!(
            "{flag} needs one or three non-negative integers (a,b,c), got {v:?}"
        )),
    }
}

fn parse_args() -> Result<Args, String> {
    let mut pos = Vec::new();
    let (mut input, mut weight, mut bias, mut tier) = (None, None, None, None);
    let mut device = None;
    let mut params = Conv3dParams::default();
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        let Some(flag) = a.to_str().filter(|s| s.starts_with("--") || *s == "-h") else {
            pos.push(PathBuf::from(a));
            continue;
        };
        if flag == "-h" || flag == "--help" {
            return Err(String::new());
        }
        let value = it
            .next()
            .and_then(|v| v.into_string().ok())
            .ok_or_else(|| format!("{flag} needs a value"))?;
        match flag {
            "--input" => input = Some(value),
            "--weight" => weight = Some(value),
            "--bias" => bias = Some(value),
            "--stride" => params.stride = triple(flag, &value)?,
            "--padding" => params.padding = triple(flag, &value)?,
            "--dilation" => params.dilation = triple(flag, &value)?,
            "--groups" => {
                params.groups = value
                    .parse()
                    .map_err(|_| format!("--groups needs a non-negative integer, got {value:?}"))?
            }
            "--tier" => {
                tier = match value.as_str() {
                    "auto" => None,
                    v => Some(v.parse::<TierKind>().map_err(|()| {
                        format!("unknown --tier {v:?} (auto, vendor, tiled, naive or cpu)")
                    })?),
                }
            }
            "--device" => {
                device = match value.as_str() {
                    "auto" => None,
                    "host" => Some(BackendKind::Host),
                    "hip" => Some(BackendKind::Hip),
                    "cuda" => Some(BackendKind::Cuda),
                    v => return Err(format!("unknown --device {v:?} (auto, host, hip or cuda)")),
                }
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    let [file, output]: [PathBuf; 2] = pos.try_into().map_err(|p: Vec<PathBuf>| {
        format!(
            "expected INPUT.safetensors and OUTPUT.safetensors, got {} paths",
            p.len()
        )
    })?;
    Ok(Args {
        file,
        output,
        input: input.ok_or("--input is required")?,
        weight: weight.ok_or("--weight is required")?,
        bias,
        params,
        tier,
        device,
    })
}

/// A tensor's shape as `usize`s.
fn shape(f: &SafeTensors, name: &str) -> Result<Vec<usize>, Error> {
    let info = f.info(name)?;
    info.shape
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<Result<_, _>>()
        .map_err(|_| Error::TooLargeForPlatform {
            path: f.path().to_owned(),
            tensor: name.to_owned(),
            bytes: info.num_bytes(),
        })
}

enum Owned {
    F32(Vec<f32>),
    BF16(Vec<half::bf16>),
}

impl Owned {
    fn data(&self) -> Conv3dData<'_> {
        match self {
            Owned::F32(v) => Conv3dData::F32(v),
            Owned::BF16(v) => Conv3dData::BF16(v),
        }
    }
}

fn run(
    args: &Args,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<String, Error> {
    let f = SafeTensors::open(&args.file)?;
    let (xs, ws) = (shape(&f, &args.input)?, shape(&f, &args.weight)?);
    let both_bf16 =
        f.info(&args.input)?.dtype == DType::BF16 && f.info(&args.weight)?.dtype == DType::BF16;
    let read = |name: &str| -> Result<Owned, Error> {
        if both_bf16 {
            f.read::<half::bf16>(name).map(Owned::BF16)
        } else {
            f.read::<f32>(name).map(Owned::F32)
        }
    };
    let (x, w) = (read(&args.input)?, read(&args.weight)?);
    let b = match &args.bias {
        Some(name) => {
            let bs = shape(&f, name)?;
            if bs.len() != 1 {
                return Err(Error::Conv3dShape {
                    tensor: "bias",
                    shape: bs,
                    reason: "must be 1-d [K]",
                });
            }
            Some(f.read::<f32>(name)?)
        }
        None => None,
    };
    let p = Conv3dProblem::new(
        args.params,
        x.data(),
        &xs,
        w.data(),
        &ws,
        b.as_deref().map(Conv3dData::F32),
    )?;
    let mut chain = match args.device {
        None => Conv3dChain::first_gpu(),
        Some(kind) => Conv3dChain::for_device(&Device::open(kind, 0)?),
    };
    chain.options_mut().force = args.tier;
    let (out, report) = chain.run(&p)?;

    let out_shape: Vec<u64> = p
        .geometry
        .output_shape()
        .iter()
        .map(|&d| d as u64)
        .collect();
    let options = WriteOptions::default()
        .with_inputs([f.file_id()])
        .with_cancel(cancel);
    let mut writer = SafeTensorsWriter::create_with(
        &args.output,
        [TensorSpec::new("output", DType::F32, out_shape)],
        None,
        options,
    )?;
    // In pieces of 1 MiB: no second copy of the output in memory.
    let delay = signals::write_delay();
    let mut bytes = Vec::with_capacity(1 << 20);
    for piece in out.chunks(1 << 18) {
        bytes.clear();
        bytes.extend(piece.iter().flat_map(|v| v.to_le_bytes()));
        writer.write_chunk("output", &bytes)?;
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
    }
    f.check_unchanged()?;
    writer.finish()?;

    let mut text = format!(
        "conv3d {:?} ({}) -> {:?} [{:.3} GFLOP]\nreport: {report}\n",
        p.geometry.input_shape(),
        p.dtype(),
        p.geometry.output_shape(),
        2.0 * p.geometry.macs() as f64 / 1e9
    );
    text.push_str("tier      attempts  successes  skips  errors  non-finite  mismatches  time\n");
    for s in chain.stats() {
        text.push_str(&format!(
            "{:<9} {:>8}  {:>9}  {:>5}  {:>6}  {:>10}  {:>10}  {:.3?}\n",
            s.name, s.attempts, s.successes, s.skips, s.errors, s.non_finite, s.mismatches, s.time
        ));
    }
    Ok(text)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("conv3d: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let cancel = signals::install();
    let result = run(&args, cancel);
    // A signal that arrived after the output was committed changes nothing.
    if let (Err(_), Some(sig)) = (&result, signals::received()) {
        eprintln!(
            "conv3d: interrupted by signal {sig}: temporary file removed, {} not written",
            args.output.display()
        );
        return ExitCode::from(signals::exit_status(sig));
    }
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("conv3d: {e}");
            ExitCode::FAILURE
        }
    }
}
