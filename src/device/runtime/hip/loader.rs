//! Finding and opening the HIP runtime (`libamdhip64`) at run time, once
//! per process, and binding its functions (`sys::Api`).
//!
//! The places, in order (the first that loads wins; `spec()` builds the
//! list, `dynlib::open` walks it):
//!
//! 1. a runtime **already in the process** (`libamdhip64.so.7`, `.so.6`,
//!    `.so.5`, `.so` by soname with `RTLD_NOLOAD`, then any mapped
//!    `libamdhip64.so*` file): after `import torch` on ROCm, PyTorch's own;
//! 2. `$ROCM_SAFE_HIP_RUNTIME`: the library file, or a folder holding it;
//! 3. `$ROCM_PATH/lib`, then `$HIP_PATH/lib`;
//! 4. the loader path (`LD_LIBRARY_PATH`, `ld.so.cache`);
//! 5. `/opt/rocm/lib`;
//! 6. the TheRock pip SDK's library folder, `<site-packages>/_rocm_sdk_core/lib`
//!    (package `rocm-sdk-core`), for each site-packages folder found
//!    without running Python (`site_packages()`).
//!
//! In each folder the newest major comes first: `.so.7`, `.so.6`, `.so.5`,
//! then the unversioned `.so`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::sys::Api;
use crate::device::dynlib::{self, FoundBy, Lib, NotFound, Spec};
use crate::error::{Error, Result};

/// The variable naming the runtime file (or a folder holding it).
pub const RUNTIME_VAR: &str = "ROCM_SAFE_HIP_RUNTIME";

/// The sonames, newest major first.
const SONAMES: [&str; 4] = [
    "libamdhip64.so.7",
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
];

/// The loaded runtime: the library and its bound functions.
#[derive(Debug)]
pub(crate) struct Loaded {
    pub(crate) lib: Lib,
    pub(crate) api: Api,
}

static LOADED: OnceLock<std::result::Result<Loaded, NotFound>> = OnceLock::new();

/// The runtime, opened on the first call (never unloaded); the same for
/// every later call of the process.
///
/// Errors: [`Error::RuntimeNotFound`] listing every place tried (or the
/// file that loaded but lacks a function).
pub(crate) fn loaded() -> Result<&'static Loaded> {
    LOADED
        .get_or_init(|| load(&spec()))
        .as_ref()
        .map_err(|e| Error::RuntimeNotFound {
            backend: "hip",
            source: e.clone(),
        })
}

/// The bound functions of the runtime ([`loaded`]).
pub(crate) fn api() -> Result<&'static Api> {
    loaded().map(|l| &l.api)
}

/// The HIP runtime library this process uses, if one is loaded (opening it
/// on the first call): MIOpen and the doctor take its path from here, so
/// that they use the same ROCm.
// Its callers (vendor/miopen.rs, diagnostics) arrive with the vendor work.
#[allow(dead_code)]
pub(crate) fn runtime_library() -> Option<&'static Lib> {
    loaded().ok().map(|l| &l.lib)
}

/// Opens the runtime of `spec` and binds every function.
fn load(spec: &Spec) -> std::result::Result<Loaded, NotFound> {
    let lib = dynlib::open(spec).map_err(|mut e| {
        add_unset_notes(&mut e);
        e
    })?;
    // SAFETY: the library is a libamdhip64 (found by its names); its
    // exports of these names are the HIP runtime's C functions.
    match unsafe { Api::bind(&lib) } {
        Ok(api) => Ok(Loaded { lib, api }),
        Err(symbol) => Err(NotFound {
            what: spec.what.to_owned(),
            tried: vec![(
                format!(
                    "{} ({})",
                    lib.path()
                        .map_or_else(|| "the library found".into(), |p| p.display().to_string()),
                    lib.found_by()
                ),
                format!("loaded, but it does not export {symbol}"),
            )],
        }),
    }
}

/// Notes the prefix variables that were not set, so the list of places
/// says why `$ROCM_PATH/lib` was not looked in.
fn add_unset_notes(e: &mut NotFound) {
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if env_path(var).is_none() {
            e.tried.push((format!("${var}/lib"), "not set".into()));
        }
    }
}

fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// Where to look, in the order of the module docs.
pub(crate) fn spec() -> Spec {
    let mut folders = Vec::new();
    for var in ["ROCM_PATH", "HIP_PATH"] {
        if let Some(p) = env_path(var) {
            folders.push((p.join("lib"), format!("${var}/lib")));
        }
    }
    let mut later = vec![(PathBuf::from("/opt/rocm/lib"), "/opt/rocm/lib".to_owned())];
    for site in site_packages() {
        for lib in rocm_sdk_core_libs(&site) {
            if !later.iter().any(|(p, _)| *p == lib) {
                later.push((lib, "the TheRock pip SDK (rocm-sdk-core)".to_owned()));
            }
        }
    }
    Spec {
        what: "the HIP runtime (libamdhip64)",
        sonames: SONAMES.to_vec(),
        stem: "libamdhip64.so",
        env_var: Some(RUNTIME_VAR),
        folders,
        later_folders: later,
    }
}

/// The `lib` folder of each `_rocm_sdk_core*` package in `site` (the
/// package `rocm-sdk-core` installs as `_rocm_sdk_core`, its libraries in
/// its `lib`).
pub(crate) fn rocm_sdk_core_libs(site: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(site) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = dir
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("_rocm_sdk_core"))
        })
        .map(|e| e.path().join("lib"))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

/// The Python site-packages folders this process may import from, found
/// without running Python: `$VIRTUAL_ENV` and `$CONDA_PREFIX`
/// (`lib/python3.*/site-packages`), the folder holding any file mapped from
/// a `site-packages` or `dist-packages` folder (an extension module already
/// imported, rocm-safe's own included), the prefix of the Python executable
/// running this process, `$PYTHONPATH`'s entries, and
/// `~/.local/lib/python3.*/site-packages`. Only folders that exist, each
/// once.
pub(crate) fn site_packages() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let exe = std::fs::read_link("/proc/self/exe").ok();
    let env = |v: &str| env_path(v);
    site_packages_from(&maps, exe.as_deref(), &env)
}

/// [`site_packages`] from its inputs (the maps text, the executable, the
/// environment), for the tests.
pub(crate) fn site_packages_from(
    maps: &str,
    exe: Option<&Path>,
    env: &dyn Fn(&str) -> Option<PathBuf>,
) -> Vec<PathBuf> {
    let mut candidates: Vec<PathBuf> = Vec::new();
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(p) = env(var) {
            prefixes.push(p);
        }
    }
    // The mapped files' site folders.
    for line in maps.lines() {
        let Some(path) = line.splitn(6, ' ').nth(5).map(str::trim_start) else {
            continue;
        };
        if !path.starts_with('/') {
            continue;
        }
        let p = Path::new(path);
        if let Some(site) = p.ancestors().find(|a| {
            a.file_name()
                .is_some_and(|n| n == "site-packages" || n == "dist-packages")
        }) {
            candidates.push(site.to_path_buf());
        }
    }
    // `<prefix>/bin/python3.12` -> `<prefix>`.
    if let Some(exe) = exe {
        let is_python = exe
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("python"));
        if let (true, Some(prefix)) = (is_python, exe.parent().and_then(Path::parent)) {
            prefixes.push(prefix.to_path_buf());
        }
    }
    if let Some(home) = env("HOME") {
        prefixes.push(home.join(".local"));
    }
    for prefix in prefixes {
        candidates.extend(python_site_dirs(&prefix));
    }
    if let Some(pp) = env("PYTHONPATH") {
        candidates.extend(std::env::split_paths(&pp));
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for c in candidates {
        if c.is_dir() && !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// `<prefix>/lib/python3.*/site-packages` (and `dist-packages`) that exist.
fn python_site_dirs(prefix: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(prefix.join("lib")) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = dir
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("python3"))
        })
        .flat_map(|e| ["site-packages", "dist-packages"].map(|s| e.path().join(s)))
        .filter(|p| p.is_dir())
        .collect();
    out.sort();
    out
}

/// The HIP runtime file this process uses, as the doctor shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipRuntimeFile {
    /// The file the loader mapped (as it recorded it), if it says.
    pub path: Option<PathBuf>,
    /// The file with symbolic links resolved (`libamdhip64.so.7.1.25424`),
    /// when `path` resolves.
    pub real_path: Option<PathBuf>,
    /// How it was found (`"already loaded in this process
    /// (libamdhip64.so.7)"`, `"$ROCM_SAFE_HIP_RUNTIME"`, `"/opt/rocm/lib"`, ...).
    pub found_by: String,
    /// Whether it was already in the process before rocm-safe asked for it
    /// (PyTorch's runtime, say).
    pub already_loaded: bool,
    /// `hipRuntimeGetVersion` decoded (`"7.1.25424"`) with its raw value,
    /// or why it is unknown.
    pub version: std::result::Result<(i32, String), String>,
}

/// The HIP runtime file in use (opening the runtime on the first call):
/// its path, how it was found and its version.
///
/// Errors: [`Error::RuntimeNotFound`] listing every place tried.
pub fn runtime_file() -> Result<HipRuntimeFile> {
    let l = loaded()?;
    let path = l.lib.path().map(Path::to_path_buf);
    let real_path = path.as_ref().and_then(|p| std::fs::canonicalize(p).ok());
    let version = super::result::info::runtime_version(&l.api)
        .map(|v| (v, super::decode_hip_version(v)))
        .map_err(|e| format!("hipRuntimeGetVersion: {e}"));
    Ok(HipRuntimeFile {
        path,
        real_path,
        found_by: l.lib.found_by().to_string(),
        already_loaded: matches!(l.lib.found_by(), FoundBy::InProcess(_) | FoundBy::Mapped),
        version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_order_of_places_is_the_documented_one() {
        let s = spec();
        assert_eq!(s.sonames, SONAMES.to_vec());
        assert_eq!(s.env_var, Some(RUNTIME_VAR));
        assert_eq!(s.stem, "libamdhip64.so");
        // $ROCM_PATH before $HIP_PATH (when set), /opt/rocm/lib first of
        // the folders after the loader path, then the pip SDK's.
        let labels: Vec<&str> = s.folders.iter().map(|(_, l)| l.as_str()).collect();
        for l in &labels {
            assert!(*l == "$ROCM_PATH/lib" || *l == "$HIP_PATH/lib", "{l}");
        }
        assert_eq!(s.later_folders[0].0, PathBuf::from("/opt/rocm/lib"));
        for (p, l) in &s.later_folders[1..] {
            assert!(p.ends_with("lib") && l.contains("TheRock"), "{p:?} {l}");
        }
    }

    #[test]
    fn site_packages_come_from_the_environment_the_maps_and_the_executable() {
        let root = std::env::temp_dir().join(format!("rocm-safe-site-{}", std::process::id()));
        let venv = root.join("venv");
        let venv_site = venv.join("lib/python3.12/site-packages");
        let exe_prefix = root.join("usr");
        let exe_site = exe_prefix.join("lib/python3.11/dist-packages");
        let mapped_site = root.join("other/lib/python3.13/site-packages");
        let sdk = venv_site.join("_rocm_sdk_core/lib");
        for d in [&venv_site, &exe_site, &mapped_site, &sdk] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::create_dir_all(exe_prefix.join("bin")).unwrap();
        let maps = format!(
            "7f00-7f01 r--p 00000000 08:01 1 {}/torch/lib/libtorch.so\n\
             7f01-7f02 r--p 00000000 08:01 2 /usr/lib/libc.so.6\n\
             7f02-7f03 rw-p 00000000 00:00 0 [heap]\n",
            mapped_site.display()
        );
        let exe = exe_prefix.join("bin/python3.11");
        let venv2 = venv.clone();
        let env = move |v: &str| (v == "VIRTUAL_ENV").then(|| venv2.clone());
        let sites = site_packages_from(&maps, Some(&exe), &env);
        assert_eq!(
            sites,
            vec![mapped_site.clone(), venv_site.clone(), exe_site.clone()]
        );
        // The TheRock core package's library folder in the venv.
        assert_eq!(rocm_sdk_core_libs(&venv_site), vec![sdk]);
        assert!(rocm_sdk_core_libs(&exe_site).is_empty());
        assert!(rocm_sdk_core_libs(&root.join("missing")).is_empty());
        // Not a Python executable: no prefix from it.
        let none = |_: &str| None;
        assert!(site_packages_from("", Some(Path::new("/usr/bin/cargo")), &none).is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_library_without_the_hip_functions_is_refused_with_the_symbol() {
        // The C library loads but is no HIP runtime.
        let spec = Spec {
            what: "the HIP runtime (libamdhip64)",
            sonames: vec!["libc.so.6"],
            stem: "libc.so",
            ..Spec::default()
        };
        let e = load(&spec).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("does not export hipMalloc"), "{e}");
    }
}
