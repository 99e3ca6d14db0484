//! The staged check: from a [`Policy`] and the device's self-test to the
//! device operations of one conversion (or device copy) and its output
//! check. Used by [`convert_verified`](super::convert_verified) and by the
//! loader's pieces (`transfer/checks.rs`), so both apply one rule.
//!
//! The rule (docs/decisions.md): a fingerprint computed by a
//! fingerprint kernel that failed its self-test proves nothing either way
//! (a match may be as wrong as a mismatch), so the fingerprint policies
//! become [`Policy::ReadBack`] on that device, decided before any work is
//! queued; a fused kernel that failed its self-test (or a pair without one)
//! leaves [`Policy::FusedFingerprint`] to the separate fingerprint pass.

use super::{Policy, SelfTestReport};
use crate::device::{ConvertOp, DeviceView, DeviceViewMut, Event, Stream};
use crate::error::Result;

/// The policy a staged check applies: `asked`, under the rule above, for
/// conversion `op` (`None`: every conversion of a load, so a fused kernel
/// must be trusted for every pair that has one).
pub(crate) fn applied_policy(
    asked: Policy,
    st: Option<&SelfTestReport>,
    op: Option<ConvertOp>,
) -> Policy {
    let Some(st) = st else { return asked };
    let fingerprints = matches!(asked, Policy::Fingerprint | Policy::FusedFingerprint);
    if fingerprints && !st.fingerprint_trusted() {
        return Policy::ReadBack;
    }
    let fused_ok = match op {
        Some(op) => op.fused_symbol().is_none() || st.fused_trusted(op),
        None => ConvertOp::DEVICE
            .iter()
            .all(|&op| op.fused_symbol().is_none() || st.fused_trusted(op)),
    };
    if asked == Policy::FusedFingerprint && !fused_ok {
        return Policy::Fingerprint;
    }
    asked
}

/// Whether `policy` compares fingerprints (so every piece gets one).
pub(crate) fn fingerprints(policy: Policy) -> bool {
    matches!(policy, Policy::Fingerprint | Policy::FusedFingerprint)
}

/// The fingerprint accumulators of one staged conversion, and an event to
/// record between the conversion and the output check (for timing it).
pub(crate) struct Accumulators<'a, 'v> {
    /// Where the copy check's sum of the staged source goes; `None` where
    /// the source was not copied (a verified call on the caller's data).
    pub copy: Option<&'a mut DeviceViewMut<'v, u64>>,
    /// Where the output's fingerprint sum goes (fused or separate).
    pub out: &'a mut DeviceViewMut<'v, u64>,
    /// Recorded after the conversion, before the separate pass.
    pub between: Option<&'a Event>,
}

/// What [`queue`] queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Queued {
    /// The fused kernel converted and summed the output.
    pub fused: bool,
    /// A separate fingerprint pass summed the stored output.
    pub separate: bool,
}

/// Queues the device work of one staged conversion under the applied
/// `policy`: the copy check of `src` (where `acc.copy` is given and the
/// policy compares fingerprints); the conversion `op` into `dst` (a device
/// copy when `op` is `None`), with the fused kernel where the policy is
/// [`Policy::FusedFingerprint`] and the pair has one; then the separate
/// fingerprint pass over the stored output where the policy compares
/// fingerprints and the conversion was not fused.
pub(crate) fn queue(
    s: &Stream,
    op: Option<ConvertOp>,
    policy: Policy,
    src: &DeviceView<'_, u8>,
    dst: &mut DeviceViewMut<'_, u8>,
    acc: Accumulators<'_, '_>,
) -> Result<Queued> {
    let fp = fingerprints(policy);
    if let (true, Some(a)) = (fp, acc.copy) {
        s.fingerprint_sum_into(src, a)?;
    }
    let fused = match op {
        None => {
            dst.copy_dtod(s, src)?;
            false
        }
        Some(op) if policy == Policy::FusedFingerprint && op.fused_symbol().is_some() => {
            s.convert_fingerprint_raw(src, op.from, dst, op.to, acc.out)?;
            true
        }
        Some(op) => {
            s.convert_raw(src, op.from, dst, op.to)?;
            false
        }
    };
    if let Some(e) = acc.between {
        s.record(e)?;
    }
    let separate = fp && !fused;
    if separate {
        s.fingerprint_sum_into(&dst.as_view(), acc.out)?;
    }
    Ok(Queued { fused, separate })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::verify::KernelTest;

    fn report(failed: &[&str]) -> SelfTestReport {
        let kernels = ["convert bf16->f32", "fused bf16->f32", "fingerprint"]
            .iter()
            .map(|k| KernelTest {
                kernel: (*k).into(),
                tested: 1,
                mismatches: u64::from(failed.contains(k)),
                first_mismatch: None,
            })
            .collect();
        SelfTestReport {
            device: "test".into(),
            kernels,
            elapsed_ms: 0.0,
            reference_ms: 0.0,
            upload_ms: 0.0,
            device_ms: 0.0,
        }
    }

    #[test]
    fn the_rule() {
        let bf = Some(ConvertOp {
            from: DType::BF16,
            to: DType::F32,
        });
        let f32bf = Some(ConvertOp {
            from: DType::F32,
            to: DType::BF16,
        });
        let all = [
            Policy::Off,
            Policy::Fingerprint,
            Policy::FusedFingerprint,
            Policy::ReadBack,
        ];
        // No self-test, or everything trusted: as asked.
        for p in all {
            assert_eq!(applied_policy(p, None, bf), p);
        }
        // An untrusted fingerprint kernel: fingerprints become a read-back.
        let st = report(&["fingerprint"]);
        let want = [
            Policy::Off,
            Policy::ReadBack,
            Policy::ReadBack,
            Policy::ReadBack,
        ];
        for (p, w) in all.into_iter().zip(want) {
            assert_eq!(applied_policy(p, Some(&st), bf), w, "{p:?}");
            assert_eq!(applied_policy(p, Some(&st), None), w, "{p:?}");
        }
        // An untrusted fused kernel: the separate pass, for its pair and
        // for a whole load; a pair without a fused kernel is unaffected.
        let st = report(&["fused bf16->f32"]);
        let fused = Policy::FusedFingerprint;
        assert_eq!(applied_policy(fused, Some(&st), bf), Policy::Fingerprint);
        assert_eq!(applied_policy(fused, Some(&st), None), Policy::Fingerprint);
        assert_eq!(applied_policy(fused, Some(&st), f32bf), fused);
        assert!(fingerprints(fused) && !fingerprints(Policy::ReadBack));
    }
}
