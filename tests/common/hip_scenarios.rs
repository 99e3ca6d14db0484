//! Shared by the tests of the HIP runtime layer over the stand-in runtime
//! (`tests/hip_runtime_standin.rs`, `tests/hip_standin_launches.rs`,
//! `tests/hip_standin_memory.rs`): the variable naming the runtime, the
//! stand-ins' versions, the scenario result and its `ensure!`, the built
//! stand-ins, the device and the stand-in the crate loaded in this process.

use std::process::Command;

use rocm_safe::device::{BackendKind, Device};

use super::hip_standin::{self as standin, Standin};

/// The variable naming the HIP runtime to load (a file or a folder).
pub const RUNTIME_VAR: &str = "ROCM_SAFE_HIP_RUNTIME";
/// The versions the stand-ins report (`hipRuntimeGetVersion`).
pub const VERSIONS: [(u32, i32); 3] = [(7, 70125424), (6, 60443482), (5, 50731921)];

/// A scenario's result: `Err` says what was wrong.
pub type R = Result<(), String>;

/// Returns `Err(format!(...))` from the enclosing function unless `cond`.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

pub fn built() -> standin::Built {
    match standin::library() {
        Ok(b) => b,
        Err(e) => panic!("building the stand-in HIP runtime: {e}"),
    }
}

pub fn version_of(major: u32) -> i32 {
    VERSIONS
        .iter()
        .find(|(m, _)| *m == major)
        .map_or(0, |(_, v)| *v)
}

/// `HSA_OVERRIDE_GFX_VERSION` for a gfx arch: `gfx1151` -> `11.5.1`,
/// `gfx90a` -> `9.0.10` (minor and stepping are hex digits in the name).
pub fn hsa_override(arch: &str) -> String {
    let d = arch.trim_start_matches("gfx");
    let (major, rest) = d.split_at(d.len() - 2);
    let hex = |c: char| c.to_digit(16).expect("a hex digit");
    let mut r = rest.chars();
    let (minor, step) = (
        hex(r.next().expect("minor")),
        hex(r.next().expect("stepping")),
    );
    format!("{major}.{minor}.{step}")
}

/// The stand-in the crate loaded in this process: the `libamdhip64`
/// mapped, opened again without loading anything.
pub fn loaded_standin() -> Result<Standin, String> {
    let mapped = standin::mapped_hip_runtimes();
    mapped
        .iter()
        .filter_map(|p| Standin::loaded_from(p))
        .find(|s| s.exports("standin_major"))
        .ok_or_else(|| format!("no stand-in HIP runtime is loaded; mapped: {mapped:?}"))
}

pub fn open_device() -> Result<Device, String> {
    Device::open(BackendKind::Hip, 0).map_err(|e| format!("opening hip:0 on the stand-in: {e}"))
}

pub fn err<E: std::fmt::Display>(what: &'static str) -> impl Fn(E) -> String {
    move |e| format!("{what}: {e}")
}

pub fn on_standin(major: u32) -> impl FnOnce(&mut Command) {
    move |c| {
        c.env(RUNTIME_VAR, built().file(major))
            .env("HSA_OVERRIDE_GFX_VERSION", "11.5.1");
    }
}
