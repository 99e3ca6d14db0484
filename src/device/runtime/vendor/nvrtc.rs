//! NVRTC, CUDA's run-time compiler, bound here (not through cudarc, whose
//! choice of library file is its own: inside a PyTorch process it mapped
//! the CUDA toolkit's NVRTC beside pip's). Opened through
//! [`dynlib`](crate::device::dynlib) with [`nvrtc_spec`]: a copy already in
//! the process first. **Never unloaded**: NVRTC (CUDA 13) aborts the
//! process when it is loaded again after being unloaded. Only the calls the
//! kernel compile needs are bound, with the C signatures of `nvrtc.h`:
//!
//! ```c
//! nvrtcResult nvrtcVersion(int *major, int *minor);
//! nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
//!     int numHeaders, const char * const *headers, const char * const *includeNames);
//! nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int numOptions,
//!     const char * const *options);
//! nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog);
//! nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *logSizeRet);
//! nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log);
//! nvrtcResult nvrtcGetPTXSize(nvrtcProgram prog, size_t *ptxSizeRet);
//! nvrtcResult nvrtcGetPTX(nvrtcProgram prog, char *ptx);
//! // Optional (NVRTC 11.1 and later): the machine code of a real arch.
//! nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *cubinSizeRet);
//! nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin);
//! ```
//!
//! `nvrtcResult` is taken as `int`: a code a newer NVRTC adds is a number
//! with an "unknown" name, never undefined behaviour.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::ffi::{c_char, c_int, c_void, CString};
use std::sync::OnceLock;

#[cfg(feature = "doctor")]
use super::libs::Loaded;
use super::libs::{bind_fn, nvrtc_spec};
use crate::device::dynlib::{self, NotFound, Spec};
use crate::error::{Error, Result};

type Program = *mut c_void;
type Status = c_int;

/// The code [`Nvrtc::compile`] reports for a source, name or option that holds
/// a NUL byte (NVRTC is never called then).
pub(crate) const INTERIOR_NUL: c_int = -1;

/// The bound library.
#[derive(Debug)]
pub(crate) struct Nvrtc {
    /// Holds the library open (read only by the doctor otherwise).
    #[cfg_attr(not(feature = "doctor"), allow(dead_code))]
    lib: dynlib::Lib,
    /// `nvrtcVersion`.
    #[cfg_attr(not(feature = "doctor"), allow(dead_code))]
    version: (c_int, c_int),
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> Status,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> Status,
    destroy: unsafe extern "C" fn(*mut Program) -> Status,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    log: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> Status,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> Status,
    /// `nvrtcGetCUBINSize` and `nvrtcGetCUBIN`, where this NVRTC has them.
    cubin: Option<(
        unsafe extern "C" fn(Program, *mut usize) -> Status,
        unsafe extern "C" fn(Program, *mut c_char) -> Status,
    )>,
}

/// What a compile returns: [`Nvrtc::compile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Output {
    /// PTX text (for a virtual arch, `compute_90`), without its NUL: the
    /// driver translates it when the module is loaded.
    Ptx,
    /// Machine code for a real arch (`sm_90`): loaded as it is.
    Cubin,
}

/// The name of an `nvrtcResult` code (`nvrtc.h`, CUDA 13).
pub(crate) fn status_name(code: c_int) -> &'static str {
    match code {
        0 => "NVRTC_SUCCESS",
        1 => "NVRTC_ERROR_OUT_OF_MEMORY",
        2 => "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
        3 => "NVRTC_ERROR_INVALID_INPUT",
        4 => "NVRTC_ERROR_INVALID_PROGRAM",
        5 => "NVRTC_ERROR_INVALID_OPTION",
        6 => "NVRTC_ERROR_COMPILATION",
        7 => "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE",
        8 => "NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION",
        9 => "NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION",
        10 => "NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID",
        11 => "NVRTC_ERROR_INTERNAL_ERROR",
        12 => "NVRTC_ERROR_TIME_FILE_WRITE_FAILED",
        13 => "NVRTC_ERROR_NO_PCH_CREATE_ATTEMPTED",
        14 => "NVRTC_ERROR_PCH_CREATE_HEAP_EXHAUSTED",
        15 => "NVRTC_ERROR_PCH_CREATE",
        16 => "NVRTC_ERROR_CANCELLED",
        17 => "NVRTC_ERROR_TIME_TRACE_FILE_WRITE_FAILED",
        18 => "NVRTC_ERROR_BUSY",
        INTERIOR_NUL => "the source, its name or an option holds a NUL byte",
        _ => "unknown nvrtcResult",
    }
}

/// Opens NVRTC by `spec` and binds its functions; the error lists every
/// place tried, or names the file that loaded and what it lacks.
pub(crate) fn load(spec: &Spec) -> std::result::Result<Nvrtc, NotFound> {
    let lib = dynlib::open(spec)?;
    let refuse = |why: String| NotFound {
        what: spec.what.to_owned(),
        tried: vec![(
            format!(
                "{} ({})",
                lib.path()
                    .map_or_else(|| "the library found".into(), |p| p.display().to_string()),
                lib.found_by()
            ),
            why,
        )],
    };
    let missing = |sym: &str| refuse(format!("loaded, but it does not export {sym}"));
    // SAFETY: (every bind below) each field's type is the C signature of
    // the function of that name in nvrtc.h (module docs); the library is
    // never closed.
    let version_fn = unsafe {
        bind_fn::<unsafe extern "C" fn(*mut c_int, *mut c_int) -> Status>(&lib, c"nvrtcVersion")
    }
    .map_err(missing)?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints.
    let rc = unsafe { version_fn(&mut major, &mut minor) };
    if rc != 0 {
        return Err(refuse(format!(
            "loaded, but nvrtcVersion failed: {} (status {rc})",
            status_name(rc)
        )));
    }
    // SAFETY: as above.
    let bound = unsafe {
        (|| {
            Ok::<_, &'static str>((
                bind_fn(&lib, c"nvrtcCreateProgram")?,
                bind_fn(&lib, c"nvrtcCompileProgram")?,
                bind_fn(&lib, c"nvrtcDestroyProgram")?,
                bind_fn(&lib, c"nvrtcGetProgramLogSize")?,
                bind_fn(&lib, c"nvrtcGetProgramLog")?,
                bind_fn(&lib, c"nvrtcGetPTXSize")?,
                bind_fn(&lib, c"nvrtcGetPTX")?,
            ))
        })()
    };
    let (create, compile, destroy, log_size, log, ptx_size, ptx) = bound.map_err(missing)?;
    // SAFETY: as above; absent, PTX is what this NVRTC gives.
    let cubin = unsafe {
        (|| {
            Ok::<_, &'static str>((
                bind_fn(&lib, c"nvrtcGetCUBINSize")?,
                bind_fn(&lib, c"nvrtcGetCUBIN")?,
            ))
        })()
    }
    .ok();
    Ok(Nvrtc {
        version: (major, minor),
        create,
        compile,
        destroy,
        log_size,
        log,
        ptx_size,
        ptx,
        cubin,
        lib,
    })
}

/// This process's NVRTC, opened on the first call, or every place tried.
fn library_result() -> &'static std::result::Result<Nvrtc, NotFound> {
    static LIB: OnceLock<std::result::Result<Nvrtc, NotFound>> = OnceLock::new();
    LIB.get_or_init(|| load(&nvrtc_spec()))
}

/// This process's NVRTC, or [`Error::RuntimeNotFound`] listing every
/// place tried.
pub(crate) fn library() -> Result<&'static Nvrtc> {
    library_result()
        .as_ref()
        .map_err(|e| Error::RuntimeNotFound {
            backend: "cuda",
            source: e.clone(),
        })
}

/// The NVRTC in use (opening it if need be), or why there is none: for
/// the doctor.
#[cfg(feature = "doctor")]
pub(crate) fn loaded() -> std::result::Result<Loaded, String> {
    library_result()
        .as_ref()
        .map(Nvrtc::loaded)
        .map_err(ToString::to_string)
}

/// A program, destroyed when dropped.
struct Prog<'a> {
    lib: &'a Nvrtc,
    prog: Program,
}

impl Drop for Prog<'_> {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once, here. A
        // failure has nowhere to go: the program is leaked.
        let rc = unsafe { (self.lib.destroy)(&mut self.prog) };
        if rc != 0 {
            tracing::debug!(status = rc, "nvrtcDestroyProgram failed");
        }
    }
}

impl Nvrtc {
    /// What the doctor shows of this copy.
    #[cfg(feature = "doctor")]
    pub(crate) fn loaded(&self) -> Loaded {
        let (major, minor) = self.version;
        Loaded::of(&self.lib, Some(format!("{major}.{minor}")))
    }

    /// Whether this NVRTC gives machine code ([`Output::Cubin`]).
    pub(crate) fn has_cubin(&self) -> bool {
        self.cubin.is_some()
    }

    /// Compiles `source` (named `name` in messages) with `options` and
    /// returns `output`: the PTX without its terminating NUL, or the cubin
    /// (the options then name a real arch, `sm_90`). `arch` names the
    /// target in errors.
    ///
    /// Errors: [`Error::Nvrtc`] naming the call that failed, with NVRTC's
    /// log when the compile itself failed; `nvrtcGetCUBIN` with
    /// `NVRTC_ERROR_INVALID_INPUT` when this NVRTC has no cubin calls.
    pub(crate) fn compile(
        &self,
        source: &str,
        name: &str,
        options: &[String],
        arch: &str,
        output: Output,
    ) -> Result<Vec<u8>> {
        let fail = |op: &'static str, code: c_int, log: String| Error::Nvrtc {
            arch: arch.to_owned(),
            op,
            code,
            status: status_name(code),
            log,
        };
        let nul = |_| fail("nvrtcCreateProgram", INTERIOR_NUL, String::new());
        let src = CString::new(source).map_err(nul)?;
        let cname = CString::new(name).map_err(nul)?;
        let opts = options
            .iter()
            .map(|o| CString::new(o.as_str()))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|_| fail("nvrtcCompileProgram", INTERIOR_NUL, String::new()))?;
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        let n_opts = c_int::try_from(ptrs.len())
            .map_err(|_| fail("nvrtcCompileProgram", 5, "too many options".into()))?;
        let mut raw: Program = std::ptr::null_mut();
        // SAFETY: writes one program handle; `src` and `cname` are
        // NUL-terminated and outlive the call; no headers.
        let rc = unsafe {
            (self.create)(
                &mut raw,
                src.as_ptr(),
                cname.as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(fail("nvrtcCreateProgram", rc, String::new()));
        }
        let prog = Prog {
            lib: self,
            prog: raw,
        };
        // SAFETY: a live program; `ptrs` holds `n_opts` NUL-terminated
        // strings (kept alive by `opts`).
        let rc = unsafe { (self.compile)(prog.prog, n_opts, ptrs.as_ptr()) };
        if rc != 0 {
            return Err(fail("nvrtcCompileProgram", rc, self.program_log(&prog)));
        }
        if output == Output::Cubin {
            let Some((cubin_size, cubin)) = self.cubin else {
                return Err(fail(
                    "nvrtcGetCUBIN",
                    3,
                    "this NVRTC has no cubin calls".into(),
                ));
            };
            let mut size = 0usize;
            // SAFETY: a live, compiled program; writes one size_t.
            let rc = unsafe { cubin_size(prog.prog, &mut size) };
            if rc != 0 {
                return Err(fail("nvrtcGetCUBINSize", rc, String::new()));
            }
            if size == 0 {
                // A virtual arch was compiled for: there is no machine code.
                return Err(fail(
                    "nvrtcGetCUBIN",
                    3,
                    "no cubin for a virtual arch".into(),
                ));
            }
            let mut image = vec![0u8; size];
            // SAFETY: `image` holds the `size` bytes NVRTC said the cubin
            // takes.
            let rc = unsafe { cubin(prog.prog, image.as_mut_ptr().cast()) };
            if rc != 0 {
                return Err(fail("nvrtcGetCUBIN", rc, String::new()));
            }
            return Ok(image);
        }
        let mut size = 0usize;
        // SAFETY: a live, compiled program; writes one size_t.
        let rc = unsafe { (self.ptx_size)(prog.prog, &mut size) };
        if rc != 0 {
            return Err(fail("nvrtcGetPTXSize", rc, String::new()));
        }
        let mut ptx = vec![0u8; size];
        // SAFETY: `ptx` holds the `size` bytes NVRTC said the PTX takes
        // (with its NUL).
        let rc = unsafe { (self.ptx)(prog.prog, ptx.as_mut_ptr().cast()) };
        if rc != 0 {
            return Err(fail("nvrtcGetPTX", rc, String::new()));
        }
        let end = ptx.iter().position(|&b| b == 0).unwrap_or(ptx.len());
        ptx.truncate(end);
        Ok(ptx)
    }

    /// The program's log, or a note saying why it could not be read.
    fn program_log(&self, prog: &Prog<'_>) -> String {
        let mut size = 0usize;
        // SAFETY: a live program; writes one size_t.
        let rc = unsafe { (self.log_size)(prog.prog, &mut size) };
        if rc != 0 {
            return format!("(no log: nvrtcGetProgramLogSize: {})", status_name(rc));
        }
        let mut log = vec![0u8; size.max(1)];
        // SAFETY: `log` holds the `size` bytes NVRTC said the log takes.
        let rc = unsafe { (self.log)(prog.prog, log.as_mut_ptr().cast()) };
        if rc != 0 {
            return format!("(no log: nvrtcGetProgramLog: {})", status_name(rc));
        }
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        String::from_utf8_lossy(&log[..end]).trim_end().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_follow_the_header_and_unknown_codes_are_numbers() {
        assert_eq!(status_name(0), "NVRTC_SUCCESS");
        assert_eq!(status_name(6), "NVRTC_ERROR_COMPILATION");
        assert_eq!(status_name(18), "NVRTC_ERROR_BUSY");
        assert_eq!(status_name(99), "unknown nvrtcResult");
        let e = Error::Nvrtc {
            arch: "compute_90".into(),
            op: "nvrtcCompileProgram",
            code: 6,
            status: status_name(6),
            log: "kernel.cu(3): error: expected a \";\"".into(),
        };
        let text = e.to_string();
        assert!(
            text.starts_with(
                "cuda: nvrtc compile for compute_90: nvrtcCompileProgram: \
                 NVRTC_ERROR_COMPILATION (status 6)"
            ),
            "{text}"
        );
        assert!(text.contains("expected a"), "{text}");
    }

    #[test]
    fn a_missing_library_lists_where_it_looked_and_a_wrong_one_its_symbol() {
        let spec = Spec {
            what: "NVRTC (libnvrtc)",
            sonames: vec!["libnvrtc-rocm-safe-absent.so.13"],
            stem: "libnvrtc-rocm-safe-absent.so",
            env_var: Some("ROCM_SAFE_TEST_NVRTC_UNSET"),
            folders: vec![("/nonexistent/cuda/lib64".into(), "a CUDA folder".into())],
            ..Spec::default()
        };
        let e = load(&spec).unwrap_err().to_string();
        assert!(e.starts_with("NVRTC (libnvrtc) not found; tried "), "{e}");
        assert!(e.contains("$ROCM_SAFE_TEST_NVRTC_UNSET: not set"), "{e}");
        assert!(e.contains("a CUDA folder (/nonexistent/cuda/lib64)"), "{e}");
        assert!(
            e.contains("loader path libnvrtc-rocm-safe-absent.so.13"),
            "{e}"
        );
        // A library that loads but is not NVRTC.
        let libc = Spec {
            what: "NVRTC",
            sonames: vec!["libc.so.6"],
            stem: "libc.so",
            ..Spec::default()
        };
        let e = load(&libc).unwrap_err().to_string();
        assert!(
            e.ends_with("(already loaded in this process (libc.so.6)): loaded, but it does not export nvrtcVersion"),
            "{e}"
        );
    }

    #[test]
    fn this_machines_nvrtc_is_bound_or_typed() {
        match library() {
            Ok(n) => {
                let (major, _) = n.version;
                assert!(major >= 11, "{major}");
                let l = n.loaded();
                assert!(l.version.is_some() && l.path.is_some(), "{l:?}");
                assert_eq!(loaded().map(|l| l.version), Ok(l.version));
                // A kernel compiles; a broken one fails with NVRTC's log;
                // an unknown option is refused.
                let opts = ["--gpu-architecture=compute_75".to_owned()];
                let ok = "extern \"C\" __global__ void k(float *p) { p[0] = 1.0f; }";
                let ptx = n
                    .compile(ok, "k.cu", &opts, "compute_75", Output::Ptx)
                    .unwrap();
                let ptx = String::from_utf8(ptx).unwrap();
                assert!(ptx.contains(".entry k") && !ptx.contains('\0'), "{ptx}");
                // Machine code for a real arch: an ELF image; asking a
                // virtual arch for one is an error, not an empty image.
                if n.has_cubin() {
                    let real = ["--gpu-architecture=sm_75".to_owned()];
                    let elf = n
                        .compile(ok, "k.cu", &real, "sm_75", Output::Cubin)
                        .unwrap();
                    assert_eq!(elf.get(..4), Some(&b"\x7fELF"[..]));
                    assert!(matches!(
                        n.compile(ok, "k.cu", &opts, "compute_75", Output::Cubin),
                        Err(Error::Nvrtc { .. })
                    ));
                }
                let bad = "extern \"C\" __global__ void k(float *p) { p[0] = }";
                match n.compile(bad, "bad.cu", &opts, "compute_75", Output::Ptx) {
                    Err(Error::Nvrtc { code: 6, log, .. }) => {
                        assert!(log.contains("bad.cu"), "{log}")
                    }
                    other => panic!("{other:?}"),
                }
                let wrong = ["--rocm-safe-no-such-option".to_owned()];
                assert!(matches!(
                    n.compile(ok, "k.cu", &wrong, "compute_75", Output::Ptx),
                    Err(Error::Nvrtc { code: 5, .. })
                ));
                assert!(matches!(
                    n.compile("a\0b", "k.cu", &opts, "compute_75", Output::Ptx),
                    Err(Error::Nvrtc {
                        code: INTERIOR_NUL,
                        ..
                    })
                ));
            }
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        Error::RuntimeNotFound {
                            backend: "cuda",
                            ..
                        }
                    ),
                    "{e}"
                );
                assert!(
                    e.to_string().contains("NVRTC (libnvrtc) not found; tried"),
                    "{e}"
                );
                let why = loaded().unwrap_err();
                assert!(why.contains("not found; tried"), "{why}");
            }
        }
    }
}
