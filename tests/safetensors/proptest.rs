//! Property tests of the header parser: valid random files written by the
//! safetensors crate round-trip through our reader; random mutations and
//! truncations never panic and, when they still validate, describe a
//! consistent file.

use crate::common;

use std::collections::HashMap;
use std::path::Path;

use proptest::prelude::*;
use rocm_safe::safetensors::{parse_bytes, SafeTensors, SafeTensorsWriter, TensorSpec};
use rocm_safe::DType;
use safetensors::tensor::TensorView;

#[derive(Debug, Clone)]
struct T {
    name: String,
    dtype: DType,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn tensor() -> impl Strategy<Value = T> {
    (
        "[a-z_.\\u{e9}\\u{4e2d}\"\\\\]{1,12}",
        prop::sample::select(DType::ALL.to_vec()),
        prop::collection::vec(0usize..5, 0..4),
    )
        .prop_flat_map(|(name, dtype, mut shape)| {
            // Sub-byte dtypes need a whole number of bytes: make the last
            // dimension a multiple of 4 (F4: 2 per byte; F6: 4 per 3 bytes).
            if dtype.size().is_none() {
                match shape.last_mut() {
                    Some(l) => *l *= 4,
                    None => shape.push(4),
                }
            }
            let n: usize = shape.iter().product();
            let bytes = dtype.bytes_for(n as u64).unwrap() as usize;
            (
                Just(name),
                Just(dtype),
                Just(shape),
                prop::collection::vec(any::<u8>(), bytes),
            )
        })
        .prop_map(|(name, dtype, shape, data)| T {
            name,
            dtype,
            shape,
            data,
        })
}

fn tensors() -> impl Strategy<Value = Vec<T>> {
    prop::collection::vec(tensor(), 0..8).prop_map(|mut v| {
        let mut seen = std::collections::HashSet::new();
        v.retain(|t| t.name != "__metadata__" && seen.insert(t.name.clone()));
        v
    })
}

fn metadata() -> impl Strategy<Value = Option<HashMap<String, String>>> {
    prop::option::of(prop::collection::hash_map(
        "[ -~]{0,6}",
        "[ -~\\u{e9}]{0,6}",
        0..4,
    ))
}

/// The safetensors crate (0.8) writes invalid JSON (`{},"__metadata__":{}}`)
/// for empty metadata and no tensors: its map length hint counts metadata
/// entries, and serde_json closes a map of hinted length 0 at once.
fn crate_writes_invalid_json(ts: &[T], meta: &Option<HashMap<String, String>>) -> bool {
    ts.is_empty() && meta.as_ref().is_some_and(HashMap::is_empty)
}

#[test]
fn crate_quirk_empty_metadata_no_tensors() {
    let bytes = serialize(&[], Some(HashMap::new()));
    assert_eq!(&bytes[8..], br#"{},"__metadata__":{}}   "#);
    assert!(matches!(
        parse_bytes(Path::new("q"), &bytes),
        Err(rocm_safe::Error::HeaderJson { .. })
    ));
}

fn serialize(ts: &[T], meta: Option<HashMap<String, String>>) -> Vec<u8> {
    let views = ts.iter().map(|t| {
        (
            t.name.clone(),
            TensorView::new(common::st::to_st(t.dtype), t.shape.clone(), &t.data).unwrap(),
        )
    });
    safetensors::serialize(views, meta).unwrap()
}

/// Invariants of any header we accept.
fn check_consistent(bytes: &[u8]) {
    let Ok(h) = parse_bytes(Path::new("p"), bytes) else {
        return;
    };
    let mut cursor = 0;
    for t in h.tensors() {
        assert_eq!(t.data_offsets.0, cursor);
        assert_eq!(Some(t.num_bytes()), t.dtype.bytes_for(t.num_elements()));
        cursor = t.data_offsets.1;
        assert!(std::ptr::eq(h.get(&t.name).unwrap(), t));
    }
    assert_eq!(cursor, h.data_len());
    assert_eq!(h.data_start() + h.data_len(), bytes.len() as u64);
    // What we accept, the safetensors crate accepts too (it is laxer).
    let st = safetensors::SafeTensors::deserialize(bytes).unwrap();
    assert_eq!(st.len(), h.tensors().len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn crate_written_files_round_trip(ts in tensors(), meta in metadata()) {
        prop_assume!(!crate_writes_invalid_json(&ts, &meta));
        let bytes = serialize(&ts, meta.clone());
        let h = parse_bytes(Path::new("p"), &bytes).unwrap();
        prop_assert_eq!(h.tensors().len(), ts.len());
        for t in &ts {
            let info = h.get(&t.name).unwrap();
            prop_assert_eq!(info.dtype, t.dtype);
            prop_assert_eq!(info.shape.iter().map(|&d| d as usize).collect::<Vec<_>>(), t.shape.clone());
            let (b, e) = info.data_offsets;
            let start = h.data_start() as usize;
            prop_assert_eq!(&bytes[start + b as usize..start + e as usize], &t.data[..]);
        }
        prop_assert_eq!(h.metadata().cloned(), meta.map(|m| m.into_iter().collect()));
        check_consistent(&bytes);
    }

    #[test]
    fn our_writer_round_trips_through_both_readers(ts in tensors(), meta in metadata()) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("w.safetensors");
        let specs = ts.iter().map(|t| TensorSpec::new(t.name.clone(), t.dtype, t.shape.iter().map(|&d| d as u64).collect::<Vec<_>>()));
        let m = meta.map(|m| m.into_iter().collect());
        let mut w = SafeTensorsWriter::create(&p, specs, m.as_ref()).unwrap();
        for t in &ts {
            w.write_tensor(&t.name, &t.data).unwrap();
        }
        w.finish().unwrap();
        let f = SafeTensors::open(&p).unwrap();
        for t in &ts {
            prop_assert_eq!(f.read_bytes(&t.name).unwrap(), t.data.clone());
        }
        prop_assert_eq!(f.metadata().cloned(), m);
        let bytes = std::fs::read(&p).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for t in &ts {
            prop_assert_eq!(st.tensor(&t.name).unwrap().data(), &t.data[..]);
        }
    }

    #[test]
    fn mutations_never_panic(
        ts in tensors(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
    ) {
        let mut bytes = serialize(&ts, None);
        for (i, b) in edits {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        check_consistent(&bytes);
    }

    #[test]
    fn header_text_mutations_never_panic(
        ts in tensors(),
        pos in any::<prop::sample::Index>(),
        insert in prop::sample::select(vec!["{", "}", "\"", ",", "[", "]", "0", "-1", "1e3", "\\u0061", " ", "\"x\":1", "null", "99999999999999999999"]),
        delete in 0usize..4,
    ) {
        let bytes = serialize(&ts, None);
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header = bytes[8..8 + n].to_vec();
        let at = pos.index(header.len() + 1);
        let end = (at + delete).min(header.len());
        header.splice(at..end, insert.bytes());
        let mut file = (header.len() as u64).to_le_bytes().to_vec();
        file.extend_from_slice(&header);
        file.extend_from_slice(&bytes[8 + n..]);
        check_consistent(&file);
    }

    #[test]
    fn truncations_and_extensions_are_rejected(ts in tensors(), cut in any::<prop::sample::Index>(), extra in 1usize..16) {
        let bytes = serialize(&ts, None);
        let len = cut.index(bytes.len());
        prop_assert!(parse_bytes(Path::new("p"), &bytes[..len]).is_err());
        let mut longer = bytes.clone();
        longer.extend(std::iter::repeat_n(0u8, extra));
        prop_assert!(parse_bytes(Path::new("p"), &longer).is_err());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        check_consistent(&bytes);
    }
}
