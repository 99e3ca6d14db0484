//! One hand-made file per error variant of the safetensors reader: the
//! bytes are built here (8-byte length + header + data), never by a writer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rocm_safe::safetensors::{parse_bytes, Checkpoint, SafeTensors, SafeTensorsWriter, TensorSpec};
use rocm_safe::{DType, Error};

/// 8-byte little-endian length + header (unpadded) + data.
fn file_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Opens a hand-made file and returns the error; also checks that the
/// in-memory parser agrees.
fn open_err(header: &str, data: &[u8]) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let bytes = file_bytes(header, data);
    let p = write(dir.path(), "t.safetensors", &bytes);
    let e = SafeTensors::open(&p).unwrap_err();
    let e2 = parse_bytes(&p, &bytes).unwrap_err();
    assert_eq!(e.to_string(), e2.to_string());
    assert!(
        e.to_string().contains("t.safetensors"),
        "error names the file: {e}"
    );
    e
}

const ONE: &str = r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;

#[test]
fn valid_baseline_opens() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "ok.safetensors", &file_bytes(ONE, &[7, 9]));
    let f = SafeTensors::open(&p).unwrap();
    assert_eq!(f.read_bytes("a").unwrap(), vec![7, 9]);
    assert_eq!(f.data_start(), 8 + ONE.len() as u64);
}

#[test]
fn io_missing_file() {
    let e = SafeTensors::open("/nonexistent/dir/x.safetensors").unwrap_err();
    assert!(matches!(e, Error::Io { op: "open", .. }), "{e}");
}

#[test]
fn file_too_small() {
    let dir = tempfile::tempdir().unwrap();
    for len in 0..8 {
        let p = write(dir.path(), "s.safetensors", &vec![0u8; len]);
        let e = SafeTensors::open(&p).unwrap_err();
        assert!(
            matches!(e, Error::FileTooSmall { len: l, .. } if l == len as u64),
            "{e}"
        );
    }
    assert!(matches!(
        parse_bytes(Path::new("m"), &[1, 2, 3]),
        Err(Error::FileTooSmall { len: 3, .. })
    ));
}

#[test]
fn lfs_pointer() {
    let ptr = "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 12345\n";
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "model.safetensors", ptr.as_bytes());
    let e = SafeTensors::open(&p).unwrap_err();
    assert!(matches!(e, Error::LfsPointer { .. }), "{e}");
    assert!(e.to_string().contains("git lfs"), "{e}");
}

#[test]
fn header_too_large() {
    let mut bytes = (100_000_001u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let e = parse_bytes(Path::new("big"), &bytes).unwrap_err();
    assert!(
        matches!(
            e,
            Error::HeaderTooLarge {
                len: 100_000_001,
                limit: 100_000_000,
                ..
            }
        ),
        "{e}"
    );
    // u64::MAX must not overflow 8 + N.
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    assert!(matches!(
        parse_bytes(Path::new("big"), &bytes),
        Err(Error::HeaderTooLarge { .. })
    ));
}

#[test]
fn header_out_of_bounds() {
    let mut bytes = 100u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "oob.safetensors", &bytes);
    let e = SafeTensors::open(&p).unwrap_err();
    assert!(
        matches!(
            e,
            Error::HeaderOutOfBounds {
                header_len: 100,
                file_len: 10,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn header_not_utf8() {
    let mut h = b"{\"\xff\":1}".to_vec();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.append(&mut h);
    let e = parse_bytes(Path::new("u"), &bytes).unwrap_err();
    assert!(
        matches!(e, Error::HeaderNotUtf8 { valid_up_to: 2, .. }),
        "{e}"
    );
}

#[test]
fn header_not_object() {
    let e = open_err(" {}", &[]);
    assert!(
        matches!(e, Error::HeaderNotObject { reason, .. } if reason.contains("start")),
        "{e}"
    );
    let e = open_err("[1]", &[]);
    assert!(matches!(e, Error::HeaderNotObject { .. }), "{e}");
    // Padding other than spaces (a tab, a newline, a NUL) after the object.
    for pad in ["{}\t", "{}\n", "{}\0", "{} x"] {
        let e = open_err(pad, &[]);
        assert!(
            matches!(e, Error::HeaderNotObject { reason, .. } if reason.contains("spaces")),
            "{pad:?}: {e}"
        );
    }
    // Spaces are fine.
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "sp.safetensors", &file_bytes("{}      ", &[]));
    assert!(SafeTensors::open(&p).unwrap().tensors().is_empty());
}

#[test]
fn header_json_syntax() {
    let e = open_err(r#"{"a": }"#, &[]);
    assert!(matches!(e, Error::HeaderJson { .. }), "{e}");
    let e = open_err("{} {}", &[]);
    assert!(matches!(e, Error::HeaderJson { .. }), "{e}");
    // Lone surrogate escape.
    let e = open_err(r#"{"\ud800":{}}"#, &[]);
    assert!(matches!(e, Error::HeaderJson { .. }), "{e}");
}

#[test]
fn duplicate_keys() {
    let t = r#"{"dtype":"U8","shape":[1],"data_offsets":[0,1]}"#;
    // Top level, plain and differently escaped.
    for h in [
        format!(r#"{{"a":{t},"a":{t}}}"#),
        format!(r#"{{"a":{t},"\u0061":{t}}}"#),
    ] {
        let e = open_err(&h, &[1]);
        assert!(
            matches!(&e, Error::DuplicateKey { key, within, .. } if key == "a" && within == "the header"),
            "{e}"
        );
    }
    // __metadata__ twice.
    let e = open_err(r#"{"__metadata__":{},"__metadata__":{}}"#, &[]);
    assert!(
        matches!(&e, Error::DuplicateKey { key, .. } if key == "__metadata__"),
        "{e}"
    );
    // Inside __metadata__.
    let e = open_err(r#"{"__metadata__":{"k":"1","\u006b":"2"}}"#, &[]);
    assert!(
        matches!(&e, Error::DuplicateKey { key, within, .. } if key == "k" && within == "__metadata__"),
        "{e}"
    );
    // Inside a tensor entry.
    let e = open_err(
        r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"d\u0074ype":"I8"}}"#,
        &[1],
    );
    assert!(
        matches!(&e, Error::DuplicateKey { key, within, .. } if key == "dtype" && within.contains("\"a\"")),
        "{e}"
    );
}

#[test]
fn invalid_metadata() {
    let e = open_err(r#"{"__metadata__":["x"]}"#, &[]);
    assert!(
        matches!(&e, Error::InvalidMetadata { key: None, .. }),
        "{e}"
    );
    let e = open_err(r#"{"__metadata__":{"k":1}}"#, &[]);
    assert!(
        matches!(&e, Error::InvalidMetadata { key: Some(k), .. } if k == "k"),
        "{e}"
    );
    // `null` is no metadata (safetensors_read.rs) but still a duplicate
    // key twice; other non-objects are refused.
    let e = open_err(r#"{"__metadata__":null,"__metadata__":null}"#, &[]);
    assert!(matches!(&e, Error::DuplicateKey { .. }), "{e}");
    for bad in [r#"{"__metadata__":1}"#, r#"{"__metadata__":true}"#] {
        let e = open_err(bad, &[]);
        assert!(
            matches!(&e, Error::InvalidMetadata { key: None, .. }),
            "{bad}: {e}"
        );
    }
    // A tensor-shaped __metadata__ is still metadata, never a tensor.
    let e = open_err(
        r#"{"__metadata__":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#,
        &[1],
    );
    assert!(
        matches!(&e, Error::InvalidMetadata { key: Some(k), .. } if k == "shape"),
        "{e}"
    );
}

#[test]
fn invalid_tensor_entries() {
    let cases: &[(&str, &str, &str)] = &[
        (r#"{"a":[1]}"#, "entry", "not an object"),
        (
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":0}}"#,
            "extra",
            "unknown",
        ),
        (
            r#"{"a":{"shape":[1],"data_offsets":[0,1]}}"#,
            "dtype",
            "missing",
        ),
        (
            r#"{"a":{"dtype":"U8","data_offsets":[0,1]}}"#,
            "shape",
            "missing",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[1]}}"#,
            "data_offsets",
            "missing",
        ),
        (
            r#"{"a":{"dtype":8,"shape":[1],"data_offsets":[0,1]}}"#,
            "dtype",
            "not a string",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#,
            "shape",
            "unsigned",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}"#,
            "shape",
            "unsigned",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":1,"data_offsets":[0,1]}}"#,
            "shape",
            "unsigned",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,1]}}"#,
            "data_offsets",
            "two",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[1]}}"#,
            "data_offsets",
            "two",
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,"1"]}}"#,
            "data_offsets",
            "two",
        ),
    ];
    for (h, field, reason) in cases {
        let e = open_err(h, &[1]);
        match &e {
            Error::InvalidTensorEntry {
                tensor,
                field: f,
                reason: r,
                ..
            } => {
                assert_eq!(tensor, "a");
                assert_eq!(f, field, "{h}");
                assert!(r.contains(reason), "{h}: {e}");
            }
            _ => panic!("{h}: {e}"),
        }
    }
}

#[test]
fn unknown_dtype() {
    for d in ["bf16", "F8", "Q4_0", ""] {
        let h = format!(r#"{{"a":{{"dtype":"{d}","shape":[1],"data_offsets":[0,1]}}}}"#);
        let e = open_err(&h, &[1]);
        assert!(
            matches!(&e, Error::UnknownDType { tensor, dtype, .. } if tensor == "a" && dtype == d),
            "{e}"
        );
    }
}

#[test]
fn every_dtype_is_accepted() {
    for d in DType::ALL {
        let n = d.bytes_for(8).unwrap();
        let h = format!(
            r#"{{"t":{{"dtype":"{}","shape":[2,4],"data_offsets":[0,{n}]}}}}"#,
            d.name()
        );
        let bytes = file_bytes(&h, &vec![0u8; n as usize]);
        let hd = parse_bytes(Path::new("x"), &bytes).unwrap();
        assert_eq!(hd.tensors()[0].dtype, d);
    }
}

#[test]
fn invalid_tensor_size() {
    let e = open_err(
        r#"{"a":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#,
        &[],
    );
    assert!(
        matches!(&e, Error::InvalidTensorSize { reason, .. } if reason.contains("element count")),
        "{e}"
    );
    let e = open_err(
        r#"{"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}}"#,
        &[],
    );
    assert!(
        matches!(&e, Error::InvalidTensorSize { reason, .. } if reason.contains("byte size")),
        "{e}"
    );
    let e = open_err(
        r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,1]}}"#,
        &[1],
    );
    assert!(
        matches!(&e, Error::InvalidTensorSize { dtype: DType::F4, reason, .. } if reason.contains("sub-byte")),
        "{e}"
    );
}

#[test]
fn invalid_data_offsets() {
    // begin > end
    let e = open_err(
        r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[2,1]}}"#,
        &[1, 2],
    );
    assert!(
        matches!(
            &e,
            Error::InvalidDataOffsets {
                begin: 2,
                end: 1,
                ..
            }
        ),
        "{e}"
    );
    // span != size
    let e = open_err(
        r#"{"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,3]}}"#,
        &[1, 2, 3],
    );
    assert!(
        matches!(&e, Error::InvalidDataOffsets { expected: 4, .. }),
        "{e}"
    );
}

#[test]
fn data_layout() {
    let t = |name: &str, b: u64, e: u64| {
        format!(
            r#""{name}":{{"dtype":"U8","shape":[{}],"data_offsets":[{b},{e}]}}"#,
            e - b
        )
    };
    let case = |h: String, data: usize, problem: &str, tensor: Option<&str>| {
        let e = open_err(&h, &vec![0u8; data]);
        match &e {
            Error::DataLayout {
                problem: p,
                tensor: t,
                ..
            } => {
                assert_eq!(*p, problem, "{h}");
                assert_eq!(t.as_deref(), tensor, "{h}");
            }
            _ => panic!("{h}: {e}"),
        }
    };
    case(
        format!("{{{},{}}}", t("a", 0, 2), t("b", 3, 4)),
        4,
        "hole",
        Some("b"),
    );
    case(format!("{{{}}}", t("a", 1, 2)), 2, "hole", Some("a"));
    case(
        format!("{{{},{}}}", t("a", 0, 2), t("b", 1, 3)),
        3,
        "overlap",
        Some("b"),
    );
    case(
        format!("{{{},{}}}", t("a", 0, 2), t("b", 0, 2)),
        2,
        "overlap",
        Some("b"),
    );
    // An empty tensor inside another one is refused too (strictness).
    case(
        format!("{{{},{}}}", t("a", 0, 2), t("z", 1, 1)),
        2,
        "overlap",
        Some("z"),
    );
    case(
        format!("{{{}}}", t("a", 0, 4)),
        3,
        "tensor past the end",
        Some("a"),
    );
    case(format!("{{{}}}", t("a", 0, 2)), 3, "trailing bytes", None);
    case("{}".to_owned(), 1, "trailing bytes", None);
}

/// A small file with several dtypes and shapes.
fn sample(dir: &Path) -> PathBuf {
    let h = r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,12]},"i":{"dtype":"I32","shape":[2],"data_offsets":[12,20]},"s":{"dtype":"F32","shape":[],"data_offsets":[20,24]},"f8":{"dtype":"F8_E4M3FNUZ","shape":[2],"data_offsets":[24,26]}}"#;
    let data: Vec<u8> = (0..26u8).collect();
    write(dir, "sample.safetensors", &file_bytes(h, &data))
}

#[test]
fn tensor_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let f = SafeTensors::open(sample(dir.path())).unwrap();
    let e = f.read_bytes("nope").unwrap_err();
    assert!(
        matches!(&e, Error::TensorNotFound { tensor, .. } if tensor == "nope"),
        "{e}"
    );
    assert!(f.info("nope").is_err());
    assert!(f.get("nope").is_none());
}

#[test]
fn conversion_not_supported() {
    let dir = tempfile::tempdir().unwrap();
    let f = SafeTensors::open(sample(dir.path())).unwrap();
    for name in ["i", "f8"] {
        let e = f.read::<f32>(name).unwrap_err();
        assert!(
            matches!(&e, Error::UnsupportedConversion { to: DType::F32, tensor: Some(t), .. } if t.tensor == name),
            "{e}"
        );
        let mut out = vec![0f32; 2];
        assert!(matches!(
            f.read_into(name, &mut out),
            Err(Error::UnsupportedConversion { .. })
        ));
        assert!(matches!(
            f.read_rows::<half::bf16>(name, 0..1),
            Err(Error::UnsupportedConversion { .. })
        ));
        // Raw bytes always work.
        assert_eq!(
            f.read_bytes(name).unwrap().len(),
            f.info(name).unwrap().num_bytes() as usize
        );
    }
    // A float read as a non-target type (f64) is refused as well.
    let e = f.read::<f64>("w").unwrap_err();
    assert!(
        matches!(
            &e,
            Error::UnsupportedConversion {
                from: DType::BF16,
                to: DType::F64,
                ..
            }
        ),
        "{e}"
    );
    let e = f.read_converted_bytes("w", DType::I32).unwrap_err();
    assert!(matches!(&e, Error::UnsupportedConversion { .. }), "{e}");
}

#[test]
fn buffer_length() {
    let dir = tempfile::tempdir().unwrap();
    let f = SafeTensors::open(sample(dir.path())).unwrap();
    let mut small = vec![0f32; 5];
    let e = f.read_into("w", &mut small).unwrap_err();
    // The file and tensor are named.
    assert!(
        e.to_string()
            .contains("tensor \"w\": read: length mismatch"),
        "{e}"
    );
    assert!(
        matches!(
            &e,
            Error::LengthMismatch {
                expected: 6,
                actual: 5,
                ..
            }
        ),
        "{e}"
    );
    let mut b = vec![0u8; 3];
    assert!(matches!(
        f.read_bytes_into("i", &mut b),
        Err(Error::LengthMismatch {
            expected: 8,
            actual: 3,
            ..
        })
    ));
    let mut b = vec![0u8; 11];
    assert!(matches!(
        f.read_converted_bytes_into("w", DType::F16, &mut b),
        Err(Error::LengthMismatch { .. })
    ));
    let mut r = vec![0f32; 3];
    assert!(matches!(
        f.read_rows_into("w", 0..2, &mut r),
        Err(Error::LengthMismatch { expected: 4, .. })
    ));
}

#[test]
fn no_rows_and_row_range() {
    let dir = tempfile::tempdir().unwrap();
    let f = SafeTensors::open(sample(dir.path())).unwrap();
    let e = f.read_rows::<f32>("s", 0..1).unwrap_err();
    assert!(
        matches!(&e, Error::NoRows { tensor, .. } if tensor == "s"),
        "{e}"
    );
    assert!(matches!(
        f.read_rows_bytes("s", 0..0),
        Err(Error::NoRows { .. })
    ));
    #[allow(clippy::reversed_empty_ranges)]
    let e = f.read_rows::<f32>("w", 2..1).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::RowRange {
                start: 2,
                end: 1,
                rows: 3,
                ..
            }
        ),
        "{e}"
    );
    let e = f.read_rows_bytes("w", 0..4).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::RowRange {
                end: 4,
                rows: 3,
                ..
            }
        ),
        "{e}"
    );
    // Sub-byte rows that do not fill whole bytes have no byte-addressable rows.
    let h = r#"{"q":{"dtype":"F4","shape":[2,3],"data_offsets":[0,3]}}"#;
    let p = write(dir.path(), "f4.safetensors", &file_bytes(h, &[1, 2, 3]));
    let f = SafeTensors::open(p).unwrap();
    assert!(matches!(
        f.read_rows_bytes("q", 0..1),
        Err(Error::NoRows { .. })
    ));
    assert_eq!(f.read_bytes("q").unwrap(), vec![1, 2, 3]);
}

#[test]
fn file_shrunk_after_open() {
    let dir = tempfile::tempdir().unwrap();
    let p = sample(dir.path());
    let f = SafeTensors::open(&p).unwrap();
    let len = f.file_len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(len - 4)
        .unwrap();
    // "f8" (the last two bytes) is gone, "s" is half gone.
    let e = f.read_bytes("f8").unwrap_err();
    assert!(
        matches!(&e, Error::FileShrunk { tensor, expected, actual, .. } if tensor == "f8" && *expected == len && *actual == len - 4),
        "{e}"
    );
    assert!(matches!(f.read::<f32>("s"), Err(Error::FileShrunk { .. })));
    // Bytes still present are read, but the file changed since open: the
    // read is refused rather than trusted.
    assert!(matches!(
        f.read_bytes("i"),
        Err(Error::FileChanged { what: "size", .. })
    ));
    // Converting path too.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(10)
        .unwrap();
    assert!(matches!(f.read::<f32>("w"), Err(Error::FileShrunk { .. })));
}

#[cfg(target_pointer_width = "32")]
#[test]
fn too_large_for_platform() {
    let h = r#"{"a":{"dtype":"U8","shape":[0,8589934592],"data_offsets":[0,0]}}"#;
    let bytes = file_bytes(h, &[]);
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "big.safetensors", &bytes);
    let f = SafeTensors::open(p).unwrap();
    assert!(f.read_rows_bytes("a", 0..0).is_ok());
}

// ----- sharded checkpoints ------------------------------------------------

fn shard(dir: &Path, name: &str, tensors: &[&str], meta: Option<&str>) -> PathBuf {
    let mut entries: Vec<String> = meta
        .map(|m| format!(r#""__metadata__":{m}"#))
        .into_iter()
        .collect();
    for (i, t) in tensors.iter().enumerate() {
        entries.push(format!(
            r#""{t}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#,
            i + 1
        ));
    }
    let data: Vec<u8> = (0..tensors.len() as u8).collect();
    write(
        dir,
        name,
        &file_bytes(&format!("{{{}}}", entries.join(",")), &data),
    )
}

fn index(dir: &Path, weight_map: &str) -> PathBuf {
    let body = format!(
        r#"{{"metadata":{{"total_size":4,"nested":{{"x":[1,2]}}}},"weight_map":{weight_map}}}"#
    );
    write(dir, "model.safetensors.index.json", body.as_bytes())
}

#[test]
fn sharded_checkpoint_opens() {
    let dir = tempfile::tempdir().unwrap();
    shard(
        dir.path(),
        "b.safetensors",
        &["x", "y"],
        Some(r#"{"format":"pt"}"#),
    );
    shard(
        dir.path(),
        "a.safetensors",
        &["z"],
        Some(r#"{"format":"pt","extra":"1"}"#),
    );
    let p = index(
        dir.path(),
        r#"{"x":"b.safetensors","y":"b.safetensors","z":"a.safetensors"}"#,
    );
    let c = Checkpoint::open(&p).unwrap();
    assert_eq!(c.shards().len(), 2);
    let names: Vec<&str> = c.tensors().map(|(_, t)| t.name.as_str()).collect();
    assert_eq!(names, ["z", "x", "y"], "shard order (sorted), then offsets");
    assert_eq!(c.read_bytes("y").unwrap(), vec![1]);
    assert_eq!(
        c.get("z").unwrap().0.path(),
        dir.path().join("a.safetensors")
    );
    assert_eq!(
        c.metadata().unwrap().get("extra").map(String::as_str),
        Some("1")
    );
    assert_eq!(c.index_metadata().unwrap()["total_size"], 4);
    assert_eq!(c.len(), 3);
    let e = c.read_bytes("nope").unwrap_err();
    assert!(
        matches!(&e, Error::TensorNotFound { path, .. } if path == &p),
        "{e}"
    );
}

#[test]
fn single_file_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let p = sample(dir.path());
    let c = Checkpoint::open(&p).unwrap();
    assert_eq!(c.shards().len(), 1);
    assert_eq!(c.read::<f32>("s").unwrap().len(), 1);
    assert_eq!(c.metadata().unwrap()["format"], "pt");
    assert!(c.index_metadata().is_none());
}

fn index_err(setup: impl FnOnce(&Path) -> PathBuf) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let p = setup(dir.path());
    Checkpoint::open(p).unwrap_err()
}

#[test]
fn invalid_index() {
    let e = index_err(|d| write(d, "m.index.json", br#"{"metadata":{}}"#));
    assert!(
        matches!(&e, Error::InvalidIndex { reason, .. } if reason.contains("weight_map")),
        "{e}"
    );
    let e = index_err(|d| write(d, "m.index.json", br#"[1]"#));
    assert!(matches!(&e, Error::InvalidIndex { .. }), "{e}");
    let e = index_err(|d| write(d, "m.index.json", br#"{"weight_map":{"a":1}}"#));
    assert!(
        matches!(&e, Error::InvalidIndex { tensor: Some(t), .. } if t == "a"),
        "{e}"
    );
    let e = index_err(|d| write(d, "m.index.json", br#"{"weight_map":{"#));
    assert!(matches!(&e, Error::HeaderJson { .. }), "{e}");
    let e = index_err(|d| {
        let p = d.join("m.index.json");
        std::fs::File::create(&p)
            .unwrap()
            .set_len(100_000_001)
            .unwrap(); // sparse
        p
    });
    assert!(
        matches!(&e, Error::InvalidIndex { reason, .. } if reason.contains("100 MB")),
        "{e}"
    );
    let e = index_err(|d| d.join("missing.index.json"));
    assert!(matches!(&e, Error::Io { .. }), "{e}");
}

#[test]
fn index_duplicate_keys() {
    let e = index_err(|d| {
        shard(d, "a.safetensors", &["x"], None);
        index(d, r#"{"x":"a.safetensors","\u0078":"a.safetensors"}"#)
    });
    assert!(
        matches!(&e, Error::DuplicateKey { key, within, .. } if key == "x" && within == "weight_map"),
        "{e}"
    );
    let e = index_err(|d| write(d, "m.index.json", br#"{"weight_map":{},"weight_map":{}}"#));
    assert!(
        matches!(&e, Error::DuplicateKey { within, .. } if within == "the index"),
        "{e}"
    );
}

#[test]
fn invalid_shard_names() {
    for bad in [
        "../a.safetensors",
        "/tmp/a.safetensors",
        "sub/a.safetensors",
        "a\\\\b",
        "",
        "..",
        ".",
    ] {
        let e = index_err(|d| {
            shard(d, "a.safetensors", &["x"], None);
            index(d, &format!(r#"{{"x":"{bad}"}}"#))
        });
        assert!(
            matches!(&e, Error::InvalidShardName { tensor, .. } if tensor == "x"),
            "{bad:?}: {e}"
        );
    }
}

#[test]
fn shard_symlink_escaping_folder() {
    let outside = tempfile::tempdir().unwrap();
    let target = shard(outside.path(), "real.safetensors", &["x"], None);
    let e = index_err(|d| {
        std::os::unix::fs::symlink(&target, d.join("a.safetensors")).unwrap();
        index(d, r#"{"x":"a.safetensors"}"#)
    });
    assert!(
        matches!(&e, Error::InvalidShardName { reason, .. } if reason.contains("symlink")),
        "{e}"
    );
    // A symlink to a file inside the folder is fine.
    let dir = tempfile::tempdir().unwrap();
    shard(dir.path(), "real.safetensors", &["x"], None);
    std::os::unix::fs::symlink(
        dir.path().join("real.safetensors"),
        dir.path().join("a.safetensors"),
    )
    .unwrap();
    let p = index(dir.path(), r#"{"x":"a.safetensors"}"#);
    assert_eq!(
        Checkpoint::open(p).unwrap().read_bytes("x").unwrap(),
        vec![0]
    );
}

#[test]
fn index_shard_missing_file() {
    let e = index_err(|d| index(d, r#"{"x":"a.safetensors"}"#));
    assert!(
        matches!(
            &e,
            Error::Io {
                op: "open shard",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn listed_tensor_missing_from_shard() {
    let e = index_err(|d| {
        shard(d, "a.safetensors", &["x"], None);
        index(d, r#"{"x":"a.safetensors","y":"a.safetensors"}"#)
    });
    assert!(
        matches!(&e, Error::TensorNotFound { tensor, path } if tensor == "y" && path.ends_with("a.safetensors")),
        "{e}"
    );
    // Listed for one shard, stored in another.
    let e = index_err(|d| {
        shard(d, "a.safetensors", &["x"], None);
        shard(d, "b.safetensors", &["y"], None);
        index(d, r#"{"x":"a.safetensors","y":"a.safetensors"}"#)
    });
    assert!(
        matches!(&e, Error::TensorNotFound { tensor, path } if tensor == "y" && path.ends_with("a.safetensors")),
        "{e}"
    );
}

#[test]
fn tensor_in_two_shards() {
    let e = index_err(|d| {
        shard(d, "a.safetensors", &["x"], None);
        shard(d, "b.safetensors", &["x", "y"], None);
        index(d, r#"{"x":"a.safetensors","y":"b.safetensors"}"#)
    });
    assert!(
        matches!(&e, Error::TensorInTwoShards { tensor, .. } if tensor == "x"),
        "{e}"
    );
}

#[test]
fn tensor_not_in_index() {
    let e = index_err(|d| {
        shard(d, "a.safetensors", &["x", "extra"], None);
        index(d, r#"{"x":"a.safetensors"}"#)
    });
    assert!(
        matches!(&e, Error::TensorNotInIndex { tensor, .. } if tensor == "extra"),
        "{e}"
    );
}

#[test]
fn metadata_conflict() {
    let e = index_err(|d| {
        shard(d, "a.safetensors", &["x"], Some(r#"{"format":"pt"}"#));
        shard(d, "b.safetensors", &["y"], Some(r#"{"format":"np"}"#));
        index(d, r#"{"x":"a.safetensors","y":"b.safetensors"}"#)
    });
    assert!(
        matches!(&e, Error::MetadataConflict { key, first, second, .. } if key == "format" && first == "pt" && second == "np"),
        "{e}"
    );
}

#[test]
fn shard_with_bad_header_names_the_shard() {
    let e = index_err(|d| {
        write(d, "a.safetensors", &file_bytes(r#"{"a"}"#, &[]));
        index(d, r#"{"x":"a.safetensors"}"#)
    });
    assert!(
        matches!(&e, Error::HeaderJson { path, .. } if path.ends_with("a.safetensors")),
        "{e}"
    );
}

// ----- writer ---------------------------------------------------------------

#[test]
fn writer_errors() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.safetensors");
    let spec = |n: &str| TensorSpec::new(n, DType::U8, vec![2]);
    let e = SafeTensorsWriter::create(&out, [spec("__metadata__")], None).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Writer {
                reason: "reserved name",
                ..
            }
        ),
        "{e}"
    );
    let e = SafeTensorsWriter::create(&out, [spec("a"), spec("a")], None).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Writer {
                reason: "declared twice",
                ..
            }
        ),
        "{e}"
    );
    let e = SafeTensorsWriter::create(&out, [TensorSpec::new("f4", DType::F4, vec![3])], None)
        .unwrap_err();
    assert!(matches!(&e, Error::InvalidTensorSize { .. }), "{e}");
    let e = SafeTensorsWriter::create(
        &out,
        [TensorSpec::new("o", DType::U8, vec![u64::MAX, 2])],
        None,
    )
    .unwrap_err();
    assert!(matches!(&e, Error::InvalidTensorSize { .. }), "{e}");
    // Each size fits in u64, their sum does not.
    let huge = (0..9).map(|i| TensorSpec::new(format!("h{i}"), DType::U8, vec![(1u64 << 61) - 1]));
    let e = SafeTensorsWriter::create(&out, huge, None).unwrap_err();
    assert!(
        matches!(&e, Error::InvalidTensorSize { reason, .. } if reason.contains("data section")),
        "{e}"
    );
    let e = SafeTensorsWriter::create(
        dir.path().join("no/such/dir/o.safetensors"),
        [spec("a")],
        None,
    )
    .unwrap_err();
    assert!(matches!(&e, Error::Io { .. }), "{e}");

    let mut w = SafeTensorsWriter::create(&out, [spec("a"), spec("b")], None).unwrap();
    let e = w.write_tensor("b", &[1, 2]).unwrap_err();
    assert!(
        matches!(&e, Error::Writer { reason, .. } if reason.contains("order")),
        "{e}"
    );
    let e = w.write_tensor("zz", &[1, 2]).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Writer {
                reason: "not declared",
                ..
            }
        ),
        "{e}"
    );
    let e = w.write_tensor("a", &[1]).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::WriterSize {
                expected: 2,
                actual: 1,
                ..
            }
        ),
        "{e}"
    );
    w.write_tensor("a", &[1, 2]).unwrap();
    let e = w.write_tensor("a", &[1, 2]).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Writer {
                reason: "already written",
                ..
            }
        ),
        "{e}"
    );
    let e = w.finish().unwrap_err();
    assert!(
        matches!(&e, Error::Writer { tensor, .. } if tensor == "b"),
        "{e}"
    );
    // Neither the final file nor the temporary file remains.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let mut w = SafeTensorsWriter::create(&out, [spec("a")], None).unwrap();
    w.write_tensor("a", &[1, 2]).unwrap();
    let e = w.write_tensor("a", &[1, 2]).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Writer {
                reason: "already written",
                ..
            }
        ),
        "{e}"
    );
    let e = w.write_tensor("q", &[1, 2]).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::Writer {
                reason: "not declared",
                ..
            }
        ),
        "{e}"
    );
    drop(w);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "drop removes the temporary file"
    );
}

#[test]
fn writer_header_too_large() {
    let dir = tempfile::tempdir().unwrap();
    let name = "n".repeat(100_000_000);
    let e = SafeTensorsWriter::create(
        dir.path().join("o.safetensors"),
        [TensorSpec::new(name, DType::U8, vec![0])],
        None,
    )
    .unwrap_err();
    assert!(matches!(&e, Error::HeaderTooLarge { .. }), "{e}");
}

#[test]
fn writer_round_trip_with_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.safetensors");
    let mut meta = BTreeMap::new();
    meta.insert("format".to_owned(), "pt".to_owned());
    meta.insert("q\"uote".to_owned(), "é\n".to_owned());
    let specs = vec![
        TensorSpec::new("w\"eird", DType::BF16, vec![2, 2]),
        TensorSpec::new("e", DType::F32, vec![0, 3]),
        TensorSpec::new("s", DType::I64, vec![]),
    ];
    let mut w = SafeTensorsWriter::create(&out, specs.clone(), Some(&meta)).unwrap();
    assert_eq!(w.next_tensor().unwrap().name, "w\"eird");
    w.write_tensor("w\"eird", &[1, 2, 3, 4, 5, 6, 7, 8])
        .unwrap();
    w.write_tensor("e", &[]).unwrap();
    w.write_tensor("s", &7i64.to_le_bytes()).unwrap();
    assert!(w.next_tensor().is_none());
    assert_eq!(w.finish().unwrap(), out);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "only the final file"
    );

    let f = SafeTensors::open(&out).unwrap();
    assert_eq!(f.metadata(), Some(&meta));
    let got: Vec<TensorSpec> = f.tensors().iter().map(TensorSpec::from).collect();
    assert_eq!(got, specs);
    assert_eq!(f.data_start() % 8, 0);
    assert_eq!(f.read_bytes("s").unwrap(), 7i64.to_le_bytes());
    // The safetensors crate reads it too.
    let bytes = std::fs::read(&out).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(
        st.tensor("w\"eird").unwrap().data(),
        &[1, 2, 3, 4, 5, 6, 7, 8]
    );
    let (_, m) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(m.metadata().as_ref().unwrap()["q\"uote"], "é\n");
}

#[test]
fn writer_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("c.safetensors");
    let specs = [
        TensorSpec::new("a", DType::BF16, vec![3, 2]),
        TensorSpec::new("e", DType::U8, vec![0]),
        TensorSpec::new("b", DType::U8, vec![2]),
    ];
    let mut w = SafeTensorsWriter::create(&out, specs, None).unwrap();
    w.write_chunk("a", &[1, 2, 3, 4]).unwrap();
    // Past the end: refused, nothing written.
    let e = w.write_chunk("a", &[0; 9]).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::WriterSize {
                expected: 8,
                actual: 9,
                ..
            }
        ),
        "{e}"
    );
    // write_tensor after chunks must complete the tensor exactly.
    let e = w.write_tensor("a", &[0; 2]).unwrap_err();
    assert!(
        matches!(
            &e,
            Error::WriterSize {
                expected: 8,
                actual: 2,
                ..
            }
        ),
        "{e}"
    );
    let e = w.write_chunk("b", &[1]).unwrap_err();
    assert!(
        matches!(&e, Error::Writer { reason, .. } if reason.contains("order")),
        "{e}"
    );
    w.write_chunk("a", &[5, 6, 7, 8]).unwrap();
    w.write_chunk("a", &[9, 10, 11, 12]).unwrap();
    assert_eq!(w.next_tensor().unwrap().name, "e");
    w.write_chunk("e", &[]).unwrap();
    w.write_tensor("b", &[13, 14]).unwrap();
    w.finish().unwrap();
    let f = SafeTensors::open(&out).unwrap();
    assert_eq!(f.read_bytes("a").unwrap(), (1..=12).collect::<Vec<u8>>());
    assert_eq!(f.read_bytes("b").unwrap(), vec![13, 14]);
}

#[test]
fn io_errors_opening_odd_paths() {
    // Not a regular file.
    let dir = tempfile::tempdir().unwrap();
    let e = SafeTensors::open(dir.path()).unwrap_err();
    assert!(e.to_string().contains("regular file"), "{e}");
    assert!(
        matches!(e, Error::NotRegularFile { kind: "folder", .. }),
        "{e}"
    );
    // A writer needs a file name.
    let e = SafeTensorsWriter::create("/", [TensorSpec::new("a", DType::U8, vec![1])], None)
        .unwrap_err();
    assert!(matches!(e, Error::Io { op: "create", .. }), "{e}");
}
