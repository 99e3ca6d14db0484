#![doc = include_str!("../README.md")]
//!
//! # Contracts
//!
//! What every module keeps, and what the rest of these docs refer to as
//! "contract 1" to "contract 6":
//!
//! 1. **Conversions are exact and integer-only.** bf16 -> f32 is the bit
//!    pattern shifted left by 16 (what PyTorch does; `half::bf16::to_f32`
//!    quiets signalling NaNs and is not the reference); f16 -> f32 is the
//!    exact IEEE widening; fp8 (e4m3fn, e5m2) -> f32/bf16/f16 are exact;
//!    f32/f64 -> bf16 and -> f16 round to nearest, ties
//!    to even, NaN stays NaN, subnormals are never flushed. Every backend
//!    (CPU, HIP, CUDA) computes them with integer bit operations, so no
//!    denormal mode or instruction selection can change a value
//!    ([`convert::scalar`] is the reference).
//! 2. **Verified means checked independently.** A device result is compared
//!    with what the host knows it must be: an exhaustive self-test over all
//!    65 536 bf16 (and f16) patterns, all 256 fp8 codes and the
//!    rounding-critical f32 patterns when a device's kernels are first used
//!    ([`verify::self_test`]), and per call a fingerprint (a
//!    position-keyed, order-independent 64-bit hash,
//!    [`convert::fingerprint`]) of the expected output, computed on the host
//!    from the source bytes, against the same fingerprint computed on the
//!    device from the actual output. A mismatch is an error or a recorded
//!    fallback, never a silent success.
//! 3. **Fallbacks are explicit and recorded.** Every chain (the transfer
//!    ladder [`transfer::Rung`], the conv3d tiers
//!    [`conv3d_chain::TierKind`], the kernels' ahead-of-time or run-time
//!    compilation) reports which step served, what failed before it and why,
//!    in one vocabulary ([`fallback`]). A caller can force a step (tests) or
//!    forbid falling back (fail fast).
//! 4. **Bad input never panics and loses nothing.** Malformed files, wrong
//!    shapes, missing devices, driver errors: a typed [`Error`] naming the
//!    file, tensor or operation. Output files are written under a temporary
//!    name and renamed when complete. A GPU runtime's failure becomes that
//!    value and nothing else: after every failed HIP call (an out-of-memory
//!    the crate retries, a `hipHostRegister` it does without, any other)
//!    the crate reads `hipGetLastError`, so HIP 7's sticky last error never
//!    reaches the caller's own next check (PyTorch's launch check included).
//! 5. **It builds everywhere.** Default features need no ROCm and no CUDA;
//!    everything then runs on the CPU (and the `host` device backend).
//!    `hip` compiles the kernels (clang >= 19 with lld, or ROCm's hipcc) and
//!    links nothing of ROCm: the HIP runtime (`libamdhip64.so.7`, `.so.6` or
//!    `.so.5`) is loaded at run time, the one already in the process first,
//!    so a process holds one; `cuda` runs the same kernel sources on NVIDIA
//!    GPUs.
//! 6. **Memory-efficient.** Reading a checkpoint never holds more than a
//!    bounded window of it in host memory (on an APU the page cache and the
//!    GPU share RAM); staging buffers are few, pinned and reused.
//!
//! # Layers
//!
//! Bottom to top; a module imports only from the layers below it (see
//! `ARCHITECTURE.md`): [`error`], [`dtype`] -> [`convert`], [`conv3d`] (the
//! problem), [`fallback`] -> [`safetensors`] -> [`device`] -> [`verify`] ->
//! [`transfer`], [`conv3d_chain`] -> `diagnostics` (the engine behind the
//! `doctor` example; compiled with the `doctor` feature only), [`dlpack`] (device memory and loaded tensors handed
//! to and taken from other frameworks).
#![deny(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub(crate) mod alloc;
pub mod conv3d;
pub mod conv3d_chain;
pub mod convert;
pub mod device;
#[cfg(feature = "doctor")]
#[cfg_attr(docsrs, doc(cfg(feature = "doctor")))]
pub mod diagnostics;
pub mod dlpack;
pub mod dtype;
pub mod error;
pub mod fallback;
pub mod guide;
pub mod moves;
pub(crate) mod par;
pub mod safetensors;
pub mod transfer;
pub mod verify;

pub use crate::dtype::DType;
pub use crate::error::{Error, Result};
/// The `half` crate, whose [`f16`](half::f16) and [`bf16`](half::bf16) types
/// appear in this crate's signatures.
pub use half;
