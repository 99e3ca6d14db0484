//! `cargo run --release --example convert -- INPUT OUTPUT --dtype f32|bf16|f16 [--keep-unsupported]`
//!
//! Converts a checkpoint (one `.safetensors` file or a sharded
//! `*.safetensors.index.json`) into ONE `.safetensors` file in which every
//! floating tensor (F64, F32, F16, BF16) has the target dtype. Integer and
//! bool tensors are copied unchanged; names, shapes and `__metadata__` are
//! kept. Floating types rocm-safe does not convert (FP8, MX, C64) are an
//! error unless `--keep-unsupported` copies them unchanged.
//!
//! Contract: exit 0 on success. On bad input: exit 1 with one line on stderr
//! naming the file (and tensor), and OUTPUT is not created (the data goes to
//! a temporary file that is renamed only when complete). Exit 2 on a usage
//! error. Memory: one tensor's output plus the reader's chunk at a time.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::{DType, Error};

const USAGE: &str = "usage: convert INPUT OUTPUT --dtype f32|bf16|f16 [--keep-unsupported]";

struct Args {
    input: PathBuf,
    output: PathBuf,
    dtype: DType,
    keep_unsupported: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut pos = Vec::new();
    let mut dtype = None;
    let mut keep_unsupported = false;
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("--dtype") => {
                let v = it.next().ok_or("--dtype needs a value")?;
                dtype = Some(match v.to_str() {
                    Some("f32") | Some("F32") => DType::F32,
                    Some("bf16") | Some("BF16") => DType::BF16,
                    Some("f16") | Some("F16") => DType::F16,
                    _ => return Err(format!("unknown --dtype {v:?} (f32, bf16 or f16)")),
                });
            }
            Some("--keep-unsupported") => keep_unsupported = true,
            Some("-h") | Some("--help") => return Err(String::new()),
            Some(s) if s.starts_with("--") => return Err(format!("unknown option {s}")),
            _ => pos.push(PathBuf::from(a)),
        }
    }
    let [input, output]: [PathBuf; 2] = pos
        .try_into()
        .map_err(|p: Vec<PathBuf>| format!("expected INPUT and OUTPUT, got {} paths", p.len()))?;
    let dtype = dtype.ok_or("--dtype is required")?;
    Ok(Args {
        input,
        output,
        dtype,
        keep_unsupported,
    })
}

/// What a tensor of dtype `from` becomes.
fn target(
    from: DType,
    to: DType,
    keep_unsupported: bool,
    ck: &Checkpoint,
    name: &str,
) -> Result<DType, Error> {
    if from.is_convertible_float() {
        return Ok(to);
    }
    let floating = matches!(
        from,
        DType::F4
            | DType::F6_E2M3
            | DType::F6_E3M2
            | DType::F8_E5M2
            | DType::F8_E4M3
            | DType::F8_E8M0
            | DType::F8_E4M3FNUZ
            | DType::F8_E5M2FNUZ
            | DType::C64
    );
    if floating && !keep_unsupported {
        let path = ck
            .get(name)
            .map_or_else(|| ck.path().to_owned(), |(f, _)| f.path().to_owned());
        return Err(Error::ConversionNotSupported {
            path,
            tensor: name.to_owned(),
            from,
            to,
        });
    }
    Ok(from)
}

fn run(args: &Args) -> Result<(usize, u64), Error> {
    let ck = Checkpoint::open(&args.input)?;
    let mut specs = Vec::with_capacity(ck.len());
    let mut total = 0u64;
    for (_, info) in ck.tensors() {
        let to = target(
            info.dtype,
            args.dtype,
            args.keep_unsupported,
            &ck,
            &info.name,
        )?;
        let spec = TensorSpec::new(info.name.clone(), to, info.shape.clone());
        total = total.saturating_add(info.num_bytes());
        specs.push(spec);
    }
    let mut writer = SafeTensorsWriter::create(&args.output, specs.iter().cloned(), ck.metadata())?;
    let bar = if std::io::stderr().is_terminal() {
        let b = ProgressBar::new(total);
        if let Ok(style) = ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
        ) {
            b.set_style(style);
        }
        b
    } else {
        ProgressBar::hidden()
    };
    let mut buf: Vec<u8> = Vec::new();
    let mut written = 0u64;
    for ((file, info), spec) in ck.tensors().zip(&specs) {
        bar.set_message(info.name.clone());
        // The writer computed every output size when it validated the specs.
        let n = spec
            .dtype
            .bytes_for(info.num_elements())
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| Error::TooLargeForPlatform {
                path: file.path().to_owned(),
                tensor: info.name.clone(),
                bytes: info.num_bytes(),
            })?;
        buf.clear();
        buf.resize(n, 0);
        if spec.dtype == info.dtype {
            file.read_bytes_into(&info.name, &mut buf)?;
        } else {
            file.read_as_bytes_into(&info.name, spec.dtype, &mut buf)?;
        }
        writer.write_tensor(&info.name, &buf)?;
        written += n as u64;
        bar.inc(info.num_bytes());
    }
    writer.finish()?;
    bar.finish_and_clear();
    Ok((specs.len(), written))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("convert: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok((n, bytes)) => {
            eprintln!(
                "convert: wrote {n} tensors ({:.1} MiB of tensor data) to {}",
                bytes as f64 / (1 << 20) as f64,
                args.output.display()
            );
            ExitCode::SUCCESS
        }
        Err(e @ Error::ConversionNotSupported { .. }) => {
            eprintln!("convert: {e}; --keep-unsupported copies such tensors unchanged");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("convert: {e}");
            ExitCode::FAILURE
        }
    }
}
