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
//! error. Memory: the data takes two chunks of about 1 MiB, whatever the
//! tensor sizes (tensors are streamed, never held whole); the headers of
//! the input and the output take memory in proportion to the number of
//! tensors: while a header is parsed, its JSON text plus a tree of it
//! (duplicate keys are kept to be refused), then the tensor table. Measured
//! on a file of 1,000,000 tensors (an 89 MB header): opening it grows the
//! RSS by 0.89 GB (about 0.9 KB per tensor; the allocator keeps what the
//! parse freed), and listing its keys from Python peaks at 1.29 GB
//! (`safetensors`: 1.0 GB).
//!
//! Refused with exit 1, nothing written (the library's checks): an OUTPUT
//! that is the INPUT, one of its shards or its index (same file through
//! `..`, symlinks or hard links); an OUTPUT that exists and is not a
//! regular file (`/dev/null`, a FIFO); an INPUT, index or shard that is not
//! a regular file (a FIFO is refused at once, never waited on); a file
//! changed while it is read. SIGINT, SIGTERM and SIGHUP remove the
//! temporary file and exit with 128 + the signal.

#[path = "common/signals.rs"]
mod signals;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use rocm_safe::safetensors::{convert_file, ConvertOptions};
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

fn run(
    args: &Args,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<(usize, u64), Error> {
    let options = ConvertOptions::to_dtype(args.dtype)
        .keep_unsupported(args.keep_unsupported)
        .with_cancel(cancel);
    let delay = signals::write_delay();
    let mut bar: Option<ProgressBar> = None;
    let done = convert_file(&args.input, &args.output, &options, &mut |p| {
        if std::io::stderr().is_terminal() {
            let b = bar.get_or_insert_with(|| {
                let b = ProgressBar::new(p.bytes_total);
                if let Ok(style) = ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta} {msg}",
                ) {
                    b.set_style(style);
                }
                b
            });
            b.set_message(p.tensor.clone());
            b.set_position(p.bytes_done);
        }
        if let Some(d) = delay {
            std::thread::sleep(d);
        }
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok((done.tensors, done.bytes_written))
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
    let cancel = signals::install();
    let result = run(&args, cancel);
    // A signal that arrived after the output was committed changes nothing.
    if let (Err(_), Some(sig)) = (&result, signals::received()) {
        eprintln!(
            "convert: interrupted by signal {sig}: temporary file removed, {} not written",
            args.output.display()
        );
        return ExitCode::from(signals::exit_status(sig));
    }
    match result {
        Ok((n, bytes)) => {
            eprintln!(
                "convert: wrote {n} tensors ({:.1} MiB of tensor data) to {}",
                bytes as f64 / (1 << 20) as f64,
                args.output.display()
            );
            ExitCode::SUCCESS
        }
        Err(
            e @ Error::UnsupportedConversion {
                tensor: Some(_), ..
            },
        ) => {
            eprintln!("convert: {e}; --keep-unsupported copies such tensors unchanged");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("convert: {e}");
            ExitCode::FAILURE
        }
    }
}
