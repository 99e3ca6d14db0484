//! The `doctor` example through the real binary: exit status, the JSON
//! document's documented fields, usage errors.

mod example_bin;

use std::path::PathBuf;
use std::process::Command;

fn doctor_exe() -> PathBuf {
    example_bin::example("doctor")
}

#[test]
fn json_report_has_the_documented_fields_and_exit_0() {
    let o = Command::new(doctor_exe())
        .args(["--json", "--arch", "gfx1151"])
        .env("HSA_OVERRIDE_GFX_VERSION", "11.0.0")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["schema_version"], 1);
    for key in [
        "crate_version",
        "features",
        "platform",
        "amdgpu_memory",
        "environment",
        "advice",
        "self_tests",
        "backends",
        "matrix",
    ] {
        assert!(r.get(key).is_some(), "missing {key}");
    }
    for key in [
        "os",
        "cores",
        "memory_total_bytes",
        "hip_runtime",
        "cuda_driver",
        "nvrtc",
    ] {
        assert!(r["platform"].get(key).is_some(), "missing platform.{key}");
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
    assert_eq!(backends[0]["devices"][0]["self_test"]["verdict"], "pass");
    // The compatibility matrix: a staged copy on the host device and a conv3d.
    let matrix = r["matrix"].as_array().unwrap();
    let staged = matrix
        .iter()
        .find(|m| m["operation"] == "staged copy bf16->f32" && m["device"] == "host:0")
        .expect("host staged copy");
    assert_eq!(staged["status"], "verified", "{staged}");
    let conv = matrix
        .iter()
        .find(|m| m["operation"] == "conv3d")
        .expect("conv3d");
    assert_ne!(conv["status"], "fails", "{conv}");
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
fn table_output_names_every_section() {
    let o = Command::new(doctor_exe()).output().unwrap();
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    for section in [
        "Platform",
        "Environment",
        "Self-tests",
        "Backends and devices",
        "Compatibility",
        "All self-tests passed.",
    ] {
        assert!(s.contains(section), "missing {section:?} in\n{s}");
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [vec!["--bogus"], vec!["--arch"], vec!["--arch", "sm_90"]] {
        let o = Command::new(doctor_exe()).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("usage"),
            "{args:?}"
        );
    }
}
