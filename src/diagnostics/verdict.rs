//! The doctor's verdict: one line that says what this machine can do, or
//! the one thing to fix first. A pure function of the [`Report`] (and
//! whether `/dev/kfd` exists), so each machine kind is tested without it.

use super::{Audience, Report, Verdict as TestVerdict};

/// How the machine stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Level {
    /// A GPU with kernels built for it, self-tests passing.
    Ready,
    /// No GPU (or none this build can use, as expected): everything runs
    /// on the CPU, correctly.
    CpuOnly,
    /// Something to fix before the GPU can be used (the line says what).
    Fix,
    /// A check failed with no fallback left: results are not to be trusted.
    Failed,
}

/// The verdict line and its level.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Verdict {
    /// The level.
    pub level: Level,
    /// One line for a person.
    pub line: String,
}

impl Verdict {
    /// The placeholder of a report whose checks have not run yet.
    pub(crate) fn pending() -> Verdict {
        Verdict::new(Level::CpuOnly, "not judged yet: the checks have not run")
    }

    fn new(level: Level, line: impl Into<String>) -> Verdict {
        Verdict {
            level,
            line: line.into(),
        }
    }
}

/// The major version of a HIP runtime version text (`"5.2.21153"` -> 5).
fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.trim().parse().ok()
}

/// The verdict of `r`; `kfd_present`: whether `/dev/kfd` exists (the amdgpu
/// kernel driver is loaded, so an AMD GPU is very likely here).
pub fn verdict_of(r: &Report, kfd_present: bool) -> Verdict {
    // 1. Nothing below the CPU: a failing CPU self-test or a fatal cell.
    if let Some(t) = r.self_tests.iter().find(|t| t.verdict == TestVerdict::Fail) {
        return Verdict::new(
            Level::Failed,
            format!(
                "FAILED: the CPU self-test {:?} failed, with no fallback below it: do not trust this machine's results; please report this output",
                t.name
            ),
        );
    }
    if let Some(m) = r.matrix.iter().find(|m| m.is_fatal()) {
        return Verdict::new(
            Level::Failed,
            format!(
                "FAILED: {} on {} fails with no fallback left: do not trust its results; please report this output",
                m.operation, m.device
            ),
        );
    }
    // 2. Two copies of a runtime in one process.
    if let Some(d) = r.duplicate_libraries.first() {
        return Verdict::new(
            Level::Fix,
            format!(
                "fix: {} is loaded from {} files in one process ({}); {}",
                d.library,
                d.files.len(),
                d.files.join(", "),
                d.warning
            ),
        );
    }
    let gpus: Vec<(&str, &super::DeviceReport)> = r
        .backends
        .iter()
        .filter(|b| b.backend != "host")
        .flat_map(|b| b.devices.iter().map(move |d| (b.backend.as_str(), d)))
        .collect();
    let hip_major = r
        .platform
        .hip_runtime_version
        .version
        .as_deref()
        .and_then(major);
    let co = r.hip_build.code_object_version;
    // 3. A HIP runtime too old for the code objects built, where an AMD
    // GPU may be (the amdgpu driver, or a HIP device seen): an old ROCm
    // library left on a machine that CUDA or the CPU serves is not a thing
    // to fix (the H200 machines carry a ROCm 5.7 libamdhip64.so.5).
    let amd_here = kfd_present || gpus.iter().any(|(b, _)| *b == "hip");
    if let (Some(m), Some(v), true) = (hip_major, co, amd_here) {
        if m < 6 && v >= 5 {
            let version = r
                .platform
                .hip_runtime_version
                .version
                .clone()
                .unwrap_or_default();
            return Verdict::new(
                Level::Fix,
                format!(
                    "fix: the HIP runtime is {version}; the kernels need ROCm >= 6 (code object v{v}): install ROCm 6 or 7 (or TheRock's pip SDK), or rebuild with ROCM_SAFE_CODE_OBJECT_VERSION=4 for this runtime"
                ),
            );
        }
    }
    // 4. A HIP device this build has no kernels for.
    if let Some(d) = r.hip_build.devices.iter().find(|d| !d.built) {
        if d.arch == "unknown" {
            // No KFD topology said what the GPU is: name how to find out
            // rather than a rebuild for an arch called "unknown".
            return Verdict::new(
                Level::Fix,
                format!(
                    "fix: the gfx arch of hip:{} is unknown (no KFD topology under /sys/class/kfd): `rocminfo | grep gfx` names it; rebuild with {} if this build lacks it",
                    d.ordinal,
                    r.audience.hip_rebuild(Some("<that arch>"))
                ),
            );
        }
        return Verdict::new(
            Level::Fix,
            format!(
                "fix: {} (hip:{}) has no kernels in this build: rebuild with {}",
                d.arch,
                d.ordinal,
                r.audience
                    .hip_rebuild(Some(d.arch.split(':').next().unwrap_or(&d.arch)))
            ),
        );
    }
    if !gpus.is_empty() {
        // 5. GPUs: ready, or a device self-test to report.
        let names: Vec<String> = gpus
            .iter()
            .map(|(b, d)| format!("{} ({b}:{}, {})", d.name, d.ordinal, d.arch))
            .collect();
        let failed: Vec<String> = gpus
            .iter()
            .filter(|(_, d)| {
                d.self_test
                    .as_ref()
                    .is_some_and(|t| t.verdict == TestVerdict::Fail)
            })
            .map(|(b, d)| format!("{b}:{}", d.ordinal))
            .collect();
        if !failed.is_empty() {
            return Verdict::new(
                Level::Fix,
                format!(
                    "fix: the kernel self-test failed on {}: its verified work falls back to the CPU (correct, slower); please report this output",
                    failed.join(", ")
                ),
            );
        }
        let tested = gpus.iter().any(|(_, d)| d.self_test.is_some());
        return Verdict::new(
            Level::Ready,
            format!(
                "{} found, kernels for it built{}: ready",
                names.join(", "),
                if tested {
                    ", self-tests pass"
                } else {
                    " (not self-tested: not selected)"
                }
            ),
        );
    }
    // 6. No GPU device: what stands between an AMD GPU and this build.
    let hip = r.backends.iter().find(|b| b.backend == "hip");
    let hip_error = hip.and_then(|b| b.error.as_deref()).unwrap_or("");
    if kfd_present {
        if !r.features.iter().any(|f| f == "hip") {
            return Verdict::new(
                Level::Fix,
                format!(
                    "fix: an AMD GPU driver is loaded (/dev/kfd) but this build has no HIP backend: rebuild with {} (`rocminfo | grep gfx` names the arch, e.g. gfx1151)",
                    r.audience.hip_rebuild(Some("<your gfx arch>"))
                ),
            );
        }
        if hip_error.contains("permission") || hip_error.contains("/dev/kfd") {
            return Verdict::new(Level::Fix, format!("fix: {hip_error}"));
        }
        if hip_error.contains("runtime not available") {
            return Verdict::new(
                Level::Fix,
                "fix: an AMD GPU driver is loaded (/dev/kfd) but no HIP runtime was found: install ROCm >= 6 (AMD's packages, your distribution's, or TheRock's pip SDK) or point ROCM_SAFE_HIP_RUNTIME at libamdhip64.so.7 (the HIP backend's error lists every place tried)",
            );
        }
        if !hip_error.is_empty() {
            return Verdict::new(Level::Fix, format!("fix: the HIP backend: {hip_error}"));
        }
    }
    Verdict::new(
        Level::CpuOnly,
        "no GPU here: everything runs on the CPU, as expected",
    )
}

impl Report {
    /// The report for `audience`: its commands (the rebuild command and the
    /// verdict's) written as that reader runs them.
    pub fn for_audience(mut self, audience: Audience) -> Report {
        self.audience = audience;
        self.hip_build.retarget(audience);
        self.verdict = self.judge();
        self
    }

    /// The verdict on this machine ([`verdict_of`] with whether `/dev/kfd`
    /// exists here), as [`Report::collect_with`] stores it.
    pub fn judge(&self) -> Verdict {
        verdict_of(self, std::path::Path::new("/dev/kfd").exists())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::{
        BackendReport, DeviceReport, DuplicateLibrary, HipDeviceBuild, SelfTest,
    };

    fn pass(name: &str) -> SelfTest {
        SelfTest {
            name: name.into(),
            verdict: TestVerdict::Pass,
            detail: String::new(),
            millis: 0.0,
        }
    }

    fn device(name: &str, arch: &str, tested: Option<TestVerdict>) -> DeviceReport {
        DeviceReport {
            ordinal: 0,
            name: name.into(),
            arch: arch.into(),
            total_memory_bytes: 1 << 34,
            multiprocessors: 1,
            pci_bus_id: None,
            memory_free_bytes: None,
            memory_reported_total_bytes: None,
            memory_info_error: None,
            selected: true,
            self_test: tested.map(|v| SelfTest {
                verdict: v,
                ..pass("kernels")
            }),
        }
    }

    /// A machine with no GPU: the host backend only, CPU self-tests passed.
    fn cpu_machine() -> Report {
        let mut r = Report::collect_quick();
        r.features.clear();
        r.self_tests = vec![pass("bf16 -> f32")];
        r.matrix.clear();
        r.duplicate_libraries.clear();
        r.hip_build.devices.clear();
        r.hip_build.code_object_version = None;
        r.platform.hip_runtime_version.version = None;
        r.backends = vec![
            BackendReport {
                backend: "host".into(),
                built: true,
                devices: vec![device("host", "cpu", None)],
                error: None,
            },
            BackendReport {
                backend: "hip".into(),
                built: false,
                devices: Vec::new(),
                error: Some("not built".into()),
            },
        ];
        r
    }

    fn hip_backend(r: &mut Report, error: &str) {
        r.features = vec!["hip".into()];
        r.hip_build.code_object_version = Some(5);
        if let Some(b) = r.backends.iter_mut().find(|b| b.backend == "hip") {
            b.built = true;
            b.error = Some(error.into());
        }
    }

    #[test]
    fn a_machine_without_gpu_reads_as_expected_not_as_a_failure() {
        let v = verdict_of(&cpu_machine(), false);
        assert_eq!(v.level, Level::CpuOnly);
        assert_eq!(
            v.line,
            "no GPU here: everything runs on the CPU, as expected"
        );
    }

    #[test]
    fn a_cuda_device_with_passing_self_tests_is_ready() {
        let mut r = cpu_machine();
        r.features = vec!["cuda".into()];
        r.backends.push(BackendReport {
            backend: "cuda".into(),
            built: true,
            devices: vec![device("NVIDIA H100", "sm_90", Some(TestVerdict::Pass))],
            error: None,
        });
        let v = verdict_of(&r, false);
        assert_eq!(v.level, Level::Ready, "{v:?}");
        assert_eq!(
            v.line,
            "NVIDIA H100 (cuda:0, sm_90) found, kernels for it built, self-tests pass: ready"
        );
        // A failing kernel self-test is the thing to report.
        r.backends[2].devices[0].self_test = Some(SelfTest {
            verdict: TestVerdict::Fail,
            ..pass("kernels")
        });
        let v = verdict_of(&r, false);
        assert_eq!(v.level, Level::Fix);
        assert!(v.line.contains("self-test failed on cuda:0"), "{}", v.line);
    }

    #[test]
    fn hip_without_a_device_names_what_is_missing() {
        // The driver is there (/dev/kfd), the runtime is not.
        let mut r = cpu_machine();
        hip_backend(
            &mut r,
            "runtime not available: the HIP runtime not found; tried ...",
        );
        let v = verdict_of(&r, true);
        assert_eq!(v.level, Level::Fix);
        assert!(v.line.contains("no HIP runtime was found"), "{}", v.line);
        // No permission on /dev/kfd: the backend's own advice.
        hip_backend(
            &mut r,
            "no permission to open /dev/kfd: add your user to the render group",
        );
        let v = verdict_of(&r, true);
        assert_eq!(
            v.line,
            "fix: no permission to open /dev/kfd: add your user to the render group"
        );
        // No driver either: nothing to fix, the CPU serves.
        hip_backend(&mut r, "runtime not available: ...");
        assert_eq!(verdict_of(&r, false).level, Level::CpuOnly);
        // An AMD GPU driver but a build without `hip`.
        let v = verdict_of(&cpu_machine(), true);
        assert_eq!(v.level, Level::Fix);
        assert!(v.line.contains("--features hip"), "{}", v.line);
    }

    #[test]
    fn a_hip_runtime_older_than_the_code_objects_is_the_thing_to_fix() {
        let mut r = cpu_machine();
        hip_backend(&mut r, "no device");
        r.platform.hip_runtime_version.version = Some("5.2.21153".into());
        let v = verdict_of(&r, true);
        assert_eq!(v.level, Level::Fix);
        assert!(
            v.line.starts_with(
                "fix: the HIP runtime is 5.2.21153; the kernels need ROCm >= 6 (code object v5)"
            ),
            "{}",
            v.line
        );
        // ROCm 7: no complaint about the version.
        r.platform.hip_runtime_version.version = Some("7.1.25424".into());
        assert!(!verdict_of(&r, true).line.contains("ROCm >= 6"));
    }

    /// An old ROCm library on a machine without an AMD GPU (no /dev/kfd,
    /// no HIP device) that CUDA serves: ready, not "fix" (seen on an H200
    /// machine with ROCm 5.7's libamdhip64.so.5 installed); with no GPU at
    /// all, the CPU serves, as expected.
    #[test]
    fn an_old_hip_runtime_without_an_amd_gpu_is_not_the_thing_to_fix() {
        let mut r = cpu_machine();
        hip_backend(&mut r, "no device");
        r.platform.hip_runtime_version.version = Some("5.7.31921".into());
        assert_eq!(verdict_of(&r, false).level, Level::CpuOnly);
        r.features = vec!["hip".into(), "cuda".into()];
        r.backends.push(BackendReport {
            backend: "cuda".into(),
            built: true,
            devices: vec![device("NVIDIA H200", "sm_90", Some(TestVerdict::Pass))],
            error: None,
        });
        let v = verdict_of(&r, false);
        assert_eq!(v.level, Level::Ready, "{v:?}");
        assert!(
            v.line.starts_with("NVIDIA H200 (cuda:0, sm_90) found"),
            "{}",
            v.line
        );
        // With the amdgpu driver loaded, the old runtime is the thing to fix.
        assert_eq!(verdict_of(&r, true).level, Level::Fix);
    }

    #[test]
    fn a_device_without_kernels_gets_the_rebuild_command_for_its_arch_only() {
        let mut r = cpu_machine();
        hip_backend(&mut r, "");
        r.platform.hip_runtime_version.version = Some("7.1.25424".into());
        r.hip_build.devices = vec![HipDeviceBuild {
            ordinal: 0,
            arch: "gfx1151".into(),
            built: false,
        }];
        let v = verdict_of(&r, true);
        assert_eq!(v.level, Level::Fix);
        assert!(
            v.line
                .contains("ROCM_SAFE_OFFLOAD_ARCH=gfx1151 cargo run --release --features hip"),
            "{}",
            v.line
        );
        assert!(!v.line.contains("gfx1100"));
    }

    #[test]
    fn failures_and_duplicates_come_first() {
        let mut r = cpu_machine();
        r.duplicate_libraries = vec![DuplicateLibrary {
            library: "cudnn".into(),
            files: vec!["/a/libcudnn.so.9".into(), "/b/libcudnn.so.9.14.0".into()],
            warning: "the vendor tier is refused".into(),
        }];
        let v = verdict_of(&r, false);
        assert_eq!(v.level, Level::Fix);
        assert!(
            v.line.contains("cudnn is loaded from 2 files"),
            "{}",
            v.line
        );
        r.self_tests[0].verdict = TestVerdict::Fail;
        let v = verdict_of(&r, false);
        assert_eq!(v.level, Level::Failed);
        assert!(
            v.line.starts_with("FAILED: the CPU self-test"),
            "{}",
            v.line
        );
    }
}
