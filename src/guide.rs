//! The long-form documentation (the files of `docs/`), here so that it is
//! part of the crate's docs and its Rust examples are compiled and run as
//! doctests. Each module holds text only.

#[doc = include_str!("../docs/guide.md")]
pub mod using {}

#[doc = include_str!("../docs/amd.md")]
pub mod amd {}

#[doc = include_str!("../docs/doctor.md")]
pub mod doctor {}

#[doc = include_str!("../docs/refused.md")]
pub mod refused {}

#[doc = include_str!("../docs/verified.md")]
pub mod verified {}

#[doc = include_str!("../docs/python.md")]
pub mod python {}
