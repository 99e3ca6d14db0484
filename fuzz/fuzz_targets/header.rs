//! Fuzz target: the safetensors header parser on arbitrary file bytes.
//! It must return Ok or a typed error, never panic, and whatever it accepts
//! must be a consistent file.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = rocm_safe::safetensors::parse_bytes(Path::new("fuzz"), data) {
        let mut cursor = 0u64;
        for t in h.tensors() {
            assert_eq!(t.data_offsets.0, cursor);
            assert_eq!(Some(t.num_bytes()), t.dtype.bytes_for(t.num_elements()));
            cursor = t.data_offsets.1;
        }
        assert_eq!(cursor, h.data_len());
        assert_eq!(h.data_start() + h.data_len(), data.len() as u64);
    }
});
