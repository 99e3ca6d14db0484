//! The compatibility matrix: each operation on each device, run for real on
//! a small case and checked against the CPU, with the outcome in one of
//! three words: verified, falls back (to what, and why), fails.

use crate::conv3d::{reference, Conv3dChain, Conv3dData, Conv3dParams, Conv3dProblem};
use crate::convert::convert_bytes;
use crate::device::{BackendKind, Device};
use crate::dtype::DType;
use crate::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use crate::transfer::{LoadOptions, Loader, Rung};

/// How an operation fared.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
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
    /// Nothing served it correctly: do not use this operation here.
    Fails {
        /// What went wrong.
        why: String,
    },
}

/// One cell of the matrix.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MatrixEntry {
    /// The operation (`"staged copy bf16->f32"`, `"conv3d"`).
    pub operation: String,
    /// The device (`"host:0"`, `"cuda:0"`; `"chain"` for conv3d, which picks
    /// its own devices).
    pub device: String,
    /// The outcome.
    #[serde(flatten)]
    pub compat: Compat,
    /// What ran (which rung or tier served, sizes).
    pub detail: String,
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
                        |a| format!("{}: {}", a.rung, a.failure),
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

/// Runs a small conv3d (1x4x5x6x7 input, 8 filters 3x3x3, padding 1, bias)
/// through the default chain and checks every output against the f64
/// reference.
pub fn conv3d() -> MatrixEntry {
    let (compat, detail) =
        conv3d_inner().unwrap_or_else(|e| (Compat::Fails { why: e.to_string() }, String::new()));
    MatrixEntry {
        operation: "conv3d".into(),
        device: "chain".into(),
        compat,
        detail,
    }
}

fn conv3d_inner() -> crate::Result<(Compat, String)> {
    let x: Vec<f32> = (0..4 * 5 * 6 * 7)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let w: Vec<f32> = (0..8 * 4 * 27)
        .map(|i| ((i * 53 % 89) as f32 - 44.0) / 60.0)
        .collect();
    let b: Vec<f32> = (0..8).map(|i| i as f32 * 0.25 - 1.0).collect();
    let params = Conv3dParams::default().with_padding([1, 1, 1]);
    let p = Conv3dProblem::new(
        params,
        Conv3dData::F32(&x),
        &[1, 4, 5, 6, 7],
        Conv3dData::F32(&w),
        &[8, 4, 3, 3, 3],
        Some(Conv3dData::F32(&b)),
    )?;
    let chain = Conv3dChain::new();
    let (out, report) = chain.run(&p)?;
    let want = reference(&p);
    let bad = out
        .iter()
        .zip(&want)
        .position(|(&o, &r)| (f64::from(o) - r).abs() > 1e-4 * (1.0 + r.abs()));
    let served = report
        .served()
        .map_or_else(|| "none".to_owned(), |a| a.name.clone());
    if let Some(i) = bad.or((out.len() != want.len()).then_some(out.len().min(want.len()))) {
        return Ok((
            Compat::Fails {
                why: format!("served by {served}, but output {i} differs from the f64 reference"),
            },
            String::new(),
        ));
    }
    let skipped = report
        .attempts
        .iter()
        .filter(|a| matches!(a.outcome, crate::conv3d::Outcome::Skipped(_)))
        .count();
    let detail = format!("served by {served} ({skipped} tiers skipped as unsupported or unavailable), {} outputs match the f64 reference", out.len());
    let first_failure = report
        .failures()
        .next()
        .map(|(a, f)| format!("{}: {f}", a.name));
    Ok(match first_failure {
        None => (Compat::Verified, detail),
        Some(why) => (Compat::FallsBack { to: served, why }, detail),
    })
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
    fn conv3d_matches_the_reference() {
        let e = conv3d();
        assert!(
            matches!(e.compat, Compat::Verified | Compat::FallsBack { .. }),
            "{e:?}"
        );
        assert!(e.detail.contains("match the f64 reference"), "{}", e.detail);
    }

    #[test]
    fn serialises_with_a_status_tag() {
        let e = MatrixEntry {
            operation: "x".into(),
            device: "host:0".into(),
            compat: Compat::FallsBack {
                to: "cpu".into(),
                why: "y".into(),
            },
            detail: String::new(),
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["status"], "falls_back");
        assert_eq!(v["to"], "cpu");
    }
}
