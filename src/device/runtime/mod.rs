//! The runtimes and what only they use: the host backend ([`host`], always),
//! the GPU runtimes (`hip`, feature `hip`; `cuda`, feature `cuda`), the one
//! generic GPU body both run under (`gpu`), the vendor libraries (MIOpen,
//! cuDNN, NVRTC: `vendor`).
//! They implement the raw interface ([`crate::device::raw`]); of the safe
//! types of [`crate::device`] only `Device::host` names one (the host
//! backend); the factory ([`crate::device::raw::open_backend`]) names all. The public paths stay
//! `device::host`, `device::hip` and `device::cuda` (re-exports).

#[cfg(feature = "cuda")]
#[cfg_attr(docsrs, doc(cfg(feature = "cuda")))]
pub mod cuda;
pub(crate) mod gpu;
#[cfg(feature = "hip")]
#[cfg_attr(docsrs, doc(cfg(feature = "hip")))]
pub mod hip;
pub mod host;
pub(crate) mod vendor;
