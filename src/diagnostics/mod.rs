//! Diagnostics: platform facts and self-tests, the engine behind the
//! `doctor` example. Everything is plain data that serialises to JSON with
//! stable field names.
//!
//! This is the top layer: it drives every other module (devices, verified
//! conversions, the loader, the conv3d chain) on small cases and records
//! what it saw. It is public so that the `doctor` example, and tools like
//! it, can build on it; a trainer that loads and converts tensors needs
//! the modules below it, not this one.
//!
//! Public: the report and every type it holds (re-exported here), how to
//! collect and render it, and the few probes the doctor example calls
//! itself. The engine's tables (the watched variables, the advice rules,
//! the matrix's cells) are private: they change with every release.
//! [`verdict`] stays a module because its [`verdict::Verdict`] (the
//! report's one line) and the self-test's [`Verdict`] share a name.

mod amdgpu;
mod build_info;
mod code_object;
mod devices;
mod env;
mod libraries;
mod matrix;
mod platform;
mod render;
mod selftest;
pub mod verdict;

pub use amdgpu::{
    amdgpu_memory, assess_memory, attach_runtime, AmdgpuMemory, MemoryAssessment, MemoryFigures,
    RuntimeMemory,
};
pub use build_info::{
    compiler_needed, Audience, HipBuild, HipDeviceBuild, HIP_DOCTOR_COMMAND, HIP_PIP_COMMAND,
};
pub use code_object::{
    read_code_object, CodeObjectError, CodeObjectInfo, KernelArgInfo, KernelResources,
};
pub use devices::{kernel_self_test, list_backends, probe_backends, BackendReport, DeviceReport};
pub use env::{advise, gfx_override, read_env, Advice, EnvVar, GfxOverrideReport};
pub use libraries::{
    duplicate_libraries, duplicates_in, runtime_files, DuplicateLibrary, RuntimeFile,
};
pub use matrix::{Compat, MatrixEntry};
pub use platform::{Library, Platform, RuntimeVersion};
pub use render::render_text;

use crate::device::BackendKind;
use crate::error::{Error, Result};
pub use selftest::{cpu_self_tests, SelfTest, Verdict};

/// The version of the report's JSON layout ([`Report::schema_version`]).
/// 2: runtime versions, library file versions, runtime memory figures per
/// device and per amdgpu card, `--device` selection, per-tier conv3d cells
/// and the `skipped` state. 3: `hip_build` (the gfx archs compiled in, the
/// compiler, each HIP device's arch against them, the rebuild command).
/// 4: `runtime_files` (each runtime and vendor library in use: path,
/// version, how it was found), `duplicate_libraries`, `gfx_override`;
/// `amdgpu_memory` gains the used figures, the TTM limit and
/// `amdgpu.gttsize`, and its assessment the states `free_above_total`,
/// `below_gtt` and `ttm_capped` (figures once called `carve_out_only` or
/// `shared_reported` may now be these). 5: `verdict` (`level`, `line`: what
/// the machine can do, or the one thing to fix first).
pub const SCHEMA_VERSION: u32 = 5;

/// The complete doctor report. Serialised (serde) with these field names,
/// which are stable within a [`SCHEMA_VERSION`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Report {
    /// Version of the report's JSON layout ([`SCHEMA_VERSION`]); bumped
    /// when a field changes meaning or is added.
    pub schema_version: u32,
    /// One line on what this machine can do, or the one thing to fix
    /// first ([`Report::judge`]); the doctor prints it first and last.
    pub verdict: verdict::Verdict,
    /// Who the commands in the report are written for ([`Report::for_audience`]);
    /// not serialised (the commands themselves are).
    #[serde(skip)]
    pub audience: Audience,
    /// rocm-safe's version.
    pub crate_version: String,
    /// Cargo features this build was compiled with.
    pub features: Vec<String>,
    /// Platform facts, runtime libraries and their versions.
    pub platform: Platform,
    /// What this build compiled for HIP and whether it covers each HIP
    /// device (with the command to rebuild when not).
    pub hip_build: HipBuild,
    /// amdgpu memory pools from sysfs (VRAM carve-out and GTT), one per
    /// card, compared with what the HIP runtime reports for it.
    pub amdgpu_memory: Vec<AmdgpuMemory>,
    /// Each runtime and vendor library (HIP runtime, CUDA driver, cuDNN,
    /// NVRTC, MIOpen): the file in use, its version and how it was found,
    /// or why none is.
    pub runtime_files: Vec<RuntimeFile>,
    /// The libraries this process maps from more than one file (checked
    /// after every other step), each with what it means.
    pub duplicate_libraries: Vec<DuplicateLibrary>,
    /// `HSA_OVERRIDE_GFX_VERSION`, when set: the arch the HIP runtime loads
    /// code objects for instead of the GPU's own.
    pub gfx_override: Option<GfxOverrideReport>,
    /// The environment variables that matter, with their values.
    pub environment: Vec<EnvVar>,
    /// Advice for each HIP device's architecture (empty without one).
    pub advice: Vec<Advice>,
    /// Self-test results of the CPU paths.
    pub self_tests: Vec<SelfTest>,
    /// Each backend (host, hip, cuda): built or not, its devices, their
    /// memory figures and (for selected devices) kernel self-tests.
    pub backends: Vec<BackendReport>,
    /// The `--device` selection in effect (`"1"`, `"hip:0"`), `None` for
    /// every device.
    pub device_filter: Option<String>,
    /// Operation x device for every selected device: a staged verified
    /// copy, each conv3d tier forced, and the conv3d chain, each checked
    /// against the CPU.
    pub matrix: Vec<MatrixEntry>,
}

/// Which devices the self-tests and the matrix run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceSelector {
    /// Ordinal N of every backend that has one (`--device 1`: hip:1 and
    /// cuda:1; the host device is 0).
    Ordinal(usize),
    /// One device of one backend (`--device hip:0`).
    Exact(BackendKind, usize),
}

impl DeviceSelector {
    /// Whether device `kind:ordinal` is selected.
    pub fn matches(self, kind: BackendKind, ordinal: usize) -> bool {
        match self {
            DeviceSelector::Ordinal(n) => n == ordinal,
            DeviceSelector::Exact(k, n) => k == kind && n == ordinal,
        }
    }
}

impl std::fmt::Display for DeviceSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSelector::Ordinal(n) => write!(f, "{n}"),
            DeviceSelector::Exact(k, n) => write!(f, "{k}:{n}"),
        }
    }
}

impl std::str::FromStr for DeviceSelector {
    type Err = ();
    /// Parses `N` or `BACKEND:N` (`host`, `hip`, `cuda`).
    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        match s.split_once(':') {
            None => s.parse().map(DeviceSelector::Ordinal).map_err(|_| ()),
            Some((b, n)) => {
                let kind = devices::KINDS
                    .into_iter()
                    .find(|k| k.name() == b)
                    .ok_or(())?;
                Ok(DeviceSelector::Exact(kind, n.parse().map_err(|_| ())?))
            }
        }
    }
}

/// What [`Report::collect_with`] does beyond the defaults
/// (`CollectOptions::default().with_device(...)`).
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct CollectOptions {
    /// Run the device self-tests and the matrix only on these devices
    /// (`None`: every device).
    pub device: Option<DeviceSelector>,
}

impl CollectOptions {
    /// Self-tests and matrix on the devices `selector` picks only.
    pub fn with_device(mut self, selector: DeviceSelector) -> Self {
        self.device = Some(selector);
        self
    }
}

/// Progress of [`Report::collect_with`]: reported before each step and once
/// at the end (`done == total`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Progress {
    /// Steps finished.
    pub done: usize,
    /// Steps in all (known before the first one runs).
    pub total: usize,
    /// The step about to run (`"cpu.fingerprint"`, `"hip:0 staged copy"`),
    /// or `"done"`.
    pub step: String,
}

impl Report {
    /// Detects the platform and runs every self-test on every device.
    pub fn collect() -> Report {
        // Without a selector no device can be missing, so this cannot fail;
        // should it ever, report an empty matrix rather than panic.
        Self::collect_with(&CollectOptions::default(), &mut |_| {}).unwrap_or_else(|_| {
            let mut r = Self::collect_quick();
            r.self_tests = cpu_self_tests();
            r
        })
    }

    /// The report without self-tests or matrix: platform, memory,
    /// environment, advice, device list.
    fn collect_quick() -> Report {
        let mut features = Vec::new();
        if cfg!(feature = "hip") {
            features.push("hip".to_owned());
        }
        if cfg!(feature = "cuda") {
            features.push("cuda".to_owned());
        }
        let environment = read_env();
        let backends = list_backends();
        let mut archs: Vec<&str> = backends
            .iter()
            .filter(|b| b.backend == "hip")
            .flat_map(|b| b.devices.iter().map(|d| d.arch.as_str()))
            .collect();
        archs.sort_unstable();
        archs.dedup();
        let advice = archs.iter().flat_map(|a| advise(a, &environment)).collect();
        let runtime: Vec<RuntimeMemory> = backends
            .iter()
            .filter(|b| b.backend == "hip")
            .flat_map(|b| &b.devices)
            .map(|d| RuntimeMemory {
                ordinal: d.ordinal,
                pci: d.pci_bus_id.clone(),
                mem: d.memory_free_bytes.zip(d.memory_reported_total_bytes),
            })
            .collect();
        let hip_devices: Vec<(usize, String)> = backends
            .iter()
            .filter(|b| b.backend == "hip")
            .flat_map(|b| b.devices.iter().map(|d| (d.ordinal, d.arch.clone())))
            .collect();
        let mut amdgpu = amdgpu_memory();
        attach_runtime(&mut amdgpu, &runtime);
        Report {
            schema_version: SCHEMA_VERSION,
            crate_version: env!("CARGO_PKG_VERSION").to_owned(),
            features,
            platform: Platform::detect(),
            hip_build: HipBuild::for_devices(&hip_devices),
            amdgpu_memory: amdgpu,
            runtime_files: runtime_files(),
            duplicate_libraries: duplicate_libraries(),
            gfx_override: gfx_override(),
            environment,
            advice,
            self_tests: Vec::new(),
            backends,
            device_filter: None,
            matrix: Vec::new(),
            verdict: verdict::Verdict::pending(),
            audience: Audience::Cargo,
        }
    }

    /// Detects the platform, then runs the CPU self-tests and, on each
    /// selected device, the kernel self-test and the matrix (staged copy,
    /// each conv3d tier, the conv3d chain), calling `progress` before each
    /// step and once at the end. The library draws nothing; the `doctor`
    /// example turns `progress` into a progress bar.
    ///
    /// Errors: [`Error::NoSuchDevice`] when `options.device` selects no
    /// listed device (nothing has been run then).
    pub fn collect_with(
        options: &CollectOptions,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Report> {
        let mut report = Self::collect_quick();
        let mut selected: Vec<(BackendKind, usize)> = Vec::new();
        for (b, kind) in report.backends.iter_mut().zip(devices::KINDS) {
            for d in &mut b.devices {
                d.selected = options.device.is_none_or(|s| s.matches(kind, d.ordinal));
                if d.selected {
                    selected.push((kind, d.ordinal));
                }
            }
        }
        if let Some(sel) = options.device {
            if selected.is_empty() {
                return Err(Error::NoSuchDevice {
                    wanted: sel.to_string(),
                    available: report.device_list(),
                });
            }
            report.device_filter = Some(sel.to_string());
        }
        let cpu_steps = selftest::CPU_SELF_TESTS;
        let total = cpu_steps
            + selected
                .iter()
                .map(|&(k, _)| 2 + matrix::conv3d_cell_count(k))
                .sum::<usize>();
        let mut done = 0usize;
        let mut step = |name: &str, progress: &mut dyn FnMut(&Progress)| {
            progress(&Progress {
                done,
                total,
                step: name.to_owned(),
            });
            done += 1;
        };
        report.self_tests = selftest::cpu_self_tests_with(&mut |name| step(name, progress));
        for &(kind, ordinal) in &selected {
            step(&format!("{kind}:{ordinal} kernel self-test"), progress);
            let t = kernel_self_test(kind, ordinal);
            if let Some(d) = report
                .backends
                .iter_mut()
                .filter(|b| b.backend == kind.name())
                .flat_map(|b| b.devices.iter_mut())
                .find(|d| d.ordinal == ordinal)
            {
                d.self_test = Some(t);
            }
            step(&format!("{kind}:{ordinal} staged copy"), progress);
            report.matrix.push(matrix::staged_copy(kind, ordinal));
            let cells = matrix::conv3d_cells(kind, ordinal, &mut |name| step(name, progress));
            report.matrix.extend(cells);
        }
        // After every step has loaded what it uses.
        report.duplicate_libraries = duplicate_libraries();
        report.verdict = report.judge();
        progress(&Progress {
            done: total,
            total,
            step: "done".to_owned(),
        });
        Ok(report)
    }

    /// The listed devices as `"host:0, hip:0, hip:1"`, with the reason for
    /// each backend that has none (`"cuda: not built ..."`).
    pub fn device_list(&self) -> String {
        let mut parts = Vec::new();
        for b in &self.backends {
            if b.devices.is_empty() {
                let why = b.error.as_deref().unwrap_or("no devices");
                parts.push(format!("{}: {why}", b.backend));
            }
            parts.extend(
                b.devices
                    .iter()
                    .map(|d| format!("{}:{}", b.backend, d.ordinal)),
            );
        }
        parts.join("; ")
    }

    /// Whether every self-test that ran passed, CPU and device. A backend
    /// without devices is not a failure; a device whose kernels fail is.
    pub fn all_passed(&self) -> bool {
        self.self_tests
            .iter()
            .chain(
                self.backends
                    .iter()
                    .flat_map(|b| b.devices.iter().filter_map(|d| d.self_test.as_ref())),
            )
            .all(|t| t.verdict == Verdict::Pass)
    }

    /// Whether everything present works or falls back as designed: the CPU
    /// self-tests pass (nothing lies below the CPU) and no operation in the
    /// matrix fails ([`MatrixEntry::is_fatal`]: a single conv3d tier that
    /// fails is not fatal, the chain falls back past it). A device whose
    /// kernels fail their self-test is not fatal either: verified
    /// conversions fall back to the CPU there. This decides `doctor`'s exit
    /// status.
    pub fn usable(&self) -> bool {
        self.self_tests.iter().all(|t| t.verdict == Verdict::Pass)
            && !self.matrix.iter().any(MatrixEntry::is_fatal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_selectors_parse_and_match() {
        assert_eq!("1".parse(), Ok(DeviceSelector::Ordinal(1)));
        assert_eq!(
            "hip:0".parse(),
            Ok(DeviceSelector::Exact(BackendKind::Hip, 0))
        );
        for bad in ["", "x", "-1", "gpu:0", "hip:", "hip:x", ":1"] {
            assert_eq!(bad.parse::<DeviceSelector>(), Err(()), "{bad}");
        }
        let s = DeviceSelector::Ordinal(1);
        assert!(s.matches(BackendKind::Hip, 1) && s.matches(BackendKind::Cuda, 1));
        assert!(!s.matches(BackendKind::Host, 0));
        let e = DeviceSelector::Exact(BackendKind::Cuda, 0);
        assert!(e.matches(BackendKind::Cuda, 0) && !e.matches(BackendKind::Hip, 0));
        assert_eq!(e.to_string(), "cuda:0");
    }

    #[test]
    fn collect_reports_progress_and_selects_devices() {
        let mut seen = Vec::new();
        let opts = CollectOptions {
            device: Some(DeviceSelector::Exact(BackendKind::Host, 0)),
        };
        let r = Report::collect_with(&opts, &mut |p| seen.push(p.clone())).unwrap();
        assert_eq!(r.schema_version, SCHEMA_VERSION);
        assert_eq!(r.device_filter.as_deref(), Some("host:0"));
        let last = seen.last().unwrap();
        assert_eq!((last.done, last.step.as_str()), (last.total, "done"));
        // One call per step, counting up from 0, then the final one.
        assert_eq!(seen.len(), last.total + 1);
        assert!(seen.iter().enumerate().all(|(i, p)| p.done == i));
        assert!(seen.iter().any(|p| p.step == "host:0 staged copy"));
        assert!(r.usable() && r.all_passed());
        assert!(r.matrix.iter().all(|m| m.device == "host:0"));
    }

    #[test]
    fn selecting_a_missing_device_is_a_typed_error() {
        let opts = CollectOptions {
            device: Some(DeviceSelector::Ordinal(99)),
        };
        let mut calls = 0;
        let e = Report::collect_with(&opts, &mut |_| calls += 1).unwrap_err();
        assert_eq!(calls, 0, "nothing runs before the selection is checked");
        match e {
            Error::NoSuchDevice { wanted, available } => {
                assert_eq!(wanted, "99");
                assert!(available.contains("host:0"), "{available}");
            }
            other => panic!("{other}"),
        }
    }
}
