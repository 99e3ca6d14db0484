//! The runtime and vendor library files this process actually uses (path,
//! version, how each was found), and the libraries it maps more than once.
//!
//! Two copies of one GPU library in a process do not mix: a `hipStream_t`
//! of one HIP runtime is an invalid handle (or a crash) in the other, and a
//! second cuDNN fails every call with
//! `CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH`. rocm-safe opens each library
//! so that a copy already in the process is the one used; the doctor
//! checks `/proc/self/maps` after its own work to show that it held.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One runtime or vendor library as this process uses it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct RuntimeFile {
    /// `"hip_runtime"`, `"cuda_driver"`, `"cudnn"`, `"nvrtc"`, `"miopen"`.
    pub library: String,
    /// Whether it is loaded (and bound) in this process.
    pub loaded: bool,
    /// The file in use, as the loader recorded it.
    pub path: Option<String>,
    /// `path` with symbolic links resolved (`libcudnn.so.9.19.0`).
    pub real_path: Option<String>,
    /// The version the library reports (`hipRuntimeGetVersion`,
    /// `cuDriverGetVersion`, `cudnnGetVersion`, `nvrtcVersion`,
    /// `miopenGetVersion`), if known.
    pub version: Option<String>,
    /// How it was found (`"already loaded in this process
    /// (libcudnn.so.9)"`, `"$ROCM_PATH/lib"`, `"the loader path
    /// (libnvrtc.so.13)"`).
    pub found_by: Option<String>,
    /// Why it is not loaded (not built, every place tried, a refusal).
    pub error: Option<String>,
}

impl RuntimeFile {
    /// A library in use.
    #[cfg(any(feature = "cuda", feature = "hip"))]
    fn in_use(
        library: &str,
        path: Option<&Path>,
        version: Option<String>,
        found_by: String,
    ) -> RuntimeFile {
        RuntimeFile {
            library: library.to_owned(),
            loaded: true,
            path: path.map(|p| p.display().to_string()),
            real_path: path
                .and_then(|p| std::fs::canonicalize(p).ok())
                .map(|p| p.display().to_string()),
            version,
            found_by: Some(found_by),
            error: None,
        }
    }

    /// A library not in use, and why.
    fn absent(library: &str, why: impl Into<String>) -> RuntimeFile {
        RuntimeFile {
            library: library.to_owned(),
            loaded: false,
            path: None,
            real_path: None,
            version: None,
            found_by: None,
            error: Some(why.into()),
        }
    }

    #[cfg(any(feature = "cuda", feature = "hip"))]
    fn from_vendor(
        library: &str,
        r: std::result::Result<crate::device::runtime::vendor::libs::Loaded, String>,
    ) -> RuntimeFile {
        match r {
            Ok(l) => Self::in_use(
                library,
                l.path.as_deref(),
                l.version,
                l.found_by.to_string(),
            ),
            Err(why) => Self::absent(library, why),
        }
    }
}

/// The libraries whose copies the doctor counts: report name and the start
/// of their file names.
pub const WATCHED_LIBRARIES: [(&str, &str); 5] = [
    ("hip_runtime", "libamdhip64.so"),
    ("cuda_driver", "libcuda.so"),
    ("cudnn", "libcudnn.so"),
    ("nvrtc", "libnvrtc.so"),
    ("miopen", "libMIOpen.so"),
];

/// A library mapped from more than one file in this process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct DuplicateLibrary {
    /// The library (`"cudnn"`), as in `WATCHED_LIBRARIES`.
    pub library: String,
    /// The distinct files mapped, in the order of `/proc/self/maps`.
    pub files: Vec<String>,
    /// What it means.
    pub warning: String,
}

/// The libraries of `WATCHED_LIBRARIES` that the `/proc/<pid>/maps` text
/// `maps` shows from more than one file. Files are told apart by identity
/// (device and inode, from `identity`; a path it cannot identify counts as
/// a file of its own), so a symbolic link and its target are one copy.
pub fn duplicates_in(
    maps: &str,
    identity: &dyn Fn(&Path) -> Option<(u64, u64)>,
) -> Vec<DuplicateLibrary> {
    let mut out = Vec::new();
    for (library, stem) in WATCHED_LIBRARIES {
        let mut seen: Vec<(u64, u64)> = Vec::new();
        let mut files: Vec<PathBuf> = Vec::new();
        for p in crate::device::dynlib::parse_maps(maps, stem) {
            if let Some(id) = identity(&p) {
                if seen.contains(&id) {
                    continue;
                }
                seen.push(id);
            }
            files.push(p);
        }
        if files.len() > 1 {
            out.push(DuplicateLibrary {
                library: library.to_owned(),
                warning: duplicate_warning(library, files.len()),
                files: files.iter().map(|p| p.display().to_string()).collect(),
            });
        }
    }
    out
}

/// What `n` copies of `library` in one process mean.
fn duplicate_warning(library: &str, n: usize) -> String {
    let consequence = match library {
        "hip_runtime" => {
            "streams, events and memory of one runtime are invalid handles (or a crash) in \
             the other; use the runtime the framework loaded (set ROCM_SAFE_HIP_RUNTIME to \
             its file)"
        }
        "cudnn" => {
            "each copy's sub-libraries resolve to the other's and calls fail with \
             CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH; use the framework's cuDNN (set \
             ROCM_SAFE_CUDNN to its file)"
        }
        "nvrtc" => {
            "two compilers with their own state and builtins in one process; use the \
             framework's NVRTC (set ROCM_SAFE_NVRTC to its file)"
        }
        "miopen" => {
            "each MIOpen uses the HIP runtime of its own ROCm; use the framework's MIOpen \
             (set ROCM_SAFE_MIOPEN to its file)"
        }
        _ => "two driver libraries in one process: only one can talk to the kernel driver",
    };
    format!("{n} copies of {library} are mapped in this process: {consequence}")
}

/// [`duplicates_in`] of this process's `/proc/self/maps` (empty when it
/// cannot be read).
pub fn duplicate_libraries() -> Vec<DuplicateLibrary> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    duplicates_in(&maps, &|p| {
        std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
    })
}

/// The HIP runtime in use (opening it if need be).
#[cfg(feature = "hip")]
fn hip_runtime() -> RuntimeFile {
    match crate::device::runtime::hip::runtime_file() {
        Ok(f) => {
            let mut r = RuntimeFile::in_use(
                "hip_runtime",
                f.path.as_deref(),
                f.version.as_ref().ok().map(|(_, v)| v.clone()),
                f.found_by,
            );
            if let Err(why) = f.version {
                r.error = Some(why);
            }
            r
        }
        Err(e) => RuntimeFile::absent("hip_runtime", e.to_string()),
    }
}

#[cfg(not(feature = "hip"))]
fn hip_runtime() -> RuntimeFile {
    RuntimeFile::absent("hip_runtime", "not built: cargo feature `hip` is off")
}

/// MIOpen, asked for only when a HIP runtime is loaded (MIOpen needs one).
#[cfg(feature = "hip")]
fn miopen(hip: &RuntimeFile) -> RuntimeFile {
    if !hip.loaded {
        return RuntimeFile::absent("miopen", "no HIP runtime loaded");
    }
    RuntimeFile::from_vendor("miopen", crate::device::runtime::vendor::miopen::loaded())
}

#[cfg(not(feature = "hip"))]
fn miopen(_hip: &RuntimeFile) -> RuntimeFile {
    RuntimeFile::absent("miopen", "not built: cargo feature `hip` is off")
}

/// libcuda (loaded by cudarc on the loader path: one file per system), its
/// version, and cuDNN and NVRTC.
#[cfg(feature = "cuda")]
fn cuda_libraries() -> [RuntimeFile; 3] {
    let driver = match crate::device::runtime::cuda::driver_version() {
        Ok((_, v)) => {
            let path = crate::device::dynlib::mapped("libcuda.so")
                .into_iter()
                .next();
            RuntimeFile::in_use(
                "cuda_driver",
                path.as_deref(),
                Some(v),
                "the loader path (cudarc)".to_owned(),
            )
        }
        Err(e) => RuntimeFile::absent("cuda_driver", e.to_string()),
    };
    [
        driver,
        RuntimeFile::from_vendor("cudnn", crate::device::runtime::vendor::cudnn::loaded()),
        RuntimeFile::from_vendor("nvrtc", crate::device::runtime::vendor::nvrtc::loaded()),
    ]
}

#[cfg(not(feature = "cuda"))]
fn cuda_libraries() -> [RuntimeFile; 3] {
    let why = "not built: cargo feature `cuda` is off";
    [
        RuntimeFile::absent("cuda_driver", why),
        RuntimeFile::absent("cudnn", why),
        RuntimeFile::absent("nvrtc", why),
    ]
}

/// Every runtime and vendor library of this build, in use or why not
/// (opening those not yet opened, the way the backends do: a copy already
/// in the process first). In the order of `WATCHED_LIBRARIES`.
pub fn runtime_files() -> Vec<RuntimeFile> {
    let hip = hip_runtime();
    let miopen = miopen(&hip);
    let [driver, cudnn, nvrtc] = cuda_libraries();
    vec![hip, driver, cudnn, nvrtc, miopen]
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
7f00-7f01 r--p 00000000 08:01 1 /venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9
7f01-7f02 r--p 00000000 08:01 2 /venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn_ops.so.9
7f02-7f03 r--p 00000000 08:01 3 /usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0
7f03-7f04 r--p 00000000 08:01 4 /venv/lib/python3.12/site-packages/nvidia/cu13/lib/libnvrtc.so.13
7f04-7f05 r--p 00000000 08:01 5 /usr/local/cuda-13.0/lib64/libnvrtc.so.13.0.88
7f05-7f06 r--p 00000000 08:01 6 /usr/local/cuda-13.0/lib64/libnvrtc-builtins.so.13.0
7f06-7f07 r--p 00000000 08:01 7 /usr/lib/x86_64-linux-gnu/libcuda.so.580.65
7f07-7f08 r--p 00000000 08:01 8 /opt/rocm/lib/libamdhip64.so.7
7f08-7f09 r--p 00000000 08:01 8 /opt/rocm/lib/libamdhip64.so.7.1.25424
";

    /// Identities from the maps' inode column, as the kernel gives them.
    fn by_inode(maps: &str) -> impl Fn(&Path) -> Option<(u64, u64)> + '_ {
        move |p: &Path| {
            maps.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(5).map(Path::new) == Some(p)).then(|| (1, f[4].parse().unwrap_or(0)))
            })
        }
    }

    #[test]
    fn the_measured_pytorch_process_shows_two_cudnn_and_two_nvrtc() {
        let d = duplicates_in(MAPS, &by_inode(MAPS));
        let names: Vec<&str> = d.iter().map(|x| x.library.as_str()).collect();
        assert_eq!(names, ["cudnn", "nvrtc"], "{d:?}");
        assert_eq!(
            d[0].files,
            [
                "/venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9",
                "/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"
            ]
        );
        assert!(
            d[0].warning.contains("SUBLIBRARY_VERSION_MISMATCH"),
            "{d:?}"
        );
        assert!(d[0].warning.starts_with("2 copies of cudnn"), "{d:?}");
        // The builtins are not a second NVRTC; one HIP runtime file under
        // two names (a link and its target, one inode) is one copy.
        assert_eq!(d[1].files.len(), 2);
        assert!(d[1].files.iter().all(|f| !f.contains("builtins")));
    }

    #[test]
    fn two_hip_runtimes_are_warned_and_linked_names_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("libamdhip64.so.7.1.25424");
        let b = dir.path().join("libamdhip64.so.6.4.60400");
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let link = dir.path().join("libamdhip64.so.7");
        std::os::unix::fs::symlink(&a, &link).unwrap();
        let line = |p: &Path| format!("7f00-7f01 r--p 00000000 08:01 1 {}\n", p.display());
        let real = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()));
        let one = format!("{}{}", line(&link), line(&a));
        assert!(duplicates_in(&one, &real).is_empty());
        let two = format!("{}{}", line(&a), line(&b));
        let d = duplicates_in(&two, &real);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].library, "hip_runtime");
        assert!(d[0].warning.contains("ROCM_SAFE_HIP_RUNTIME"), "{d:?}");
        for lib in ["miopen", "nvrtc", "cuda_driver"] {
            assert!(duplicate_warning(lib, 2).starts_with(&format!("2 copies of {lib}")));
        }
    }

    #[test]
    fn this_process_has_no_duplicates_and_every_library_says_where_or_why() {
        let files = runtime_files();
        let names: Vec<&str> = files.iter().map(|f| f.library.as_str()).collect();
        assert_eq!(names, WATCHED_LIBRARIES.map(|(n, _)| n));
        for f in &files {
            if f.loaded {
                assert!(f.found_by.is_some(), "{f:?}");
            } else {
                assert!(!f.error.as_deref().unwrap_or("").is_empty(), "{f:?}");
                assert!(f.path.is_none() && f.version.is_none(), "{f:?}");
            }
        }
        if !cfg!(feature = "cuda") {
            assert!(files[2]
                .error
                .as_deref()
                .unwrap_or("")
                .contains("not built"));
        }
        assert!(
            duplicate_libraries().is_empty(),
            "{:?}",
            duplicate_libraries()
        );
    }
}
