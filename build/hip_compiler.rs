//! Choosing the HIP kernel compiler and the archs to build: `$ROCM_SAFE_HIP_CLANG`,
//! hipcc, clang >= 19 with lld, and what each can target.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tools::{env_var, fail, find_tool, on_path, parse_version, version_text};
use crate::{DEFAULT_ARCHS, INSTALL_HINT, MIN_CLANG_MAJOR};

pub(crate) fn arch_list() -> (Vec<String>, bool) {
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
pub(crate) enum Driver {
    /// A ROCm hipcc: `hipcc --genco`, the real HIP headers and device libs.
    Hipcc,
    /// A plain clang in HIP device-only mode with `hip_standin.h`.
    Clang,
}

/// The compiler chosen for the HIP kernels.
pub(crate) struct HipCompiler {
    pub(crate) path: PathBuf,
    pub(crate) driver: Driver,
    /// `"clang 19.1.7"`, `"hipcc (HIP 5.2.21153)"`.
    pub(crate) version: String,
    /// The major version that decides what it can target: clang's, or
    /// HIP's for hipcc.
    pub(crate) major: u32,
    /// Where it was found (`$ROCM_SAFE_HIP_CLANG`, `PATH`, ...).
    pub(crate) source: String,
    /// Other compilers seen and why they were not used (for messages).
    pub(crate) passed_over: Vec<String>,
    /// The code object version (set by `pin_code_object_version`).
    pub(crate) cov: u32,
}

impl HipCompiler {
    /// A hipcc found by the search, of HIP `major` (`v` the whole version).
    pub(crate) fn hipcc(
        path: PathBuf,
        major: u32,
        v: &str,
        passed_over: Vec<String>,
    ) -> HipCompiler {
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
    pub(crate) fn code_object_version(&self) -> u32 {
        self.cov
    }

    pub(crate) fn pin_code_object_version(&mut self) {
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

    pub(crate) fn describe(&self) -> String {
        let how = match self.driver {
            Driver::Hipcc => "hipcc --genco",
            Driver::Clang => "clang -x hip --offload-device-only, kernels/hip_standin.h",
        };
        format!(
            "{} ({}, from {}; {how}; code object v{})",
            self.version,
            self.path.display(),
            self.source,
            self.code_object_version()
        )
    }

    pub(crate) fn command(&self, arch: &str, include: &Path, entry: &Path, dst: &Path) -> Command {
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

/// A clang at `path`: its major version, version string and whether the
/// linker its HIP toolchain runs (`ld.lld`) is there.
pub(crate) fn probe_clang(path: &Path) -> Option<(u32, String, bool)> {
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
pub(crate) fn find_hip_compiler() -> Result<HipCompiler, String> {
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
        "feature `hip` needs a compiler for kernels/*.hip and none was found \
         (looked at $ROCM_SAFE_HIP_CLANG, hipcc in $HIPCC, PATH, $ROCM_PATH/bin, $HIP_PATH/bin, \
         /opt/rocm/bin, and clang >= {MIN_CLANG_MAJOR} on PATH and in /usr/lib/llvm-N/bin).{seen} \
         To fix it, {INSTALL_HINT}"
    ))
}

/// Whether a failed compile says the compiler cannot target the arch at all
/// (as opposed to an error in the kernels, which is always fatal).
pub(crate) fn cannot_target(stderr: &str) -> bool {
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
