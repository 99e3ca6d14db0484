//! Strict, lazy, memory-bounded safetensors reading and streaming writing.
//!
//! # Reading
//!
//! ```no_run
//! use rocm_safe::safetensors::Checkpoint;
//! # fn main() -> rocm_safe::Result<()> {
//! // A single file, or a sharded `model.safetensors.index.json`.
//! let ckpt = Checkpoint::open("model.safetensors.index.json")?;
//! for (shard, t) in ckpt.tensors() {
//!     if t.dtype.is_convertible_float() {
//!         let w: Vec<f32> = shard.read(&t.name)?; // bf16/f16/f64 -> f32, exact
//!     } else {
//!         let raw: Vec<u8> = shard.read_bytes(&t.name)?; // ints, bool, fp8
//!     }
//! }
//! // Tensor parallelism: rank 1 of 4 loads only its quarter of the rows.
//! let info = ckpt.info("lm_head.weight")?;
//! let rows = info.rows().unwrap_or(0);
//! let part: Vec<half::bf16> = ckpt.read_rows("lm_head.weight", rows / 4..rows / 2)?;
//! # Ok(()) }
//! ```
//!
//! * [`SafeTensors`] is one file, [`Checkpoint`] one file or every shard of
//!   a `*.safetensors.index.json`, with the same read methods by name.
//! * [`TensorInfo`] describes a tensor: name, [`DType`](crate::DType),
//!   shape, `data_offsets` within the data section.
//! * Reads: `read_bytes[_into]` (raw stored bytes, any dtype),
//!   `read[_into]::<T>` (typed, `T` = `f32`, `half::bf16`, `half::f16`,
//!   or `f64` for F64 tensors), `read_converted_bytes[_into]` (converted
//!   little-endian bytes of a chosen dtype), `read_rows*` (rows `a..b` of
//!   the first dimension only). The `_into` forms fill a caller's buffer.
//!
//! # What `open` checks, before any tensor data is read
//!
//! * file length >= 8; a Git LFS pointer file is recognised and named as
//!   such ([`Error::LfsPointer`](crate::Error::LfsPointer));
//! * header length <= 100 MB and `8 + N <=` file length (checked arithmetic);
//! * the header is UTF-8, starts with `{`, and is followed only by spaces;
//! * no duplicate key anywhere that matters: top level, `__metadata__`,
//!   inside each tensor entry; keys are compared after JSON unescaping, so
//!   `"a"` and `"\u0061"` collide (serde_json alone keeps the last one);
//! * `__metadata__` is a string-to-string map, never a tensor;
//! * each tensor entry has exactly `dtype`, `shape`, `data_offsets`
//!   (unknown fields are rejected); the dtype is one of the closed
//!   safetensors set; element count and byte size use checked
//!   multiplication; `data_offsets` has two entries, begin <= end, and
//!   the span equals the byte size;
//! * sorted by offset, the tensors tile the data section exactly: no hole,
//!   no overlap, no byte past the last tensor.
//!
//! Every failure is a typed [`Error`](crate::Error) naming the file (and
//! the tensor where there is one), never a panic.
//!
//! # Memory and I/O
//!
//! Tensor data is read with positioned reads (`pread`) from the file
//! descriptor, never through a memory map: nothing of the file stays
//! mapped in the process, so reading a checkpoint tensor by tensor needs
//! only the output buffers plus one staging chunk ([`CHUNK_BYTES`], per
//! thread, reused). Raw reads go straight into the output; converting
//! reads convert chunk by chunk. Offsets need no alignment. A file
//! truncated after `open` gives [`Error::FileShrunk`](crate::Error::FileShrunk)
//! (a short read), never `SIGBUS`. A file changed in place after `open`
//! (same size, other bytes; truncated and regrown) is detected after each
//! read by its identity, size and modification time (not by metadata:
//! a `chmod`, link, rename, `rm` or atomic replace of the path leaves the
//! open file readable):
//! [`Error::FileChanged`](crate::Error::FileChanged) naming the file and
//! tensor ([`SafeTensors::check_unchanged`] says what is and is not seen).
//! Whole-tensor reads (`read`, `read_rows`, `read_bytes`, ...) allocate
//! fallibly, after checking the size against the machine's memory:
//! [`Error::AllocationFailed`](crate::Error::AllocationFailed) instead of
//! an abort; [`SafeTensors::for_each_chunk`] streams a tensor of any size.
//!
//! # What is refused
//!
//! * An input that is not a regular file (FIFO, device, socket, folder),
//!   as a file, an index or a shard: opened non-blocking, refused at once
//!   ([`Error::NotRegularFile`](crate::Error::NotRegularFile)), never
//!   waited on.
//! * A shard that is not a plain entry of the index's folder: each shard is
//!   opened relative to the folder's descriptor and **what was opened** is
//!   checked (its device and inode must be those of a non-symlink entry of
//!   the folder), so a symlink swapped during the open cannot make a read
//!   escape the folder ([`Error::InvalidShardName`](crate::Error::InvalidShardName)).
//! * A writer output that is the same file (device, inode; through `..`,
//!   symlinks or hard links) as a file being read
//!   ([`Error::OutputIsInput`](crate::Error::OutputIsInput)), or that
//!   exists and is not a regular file
//!   ([`Error::OutputNotRegular`](crate::Error::OutputNotRegular)): before
//!   anything is written.
//!
//! # Writing
//!
//! [`SafeTensorsWriter`] streams a file tensor by tensor, in the declared
//! order, through a temporary file renamed into place by `finish` (through
//! a symlink to its target, keeping a replaced file's mode). It refuses an
//! output that is one of the call's own inputs ([`WriteOptions::inputs`])
//! or an existing non-regular file, and stops at once, removing its
//! temporary file, when [`WriteOptions::cancel`] is set (a signal handler
//! sets it: see the `convert` example).

mod checkpoint;
mod convert_file;
pub(crate) mod file;
pub(crate) mod handle;
mod header;
mod json;
mod open;
mod writer;

pub use checkpoint::Checkpoint;
pub use convert_file::{convert_file, ConvertOptions, ConvertProgress, ConvertSummary};
pub use file::{SafeTensors, CHUNK_BYTES};
#[doc(hidden)]
pub use header::parse_bytes;
pub use header::{header_len, parse_head, Header, TensorInfo, LFS_POINTER_PREFIX, MAX_HEADER_LEN};
pub use open::FileId;
pub use writer::{SafeTensorsWriter, TensorSpec, WriteOptions};
