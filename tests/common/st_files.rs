//! Hand-made safetensors files for the reader's error tests
//! (`tests/safetensors/errors.rs`, `tests/safetensors/tensor_errors.rs`,
//! `tests/safetensors/sharded_errors.rs`): the bytes are built here
//! (8-byte length + header + data), never by a writer.

use std::path::{Path, PathBuf};

/// 8-byte little-endian length + header (unpadded) + data.
pub fn file_bytes(header: &str, data: &[u8]) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.extend_from_slice(data);
    v
}

pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A small file with several dtypes and shapes.
pub fn sample(dir: &Path) -> PathBuf {
    let h = r#"{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,12]},"i":{"dtype":"I32","shape":[2],"data_offsets":[12,20]},"s":{"dtype":"F32","shape":[],"data_offsets":[20,24]},"f8":{"dtype":"F8_E4M3FNUZ","shape":[2],"data_offsets":[24,26]}}"#;
    let data: Vec<u8> = (0..26u8).collect();
    write(dir, "sample.safetensors", &file_bytes(h, &data))
}
