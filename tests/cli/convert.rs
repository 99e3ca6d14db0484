//! The `convert` example's contract, exercised through the real binary:
//! exit codes, one-line errors naming the file and tensor, no output file on
//! failure, bit-exact conversion, untouched integer tensors, kept metadata.

use crate::example_bin;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use rocm_safe::convert::convert_bytes;
use rocm_safe::safetensors::{Checkpoint, SafeTensors, SafeTensorsWriter, TensorSpec};
use rocm_safe::DType;

fn convert_exe() -> PathBuf {
    example_bin::example("convert")
}

fn run(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut cmd = Command::new(convert_exe());
    for a in args {
        cmd.arg(a);
    }
    cmd.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Deterministic bytes that are finite values for every float dtype
/// (patterns with a moderate exponent), plus a NaN and an infinity.
fn data(dtype: DType, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..n {
        let x = (i as f64 * 0.37 - 3.0) * if i % 3 == 0 { 1e-3 } else { 1.0 };
        let x = match i {
            5 => f64::NAN,
            7 => f64::NEG_INFINITY,
            _ => x,
        };
        match dtype {
            DType::F64 => out.extend(x.to_le_bytes()),
            DType::F32 => out.extend((x as f32).to_le_bytes()),
            DType::F16 => out.extend(half::f16::from_f64(x).to_le_bytes()),
            DType::BF16 => out.extend(half::bf16::from_f64(x).to_le_bytes()),
            DType::I32 => out.extend((i as i32 - 7).to_le_bytes()),
            DType::BOOL | DType::U8 | DType::F8_E4M3 | DType::F8_E4M3FNUZ => {
                out.push((i * 37) as u8)
            }
            other => unreachable!("{other}"),
        }
    }
    out
}

struct T {
    name: &'static str,
    dtype: DType,
    shape: Vec<u64>,
}

fn write_file(path: &Path, tensors: &[T], metadata: Option<&BTreeMap<String, String>>) {
    let specs: Vec<TensorSpec> = tensors
        .iter()
        .map(|t| TensorSpec::new(t.name, t.dtype, t.shape.clone()))
        .collect();
    let mut w = SafeTensorsWriter::create(path, specs, metadata).unwrap();
    for t in tensors {
        let n: u64 = t.shape.iter().product();
        w.write_tensor(t.name, &data(t.dtype, n as usize)).unwrap();
    }
    w.finish().unwrap();
}

fn mixed() -> Vec<T> {
    vec![
        T {
            name: "w.f64",
            dtype: DType::F64,
            shape: vec![3, 5],
        },
        T {
            name: "w.f32",
            dtype: DType::F32,
            shape: vec![17],
        },
        T {
            name: "w.f16",
            dtype: DType::F16,
            shape: vec![2, 3, 3],
        },
        T {
            name: "w.bf16",
            dtype: DType::BF16,
            shape: vec![33],
        },
        T {
            name: "scalar",
            dtype: DType::BF16,
            shape: vec![],
        },
        T {
            name: "empty",
            dtype: DType::F32,
            shape: vec![0, 4],
        },
        T {
            name: "ids",
            dtype: DType::I32,
            shape: vec![9],
        },
        T {
            name: "mask",
            dtype: DType::BOOL,
            shape: vec![4, 2],
        },
    ]
}

fn meta() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("format".to_owned(), "pt".to_owned()),
        ("note".to_owned(), "x".to_owned()),
    ])
}

/// Checks OUTPUT against INPUT: same names, shapes, metadata; floats
/// converted bit-exactly by the CPU reference; others byte-identical.
fn check_output(input: &Checkpoint, output: &Path, to: DType) {
    let out = SafeTensors::open(output).unwrap();
    assert_eq!(out.tensors().len(), input.len());
    assert_eq!(out.metadata(), input.metadata());
    for (file, info) in input.tensors() {
        let o = out.info(&info.name).unwrap();
        assert_eq!(o.shape, info.shape, "{}", info.name);
        let src = file.read_bytes(&info.name).unwrap();
        let got = out.read_bytes(&info.name).unwrap();
        if info.dtype.is_convertible_float() {
            assert_eq!(o.dtype, to, "{}", info.name);
            let mut want = vec![0u8; got.len()];
            convert_bytes(info.dtype, &src, to, &mut want).unwrap();
            assert_eq!(got, want, "{}", info.name);
        } else {
            assert_eq!(o.dtype, info.dtype, "{}", info.name);
            assert_eq!(got, src, "{}", info.name);
        }
    }
}

#[test]
fn converts_a_single_file_to_each_dtype() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_file(&input, &mixed(), Some(&meta()));
    let ck = Checkpoint::open(&input).unwrap();
    for (flag, to) in [
        ("f32", DType::F32),
        ("bf16", DType::BF16),
        ("f16", DType::F16),
    ] {
        let output = dir.path().join(format!("out-{flag}.safetensors"));
        let o = run(&[&input, &output, &"--dtype", &flag]);
        assert!(o.status.success(), "{flag}: {}", stderr(&o));
        check_output(&ck, &output, to);
    }
}

#[test]
fn converts_a_sharded_checkpoint_into_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let all = mixed();
    let (a, b) = all.split_at(4);
    write_file(&dir.path().join("m-1.safetensors"), a, Some(&meta()));
    write_file(&dir.path().join("m-2.safetensors"), b, Some(&meta()));
    let weight_map: BTreeMap<&str, &str> = a
        .iter()
        .map(|t| (t.name, "m-1.safetensors"))
        .chain(b.iter().map(|t| (t.name, "m-2.safetensors")))
        .collect();
    let index = dir.path().join("m.safetensors.index.json");
    let json = serde_json::json!({"metadata": {"total_size": 1}, "weight_map": weight_map});
    std::fs::write(&index, json.to_string()).unwrap();
    let output = dir.path().join("one.safetensors");
    let o = run(&[&index, &output, &"--dtype", &"f32"]);
    assert!(o.status.success(), "{}", stderr(&o));
    check_output(&Checkpoint::open(&index).unwrap(), &output, DType::F32);
}

/// Asserts the failure contract: exit 1, one stderr line containing every
/// `needle`, no panic, and OUTPUT not created.
fn assert_fails(o: &Output, output: &Path, needles: &[&str]) {
    let e = stderr(o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert_eq!(e.trim_end().lines().count(), 1, "one line expected: {e}");
    assert!(!e.contains("panicked"), "{e}");
    for n in needles {
        assert!(e.contains(n), "{n:?} not in {e:?}");
    }
    assert!(!output.exists(), "output must not be created on failure");
    let leftovers: Vec<_> = std::fs::read_dir(output.parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

#[test]
fn truncated_input_fails_cleanly_without_output() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    write_file(&input, &mixed(), None);
    let bytes = std::fs::read(&input).unwrap();
    std::fs::write(&input, &bytes[..bytes.len() - 3]).unwrap();
    let output = dir.path().join("out.safetensors");
    let o = run(&[&input, &output, &"--dtype", &"f32"]);
    assert_fails(&o, &output, &["in.safetensors"]);
}

#[test]
fn garbage_and_lfs_pointer_inputs_fail_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.safetensors");
    let lfs = dir.path().join("lfs.safetensors");
    std::fs::write(
        &lfs,
        "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 12\n",
    )
    .unwrap();
    let o = run(&[&lfs, &output, &"--dtype", &"bf16"]);
    assert_fails(&o, &output, &["lfs.safetensors", "lfs"]);
    let missing = dir.path().join("missing.safetensors");
    let o = run(&[&missing, &output, &"--dtype", &"bf16"]);
    assert_fails(&o, &output, &["missing.safetensors"]);
}

#[test]
fn fp8_tensor_is_an_error_unless_kept() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    let mut ts = mixed();
    // F8_E4M3 and F8_E5M2 convert (rows of the conversion table); the
    // FNUZ flavours do not.
    ts.push(T {
        name: "scale.fp8",
        dtype: DType::F8_E4M3FNUZ,
        shape: vec![6],
    });
    ts.push(T {
        name: "w.fp8",
        dtype: DType::F8_E4M3,
        shape: vec![6],
    });
    write_file(&input, &ts, None);
    let output = dir.path().join("out.safetensors");
    let o = run(&[&input, &output, &"--dtype", &"f32"]);
    assert_fails(&o, &output, &["in.safetensors", "scale.fp8", "F8_E4M3FNUZ"]);
    let o = run(&[&input, &output, &"--dtype", &"f32", &"--keep-unsupported"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = SafeTensors::open(&output).unwrap();
    assert_eq!(out.info("scale.fp8").unwrap().dtype, DType::F8_E4M3FNUZ);
    assert_eq!(out.info("w.fp8").unwrap().dtype, DType::F32);
    assert_eq!(out.info("w.bf16").unwrap().dtype, DType::F32);
}

#[test]
fn failure_leaves_an_existing_output_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.safetensors");
    std::fs::write(&input, b"\x10\0\0\0\0\0\0\0{\"a\":1}        ").unwrap();
    let output = dir.path().join("out.safetensors");
    std::fs::write(&output, b"precious").unwrap();
    let o = run(&[&input, &output, &"--dtype", &"f32"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("in.safetensors"));
    assert_eq!(std::fs::read(&output).unwrap(), b"precious");
}

#[test]
fn usage_errors_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    for args in [
        vec![],
        vec![a.as_os_str().to_owned()],
        vec![a.as_os_str().into(), "b".into()],
        vec![
            a.as_os_str().into(),
            "b".into(),
            "--dtype".into(),
            "f64".into(),
        ],
        vec![
            a.as_os_str().into(),
            "b".into(),
            "--dtype".into(),
            "f32".into(),
            "--bogus".into(),
        ],
    ] {
        let o = Command::new(convert_exe()).args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("usage"), "{args:?}");
    }
}
