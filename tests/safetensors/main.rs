//! The safetensors reader and writer: reads, errors at each step, hostile and property-tested headers, shards, file conversion.
//!
//! One test binary for the area (each binary links the crate again); one
//! module per file.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod convert_file;
mod errors;
mod hostile;
mod proptest;
mod read;
mod sharded_errors;
mod shards_many;
mod tensor_errors;
mod writer_errors;
