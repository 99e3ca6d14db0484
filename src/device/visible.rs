//! `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`: the runtimes apply them;
//! [`VisibleDevices`] (defined with the error's data, which names it) only
//! reports which physical device an ordinal maps to.

pub use crate::error::VisibleDevices;
