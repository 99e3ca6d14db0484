//! conv3d: the problem, the chain and its tiers, the device kernels and checks, backward and transposed passes, fault injection.
//!
//! One test binary for the area (each binary links the crate again); one
//! module per file.

#[macro_use]
#[path = "../common/mod.rs"]
mod common;

mod backward;
mod chain;
mod device_checks;
mod device_kernels;
mod faults;
mod guard;
mod limits;
mod tiers;
mod tiled_backward;
mod tiled_wgrad;
mod transpose;
mod vendor_backward;
