//! Shared by the integration tests (each includes it with `mod common;`):
//! the per-device test macro [`per_device!`](crate::per_device), the one
//! seeded generator [`Rng`], a tampering backend, the conv3d cases, and
//! (feature `hip`) the stand-in HIP runtime and its child processes.
#![allow(dead_code)]

pub mod conv3d;
pub mod conv3d_backward;
pub mod conv3d_device;
pub mod device;
pub mod dlpack;
pub mod faults;
#[cfg(feature = "hip")]
pub mod hip_scenarios;
#[cfg(feature = "hip")]
pub mod hip_standin;
pub mod rng;
pub mod st;
pub mod st_files;
pub mod tamper;
pub mod transfer;
pub mod vendor_standin;

#[allow(unused_imports)]
pub use device::Open;
#[allow(unused_imports)]
pub use rng::Rng;

/// The name the test harness lists for the test `name` of the module at
/// `module_path` (pass `module_path!()`): the path without the test
/// binary's own name, as `--exact` wants it in a child process.
pub fn listed(module_path: &str, name: &str) -> String {
    match module_path.split_once("::") {
        Some((_, inner)) => format!("{inner}::{name}"),
        None => name.to_owned(),
    }
}

/// Makes one test per backend from test functions of the including file:
/// `host::NAME` (always run), `cuda::NAME` (feature `cuda`) and
/// `hip::NAME` (feature `hip`), the GPU ones `#[ignore = "needs a GPU"]`
/// (run them with `-- --include-ignored` where the GPU is). Each runs on
/// ordinal 0 of its backend.
///
/// A function takes either the opened device, `fn NAME(dev: &Device)`, or
/// a backend opener, `fn NAME(open: common::Open<'_>)` (a fresh
/// `Box<dyn Backend>` per call, to wrap in `Faults` or a tamperer); the
/// signature decides which it gets. Functions after `gpu_only:` (also
/// either shape) get no host variant (they are still compiled, and
/// type-checked, in builds without a GPU feature). One invocation per file:
/// it makes the modules `host`, `cuda` and `hip`.
///
/// ```ignore
/// per_device!(widening_is_exact, faults_are_caught; gpu_only: past_2_pow_32);
/// per_device!(gpu_only: past_2_pow_32);
/// ```
#[macro_export]
macro_rules! per_device {
    (gpu_only: $($gpu:ident),* $(,)?) => {
        $crate::per_device!(; gpu_only: $($gpu),*);
    };
    ($($name:ident),* $(,)? $(; gpu_only: $($gpu:ident),* $(,)?)?) => {
        mod host {
            $(
                #[test]
                fn $name() {
                    $crate::common::device::run(
                        rocm_safe::device::BackendKind::Host,
                        super::$name,
                    );
                }
            )*
            // GPU-only tests stay compiled (and not dead code) in builds
            // without a GPU backend.
            $($(
                #[allow(dead_code)]
                fn $gpu() {
                    $crate::common::device::run(
                        rocm_safe::device::BackendKind::Host,
                        super::$gpu,
                    );
                }
            )*)?
        }
        #[cfg(feature = "cuda")]
        mod cuda {
            $(
                #[test]
                #[ignore = "needs a GPU"]
                fn $name() {
                    $crate::common::device::run(
                        rocm_safe::device::BackendKind::Cuda,
                        super::$name,
                    );
                }
            )*
            $($(
                #[test]
                #[ignore = "needs a GPU"]
                fn $gpu() {
                    $crate::common::device::run(
                        rocm_safe::device::BackendKind::Cuda,
                        super::$gpu,
                    );
                }
            )*)?
        }
        #[cfg(feature = "hip")]
        mod hip {
            $(
                #[test]
                #[ignore = "needs a GPU"]
                fn $name() {
                    $crate::common::device::run(
                        rocm_safe::device::BackendKind::Hip,
                        super::$name,
                    );
                }
            )*
            $($(
                #[test]
                #[ignore = "needs a GPU"]
                fn $gpu() {
                    $crate::common::device::run(
                        rocm_safe::device::BackendKind::Hip,
                        super::$gpu,
                    );
                }
            )*)?
        }
    };
}

/// A sparse file (no data blocks) declaring one BF16 tensor `x` of
/// `elems` elements.
pub fn sparse_bf16(path: &std::path::Path, elems: u64) {
    let header = format!(
        r#"{{"x":{{"dtype":"BF16","shape":[{elems}],"data_offsets":[0,{}]}}}}"#,
        elems * 2
    );
    let mut h = header.into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(&h);
    std::fs::write(path, &bytes).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.set_len(bytes.len() as u64 + elems * 2).unwrap();
}
