//! Converting a checkpoint into one safetensors file: [`convert_file`].

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use super::{Checkpoint, SafeTensorsWriter, TensorSpec, WriteOptions};
use crate::dtype::DType;
use crate::error::{Error, Result, TensorRef};

/// What [`convert_file`] does with the tensors.
///
/// ```
/// use rocm_safe::safetensors::ConvertOptions;
/// use rocm_safe::DType;
/// let opts = ConvertOptions::to_dtype(DType::BF16).keep_unsupported(true);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct ConvertOptions {
    /// The dtype every F64, F32, F16 and BF16 tensor is converted to
    /// (`None`: every tensor is copied as stored). Integer and bool tensors
    /// are always copied as stored.
    pub dtype: Option<DType>,
    /// Copy float tensors that cannot be converted (fp8, fp4, fp6, complex)
    /// unchanged instead of refusing the file
    /// ([`Error::UnsupportedConversion`]).
    pub keep_unsupported: bool,
    /// A cancellation flag for the writer ([`WriteOptions::cancel`]): set,
    /// the temporary file is removed and [`Error::Cancelled`] returned.
    pub cancel: Option<Arc<AtomicBool>>,
}

impl ConvertOptions {
    /// Float tensors converted to `dtype`.
    pub fn to_dtype(dtype: DType) -> ConvertOptions {
        ConvertOptions {
            dtype: Some(dtype),
            ..ConvertOptions::default()
        }
    }

    /// These options, copying unconvertible float tensors unchanged when
    /// `keep` is true.
    pub fn keep_unsupported(mut self, keep: bool) -> ConvertOptions {
        self.keep_unsupported = keep;
        self
    }

    /// These options with a cancellation flag.
    pub fn with_cancel(mut self, flag: Arc<AtomicBool>) -> ConvertOptions {
        self.cancel = Some(flag);
        self
    }
}

/// Where a [`convert_file`] stands, given to its progress callback after
/// every chunk written.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConvertProgress {
    /// The tensor being written.
    pub tensor: String,
    /// Tensors finished.
    pub tensors_done: usize,
    /// Tensors in all.
    pub tensors_total: usize,
    /// Source bytes read so far.
    pub bytes_done: u64,
    /// Source bytes in all.
    pub bytes_total: u64,
}

/// What [`convert_file`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConvertSummary {
    /// The file written (a symlink's target when the output was a link).
    pub path: PathBuf,
    /// Tensors written.
    pub tensors: usize,
    /// Bytes of tensor data written.
    pub bytes_written: u64,
}

/// Converts the checkpoint `input` (one file or a `*.safetensors.index.json`)
/// into the single file `output`: every float tensor to
/// [`ConvertOptions::dtype`] (exactly, chunk by chunk: memory holds two
/// chunks of about 1 MiB whatever the tensor sizes), the rest as stored,
/// the metadata kept, tensors in the checkpoint's order. `progress` is
/// called after every chunk written.
///
/// The output is written atomically (a temporary file renamed when
/// complete) with the writer's checks ([`SafeTensorsWriter`]): an output
/// that is the input, one of its shards or its index is refused
/// ([`Error::OutputIsInput`]), so is one that is not a regular file; every
/// input file is checked unchanged once more just before the rename.
///
/// Errors: those of [`Checkpoint::open`], the reads
/// ([`Error::FileChanged`], [`Error::FileShrunk`], [`Error::Io`]) and the
/// writer; [`Error::UnsupportedConversion`] for a float tensor that cannot
/// be converted without [`ConvertOptions::keep_unsupported`];
/// [`Error::Cancelled`].
///
/// ```no_run
/// use rocm_safe::safetensors::{convert_file, ConvertOptions};
/// use rocm_safe::DType;
/// let done = convert_file(
///     "model.safetensors.index.json",
///     "model-bf16.safetensors",
///     &ConvertOptions::to_dtype(DType::BF16),
///     &mut |p| eprintln!("{} {}/{} bytes", p.tensor, p.bytes_done, p.bytes_total),
/// )?;
/// println!("{} tensors -> {}", done.tensors, done.path.display());
/// # Ok::<(), rocm_safe::Error>(())
/// ```
pub fn convert_file(
    input: impl AsRef<Path>,
    output: impl AsRef<Path>,
    options: &ConvertOptions,
    progress: &mut dyn FnMut(&ConvertProgress),
) -> Result<ConvertSummary> {
    let ck = Checkpoint::open(input.as_ref())?;
    let mut specs = Vec::with_capacity(ck.len());
    let mut bytes_total = 0u64;
    for (file, info) in ck.tensors() {
        let to = target(info.dtype, options, file.path(), &info.name)?;
        specs.push(TensorSpec::new(info.name.clone(), to, info.shape.clone()));
        bytes_total = bytes_total.saturating_add(info.num_bytes());
    }
    let mut write = WriteOptions::default().with_inputs(ck.file_ids());
    if let Some(flag) = &options.cancel {
        write = write.with_cancel(flag.clone());
    }
    let mut writer =
        SafeTensorsWriter::create_with(output, specs.iter().cloned(), ck.metadata(), write)?;
    let mut state = ConvertProgress {
        tensor: String::new(),
        tensors_done: 0,
        tensors_total: specs.len(),
        bytes_done: 0,
        bytes_total,
    };
    let mut written = 0u64;
    for ((file, info), spec) in ck.tensors().zip(&specs) {
        state.tensor.clone_from(&info.name);
        let src_size = info.dtype.size().unwrap_or(1) as u64;
        let dst_size = spec.dtype.size().unwrap_or(1) as u64;
        // Streamed: one chunk of the source and its conversion at a time.
        file.for_each_chunk(&info.name, spec.dtype, |piece| {
            writer.write_chunk(&info.name, piece)?;
            let len = piece.len() as u64;
            written = written.saturating_add(len);
            // Source bytes behind this piece of output.
            state.bytes_done = state
                .bytes_done
                .saturating_add(len.saturating_mul(src_size) / dst_size.max(1));
            progress(&state);
            Ok(())
        })?;
        state.tensors_done += 1;
    }
    // Every read checked its file afterwards; check all of them (index
    // included) once more just before the output is committed.
    ck.check_unchanged()?;
    let path = writer.finish()?;
    Ok(ConvertSummary {
        path,
        tensors: specs.len(),
        bytes_written: written,
    })
}

/// What a tensor of dtype `from` (in the file `path`) becomes.
fn target(from: DType, options: &ConvertOptions, path: &Path, name: &str) -> Result<DType> {
    let Some(to) = options.dtype else {
        return Ok(from);
    };
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
    if floating && !options.keep_unsupported {
        return Err(Error::UnsupportedConversion {
            op: "convert",
            from,
            to,
            tensor: Some(TensorRef::new(path, name)),
        });
    }
    Ok(from)
}
