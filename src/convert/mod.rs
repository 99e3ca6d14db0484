//! Exact, integer-only dtype conversions on the CPU, and the buffer
//! fingerprint used to verify GPU results (DESIGN.md contracts 1 and 2).
//!
//! Supported: sources F64, F32, F16, BF16; targets F32, F16, BF16. Every
//! function reads little-endian bytes at any alignment.

pub mod fingerprint;
pub mod scalar;

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

/// Whether `from -> to` is a conversion this module performs.
pub const fn supported(from: DType, to: DType) -> bool {
    from.is_convertible_float() && matches!(to, DType::F32 | DType::F16 | DType::BF16)
}

fn check(op: &'static str, from: DType, to: DType, src_len: usize, dst_len: usize) -> Result<()> {
    if !supported(from, to) {
        return Err(Error::UnsupportedConversion { op, from, to });
    }
    // Both sizes exist: convertible floats and targets are whole-byte types.
    let (ss, ds) = (from.size().unwrap_or(1), to.size().unwrap_or(1));
    if !src_len.is_multiple_of(ss) {
        return Err(Error::LengthMismatch {
            op,
            expected: src_len / ss * ss,
            actual: src_len,
        });
    }
    let n = src_len / ss;
    if dst_len != n * ds {
        return Err(Error::LengthMismatch {
            op,
            expected: n * ds,
            actual: dst_len,
        });
    }
    Ok(())
}

/// Reads one source element at element index `i` as its converted bit pattern.
#[inline(always)]
fn convert_one(from: DType, to: DType, src: &[u8], i: usize) -> u32 {
    use scalar::*;
    let ss = match from {
        DType::F64 => 8,
        DType::F32 => 4,
        _ => 2,
    };
    let b = &src[i * ss..i * ss + ss];
    match (from, to) {
        (DType::F64, DType::F32) => f64_to_f32(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ])),
        (DType::F64, DType::BF16) => f64_to_bf16(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ])) as u32,
        (DType::F64, _) => f64_to_f16(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ])) as u32,
        (DType::F32, DType::F32) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        (DType::F32, DType::BF16) => {
            f32_to_bf16(u32::from_le_bytes([b[0], b[1], b[2], b[3]])) as u32
        }
        (DType::F32, _) => f32_to_f16(u32::from_le_bytes([b[0], b[1], b[2], b[3]])) as u32,
        (DType::BF16, DType::F32) => bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        (DType::BF16, DType::BF16) => u16::from_le_bytes([b[0], b[1]]) as u32,
        (DType::BF16, _) => bf16_to_f16(u16::from_le_bytes([b[0], b[1]])) as u32,
        (DType::F16, DType::F32) => f16_to_f32(u16::from_le_bytes([b[0], b[1]])),
        (DType::F16, DType::BF16) => f16_to_bf16(u16::from_le_bytes([b[0], b[1]])) as u32,
        (_, _) => u16::from_le_bytes([b[0], b[1]]) as u32,
    }
}

/// Converts little-endian `src` bytes of dtype `from` into little-endian
/// `dst` bytes of dtype `to`. Neither buffer needs any alignment.
///
/// Errors: [`Error::UnsupportedConversion`] for a pair outside
/// [`supported`], [`Error::LengthMismatch`] when `src` is not a whole number
/// of elements or `dst` does not have room for exactly as many.
pub fn convert_bytes(from: DType, src: &[u8], to: DType, dst: &mut [u8]) -> Result<()> {
    check("convert_bytes", from, to, src.len(), dst.len())?;
    let ds = to.size().unwrap_or(1);
    for (i, out) in dst.chunks_exact_mut(ds).enumerate() {
        let v = convert_one(from, to, src, i);
        out.copy_from_slice(&v.to_le_bytes()[..ds]);
    }
    Ok(())
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
/// have, computed from the source without materialising the output.
pub fn expected_fingerprint(from: DType, src: &[u8], to: DType) -> Result<Fingerprint> {
    let ss = from.size().unwrap_or(1);
    let ds = to.size().unwrap_or(1);
    let n = src.len() / ss;
    check("expected_fingerprint", from, to, src.len(), n * ds)?;
    let mut out = vec![0u8; n * ds];
    convert_bytes(from, src, to, &mut out)?;
    Ok(fingerprint_bytes(&out))
}
