//! Devices: kernels and conversions on each backend, injected faults, interop and DLPack, the kernel cache, large buffers, the kernel sources.
//!
//! One test binary for the area (each binary links the crate again); one
//! module per file.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod convert;
mod dlpack;
mod dlpack_import;
mod faults;
mod gpu_large;
mod interop;
mod kernel_cache;
mod kernel_sources;
