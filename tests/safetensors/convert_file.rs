//! `safetensors::convert_file`: a checkpoint (file or index) into one file,
//! float tensors converted, the rest as stored, with progress, refusals and
//! cancellation.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use half::bf16;
use rocm_safe::safetensors::{
    convert_file, Checkpoint, ConvertOptions, SafeTensors, SafeTensorsWriter, TensorSpec,
};
use rocm_safe::{DType, Error};

fn write(path: &Path, tensors: &[(&str, DType, Vec<u64>, Vec<u8>)]) {
    let mut meta = std::collections::BTreeMap::new();
    meta.insert("format".to_owned(), "pt".to_owned());
    let specs = tensors
        .iter()
        .map(|(n, d, s, _)| TensorSpec::new(*n, *d, s.clone()));
    let mut w = SafeTensorsWriter::create(path, specs, Some(&meta)).unwrap();
    for (n, _, _, b) in tensors {
        w.write_tensor(n, b).unwrap();
    }
    w.finish().unwrap();
}

fn bf16_bytes(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| bf16::from_f32(i as f32 * 0.5 - 3.0).to_le_bytes())
        .collect()
}

#[test]
fn a_sharded_checkpoint_becomes_one_converted_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Large enough for several chunks (1 MiB each).
    let big = 3 << 19;
    write(
        &d.join("a.safetensors"),
        &[("w", DType::BF16, vec![big as u64], bf16_bytes(big))],
    );
    write(
        &d.join("b.safetensors"),
        &[
            (
                "i",
                DType::I32,
                vec![3],
                vec![1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0],
            ),
            ("e", DType::F16, vec![0, 4], Vec::new()),
        ],
    );
    let index = d.join("m.safetensors.index.json");
    std::fs::write(
        &index,
        r#"{"metadata": {}, "weight_map": {"w": "a.safetensors", "i": "b.safetensors", "e": "b.safetensors"}}"#,
    )
    .unwrap();
    let out = d.join("out.safetensors");
    let mut calls = Vec::new();
    let done = convert_file(
        &index,
        &out,
        &ConvertOptions::to_dtype(DType::F32),
        &mut |p| calls.push((p.tensors_done, p.bytes_done, p.bytes_total)),
    )
    .unwrap();
    assert_eq!(done.tensors, 3);
    assert_eq!(done.bytes_written, (big * 4 + 12) as u64);
    assert_eq!(done.path, out);
    // Progress grows to the total, chunk by chunk.
    assert!(calls.len() >= 3, "{calls:?}");
    assert!(calls.windows(2).all(|w| w[0].1 <= w[1].1));
    assert_eq!(
        calls.last().map(|c| (c.1, c.2)),
        Some(((big * 2 + 12) as u64, (big * 2 + 12) as u64))
    );
    // Every tensor equals the reader's own conversion; integers as stored.
    let ck = Checkpoint::open(&index).unwrap();
    let f = SafeTensors::open(&out).unwrap();
    assert_eq!(f.info("w").unwrap().dtype, DType::F32);
    assert_eq!(
        f.read_bytes("w").unwrap(),
        ck.read_converted_bytes("w", DType::F32).unwrap()
    );
    assert_eq!(f.info("i").unwrap().dtype, DType::I32);
    assert_eq!(f.read_bytes("i").unwrap(), ck.read_bytes("i").unwrap());
    assert_eq!(f.info("e").unwrap().shape, vec![0, 4]);
    // No dtype: a copy as stored.
    let copy = d.join("copy.safetensors");
    convert_file(&index, &copy, &ConvertOptions::default(), &mut |_| {}).unwrap();
    let c = SafeTensors::open(&copy).unwrap();
    assert_eq!(c.info("w").unwrap().dtype, DType::BF16);
    assert_eq!(c.read_bytes("w").unwrap(), bf16_bytes(big));
}

#[test]
fn unconvertible_floats_are_refused_or_kept_inputs_never_overwritten_and_cancel_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let input = d.join("fp8.safetensors");
    // F8_E4M3FNUZ: an fp8 flavour the conversion table does not convert.
    write(&input, &[("q", DType::F8_E4M3FNUZ, vec![4], vec![0x38; 4])]);
    let out = d.join("out.safetensors");
    let r = convert_file(
        &input,
        &out,
        &ConvertOptions::to_dtype(DType::F32),
        &mut |_| {},
    );
    assert!(
        matches!(r, Err(Error::UnsupportedConversion { tensor: Some(ref t), .. }) if t.tensor == "q"),
        "{r:?}"
    );
    assert!(!out.exists());
    let opts = ConvertOptions::to_dtype(DType::F32).keep_unsupported(true);
    convert_file(&input, &out, &opts, &mut |_| {}).unwrap();
    assert_eq!(
        SafeTensors::open(&out).unwrap().read_bytes("q").unwrap(),
        vec![0x38; 4]
    );
    // The output is the input: refused, the input unchanged.
    let before = std::fs::read(&input).unwrap();
    let r = convert_file(&input, &input, &opts, &mut |_| {});
    assert!(matches!(r, Err(Error::OutputIsInput { .. })), "{r:?}");
    assert_eq!(std::fs::read(&input).unwrap(), before);
    // Cancelled: no output, no temporary file.
    let flag = Arc::new(AtomicBool::new(true));
    let third = d.join("third.safetensors");
    let r = convert_file(&input, &third, &opts.clone().with_cancel(flag), &mut |_| {});
    assert!(matches!(r, Err(Error::Cancelled { .. })), "{r:?}");
    assert!(!third.exists());
    let names: Vec<String> = std::fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.contains(".tmp-")), "{names:?}");
}

#[test]
fn a_file_with_null_metadata_converts_with_no_metadata() {
    // `"__metadata__": null` (which the safetensors package accepts) is read
    // as no metadata, and the converted file has none.
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let header = r#"{"__metadata__":null,"w":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&bf16_bytes(4));
    let input = d.join("null.safetensors");
    std::fs::write(&input, &bytes).unwrap();
    let out = d.join("out.safetensors");
    let done = convert_file(
        &input,
        &out,
        &ConvertOptions::to_dtype(DType::F32),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(done.tensors, 1);
    let f = SafeTensors::open(&out).unwrap();
    assert!(f.metadata().is_none());
    assert_eq!(
        f.read_bytes("w").unwrap(),
        Checkpoint::open(&input)
            .unwrap()
            .read_converted_bytes("w", DType::F32)
            .unwrap()
    );
}
