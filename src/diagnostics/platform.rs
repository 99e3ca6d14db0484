//! Platform facts: OS, kernel, CPU, memory, which GPU runtime libraries the
//! dynamic loader can find (and the version their file names carry), and
//! the versions the runtimes report. Everything but the runtime versions is
//! read from `/proc`, `/etc` and the loader; the versions need the `hip` /
//! `cuda` feature and are "unknown (reason)" otherwise. Nothing here needs
//! a GPU, and nothing fails: what cannot be read is `None` or unknown.

/// What the machine is, as far as rocm-safe cares.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Platform {
    /// Operating system (`PRETTY_NAME` of /etc/os-release, else the target OS).
    pub os: String,
    /// Kernel release (`/proc/sys/kernel/osrelease`), if readable.
    pub kernel: Option<String>,
    /// CPU model name (`/proc/cpuinfo`), if readable.
    pub cpu: Option<String>,
    /// Logical cores this process may use.
    pub cores: usize,
    /// Total memory in bytes (`MemTotal`), if readable.
    pub memory_total_bytes: Option<u64>,
    /// Available memory in bytes (`MemAvailable`), if readable.
    pub memory_available_bytes: Option<u64>,
    /// The HIP runtime library (libamdhip64: `.so.7`, `.so.6`, `.so.5`, `.so`),
    /// the one in the process if any, else the loader's.
    pub hip_runtime: Option<Library>,
    /// The CUDA driver library (libcuda), if the loader finds it.
    pub cuda_driver: Option<Library>,
    /// The NVRTC library, if the loader finds it.
    pub nvrtc: Option<Library>,
    /// `hipRuntimeGetVersion`, decoded (`"5.2.21153"`); unknown without
    /// the `hip` feature.
    pub hip_runtime_version: RuntimeVersion,
    /// `hipDriverGetVersion` (on AMD the ROCclr platform build number times
    /// 100 plus the revision, shown as the raw number); asked only when a
    /// HIP device is present, since HIP 5.x reads device 0 unchecked.
    pub hip_driver_version: RuntimeVersion,
    /// `cuDriverGetVersion`, decoded (`"12.4"`); unknown without the `cuda`
    /// feature or without libcuda.
    pub cuda_driver_version: RuntimeVersion,
}

/// A shared library the dynamic loader could open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Library {
    /// The soname that was opened (`libamdhip64.so.5`, ...).
    pub soname: String,
    /// The file it resolved to, if the loader reports it.
    pub path: Option<String>,
    /// `path` with every symbolic link resolved
    /// (`/opt/rocm-6.2.0/lib/libamdhip64.so.6.2.60200`), if it exists.
    pub real_path: Option<String>,
    /// The version in the real file's name after `.so.` (`"6.2.60200"`),
    /// else in the soname (`"1"` of `libcuda.so.1`); `None` when neither
    /// carries one.
    pub file_version: Option<String>,
}

/// A runtime's version as it reports it, or why it is unknown.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct RuntimeVersion {
    /// The version as text (`"5.2.21153"`, `"12.4"`), `None` when unknown.
    pub version: Option<String>,
    /// The integer the runtime returned, `None` when unknown.
    pub raw: Option<i64>,
    /// Why the version is unknown (`"not built: ..."`, `"no device"`, the
    /// runtime's error); `None` when known.
    pub unknown_reason: Option<String>,
}

impl RuntimeVersion {
    /// A known version.
    pub fn known(raw: i64, version: String) -> RuntimeVersion {
        RuntimeVersion {
            version: Some(version),
            raw: Some(raw),
            unknown_reason: None,
        }
    }

    /// An unknown version and why.
    pub fn unknown(reason: impl Into<String>) -> RuntimeVersion {
        RuntimeVersion {
            version: None,
            raw: None,
            unknown_reason: Some(reason.into()),
        }
    }
}

impl std::fmt::Display for RuntimeVersion {
    /// The version, or `unknown (reason)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.version, &self.unknown_reason) {
            (Some(v), _) => f.write_str(v),
            (None, Some(r)) => write!(f, "unknown ({r})"),
            (None, None) => f.write_str("unknown"),
        }
    }
}

/// `hipRuntimeGetVersion` / `hipDriverGetVersion`, each known or the reason.
#[cfg(feature = "hip")]
fn hip_versions() -> (RuntimeVersion, RuntimeVersion) {
    use crate::device::runtime::hip;
    let runtime = match hip::runtime_version() {
        Ok((raw, v)) => RuntimeVersion::known(i64::from(raw), v),
        Err(e) => RuntimeVersion::unknown(e.to_string()),
    };
    let driver = match hip::driver_version() {
        Ok(raw) => RuntimeVersion::known(i64::from(raw), raw.to_string()),
        Err(e) => RuntimeVersion::unknown(e.to_string()),
    };
    (runtime, driver)
}

/// `hipRuntimeGetVersion` / `hipDriverGetVersion`, each known or the reason.
#[cfg(not(feature = "hip"))]
fn hip_versions() -> (RuntimeVersion, RuntimeVersion) {
    let why = "not built: cargo feature `hip` is off";
    (RuntimeVersion::unknown(why), RuntimeVersion::unknown(why))
}

/// `cuDriverGetVersion`, known or the reason.
#[cfg(feature = "cuda")]
fn cuda_version() -> RuntimeVersion {
    match crate::device::runtime::cuda::driver_version() {
        Ok((raw, v)) => RuntimeVersion::known(i64::from(raw), v),
        Err(e) => RuntimeVersion::unknown(e.to_string()),
    }
}

/// `cuDriverGetVersion`, known or the reason.
#[cfg(not(feature = "cuda"))]
fn cuda_version() -> RuntimeVersion {
    RuntimeVersion::unknown("not built: cargo feature `cuda` is off")
}

/// The version a shared library's file name carries after `.so.`
/// (`libamdhip64.so.6.2.60200` -> `6.2.60200`); `None` without one.
pub fn so_version(file_name: &str) -> Option<String> {
    let (_, v) = file_name.split_once(".so.")?;
    let ok = !v.is_empty()
        && v.split('.')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    ok.then(|| v.to_owned())
}

impl Platform {
    /// Reads the platform facts. Never fails: what cannot be read is `None`.
    pub fn detect() -> Platform {
        // The backends choose their runtime files first (a copy already in
        // the process, their folders), so that the loader-path lookups
        // below find those and never load another.
        #[cfg(feature = "hip")]
        let _ = crate::device::runtime::hip::runtime_library();
        #[cfg(feature = "cuda")]
        let _ = crate::device::runtime::vendor::nvrtc::library();
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let (hip_runtime_version, hip_driver_version) = hip_versions();
        Platform {
            os: os_name(),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            cpu: cpu_model(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_total_bytes: meminfo_field(&meminfo, "MemTotal:"),
            memory_available_bytes: meminfo_field(&meminfo, "MemAvailable:"),
            hip_runtime: find_library(
                "libamdhip64.so",
                &[
                    "libamdhip64.so.7",
                    "libamdhip64.so.6",
                    "libamdhip64.so.5",
                    "libamdhip64.so",
                ],
            ),
            cuda_driver: find_library("libcuda.so", &["libcuda.so.1", "libcuda.so"]),
            nvrtc: find_library(
                "libnvrtc.so",
                &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            ),
            hip_runtime_version,
            hip_driver_version,
            cuda_driver_version: cuda_version(),
        }
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn os_name() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_owned())
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

pub(crate) use crate::device::runtime::host::meminfo_field;

/// Finds the library of `sonames` (newest first) the way the backends open
/// it ([`crate::device::dynlib`]): a copy already in the process first (by
/// soname, then any mapped file whose name starts with `stem`), else the
/// loader path; and reports where it resolved. So the doctor never maps a
/// second copy beside one the process (PyTorch) already holds. A library
/// opened here is **never closed**: NVRTC (CUDA 13) aborts the process when
/// it is loaded a second time after being unloaded (its LLVM registers its
/// command-line options again: "Option 'disassemble' registered more than
/// once"), seen when `Platform::detect` ran twice in one process. The
/// backends load the same libraries anyway.
fn find_library(stem: &'static str, sonames: &[&'static str]) -> Option<Library> {
    let spec = crate::device::dynlib::Spec {
        what: stem,
        sonames: sonames.to_vec(),
        stem,
        ..Default::default()
    };
    let lib = crate::device::dynlib::open(&spec).ok()?;
    let path = lib.path().map(|p| p.to_string_lossy().into_owned());
    let opened_as = match lib.found_by() {
        crate::device::dynlib::FoundBy::InProcess(s)
        | crate::device::dynlib::FoundBy::LoaderPath(s) => s.clone(),
        _ => lib
            .path()
            .and_then(|p| p.file_name())
            .map_or_else(|| stem.to_owned(), |f| f.to_string_lossy().into_owned()),
    };
    let real_path = path
        .as_ref()
        .and_then(|p| std::fs::canonicalize(p).ok())
        .map(|p| p.to_string_lossy().into_owned());
    let file_version = real_path
        .as_deref()
        .and_then(|p| std::path::Path::new(p).file_name())
        .and_then(|f| so_version(&f.to_string_lossy()))
        .or_else(|| so_version(&opened_as));
    Some(Library {
        soname: opened_as,
        path,
        real_path,
        file_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parsing() {
        let m = "MemTotal:       24576000 kB\nMemAvailable:    1000 kB\nBad: x kB\n";
        assert_eq!(meminfo_field(m, "MemTotal:"), Some(24_576_000 * 1024));
        assert_eq!(meminfo_field(m, "MemAvailable:"), Some(1_024_000));
        assert_eq!(meminfo_field(m, "Bad:"), None);
        assert_eq!(meminfo_field(m, "Missing:"), None);
    }

    #[test]
    fn detect_reads_this_machine() {
        let p = Platform::detect();
        assert!(p.cores >= 1);
        assert!(!p.os.is_empty());
        if cfg!(target_os = "linux") {
            assert!(p.memory_total_bytes.unwrap_or(0) > 0);
            assert!(p.kernel.is_some());
        }
    }

    #[test]
    fn detect_twice_in_one_process_finds_the_same_libraries() {
        // On a CUDA 13 machine the second NVRTC load used to abort the
        // process (the library was closed and loaded again).
        let a = Platform::detect();
        let b = Platform::detect();
        assert_eq!(a.nvrtc, b.nvrtc);
        assert_eq!(a.cuda_driver, b.cuda_driver);
        assert_eq!(a.hip_runtime, b.hip_runtime);
    }

    #[test]
    fn loader_finds_libc_and_not_nonsense() {
        let libc = find_library("libc.so", &["libc.so.6"]).expect("libc is loadable");
        assert_eq!(libc.soname, "libc.so.6");
        if cfg!(target_os = "linux") {
            assert!(libc.path.as_deref().unwrap_or("").contains("libc"));
        }
        assert_eq!(
            find_library(
                "librocm-safe-does-not-exist.so",
                &["librocm-safe-does-not-exist.so"]
            ),
            None
        );
        // libc.so.6 resolves to a real file whose name, or else the soname,
        // carries a version.
        assert!(libc.file_version.is_some(), "{libc:?}");
    }

    #[test]
    fn versions_in_library_file_names() {
        assert_eq!(
            so_version("libamdhip64.so.6.2.60200").as_deref(),
            Some("6.2.60200")
        );
        assert_eq!(so_version("libcuda.so.1").as_deref(), Some("1"));
        assert_eq!(
            so_version("libcuda.so.550.54.14").as_deref(),
            Some("550.54.14")
        );
        assert_eq!(so_version("libamdhip64.so"), None);
        assert_eq!(so_version("libx.so.1.rc2"), None);
        assert_eq!(so_version("libx.so."), None);
        assert_eq!(so_version("libx.so.1..2"), None);
    }

    #[test]
    fn runtime_versions_are_known_or_say_why() {
        let p = Platform::detect();
        for v in [
            &p.hip_runtime_version,
            &p.hip_driver_version,
            &p.cuda_driver_version,
        ] {
            assert_eq!(v.version.is_some(), v.raw.is_some(), "{v:?}");
            assert_eq!(v.version.is_none(), v.unknown_reason.is_some(), "{v:?}");
            let shown = v.to_string();
            assert!(
                v.version.is_some() || shown.starts_with("unknown ("),
                "{shown}"
            );
        }
        if !cfg!(feature = "hip") {
            assert!(p.hip_runtime_version.to_string().contains("not built"));
        }
        if !cfg!(feature = "cuda") {
            assert!(p.cuda_driver_version.to_string().contains("not built"));
        }
        let u = RuntimeVersion::unknown("no device");
        assert_eq!(u.to_string(), "unknown (no device)");
        assert_eq!(
            RuntimeVersion::known(12040, "12.4".into()).to_string(),
            "12.4"
        );
    }
}
