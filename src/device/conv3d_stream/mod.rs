//! The conv3d operations of a [`Stream`]: [`Conv3dOps`], each checking its
//! operands and then launching the kernel operation the backend runs (the
//! launch descriptors are data, in `device::raw::conv3d`).

use std::ops::Deref;

use super::stream::Stream;

mod checks;
mod flip_insert;
pub(crate) mod forward;
mod gradients;
mod guard_ops;
mod wgrad_tiled;

pub use checks::{CheckBias, CheckOperands};
pub use guard_ops::GuardWords;

/// The conv3d operations of a [`Stream`] ([`Stream::conv3d_ops`]): the
/// forward convolution by kernel ([`forward`](Self::forward)) or by the
/// vendor library ([`vendor`](Self::vendor)), its gradients, the transposed
/// convolution, the weight layouts made on the device, and the checks and
/// guards of the conv3d chain. Each runs in order on the stream; it derefs
/// to the [`Stream`].
#[derive(Debug, Clone, Copy)]
pub struct Conv3dOps<'s> {
    stream: &'s Stream,
}

impl Deref for Conv3dOps<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        self.stream
    }
}

impl Stream {
    /// The conv3d operations on this stream.
    pub fn conv3d_ops(&self) -> Conv3dOps<'_> {
        Conv3dOps { stream: self }
    }
}
