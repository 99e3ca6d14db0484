//! Sharded safetensors checkpoints (an index and its shards, built by
//! hand here): what opens, and one case per error of the index, the
//! shards' names and files, and the tensors they list.

use crate::common;

use std::path::{Path, PathBuf};

use common::st_files::{file_bytes, sample, write};
use rocm_safe::safetensors::Checkpoint;
use rocm_safe::Error;

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
