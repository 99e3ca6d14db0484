//! Opening the GPU runtimes and vendor libraries at run time so that a
//! process holds **one copy of each**.
//!
//! A trainer process has often loaded its own copy of a library before
//! rocm-safe asks for it: PyTorch's ROCm wheels bring their own
//! `libamdhip64`, its CUDA wheels pip's cuDNN and NVRTC. Opening the
//! library again by its bare name would map a *second* copy (the system's,
//! found on the loader path), whose handles and sub-libraries do not mix
//! with the first: a `hipStream_t` of one HIP runtime is an invalid handle
//! (or a crash) in the other, and a second cuDNN fails every call with
//! `CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH`. [`open`] therefore looks in
//! this order, stopping at the first that loads:
//!
//! 1. **in the process already**, by soname (`dlopen` with `RTLD_NOLOAD`,
//!    which never loads anything);
//! 2. **mapped in the process** under another name: a file in
//!    `/proc/self/maps` whose name starts with the library's stem, opened
//!    by its path with `RTLD_NOLOAD` (the loader matches it to the object
//!    already loaded by its file identity);
//! 3. the **environment variable** of the library, if set: a file, or a
//!    folder holding one of the sonames;
//! 4. the **folders** given by the caller (a ROCm prefix's `lib`, a pip
//!    SDK's library folder, ...), each soname in turn, newest first;
//! 5. the **loader path** (`LD_LIBRARY_PATH`, `ld.so.cache`), each soname
//!    in turn;
//! 6. the caller's **fallback folders** (`Spec::later_folders`: places
//!    that should not win over the loader path, such as `/opt/rocm/lib`
//!    or a pip SDK's library folder).
//!
//! When none loads, [`NotFound`] lists every place tried with the loader's
//! message. A library opened here is never closed: the runtimes keep
//! process-wide state, and NVRTC (CUDA 13) aborts the process when it is
//! loaded again after being unloaded.

// Users arrive with the HIP and CUDA loaders and the doctor.
#![allow(dead_code)]

use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

/// How [`open`] found a library.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FoundBy {
    /// Already loaded in the process under this soname.
    InProcess(String),
    /// Already mapped in the process (found in `/proc/self/maps`).
    Mapped,
    /// The environment variable of this name.
    EnvVar(String),
    /// A folder the caller named; the label says which (e.g. `$ROCM_PATH/lib`).
    Folder(String),
    /// The dynamic loader's search path, under this soname.
    LoaderPath(String),
}

impl fmt::Display for FoundBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FoundBy::InProcess(soname) => write!(f, "already loaded in this process ({soname})"),
            FoundBy::Mapped => f.write_str("already mapped in this process"),
            FoundBy::EnvVar(var) => write!(f, "${var}"),
            FoundBy::Folder(label) => write!(f, "{label}"),
            FoundBy::LoaderPath(soname) => write!(f, "the loader path ({soname})"),
        }
    }
}

/// A shared library opened by [`open`]: a live handle, never closed.
#[derive(Debug)]
pub(crate) struct Lib {
    handle: NonNull<c_void>,
    path: Option<PathBuf>,
    found_by: FoundBy,
}

// SAFETY: a dlopen handle is a process-wide token; dlsym and dlinfo on it
// are thread-safe in glibc, and the handle is never closed.
unsafe impl Send for Lib {}
// SAFETY: as above; `Lib` has no interior mutability.
unsafe impl Sync for Lib {}

impl Lib {
    /// The file the loader mapped (the name it was opened by, absolute
    /// when found by path), if the loader says.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// How it was found.
    pub(crate) fn found_by(&self) -> &FoundBy {
        &self.found_by
    }

    /// The address of the exported symbol `name`, or `None`.
    pub(crate) fn symbol(&self, name: &CStr) -> Option<NonNull<c_void>> {
        // SAFETY: the handle is live (never closed); `name` is
        // NUL-terminated. dlsym only looks the symbol up.
        NonNull::new(unsafe { libc::dlsym(self.handle.as_ptr(), name.as_ptr()) })
    }
}

/// Where to look for one library.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spec {
    /// What the library is, for messages ("the HIP runtime").
    pub what: &'static str,
    /// Sonames, newest first (`libamdhip64.so.7`, ...).
    pub sonames: Vec<&'static str>,
    /// The start of the file names of every version (`libamdhip64.so`):
    /// a mapped file whose name starts with it is this library.
    pub stem: &'static str,
    /// The environment variable naming a file or a folder, if any.
    pub env_var: Option<&'static str>,
    /// Folders to look in before the loader path, with their labels.
    pub folders: Vec<(PathBuf, String)>,
    /// Folders to look in after the loader path, with their labels.
    pub later_folders: Vec<(PathBuf, String)>,
}

/// No place held a library that loads (an error of its own, the source of
/// [`Error::RuntimeNotFound`](crate::Error::RuntimeNotFound)).
pub use crate::error::NotFound;

/// The loader's last error message on this thread.
pub(crate) fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until
    // the next dl* call on this thread; it is copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown loader error".into();
    }
    // SAFETY: non-null and NUL-terminated (above).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// `dlopen(name, flags)`: the handle, or the loader's message.
fn dlopen(name: &[u8], flags: libc::c_int) -> Result<NonNull<c_void>, String> {
    let c = CString::new(name).map_err(|_| "name holds a NUL byte".to_owned())?;
    // SAFETY: `c` is NUL-terminated and outlives the call. Loading runs the
    // library's initialisers, which is what opening a runtime means; with
    // RTLD_NOLOAD nothing is loaded. The handle is never closed.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    NonNull::new(h).ok_or_else(dlerror)
}

const LOAD: libc::c_int = libc::RTLD_NOW | libc::RTLD_LOCAL;
const NOLOAD: libc::c_int = libc::RTLD_NOW | libc::RTLD_NOLOAD;

/// Opens the library of `spec`, in the order of the module docs.
pub(crate) fn open(spec: &Spec) -> Result<Lib, NotFound> {
    let mut tried: Vec<(String, String)> = Vec::new();
    let lib = |handle: NonNull<c_void>, found_by: FoundBy| Lib {
        path: library_path(handle),
        handle,
        found_by,
    };
    // 1. In the process by soname.
    for soname in &spec.sonames {
        if let Ok(h) = dlopen(soname.as_bytes(), NOLOAD) {
            return Ok(lib(h, FoundBy::InProcess((*soname).to_owned())));
        }
    }
    // 2. Mapped in the process under another name.
    for path in mapped(spec.stem) {
        match dlopen(path.as_os_str().as_bytes(), NOLOAD) {
            Ok(h) => return Ok(lib(h, FoundBy::Mapped)),
            Err(e) => tried.push((format!("mapped {}", path.display()), e)),
        }
    }
    // 3. The environment variable: a file, or a folder.
    if let Some(var) = spec.env_var {
        match std::env::var_os(var) {
            Some(value) if !value.is_empty() => {
                let p = PathBuf::from(value);
                let found_by = FoundBy::EnvVar(var.to_owned());
                if p.is_dir() {
                    if let Some(l) = open_in_folder(&p, &spec.sonames, &found_by, &mut tried) {
                        return Ok(lib(l, found_by));
                    }
                } else {
                    match dlopen(p.as_os_str().as_bytes(), LOAD) {
                        Ok(h) => return Ok(lib(h, found_by)),
                        Err(e) => tried.push((format!("${var}={}", p.display()), e)),
                    }
                }
            }
            _ => tried.push((format!("${var}"), "not set".to_owned())),
        }
    }
    // 4. The caller's folders.
    for (folder, label) in &spec.folders {
        let found_by = FoundBy::Folder(label.clone());
        if let Some(h) = open_in_folder(folder, &spec.sonames, &found_by, &mut tried) {
            return Ok(lib(h, found_by));
        }
    }
    // 5. The loader path.
    for soname in &spec.sonames {
        match dlopen(soname.as_bytes(), LOAD) {
            Ok(h) => return Ok(lib(h, FoundBy::LoaderPath((*soname).to_owned()))),
            Err(e) => tried.push((format!("loader path {soname}"), e)),
        }
    }
    // 6. The caller's fallback folders.
    for (folder, label) in &spec.later_folders {
        let found_by = FoundBy::Folder(label.clone());
        if let Some(h) = open_in_folder(folder, &spec.sonames, &found_by, &mut tried) {
            return Ok(lib(h, found_by));
        }
    }
    Err(NotFound {
        what: spec.what.to_owned(),
        tried,
    })
}

/// Each soname in `folder` that exists, opened by path; a missing folder
/// or file is recorded once, without asking the loader.
fn open_in_folder(
    folder: &Path,
    sonames: &[&str],
    found_by: &FoundBy,
    tried: &mut Vec<(String, String)>,
) -> Option<NonNull<c_void>> {
    if !folder.is_dir() {
        tried.push((
            format!("{found_by} ({})", folder.display()),
            "no such folder".into(),
        ));
        return None;
    }
    let mut any = false;
    for soname in sonames {
        let p = folder.join(soname);
        if !p.exists() {
            continue;
        }
        any = true;
        match dlopen(p.as_os_str().as_bytes(), LOAD) {
            Ok(h) => return Some(h),
            Err(e) => tried.push((format!("{found_by} ({})", p.display()), e)),
        }
    }
    if !any {
        tried.push((
            format!("{found_by} ({})", folder.display()),
            format!("none of {} there", sonames.join(", ")),
        ));
    }
    None
}

/// The distinct files mapped in this process whose file name starts with
/// `stem` (`libamdhip64.so` matches `libamdhip64.so.7.1.25424`), in the
/// order of `/proc/self/maps`; empty when it cannot be read.
pub(crate) fn mapped(stem: &str) -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/maps")
        .map(|maps| parse_maps(&maps, stem))
        .unwrap_or_default()
}

/// The distinct paths in a `/proc/<pid>/maps` text whose file name starts
/// with `stem`, in order of first appearance.
pub(crate) fn parse_maps(maps: &str, stem: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode [path]: the path is the sixth
        // field and may hold spaces; a deleted file ends in " (deleted)".
        let mut fields = line.splitn(6, ' ');
        let Some(rest) = fields.nth(5) else { continue };
        let path = rest.trim_start();
        if !path.starts_with('/') {
            continue;
        }
        let path = Path::new(path);
        let matches = path
            .file_name()
            .is_some_and(|f| f.as_bytes().starts_with(stem.as_bytes()));
        if matches && !out.iter().any(|p| p == path) {
            out.push(path.to_path_buf());
        }
    }
    out
}

/// The distinct *files* among [`mapped`]`(stem)`, told apart by their
/// identity (device and inode), not their names: two entries here are two
/// copies of the library in one process.
pub(crate) fn mapped_copies(stem: &str) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let mut out = Vec::new();
    for p in mapped(stem) {
        let id = std::fs::metadata(&p).map(|m| (m.dev(), m.ino())).ok();
        if let Some(id) = id {
            if seen.contains(&id) {
                continue;
            }
            seen.push(id);
        }
        out.push(p);
    }
    out
}

/// The file name the loader recorded for `handle` (`link_map::l_name`).
#[cfg(target_os = "linux")]
pub(crate) fn library_path(handle: NonNull<c_void>) -> Option<PathBuf> {
    let mut map: *mut c_void = std::ptr::null_mut();
    // SAFETY: `handle` is a live dlopen handle; RTLD_DI_LINKMAP writes a
    // `struct link_map *` into `map`, passed as a pointer to a pointer.
    let rc = unsafe {
        libc::dlinfo(
            handle.as_ptr(),
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut c_void).cast(),
        )
    };
    if rc != 0 || map.is_null() {
        return None;
    }
    // glibc's link_map starts with `ElfW(Addr) l_addr; char *l_name;`.
    #[repr(C)]
    struct LinkMapHead {
        l_addr: usize,
        l_name: *const libc::c_char,
    }
    // SAFETY: dlinfo succeeded, so `map` points to the loader's live
    // link_map for this handle, whose first two fields have the layout
    // above; the handle stays open, so the name is alive while copied.
    let name = unsafe {
        let head = &*(map as *const LinkMapHead);
        if head.l_name.is_null() {
            return None;
        }
        CStr::from_ptr(head.l_name)
    };
    let bytes = name.to_bytes();
    (!bytes.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(bytes)))
}

/// Without glibc's link map the path is unknown.
#[cfg(not(target_os = "linux"))]
pub(crate) fn library_path(_handle: NonNull<c_void>) -> Option<PathBuf> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
7f0000000000-7f0000001000 r--p 00000000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000001000-7f0000002000 r-xp 00001000 08:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000003000-7f0000004000 r--p 00000000 08:01 456 /opt/venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9
7f0000004000-7f0000005000 r--p 00000000 08:01 457 /opt/venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn_ops.so.9
7f0000005000-7f0000006000 r--p 00000000 08:01 789 /usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0
7f0000006000-7f0000007000 rw-p 00000000 00:00 0 [heap]
7f0000007000-7f0000008000 rw-p 00000000 00:00 0
7f0000008000-7f0000009000 r--p 00000000 08:01 999 /tmp/with space/libamdhip64.so.7 (deleted)
";

    #[test]
    fn parse_maps_finds_each_copy_once_by_stem() {
        let cudnn = parse_maps(MAPS, "libcudnn.so");
        assert_eq!(
            cudnn,
            vec![
                PathBuf::from(
                    "/opt/venv/lib/python3.12/site-packages/nvidia/cudnn/lib/libcudnn.so.9"
                ),
                PathBuf::from("/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"),
            ]
        );
        assert_eq!(parse_maps(MAPS, "libc.so").len(), 1);
        assert!(parse_maps(MAPS, "libnvrtc.so").is_empty());
        // A path with a space is kept whole (the " (deleted)" marker too:
        // opening it fails and is recorded, never a wrong match).
        let hip = parse_maps(MAPS, "libamdhip64.so");
        assert_eq!(hip.len(), 1);
        assert!(hip[0].to_string_lossy().starts_with("/tmp/with space/"));
    }

    #[test]
    fn a_library_in_the_process_is_found_there_without_loading() -> Result<(), NotFound> {
        let spec = Spec {
            what: "the C library",
            sonames: vec!["libc.so.6"],
            stem: "libc.so",
            ..Spec::default()
        };
        let lib = open(&spec)?;
        assert_eq!(lib.found_by(), &FoundBy::InProcess("libc.so.6".into()));
        assert!(lib.symbol(c"malloc").is_some());
        assert!(lib.symbol(c"rocm_safe_no_such_symbol").is_none());
        // This process maps exactly one C library.
        assert_eq!(mapped_copies("libc.so").len(), 1);
        Ok(())
    }

    #[test]
    fn nothing_found_lists_every_place_tried() {
        let dir = std::env::temp_dir().join("rocm-safe-dynlib-empty-folder");
        let _ = std::fs::create_dir_all(&dir);
        let spec = Spec {
            what: "a library that does not exist",
            sonames: vec!["librocm_safe_missing.so.2", "librocm_safe_missing.so.1"],
            stem: "librocm_safe_missing.so",
            env_var: Some("ROCM_SAFE_TEST_DYNLIB_UNSET_VARIABLE"),
            folders: vec![
                (dir.clone(), "a folder".into()),
                (
                    PathBuf::from("/nonexistent/rocm-safe"),
                    "a missing folder".into(),
                ),
            ],
            later_folders: vec![(
                PathBuf::from("/nonexistent/rocm-safe-later"),
                "a fallback folder".into(),
            )],
        };
        let e = open(&spec).err().map(|e| e.to_string()).unwrap_or_default();
        for part in [
            "a library that does not exist not found; tried ",
            "$ROCM_SAFE_TEST_DYNLIB_UNSET_VARIABLE: not set",
            "a folder (",
            "none of librocm_safe_missing.so.2, librocm_safe_missing.so.1 there",
            "a missing folder (/nonexistent/rocm-safe): no such folder",
            "loader path librocm_safe_missing.so.2: ",
            "loader path librocm_safe_missing.so.1: ",
            "a fallback folder (/nonexistent/rocm-safe-later): no such folder",
        ] {
            assert!(e.contains(part), "{part:?} missing from {e}");
        }
        // The fallback folders come after the loader path.
        let (loader, later) = (e.find("loader path "), e.find("a fallback folder"));
        assert!(loader.is_some() && later.is_some() && loader < later, "{e}");
    }
}
