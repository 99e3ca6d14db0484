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
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec, WriteOptions};
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

fn run(
    args: &Args,
    cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<(usize, u64), Error> {
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
    let options = WriteOptions::default()
        .with_inputs(ck.file_ids())
        .with_cancel(cancel);
    let mut writer = SafeTensorsWriter::create_with(
        &args.output,
        specs.iter().cloned(),
        ck.metadata(),
        options,
    )?;
    let delay = signals::write_delay();
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
    let mut written = 0u64;
    for ((file, info), spec) in ck.tensors().zip(&specs) {
        bar.set_message(info.name.clone());
        // Streamed: one chunk of the source and its conversion at a time.
        file.for_each_chunk(&info.name, spec.dtype, |piece| {
            writer.write_chunk(&info.name, piece)?;
            written = written.saturating_add(piece.len() as u64);
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            Ok(())
        })?;
        bar.inc(info.num_bytes());
    }
    // Every read checked its file afterwards; check all of them (index
    // included) once more just before the output is committed.
    ck.check_unchanged()?;
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
