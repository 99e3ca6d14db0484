//! The `doctor` example through the real binary: exit status, the JSON
//! document's documented fields, usage errors.

use crate::example_bin;

use std::path::PathBuf;
use std::process::Command;

fn doctor_exe() -> PathBuf {
    example_bin::example("doctor")
}

fn doctor_json(args: &[&str]) -> serde_json::Value {
    let o = Command::new(doctor_exe())
        .arg("--json")
        .args(args)
        .env("HSA_OVERRIDE_GFX_VERSION", "11.0.0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // --json keeps stderr free of progress output.
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A runtime version: `version` (string) and `raw` (integer) together, or
/// `unknown_reason` (string) alone.
fn assert_version(v: &serde_json::Value, what: &str) {
    match (&v["version"], &v["raw"], &v["unknown_reason"]) {
        (serde_json::Value::String(s), serde_json::Value::Number(n), serde_json::Value::Null) => {
            assert!(!s.is_empty() && n.is_i64(), "{what}: {v}")
        }
        (serde_json::Value::Null, serde_json::Value::Null, serde_json::Value::String(r)) => {
            assert!(!r.is_empty(), "{what}: {v}")
        }
        _ => panic!("{what}: {v}"),
    }
}

fn is_uint_or_null(v: &serde_json::Value) -> bool {
    v.is_null() || v.is_u64()
}

#[test]
fn json_report_has_the_documented_fields_and_exit_0() {
    let r = doctor_json(&["--arch", "gfx1151"]);
    assert_eq!(r["schema_version"], 5);
    let level = r["verdict"]["level"].as_str().unwrap();
    assert!(
        ["ready", "cpu_only", "fix", "failed"].contains(&level),
        "{}",
        r["verdict"]
    );
    assert!(!r["verdict"]["line"].as_str().unwrap().is_empty());
    for key in [
        "crate_version",
        "features",
        "platform",
        "hip_build",
        "amdgpu_memory",
        "runtime_files",
        "duplicate_libraries",
        "gfx_override",
        "environment",
        "advice",
        "self_tests",
        "backends",
        "device_filter",
        "matrix",
    ] {
        assert!(r.get(key).is_some(), "missing {key}");
    }
    assert!(r["device_filter"].is_null());
    let p = &r["platform"];
    for key in [
        "os",
        "cores",
        "memory_total_bytes",
        "hip_runtime",
        "cuda_driver",
        "nvrtc",
        "hip_runtime_version",
        "hip_driver_version",
        "cuda_driver_version",
    ] {
        assert!(p.get(key).is_some(), "missing platform.{key}");
    }
    assert!(p["memory_total_bytes"].is_u64());
    assert_version(&p["hip_runtime_version"], "hip_runtime_version");
    assert_version(&p["hip_driver_version"], "hip_driver_version");
    assert_version(&p["cuda_driver_version"], "cuda_driver_version");
    let features = r["features"].as_array().unwrap();
    if !features.iter().any(|f| f == "hip") {
        assert!(p["hip_runtime_version"]["unknown_reason"]
            .as_str()
            .unwrap()
            .contains("not built"));
    }
    // What was compiled for HIP: the archs and the compiler with `hip`,
    // else the command to run instead.
    let h = &r["hip_build"];
    assert_eq!(h["built"], cfg!(feature = "hip"), "{h}");
    let archs = h["archs"].as_array().unwrap();
    assert!(h["left_out"].is_array() && h["devices"].is_array(), "{h}");
    if cfg!(feature = "hip") {
        assert!(
            archs.iter().all(|a| a.as_str().unwrap().starts_with("gfx")),
            "{h}"
        );
        if !archs.is_empty() {
            assert!(h["compiler"].is_string(), "{h}");
            assert!(h["code_object_version"].is_u64(), "{h}");
        }
        // No AMD device here, so nothing to rebuild for.
        if h["devices"].as_array().unwrap().is_empty() {
            assert!(h["rebuild_command"].is_null(), "{h}");
        }
    } else {
        assert!(archs.is_empty() && h["compiler"].is_null(), "{h}");
        assert_eq!(
            h["rebuild_command"],
            "cargo run --release --features hip --example doctor"
        );
    }
    for lib in ["hip_runtime", "cuda_driver", "nvrtc"] {
        let l = &p[lib];
        if !l.is_null() {
            assert!(l["soname"].is_string(), "{l}");
            for key in ["path", "real_path", "file_version"] {
                assert!(l[key].is_null() || l[key].is_string(), "{lib}.{key}: {l}");
            }
        }
    }
    for m in r["amdgpu_memory"].as_array().unwrap() {
        for key in [
            "vram_total_bytes",
            "gtt_total_bytes",
            "hip_ordinal",
            "runtime_free_bytes",
            "runtime_total_bytes",
        ] {
            assert!(is_uint_or_null(&m[key]), "amdgpu_memory.{key}: {m}");
        }
        for key in ["vram_used_bytes", "gtt_used_bytes", "ttm_limit_bytes"] {
            assert!(is_uint_or_null(&m[key]), "amdgpu_memory.{key}: {m}");
        }
        assert!(m["amdgpu_gttsize_mib"].is_null() || m["amdgpu_gttsize_mib"].is_i64());
        let a = m["assessment"].as_str().unwrap();
        assert!(
            [
                "vram_sized",
                "carve_out_only",
                "free_above_total",
                "below_gtt",
                "ttm_capped",
                "shared_reported",
                "apu_not_compared",
                "unknown"
            ]
            .contains(&a),
            "{a}"
        );
    }
    // Each runtime and vendor library: in use (with how it was found), or
    // why not; none mapped twice in the doctor's own process.
    let files = r["runtime_files"].as_array().unwrap();
    let names: Vec<&str> = files
        .iter()
        .map(|f| f["library"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["hip_runtime", "cuda_driver", "cudnn", "nvrtc", "miopen"]
    );
    for f in files {
        if f["loaded"] == true {
            assert!(f["found_by"].is_string(), "{f}");
            assert!(f["path"].is_string() || f["path"].is_null(), "{f}");
        } else {
            assert!(!f["error"].as_str().unwrap().is_empty(), "{f}");
        }
    }
    if !cfg!(feature = "cuda") {
        assert!(files[2]["error"].as_str().unwrap().contains("not built"));
    }
    assert_eq!(r["duplicate_libraries"], serde_json::json!([]), "{r}");
    // The override set by doctor_json, as the runtime reads it.
    let o = &r["gfx_override"];
    assert_eq!(o["var"], "HSA_OVERRIDE_GFX_VERSION", "{o}");
    assert_eq!(o["value"], "11.0.0", "{o}");
    if cfg!(feature = "hip") {
        assert_eq!(o["arch"], "gfx1100", "{o}");
        assert!(o["built_in"].is_boolean(), "{o}");
    } else {
        assert!(o["arch"].is_null() && o["error"].as_str().unwrap().contains("hip"));
    }
    let tests = r["self_tests"].as_array().unwrap();
    assert!(tests.len() >= 6);
    assert!(tests.iter().all(|t| t["verdict"] == "pass"), "{tests:?}");
    let backends = r["backends"].as_array().unwrap();
    let names: Vec<&str> = backends
        .iter()
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["host", "hip", "cuda"]);
    // The HIP backend: with `--features hip` and no AMD GPU (CI) it
    // reports the missing device (and the exit status is still 0).
    let hip = &backends[1];
    assert_eq!(hip["built"], cfg!(feature = "hip"));
    if hip["devices"].as_array().unwrap().is_empty() {
        let e = hip["error"].as_str().unwrap();
        if cfg!(feature = "hip") {
            assert!(
                e.contains("no device")
                    || e.contains("runtime not available")
                    || e.contains("no permission to open /dev/kfd"),
                "{e}"
            );
            // The runtime is loaded at run time: without one (CI without a
            // stand-in) its version says why it is unknown; the driver
            // version needs a device and says why it is unknown.
            let rv = &p["hip_runtime_version"];
            assert!(
                rv["version"].is_string()
                    || rv["unknown_reason"]
                        .as_str()
                        .unwrap()
                        .contains("runtime not available"),
                "{p}"
            );
            let why = p["hip_driver_version"]["unknown_reason"].as_str().unwrap();
            assert!(
                why.contains("no device")
                    || why.contains("runtime not available")
                    || why.contains("no permission"),
                "{why}"
            );
        } else {
            assert!(e.contains("not built"), "{e}");
        }
    }
    let host = &backends[0]["devices"][0];
    assert_eq!(host["self_test"]["verdict"], "pass");
    assert_eq!(host["selected"], true);
    for key in [
        "total_memory_bytes",
        "memory_free_bytes",
        "memory_reported_total_bytes",
    ] {
        assert!(is_uint_or_null(&host[key]), "{key}: {host}");
    }
    assert!(host["memory_info_error"].is_null() || host["memory_info_error"].is_string());
    if cfg!(target_os = "linux") {
        // The host device reports host RAM.
        let total = host["memory_reported_total_bytes"].as_u64().unwrap();
        assert!(total > 0 && host["memory_free_bytes"].as_u64().unwrap() <= total);
    }
    // The compatibility matrix: every cell in a documented state.
    let matrix = r["matrix"].as_array().unwrap();
    for m in matrix {
        let status = m["status"].as_str().unwrap();
        match status {
            "verified" => {}
            "falls_back" => assert!(m["to"].is_string() && m["why"].is_string(), "{m}"),
            "skipped" | "fails" => assert!(m["why"].is_string(), "{m}"),
            other => panic!("undocumented status {other}: {m}"),
        }
        let op = m["operation"].as_str().unwrap();
        assert!(
            ["staged copy bf16->f32", "conv3d tier", "conv3d"].contains(&op),
            "{m}"
        );
        assert_eq!(op == "conv3d tier", m["tier"].is_string(), "{m}");
        assert!(m["device"].is_string() && m["detail"].is_string(), "{m}");
    }
    let cell = |op: &str, tier: Option<&str>| {
        matrix
            .iter()
            .find(|m| m["operation"] == op && m["device"] == "host:0" && m["tier"].as_str() == tier)
            .unwrap_or_else(|| panic!("no {op} {tier:?} cell on host:0"))
    };
    assert_eq!(cell("staged copy bf16->f32", None)["status"], "verified");
    // The host device: no vendor library (no cell: nothing there can be
    // skipped or fallen back from), its tiled and naive kernels emulated
    // on the CPU, the CPU tier; the chain is served by its first tier.
    assert!(
        !matrix
            .iter()
            .any(|m| m["device"] == "host:0" && m["tier"] == "vendor"),
        "a vendor cell on the host"
    );
    for t in ["tiled", "naive", "cpu"] {
        assert_eq!(cell("conv3d tier", Some(t))["status"], "verified", "{t}");
    }
    let conv = cell("conv3d", None);
    assert_eq!(conv["status"], "verified", "{conv}");
    assert!(conv["detail"].as_str().unwrap().contains("served by tiled"));
    // Nothing on a CPU-only machine reads like a failure.
    if r["verdict"]["level"] == "cpu_only" {
        for m in matrix {
            assert_ne!(m["status"], "fails", "{m}");
            if m["device"] == "host:0" {
                assert_eq!(m["status"], "verified", "{m}");
            }
        }
    }
    // --arch gives advice without a device; the override is flagged.
    let advice = r["advice"].as_array().unwrap();
    let ovr = advice
        .iter()
        .find(|a| a["variable"] == "HSA_OVERRIDE_GFX_VERSION" && a["arch"] == "gfx1151")
        .expect("override advice");
    assert_eq!(ovr["ok"], false);
    assert_eq!(ovr["current"], "11.0.0");
    let env = r["environment"].as_array().unwrap();
    assert!(env
        .iter()
        .any(|e| e["name"] == "HSA_OVERRIDE_GFX_VERSION" && e["value"] == "11.0.0"));
}

#[test]
fn device_selects_what_is_tested() {
    for sel in ["0", "host:0"] {
        let r = doctor_json(&["--device", sel]);
        assert_eq!(r["device_filter"], sel);
        let matrix = r["matrix"].as_array().unwrap();
        assert!(!matrix.is_empty());
        assert!(matrix
            .iter()
            .all(|m| m["device"].as_str().unwrap().ends_with(":0")));
        assert!(matrix.iter().any(|m| m["device"] == "host:0"));
    }
}

#[test]
fn device_out_of_range_is_a_one_line_error() {
    for sel in ["7", "host:1", "cuda:9"] {
        let o = Command::new(doctor_exe())
            .args(["--device", sel])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{sel}");
        assert!(o.stdout.is_empty(), "{sel}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(err.contains(&format!("no device {sel}")), "{err}");
        assert!(err.contains("host:0"), "{err}");
    }
}

#[test]
fn help_documents_device() {
    let o = Command::new(doctor_exe()).arg("--help").output().unwrap();
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("--device N") && s.contains("BACKEND:N"), "{s}");
}

#[test]
fn table_output_names_every_section() {
    let o = Command::new(doctor_exe()).output().unwrap();
    assert!(o.status.success());
    // stderr is not a terminal here: no progress bar.
    assert!(
        o.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let s = String::from_utf8_lossy(&o.stdout);
    for section in [
        "Platform",
        "HIP kernels in this build",
        "Environment",
        "Self-tests",
        "Backends and devices",
        "Compatibility",
        "All self-tests passed.",
    ] {
        assert!(s.contains(section), "missing {section:?} in\n{s}");
    }
    // Without `hip` the doctor says what to run instead; with it, the archs.
    if cfg!(feature = "hip") {
        assert!(s.contains("  archs ") && s.contains("  compiler "), "{s}");
    } else {
        assert!(
            s.contains("run instead  cargo run --release --features hip --example doctor"),
            "{s}"
        );
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        vec!["--bogus"],
        vec!["--arch"],
        vec!["--arch", "sm_90"],
        vec!["--device"],
        vec!["--device", "x"],
        vec!["--device", "gpu:0"],
    ] {
        let o = Command::new(doctor_exe()).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("usage"),
            "{args:?}"
        );
    }
}
