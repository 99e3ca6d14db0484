//! The doctor's verdict (its first and last line) on the machine kinds a
//! HIP build meets, made with the stand-in HIP runtime
//! (`tests/hip-standin/standin.c`): a runtime too old for the code objects,
//! a runtime with no device, a GPU whose arch this build has no kernels
//! for, and a GPU that is ready. (No GPU at all and the CUDA build without
//! a GPU are `tests/cli/doctor.rs`'s, through the real binary.) Each case
//! runs in a child process of its own.
#![cfg(feature = "hip")]

mod common;

use common::hip_standin::{self as standin, scenario};
use rocm_safe::diagnostics::{
    render_text, verdict::verdict_of, Audience, CollectOptions, DeviceSelector, Report,
};

type R = Result<(), String>;

/// The report with the device self-tests and the matrix run on the host
/// device only (the stand-in runs no kernels: what is judged here is the
/// runtime, the devices and the build).
fn report() -> Result<Report, String> {
    let host: DeviceSelector = "host:0".parse().map_err(|e| format!("selector: {e:?}"))?;
    Report::collect_with(&CollectOptions::default().with_device(host), &mut |_| {})
        .map_err(|e| format!("collect: {e}"))
}

/// The verdict is the table's first and last line.
fn first_and_last(r: &Report) -> R {
    let text = render_text(r);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    if lines.first() != Some(&r.verdict.line.as_str()) || lines.last() != lines.first() {
        return Err(format!("verdict not first and last: {text}"));
    }
    Ok(())
}

fn on(
    major: u32,
    arch_override: Option<&'static str>,
    devices: u32,
) -> impl FnOnce(&mut std::process::Command) {
    move |c| {
        let built = standin::library().expect("building the stand-in HIP runtime");
        c.env("ROCM_SAFE_HIP_RUNTIME", built.file(major))
            .env("ROCM_SAFE_STANDIN_DEVICES", devices.to_string());
        if let Some(o) = arch_override {
            c.env("HSA_OVERRIDE_GFX_VERSION", o);
        }
    }
}

#[test]
#[cfg_attr(
    rocm_safe_no_c_compiler,
    ignore = "no C compiler (cc, or $CC) to build the stand-in HIP runtime"
)]
fn verdicts_on_the_machine_kinds_a_hip_build_meets() {
    let test = "verdicts_on_the_machine_kinds_a_hip_build_meets";
    // HIP 5.7 under code objects v5: the one thing to fix is the runtime.
    scenario(test, "HIP 5, gfx1151", on(5, None, 1), || {
        let r = report()?;
        let v = &r.verdict;
        if !(v.line.starts_with("fix: the HIP runtime is 5.7") && v.line.contains("ROCm >= 6")) {
            return Err(format!("{v:?}"));
        }
        first_and_last(&r)
    });
    // A runtime that shows no device: on a machine without /dev/kfd
    // that is a CPU machine; with the driver loaded it is a fix.
    scenario(test, "HIP 7, no device", on(7, None, 0), || {
        let r = report()?;
        if !r.verdict.line.starts_with("no GPU here") {
            return Err(format!("without /dev/kfd: {:?}", r.verdict));
        }
        let with_kfd = verdict_of(&r, true);
        if !with_kfd.line.starts_with("fix:") {
            return Err(format!("with /dev/kfd: {with_kfd:?}"));
        }
        first_and_last(&r)
    });
    // A GPU this build has kernels for: ready.
    scenario(test, "HIP 7, gfx1151", on(7, Some("11.5.1"), 1), || {
        let r = report()?;
        let v = &r.verdict;
        if !(v.line.contains("gfx1151") && v.line.ends_with("ready")) {
            return Err(format!("{v:?}"));
        }
        first_and_last(&r)
    });
    // A GPU whose arch nobody can tell (no KFD topology, no override): how
    // to find it out, never a rebuild for an arch called "unknown".
    scenario(test, "HIP 7, arch unknown", on(7, None, 1), || {
        let r = report()?;
        let v = &r.verdict;
        let named = v.line.starts_with("fix: the gfx arch of hip:0 is unknown");
        if !named || v.line.contains("=unknown") {
            return Err(format!("{v:?}"));
        }
        if r.hip_build
            .rebuild_command
            .as_deref()
            .is_some_and(|c| c.contains("=unknown"))
        {
            return Err(format!("{:?}", r.hip_build));
        }
        first_and_last(&r)
    });
    // A GPU whose arch has no kernels here: the rebuild command names that
    // arch alone, for cargo and for pip.
    scenario(test, "HIP 7, gfx1010", on(7, Some("10.1.0"), 1), || {
        let r = report()?;
        let v = &r.verdict;
        if !v
            .line
            .contains("ROCM_SAFE_OFFLOAD_ARCH=gfx1010 cargo run --release --features hip")
        {
            return Err(format!("{v:?} / {:?}", r.hip_build));
        }
        let pip = r.for_audience(Audience::Pip);
        if !pip
            .verdict
            .line
            .contains("ROCM_SAFE_OFFLOAD_ARCH=gfx1010 MATURIN_PEP517_ARGS=")
        {
            return Err(format!("pip: {:?}", pip.verdict));
        }
        first_and_last(&pip)
    });
}
