//! The raw interface, for backend authors: the traits a backend implements
//! ([`Driver`], [`Backend`], [`Wrap`] for a backend over another), the
//! kernel operations and copies it is asked for ([`KernelOp`], [`CopyOp`]),
//! the launch descriptors of the conv3d kernels and the word layouts of
//! their results (pure data, in `raw/conv3d/`), and the raw handles. Users of devices need
//! none of it: [`Device`](super::Device), [`Stream`](super::Stream) and the
//! buffers are at the root of [`device`](super).

pub(crate) mod backend;
pub(crate) mod conv3d;
pub(crate) mod op_table;
pub(crate) mod wrap;

pub use conv3d::{
    tiled_weight_layout, tiled_wgrad_split, tiled_wgrad_unsupported, CheckedPoint,
    Conv3dBackwardCheckLaunch, Conv3dBackwardLaunch, Conv3dCheckLaunch, Conv3dFlipLaunch,
    Conv3dGuardCheck, Conv3dGuardDecide, Conv3dLaunch, Conv3dLayoutLaunch, Conv3dWeightLayout,
    Conv3dZeroInsertLaunch, GuardStage, GuardVerdict, TiledWgradSplit, CHECK_MAX_SAMPLES,
    CHECK_WORDS, GUARD_ACC_WORDS, GUARD_RECORD_WORDS, GUARD_REPAIR_WORDS, VERDICT_MISMATCH,
    VERDICT_NON_FINITE, VERDICT_WORDS,
};
// Not raw data: aliases over the safe buffer views that `Conv3dOps`'s
// checks take, so they live with them (`conv3d_stream/`); re-exported
// here, where they have always been public.
pub use super::conv3d_stream::{CheckBias, CheckOperands, GuardWords};
pub use super::info::{DevicePtr, RawEvent, RawStream};
pub use super::open::{open_backend, open_backend_with};
pub use backend::{Backend, CopyOp, Driver, KernelOp};
pub use wrap::Wrap;
