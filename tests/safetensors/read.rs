//! Reading values: raw bytes, typed conversion (across chunk boundaries and
//! at unaligned offsets), rows, and agreement with the safetensors crate.

use crate::common;

use common::Rng;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use half::{bf16, f16};
use rocm_safe::safetensors::{
    parse_bytes, Checkpoint, SafeTensors, SafeTensorsWriter, TensorSpec, CHUNK_BYTES,
};
use rocm_safe::DType;

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    Rng::new(seed).bytes(n)
}

fn write_file(path: &Path, tensors: &[(&str, DType, Vec<u64>, Vec<u8>)]) {
    let specs = tensors
        .iter()
        .map(|(n, d, s, _)| TensorSpec::new(*n, *d, s.clone()));
    let mut w = SafeTensorsWriter::create(path, specs, None).unwrap();
    for (n, _, _, b) in tensors {
        w.write_tensor(n, b).unwrap();
    }
    w.finish().unwrap();
}

#[test]
fn conversions_cross_chunks_at_unaligned_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.safetensors");
    // 1 leading byte makes every following tensor start at an odd offset.
    let big = CHUNK_BYTES / 2 + 12_345; // bf16 elements: more than one chunk
    let tensors = vec![
        ("pad", DType::U8, vec![1], vec![0xAB]),
        ("bf", DType::BF16, vec![big as u64], pattern(big * 2, 1)),
        ("h", DType::F16, vec![3, 1001], pattern(3 * 1001 * 2, 2)),
        ("f", DType::F32, vec![777], pattern(777 * 4, 3)),
        ("d", DType::F64, vec![5, 3], pattern(15 * 8, 4)),
    ];
    write_file(&p, &tensors);
    let f = SafeTensors::open(&p).unwrap();
    assert_eq!(
        f.data_start() + f.info("bf").unwrap().data_offsets.0,
        f.data_start() + 1
    );
    assert_eq!(f.data_start() % 8, 0);

    // bf16 -> f32 is the bit pattern shifted left by 16, NaNs included.
    let got: Vec<f32> = f.read("bf").unwrap();
    let raw = &tensors[1].3;
    assert_eq!(got.len(), big);
    for (i, v) in got.iter().enumerate() {
        let b = u16::from_le_bytes([raw[2 * i], raw[2 * i + 1]]);
        assert_eq!(v.to_bits(), (b as u32) << 16, "element {i}");
    }
    // Every float source into every target equals the reference conversion.
    for (name, dtype, _, bytes) in &tensors[1..] {
        for to in [DType::F32, DType::F16, DType::BF16] {
            let mut want = vec![0u8; bytes.len() / dtype.size().unwrap() * to.size().unwrap()];
            rocm_safe::convert::convert_bytes(*dtype, bytes, to, &mut want).unwrap();
            assert_eq!(
                f.read_converted_bytes(name, to).unwrap(),
                want,
                "{name} -> {to}"
            );
            let mut into = vec![0u8; want.len()];
            f.read_converted_bytes_into(name, to, &mut into).unwrap();
            assert_eq!(into, want);
        }
        let typed_f16: Vec<f16> = f.read(name).unwrap();
        let typed_bf16: Vec<bf16> = f.read(name).unwrap();
        assert_eq!(typed_f16.len(), typed_bf16.len());
        // Same dtype: a plain copy.
        assert_eq!(f.read_converted_bytes(name, *dtype).unwrap(), *bytes);
        assert_eq!(f.read_bytes(name).unwrap(), *bytes);
    }
    let d: Vec<f64> = f.read("d").unwrap();
    assert_eq!(bytemuck::cast_slice::<f64, u8>(&d), &tensors[4].3[..]);
}

#[test]
fn rows_read_only_their_part() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.safetensors");
    let (rows, cols) = (10u64, 7u64);
    let raw = pattern((rows * cols * 2) as usize, 9);
    write_file(
        &p,
        &[
            ("odd", DType::U8, vec![3], vec![1, 2, 3]),
            ("w", DType::BF16, vec![rows, cols], raw.clone()),
        ],
    );
    let f = SafeTensors::open(&p).unwrap();
    let all: Vec<f32> = f.read("w").unwrap();
    let rb = (cols * 2) as usize;
    for (a, b) in [(0, 10), (3, 7), (9, 10), (4, 4), (0, 1)] {
        let part: Vec<f32> = f.read_rows("w", a..b).unwrap();
        assert_eq!(part, all[(a * cols) as usize..(b * cols) as usize]);
        assert_eq!(
            f.read_rows_bytes("w", a..b).unwrap(),
            raw[a as usize * rb..b as usize * rb]
        );
        let mut into = vec![bf16::ZERO; ((b - a) * cols) as usize];
        f.read_rows_into("w", a..b, &mut into).unwrap();
        assert_eq!(
            bytemuck::cast_slice::<bf16, u8>(&into),
            &raw[a as usize * rb..b as usize * rb]
        );
        let mut bytes = vec![0u8; (b - a) as usize * rb];
        f.read_rows_bytes_into("w", a..b, &mut bytes).unwrap();
        assert_eq!(bytes, raw[a as usize * rb..b as usize * rb]);
    }
    // Tensor-parallel split: 4 ranks' parts concatenate to the whole.
    let ckpt = Checkpoint::open(&p).unwrap();
    let mut joined = Vec::new();
    for r in 0..4u64 {
        let (a, b) = (rows * r / 4, rows * (r + 1) / 4);
        joined.extend(ckpt.read_rows::<f32>("w", a..b).unwrap());
    }
    assert_eq!(joined, all);
    // Rank threads share one reader.
    let parts: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4u64)
            .map(|r| {
                let f = &f;
                s.spawn(move || {
                    f.read_rows::<f32>("w", rows * r / 4..rows * (r + 1) / 4)
                        .unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(parts.concat(), all);
}

#[test]
fn agrees_with_safetensors_crate() {
    use safetensors::tensor::TensorView;
    let names = [
        "a.weight", "b", "c", "scalar", "empty", "ints", "fp8", "flag",
    ];
    let specs: Vec<(&str, DType, Vec<usize>)> = vec![
        (names[0], DType::BF16, vec![4, 3]),
        (names[1], DType::F32, vec![5]),
        (names[2], DType::F16, vec![2, 2, 2]),
        (names[3], DType::F64, vec![]),
        (names[4], DType::F32, vec![0, 4]),
        (names[5], DType::I64, vec![3]),
        (names[6], DType::F8_E4M3, vec![6]),
        (names[7], DType::BOOL, vec![2]),
    ];
    let datas: Vec<Vec<u8>> = specs
        .iter()
        .enumerate()
        .map(|(i, (_, d, s))| pattern(d.size().unwrap() * s.iter().product::<usize>(), i as u64))
        .collect();
    let views: Vec<(&str, TensorView)> = specs
        .iter()
        .zip(&datas)
        .map(|((n, d, s), b)| {
            (
                *n,
                TensorView::new(common::st::to_st(*d), s.clone(), b).unwrap(),
            )
        })
        .collect();
    let meta: HashMap<String, String> = [("format".to_owned(), "pt".to_owned())].into();
    let bytes = safetensors::serialize(views, Some(meta.clone())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("st.safetensors");
    std::fs::write(&p, &bytes).unwrap();

    let f = SafeTensors::open(&p).unwrap();
    assert_eq!(f.tensors().len(), specs.len());
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    for ((n, d, s), data) in specs.iter().zip(&datas) {
        let info = f.info(n).unwrap();
        assert_eq!(info.dtype, *d);
        assert_eq!(info.shape, s.iter().map(|&x| x as u64).collect::<Vec<_>>());
        assert_eq!(f.read_bytes(n).unwrap(), *data);
        assert_eq!(st.tensor(n).unwrap().data(), &data[..]);
    }
    assert_eq!(f.metadata().unwrap()["format"], "pt");

    // Our writer, given the crate's order (dtype descending, then name),
    // produces byte-identical output.
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by(|&a, &b| {
        common::st::to_st(specs[b].1)
            .cmp(&common::st::to_st(specs[a].1))
            .then(specs[a].0.cmp(specs[b].0))
    });
    let ours = dir.path().join("ours.safetensors");
    let m: BTreeMap<String, String> = meta.into_iter().collect();
    let mut w = SafeTensorsWriter::create(
        &ours,
        order.iter().map(|&i| {
            TensorSpec::new(
                specs[i].0,
                specs[i].1,
                specs[i].2.iter().map(|&x| x as u64).collect::<Vec<_>>(),
            )
        }),
        Some(&m),
    )
    .unwrap();
    for &i in &order {
        w.write_tensor(specs[i].0, &datas[i]).unwrap();
    }
    w.finish().unwrap();
    assert_eq!(std::fs::read(&ours).unwrap(), bytes);
}

#[test]
fn checkpoint_delegates_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let raw = pattern(4 * 3 * 2, 5);
    write_file(
        &dir.path().join("shard 1.safetensors"),
        &[("w", DType::BF16, vec![4, 3], raw.clone())],
    );
    write_file(
        &dir.path().join("shard-\u{e9}.safetensors"),
        &[("i", DType::I32, vec![2], pattern(8, 6))],
    );
    let idx = dir.path().join("m.safetensors.index.json");
    std::fs::write(
        &idx,
        r#"{"weight_map":{"w":"shard 1.safetensors","i":"shard-\u00e9.safetensors"}}"#,
    )
    .unwrap();
    let c = Checkpoint::open(&idx).unwrap();
    assert_eq!(c.path(), idx);
    assert!(!c.is_empty());
    let direct = SafeTensors::open(dir.path().join("shard 1.safetensors")).unwrap();
    let want: Vec<f32> = direct.read("w").unwrap();

    assert_eq!(c.read::<f32>("w").unwrap(), want);
    let mut v = vec![0f32; 12];
    c.read_into("w", &mut v).unwrap();
    assert_eq!(v, want);
    assert_eq!(c.read_bytes("w").unwrap(), raw);
    let mut b = vec![0u8; raw.len()];
    c.read_bytes_into("w", &mut b).unwrap();
    assert_eq!(b, raw);
    let as_f32 = c.read_converted_bytes("w", DType::F32).unwrap();
    assert_eq!(as_f32, bytemuck::cast_slice::<f32, u8>(&want));
    let mut b = vec![0u8; 48];
    c.read_converted_bytes_into("w", DType::F32, &mut b)
        .unwrap();
    assert_eq!(b, as_f32);
    assert_eq!(c.read_rows::<f32>("w", 1..3).unwrap(), want[3..9]);
    let mut r = vec![0f32; 3];
    c.read_rows_into("w", 3..4, &mut r).unwrap();
    assert_eq!(r, want[9..12]);
    assert_eq!(c.read_rows_bytes("w", 0..1).unwrap(), raw[..6]);
    let mut rb = vec![0u8; 6];
    c.read_rows_bytes_into("w", 2..3, &mut rb).unwrap();
    assert_eq!(rb, raw[12..18]);
    assert_eq!(c.info("i").unwrap().dtype, DType::I32);
    assert!(c.read::<f32>("i").is_err());
}

#[test]
fn null_metadata_is_no_metadata() {
    // The safetensors package reads `"__metadata__": null` as no metadata;
    // so do we, from a file and from bytes, alone or with tensors.
    let dir = tempfile::tempdir().unwrap();
    for (header, data) in [
        (r#"{"__metadata__":null}"#, &[][..]),
        (
            r#"{"__metadata__":null,"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
            &[7, 9][..],
        ),
        (
            r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"__metadata__":null}"#,
            &[7, 9][..],
        ),
    ] {
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(data);
        let p = dir.path().join("null.safetensors");
        std::fs::write(&p, &bytes).unwrap();
        let f = SafeTensors::open(&p).unwrap();
        assert!(f.metadata().is_none(), "{header}");
        assert_eq!(f.tensors().len(), data.len() / 2, "{header}");
        assert!(
            parse_bytes(&p, &bytes).unwrap().metadata().is_none(),
            "{header}"
        );
        let c = Checkpoint::open(&p).unwrap();
        assert!(c.metadata().is_none(), "{header}");
        if !data.is_empty() {
            assert_eq!(c.read_bytes("a").unwrap(), data);
        }
    }
}

/// Every dtype has the `safetensors` crate's name and size, and the same
/// order (the Python writer sorts by `DType`'s order as that crate does).
#[test]
fn dtypes_match_the_safetensors_crate() {
    for d in DType::ALL {
        let s = common::st::to_st(d);
        assert_eq!(s.to_string(), d.name());
        assert_eq!(s.bitsize() as u64, d.bits());
    }
    for a in DType::ALL {
        for b in DType::ALL {
            assert_eq!(
                a.cmp(&b),
                common::st::to_st(a).cmp(&common::st::to_st(b)),
                "{a} vs {b}"
            );
        }
    }
}
