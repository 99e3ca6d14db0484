//! Locates an example binary for CLI contract tests, (re)building it first
//! with the same profile and features as this test binary, so a test never
//! runs a stale example (`cargo test --test X` alone does not build
//! examples; a plain `cargo test` already did, and the build is a no-op).

use std::path::PathBuf;
use std::process::Command;

/// Path of `target/<profile>/examples/<name>`, freshly built.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps layout");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--example", name]);
    if profile_dir.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    let mut features = Vec::new();
    if cfg!(feature = "hip") {
        features.push("hip");
    }
    if cfg!(feature = "cuda") {
        features.push("cuda");
    }
    if !features.is_empty() {
        cmd.args(["--features", &features.join(",")]);
    }
    let bin = profile_dir.join("examples").join(name);
    match cmd.status() {
        Ok(status) => assert!(status.success(), "building the {name} example failed"),
        // No cargo here (test binaries staged to a GPU machine): use the
        // staged example if there is one; the assert below fails otherwise.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => panic!("cannot run cargo to build the {name} example: {e}"),
    }
    assert!(bin.exists(), "{} missing", bin.display());
    bin
}
