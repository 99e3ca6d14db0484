//! Verified conversions on a device (crate [contract 2](crate#contracts)).
//!
//! A conversion on a [`Device`] takes a [`Policy`]:
//!
//! | policy | what is checked | cost |
//! | --- | --- | --- |
//! | [`Policy::Off`] | nothing per call | none |
//! | [`Policy::Fingerprint`] (default) | the fingerprint of the output *as stored*, computed on the device by a separate pass, against the one the host computes from the source | one extra read of the output on the device; the host pass runs while the device works |
//! | [`Policy::FusedFingerprint`] | the fingerprint of the values the conversion kernel wrote, summed inside the kernel (bf16/f16 -> f32; other ops use the separate pass) | arithmetic only |
//! | [`Policy::ReadBack`] | the whole output, copied back and compared byte for byte with the CPU's | a device-to-host copy |
//!
//! Independently of the policy, [`VerifyOptions::self_test`] runs the
//! exhaustive self-test ([`self_test`]) once per device: every row of the
//! conversion table ([`crate::convert::table`]) with a device kernel, over
//! the patterns of its source (all 65 536 bf16 and f16 codes, all 256 fp8
//! codes, every f32 upper half combined with rounding-critical lower
//! halves), through its plain and fused kernels, and the fingerprint kernel,
//! each compared bit for bit with the CPU. A kernel that fails is untrusted
//! on that device: its conversions run
//! on the CPU (and the report says so), or fail with
//! [`Error::KernelUntrusted`](crate::Error::KernelUntrusted) when [`VerifyOptions::allow_cpu_fallback`] is
//! off. A per-call mismatch is [`Error::VerificationFailed`](crate::Error::VerificationFailed) or, when
//! fallback is allowed, a recorded CPU fallback. Where the fingerprint
//! kernel itself failed the self-test, the fingerprint policies are applied
//! as [`Policy::ReadBack`] (the staged check's rule, shared with the
//! loader).

//!

mod convert;
mod selftest;
pub(crate) mod staged;

pub use convert::{convert_verified, upload_convert};
pub(crate) use selftest::self_test_cached;
pub use selftest::{self_test, KernelTest, SelfTestReport};
// The self-test without the device's slot: public for
// benches/gpu_convert.rs only (which times the test itself), not part of
// the API; `self_test` on a newly opened device runs it afresh.
#[doc(hidden)]
pub use selftest::self_test_uncached;

use crate::convert::fingerprint::Fingerprint;
use crate::device::{ConvertOp, Device};
use crate::fallback::{Failure, Outcome};

/// What is checked on each conversion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[non_exhaustive]
pub enum Policy {
    /// No per-call check (the self-test still runs if enabled).
    Off,
    /// Device fingerprint of the stored output vs the host's expectation.
    #[default]
    Fingerprint,
    /// Fingerprint summed inside the conversion kernel (widening ops).
    FusedFingerprint,
    /// Full read-back and byte comparison.
    ReadBack,
}

/// Options of a verified conversion: `VerifyOptions::default()` and the
/// `with_*` methods (non-exhaustive: fields may be added).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct VerifyOptions {
    /// The per-call check.
    pub policy: Policy,
    /// Run the exhaustive self-test on the device's first verified call.
    pub self_test: bool,
    /// On an untrusted kernel or a mismatch, convert on the CPU (recorded in
    /// the report) instead of returning an error.
    pub allow_cpu_fallback: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            policy: Policy::Fingerprint,
            self_test: true,
            allow_cpu_fallback: true,
        }
    }
}

impl VerifyOptions {
    /// The per-call check.
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Whether the device's first verified call runs the exhaustive
    /// self-test.
    pub fn with_self_test(mut self, on: bool) -> Self {
        self.self_test = on;
        self
    }

    /// Whether an untrusted kernel or a mismatch falls back to the CPU
    /// (`true`) or is an error.
    pub fn with_cpu_fallback(mut self, allow: bool) -> Self {
        self.allow_cpu_fallback = allow;
        self
    }
}

/// What a verified conversion did.
#[derive(Debug, serde::Serialize)]
#[non_exhaustive]
pub struct ConvertReport {
    /// The conversion.
    pub op: ConvertOp,
    /// Elements converted.
    pub elements: u64,
    /// The device (`"cuda:0 sm_90"`).
    pub device: String,
    /// The policy applied: the one asked for, or what the staged check's
    /// rule made of it on this device ([`Policy::ReadBack`] where the
    /// fingerprint kernel failed its self-test; [`Policy::Fingerprint`]
    /// where the fused kernel did).
    pub policy: Policy,
    /// What happened on the device: [`Outcome::Served`] (the device's
    /// output, checked as the policy says, is the result), or
    /// [`Outcome::Failed`] and the CPU served (with
    /// [`Failure::NoTrustedKernel`]: the kernel failed its self-test; with
    /// [`Failure::FingerprintMismatch`]: the output failed the per-call
    /// check). Serialised as its description.
    #[serde(serialize_with = "outcome_text")]
    pub outcome: Outcome,
    /// The fingerprint the host computed from the source (when checked).
    pub expected: Option<Fingerprint>,
    /// The device's fingerprint of its output (when checked).
    pub actual: Option<Fingerprint>,
    /// Device time of the conversion kernel (fused: conversion + fingerprint).
    pub kernel_ms: Option<f32>,
    /// Device time of the verification pass (separate fingerprint kernel).
    pub verify_ms: Option<f32>,
    /// Host time to compute the expected fingerprint / reference.
    pub host_expected_ms: f32,
    /// Wall time of the whole call.
    pub total_ms: f32,
}

impl std::fmt::Display for ConvertReport {
    /// `convert bf16->f32 of N elements on DEVICE (POLICY): SERVED, in X ms`,
    /// with the fingerprints when they were compared.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "convert {} of {} elements on {} ({:?}): ",
            self.op, self.elements, self.device, self.policy
        )?;
        f.write_str(&describe(&self.outcome))?;
        if let (Some(e), Some(a)) = (self.expected, self.actual) {
            write!(f, ", fingerprints {e} / {a}")?;
        }
        write!(f, ", in {:.3} ms", self.total_ms)
    }
}

/// What [`ConvertReport::outcome`] says, in words.
fn describe(o: &Outcome) -> String {
    match o {
        Outcome::Served => "served by the device".into(),
        Outcome::Failed(Failure::NoTrustedKernel { .. }) => {
            "served by the CPU (the device kernel failed its self-test)".into()
        }
        Outcome::Failed(Failure::FingerprintMismatch {
            expected, actual, ..
        }) => {
            format!(
                "served by the CPU after a mismatch (expected {expected}, device gave {actual})"
            )
        }
        Outcome::Failed(f) => format!("served by the CPU ({f})"),
        Outcome::Skipped(why) => format!("served by the CPU (device skipped: {why})"),
    }
}

fn outcome_text<S: serde::Serializer>(o: &Outcome, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&describe(o))
}

/// `"cuda:0 sm_90"`: the device in reports and errors.
pub(crate) fn device_label(d: &Device) -> String {
    let i = d.info();
    format!("{}:{} {}", i.kind, i.ordinal, i.arch)
}

/// The fingerprint that `crate::convert::convert_bytes(from, src, to, ..)`'s
/// output has, computed on the host without materialising the output: the
/// host half of every verification. This is
/// [`crate::convert::expected_fingerprint`], re-exported here because it is
/// what a verified call compares the device's fingerprint against.
pub use crate::convert::expected_fingerprint;
