//! The conv3d problem: parameters, validated geometry, f64 reference, CPU kernel.
//!
//! The conv3d *problem*: parameters and validated geometry, the f64
//! reference, and the CPU kernel. The chain that tries vendor, GPU and CPU
//! tiers in turn is [`crate::conv3d_chain`].
//!
//! - [`Conv3dProblem::new`] validates shapes and parameters (NCDHW, stride,
//!   padding, dilation, groups, optional bias; f32 or bf16 inputs) into a
//!   [`Conv3dGeometry`], with typed errors.
//! - [`reference()`] and [`reference_point`] compute the definition in f64
//!   (what every tier is tested, and each result sampled, against).
//! - [`conv3d_cpu`] is the CPU kernel (rayon; AVX2/AVX-512 register tiles
//!   chosen at run time), every tier's last resort.
//! - [`Conv3dBackwardProblem`] (`backward_problem.rs`): the gradients of a conv3d
//!   (input, weight, bias: [`Conv3dBackwardOp`]) and the transposed
//!   convolution ([`Conv3dGeometry::transposed`]), their f64 references
//!   ([`backward_reference_point`]) and CPU kernels
//!   ([`conv3d_backward_cpu`]).
//! - `flip.rs`: the input gradient at stride 1 as a forward convolution
//!   ([`Conv3dGeometry::data_grad_as_forward`], [`flip_weight`]) and a
//!   strided one as a stride-1 one ([`Conv3dGeometry::data_grad_unstrided`],
//!   [`zero_insert`]), which the chain's tiled tier runs.
//!
//! This module sits below [`device`](crate::device) (whose host backend
//! runs the CPU kernel and whose kernels take a [`Conv3dGeometry`]); it
//! imports nothing above it.

mod backward_problem;
mod cpu;
mod flip;
mod params;
mod reference;

pub use backward_problem::{
    backward_reference, backward_reference_point, conv3d_backward_cpu, Conv3dBackwardOp,
    Conv3dBackwardProblem,
};
pub use cpu::{conv3d_cpu, conv3d_cpu_with, release_cpu_scratch, CpuKernel};
pub use flip::{flip_weight, zero_insert};
pub use params::{Conv3dData, Conv3dGeometry, Conv3dParams, Conv3dProblem, ShapeDim};
pub use reference::{reference, reference_point, sample_index, RefPoint};
