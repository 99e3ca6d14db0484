//! The sampled-point check of a forward convolution on the device
//! ([`Conv3dCheckLaunch`], [`Conv3dOps::check`](crate::device::Conv3dOps::check))
//! and the word layout of its results ([`CHECK_WORDS`], [`CheckedPoint`]).
//!
//! The check recomputes sampled output points in f64 (every product of two
//! f32 or widened bf16 values is exact in f64) from the operands where they
//! are, and reads the tier's value at each point, so one small read-back
//! per check replaces host copies of the operands and one read per point.

use super::Conv3dLaunch;
#[cfg(doc)]
use crate::conv3d::sample_index;
use crate::device::info::DevicePtr;
use crate::dtype::DType;

/// `u64` words of [`Conv3dCheckLaunch::results`] per sampled point.
pub const CHECK_WORDS: usize = 4;

/// Most sampled points of one check launch (its grid's x dimension).
pub const CHECK_MAX_SAMPLES: usize = 1 << 16;

/// One launch of the device check ([`KernelOp::Conv3dCheck`](crate::device::raw::KernelOp::Conv3dCheck)).
///
/// Sample `j < samples` is the flat output index
/// [`sample_index`]`(output_len, seed, j)`; with `locate`, the single
/// sample is the first output point holding a NaN or an infinity, found on
/// the device. For each, `results[4j..4j + 4]` receives `(index, value,
/// reference, magnitude)`: the index as a `u64` (`u64::MAX` when there is
/// no such point), the other three as the bits of `f64`s (the tier's f32
/// value widened, the f64 recomputation, and `|bias| + sum |x * w|`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv3dCheckLaunch {
    /// The convolution checked: input, weight in the standard layout,
    /// output (of `output_dtype`); `conv.bias` is the bias as the caller
    /// gave it, of `bias_dtype`.
    pub conv: Conv3dLaunch,
    /// The bias's dtype (F32 or BF16; ignored without a bias).
    pub bias_dtype: DType,
    /// The output's dtype: F32 (every tier's), or BF16 (another library's
    /// bf16 result; not with `locate`).
    pub output_dtype: DType,
    /// Sampled points (`1` with `locate`), at most [`CHECK_MAX_SAMPLES`].
    pub samples: usize,
    /// The seed of the sampled points.
    pub seed: u64,
    /// `Some(slot)`: one `u64` the caller zeroed, where the device first
    /// stores `output_len - i` for the first non-finite output point `i`
    /// (0 when none); the check then recomputes that point.
    pub locate: Option<DevicePtr>,
    /// `CHECK_WORDS * samples` `u64`s, written.
    pub results: DevicePtr,
}

/// One sampled point as the device check read it back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CheckedPoint {
    /// The flat output index; `None` when there was no such point (nothing
    /// located).
    pub index: Option<usize>,
    /// The tier's value there.
    pub value: f32,
    /// The f64 recomputation.
    pub reference: f64,
    /// `|bias| + sum |x * w|` of the point.
    pub magnitude: f64,
}

impl CheckedPoint {
    /// The points of a read-back results buffer ([`CHECK_WORDS`] words
    /// each; a trailing partial point is ignored).
    pub fn decode(words: &[u64]) -> Vec<CheckedPoint> {
        words
            .chunks_exact(CHECK_WORDS)
            .map(|w| CheckedPoint {
                index: usize::try_from(w[0]).ok().filter(|_| w[0] != u64::MAX),
                value: f64::from_bits(w[1]) as f32,
                reference: f64::from_bits(w[2]),
                magnitude: f64::from_bits(w[3]),
            })
            .collect()
    }
}
