//! The compatibility matrix: each operation on each device, run for real on
//! a small case and checked against the CPU, with the outcome in one of
//! four words: verified, falls back (to what, and why), skipped (why),
//! fails (why).
//!
//! Per device: a staged, verified bf16->f32 copy of a generated checkpoint
//! through the transfer ladder; each conv3d tier of the device's chain
//! forced on its own (a `"conv3d tier"` cell per tier); and the conv3d
//! chain unforced (a `"conv3d"` cell saying which tier served).

use crate::conv3d::{reference, Conv3dData, Conv3dParams, Conv3dProblem};
use crate::conv3d_chain::{Conv3dChain, Conv3dOptions, Conv3dReport, Conv3dTier};
use crate::convert::convert_bytes;
use crate::device::{BackendKind, Device};
use crate::dtype::DType;
use crate::fallback::Outcome;
use crate::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use crate::transfer::{LoadOptions, Loader, Rung};

/// How an operation fared. Serialised as a `status` field
/// (`"verified"`, `"falls_back"`, `"skipped"`, `"fails"`) next to the
/// variant's own fields.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Compat {
    /// Served by its first choice and checked against the CPU.
    Verified,
    /// A later fallback served it (the result is still checked).
    FallsBack {
        /// What served it (`"small sync chunks"`, `"cpu"`, ...).
        to: String,
        /// Why the earlier choices did not.
        why: String,
    },
    /// Not run here: a conv3d tier that does not take the case or is not
    /// available on this device (no library, not built).
    Skipped {
        /// Why (`"unavailable: libcudnn not found ..."`).
        why: String,
    },
    /// It ran and its result was wrong, or it failed. For a whole operation
    /// nothing served it correctly; for a single tier the chain falls back
    /// past it (its `"conv3d"` cell says whether anything served).
    Fails {
        /// What went wrong.
        why: String,
    },
}

/// One cell of the matrix.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct MatrixEntry {
    /// The operation: `"staged copy bf16->f32"`, `"conv3d tier"` (one tier
    /// forced), `"conv3d"` (the whole chain).
    pub operation: String,
    /// The device (`"host:0"`, `"cuda:0"`, `"hip:1"`).
    pub device: String,
    /// For `"conv3d tier"` cells the tier's kind (`"vendor"`, `"tiled"`,
    /// `"naive"`, `"cpu"`); `None` otherwise.
    pub tier: Option<String>,
    /// The outcome.
    #[serde(flatten)]
    pub compat: Compat,
    /// What ran (which rung or tier served, sizes, time).
    pub detail: String,
}

impl MatrixEntry {
    /// Whether this cell leaves the operation with nothing that works: a
    /// failed operation. A failed single tier is not fatal (the chain falls
    /// back past it; its own `"conv3d"` cell is what counts).
    pub fn is_fatal(&self) -> bool {
        self.tier.is_none() && matches!(self.compat, Compat::Fails { .. })
    }
}

/// Runs a staged, verified copy of a generated bf16 checkpoint to f32 on
/// `kind:ordinal`, through the transfer pipeline and its ladder.
pub fn staged_copy(kind: BackendKind, ordinal: usize) -> MatrixEntry {
    let device = format!("{}:{ordinal}", kind.name());
    let (compat, detail) = match staged_copy_inner(kind, ordinal) {
        Ok(r) => r,
        Err(e) => (Compat::Fails { why: e.to_string() }, String::new()),
    };
    MatrixEntry {
        operation: "staged copy bf16->f32".into(),
        device,
        tier: None,
        compat,
        detail,
    }
}

/// Tensors of the generated checkpoint: one spanning several pinned-ring
/// pieces, small ones that are coalesced, an odd-sized one.
const TENSORS: &[(&str, [u64; 2])] = &[
    ("big", [515, 1031]),
    ("small.a", [3, 5]),
    ("small.b", [1, 7]),
    ("odd", [33, 17]),
];

fn staged_copy_inner(kind: BackendKind, ordinal: usize) -> crate::Result<(Compat, String)> {
    // One directory per call: calls may run concurrently in one process.
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("rocm-safe-doctor-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| crate::Error::Io {
        path: dir.clone(),
        op: "create",
        source: e,
    })?;
    let path = dir.join(format!("staged-{}-{ordinal}.safetensors", kind.name()));
    let result = (|| {
        let mut data = Vec::new();
        let mut specs = Vec::new();
        let mut seed = 0x1234_5678u32;
        for (name, shape) in TENSORS {
            let n = (shape[0] * shape[1]) as usize;
            let bytes: Vec<u8> = (0..n)
                .flat_map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    ((seed >> 16) as u16).to_le_bytes()
                })
                .collect();
            specs.push(TensorSpec::new(*name, DType::BF16, shape.to_vec()));
            data.push(bytes);
        }
        let mut w = SafeTensorsWriter::create(&path, specs, None)?;
        for ((name, _), bytes) in TENSORS.iter().zip(&data) {
            w.write_tensor(name, bytes)?;
        }
        w.finish()?;
        let ckpt = Checkpoint::open(&path)?;
        let dev = Device::open(kind, ordinal)?;
        let mut loader = Loader::new(&dev, LoadOptions::to_dtype(DType::F32))?;
        let loaded = loader.load_all(&ckpt)?;
        let mut fallbacks = Vec::new();
        for ((name, _), src) in TENSORS.iter().zip(&data) {
            let t = loaded
                .get(name)
                .ok_or_else(|| crate::Error::TensorNotFound {
                    path: path.clone(),
                    tensor: (*name).into(),
                })?;
            let got = t.data.to_host()?;
            let mut want = vec![0u8; src.len() * 2];
            convert_bytes(DType::BF16, src, DType::F32, &mut want)?;
            if got != want {
                let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0);
                return Ok((Compat::Fails { why: format!("tensor {name}: loaded data differs from the CPU conversion at byte {first}") }, String::new()));
            }
            if let Some(r) = loaded.report.tensor(name) {
                if r.rung != Rung::PinnedRing {
                    let why = r.attempts.first().map_or_else(
                        || "no failure recorded".to_owned(),
                        |a| format!("{}: {}", a.step, a.failure),
                    );
                    fallbacks.push((r.rung.to_string(), format!("{name}: {why}")));
                }
            }
        }
        let detail = format!(
            "{} tensors, {} bytes, bit-exact against the CPU",
            TENSORS.len(),
            loaded.report.out_bytes
        );
        Ok(match fallbacks.first() {
            None => (Compat::Verified, format!("pinned ring; {detail}")),
            Some((to, why)) => (
                Compat::FallsBack {
                    to: to.clone(),
                    why: why.clone(),
                },
                detail,
            ),
        })
    })();
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_dir(&dir);
    result
}

/// The small conv3d case: 1x4x5x6x7 input, 8 filters 3x3x3, padding 1,
/// bias; values that are exact in f32.
struct SmallConv {
    x: Vec<f32>,
    w: Vec<f32>,
    b: Vec<f32>,
}

impl SmallConv {
    fn new() -> SmallConv {
        SmallConv {
            x: (0..4 * 5 * 6 * 7)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
                .collect(),
            w: (0..8 * 4 * 27)
                .map(|i| ((i * 53 % 89) as f32 - 44.0) / 60.0)
                .collect(),
            b: (0..8).map(|i| i as f32 * 0.25 - 1.0).collect(),
        }
    }

    fn problem(&self) -> crate::Result<Conv3dProblem<'_>> {
        Conv3dProblem::new(
            Conv3dParams::default().with_padding([1, 1, 1]),
            Conv3dData::F32(&self.x),
            &[1, 4, 5, 6, 7],
            Conv3dData::F32(&self.w),
            &[8, 4, 3, 3, 3],
            Some(Conv3dData::F32(&self.b)),
        )
    }
}

/// The conv3d tiers of device `kind:ordinal`'s chain, in order (vendor,
/// tiled, naive, CPU: `conv3d_chain::device_tiers`); when the device cannot be
/// opened, its GPU tiers are unavailable for that reason and the CPU tier
/// remains. The host device has no vendor library by design, so its
/// matrix leaves the vendor tier out: on a CPU-only machine a tier that can
/// never exist there is neither a skip nor a fallback.
fn device_tiers(kind: BackendKind, ordinal: usize) -> Vec<Box<dyn Conv3dTier>> {
    match crate::device::Device::open(kind, ordinal) {
        Ok(d) if kind == BackendKind::Host => crate::conv3d_chain::device_tiers(&d)
            .into_iter()
            .filter(|t| t.kind() != crate::conv3d_chain::TierKind::Vendor)
            .collect(),
        Ok(d) => crate::conv3d_chain::device_tiers(&d),
        Err(e) => crate::conv3d_chain::unavailable_gpu_tiers(format!(
            "{}:{ordinal} cannot be opened: {e}",
            kind.name()
        )),
    }
}

/// The index of the first output that differs from the f64 reference by
/// more than 1e-4 relative (or a length mismatch), if any.
fn first_mismatch(out: &[f32], want: &[f64]) -> Option<usize> {
    out.iter()
        .zip(want)
        .position(|(&o, &r)| (f64::from(o) - r).abs() > 1e-4 * (1.0 + r.abs()))
        .or((out.len() != want.len()).then_some(out.len().min(want.len())))
}

/// Runs the small conv3d on device `kind:ordinal`: each tier of its chain
/// forced on its own (one `"conv3d tier"` cell each), then the chain
/// unforced (one `"conv3d"` cell). Every result that is served is compared
/// in full with the f64 reference. `before_step` is called with each
/// cell's name before it runs (for progress).
pub fn conv3d_cells(
    kind: BackendKind,
    ordinal: usize,
    before_step: &mut dyn FnMut(&str),
) -> Vec<MatrixEntry> {
    let device = format!("{}:{ordinal}", kind.name());
    let case = SmallConv::new();
    let problem = match case.problem() {
        Ok(p) => p,
        Err(e) => {
            return vec![MatrixEntry {
                operation: "conv3d".into(),
                device,
                tier: None,
                compat: Compat::Fails { why: e.to_string() },
                detail: String::new(),
            }]
        }
    };
    let want = reference(&problem);
    let mut chain = Conv3dChain::with_tiers(device_tiers(kind, ordinal), Conv3dOptions::default());
    let mut cells = Vec::new();
    for (tier, name) in chain.tiers() {
        before_step(&format!("{device} conv3d tier {tier}"));
        chain.options_mut().force = Some(tier);
        let (compat, detail) = match chain.run(&problem) {
            Ok((out, report)) => match first_mismatch(&out, &want) {
                Some(i) => (
                    Compat::Fails {
                        why: format!("output {i} differs from the f64 reference"),
                    },
                    name.clone(),
                ),
                None => (
                    Compat::Verified,
                    format!(
                        "{name}: {} outputs match the f64 reference{}",
                        out.len(),
                        report
                            .served()
                            .map(|a| format!(", {:.1} ms", a.time.as_secs_f64() * 1e3))
                            .unwrap_or_default()
                    ),
                ),
            },
            Err(e) => match Conv3dReport::of(&e) {
                Some(report) => match report
                    .attempts
                    .iter()
                    .find(|a| a.kind == tier)
                    .map(|a| &a.outcome)
                {
                    Some(Outcome::Skipped(why)) => {
                        (Compat::Skipped { why: why.clone() }, name.clone())
                    }
                    Some(Outcome::Failed(f)) => {
                        (Compat::Fails { why: f.to_string() }, name.clone())
                    }
                    _ => (
                        Compat::Fails {
                            why: report.to_string(),
                        },
                        name.clone(),
                    ),
                },
                None => (Compat::Fails { why: e.to_string() }, name.clone()),
            },
        };
        cells.push(MatrixEntry {
            operation: "conv3d tier".into(),
            device: device.clone(),
            tier: Some(tier.name().to_owned()),
            compat,
            detail,
        });
    }
    before_step(&format!("{device} conv3d chain"));
    chain.options_mut().force = None;
    let (compat, detail) = match chain.run(&problem) {
        Ok((out, report)) => {
            let served = report
                .served()
                .map_or_else(|| "none".to_owned(), |a| a.name.clone());
            match first_mismatch(&out, &want) {
                Some(i) => (
                    Compat::Fails {
                        why: format!(
                            "served by {served}, but output {i} differs from the f64 reference"
                        ),
                    },
                    String::new(),
                ),
                None => {
                    let detail = format!(
                        "served by {served}, {} outputs match the f64 reference",
                        out.len()
                    );
                    // Falls back when the first tier of the chain did not serve:
                    // the first failure, else the first skip, says why.
                    let first_not_served = report
                        .attempts
                        .iter()
                        .take_while(|a| !matches!(a.outcome, Outcome::Served))
                        .find_map(|a| match &a.outcome {
                            Outcome::Failed(f) => Some(format!("{}: failed: {f}", a.name)),
                            _ => None,
                        })
                        .or_else(|| {
                            report.attempts.first().and_then(|a| match &a.outcome {
                                Outcome::Skipped(why) => Some(format!("{}: {why}", a.name)),
                                _ => None,
                            })
                        });
                    match first_not_served {
                        None => (Compat::Verified, detail),
                        Some(why) => (Compat::FallsBack { to: served, why }, detail),
                    }
                }
            }
        }
        Err(e) => (Compat::Fails { why: e.to_string() }, String::new()),
    };
    cells.push(MatrixEntry {
        operation: "conv3d".into(),
        device,
        tier: None,
        compat,
        detail,
    });
    cells
}

/// How many cells (and progress steps) [`conv3d_cells`] makes for a device
/// of `kind`: one per tier of its chain, plus the chain.
pub fn conv3d_cell_count(kind: BackendKind) -> usize {
    // Every GPU's chain has the four tiers; the host's has no vendor tier.
    let tiers = crate::conv3d_chain::TierKind::ALL.len();
    if kind == BackendKind::Host {
        tiers
    } else {
        tiers + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_staged_copy_is_verified() {
        let e = staged_copy(BackendKind::Host, 0);
        assert_eq!(e.compat, Compat::Verified, "{e:?}");
        assert!(e.detail.contains("bit-exact"), "{}", e.detail);
        assert_eq!(e.device, "host:0");
    }

    #[test]
    fn staged_copy_on_a_missing_device_fails_with_the_reason() {
        let e = staged_copy(BackendKind::Host, 7);
        match &e.compat {
            Compat::Fails { why } => assert!(!why.is_empty()),
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn host_conv3d_tiers_and_chain_are_verified() {
        let mut steps = Vec::new();
        let cells = conv3d_cells(BackendKind::Host, 0, &mut |s| steps.push(s.to_owned()));
        assert_eq!(cells.len(), conv3d_cell_count(BackendKind::Host));
        assert_eq!(steps.len(), cells.len());
        // The host device's chain: no vendor library (left out: nothing to
        // skip or fall back from), the tiled and naive kernels emulated on
        // the CPU, the CPU tier; each checked in full against the f64
        // reference.
        let tiers: Vec<(&str, Option<&str>)> = cells
            .iter()
            .map(|c| (c.operation.as_str(), c.tier.as_deref()))
            .collect();
        assert_eq!(
            tiers,
            [
                ("conv3d tier", Some("tiled")),
                ("conv3d tier", Some("naive")),
                ("conv3d tier", Some("cpu")),
                ("conv3d", None),
            ]
        );
        for c in &cells[..3] {
            assert_eq!(c.compat, Compat::Verified, "{c:?}");
            assert!(c.detail.contains("match the f64 reference"), "{}", c.detail);
        }
        // Its first tier serves: verified, not a fallback (a CPU-only
        // machine reads as working, not as failing over).
        let chain = &cells[3];
        assert_eq!(chain.compat, Compat::Verified, "{chain:?}");
        assert!(chain.detail.contains("served by tiled"), "{}", chain.detail);
    }

    #[test]
    fn a_gpu_device_without_tiers_skips_them_and_falls_back_to_cpu() {
        // HIP has no conv3d tiers on this branch (and without the feature
        // there is no device): the GPU tiers are skipped with the reason and
        // the chain falls back to the CPU, checked. Under `cuda` the CUDA
        // tiers are real; without a GPU they are skipped likewise.
        let kind = if cfg!(feature = "cuda") {
            BackendKind::Cuda
        } else {
            BackendKind::Hip
        };
        let cells = conv3d_cells(kind, 0, &mut |_| {});
        assert_eq!(cells.len(), 5, "{cells:?}");
        for c in &cells[..3] {
            match &c.compat {
                Compat::Skipped { why } => assert!(why.contains("unavailable"), "{why}"),
                // A machine with the GPU runs them.
                Compat::Verified => assert!(kind == BackendKind::Cuda, "{c:?}"),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(cells[3].tier.as_deref(), Some("cpu"));
        assert_eq!(cells[3].compat, Compat::Verified);
        let chain = &cells[4];
        match &chain.compat {
            Compat::FallsBack { to, why } => {
                assert_eq!(to, "cpu");
                assert!(why.contains("unavailable"), "{why}");
            }
            Compat::Verified => assert!(kind == BackendKind::Cuda, "{chain:?}"),
            other => panic!("{other:?}"),
        }
        assert!(!chain.is_fatal());
    }

    #[test]
    fn mismatches_are_found() {
        assert_eq!(first_mismatch(&[1.0, 2.0], &[1.0, 2.0]), None);
        assert_eq!(first_mismatch(&[1.0, 2.5], &[1.0, 2.0]), Some(1));
        assert_eq!(first_mismatch(&[1.0], &[1.0, 2.0]), Some(1));
        let tier_fail = MatrixEntry {
            operation: "conv3d tier".into(),
            device: "cuda:0".into(),
            tier: Some("tiled".into()),
            compat: Compat::Fails { why: "x".into() },
            detail: String::new(),
        };
        assert!(!tier_fail.is_fatal());
        let op_fail = MatrixEntry {
            tier: None,
            ..tier_fail
        };
        assert!(op_fail.is_fatal());
    }

    #[test]
    fn serialises_with_a_status_tag() {
        let e = MatrixEntry {
            operation: "x".into(),
            device: "host:0".into(),
            tier: None,
            compat: Compat::FallsBack {
                to: "cpu".into(),
                why: "y".into(),
            },
            detail: String::new(),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["status"], "falls_back");
        assert_eq!(v["to"], "cpu");
        assert_eq!(v["tier"], serde_json::Value::Null);
        let skipped = serde_json::to_value(Compat::Skipped { why: "w".into() }).unwrap();
        assert_eq!(skipped["status"], "skipped");
    }
}
