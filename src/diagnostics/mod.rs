//! Diagnostics: platform facts and self-tests, the engine behind the
//! `doctor` example. Everything is plain data that serialises to JSON with
//! stable field names.

pub mod amdgpu;
pub mod devices;
pub mod env;
pub mod matrix;
pub mod platform;
pub mod selftest;

pub use amdgpu::{amdgpu_memory, AmdgpuMemory};
pub use devices::{probe_backends, BackendReport, DeviceReport};
pub use env::{advise, read_env, Advice, EnvVar};
pub use matrix::{Compat, MatrixEntry};
pub use platform::{Library, Platform};

use crate::device::BackendKind;
pub use selftest::{cpu_self_tests, SelfTest, Verdict};

/// The complete doctor report.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// Version of the report's JSON layout; bumped when a field changes meaning.
    pub schema_version: u32,
    /// rocm-safe's version.
    pub crate_version: String,
    /// Cargo features this build was compiled with.
    pub features: Vec<String>,
    /// Platform facts.
    pub platform: Platform,
    /// amdgpu memory pools from sysfs (VRAM carve-out and GTT), one per card.
    pub amdgpu_memory: Vec<AmdgpuMemory>,
    /// The environment variables that matter, with their values.
    pub environment: Vec<EnvVar>,
    /// Advice for each HIP device's architecture (empty without one).
    pub advice: Vec<Advice>,
    /// Self-test results of the CPU paths.
    pub self_tests: Vec<SelfTest>,
    /// Each backend (host, hip, cuda): built or not, its devices, and each
    /// device's kernel self-test.
    pub backends: Vec<BackendReport>,
    /// Operation x device: a staged verified copy on every device, and a
    /// conv3d through the chain, each checked against the CPU.
    pub matrix: Vec<MatrixEntry>,
}

impl Report {
    /// Detects the platform and runs every self-test.
    pub fn collect() -> Report {
        let mut features = Vec::new();
        if cfg!(feature = "hip") {
            features.push("hip".to_owned());
        }
        if cfg!(feature = "cuda") {
            features.push("cuda".to_owned());
        }
        let environment = read_env();
        let backends = probe_backends();
        let mut archs: Vec<&str> = backends
            .iter()
            .filter(|b| b.backend == "hip")
            .flat_map(|b| b.devices.iter().map(|d| d.arch.as_str()))
            .collect();
        archs.sort_unstable();
        archs.dedup();
        let advice = archs.iter().flat_map(|a| advise(a, &environment)).collect();
        let mut matrix: Vec<MatrixEntry> = backends
            .iter()
            .flat_map(|b| {
                b.devices
                    .iter()
                    .map(move |d| (b.backend.as_str(), d.ordinal))
            })
            .filter_map(|(name, ordinal)| {
                let kind = [BackendKind::Host, BackendKind::Hip, BackendKind::Cuda]
                    .into_iter()
                    .find(|k| k.name() == name)?;
                Some(matrix::staged_copy(kind, ordinal))
            })
            .collect();
        matrix.push(matrix::conv3d());
        Report {
            schema_version: 1,
            crate_version: env!("CARGO_PKG_VERSION").to_owned(),
            features,
            platform: Platform::detect(),
            amdgpu_memory: amdgpu_memory(),
            environment,
            advice,
            self_tests: cpu_self_tests(),
            backends,
            matrix,
        }
    }

    /// Whether every self-test passed, CPU and device. A backend without
    /// devices is not a failure; a device whose kernels fail is.
    pub fn all_passed(&self) -> bool {
        self.self_tests
            .iter()
            .chain(
                self.backends
                    .iter()
                    .flat_map(|b| b.devices.iter().map(|d| &d.self_test)),
            )
            .all(|t| t.verdict == Verdict::Pass)
    }

    /// Whether everything present works or falls back as designed: the CPU
    /// self-tests pass (nothing lies below the CPU) and no operation in the
    /// matrix fails. A device whose kernels fail their self-test is not
    /// fatal: verified conversions fall back to the CPU there. This decides
    /// `doctor`'s exit status.
    pub fn usable(&self) -> bool {
        self.self_tests.iter().all(|t| t.verdict == Verdict::Pass)
            && self
                .matrix
                .iter()
                .all(|m| !matches!(m.compat, Compat::Fails { .. }))
    }
}
