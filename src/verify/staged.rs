//! The staged check: from a [`Policy`] and the device's self-test to the
//! device operations of one conversion (or device copy) and its output
//! check. Used by [`convert_verified`](super::convert_verified) and by the
//! loader's pieces (`transfer/checks.rs`), so both apply one rule.
//!
//! The rule (ARCHITECTURE.md, "Decisions"): a fingerprint computed by a
//! fingerprint kernel that failed its self-test proves nothing either way
//! (a match may be as wrong as a mismatch), so the fingerprint policies
//! become [`Policy::ReadBack`] on that device, decided before any work is
//! queued; a fused kernel that failed its self-test (or a pair without one)
//! leaves [`Policy::FusedFingerprint`] to the separate fingerprint pass.

use super::{Policy, SelfTestReport};
use crate::device::{ConvertOp, DeviceView, DeviceViewMut, Stream};
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

/// Queues the conversion `op` of `src` into `dst` (a device copy when `op`
/// is `None`) under the applied `policy`: with the fused kernel, which
/// adds the output's fingerprint sum to `acc`, where the policy is
/// [`Policy::FusedFingerprint`] and the pair has one. Returns whether it
/// did (then [`queue_output_check`] has nothing left to do).
pub(crate) fn queue_convert(
    s: &Stream,
    op: Option<ConvertOp>,
    policy: Policy,
    src: &DeviceView<'_, u8>,
    dst: &mut DeviceViewMut<'_, u8>,
    acc: &mut DeviceViewMut<'_, u64>,
) -> Result<bool> {
    match op {
        None => {
            dst.copy_dtod(s, src)?;
            Ok(false)
        }
        Some(op) if policy == Policy::FusedFingerprint && op.fused_symbol().is_some() => {
            s.convert_fingerprint_raw(src, op.from, dst, op.to, acc)?;
            Ok(true)
        }
        Some(op) => {
            s.convert_raw(src, op.from, dst, op.to)?;
            Ok(false)
        }
    }
}

/// Queues the separate fingerprint pass over the stored output `dst` into
/// `acc`, where the applied `policy` compares fingerprints and the
/// conversion was not `fused`. Returns whether it queued one.
pub(crate) fn queue_output_check(
    s: &Stream,
    policy: Policy,
    fused: bool,
    dst: &DeviceView<'_, u8>,
    acc: &mut DeviceViewMut<'_, u64>,
) -> Result<bool> {
    if !fingerprints(policy) || fused {
        return Ok(false);
    }
    s.fingerprint_sum_into(dst, acc)?;
    Ok(true)
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
