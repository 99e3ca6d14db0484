//! Conv3d on a device, as data: the launch descriptors the backends take
//! ([`Conv3dLaunch`] and the backward, check, layout, flip and guard
//! launches), which GPU kernel runs ([`Conv3dKernel`]), the weight layout
//! the kernels read, the word layouts of the checks' results and the pure
//! helpers over them. Nothing here touches memory: these files name only
//! plain data (`crate::conv3d`'s geometry, `dtype`, `error`, the handles
//! of `device::info`). The host backend's emulation of the kernels is in
//! `runtime/host/`, their launch encoding in `runtime/gpu/`; the safe
//! entry points that launch them are [`Conv3dOps`](crate::device::Conv3dOps).
//!
//! Every backend computes the same thing: input `[N, C, D, H, W]` and weight
//! `[K, C/G, KD, KH, KW]` in f32 or bf16 (widened exactly), an optional f32
//! bias `[K]`, an f32 output `[N, K, OD, OH, OW]`, f32 accumulation.

pub(crate) mod backward_launch;
pub(crate) mod check_launch;
pub(crate) mod flip_launch;
pub(crate) mod forward_launch;
pub(crate) mod guard_launch;
pub(crate) mod weight_layout;
pub(crate) mod wgrad_split;

pub(crate) use backward_launch::{bias_refused, operand_name};
pub use backward_launch::{Conv3dBackwardCheckLaunch, Conv3dBackwardLaunch};
pub use check_launch::{CheckedPoint, Conv3dCheckLaunch, CHECK_MAX_SAMPLES, CHECK_WORDS};
pub use flip_launch::{Conv3dFlipLaunch, Conv3dZeroInsertLaunch};
pub(crate) use forward_launch::{mma_tiles_m, TILE_M};
pub use forward_launch::{Conv3dKernel, Conv3dLaunch};
pub use guard_launch::{
    Conv3dGuardCheck, Conv3dGuardDecide, GuardStage, GuardVerdict, GUARD_ACC_WORDS,
    GUARD_RECORD_WORDS, GUARD_REPAIR_WORDS, VERDICT_MISMATCH, VERDICT_NON_FINITE, VERDICT_WORDS,
};
pub(crate) use weight_layout::{check_len, standard_weight_layout};
pub use weight_layout::{tiled_weight_layout, Conv3dLayoutLaunch, Conv3dWeightLayout};
pub(crate) use wgrad_split::WGRAD_BLOCK;
pub use wgrad_split::{tiled_wgrad_split, tiled_wgrad_unsupported, TiledWgradSplit};
