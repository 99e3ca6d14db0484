//! The stand-in HIP runtime (`tests/hip-standin/standin.c` and the parts
//! it includes, `tests/hip-standin/standin_*.c`): built here
//! with the C compiler, once per HIP major, and driven through its
//! `standin_*` exports; and the child processes the HIP runtime tests run
//! in (the crate picks its HIP runtime once per process, so every scenario
//! gets a fresh one).
//!
//! [`library`] compiles `libamdhip64.so.{5,6,7}` (each with its soname,
//! each alone in a folder of its own, and the three together in a fourth;
//! plus a HIP 7 one under a full version's name)
//! into `$CARGO_TARGET_TMPDIR/hip-standin/<hash of the source>/`, so a
//! second run reuses them. [`scenario`] runs a test body in a child: the
//! test binary itself, asked for exactly that test, with
//! [`SCENARIO_VAR`] naming it and the HIP-related environment of the parent
//! removed. [`Standin`] is the copy loaded in the (child) process.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

/// The stand-in's C source: `standin.c` (compiled), then the parts it
/// `#include`s, each as (file name, text).
pub const SOURCES: [(&str, &str); 4] = [
    ("standin.c", include_str!("../hip-standin/standin.c")),
    (
        "standin_runtime.c",
        include_str!("../hip-standin/standin_runtime.c"),
    ),
    (
        "standin_modules.c",
        include_str!("../hip-standin/standin_modules.c"),
    ),
    (
        "standin_control.c",
        include_str!("../hip-standin/standin_control.c"),
    ),
];
/// The HIP majors a stand-in is built as, newest first.
pub const MAJORS: [u32; 3] = [7, 6, 5];
/// Names the scenario a child process runs.
pub const SCENARIO_VAR: &str = "ROCM_SAFE_STANDIN_SCENARIO";
/// The variables a child never inherits: they choose the HIP runtime, its
/// device or the stand-in's configuration.
pub const CLEARED_VARS: &[&str] = &[
    "ROCM_SAFE_HIP_RUNTIME",
    "ROCM_PATH",
    "HIP_PATH",
    "HSA_OVERRIDE_GFX_VERSION",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "CUDA_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
    "LD_PRELOAD",
    "ROCM_SAFE_STANDIN_DEVICES",
    "ROCM_SAFE_STANDIN_MEM_MB",
    "ROCM_SAFE_PINNED",
];

/// Where the built stand-ins are.
#[derive(Debug, Clone)]
pub struct Built {
    /// The folder of everything built from this source.
    pub root: PathBuf,
}

impl Built {
    /// `libamdhip64.so.{major}`, alone in its folder.
    pub fn file(&self, major: u32) -> PathBuf {
        self.folder(major).join(soname(major))
    }

    /// The folder holding only `libamdhip64.so.{major}`.
    pub fn folder(&self, major: u32) -> PathBuf {
        self.root.join(format!("so{major}"))
    }

    /// A folder holding the three sonames (`.so.7`, `.so.6`, `.so.5`).
    pub fn all(&self) -> PathBuf {
        self.root.join("all")
    }

    /// A HIP 7 stand-in under a full version's name, whose soname is that
    /// name too (as a runtime a framework loads by path may be): no
    /// soname the crate asks for matches it, only its mapped file does.
    pub fn full_version_name(&self) -> PathBuf {
        self.root.join("versioned").join(FULL_VERSION_NAME)
    }
}

/// The file name of [`Built::full_version_name`].
pub const FULL_VERSION_NAME: &str = "libamdhip64.so.7.1.25424";

/// `libamdhip64.so.{major}`.
pub fn soname(major: u32) -> String {
    format!("libamdhip64.so.{major}")
}

/// The C compiler: `$CC`, else `cc`.
pub fn compiler() -> String {
    std::env::var("CC")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| "cc".to_owned())
}

/// The stand-ins built (once per process; reused across runs while the
/// source is unchanged). Errors name the compiler and its output.
pub fn library() -> Result<Built, String> {
    static BUILT: OnceLock<Mutex<Option<Built>>> = OnceLock::new();
    let slot = BUILT.get_or_init(|| Mutex::new(None));
    let mut slot = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(b) = slot.as_ref() {
        return Ok(b.clone());
    }
    let mut h = DefaultHasher::new();
    SOURCES.hash(&mut h);
    compiler().hash(&mut h);
    let root = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("hip-standin")
        .join(format!("{:016x}", h.finish()));
    let built = Built { root };
    std::fs::create_dir_all(built.all()).map_err(|e| format!("{}: {e}", built.all().display()))?;
    for (name, text) in SOURCES {
        write_atomically(&built.root.join(name), text.as_bytes())?;
    }
    let src = built.root.join(SOURCES[0].0);
    for major in MAJORS {
        let out = built.file(major);
        if !out.exists() {
            compile(&src, major, &soname(major), &out)?;
        }
        let in_all = built.all().join(soname(major));
        if !in_all.exists() {
            let bytes = std::fs::read(&out).map_err(|e| format!("{}: {e}", out.display()))?;
            write_atomically(&in_all, &bytes)?;
        }
    }
    let versioned = built.full_version_name();
    if !versioned.exists() {
        compile(&src, 7, FULL_VERSION_NAME, &versioned)?;
    }
    *slot = Some(built.clone());
    Ok(built)
}

/// Writes `path` through a temporary file and a rename, so that another
/// test process sees the whole file or none.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

fn compile(src: &Path, major: u32, soname: &str, out: &Path) -> Result<(), String> {
    std::fs::create_dir_all(out.parent().unwrap_or(Path::new(".")))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let cc = compiler();
    let result = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror"])
        .arg(format!("-DSTANDIN_MAJOR={major}"))
        .arg(format!("-Wl,-soname,{soname}"))
        .arg("-o")
        .arg(&tmp)
        .arg(src)
        .arg("-lpthread")
        .output()
        .map_err(|e| format!("the C compiler `{cc}` did not run: {e}"))?;
    if !result.status.success() {
        return Err(format!(
            "`{cc}` failed to build the stand-in HIP {major} runtime:\n{}",
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    std::fs::rename(&tmp, out).map_err(|e| format!("{}: {e}", out.display()))
}

/// Names the case of a scenario a child process runs.
pub const CASE_VAR: &str = "ROCM_SAFE_STANDIN_CASE";

/// Runs `body` as case `case` of the scenario test `test` (the name of the
/// calling test function), in a child process: the test binary asked for
/// exactly `test`, with [`SCENARIO_VAR`] and [`CASE_VAR`] naming the case
/// and the environment `configure` sets on top of the parent's, less
/// [`CLEARED_VARS`]. In that child, the call whose case is named runs
/// `body` and the test's other calls do nothing. In the parent, the child
/// must succeed and have run `body` to its end (a marker printed after
/// it), else this panics with the child's output.
pub fn scenario(
    test: &str,
    case: &str,
    configure: impl FnOnce(&mut Command),
    body: impl FnOnce() -> Result<(), String>,
) {
    let marker = format!("standin scenario {test} [{case}]: completed");
    if let Ok(running) = std::env::var(SCENARIO_VAR) {
        if running == test && std::env::var(CASE_VAR).is_ok_and(|c| c == case) {
            if let Err(e) = body() {
                panic!("scenario {test} [{case}] failed: {e}");
            }
            println!("{marker}");
        }
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = Command::new(exe);
    cmd.args([
        test,
        "--exact",
        "--include-ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    for v in CLEARED_VARS {
        cmd.env_remove(v);
    }
    cmd.env(SCENARIO_VAR, test).env(CASE_VAR, case);
    configure(&mut cmd);
    let out = cmd.output().expect("the child test process starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains(&marker) && text.contains("1 passed"),
        "scenario {test} [{case}] in a child process: {}\n----- child output -----\n{text}",
        out.status
    );
}

// ----- the stand-in in this process ----------------------------------------

/// The loaded stand-in's control exports.
pub struct Standin {
    handle: *mut c_void,
    /// The file the handle was opened by.
    pub path: PathBuf,
}

/// The live resources `standin_live` counts.
#[derive(Debug, Clone, Copy)]
pub enum Live {
    /// Device allocations.
    Allocations = 0,
    /// Device bytes allocated.
    DeviceBytes = 1,
    /// Pinned host allocations (`hipHostMalloc`).
    HostAllocations = 2,
    /// Registered host ranges (`hipHostRegister`).
    Registered = 3,
    /// Streams.
    Streams = 4,
    /// Events.
    Events = 5,
    /// Modules.
    Modules = 6,
}

/// What an address argument of a recorded launch pointed to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointerArg {
    /// Null.
    Null,
    /// Memory the device can access (a device allocation, pinned or
    /// registered host memory) at launch time.
    Device,
    /// Anything else.
    Elsewhere,
}

/// One recorded `hipModuleLaunchKernel`.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The kernel's name.
    pub name: String,
    /// Blocks per dimension.
    pub grid: [u32; 3],
    /// Threads per block per dimension.
    pub block: [u32; 3],
    /// Dynamic shared memory bytes.
    pub shared: u32,
    /// The stand-in's id of the stream (0: the null stream).
    pub stream_id: u32,
    /// The argument segment packed by the registered layout, or the
    /// `extra` buffer.
    pub args: Vec<u8>,
    /// 1: by a registered layout; 2: an `extra` buffer; 0: not packed (no
    /// layout registered).
    pub packed: i32,
    /// Per argument of the layout: `Some` for an address argument.
    pub pointers: Vec<Option<PointerArg>>,
}

impl Launch {
    /// The `len` bytes at `offset` of the packed arguments, as a
    /// little-endian number.
    pub fn arg_u64(&self, offset: usize, len: usize) -> Option<u64> {
        let b = self.args.get(offset..offset.checked_add(len)?)?;
        let mut a = [0u8; 8];
        a.get_mut(..len)?.copy_from_slice(b);
        Some(u64::from_le_bytes(a))
    }
}

fn dlopen(path: &Path, flags: c_int) -> Option<*mut c_void> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a NUL-terminated path; dlopen of the stand-in runs no
    // initialiser of its own.
    let h = unsafe { libc::dlopen(c.as_ptr(), flags) };
    (!h.is_null()).then_some(h)
}

impl Standin {
    /// The stand-in the process has already loaded from `path` (with
    /// `RTLD_NOLOAD`: never loads a copy).
    pub fn loaded_from(path: &Path) -> Option<Standin> {
        dlopen(path, libc::RTLD_NOW | libc::RTLD_NOLOAD).map(|handle| Standin {
            handle,
            path: path.to_path_buf(),
        })
    }

    /// Loads the stand-in at `path` as a trainer's framework would, with
    /// `RTLD_GLOBAL` (or returns the copy already loaded).
    pub fn load_global(path: &Path) -> Result<Standin, String> {
        dlopen(path, libc::RTLD_NOW | libc::RTLD_GLOBAL)
            .map(|handle| Standin {
                handle,
                path: path.to_path_buf(),
            })
            .ok_or_else(|| format!("dlopen {}: {}", path.display(), dlerror()))
    }

    fn sym(&self, name: &str) -> *mut c_void {
        let c = CString::new(name).expect("a symbol name without NUL");
        // SAFETY: a live handle (never closed) and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        assert!(!p.is_null(), "the stand-in exports {name}");
        p
    }

    /// Whether this library exports `name` (a stand-in exports `standin_major`).
    pub fn exports(&self, name: &str) -> bool {
        let c = CString::new(name).expect("a symbol name without NUL");
        // SAFETY: as in `sym`.
        !unsafe { libc::dlsym(self.handle, c.as_ptr()) }.is_null()
    }

    /// The HIP major the stand-in was built as.
    pub fn major(&self) -> i32 {
        // SAFETY: `int standin_major(void)`.
        let f: extern "C" fn() -> c_int = unsafe { std::mem::transmute(self.sym("standin_major")) };
        f()
    }

    /// The device's arch (`gfx1151`).
    pub fn arch(&self) -> String {
        // SAFETY: `const char* standin_arch(void)`, a static string.
        let f: extern "C" fn() -> *const c_char =
            unsafe { std::mem::transmute(self.sym("standin_arch")) };
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(f()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Makes call number `nth` of `func` (counted over all its calls, past
    /// ones included) return `code`, and each later one too with `every`.
    pub fn fail_call(&self, func: &str, nth: u64, code: i32, every: bool) {
        type F = extern "C" fn(*const c_char, u64, c_int, c_int) -> c_int;
        // SAFETY: `int standin_fail_call(const char*, unsigned long, int, int)`.
        let f: F = unsafe { std::mem::transmute(self.sym("standin_fail_call")) };
        let c = CString::new(func).expect("a function name");
        assert_eq!(f(c.as_ptr(), nth, code, c_int::from(every)), 0);
    }

    /// Makes the next call of `func` return `code`.
    pub fn fail_next(&self, func: &str, code: i32) {
        self.fail_call(func, self.calls(func) + 1, code, false);
    }

    /// How many times `func` was called.
    pub fn calls(&self, func: &str) -> u64 {
        // SAFETY: `unsigned long standin_call_count(const char*)`.
        let f: extern "C" fn(*const c_char) -> u64 =
            unsafe { std::mem::transmute(self.sym("standin_call_count")) };
        let c = CString::new(func).expect("a function name");
        f(c.as_ptr())
    }

    /// The calling thread's pending last error (not cleared).
    pub fn thread_last_error(&self) -> i32 {
        // SAFETY: `int standin_thread_last_error(void)`.
        let f: extern "C" fn() -> c_int =
            unsafe { std::mem::transmute(self.sym("standin_thread_last_error")) };
        f()
    }

    /// The first pending last error of any live thread (0: none) and how
    /// many threads hold one.
    pub fn pending_errors(&self) -> (i32, i32) {
        // SAFETY: `int standin_pending_errors(int*)`.
        let f: extern "C" fn(*mut c_int) -> c_int =
            unsafe { std::mem::transmute(self.sym("standin_pending_errors")) };
        let mut n = 0;
        let first = f(&mut n);
        (first, n)
    }

    /// A live-resource count.
    pub fn live(&self, what: Live) -> u64 {
        // SAFETY: `unsigned long standin_live(int)`.
        let f: extern "C" fn(c_int) -> u64 =
            unsafe { std::mem::transmute(self.sym("standin_live")) };
        f(what as c_int)
    }

    /// Bytes `hipMemcpyAsync` copied with this `hipMemcpyKind`.
    pub fn copied_bytes(&self, kind: i32) -> u64 {
        // SAFETY: `unsigned long long standin_copied_bytes(int)`.
        let f: extern "C" fn(c_int) -> u64 =
            unsafe { std::mem::transmute(self.sym("standin_copied_bytes")) };
        f(kind)
    }

    /// Module `index`'s whole image and the code object chosen from it for
    /// the device (copies made at load, alive until the process ends).
    pub fn module_image(&self, index: usize) -> Option<(&'static [u8], &'static [u8])> {
        type F =
            extern "C" fn(usize, *mut *const u8, *mut usize, *mut *const u8, *mut usize) -> c_int;
        // SAFETY: `int standin_module_image(size_t, const unsigned char**,
        // size_t*, const unsigned char**, size_t*)`.
        let f: F = unsafe { std::mem::transmute(self.sym("standin_module_image")) };
        let (mut img, mut img_len, mut elf, mut elf_len) =
            (std::ptr::null(), 0usize, std::ptr::null(), 0usize);
        if f(index, &mut img, &mut img_len, &mut elf, &mut elf_len) != 0 {
            return None;
        }
        // SAFETY: the stand-in keeps both copies for the process's life.
        unsafe {
            Some((
                std::slice::from_raw_parts(img, img_len),
                std::slice::from_raw_parts(elf, elf_len),
            ))
        }
    }

    /// Registers kernel `name`'s explicit arguments: `(size, offset,
    /// is an address)` each.
    pub fn set_kernel_layout(&self, name: &str, args: &[(u64, u64, bool)]) {
        type F = extern "C" fn(*const c_char, u32, *const usize, *const usize, *const u8) -> c_int;
        // SAFETY: `int standin_set_kernel_layout(const char*, unsigned,
        // const size_t*, const size_t*, const unsigned char*)`.
        let f: F = unsafe { std::mem::transmute(self.sym("standin_set_kernel_layout")) };
        let c = CString::new(name).expect("a kernel name");
        let sizes: Vec<usize> = args.iter().map(|a| a.0 as usize).collect();
        let offsets: Vec<usize> = args.iter().map(|a| a.1 as usize).collect();
        let pointer: Vec<u8> = args.iter().map(|a| u8::from(a.2)).collect();
        let n = u32::try_from(args.len()).expect("a few arguments");
        assert_eq!(
            f(
                c.as_ptr(),
                n,
                sizes.as_ptr(),
                offsets.as_ptr(),
                pointer.as_ptr()
            ),
            0,
            "layout of {name}"
        );
    }

    /// Every launch recorded so far.
    pub fn launches(&self) -> Vec<Launch> {
        // SAFETY: `size_t standin_launch_count(void)`.
        let count: extern "C" fn() -> usize =
            unsafe { std::mem::transmute(self.sym("standin_launch_count")) };
        type F = extern "C" fn(
            usize,
            *mut *const c_char,
            *mut u32,
            *mut u32,
            *mut *const u8,
            *mut usize,
            *mut c_int,
            *mut u8,
        ) -> c_int;
        // SAFETY: `int standin_launch(size_t, const char**, unsigned[7],
        // unsigned*, const unsigned char**, size_t*, int*, unsigned char[32])`.
        let get: F = unsafe { std::mem::transmute(self.sym("standin_launch")) };
        (0..count())
            .map(|i| {
                let (mut name, mut dims, mut stream_id) = (std::ptr::null(), [0u32; 7], 0u32);
                let (mut args, mut len, mut packed, mut ptrs) =
                    (std::ptr::null(), 0usize, 0, [0u8; 32]);
                let rc = get(
                    i,
                    &mut name,
                    dims.as_mut_ptr(),
                    &mut stream_id,
                    &mut args,
                    &mut len,
                    &mut packed,
                    ptrs.as_mut_ptr(),
                );
                assert_eq!(rc, 0, "launch {i} recorded");
                Launch {
                    // SAFETY: the stand-in's NUL-terminated record, kept.
                    name: unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned(),
                    grid: [dims[0], dims[1], dims[2]],
                    block: [dims[3], dims[4], dims[5]],
                    shared: dims[6],
                    stream_id,
                    args: if args.is_null() {
                        Vec::new()
                    } else {
                        // SAFETY: `len` bytes kept by the stand-in.
                        unsafe { std::slice::from_raw_parts(args, len) }.to_vec()
                    },
                    packed,
                    pointers: ptrs
                        .iter()
                        .map(|p| match p {
                            1 => Some(PointerArg::Null),
                            2 => Some(PointerArg::Device),
                            3 => Some(PointerArg::Elsewhere),
                            _ => None,
                        })
                        .collect(),
                }
            })
            .collect()
    }

    /// The stand-in's id of a stream handle (0 for the null stream or a
    /// handle it does not know).
    pub fn stream_id(&self, raw: u64) -> u32 {
        // SAFETY: `unsigned standin_stream_id(hipStream_t)`; only compared.
        let f: extern "C" fn(*mut c_void) -> u32 =
            unsafe { std::mem::transmute(self.sym("standin_stream_id")) };
        f(raw as usize as *mut c_void)
    }

    /// `hipMalloc` of this stand-in, called directly: (code, address).
    pub fn hip_malloc(&self, bytes: usize) -> (i32, *mut c_void) {
        type F = extern "C" fn(*mut *mut c_void, usize) -> c_int;
        // SAFETY: `hipError_t hipMalloc(void**, size_t)`.
        let f = unsafe { std::mem::transmute::<*mut c_void, F>(self.sym("hipMalloc")) };
        let mut p = std::ptr::null_mut();
        (f(&mut p, bytes), p)
    }

    /// `hipSetDevice` of this stand-in, called directly.
    pub fn hip_set_device(&self, ordinal: i32) -> i32 {
        type F = extern "C" fn(c_int) -> c_int;
        // SAFETY: `hipError_t hipSetDevice(int)`.
        let f = unsafe { std::mem::transmute::<*mut c_void, F>(self.sym("hipSetDevice")) };
        f(ordinal)
    }

    /// `hipStreamCreateWithFlags(hipStreamNonBlocking)` of this stand-in,
    /// called directly, as a framework makes its streams: (code, handle).
    pub fn hip_stream_create(&self) -> (i32, u64) {
        type F = extern "C" fn(*mut *mut c_void, u32) -> c_int;
        // SAFETY: `hipError_t hipStreamCreateWithFlags(hipStream_t*, unsigned)`.
        let f =
            unsafe { std::mem::transmute::<*mut c_void, F>(self.sym("hipStreamCreateWithFlags")) };
        let mut s = std::ptr::null_mut();
        (f(&mut s, 1), s as usize as u64)
    }

    /// `hipGetLastError` of this stand-in, as a caller (PyTorch) would
    /// call it after its own work.
    pub fn hip_get_last_error(&self) -> i32 {
        // SAFETY: `hipError_t hipGetLastError(void)`.
        let f: extern "C" fn() -> c_int =
            unsafe { std::mem::transmute(self.sym("hipGetLastError")) };
        f()
    }
}

fn dlerror() -> String {
    // SAFETY: null or a NUL-terminated message, copied at once.
    let p = unsafe { libc::dlerror() };
    if p.is_null() {
        return "unknown loader error".into();
    }
    // SAFETY: as above.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// The distinct files named `libamdhip64*` mapped in this process, from
/// `/proc/self/maps`, told apart by device and inode.
pub fn mapped_hip_runtimes() -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut seen: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut out = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.splitn(6, ' ').nth(5).map(str::trim_start) else {
            continue;
        };
        let p = Path::new(path);
        let is_hip = p
            .file_name()
            .is_some_and(|f| f.to_string_lossy().starts_with("libamdhip64"));
        if !is_hip {
            continue;
        }
        let id = std::fs::metadata(p)
            .map(|m| (m.dev(), m.ino()))
            .unwrap_or((0, 0));
        if let std::collections::hash_map::Entry::Vacant(e) = seen.entry(id) {
            e.insert(p.to_path_buf());
            out.push(p.to_path_buf());
        }
    }
    out
}
