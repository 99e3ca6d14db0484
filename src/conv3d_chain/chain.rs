//! The chain: tiers tried in order, output checks, statistics.
//!
//! [`Conv3dOptions`], [`Conv3dChain`] and the choice of the sampled points.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::device_run::DeviceScratch;
use super::{Conv3dReport, Conv3dTier, Support, TierAttempt, TierKind, TierStats};
use crate::conv3d::{reference_point, sample_index, Conv3dProblem};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::fallback::{Failure, Outcome};

/// How results are checked and which tiers may run: `Conv3dOptions::default()`
/// and the `with_*` methods (non-exhaustive: fields may be added).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Conv3dOptions {
    /// Run only this kind of tier (no fallback): fail fast, or test one tier.
    pub force: Option<TierKind>,
    /// Never run these kinds.
    pub forbid: Vec<TierKind>,
    /// Output points recomputed on the CPU in f64 per result (0: none).
    /// The first and last points are always among them.
    pub verify_samples: usize,
    /// Reject a result holding NaN or infinity when input, weight and bias
    /// are all finite.
    pub scan_non_finite: bool,
    /// Seed choosing the sampled points.
    pub seed: u64,
    /// Tolerance for f32 inputs, relative to `|bias| + sum |x * w|` of the
    /// point.
    pub rel_tol_f32: f64,
    /// Tolerance for bf16 inputs, relative likewise (larger: a vendor
    /// library may round its bf16 output).
    pub rel_tol_bf16: f64,
}

impl Default for Conv3dOptions {
    /// Every tier, 16 sampled points, the non-finite scan on, tolerances
    /// 1e-4 (f32) and 1e-2 (bf16).
    fn default() -> Self {
        Conv3dOptions {
            force: None,
            forbid: Vec::new(),
            verify_samples: 16,
            scan_non_finite: true,
            seed: 0x00c0_ffee,
            rel_tol_f32: 1e-4,
            rel_tol_bf16: 1e-2,
        }
    }
}

impl Conv3dOptions {
    /// Runs only tiers of `kind` (no fallback).
    pub fn with_force(mut self, kind: TierKind) -> Self {
        self.force = Some(kind);
        self
    }

    /// Never runs tiers of `kind` (added to [`Conv3dOptions::forbid`]).
    pub fn with_forbid(mut self, kind: TierKind) -> Self {
        self.forbid.push(kind);
        self
    }

    /// Recomputes `n` output points per result on the CPU (0: none).
    pub fn with_verify_samples(mut self, n: usize) -> Self {
        self.verify_samples = n;
        self
    }

    /// Turns the NaN/infinity scan of results on or off.
    pub fn with_scan_non_finite(mut self, on: bool) -> Self {
        self.scan_non_finite = on;
        self
    }

    /// The seed choosing the sampled points.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The relative tolerances of the sampled points: f32 inputs, bf16
    /// inputs.
    pub fn with_tolerances(mut self, rel_tol_f32: f64, rel_tol_bf16: f64) -> Self {
        self.rel_tol_f32 = rel_tol_f32;
        self.rel_tol_bf16 = rel_tol_bf16;
        self
    }
}

/// Conv3d with an explicit fallback chain (crate [contract 3](crate#contracts):
/// vendor -> tiled -> naive -> CPU), output checks, per-tier statistics and a report per call.
///
/// ```
/// use rocm_safe::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
/// use rocm_safe::conv3d_chain::{Conv3dChain, TierKind};
/// let x = vec![1.0f32; 2 * 3 * 3 * 3];
/// let w = vec![0.5f32; 2 * 3 * 3 * 3];
/// let p = Conv3dProblem::new(
///     Conv3dParams::default().with_padding([1, 1, 1]),
///     Conv3dData::F32(&x), &[1, 2, 3, 3, 3],
///     Conv3dData::F32(&w), &[1, 2, 3, 3, 3],
///     None,
/// )?;
/// let chain = Conv3dChain::first_gpu();
/// let (out, report) = chain.run(&p)?;
/// assert_eq!(out.len(), 27);
/// assert_eq!(out[13], 27.0); // centre: 2 channels x 27 taps x 0.5
/// assert_eq!(report.served_by(), Some(TierKind::Cpu));
/// # Ok::<(), rocm_safe::Error>(())
/// ```
pub struct Conv3dChain {
    tiers: Vec<Box<dyn Conv3dTier>>,
    options: Conv3dOptions,
    stats: Mutex<Vec<TierStats>>,
    /// The device buffers [`Conv3dChain::run_device`] reuses across calls
    /// (widened bias, check results), for the last device it ran on.
    pub(super) scratch: Mutex<Option<DeviceScratch>>,
}

/// Why one tier's attempt did not serve: a failure (the next tier runs), or
/// the overflow rule of [`Conv3dChain::run_into`] (the call ends).
#[derive(Debug)]
pub(super) enum TierFail {
    /// The tier failed.
    Failed(Failure),
    /// A non-finite output from finite inputs whose exact value is beyond
    /// the f32 range.
    Overflow {
        /// The flat output index.
        index: usize,
        /// The f64 reference there.
        reference: f64,
        /// The tier's value there.
        value: f32,
    },
}

impl From<Failure> for TierFail {
    fn from(f: Failure) -> Self {
        TierFail::Failed(f)
    }
}

impl fmt::Debug for Conv3dChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.tiers.iter().map(|t| t.name()).collect();
        f.debug_struct("Conv3dChain")
            .field("tiers", &names)
            .field("options", &self.options)
            .finish()
    }
}

impl Default for Conv3dChain {
    /// [`Conv3dChain::first_gpu`].
    fn default() -> Self {
        Self::first_gpu()
    }
}

impl Conv3dChain {
    /// The chain of the first GPU this build and machine have (HIP, then
    /// CUDA; see [`Conv3dChain::for_device`]), then the CPU tier, with
    /// default options. Without a GPU the GPU tiers are
    /// [`UnavailableTier`](super::UnavailableTier)s, so the report says why
    /// they were skipped and the CPU tier serves. The GPU is opened once per
    /// process and shared by these chains.
    pub fn first_gpu() -> Self {
        Self::with_tiers(super::default_tiers(), Conv3dOptions::default())
    }

    /// The CPU tier alone (rayon over host memory), with default options:
    /// the chain for a machine, or a caller, that wants no GPU.
    pub fn cpu() -> Self {
        Self::with_tiers(vec![Box::new(super::CpuTier)], Conv3dOptions::default())
    }

    /// The chain of `device` with default options: its vendor library,
    /// tiled and naive kernels ([`device_tiers`](super::device_tiers)), then the CPU.
    /// On the host backend (a test and CI device) the "tiled" and "naive"
    /// tiers run the GPU kernels' code on the CPU over host memory, and the
    /// vendor tier is skipped as unavailable: for CPU work use
    /// [`Conv3dChain::cpu`].
    pub fn for_device(device: &Device) -> Self {
        Self::with_tiers(super::device_tiers(device), Conv3dOptions::default())
    }

    /// A chain of the given tiers, tried in the given order.
    pub fn with_tiers(tiers: Vec<Box<dyn Conv3dTier>>, options: Conv3dOptions) -> Self {
        let stats = tiers
            .iter()
            .map(|t| TierStats {
                name: t.name().to_owned(),
                ..TierStats::default()
            })
            .collect();
        Conv3dChain {
            tiers,
            options,
            stats: Mutex::new(stats),
            scratch: Mutex::new(None),
        }
    }

    /// The options.
    pub fn options(&self) -> &Conv3dOptions {
        &self.options
    }

    /// The options, to change.
    pub fn options_mut(&mut self) -> &mut Conv3dOptions {
        &mut self.options
    }

    /// The tiers' names and kinds, in order.
    pub fn tiers(&self) -> Vec<(TierKind, String)> {
        self.tiers
            .iter()
            .map(|t| (t.kind(), t.name().to_owned()))
            .collect()
    }

    /// A snapshot of the per-tier statistics, in tier order.
    pub fn stats(&self) -> Vec<TierStats> {
        self.stats
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Computes `problem`, returning the output (`[N, K, OD, OH, OW]`, f32)
    /// and the report.
    ///
    /// Errors: [`Error::Conv3dNoTier`] (carrying the report) when no tier
    /// served.
    pub fn run(&self, problem: &Conv3dProblem<'_>) -> Result<(Vec<f32>, Conv3dReport)> {
        let mut out = vec![0f32; problem.geometry.output_len()];
        let report = self.run_into(problem, &mut out)?;
        Ok((out, report))
    }

    /// Computes `problem` into `out`, which must have the output's length.
    /// On error `out` holds whatever the last tier left there.
    ///
    /// Errors: [`Error::LengthMismatch`] for a wrong `out` length;
    /// [`Error::Conv3dNoTier`] (carrying the report) when no tier served;
    /// [`Error::Conv3dOverflow`] when the exact result overflows f32.
    ///
    /// # Non-finite output from finite inputs
    ///
    /// With [`Conv3dOptions::scan_non_finite`] on, a NaN or infinity in a
    /// tier's output while every input is finite is told apart by the f64
    /// reference at that point: when the exact value is beyond the f32
    /// range, the infinity is the correctly rounded result, a fact about
    /// the inputs: the call returns [`Error::Conv3dOverflow`] at once (no
    /// other tier would do better; the tier is counted as a success and
    /// `out` holds its result, the infinities included). Otherwise the
    /// output is corrupt: the tier failed ([`Failure::NonFinite`]) and the
    /// next tier runs.
    pub fn run_into(&self, problem: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<Conv3dReport> {
        let expected = problem.geometry.output_len();
        if out.len() != expected {
            return Err(Error::LengthMismatch {
                op: "conv3d output",
                expected,
                actual: out.len(),
                tensor: None,
            });
        }
        let samples = sample_points(expected, self.options.verify_samples, self.options.seed);
        self.run_tiers(
            |tier| tier.support(problem),
            |tier| match tier.run(problem, out) {
                Err(e) => Err(TierFail::Failed(Failure::Error(e))),
                Ok(()) => match self.check(problem, &samples, out) {
                    Err(Failure::NonFinite { index, value }) => {
                        Err(match overflow_at(problem, index) {
                            Some(reference) => TierFail::Overflow {
                                index,
                                reference,
                                value,
                            },
                            None => TierFail::Failed(Failure::NonFinite { index, value }),
                        })
                    }
                    other => other.map_err(TierFail::Failed),
                },
            },
        )
    }

    /// The tiers in order: skips (forced, forbidden, `support` says
    /// unsupported or unavailable), then `attempt` (run and check) on each
    /// tier that may run, until one serves; counts, the report and the
    /// overflow rule of [`Conv3dChain::run_into`] (`attempt` decides when
    /// it applies).
    pub(super) fn run_tiers(
        &self,
        support: impl Fn(&dyn Conv3dTier) -> Support,
        mut attempt: impl FnMut(&dyn Conv3dTier) -> std::result::Result<(), TierFail>,
    ) -> Result<Conv3dReport> {
        let mut report = Conv3dReport::default();
        for (i, tier) in self.tiers.iter().enumerate() {
            let kind = tier.kind();
            let skip = if self.options.force.is_some_and(|f| f != kind) {
                Some("not the forced tier".to_owned())
            } else if self.options.forbid.contains(&kind) {
                Some("forbidden by the options".to_owned())
            } else {
                match support(tier.as_ref()) {
                    Support::Yes => None,
                    Support::Unsupported(why) => Some(format!("unsupported: {why}")),
                    Support::Unavailable(why) => Some(format!("unavailable: {why}")),
                }
            };
            if let Some(why) = skip {
                self.count(i, |s| s.skips += 1);
                report.attempts.push(TierAttempt {
                    kind,
                    name: tier.name().to_owned(),
                    outcome: Outcome::Skipped(why),
                    time: Duration::ZERO,
                });
                continue;
            }
            let start = Instant::now();
            let result = attempt(tier.as_ref());
            let time = start.elapsed();
            let result = match result {
                Ok(()) => Ok(()),
                Err(TierFail::Failed(f)) => Err(f),
                Err(TierFail::Overflow {
                    index,
                    reference,
                    value,
                }) => {
                    self.count(i, |s| {
                        s.attempts += 1;
                        s.time += time;
                        s.successes += 1;
                    });
                    return Err(Error::Conv3dOverflow {
                        index,
                        reference,
                        value,
                        tier: tier.name().to_owned(),
                    });
                }
            };
            let served = result.is_ok();
            self.count(i, |s| {
                s.attempts += 1;
                s.time += time;
                match &result {
                    Ok(()) => s.successes += 1,
                    Err(Failure::Error(_)) => s.errors += 1,
                    Err(Failure::NonFinite { .. }) => s.non_finite += 1,
                    Err(Failure::ValueMismatch { .. }) => s.mismatches += 1,
                    Err(_) => s.errors += 1,
                }
            });
            report.attempts.push(TierAttempt {
                kind,
                name: tier.name().to_owned(),
                outcome: match result {
                    Ok(()) => Outcome::Served,
                    Err(f) => Outcome::Failed(f),
                },
                time,
            });
            if served {
                return Ok(report);
            }
        }
        Err(Error::Conv3dNoTier {
            report: Box::new(report),
        })
    }

    fn count(&self, i: usize, f: impl FnOnce(&mut TierStats)) {
        let mut stats = self
            .stats
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(s) = stats.get_mut(i) {
            f(s);
        }
    }

    /// The checks of one tier's host output: the non-finite scan (the
    /// first NaN or infinity, when the scan is on) and the sampled f64
    /// points.
    fn check(
        &self,
        p: &Conv3dProblem<'_>,
        samples: &[usize],
        out: &[f32],
    ) -> std::result::Result<(), Failure> {
        if self.options.scan_non_finite {
            if let Some((index, &value)) = out.iter().enumerate().find(|(_, v)| !v.is_finite()) {
                let inputs_finite = p.input.all_finite()
                    && p.weight.all_finite()
                    && p.bias.is_none_or(|b| b.all_finite());
                if inputs_finite {
                    return Err(Failure::NonFinite { index, value });
                }
            }
        }
        let rel = self.rel_tol(p.dtype());
        for &index in samples {
            let Some(r) = reference_point(p, index) else {
                continue;
            };
            let Some(&got) = out.get(index) else {
                continue;
            };
            compare(index, got, r.value, r.magnitude, rel)?;
        }
        Ok(())
    }

    /// The relative tolerance of inputs of `dtype`.
    pub(super) fn rel_tol(&self, dtype: DType) -> f64 {
        match dtype {
            DType::BF16 => self.options.rel_tol_bf16,
            _ => self.options.rel_tol_f32,
        }
    }
}

/// One sampled point's comparison: `got` (the tier's value at `index`)
/// against the f64 `reference` within `rel * magnitude` (plus the smallest
/// normal f32). A non-finite reference (non-finite inputs) has nothing to
/// compare against and passes; a NaN `got` against a finite reference
/// fails.
pub(super) fn compare(
    index: usize,
    got: f32,
    reference: f64,
    magnitude: f64,
    rel: f64,
) -> std::result::Result<(), Failure> {
    if !reference.is_finite() {
        return Ok(());
    }
    let tolerance = rel * magnitude + f64::from(f32::MIN_POSITIVE);
    let ok = (f64::from(got) - reference).abs() <= tolerance;
    if ok {
        Ok(())
    } else {
        Err(Failure::ValueMismatch {
            index,
            got,
            expected: reference,
            tolerance,
        })
    }
}

/// Whether a non-finite output over an exact `reference` is the correctly
/// rounded result (the reference is finite in f64 but beyond the f32
/// range): the overflow rule of [`Conv3dChain::run_into`].
pub(super) fn overflows_f32(reference: f64) -> bool {
    reference.is_finite() && (reference as f32).is_infinite()
}

/// The f64 reference at output `index` when it is beyond the f32 range
/// (rounds to an infinity), i.e. when a non-finite output there is the
/// correctly rounded result of finite inputs.
fn overflow_at(p: &Conv3dProblem<'_>, index: usize) -> Option<f64> {
    let r = reference_point(p, index)?;
    overflows_f32(r.value).then_some(r.value)
}

/// The number of sampled points of an output of `len` points with `k`
/// samples asked for (before deduplication): what the device check
/// launches.
pub(crate) fn sample_count(len: usize, k: usize) -> usize {
    k.min(len)
}

/// `k` flat indices below `len` (first and last included, the rest from a
/// splitmix64 sequence of `seed`: [`sample_index`]), sorted and
/// deduplicated.
pub(crate) fn sample_points(len: usize, k: usize, seed: u64) -> Vec<usize> {
    let mut points: Vec<usize> = (0..sample_count(len, k))
        .filter_map(|j| sample_index(len, seed, j))
        .collect();
    points.sort_unstable();
    points.dedup();
    points
}

#[cfg(test)]
mod tests {
    use super::sample_points;

    #[test]
    fn sample_points_include_ends_and_stay_in_range() {
        assert!(sample_points(0, 8, 1).is_empty());
        assert!(sample_points(100, 0, 1).is_empty());
        assert_eq!(sample_points(1, 8, 1), vec![0]);
        let s = sample_points(1000, 16, 7);
        assert!(s.len() > 2 && s.len() <= 16);
        assert_eq!((s.first(), s.last()), (Some(&0), Some(&999)));
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_ne!(sample_points(1000, 16, 7), sample_points(1000, 16, 8));
    }
}
