//! The guarded conv3d fallback's device side: the gate and the verdict.
//!
//! A guarded call (`conv3d_chain::Conv3dChain::guard_device`) checks an
//! output that another library computed (torch's conv3d), decides on the
//! device whether it is wrong ([`Conv3dOps::guard_decide`](crate::device::Conv3dOps::guard_decide)), and queues
//! the repair (the tiled kernel writing over that output) and the repair's
//! own checks behind a *gate*: one `u64` of device memory, the verdict's
//! second word. Each gated kernel reads the gate as it starts and returns at
//! once when it is zero. So nothing waits on the host: the verdict is copied
//! back later, when the caller asks.
//!
//! [`Conv3dOps::guard_check`](crate::device::Conv3dOps::guard_check) fuses a decision with what it reads: one
//! launch counts the output's NaN/Inf (and for a repair the operands'),
//! recomputes the sampled points and, in its last block to finish, writes
//! the verdict, where [`Stream::count_nonfinite_gated_into`],
//! [`Conv3dOps::check_gated`](crate::device::Conv3dOps::check_gated) and [`Conv3dOps::guard_decide`](crate::device::Conv3dOps::guard_decide) take
//! one launch each.

use super::check::{host_conv3d_check, Conv3dCheckLaunch, CHECK_WORDS};
use crate::device::info::DevicePtr;
#[cfg(doc)]
use crate::device::{raw::backend::KernelOp, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// `u64` words of a verdict ([`Conv3dGuardDecide::verdict`]):
/// `[bits, gate, index, value, reference, tolerance]`.
pub const VERDICT_WORDS: usize = 6;

/// Verdict bit: a NaN or infinity in the checked output (from finite
/// operands, where the operands' counts were given).
pub const VERDICT_NON_FINITE: u64 = 1;
/// Verdict bit: a sampled point off its f64 recomputation.
pub const VERDICT_MISMATCH: u64 = 2;

/// `u64` words of the record a fused check of the output writes
/// ([`GuardStage::Output`]): the output's NaN and Inf counts (2), its
/// verdict ([`VERDICT_WORDS`]), then the [`GUARD_REPAIR_WORDS`] words a
/// repair's check writes, zeroed.
pub const GUARD_RECORD_WORDS: usize = 2 + VERDICT_WORDS + GUARD_REPAIR_WORDS;

/// `u64` words of the record a fused check of a repair writes
/// ([`GuardStage::Repair`]): the operands' NaN and Inf counts (input,
/// weight, bias: 6), the repaired output's (2), its verdict
/// ([`VERDICT_WORDS`]).
pub const GUARD_REPAIR_WORDS: usize = 6 + 2 + VERDICT_WORDS;

/// `u64` words of a fused check's accumulators
/// ([`Conv3dOps::guard_check`](crate::device::Conv3dOps::guard_check)): a ticket and four pairs of counts.
pub const GUARD_ACC_WORDS: usize = 9;

/// Which verdict a fused guard check decides ([`Conv3dOps::guard_check`](crate::device::Conv3dOps::guard_check)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GuardStage {
    /// The checked output's (another library's): any NaN or infinity in
    /// it counts (the operands are not read); writes
    /// [`GUARD_RECORD_WORDS`] words.
    Output,
    /// A repair's: the operands are counted too, and a NaN or infinity
    /// counts only from finite operands; writes [`GUARD_REPAIR_WORDS`]
    /// words.
    Repair,
}

/// One launch of `conv3d_guard_check_{f32,bf16}`
/// ([`KernelOp::Conv3dGuardCheck`]): the NaN/Inf counts, the sampled points
/// and the verdict of one output in one launch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv3dGuardCheck {
    /// The points checked, as [`KernelOp::Conv3dCheck`] checks them (no
    /// located point; `samples` may be 0), and the gate
    /// (`check.conv.gate`): with one, nothing runs unless it is non-zero.
    pub check: Conv3dCheckLaunch,
    /// Relative tolerance against each point's `|bias| + sum |x * w|`.
    pub rel_tol: f64,
    /// Which verdict, and so which record.
    pub stage: GuardStage,
    /// [`GUARD_ACC_WORDS`] words, zero when the launch starts and again
    /// when it ends (a GPU's blocks add into them; the host backend never
    /// touches them).
    pub acc: DevicePtr,
    /// The record: [`GUARD_RECORD_WORDS`] or [`GUARD_REPAIR_WORDS`] words
    /// by `stage`, every one written (when it runs).
    pub record: DevicePtr,
}

/// One launch of `conv3d_guard_decide` ([`KernelOp::Conv3dGuardDecide`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conv3dGuardDecide {
    /// With a gate, the decision runs only when the gate is non-zero (a
    /// repair's verdict, decided only when the repair ran).
    pub gate: Option<DevicePtr>,
    /// The checked output's NaN and Inf counts (2 words).
    pub out_counts: DevicePtr,
    /// The operands' counts (input, weight, bias: 6 words), or `None`: any
    /// non-finite output counts.
    pub in_counts: Option<DevicePtr>,
    /// The sampled points as the device check wrote them ([`CHECK_WORDS`]
    /// each).
    pub results: DevicePtr,
    /// Points in `results` (0: the counts alone decide).
    pub samples: usize,
    /// Relative tolerance against each point's `|bias| + sum |x * w|`.
    pub rel_tol: f64,
    /// [`VERDICT_WORDS`] words, every one written (when it runs).
    pub verdict: DevicePtr,
}

/// A verdict read back ([`GuardVerdict::decode`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardVerdict {
    /// A NaN or infinity in the output.
    pub non_finite: bool,
    /// The first sampled point off (lowest sample number): `(index, value,
    /// reference, tolerance)`.
    pub off: Option<(usize, f64, f64, f64)>,
}

impl GuardVerdict {
    /// The verdict in `words` (at least [`VERDICT_WORDS`]; shorter reads as
    /// no failure).
    pub fn decode(words: &[u64]) -> GuardVerdict {
        let Some(w) = words.get(..VERDICT_WORDS) else {
            return GuardVerdict {
                non_finite: false,
                off: None,
            };
        };
        let off = (w[0] & VERDICT_MISMATCH != 0 && w[2] != u64::MAX).then(|| {
            (
                usize::try_from(w[2]).unwrap_or(usize::MAX),
                f64::from_bits(w[3]),
                f64::from_bits(w[4]),
                f64::from_bits(w[5]),
            )
        });
        GuardVerdict {
            non_finite: w[0] & VERDICT_NON_FINITE != 0,
            off,
        }
    }

    /// Whether the output was judged wrong.
    pub fn failed(&self) -> bool {
        self.non_finite || self.off.is_some()
    }
}

/// The verdict over host values: what `conv3d_guard_decide` computes (and
/// the host backend runs). `results` holds `samples` points.
pub(crate) fn guard_verdict(
    out_counts: [u64; 2],
    in_counts: Option<[u64; 6]>,
    results: &[u64],
    rel: f64,
) -> [u64; VERDICT_WORDS] {
    let mut bits = 0;
    let operands_finite = in_counts.is_none_or(|c| c.iter().all(|&n| n == 0));
    if (out_counts[0] | out_counts[1]) != 0 && operands_finite {
        bits |= VERDICT_NON_FINITE;
    }
    let mut v = [0, 0, u64::MAX, 0, 0, 0];
    for r in results.chunks_exact(CHECK_WORDS) {
        if r[0] == u64::MAX {
            continue;
        }
        let (value, reference, magnitude) = (
            f64::from_bits(r[1]),
            f64::from_bits(r[2]),
            f64::from_bits(r[3]),
        );
        // Non-finite values and references are the counts' to judge.
        if !value.is_finite() || !reference.is_finite() {
            continue;
        }
        let tol = rel * magnitude + f64::from(f32::MIN_POSITIVE);
        // `!(a <= b)`, as the kernel writes it: a NaN difference is off.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !((value - reference).abs() <= tol) {
            bits |= VERDICT_MISMATCH;
            v[2..].copy_from_slice(&[r[0], r[1], r[2], tol.to_bits()]);
            break;
        }
    }
    v[0] = bits;
    v[1] = u64::from(bits != 0);
    v
}

/// Whether a gate is given and closed (zero).
///
/// # Safety
/// A gate is one live, aligned `u64` of host memory (the host backend).
pub(crate) unsafe fn host_gate_closed(gate: Option<DevicePtr>) -> bool {
    match gate {
        None => false,
        // SAFETY: the caller's guarantee.
        Some(g) => unsafe { *(g.0 as usize as *const u64) == 0 },
    }
}

/// The host backend's `conv3d_guard_decide`.
///
/// # Safety
/// Every address of `a` is live, aligned host memory of its documented
/// length; `verdict` is not read elsewhere during the call.
pub(crate) unsafe fn host_guard_decide(a: &Conv3dGuardDecide) -> Result<()> {
    // SAFETY: the caller's guarantees, for each range below.
    unsafe {
        if host_gate_closed(a.gate) {
            return Ok(());
        }
        let read =
            |p: DevicePtr, n: usize| std::slice::from_raw_parts(p.0 as usize as *const u64, n);
        let out_counts = [read(a.out_counts, 2)[0], read(a.out_counts, 2)[1]];
        let in_counts = a.in_counts.map(|p| {
            let s = read(p, 6);
            [s[0], s[1], s[2], s[3], s[4], s[5]]
        });
        let results = read(a.results, CHECK_WORDS * a.samples);
        let v = guard_verdict(out_counts, in_counts, results, a.rel_tol);
        std::slice::from_raw_parts_mut(a.verdict.0 as usize as *mut u64, VERDICT_WORDS)
            .copy_from_slice(&v);
    }
    Ok(())
}

/// NaN and Inf among `n` elements of `dtype` (F32 or BF16) at `p`.
///
/// # Safety
/// `p` holds `n` readable elements of `dtype`.
unsafe fn host_count(p: DevicePtr, dtype: DType, n: usize) -> Result<[u64; 2]> {
    let mut c = [0u64; 2];
    let mut add = |nan: bool, inf: bool| {
        c[0] += u64::from(nan);
        c[1] += u64::from(inf);
    };
    if n == 0 {
        return Ok(c);
    }
    match dtype {
        DType::F32 => {
            // SAFETY: the caller's guarantee.
            let v = unsafe { std::slice::from_raw_parts(p.0 as usize as *const u32, n) };
            for &b in v {
                let x = f32::from_bits(b);
                add(x.is_nan(), x.is_infinite());
            }
        }
        DType::BF16 => {
            // SAFETY: the caller's guarantee.
            let v = unsafe { std::slice::from_raw_parts(p.0 as usize as *const u16, n) };
            for &b in v {
                let x = half::bf16::from_bits(b);
                add(x.is_nan(), x.is_infinite());
            }
        }
        other => {
            return Err(Error::Conv3dDType {
                tensor: "output",
                dtype: other,
                expected: DType::F32,
            })
        }
    }
    Ok(c)
}

/// The host backend's [`KernelOp::Conv3dGuardCheck`]: the check, the
/// counts and [`guard_verdict`], as the kernel computes them (`acc` is not
/// touched).
///
/// # Safety
/// As [`host_conv3d_check`] for `a.check`; `a.record` holds the stage's
/// record words, exclusive; a gate is one live u64.
pub(crate) unsafe fn host_guard_check(a: &Conv3dGuardCheck) -> Result<()> {
    let c = &a.check.conv;
    // SAFETY: the caller's guarantees, for every range below.
    unsafe {
        if host_gate_closed(c.gate) {
            return Ok(());
        }
        if a.check.samples > 0 {
            host_conv3d_check(&a.check)?;
        }
        let g = &c.geometry;
        let out = host_count(c.output, a.check.output_dtype, g.output_len())?;
        let results = std::slice::from_raw_parts(
            a.check.results.0 as usize as *const u64,
            a.check.samples * CHECK_WORDS,
        );
        let record = |n: usize| std::slice::from_raw_parts_mut(a.record.0 as usize as *mut u64, n);
        match a.stage {
            GuardStage::Output => {
                let v = guard_verdict(out, None, results, a.rel_tol);
                let r = record(GUARD_RECORD_WORDS);
                r.fill(0);
                r[..2].copy_from_slice(&out);
                r[2..2 + VERDICT_WORDS].copy_from_slice(&v);
            }
            GuardStage::Repair => {
                let x = host_count(c.input, c.dtype, g.input_shape().iter().product())?;
                let w = host_count(c.weight, c.dtype, g.weight_shape().iter().product())?;
                let b = match c.bias {
                    Some(b) => host_count(b, a.check.bias_dtype, g.out_channels)?,
                    None => [0; 2],
                };
                let ins = [x[0], x[1], w[0], w[1], b[0], b[1]];
                let v = guard_verdict(out, Some(ins), results, a.rel_tol);
                let r = record(GUARD_REPAIR_WORDS);
                r[..6].copy_from_slice(&ins);
                r[6..8].copy_from_slice(&out);
                r[8..].copy_from_slice(&v);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(index: u64, value: f64, reference: f64, magnitude: f64) -> [u64; 4] {
        [
            index,
            value.to_bits(),
            reference.to_bits(),
            magnitude.to_bits(),
        ]
    }

    #[test]
    fn the_verdict_judges_counts_and_points() {
        // Nothing wrong.
        let ok = point(3, 1.0, 1.0 + 1e-9, 1.0);
        let v = guard_verdict([0, 0], None, &ok, 1e-5);
        assert_eq!(v[..3], [0, 0, u64::MAX]);
        assert!(!GuardVerdict::decode(&v).failed());
        // A NaN output: from finite operands it fails, from a NaN input not.
        let v = guard_verdict([1, 0], Some([0; 6]), &[], 1e-5);
        assert_eq!(v[..2], [VERDICT_NON_FINITE, 1]);
        assert!(GuardVerdict::decode(&v).non_finite);
        let v = guard_verdict([0, 2], Some([1, 0, 0, 0, 0, 0]), &[], 1e-5);
        assert_eq!(v[..2], [0, 0]);
        // The first point off is reported, with its tolerance.
        let mut words = Vec::new();
        words.extend(point(u64::MAX, 0.0, 0.0, 0.0));
        words.extend(ok);
        words.extend(point(7, 2.0, 1.0, 10.0));
        words.extend(point(9, 5.0, 1.0, 10.0));
        let v = guard_verdict([0, 0], None, &words, 1e-3);
        let d = GuardVerdict::decode(&v);
        assert_eq!(v[1], 1);
        let (i, val, r, tol) = d.off.unwrap();
        assert_eq!((i, val, r), (7, 2.0, 1.0));
        assert!((tol - 1e-2).abs() < 1e-12);
        // A non-finite value at a sampled point is the counts' to judge.
        let nan = point(4, f64::NAN, 1.0, 1.0);
        assert_eq!(guard_verdict([0, 0], None, &nan, 1e-5)[0], 0);
        // A short read decodes as no failure.
        assert!(!GuardVerdict::decode(&[3]).failed());
    }
}
