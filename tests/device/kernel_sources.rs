//! Guards on the kernel sources in `kernels/` that hold for every build
//! (no GPU, no compiler needed):
//!
//! - no kernel built for HIP depends on the wavefront size (docs/internals.md,
//!   "Wavefront size (HIP)"): AMD runs wave64 on gfx9 and wave32 on gfx10-12, so
//!   shuffles, ballots, `warpSize`, lane masks and warp-synchronous
//!   (`volatile`) code are allowed only inside `#if defined(RS_CUDA)` blocks;
//! - every kernel that assumes its block size carries a HIP launch bound
//!   (without one the compiler budgets registers for 1024 threads and the
//!   tiled conv3d kernels spilled to scratch).

use std::path::{Path, PathBuf};

/// `kernels/` of the checkout this test was built in, or, for a test
/// binary copied to another machine (the GPU machine, where the checkout
/// sits at another path), of the working directory.
fn kernel_dir() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    if built.is_dir() {
        return built;
    }
    let here = Path::new("kernels");
    assert!(
        here.is_dir(),
        "no kernels/ at {} or in the working directory",
        built.display()
    );
    here.to_path_buf()
}

fn sources() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(kernel_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "hip"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    v.sort();
    assert!(v.len() >= 6, "{v:?}");
    v
}

/// The lines of `src` that a HIP build compiles: without comments and
/// outside `#if defined(RS_CUDA)` blocks (their `#else` branches count).
fn hip_lines(src: &str) -> Vec<(usize, String)> {
    // Stack of "this #if level is CUDA-only".
    let mut stack: Vec<bool> = Vec::new();
    let mut out = Vec::new();
    for (i, line) in src.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("").trim().to_owned();
        if let Some(d) = code.strip_prefix('#') {
            let d = d.trim_start();
            if d.starts_with("if") {
                let cuda_only = d.contains("defined(RS_CUDA)") && !d.contains("!defined(RS_CUDA)");
                stack.push(cuda_only);
            } else if d.starts_with("else") || d.starts_with("elif") {
                if let Some(top) = stack.last_mut() {
                    *top = false;
                }
            } else if d.starts_with("endif") {
                stack.pop();
            }
            continue;
        }
        if !stack.iter().any(|&c| c) {
            out.push((i + 1, code));
        }
    }
    out
}

#[test]
fn hip_kernels_do_not_depend_on_the_wavefront_size() {
    const WAVE_DEPENDENT: &[&str] = &[
        "warpSize",
        "__shfl",
        "__ballot",
        "__any(",
        "__all(",
        "__activemask",
        "__syncwarp",
        "__lane_id",
        "__lanemask",
        "__reduce_",
        "__match_",
        "WAVEFRONT_SIZE",
        "volatile",
    ];
    let mut found = Vec::new();
    for (name, src) in sources() {
        for (n, code) in hip_lines(&src) {
            for t in WAVE_DEPENDENT {
                if code.contains(t) {
                    found.push(format!("{name}:{n}: {t} in `{code}`"));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "wavefront-size dependent code outside #if defined(RS_CUDA) \
         (AMD runs wave32 and wave64; see docs/internals.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_cuda_only_filter_sees_the_mma_kernel_as_cuda_only() {
    // The one kernel written for 32-lane warps (mma.sync) must stay
    // invisible to HIP: if this fails the filter above is blind.
    let conv = sources()
        .into_iter()
        .find(|(n, _)| n == "conv3d.hip")
        .unwrap()
        .1;
    assert!(conv.contains("conv3d_tiled_bf16_mma"));
    assert!(hip_lines(&conv)
        .iter()
        .all(|(_, c)| !c.contains("conv3d_tiled_bf16_mma") && !c.contains("mma.sync")));
    assert!(hip_lines(&conv)
        .iter()
        .any(|(_, c)| c.contains("conv3d_tiled_f32")));
}

#[test]
fn kernels_that_assume_their_block_size_have_a_hip_launch_bound() {
    // Kernels whose body assumes blockDim.x == 256 (shared-memory
    // reductions over 256 lanes, the 256-thread conv3d tiles), by symbol or
    // macro name, and the file that defines them.
    let want = [
        ("fingerprint.hip", "fingerprint_sum_u8"),
        ("convert_fingerprint.hip", "RS_WIDEN_FP_KERNEL"),
        ("nonfinite.hip", "RS_NONFINITE_KERNEL"),
        ("widen_check.hip", "RS_WIDEN_CHECK_KERNEL"),
        ("conv3d_naive.hip", "conv3d_naive_f32"),
        ("conv3d_naive.hip", "conv3d_naive_bf16"),
        ("conv3d.hip", "conv3d_tiled_f32"),
        ("conv3d.hip", "conv3d_tiled_bf16"),
        ("conv3d_check.hip", "conv3d_check_f32"),
        ("conv3d_check.hip", "conv3d_check_bf16"),
        ("conv3d_check.hip", "conv3d_guard_check_f32"),
        ("conv3d_check.hip", "conv3d_guard_check_bf16"),
        ("conv3d_backward.hip", "conv3d_bwd_weight_f32"),
        ("conv3d_backward.hip", "conv3d_bwd_weight_bf16"),
        ("conv3d_backward.hip", "conv3d_bwd_bias_f32"),
        ("conv3d_backward.hip", "conv3d_bwd_bias_bf16"),
        ("conv3d_backward.hip", "conv3d_bwd_check_f32"),
        ("conv3d_backward.hip", "conv3d_bwd_check_bf16"),
        ("conv3d_wgrad.hip", "conv3d_bwd_weight_tiled_f32"),
        ("conv3d_wgrad.hip", "conv3d_bwd_weight_tiled_bf16"),
    ];
    let srcs = sources();
    for (file, kernel) in want {
        let src = &srcs.iter().find(|(n, _)| n == file).unwrap().1;
        // The KERNEL declaration that names it (possibly over two lines).
        let lines: Vec<&str> = src.lines().collect();
        let at = lines
            .iter()
            .position(|l| {
                l.contains(&format!(" {kernel}(")) || l.contains(&format!("#define {kernel}("))
            })
            .unwrap_or_else(|| panic!("{kernel} not found in {file}"));
        let decl = lines[at.saturating_sub(1)..(at + 3).min(lines.len())].join("\n");
        assert!(
            decl.contains("RS_HIP_BLOCK(") || decl.contains("RS_NAIVE_BOUNDS"),
            "{file}: {kernel} has no HIP launch bound:\n{decl}"
        );
    }
    // And the bounds mean something on HIP only (CUDA keeps its budgets).
    let prelude = std::fs::read_to_string(kernel_dir().join("prelude.h")).unwrap();
    assert!(prelude.contains("#define RS_HIP_BLOCK(n) __launch_bounds__(n)"));
    assert!(prelude.contains("#define RS_HIP_BLOCK(n)\n"));
}
