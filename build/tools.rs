//! The build script's small tools: environment variables (each watched),
//! finding programs, versions, writing files, failing with a message.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) fn env_var(name: &str) -> Option<String> {
    println!("cargo::rerun-if-env-changed={name}");
    env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Whether a C compiler runs (`$CC`, else `cc`). The HIP runtime tests
/// build their stand-in runtime with it (`tests/hip_runtime_standin.rs`)
/// and are ignored, with that reason, where none does.
pub(crate) fn c_compiler_runs() -> bool {
    let cc = env_var("CC").unwrap_or_else(|| "cc".into());
    Command::new(cc)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

pub(crate) fn write_file(path: &Path, text: &str) {
    if let Err(e) = std::fs::write(path, text) {
        fail(&format!("cannot write {}: {e}", path.display()));
    }
}

pub(crate) fn fail(msg: &str) -> ! {
    eprintln!("error: rocm-safe build: {msg}");
    std::process::exit(1);
}

pub(crate) fn find_tool(env_name: &str, exe: &str, extra_dirs: &[PathBuf]) -> Option<PathBuf> {
    if let Some(p) = env_var(env_name) {
        // An explicit tool that does not exist is "not found", not a
        // confusing failure to run it later.
        let p = PathBuf::from(p);
        return p.is_file().then_some(p);
    }
    on_path(exe).or_else(|| extra_dirs.iter().map(|d| d.join(exe)).find(|c| c.is_file()))
}

/// `exe` in a directory of `$PATH`.
pub(crate) fn on_path(exe: &str) -> Option<PathBuf> {
    let path = env_var("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(exe))
        .find(|c| c.is_file())
}

/// Runs `exe --version` and returns its output (stdout then stderr).
pub(crate) fn version_text(exe: &Path) -> Option<String> {
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
pub(crate) fn parse_version(text: &str, marker: &str) -> Option<(u32, String)> {
    let rest = &text[text.find(marker)? + marker.len()..];
    let v: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '-')
        .collect();
    let v = v.trim_end_matches(['.', '-']).to_owned();
    let major = v.split('.').next()?.parse().ok()?;
    Some((major, v))
}
