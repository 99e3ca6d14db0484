//! Conversions: the scalar reference's rounding, exhaustive 16-bit checks, the bulk loops, fp8, the fingerprint.
//!
//! One test binary for the area (each binary links the crate again); one
//! module per file.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod bulk;
mod exhaustive;
mod f8;
mod fingerprint;
mod rounding;
