//! One hand-made file per error variant of the safetensors reader's
//! parsing of a file: the bytes are built here (8-byte length + header +
//! data), never by a writer. Reading tensors of a parsed file:
//! `tests/safetensors/tensor_errors.rs`; sharded checkpoints:
//! `tests/safetensors/sharded_errors.rs`; the writer:
//! `tests/safetensors/writer_errors.rs`.

use crate::common;

use std::path::Path;

use common::st_files::{file_bytes, write};
use rocm_safe::safetensors::{
    header_len, parse_bytes, parse_head, SafeTensors, SafeTensorsWriter, TensorSpec,
};
use rocm_safe::{DType, Error};

/// Opens a hand-made file and returns the error; also checks that the
/// in-memory parser agrees.
fn open_err(header: &str, data: &[u8]) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let bytes = file_bytes(header, data);
    let p = write(dir.path(), "t.safetensors", &bytes);
    let e = SafeTensors::open(&p).unwrap_err();
    let e2 = parse_bytes(&p, &bytes).unwrap_err();
    assert_eq!(e.to_string(), e2.to_string());
    assert_eq!(e.to_string(), stream_err(&p, &bytes).to_string());
    assert!(
        e.to_string().contains("t.safetensors"),
        "error names the file: {e}"
    );
    e
}

/// The error of the stream readers' two steps ([`header_len`] on the
/// first 40 bytes, then [`parse_head`] on the first `8 + N`), which must
/// be the file reader's.
fn stream_err(p: &Path, bytes: &[u8]) -> Error {
    let len = bytes.len() as u64;
    match header_len(p, &bytes[..bytes.len().min(40)], len) {
        Err(e) => e,
        Ok(n) => {
            let end = bytes.len().min(8 + n as usize);
            parse_head(p, &bytes[..end], len).unwrap_err()
        }
    }
}

#[test]
fn stream_head_parses_as_the_file_does() {
    let bytes = file_bytes(ONE, &[7, 9]);
    let p = Path::new("s.safetensors");
    let n = header_len(p, &bytes[..40], bytes.len() as u64).unwrap();
    assert_eq!(n as usize, ONE.len());
    // Bytes after the head (the data) are ignored.
    let h = parse_head(p, &bytes, bytes.len() as u64).unwrap();
    let whole = parse_bytes(p, &bytes).unwrap();
    assert_eq!(h.tensors(), whole.tensors());
    assert_eq!(h.data_start(), 8 + n);
    assert_eq!(h.data_len(), 2);
    // A stream that ended inside its header.
    let e = parse_head(p, &bytes[..20], bytes.len() as u64).unwrap_err();
    assert!(
        matches!(e, Error::HeaderOutOfBounds { file_len: 20, .. }),
        "{e}"
    );
    // A data section shorter than the header says: the layout check.
    let e = parse_head(p, &bytes, bytes.len() as u64 - 1).unwrap_err();
    assert!(matches!(e, Error::DataLayout { .. }), "{e}");
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
