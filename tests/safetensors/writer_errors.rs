//! The safetensors writer: its errors (names, shapes, sizes, the order
//! and lengths of the data written), a header too large, and round trips
//! through the reader with metadata and in chunks.

use std::collections::BTreeMap;

use rocm_safe::safetensors::{SafeTensors, SafeTensorsWriter, TensorSpec};
use rocm_safe::{DType, Error};

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
