//! The kernel sources (`kernels/`): the files watched, the HIP translation
//! unit and the CUDA modules.

/// The kernel files, each watched with `rerun-if-changed`.
pub(crate) const KERNEL_FILES: &[&str] = &[
    "kernels/prelude.h",
    "kernels/bf16.h",
    "kernels/hip_standin.h",
    "kernels/kernels.hip",
    "kernels/core.hip",
    "kernels/convert.hip",
    "kernels/fingerprint.hip",
    "kernels/convert_fingerprint.hip",
    "kernels/nonfinite.hip",
    "kernels/widen_check.hip",
    "kernels/conv3d.hip",
    "kernels/conv3d_naive.hip",
    "kernels/conv3d_check.hip",
    "kernels/conv3d_backward.hip",
    "kernels/conv3d_wgrad.hip",
];

/// The translation unit that includes every kernel file (HIP).
pub(crate) const ENTRY: &str = "kernels/kernels.hip";

/// The CUDA sources (translation units), in `KernelModule::source` order.
pub(crate) const CUDA_SOURCES: [(&str, &str); 2] = [
    ("core", "kernels/core.hip"),
    ("conv3d", "kernels/conv3d.hip"),
];

/// The CUDA modules, in `KernelModule` order: (name, index into
/// `CUDA_SOURCES`, the `RS_PART` it is compiled with: prelude.h).
pub(crate) const CUDA_MODULES: [(&str, usize, u32); 6] = [
    ("core", 0, 0),
    ("conv3d", 1, 1),
    ("conv3d_naive", 1, 2),
    ("conv3d_tiled_f32", 1, 3),
    ("conv3d_tiled_bf16", 1, 4),
    ("conv3d_tiled_bf16_mma", 1, 5),
];
