//! The safetensors reader's errors reading the tensors of a file that
//! parsed: unknown names, conversions, buffer lengths, row ranges, a file
//! that shrank after it was opened. The file is built by hand
//! (`tests/common/st_files.rs`), never by a writer.

use crate::common;

use common::st_files::{file_bytes, sample, write};
use rocm_safe::safetensors::SafeTensors;
use rocm_safe::{DType, Error};

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
