//! Builds the GPU kernels in `hip-kernels/` for the enabled backends.
//!
//! - feature `hip`: one code object (an offload bundle, as `hipcc --genco`
//!   writes) per gfx arch, embedded with `include_bytes!`. The archs come
//!   from `ROCM_SAFE_OFFLOAD_ARCH`, else `PYTORCH_ROCM_ARCH` (`,` `;` or space
//!   separated), else [`DEFAULT_ARCHS`] (those the compiler can target). The
//!   compiler is the best one found ([`find_hip_compiler`]):
//!   `$ROCM_SAFE_HIP_CLANG`, then a ROCm >= 6 hipcc (real HIP headers), then a
//!   clang >= 19 with lld (HIP device-only, `-nogpuinc -nogpulib`, with
//!   `hip-kernels/hip_standin.h` in place of `<hip/hip_runtime.h>`), then an
//!   older hipcc (Debian's 5.2) for the archs it can target. The code object
//!   version is pinned ([`HipCompiler::code_object_version`]). An arch that
//!   was asked for and cannot be built is a build error naming the compiler,
//!   its version and what to install.
//! - feature `cuda`: two modules (`core.hip`: conversions, fingerprints,
//!   scans; `conv3d.hip` with the `conv3d_*.hip` files it includes), each flattened into one source (embedded, compiled
//!   with NVRTC at run time) and, when nvcc is found, also PTX built here for
//!   `ROCM_SAFE_CUDA_ARCH` (default `compute_75`, the oldest target CUDA 13
//!   still accepts; the driver JIT-compiles it for newer GPUs). If nvcc
//!   fails, a warning is printed and NVRTC is used.
//! - neither: no GPU work at all.
//! - `DOCS_RS` set (docs.rs, or `DOCS_RS=1 cargo doc`): nothing is compiled;
//!   the generated tables are empty, so `--all-features` docs build without
//!   any GPU toolchain.
//!
//! Output: `$OUT_DIR/kernels.rs` (included by `src/device/kernels.rs`) and,
//! always, `$OUT_DIR/hip_build.rs` (what was built for HIP and by which
//! compiler; included by `src/diagnostics/build_info.rs`).

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// The kernel files, each watched with `rerun-if-changed`.
const KERNEL_FILES: &[&str] = &[
    "hip-kernels/prelude.h",
    "hip-kernels/bf16.h",
    "hip-kernels/hip_standin.h",
    "hip-kernels/kernels.hip",
    "hip-kernels/core.hip",
    "hip-kernels/convert.hip",
    "hip-kernels/fingerprint.hip",
    "hip-kernels/convert_fingerprint.hip",
    "hip-kernels/nonfinite.hip",
    "hip-kernels/widen_check.hip",
    "hip-kernels/conv3d.hip",
    "hip-kernels/conv3d_naive.hip",
    "hip-kernels/conv3d_check.hip",
    "hip-kernels/conv3d_backward.hip",
    "hip-kernels/conv3d_wgrad.hip",
];
/// The translation unit that includes every kernel file (HIP).
const ENTRY: &str = "hip-kernels/kernels.hip";
/// The CUDA sources (translation units), in `KernelModule::source` order.
const CUDA_SOURCES: [(&str, &str); 2] = [
    ("core", "hip-kernels/core.hip"),
    ("conv3d", "hip-kernels/conv3d.hip"),
];
/// The CUDA modules, in `KernelModule` order: (name, index into
/// `CUDA_SOURCES`, the `RS_PART` it is compiled with: prelude.h).
const CUDA_MODULES: [(&str, usize, u32); 6] = [
    ("core", 0, 0),
    ("conv3d", 1, 1),
    ("conv3d_naive", 1, 2),
    ("conv3d_tiled_f32", 1, 3),
    ("conv3d_tiled_bf16", 1, 4),
    ("conv3d_tiled_bf16_mma", 1, 5),
];

/// Archs built when no list is given, where the compiler can target them:
/// Strix Halo / Strix Point / Krackan Point APUs, RDNA3, RDNA4, MI300,
/// MI200, MI100, RDNA2 (every arch of ROCm 6.4/7.x's lists that clang 19
/// targets; docs/amd.md says which are left out and why).
const DEFAULT_ARCHS: &[&str] = &[
    "gfx1151", "gfx1150", "gfx1152", "gfx1100", "gfx1101", "gfx1102", "gfx1200", "gfx1201",
    "gfx942", "gfx90a", "gfx908", "gfx1030",
];

/// The oldest clang major version that targets every arch of
/// [`DEFAULT_ARCHS`] (gfx1150/gfx1151 and gfx12 need 19 in Debian's builds).
const MIN_CLANG_MAJOR: u32 = 19;

/// What to install for a compiler that can build every default arch.
const INSTALL_HINT: &str =
    "install clang >= 19 with lld (Debian/Ubuntu: `apt install clang-19 lld-19`; \
     build.rs finds clang-19, clang-20, ... on PATH, or set ROCM_SAFE_HIP_CLANG=/path/to/clang) \
     or ROCm >= 6 (its hipcc)";

fn env_var(name: &str) -> Option<String> {
    println!("cargo::rerun-if-env-changed={name}");
    env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether a C compiler runs (`$CC`, else `cc`). The HIP runtime tests
/// build their stand-in runtime with it (`tests/hip_runtime_standin.rs`)
/// and are ignored, with that reason, where none does.
fn c_compiler_runs() -> bool {
    let cc = env_var("CC").unwrap_or_else(|| "cc".into());
    Command::new(cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rustc-check-cfg=cfg(rocm_safe_cuda_ptx)");
    println!("cargo::rustc-check-cfg=cfg(rocm_safe_no_c_compiler)");
    let out = match env::var_os("OUT_DIR") {
        Some(o) => PathBuf::from(o),
        None => fail("OUT_DIR is not set (build.rs must run under cargo)"),
    };
    let hip = env::var_os("CARGO_FEATURE_HIP").is_some();
    let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    let docs_rs = env_var("DOCS_RS").is_some();
    if hip && !docs_rs && !c_compiler_runs() {
        println!("cargo::rustc-cfg=rocm_safe_no_c_compiler");
    }
    let mut info = HipBuildInfo::default();
    if (hip || cuda) && !docs_rs {
        for f in KERNEL_FILES {
            println!("cargo::rerun-if-changed={f}");
        }
    }
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let mut rs = String::from("// @generated by build.rs\n");
    if hip {
        if docs_rs {
            rs.push_str(
                "/// Empty: built with DOCS_RS set (no kernels compiled).\n\
                 pub(crate) const HIP_CODE_OBJECTS: &[(&str, &[u8])] = &[];\n",
            );
        } else {
            info = build_hip(&manifest, &out, &mut rs);
        }
    }
    if cuda {
        if docs_rs {
            rs.push_str(
                "/// Empty: built with DOCS_RS set (no kernels compiled).\n\
                 pub(crate) const CUDA_SOURCES: [&str; 2] = [\"\", \"\"];\n\
                 /// None: built with DOCS_RS set.\n\
                 pub(crate) const CUDA_PTX: Option<[&str; 6]> = None;\n\
                 /// Empty: built with DOCS_RS set.\n\
                 pub(crate) const CUDA_MODULE_PARTS: [(&str, u32); 0] = [];\n",
            );
        } else {
            build_cuda(&manifest, &out, &mut rs);
        }
    }
    write_file(&out.join("kernels.rs"), &rs);
    write_file(&out.join("hip_build.rs"), &info.to_rust());
}

fn write_file(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        fail(&format!("cannot write {}: {e}", path.display()));
    }
}

fn fail(msg: &str) -> ! {
    eprintln!("error: rocm-safe build: {msg}");
    std::process::exit(1);
}

fn find_tool(env_name: &str, exe: &str, extra_dirs: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = env_var(env_name) {
        // An explicit tool that does not exist is "not found", not a
        // confusing failure to run it later.
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    on_path(exe).or_else(|| extra_dirs.iter().map(|d| d.join(exe)).find(|c| c.is_file()))
}

/// `exe` in a directory of `$PATH`.
fn on_path(exe: &str) -> Option<PathBuf> {
    let path = env_var("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(exe))
        .find(|c| c.is_file())
}

fn arch_list() -> (Vec<String>, bool) {
    let given = env_var("ROCM_SAFE_OFFLOAD_ARCH").or_else(|| env_var("PYTORCH_ROCM_ARCH"));
    match given {
        Some(list) => {
            let mut archs: Vec<String> = Vec::new();
            for a in list.split([',', ';', ' ']).map(str::trim) {
                if !a.is_empty() && !archs.iter().any(|b| b == a) {
                    archs.push(a.to_owned());
                }
            }
            (archs, true)
        }
        None => (DEFAULT_ARCHS.iter().map(|s| s.to_string()).collect(), false),
    }
}

/// How a compiler is driven.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// A ROCm hipcc: `hipcc --genco`, the real HIP headers and device libs.
    Hipcc,
    /// A plain clang in HIP device-only mode with `hip_standin.h`.
    Clang,
}

/// The compiler chosen for the HIP kernels.
struct HipCompiler {
    path: PathBuf,
    driver: Driver,
    /// `"clang 19.1.7"`, `"hipcc (HIP 5.2.21153)"`.
    version: String,
    /// The major version that decides what it can target: clang's, or
    /// HIP's for hipcc.
    major: u32,
    /// Where it was found (`$ROCM_SAFE_HIP_CLANG`, `PATH`, ...).
    source: String,
    /// Other compilers seen and why they were not used (for messages).
    passed_over: Vec<String>,
    /// The code object version (set by `pin_code_object_version`).
    cov: u32,
}

impl HipCompiler {
    /// A hipcc found by the search, of HIP `major` (`v` the whole version).
    fn hipcc(path: PathBuf, major: u32, v: &str, passed_over: Vec<String>) -> HipCompiler {
        HipCompiler {
            path,
            driver: Driver::Hipcc,
            version: format!("hipcc (HIP {v})"),
            major,
            source: "hipcc search ($HIPCC, PATH, $ROCM_PATH/bin, /opt/rocm/bin)".into(),
            passed_over,
            cov: 0,
        }
    }

    /// The code object version asked for explicitly:
    /// `$ROCM_SAFE_CODE_OBJECT_VERSION` (4, 5 or 6) when set, else 5 (what
    /// clang >= 19 and ROCm 6 emit by default, what ROCm 6 runtimes load),
    /// or 4 for a hipcc older than ROCm 6 (its own default, what a ROCm 5
    /// runtime loads).
    fn code_object_version(&self) -> u32 {
        self.cov
    }

    fn pin_code_object_version(&mut self) {
        self.cov = match env_var("ROCM_SAFE_CODE_OBJECT_VERSION") {
            Some(v) => match v.trim().parse::<u32>() {
                Ok(n @ 4..=6) => n,
                _ => fail(&format!(
                    "ROCM_SAFE_CODE_OBJECT_VERSION={v}: expected 4, 5 or 6 \
                     (5 for ROCm >= 6 runtimes, 4 for a ROCm 5 runtime)"
                )),
            },
            None if self.driver == Driver::Hipcc && self.major < 6 => 4,
            None => 5,
        };
    }

    fn describe(&self) -> String {
        let how = match self.driver {
            Driver::Hipcc => "hipcc --genco",
            Driver::Clang => "clang -x hip --offload-device-only, hip-kernels/hip_standin.h",
        };
        format!(
            "{} ({}, from {}; {how}; code object v{})",
            self.version,
            self.path.display(),
            self.source,
            self.code_object_version()
        )
    }

    fn command(&self, arch: &str, include: &Path, entry: &Path, dst: &Path) -> Command {
        let mut c = Command::new(&self.path);
        match self.driver {
            Driver::Hipcc => {
                c.arg("--genco");
            }
            Driver::Clang => {
                c.args([
                    "-x",
                    "hip",
                    "--offload-device-only",
                    "-nogpuinc",
                    "-nogpulib",
                ])
                .args(["-std=c++17", "-DRS_HIP_STANDIN", "-include"])
                .arg(include.join("hip_standin.h"));
            }
        }
        c.arg(format!("--offload-arch={arch}"))
            .arg("-O3")
            .arg(format!(
                "-mcode-object-version={}",
                self.code_object_version()
            ))
            .arg("-I")
            .arg(include)
            .arg(entry)
            .arg("-o")
            .arg(dst);
        c
    }
}

/// Runs `exe --version` and returns its output (stdout then stderr).
fn version_text(exe: &Path) -> Option<String> {
    let o = Command::new(exe).arg("--version").output().ok()?;
    if !o.status.success() {
        return None;
    }
    let mut t = String::from_utf8_lossy(&o.stdout).into_owned();
    t.push_str(&String::from_utf8_lossy(&o.stderr));
    Some(t)
}

/// `(major, "X.Y.Z")` after `marker` in `text` (`"clang version "`,
/// `"HIP version: "`).
fn parse_version(text: &str, marker: &str) -> Option<(u32, String)> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let v: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
        .collect();
    let v = v.trim_end_matches(['.', '-']).to_owned();
    let major = v.split('.').next()?.parse().ok()?;
    Some((major, v))
}

/// A clang at `path`: its major version, version string and whether the
/// linker its HIP toolchain runs (`ld.lld`) is there.
fn probe_clang(path: &Path) -> Option<(u32, String, bool)> {
    let text = version_text(path)?;
    let (major, v) = parse_version(&text, "clang version ")?;
    let installed = text
        .lines()
        .find_map(|l| l.strip_prefix("InstalledDir: "))
        .map(|d| PathBuf::from(d.trim()));
    let lld = installed.is_some_and(|d| d.join("ld.lld").is_file()) || on_path("ld.lld").is_some();
    Some((major, v, lld))
}

/// Picks the compiler for the HIP kernels, best first:
/// 1. `$ROCM_SAFE_HIP_CLANG` (a clang, driven in HIP device-only mode);
/// 2. a ROCm >= 6 hipcc (`$HIPCC`, `PATH`, `$ROCM_PATH/bin`, `$HIP_PATH/bin`,
///    `/opt/rocm/bin`);
/// 3. the newest clang >= 19 with lld on `PATH` (`clang`, `clang-19`,
///    `clang-20`, ...) or in `/usr/lib/llvm-N/bin`;
/// 4. an older hipcc (only for the archs it can target).
fn find_hip_compiler() -> Result<HipCompiler, String> {
    let mut passed_over = Vec::new();
    if let Some(p) = env_var("ROCM_SAFE_HIP_CLANG") {
        let path = PathBuf::from(&p);
        let path = if path.components().count() == 1 {
            on_path(&p).unwrap_or(path)
        } else {
            path
        };
        return match probe_clang(&path) {
            Some((major, v, _)) => Ok(HipCompiler {
                path,
                driver: Driver::Clang,
                version: format!("clang {v}"),
                major,
                source: "$ROCM_SAFE_HIP_CLANG".into(),
                passed_over,
                cov: 0,
            }),
            None => Err(format!(
                "ROCM_SAFE_HIP_CLANG={p} is not a clang that runs (`{p} --version` failed \
                 or printed no \"clang version\")"
            )),
        };
    }
    let mut dirs = Vec::new();
    for v in ["ROCM_PATH", "HIP_PATH"] {
        if let Some(p) = env_var(v) {
            dirs.push(PathBuf::from(p).join("bin"));
        }
    }
    dirs.push(PathBuf::from("/opt/rocm/bin"));
    let mut old_hipcc = None;
    if let Some(hipcc) = find_tool("HIPCC", "hipcc", &dirs) {
        match version_text(&hipcc).and_then(|t| parse_version(&t, "HIP version: ")) {
            Some((major, v)) if major >= 6 => {
                return Ok(HipCompiler::hipcc(hipcc, major, &v, passed_over));
            }
            Some((major, v)) => old_hipcc = Some((hipcc, major, v)),
            None => passed_over.push(format!(
                "{} (its --version names no HIP version)",
                hipcc.display()
            )),
        }
    }
    // Every clang we can see, newest first.
    let mut clangs: Vec<(u32, String, PathBuf, String)> = Vec::new();
    let mut candidates: Vec<(PathBuf, String)> = Vec::new();
    if let Some(p) = on_path("clang") {
        candidates.push((p, "PATH".into()));
    }
    for n in (MIN_CLANG_MAJOR..=40).rev() {
        if let Some(p) = on_path(&format!("clang-{n}")) {
            candidates.push((p, "PATH".into()));
        }
        let p = PathBuf::from(format!("/usr/lib/llvm-{n}/bin/clang"));
        if p.is_file() {
            candidates.push((p, format!("/usr/lib/llvm-{n}")));
        }
    }
    for (path, source) in candidates {
        match probe_clang(&path) {
            Some((major, v, true)) if major >= MIN_CLANG_MAJOR => {
                clangs.push((major, v, path, source))
            }
            Some((major, v, false)) if major >= MIN_CLANG_MAJOR => passed_over.push(format!(
                "clang {v} at {} (no ld.lld next to it or on PATH: `apt install lld-{major}`)",
                path.display()
            )),
            Some((_, v, _)) => passed_over.push(format!(
                "clang {v} at {} (older than {MIN_CLANG_MAJOR})",
                path.display()
            )),
            None => {}
        }
    }
    clangs.sort_by_key(|c| std::cmp::Reverse(c.0));
    if let Some((major, v, path, source)) = clangs.into_iter().next() {
        if let Some((hipcc, _, hv)) = &old_hipcc {
            passed_over.push(format!(
                "hipcc (HIP {hv}) at {} (older than ROCm 6)",
                hipcc.display()
            ));
        }
        return Ok(HipCompiler {
            path,
            driver: Driver::Clang,
            version: format!("clang {v}"),
            major,
            source,
            passed_over,
            cov: 0,
        });
    }
    if let Some((path, major, v)) = old_hipcc {
        return Ok(HipCompiler::hipcc(path, major, &v, passed_over));
    }
    let seen = if passed_over.is_empty() {
        String::new()
    } else {
        format!(" Seen but not usable: {}.", passed_over.join("; "))
    };
    Err(format!(
        "feature `hip` needs a compiler for hip-kernels/*.hip and none was found \
         (looked at $ROCM_SAFE_HIP_CLANG, hipcc in $HIPCC, PATH, $ROCM_PATH/bin, $HIP_PATH/bin, \
         /opt/rocm/bin, and clang >= {MIN_CLANG_MAJOR} on PATH and in /usr/lib/llvm-N/bin).{seen} \
         To fix it, {INSTALL_HINT}"
    ))
}

/// Whether a failed compile says the compiler cannot target the arch at all
/// (as opposed to an error in the kernels, which is always fatal).
fn cannot_target(stderr: &str) -> bool {
    [
        "invalid target ID",
        "unsupported CUDA gpu architecture",
        "Unsupported CUDA gpu architecture",
        "cannot find ROCm device library for",
        "unknown target CPU",
        "is not a recognized processor",
        "no device library",
    ]
    .iter()
    .any(|m| stderr.contains(m))
}

/// What `$OUT_DIR/hip_build.rs` says.
#[derive(Default)]
struct HipBuildInfo {
    /// Compiler description, `None` without a HIP build.
    compiler: Option<String>,
    code_object_version: Option<u32>,
    /// (arch, code object path), in the order asked for.
    built: Vec<(String, PathBuf)>,
    /// Default archs the compiler cannot target.
    left_out: Vec<String>,
}

impl HipBuildInfo {
    fn to_rust(&self) -> String {
        let mut s = String::from("// @generated by build.rs\n");
        let archs: Vec<String> = self.built.iter().map(|(a, _)| format!("{a:?}")).collect();
        let _ = writeln!(
            s,
            "/// The gfx archs this build has HIP code objects for.\n\
             pub const ARCHS: &[&str] = &[{}];",
            archs.join(", ")
        );
        let _ = writeln!(
            s,
            "/// The compiler that built them (`None` without a HIP build).\n\
             pub const COMPILER: Option<&str> = {:?};",
            self.compiler
        );
        let _ = writeln!(
            s,
            "/// The code object version they were built for.\n\
             pub const CODE_OBJECT_VERSION: Option<u32> = {:?};",
            self.code_object_version
        );
        let left: Vec<String> = self.left_out.iter().map(|a| format!("{a:?}")).collect();
        let _ = writeln!(
            s,
            "/// Archs of the default list this compiler cannot target.\n\
             pub const LEFT_OUT: &[&str] = &[{}];",
            left.join(", ")
        );
        s
    }
}

fn build_hip(manifest: &Path, out: &Path, rs: &mut String) -> HipBuildInfo {
    let mut compiler = find_hip_compiler().unwrap_or_else(|e| fail(&e));
    compiler.pin_code_object_version();
    // A compiler upgraded in place (same path) rebuilds the kernels.
    println!("cargo::rerun-if-changed={}", compiler.path.display());
    let (archs, explicit) = arch_list();
    if archs.is_empty() {
        fail("ROCM_SAFE_OFFLOAD_ARCH / PYTORCH_ROCM_ARCH names no arch");
    }
    let entry = manifest.join(ENTRY);
    let include = manifest.join("hip-kernels");
    // Compile the archs in parallel (each compile is single-threaded), at
    // most NUM_JOBS at a time.
    let jobs = env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or(1)
        .clamp(1, archs.len());
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(usize, Result<PathBuf, String>)>> = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(arch) = archs.get(i) else { break };
                let dst = out.join(format!("rocm_safe_kernels_{arch}.co"));
                let _ = std::fs::remove_file(&dst);
                let res = match compiler.command(arch, &include, &entry, &dst).output() {
                    Ok(o) if o.status.success() && dst.is_file() => Ok(dst),
                    Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
                    Err(e) => Err(format!("cannot run {}: {e}", compiler.path.display())),
                };
                if let Ok(mut r) = results.lock() {
                    r.push((i, res));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|(i, _)| *i);
    let mut info = HipBuildInfo {
        compiler: Some(compiler.describe()),
        code_object_version: Some(compiler.code_object_version()),
        ..HipBuildInfo::default()
    };
    let mut untargetable = Vec::new();
    for (i, res) in results {
        let arch = archs[i].clone();
        match res {
            Ok(path) => info.built.push((arch, path)),
            Err(msg) if cannot_target(&msg) => untargetable.push((arch, msg)),
            Err(msg) => fail(&format!(
                "{} failed on the kernels for {arch}:\n{msg}",
                compiler.describe()
            )),
        }
    }
    if !untargetable.is_empty() && (explicit || info.built.is_empty()) {
        let names: Vec<&str> = untargetable.iter().map(|(a, _)| a.as_str()).collect();
        let passed = if compiler.passed_over.is_empty() {
            String::new()
        } else {
            format!(
                "\nAlso seen, not used: {}.",
                compiler.passed_over.join("; ")
            )
        };
        let first = untargetable[0].1.lines().next().unwrap_or("");
        fail(&format!(
            "cannot build the HIP kernels for {} with the compiler found, {} \
             (it cannot target {}: \"{first}\").{passed}\n\
             To build them, {INSTALL_HINT}; or leave {} out of {}.",
            names.join(", "),
            compiler.describe(),
            if names.len() == 1 {
                "this arch"
            } else {
                "these archs"
            },
            names.join(", "),
            if explicit {
                "ROCM_SAFE_OFFLOAD_ARCH / PYTORCH_ROCM_ARCH"
            } else {
                "the build (set ROCM_SAFE_OFFLOAD_ARCH)"
            },
        ));
    }
    if !untargetable.is_empty() {
        let names: Vec<&str> = untargetable.iter().map(|(a, _)| a.as_str()).collect();
        println!(
            "cargo::warning=rocm-safe: {} cannot target {}: no kernels for them in this build \
             (`doctor` lists what was built). To build them, {INSTALL_HINT}",
            compiler.version,
            names.join(", ")
        );
        info.left_out = names.into_iter().map(str::to_owned).collect();
    }
    let mut entries = String::new();
    for (arch, path) in &info.built {
        let _ = writeln!(
            entries,
            "    (\"{arch}\", include_bytes!({:?})),",
            path.display().to_string()
        );
    }
    let _ = writeln!(
        rs,
        "/// HIP code objects (offload bundles), one per gfx arch.\n\
         pub(crate) const HIP_CODE_OBJECTS: &[(&str, &[u8])] = &[\n{entries}];"
    );
    info
}

/// Inlines `#include "file"` (each file once) so NVRTC needs no headers.
fn flatten(path: &Path, seen: &mut Vec<PathBuf>, out: &mut String) {
    if seen.iter().any(|p| p == path) {
        return;
    }
    seen.push(path.to_path_buf());
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => fail(&format!("cannot read {}: {e}", path.display())),
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    for line in text.lines() {
        let t = line.trim();
        if t == "#pragma once" {
            continue;
        }
        if let Some(rest) = t.strip_prefix("#include \"") {
            if let Some(name) = rest.strip_suffix('"') {
                flatten(&dir.join(name), seen, out);
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
}

fn build_cuda(manifest: &Path, out: &Path, rs: &mut String) {
    let mut dirs = Vec::new();
    if let Some(p) = env_var("CUDA_HOME").or_else(|| env_var("CUDA_PATH")) {
        dirs.push(PathBuf::from(p).join("bin"));
    }
    dirs.push(PathBuf::from("/usr/local/cuda/bin"));
    let arch = env_var("ROCM_SAFE_CUDA_ARCH").unwrap_or_else(|| "compute_75".into());
    let nvcc = find_tool("NVCC", "nvcc", &dirs);
    let mut sources = Vec::new();
    let mut files = Vec::new();
    for (name, entry) in CUDA_SOURCES {
        let mut src = String::new();
        flatten(&manifest.join(entry), &mut Vec::new(), &mut src);
        let cu = out.join(format!("rocm_safe_{name}.cu"));
        if let Err(e) = std::fs::write(&cu, &src) {
            fail(&format!("cannot write {}: {e}", cu.display()));
        }
        sources.push(format!("include_str!({:?})", cu.display().to_string()));
        files.push(cu);
    }
    let mut ptxs = Vec::new();
    for (name, source, part) in CUDA_MODULES {
        let Some(cu) = files.get(source) else {
            fail(&format!("CUDA module {name}: no source {source}"));
        };
        let ptx = out.join(format!("rocm_safe_{name}.ptx"));
        let built = match &nvcc {
            Some(nvcc) => match Command::new(nvcc)
                .args(["--ptx", "-x", "cu", "-O3"])
                .arg(format!("-arch={arch}"))
                .arg(format!("-DRS_PART={part}"))
                .arg(cu)
                .arg("-o")
                .arg(&ptx)
                .output()
            {
                Ok(o) if o.status.success() => true,
                Ok(o) => {
                    println!(
                        "cargo::warning=rocm-safe: nvcc failed on the {name} kernels ({}); the kernels will be compiled with NVRTC at run time",
                        String::from_utf8_lossy(&o.stderr).lines().next().unwrap_or("")
                    );
                    false
                }
                Err(_) => false,
            },
            None => false,
        };
        if built {
            ptxs.push(format!("include_str!({:?})", ptx.display().to_string()));
        }
    }
    let _ = writeln!(
        rs,
        "/// The CUDA sources, in `KernelModule::source` order (compiled with\n\
         /// NVRTC when no PTX is embedded).\n\
         pub(crate) const CUDA_SOURCES: [&str; 2] = [{}];",
        sources.join(", ")
    );
    let parts: Vec<String> = CUDA_MODULES
        .iter()
        .map(|(name, _, part)| format!("({name:?}, {part})"))
        .collect();
    let _ = writeln!(
        rs,
        "/// The CUDA modules (name, RS_PART) as build.rs compiles them.\n\
         #[allow(dead_code)]\n\
         pub(crate) const CUDA_MODULE_PARTS: [(&str, u32); 6] = [{}];",
        parts.join(", ")
    );
    if ptxs.len() == CUDA_MODULES.len() {
        println!("cargo::rustc-cfg=rocm_safe_cuda_ptx");
        let _ = writeln!(
            rs,
            "/// The CUDA modules as PTX built by nvcc.\n\
             pub(crate) const CUDA_PTX: Option<[&str; 6]> = Some([{}]);",
            ptxs.join(", ")
        );
    } else {
        let _ = writeln!(
            rs,
            "/// No nvcc at build time: NVRTC compiles CUDA_SOURCES on first use.\n\
             pub(crate) const CUDA_PTX: Option<[&str; 6]> = None;"
        );
    }
}
