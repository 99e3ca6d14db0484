//! The conv3d operations of a [`Stream`](super::Stream): each checks its
//! operands, then launches the [`KernelOp`](super::KernelOp) the backend runs
//! (the launch descriptors are data, in `device::conv3d`).

mod checks;
mod flip_insert;
pub(crate) mod forward;
mod gradients;
mod guard_ops;
mod wgrad_tiled;

pub use checks::{CheckBias, CheckOperands};
pub use guard_ops::GuardWords;
