//! Where each vendor library is looked for ([`dynlib::Spec`]s), the binding
//! of its functions ([`bind_fn`]), and what the doctor reports about the
//! copy in use ([`Loaded`]). Compiled in every build: the doctor asks about
//! libraries whatever the features, and the specs are plain data.
// Each backend uses its own part (MIOpen's with `hip`, cuDNN's and NVRTC's
// with `cuda`); the unit tests use all of it.
#![cfg_attr(not(all(feature = "hip", feature = "cuda")), allow(dead_code))]

use std::ffi::{c_void, CStr};
use std::path::{Path, PathBuf};

#[cfg(feature = "doctor")]
use crate::device::dynlib::FoundBy;
use crate::device::dynlib::{self, Spec};

/// A vendor library as loaded in this process: what the doctor shows.
#[cfg(feature = "doctor")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Loaded {
    /// The file the loader mapped, if it says.
    pub path: Option<PathBuf>,
    /// How it was found (`already loaded in this process (libcudnn.so.9)`).
    pub found_by: FoundBy,
    /// The version the library reports (`cudnnGetVersion`, `nvrtcVersion`,
    /// `miopenGetVersion`), if it does.
    pub version: Option<String>,
}

#[cfg(feature = "doctor")]
impl Loaded {
    /// The record of `lib` with `version`.
    pub(crate) fn of(lib: &dynlib::Lib, version: Option<String>) -> Loaded {
        Loaded {
            path: lib.path().map(Path::to_path_buf),
            found_by: lib.found_by().clone(),
            version,
        }
    }
}

/// The address of `name` in `lib` as a function pointer of type `F`, or
/// the symbol's name when `lib` does not export it.
///
/// # Safety
/// `F` is an `unsafe extern "C" fn` type whose signature is the C
/// signature of the function `name` exports, and `lib` is never closed
/// (no [`dynlib::Lib`] is).
pub(crate) unsafe fn bind_fn<F: Copy>(
    lib: &dynlib::Lib,
    name: &'static CStr,
) -> Result<F, &'static str> {
    const {
        assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>());
    }
    let Some(p) = lib.symbol(name) else {
        return Err(name.to_str().unwrap_or("(a symbol with a non-UTF-8 name)"));
    };
    let raw: *mut c_void = p.as_ptr();
    // SAFETY: `F` is a function pointer type of the symbol's C signature
    // (caller), of the size of a data pointer (asserted above), and the
    // library stays loaded for the life of the process.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&raw) })
}

/// `(folder, label)` for each of `vars` that is set and not empty, joined
/// with `sub` (`$CUDA_HOME/lib64`).
fn env_folders(vars: &[&str], sub: &str) -> Vec<(PathBuf, String)> {
    vars.iter()
        .filter_map(|v| {
            let value = std::env::var_os(v).filter(|x| !x.is_empty())?;
            Some((PathBuf::from(value).join(sub), format!("${v}/{sub}")))
        })
        .collect()
}

/// The CUDA toolkit's library folders named by `$CUDA_HOME` and
/// `$CUDA_PATH` (`lib64`), looked in before the loader path.
fn cuda_folders() -> Vec<(PathBuf, String)> {
    env_folders(&["CUDA_HOME", "CUDA_PATH"], "lib64")
}

/// The default CUDA toolkit's `lib64`, looked in after the loader path.
fn cuda_fallback() -> Vec<(PathBuf, String)> {
    vec![(
        PathBuf::from("/usr/local/cuda/lib64"),
        "/usr/local/cuda/lib64".into(),
    )]
}

/// The environment variable naming the cuDNN library (a file or a folder).
pub(crate) const CUDNN_VAR: &str = "ROCM_SAFE_CUDNN";
/// The environment variable naming the NVRTC library (a file or a folder).
pub(crate) const NVRTC_VAR: &str = "ROCM_SAFE_NVRTC";
/// The environment variable naming the MIOpen library (a file or a folder).
pub(crate) const MIOPEN_VAR: &str = "ROCM_SAFE_MIOPEN";

/// cuDNN 9: the bindings use cuDNN 9's status codes (cuDNN 8 numbers them
/// differently), so only `libcudnn.so.9` is asked for by soname; the
/// unversioned development link comes last and its version is checked
/// after loading.
pub(crate) fn cudnn_spec() -> Spec {
    Spec {
        what: "cuDNN (libcudnn)",
        sonames: vec!["libcudnn.so.9", "libcudnn.so"],
        stem: "libcudnn.so",
        env_var: Some(CUDNN_VAR),
        folders: cuda_folders(),
        later_folders: cuda_fallback(),
    }
}

/// NVRTC: CUDA 13's soname, CUDA 12's, then the unversioned link. NVRTC
/// loads its builtins (`libnvrtc-builtins`) itself.
pub(crate) fn nvrtc_spec() -> Spec {
    Spec {
        what: "NVRTC (libnvrtc)",
        sonames: vec!["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
        stem: "libnvrtc.so",
        env_var: Some(NVRTC_VAR),
        folders: cuda_folders(),
        later_folders: cuda_fallback(),
    }
}

/// MIOpen: the folder of the HIP runtime in use first (`hip_runtime`, the
/// runtime's file), so that MIOpen comes from the same ROCm; then
/// `$ROCM_PATH/lib` and `$HIP_PATH/lib`, the loader path, and
/// `/opt/rocm/lib` last.
pub(crate) fn miopen_spec(hip_runtime: Option<&Path>) -> Spec {
    let mut folders = Vec::new();
    if let Some(dir) = hip_runtime.and_then(Path::parent) {
        folders.push((dir.to_path_buf(), "the HIP runtime's folder".to_owned()));
    }
    folders.extend(env_folders(&["ROCM_PATH", "HIP_PATH"], "lib"));
    Spec {
        what: "MIOpen (libMIOpen)",
        sonames: vec!["libMIOpen.so.1", "libMIOpen.so"],
        stem: "libMIOpen.so",
        env_var: Some(MIOPEN_VAR),
        folders,
        later_folders: vec![(PathBuf::from("/opt/rocm/lib"), "/opt/rocm/lib".into())],
    }
}

/// The start of the HIP runtime's file names.
pub(crate) const HIP_RUNTIME_STEM: &str = "libamdhip64.so";

/// The file of the HIP runtime this process uses, if one is loaded: the
/// first `libamdhip64` in `/proc/self/maps` (the HIP backend loads one and
/// never a second; [`hip_runtime_copies`] tells when something else did).
pub(crate) fn hip_runtime_path() -> Option<PathBuf> {
    dynlib::mapped(HIP_RUNTIME_STEM).into_iter().next()
}

/// The distinct HIP runtime files mapped in this process.
pub(crate) fn hip_runtime_copies() -> Vec<PathBuf> {
    dynlib::mapped_copies(HIP_RUNTIME_STEM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_ask_for_the_supported_sonames_newest_first() {
        let c = cudnn_spec();
        assert_eq!(c.sonames, ["libcudnn.so.9", "libcudnn.so"]);
        assert_eq!(c.stem, "libcudnn.so");
        assert_eq!(c.env_var, Some(CUDNN_VAR));
        let n = nvrtc_spec();
        assert_eq!(
            n.sonames,
            ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"]
        );
        // The builtins library is not NVRTC ("libnvrtc-builtins.so.13.0").
        assert!(!"libnvrtc-builtins.so.13.0".starts_with(n.stem));
        assert!(!"libcudnn_ops.so.9".starts_with(c.stem));
        assert!(n
            .later_folders
            .iter()
            .any(|(p, _)| p == Path::new("/usr/local/cuda/lib64")));
    }

    #[test]
    fn miopen_is_looked_for_beside_the_hip_runtime_first() {
        let s = miopen_spec(Some(Path::new(
            "/opt/venv/_rocm_sdk_core/lib/libamdhip64.so.7",
        )));
        assert_eq!(
            s.folders[0],
            (
                PathBuf::from("/opt/venv/_rocm_sdk_core/lib"),
                "the HIP runtime's folder".to_owned()
            )
        );
        assert_eq!(
            s.later_folders.last().map(|f| f.0.clone()),
            Some(PathBuf::from("/opt/rocm/lib"))
        );
        let none = miopen_spec(None);
        assert!(none.folders.iter().all(|(_, l)| !l.contains("HIP runtime")));
        assert_eq!(none.sonames, ["libMIOpen.so.1", "libMIOpen.so"]);
    }

    #[test]
    fn binding_reports_a_missing_symbol_by_name() {
        let spec = Spec {
            what: "the C library",
            sonames: vec!["libc.so.6"],
            stem: "libc.so",
            ..Spec::default()
        };
        let lib = dynlib::open(&spec).map_err(|e| e.to_string());
        let Ok(lib) = lib else {
            panic!("libc: {lib:?}");
        };
        type Strlen = unsafe extern "C" fn(*const std::ffi::c_char) -> usize;
        // SAFETY: strlen's C signature is `size_t strlen(const char *)`.
        let f = unsafe { bind_fn::<Strlen>(&lib, c"strlen") };
        let Ok(strlen) = f else {
            panic!("strlen: {f:?}");
        };
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { strlen(c"four".as_ptr()) }, 4);
        // SAFETY: never called.
        let missing = unsafe { bind_fn::<Strlen>(&lib, c"rocm_safe_absent_fn") };
        assert_eq!(missing.err(), Some("rocm_safe_absent_fn"));
        let info = Loaded::of(&lib, None);
        assert_eq!(info.found_by, FoundBy::InProcess("libc.so.6".into()));
        assert!(info.path.is_some());
    }
}
