//! Loads onto devices: the transfer ladder, loads, replication, interop, and the verified moves.
//!
//! One test binary for the area (each binary links the crate again); one
//! module per file.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod direct;
mod interop;
mod ladder;
mod loads;
mod moves;
mod replicate;
