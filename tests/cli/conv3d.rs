//! The `conv3d` example's contract, exercised through the real binary:
//! output tensor `output` (F32) equal to the f64 reference, the report and
//! statistics on stdout, and for bad shapes, names or parameters a one-line
//! error, a non-zero exit and no output file.

use crate::example_bin;

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::conv3d::values;
use rocm_safe::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
use rocm_safe::safetensors::{SafeTensors, SafeTensorsWriter, TensorSpec};
use rocm_safe::DType;

fn exe() -> PathBuf {
    example_bin::example("conv3d")
}

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = Command::new(exe());
    for a in args {
        cmd.arg(a);
    }
    cmd.output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// x [2, 4, 3, 5, 6], w [6, 2, 3, 3, 3] (groups 2), b [6], a 2-d tensor,
/// and bf16 copies of x and w.
fn write_input(path: &Path) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let x = values(2 * 4 * 3 * 5 * 6, 1);
    let w = values(6 * 2 * 27, 2);
    let b = values(6, 3);
    let le = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|f| f.to_le_bytes()).collect() };
    let bf = |v: &[f32]| -> Vec<u8> {
        v.iter()
            .flat_map(|f| half::bf16::from_f32(*f).to_le_bytes())
            .collect()
    };
    let specs = vec![
        TensorSpec::new("x", DType::F32, vec![2, 4, 3, 5, 6]),
        TensorSpec::new("w", DType::F32, vec![6, 2, 3, 3, 3]),
        TensorSpec::new("b", DType::F32, vec![6]),
        TensorSpec::new("flat", DType::F32, vec![2, 3]),
        TensorSpec::new("xb", DType::BF16, vec![2, 4, 3, 5, 6]),
        TensorSpec::new("wb", DType::BF16, vec![6, 2, 3, 3, 3]),
    ];
    let mut wr = SafeTensorsWriter::create(path, specs, None).unwrap();
    wr.write_tensor("x", &le(&x)).unwrap();
    wr.write_tensor("w", &le(&w)).unwrap();
    wr.write_tensor("b", &le(&b)).unwrap();
    wr.write_tensor("flat", &le(&[0.0; 6])).unwrap();
    wr.write_tensor("xb", &bf(&x)).unwrap();
    wr.write_tensor("wb", &bf(&w)).unwrap();
    wr.finish().unwrap();
    (x, w, b)
}

#[test]
fn writes_the_reference_result_and_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    let (x, w, b) = write_input(&input);
    let out = dir.path().join("out.safetensors");
    let o = run(&[
        &input,
        &out,
        &"--input",
        &"x",
        &"--weight",
        &"w",
        &"--bias",
        &"b",
        &"--stride",
        &"1,2,1",
        &"--padding",
        &"1",
        &"--groups",
        &"2",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(
        stdout.contains("report: ") && stdout.contains(": served in"),
        "{stdout}"
    );
    if !cfg!(feature = "cuda") {
        // No GPU tier in this build: each is skipped, the CPU serves.
        assert!(
            stdout.contains("report: vendor: skipped (unavailable"),
            "{stdout}"
        );
        assert!(stdout.contains("cpu: served"), "{stdout}");
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("cpu ") && l.contains(" 1 ")),
            "{stdout}"
        );
    }

    let f = SafeTensors::open(&out).unwrap();
    let info = f.info("output").unwrap();
    assert_eq!(info.dtype, DType::F32);
    assert_eq!(info.shape, vec![2, 6, 3, 3, 6]);
    let got = f.read::<f32>("output").unwrap();
    let params = Conv3dParams::default()
        .with_stride([1, 2, 1])
        .with_padding([1; 3])
        .with_groups(2);
    let p = Conv3dProblem::new(
        params,
        Conv3dData::F32(&x),
        &[2, 4, 3, 5, 6],
        Conv3dData::F32(&w),
        &[6, 2, 3, 3, 3],
        Some(Conv3dData::F32(&b)),
    )
    .unwrap();
    common::conv3d::assert_close("cli", &p, &got, 1e-4);
}

#[test]
fn bf16_inputs_and_forced_cpu_tier() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    let (x, w, _) = write_input(&input);
    let out = dir.path().join("out.safetensors");
    let o = run(&[
        &input,
        &out,
        &"--input",
        &"xb",
        &"--weight",
        &"wb",
        &"--groups",
        &"2",
        &"--tier",
        &"cpu",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(
        stdout.contains("(BF16)") || stdout.contains("(bf16)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(": skipped (not the forced tier)") && stdout.contains("cpu: served"),
        "{stdout}"
    );
    let got = SafeTensors::open(&out)
        .unwrap()
        .read::<f32>("output")
        .unwrap();
    let xb: Vec<half::bf16> = x.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let wb: Vec<half::bf16> = w.iter().map(|&v| half::bf16::from_f32(v)).collect();
    let p = Conv3dProblem::new(
        Conv3dParams::default().with_groups(2),
        Conv3dData::BF16(&xb),
        &[2, 4, 3, 5, 6],
        Conv3dData::BF16(&wb),
        &[6, 2, 3, 3, 3],
        None,
    )
    .unwrap();
    common::conv3d::assert_close("cli bf16", &p, &got, 1e-5);
}

#[test]
fn host_device_runs_the_gpu_tiers() {
    // The host backend's "GPU" tiers: the tiled kernel's path serves a
    // call it supports (6 output channels over 2 groups is too few for it,
    // so the naive kernel serves here), the vendor tier is skipped.
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    let (x, w, b) = write_input(&input);
    let out = dir.path().join("out.safetensors");
    let o = run(&[
        &input,
        &out,
        &"--input",
        &"x",
        &"--weight",
        &"w",
        &"--bias",
        &"b",
        &"--groups",
        &"2",
        &"--device",
        &"host",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let stdout = text(&o.stdout);
    assert!(
        stdout.contains("report: vendor: skipped (unavailable: host: vendor library"),
        "{stdout}"
    );
    assert!(
        stdout.contains("tiled: skipped (unsupported: fewer than 8"),
        "{stdout}"
    );
    assert!(stdout.contains("naive: served"), "{stdout}");
    let got = SafeTensors::open(&out)
        .unwrap()
        .read::<f32>("output")
        .unwrap();
    let p = Conv3dProblem::new(
        Conv3dParams::default().with_groups(2),
        Conv3dData::F32(&x),
        &[2, 4, 3, 5, 6],
        Conv3dData::F32(&w),
        &[6, 2, 3, 3, 3],
        Some(Conv3dData::F32(&b)),
    )
    .unwrap();
    common::conv3d::assert_close("cli host device", &p, &got, 1e-5);
    // The vendor tier forced on the host device: nothing serves.
    let out2 = dir.path().join("out2.safetensors");
    let o = run(&[
        &input,
        &out2,
        &"--input",
        &"x",
        &"--weight",
        &"w",
        &"--groups",
        &"2",
        &"--device",
        &"host",
        &"--tier",
        &"vendor",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("no tier served the call"));
    assert!(!out2.exists());
}

/// Runs with `extra` arguments, expects exit `code`, one stderr line
/// containing `needle`, and no output file.
fn refused(extra: &[&str], code: i32, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_input(&input);
    let out = dir.path().join("out.safetensors");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![&input, &out];
    for e in extra {
        args.push(e);
    }
    let o = run(&args);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{extra:?}: {err}");
    assert!(
        err.lines().next().unwrap_or("").contains(needle),
        "{extra:?}: {err}"
    );
    if code == 1 {
        assert_eq!(err.lines().count(), 1, "{extra:?}: {err}");
    }
    assert!(!out.exists(), "{extra:?}: output was created");
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "{extra:?}: stray files {leftovers:?}");
}

#[test]
fn bad_names_shapes_and_parameters_fail_cleanly() {
    let base = ["--input", "x", "--weight", "w"];
    let with = |more: &[&'static str]| -> Vec<&'static str> {
        base.iter().copied().chain(more.iter().copied()).collect()
    };
    refused(
        &["--input", "nope", "--weight", "w"],
        1,
        "no tensor named \"nope\"",
    );
    refused(
        &with(&["--bias", "missing"]),
        1,
        "no tensor named \"missing\"",
    );
    // groups 1: the weight's 2 input channels are not x's 4.
    refused(&base, 1, "second dimension must be input channels / groups");
    refused(&["--input", "flat", "--weight", "w"], 1, "must be 5-d");
    refused(&with(&["--groups", "2", "--stride", "0,1,1"]), 1, "stride");
    refused(
        &with(&["--groups", "2", "--bias", "flat"]),
        1,
        "bias shape [2, 3]: must be 1-d",
    );
    refused(
        &with(&["--groups", "2", "--dilation", "9"]),
        1,
        "larger than the padded input",
    );
    // A tier this build lacks, forced: no tier serves.
    if !cfg!(any(feature = "cuda", feature = "hip")) {
        refused(
            &with(&["--groups", "2", "--tier", "naive"]),
            1,
            "no tier served the call",
        );
    }
    refused(&with(&["--tier", "gpu"]), 2, "unknown --tier");
    refused(&with(&["--device", "tpu"]), 2, "unknown --device");
    refused(
        &with(&["--stride", "1,2"]),
        2,
        "--stride needs one or three",
    );
    refused(&["--weight", "w"], 2, "--input is required");
}

#[test]
fn missing_input_file_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.safetensors");
    let o = run(&[
        &dir.path().join("none.safetensors"),
        &out,
        &"--input",
        &"x",
        &"--weight",
        &"w",
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("none.safetensors"),
        "{}",
        text(&o.stderr)
    );
    assert!(!out.exists());
}
