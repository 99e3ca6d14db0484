//! Exact, integer-only dtype conversions on the CPU, and the buffer
//! fingerprint used to verify GPU results (crate [contracts](crate#contracts) 1 and 2).
//!
//! Supported: the pairs of the conversion [`table`] (sources F64, F32, F16,
//! BF16, F8_E4M3, F8_E5M2; targets F32, F16, BF16). Every function reads
//! little-endian bytes at any alignment.
//!
//! # The pieces
//!
//! - [`table`]: one row per pair (sizes, scalar reference, CPU loop, device
//!   kernel symbols); everything below dispatches through it.
//! - [`scalar`]: the integer-only reference for one value, and
//!   [`scalar::convert_bytes_reference`], the element-by-element reference
//!   for a buffer. Everything else is tested against it.
//! - [`convert_bytes`] / [`convert_bytes_into`] / [`convert_slice`]: the bulk
//!   conversions, with the same results as the reference. Each pair has its
//!   own loop, written so that it compiles to SIMD code, built for the
//!   baseline target and, on x86-64, for AVX2 (chosen at run time). Inputs of
//!   128 Ki elements and more are split on element boundaries over the rayon
//!   pool (in 64 Ki-element pieces); outputs of 8 MiB and more are written
//!   with streaming stores, so they do not pass through (or evict) the
//!   caches.
//! - [`expected_fingerprint`]: the [`fingerprint`] of a conversion's output,
//!   from the source, without writing the output anywhere.

pub mod fingerprint;
mod kernels;
pub mod scalar;
pub mod table;

pub use fingerprint::{fingerprint_bytes, fingerprint_words, Fingerprint};

use crate::dtype::DType;
use crate::error::{Error, Result};

/// A value type the typed conversion functions read and write.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for f64 {
    const DTYPE: DType = DType::F64;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
/// Integer element types, for typed access to loaded tensors
/// ([`crate::transfer::LoadedTensor::to_vec`]); conversions refuse them
/// ([`crate::Error::UnsupportedConversion`]).
macro_rules! int_elements {
    ($($t:ty => $d:ident),* $(,)?) => {
        $(impl Element for $t {
            const DTYPE: DType = DType::$d;
        })*
    };
}
int_elements!(u8 => U8, i8 => I8, i16 => I16, u16 => U16, i32 => I32, u32 => U32, i64 => I64, u64 => U64);

/// Whether `from -> to` is a conversion this module performs
/// (a row of the conversion [`table`]).
pub const fn supported(from: DType, to: DType) -> bool {
    table::find(from, to).is_some()
}

fn check(op: &'static str, from: DType, to: DType, src_len: usize, dst_len: usize) -> Result<()> {
    if !supported(from, to) {
        return Err(Error::UnsupportedConversion {
            op,
            from,
            to,
            tensor: None,
        });
    }
    // Both sizes exist: convertible floats and targets are whole-byte types.
    let (ss, ds) = (from.size().unwrap_or(1), to.size().unwrap_or(1));
    if !src_len.is_multiple_of(ss) {
        return Err(Error::LengthMismatch {
            op,
            expected: src_len / ss * ss,
            actual: src_len,
            tensor: None,
        });
    }
    let n = src_len / ss;
    if dst_len != n * ds {
        return Err(Error::LengthMismatch {
            op,
            expected: n * ds,
            actual: dst_len,
            tensor: None,
        });
    }
    Ok(())
}

/// Converts little-endian `src` bytes of dtype `from` into little-endian
/// `dst` bytes of dtype `to`. Neither buffer needs any alignment.
///
/// Errors: [`Error::UnsupportedConversion`] for a pair outside
/// [`supported`], [`Error::LengthMismatch`] when `src` is not a whole number
/// of elements or `dst` does not have room for exactly as many. On an error
/// `dst` is left untouched.
pub fn convert_bytes(from: DType, src: &[u8], to: DType, dst: &mut [u8]) -> Result<()> {
    check("convert_bytes", from, to, src.len(), dst.len())?;
    let Some(k) = kernels::kernel(from, to) else {
        // `check` accepted the pair, and every supported pair has a kernel.
        return Err(Error::UnsupportedConversion {
            op: "convert_bytes",
            from,
            to,
            tensor: None,
        });
    };
    run_kernel(k, src, dst);
    Ok(())
}

/// Elements per parallel task.
const PAR_CHUNK_ELEMS: usize = 64 * 1024;
/// Below this many elements a conversion runs on the calling thread.
const PAR_MIN_ELEMS: usize = 128 * 1024;

/// Outputs at least this large are written with streaming (non-temporal)
/// stores where the CPU has them: they are larger than the caches, so the
/// usual read-for-ownership of every destination line would only add
/// memory traffic.
const STREAM_MIN_BYTES: usize = 8 << 20;

/// Runs `k` over matching `src`/`dst`, split on element boundaries over the
/// rayon pool when large enough.
fn run_kernel(k: kernels::Kernel, src: &[u8], dst: &mut [u8]) {
    use rayon::prelude::*;
    let run = if dst.len() >= STREAM_MIN_BYTES {
        k.stream
    } else {
        k.run
    };
    let n = src.len() / k.src_size;
    if n < PAR_MIN_ELEMS || crate::par::threads() < 2 {
        run(src, dst);
        return;
    }
    crate::par::install(|| {
        src.par_chunks(k.src_size * PAR_CHUNK_ELEMS)
            .zip(dst.par_chunks_mut(k.dst_size * PAR_CHUNK_ELEMS))
            .for_each(|(s, d)| run(s, d))
    });
}

/// Converts little-endian `src` bytes of dtype `from` into a typed slice.
pub fn convert_bytes_into<T: Element>(from: DType, src: &[u8], dst: &mut [T]) -> Result<()> {
    convert_bytes(from, src, T::DTYPE, bytemuck::cast_slice_mut(dst))
}

/// Converts a typed slice into another typed slice of the same length.
pub fn convert_slice<S: Element, D: Element>(src: &[S], dst: &mut [D]) -> Result<()> {
    if src.len() != dst.len() {
        return Err(Error::LengthMismatch {
            op: "convert_slice",
            expected: src.len(),
            actual: dst.len(),
            tensor: None,
        });
    }
    convert_bytes(
        S::DTYPE,
        bytemuck::cast_slice(src),
        D::DTYPE,
        bytemuck::cast_slice_mut(dst),
    )
}

/// The fingerprint the output of `convert_bytes(from, src, to, ..)` must
/// have, computed from the source without materialising the output: the
/// source is converted in small pieces into a buffer on the stack and
/// summed piece by piece (in parallel for large inputs).
///
/// Errors as [`convert_bytes`] (without the destination length).
pub fn expected_fingerprint(from: DType, src: &[u8], to: DType) -> Result<Fingerprint> {
    let ss = from.size().unwrap_or(1);
    let ds = to.size().unwrap_or(1);
    let n = src.len() / ss;
    check("expected_fingerprint", from, to, src.len(), n * ds)?;
    let Some(k) = kernels::kernel(from, to) else {
        return Err(Error::UnsupportedConversion {
            op: "expected_fingerprint",
            from,
            to,
            tensor: None,
        });
    };
    let sum = if n < PAR_MIN_ELEMS || crate::par::threads() < 2 {
        converted_sum(from, to, k, 0, src)
    } else {
        use rayon::prelude::*;
        crate::par::install(|| {
            src.par_chunks(ss * PAR_CHUNK_ELEMS)
                .enumerate()
                .map(|(c, s)| converted_sum(from, to, k, c * PAR_CHUNK_ELEMS, s))
                .reduce(|| 0, u64::wrapping_add)
        })
    };
    Ok(fingerprint::finish(sum, (n * ds) as u64))
}

/// Elements converted at a time by [`expected_fingerprint`] (a multiple of
/// 512, so every piece's output starts on a 1 KiB fingerprint block; a
/// divisor of [`PAR_CHUNK_ELEMS`]).
const FP_PIECE_ELEMS: usize = 4096;

/// The fingerprint partial sum of the converted output of `src`, whose
/// first element is element `first` of the whole source (a multiple of
/// [`FP_PIECE_ELEMS`]).
fn converted_sum(from: DType, to: DType, k: kernels::Kernel, first: usize, src: &[u8]) -> u64 {
    if (from, to) == (DType::BF16, DType::F32) {
        // The most common pair has a fused loop for whole 256-element
        // blocks (`first` is a multiple of 256, so they start on output
        // blocks); the rest goes the general way.
        let (blocks, rest) = src.as_chunks::<512>();
        let sum = fingerprint::sum_bf16_as_f32_blocks((first / 256) as u64, blocks);
        let done = 256 * blocks.len();
        return sum.wrapping_add(converted_sum_buffered(k, first + done, rest));
    }
    converted_sum_buffered(k, first, src)
}

/// [`converted_sum`] by converting pieces into a buffer on the stack and
/// summing them (`first` is a multiple of 256).
fn converted_sum_buffered(k: kernels::Kernel, first: usize, src: &[u8]) -> u64 {
    let mut buf = [0u8; FP_PIECE_ELEMS * 4];
    let mut sum = 0u64;
    let mut word = (first * k.dst_size / 4) as u64;
    let mut pieces = src.chunks(FP_PIECE_ELEMS * k.src_size).peekable();
    while let Some(piece) = pieces.next() {
        // Start loading the next piece while this one is converted and
        // summed.
        if let Some(next) = pieces.peek() {
            kernels::prefetch(next);
        }
        let len = piece.len() / k.src_size * k.dst_size;
        // `len <= FP_PIECE_ELEMS * dst_size <= buf.len()`: the `min` only
        // spells out that the split cannot panic.
        let (out, _) = buf.split_at_mut(len.min(FP_PIECE_ELEMS * 4));
        (k.run)(piece, out);
        sum = sum.wrapping_add(fingerprint::sum_bytes(word, out));
        word += (len / 4) as u64;
    }
    sum
}
