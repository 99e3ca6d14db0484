//! The examples' command lines (doctor, convert, conv3d, interop) and hostile input to them, run as processes.
//!
//! One test binary for the area (each binary links the crate again); one
//! module per file.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;
#[path = "../example_bin/mod.rs"]
mod example_bin;

mod conv3d;
mod convert;
mod doctor;
mod hostile;
mod interop;
