//! The kernel cache: kernels a runtime compiles at run time (CUDA's NVRTC
//! today; an AMD path through hipRTC would use it the same way), kept for the
//! process and on disk, keyed by source, target and options.
//!
//! Compiling takes NVRTC from under a second (the core module) to about
//! 10 s (a tiled conv3d module, to machine code) on an H100 machine; a
//! cached copy takes a file read, and a cached cubin loads in milliseconds. A cached file is named after the hash of the
//! kernel source, target and options it was built from and carries a
//! fingerprint of its contents, checked before use; a file that fails the
//! check, or that the driver refuses, is compiled again. Every verified call
//! still runs the device's exhaustive self-test on the kernels, whichever
//! way they were obtained.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use super::info::KernelSource;
use crate::error::Result;

/// The environment variable naming the directory of the kernel cache on
/// disk; set to an empty value to turn the disk cache off.
pub const CACHE_DIR_VAR: &str = "ROCM_SAFE_CACHE_DIR";

/// Where compiled kernels are kept between processes:
/// `$ROCM_SAFE_CACHE_DIR` (`None` when set but empty: no disk cache), else
/// `$XDG_CACHE_HOME/rocm-safe`, else `$HOME/.cache/rocm-safe`.
pub fn dir() -> Option<PathBuf> {
    dir_from(
        std::env::var_os(CACHE_DIR_VAR),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn dir_from(
    own: Option<OsString>,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    match own {
        Some(d) if d.is_empty() => None,
        Some(d) => Some(PathBuf::from(d)),
        None => match (xdg, home) {
            (Some(x), _) if !x.is_empty() => Some(PathBuf::from(x).join("rocm-safe")),
            (_, Some(h)) if !h.is_empty() => Some(PathBuf::from(h).join(".cache/rocm-safe")),
            _ => None,
        },
    }
}

/// What is being compiled: the file names and keys of the cache come from
/// it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    /// The runtime (`"cuda"`): the first part of a cached file's name.
    pub(crate) runtime: &'static str,
    /// The compiler (`"nvrtc"`): part of the key and the file header.
    pub(crate) compiler: &'static str,
    /// The output's kind and file extension (`"cubin"`, `"ptx"`).
    pub(crate) ext: &'static str,
    /// The module (`"core"`, `"conv3d_tiled_bf16"`).
    pub(crate) module: &'static str,
    /// The target (`"sm_90"`, `"compute_90"`).
    pub(crate) target: &'a str,
    /// The kernel source.
    pub(crate) source: &'a str,
    /// The compiler's options.
    pub(crate) options: &'a [String],
}

impl Request<'_> {
    /// The disk cache's key.
    fn key(&self) -> u64 {
        let mut bytes = Vec::with_capacity(self.source.len() + 256);
        bytes
            .extend_from_slice(format!("rocm-safe {} {} v1\0", self.compiler, self.ext).as_bytes());
        bytes.extend_from_slice(self.target.as_bytes());
        for o in self.options {
            bytes.push(0);
            bytes.extend_from_slice(o.as_bytes());
        }
        bytes.push(0);
        bytes.extend_from_slice(self.source.as_bytes());
        crate::convert::fingerprint::fingerprint_bytes(&bytes).0
    }

    /// `module-target`: part of the file name.
    fn name(&self) -> String {
        format!("{}-{}", self.module, self.target)
    }

    /// `runtime-module-target`: the process cache's key.
    fn process_key(&self) -> String {
        format!("{}-{}", self.runtime, self.name())
    }

    fn file(&self, dir: &Path, key: u64) -> PathBuf {
        dir.join(format!(
            "{}-{}-{key:016x}.{}",
            self.runtime,
            self.name(),
            self.ext
        ))
    }

    /// The first line of a cached file: the key and the fingerprint of the
    /// contents that follow.
    fn header(&self, key: u64, data: &[u8]) -> String {
        let fp = crate::convert::fingerprint::fingerprint_bytes(data);
        format!("// rocm-safe {} cache {key:016x} {fp}\n", self.compiler)
    }

    /// The contents of a cached file's `bytes` when its header matches
    /// `key` and the contents' fingerprint.
    fn parse<'b>(&self, bytes: &'b [u8], key: u64) -> Option<&'b [u8]> {
        let nl = bytes.iter().position(|&b| b == b'\n')?;
        let (head, data) = (bytes.get(..nl)?, bytes.get(nl + 1..)?);
        let want = self.header(key, data);
        (want.trim_end().as_bytes() == head && !data.is_empty()).then_some(data)
    }

    fn read(&self, dir: &Path, key: u64) -> Option<Vec<u8>> {
        let bytes = std::fs::read(self.file(dir, key)).ok()?;
        self.parse(&bytes, key).map(<[u8]>::to_vec)
    }

    /// Writes `data` into the cache (a temporary file renamed into place, so
    /// a reader never sees half a file). Failures only cost a later compile.
    fn write(&self, dir: &Path, key: u64, data: &[u8]) {
        let path = self.file(dir, key);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let mut contents = self.header(key, data).into_bytes();
        contents.extend_from_slice(data);
        let r = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&tmp, &contents))
            .and_then(|()| std::fs::rename(&tmp, &path));
        if let Err(e) = r {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(path = %path.display(), error = %e, "kernel cache not written");
        }
    }
}

/// One entry of the process cache: its own lock, held while the entry is
/// compiled, so a second caller of the same module waits for that compile
/// instead of repeating it, and different modules compile side by side.
type Entry = std::sync::Arc<Mutex<Option<Vec<u8>>>>;

/// Compiled kernels of this process, per `runtime-module-target`.
fn process_cache() -> &'static Mutex<HashMap<String, Entry>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Entry>>> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Whether this process's cache holds `req` already (no compile, no disk
/// read, no wait).
pub(crate) fn in_process(req: &Request<'_>) -> bool {
    let entry = lock(process_cache()).get(&req.process_key()).cloned();
    entry.is_some_and(|e| e.try_lock().is_ok_and(|g| g.is_some()))
}

/// `req` compiled: with `cached`, from this process's cache, then the disk
/// cache in `dir` (normally [`dir()`]; `None`: no disk cache), else by
/// `compile`, whose output goes to both caches. `cached: false` compiles
/// afresh (for output the driver refused). A call for a module another
/// thread is compiling waits for that compile.
pub(crate) fn get_or_compile(
    req: &Request<'_>,
    dir: Option<&Path>,
    cached: bool,
    compile: impl FnOnce() -> Result<Vec<u8>>,
) -> Result<(Vec<u8>, KernelSource)> {
    let entry = lock(process_cache())
        .entry(req.process_key())
        .or_default()
        .clone();
    let mut slot = lock(&entry);
    if cached {
        if let Some(p) = &*slot {
            return Ok((p.clone(), KernelSource::ProcessCache));
        }
    }
    // The key hashes the whole source: only when the disk is consulted.
    let key = req.key();
    if cached {
        if let Some(p) = dir.and_then(|d| req.read(d, key)) {
            *slot = Some(p.clone());
            return Ok((p, KernelSource::DiskCache));
        }
    }
    let out = compile()?;
    if let Some(d) = dir {
        req.write(d, key, &out);
    }
    *slot = Some(out.clone());
    Ok((out, KernelSource::Compiled))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    fn req<'a>(target: &'a str, source: &'a str, options: &'a [String]) -> Request<'a> {
        Request {
            runtime: "cuda",
            compiler: "nvrtc",
            ext: "ptx",
            module: "core",
            target,
            source,
            options,
        }
    }

    #[test]
    fn cache_dir_follows_the_environment() {
        assert_eq!(
            dir_from(os("/c"), os("/x"), os("/h")),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(dir_from(os(""), os("/x"), os("/h")), None);
        assert_eq!(
            dir_from(None, os("/x"), os("/h")),
            Some(PathBuf::from("/x/rocm-safe"))
        );
        assert_eq!(
            dir_from(None, os(""), os("/h")),
            Some(PathBuf::from("/h/.cache/rocm-safe"))
        );
        assert_eq!(dir_from(None, None, None), None);
    }

    #[test]
    fn keys_depend_on_source_target_and_options() {
        let (o, o2) = (vec!["-a".to_owned()], vec!["-b".to_owned()]);
        let k = req("compute_90", "src", &o).key();
        assert_eq!(k, req("compute_90", "src", &o).key());
        assert_ne!(k, req("compute_90", "src2", &o).key());
        assert_ne!(k, req("compute_80", "src", &o).key());
        assert_ne!(k, req("compute_90", "src", &o2).key());
        let mut other = req("compute_90", "src", &o);
        other.compiler = "hiprtc";
        assert_ne!(k, other.key());
    }

    #[test]
    fn cached_output_round_trips_and_damage_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let ptx = b"//\n.version 8.0\n.target sm_90\n.entry f() { ret; }\n";
        let r90 = req("compute_90", "s", &[]);
        assert_eq!(r90.read(dir.path(), 7), None);
        r90.write(dir.path(), 7, ptx);
        assert_eq!(r90.read(dir.path(), 7).as_deref(), Some(&ptx[..]));
        // Another key or target: another file.
        assert_eq!(r90.read(dir.path(), 8), None);
        assert_eq!(req("compute_80", "s", &[]).read(dir.path(), 7), None);
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A changed byte, a cut file, a foreign header: rejected.
        let path = r90.file(dir.path(), 7);
        let text = std::fs::read_to_string(&path).unwrap();
        for bad in [
            text.replace("sm_90", "sm_91"),
            text[..text.len() - 5].to_owned(),
            text.replacen("rocm-safe", "rocm-save", 1),
            String::from_utf8(ptx.to_vec()).unwrap(),
        ] {
            std::fs::write(&path, &bad).unwrap();
            assert_eq!(r90.read(dir.path(), 7), None, "{bad}");
        }
        // A directory that cannot be created: nothing written, no panic.
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        r90.write(&file.join("sub"), 7, ptx);
        assert_eq!(r90.read(&file.join("sub"), 7), None);
    }

    #[test]
    fn machine_code_round_trips_byte_for_byte() {
        // A cubin is binary: NULs, newlines and every byte value.
        let dir = tempfile::tempdir().unwrap();
        let mut elf = b"\x7fELF\x02\x01\x01\0\n\n\0".to_vec();
        elf.extend((0..=255u8).cycle().take(4096));
        let mut r = req("sm_90", "s", &[]);
        r.ext = "cubin";
        r.write(dir.path(), 9, &elf);
        assert_eq!(r.read(dir.path(), 9), Some(elf.clone()));
        assert!(r.file(dir.path(), 9).to_string_lossy().ends_with(".cubin"));
        // One flipped bit anywhere in the image: rejected.
        let path = r.file(dir.path(), 9);
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1000;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(r.read(dir.path(), 9), None);
    }

    #[test]
    fn get_or_compile_compiles_once_then_reads_the_caches() {
        let dir = tempfile::tempdir().unwrap();
        // A target of its own, so the process cache starts empty for it.
        let target = format!("test-{}", std::process::id());
        let mut r = req(&target, "unique source", &[]);
        r.runtime = "unit";
        let mut runs = 0;
        let mut compile = || {
            runs += 1;
            Ok(b"code".to_vec())
        };
        let d = Some(dir.path());
        let (a, s1) = get_or_compile(&r, d, true, &mut compile).unwrap();
        let (b, s2) = get_or_compile(&r, d, true, &mut compile).unwrap();
        let (c, s3) = get_or_compile(&r, d, false, &mut compile).unwrap();
        assert_eq!(s1, KernelSource::Compiled);
        assert_eq!(s2, KernelSource::ProcessCache);
        assert_eq!(s3, KernelSource::Compiled);
        assert_eq!(runs, 2);
        for out in [a, b, c] {
            assert_eq!(out, b"code");
        }
        // The compiled output reached the disk cache.
        assert_eq!(r.read(dir.path(), r.key()).as_deref(), Some(&b"code"[..]));
        // A failing compiler's error comes back, and nothing is cached.
        let mut r2 = r;
        r2.module = "other";
        let e = get_or_compile(&r2, d, true, || {
            Err(crate::Error::BackendUnsupported {
                backend: "unit",
                op: "compile",
            })
        });
        assert!(e.is_err());
        assert_eq!(r2.read(dir.path(), r2.key()), None);
        assert!(!in_process(&r2));
        assert!(in_process(&r));
    }

    #[test]
    fn a_module_being_compiled_is_waited_for_not_compiled_twice() {
        let target = format!("race-{}", std::process::id());
        let mut r = req(&target, "raced source", &[]);
        r.runtime = "unit";
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let sources = std::thread::scope(|sc| {
            let first = sc.spawn(|| {
                get_or_compile(&r, None, true, || {
                    started_tx.send(()).unwrap();
                    runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_millis(200));
                    Ok(b"slow".to_vec())
                })
                .unwrap()
            });
            // The second caller arrives while the first compiles.
            started_rx.recv().unwrap();
            assert!(!in_process(&r), "mid-compile is not cached yet");
            let second = get_or_compile(&r, None, true, || {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Ok(b"again".to_vec())
            })
            .unwrap();
            (first.join().unwrap(), second)
        });
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(sources.0, (b"slow".to_vec(), KernelSource::Compiled));
        assert_eq!(sources.1, (b"slow".to_vec(), KernelSource::ProcessCache));
        // Another module compiles while this one's lock is held.
        let mut other = r;
        other.module = "other-module";
        let entry = lock(process_cache())
            .get(&r.process_key())
            .cloned()
            .unwrap();
        let _held = lock(&entry);
        let got = get_or_compile(&other, None, true, || Ok(b"side".to_vec())).unwrap();
        assert_eq!(got.1, KernelSource::Compiled);
    }
}
