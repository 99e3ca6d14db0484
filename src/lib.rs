#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod conv3d;
pub mod conv3d_chain;
pub mod convert;
pub mod device;
pub mod diagnostics;
pub mod dtype;
pub mod error;
pub mod fallback;
pub mod safetensors;
pub mod transfer;
pub mod verify;

pub use crate::dtype::DType;
pub use crate::error::{Error, Result};
