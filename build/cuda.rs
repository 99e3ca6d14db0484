//! The CUDA build: each module flattened into one source for NVRTC, and PTX
//! when nvcc is found.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::sources::{CUDA_MODULES, CUDA_SOURCES};
use crate::tools::{env_var, fail, find_tool};

/// Inlines `#include "file"` (each file once) so NVRTC needs no headers.
pub(crate) fn flatten(path: &Path, seen: &mut Vec<PathBuf>, out: &mut String) {
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

pub(crate) fn build_cuda(manifest: &Path, out: &Path, rs: &mut String) {
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
