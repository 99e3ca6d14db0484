//! The guarded conv3d fallback's device side: the gate and the verdict.
//!
//! A guarded call (`conv3d_chain::Conv3dChain::guard_device`) checks an
//! output that another library computed (torch's conv3d), decides on the
//! device whether it is wrong ([`Stream::conv3d_guard_decide`]), and queues
//! the repair (the tiled kernel writing over that output) and the repair's
//! own checks behind a *gate*: one `u64` of device memory, the verdict's
//! second word. Each gated kernel reads the gate as it starts and returns at
//! once when it is zero. So nothing waits on the host: the verdict is copied
//! back later, when the caller asks.

use super::check::CHECK_WORDS;
use super::layout::check_len;
use crate::device::backend::KernelOp;
use crate::device::buffer::{DeviceView, DeviceViewMut};
use crate::device::info::DevicePtr;
use crate::device::stream::Stream;
use crate::error::{Error, Result};

/// `u64` words of a verdict ([`Conv3dGuardDecide::verdict`]):
/// `[bits, gate, index, value, reference, tolerance]`.
pub const VERDICT_WORDS: usize = 6;

/// Verdict bit: a NaN or infinity in the checked output (from finite
/// operands, where the operands' counts were given).
pub const VERDICT_NON_FINITE: u64 = 1;
/// Verdict bit: a sampled point off its f64 recomputation.
pub const VERDICT_MISMATCH: u64 = 2;

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

/// The counts, points and verdict of one decision.
pub type GuardWords<'r, 'v> = (
    &'r DeviceView<'v, u64>,
    Option<&'r DeviceView<'v, u64>>,
    &'r DeviceView<'v, u64>,
);

impl Stream {
    /// Queues the guarded fallback's verdict on this stream (one block; no
    /// synchronisation): over `out_counts` (2 words: the checked output's
    /// NaN and Inf counts), `in_counts` (6 words, the operands' counts, or
    /// `None`: any non-finite output counts) and `results` (the device
    /// check's sampled points, [`CHECK_WORDS`] words each; empty: the
    /// counts alone decide), into `verdict` ([`VERDICT_WORDS`] words; its
    /// second word is the gate of a repair: 1 when the output is wrong).
    /// With `gate`, the decision runs only when that gate is non-zero.
    /// Read back with [`GuardVerdict::decode`].
    ///
    /// Errors: [`Error::DeviceMismatch`]; [`Error::LengthMismatch`] for
    /// counts, a verdict or a gate of other lengths, or results that are
    /// not whole points; [`Error::Conv3dTier`] for more points than
    /// [`super::CHECK_MAX_SAMPLES`]; the backend's launch error.
    pub fn conv3d_guard_decide(
        &self,
        (out_counts, in_counts, results): GuardWords<'_, '_>,
        rel_tol: f64,
        verdict: &mut DeviceViewMut<'_, u64>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "conv3d_guard_decide";
        for d in [out_counts.device(), results.device(), verdict.device()] {
            self.check_device(OP, d)?;
        }
        check_len("guard out counts", 2, out_counts.len())?;
        check_len("guard verdict", VERDICT_WORDS, verdict.len())?;
        if let Some(c) = in_counts {
            self.check_device(OP, c.device())?;
            check_len("guard operand counts", 6, c.len())?;
        }
        let gate = self.gate_ptr((OP, "guard gate"), gate)?;
        check_len(
            "guard results",
            results.len() - results.len() % CHECK_WORDS,
            results.len(),
        )?;
        let samples = results.len() / CHECK_WORDS;
        if samples > super::CHECK_MAX_SAMPLES {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason: "the sampled points must number at most CHECK_MAX_SAMPLES",
            });
        }
        let args = Conv3dGuardDecide {
            gate,
            out_counts: out_counts.device_ptr(),
            in_counts: in_counts.map(|c| c.device_ptr()),
            results: results.device_ptr(),
            samples,
            rel_tol,
            verdict: verdict.device_ptr(),
        };
        // SAFETY: every range is a live view of this device with the length
        // checked above (views of u64 are aligned); only `verdict`, borrowed
        // mutably, is written.
        unsafe {
            self.backend()
                .run(&KernelOp::Conv3dGuardDecide { args: &args }, self.raw())
        }
    }
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
