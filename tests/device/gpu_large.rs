//! Large-index tests on a real GPU: a conversion and a fingerprint over more
//! than 2^32 elements / words (24 GiB of device memory), so 32-bit index
//! arithmetic anywhere in a kernel would show. Run with
//! `--features cuda -- --ignored` (or `hip`): `cuda::*` / `hip::*`.

use crate::common;

use half::bf16;
use rayon::prelude::*;
use rocm_safe::convert::fingerprint::{finish, sum_bytes};
use rocm_safe::convert::scalar;
use rocm_safe::device::Device;

use common::Rng;

per_device!(gpu_only: bf16_to_f32_past_2_pow_32_elements);

/// bf16 -> f32 of 2^32 + 17 elements. The source repeats a pattern of P
/// (odd, so positions differ mod 2^k) elements; the output is checked in
/// full through the device fingerprint against one the host computes
/// from the pattern (every element counted), and near the 2^32 boundary
/// and the end element by element.
fn bf16_to_f32_past_2_pow_32_elements(dev: &Device) {
    const N: usize = (1usize << 32) + 17;
    const P: usize = 65_537;
    let s = dev.stream().unwrap();
    let pattern = Rng::new(P as u64).u16s(P);
    let pat_bf: Vec<bf16> = pattern.iter().map(|&b| bf16::from_bits(b)).collect();
    let chunk = s.clone_htod(&pat_bf).unwrap();
    let mut src = s.alloc::<bf16>(N).unwrap();
    let mut at = 0usize;
    while at < N {
        let n = P.min(N - at);
        let mut dst = src.slice_mut(at..at + n).unwrap();
        dst.copy_dtod(&s, &chunk.slice(..n).unwrap()).unwrap();
        at += n;
    }
    let mut out = s.alloc::<f32>(N).unwrap();
    s.convert(&src.view(), &mut out.view_mut()).unwrap();
    let got_fp = s.fingerprint(&out.view()).unwrap();
    // Partial sums of 1 Mi-element pieces of the expected output.
    let want_sum = (0..N.div_ceil(1 << 20))
        .into_par_iter()
        .map(|c| {
            let (a, b) = (c << 20, ((c + 1) << 20).min(N));
            let bytes: Vec<u8> = (a..b)
                .flat_map(|i| scalar::bf16_to_f32(pattern[i % P]).to_le_bytes())
                .collect();
            sum_bytes(a as u64, &bytes)
        })
        .reduce(|| 0u64, u64::wrapping_add);
    assert_eq!(got_fp, finish(want_sum, 4 * N as u64));
    for (a, b) in [(0usize, 1000usize), ((1 << 32) - 1000, (1 << 32) + 17)] {
        let mut host = vec![0f32; b - a];
        out.slice(a..b).unwrap().copy_dtoh(&s, &mut host).unwrap();
        for (k, x) in host.iter().enumerate() {
            let i = a + k;
            assert_eq!(
                x.to_bits(),
                scalar::bf16_to_f32(pattern[i % P]),
                "element {i}"
            );
        }
    }
    assert!(dev.take_errors().is_empty());
}

/// Without a GPU runtime the backends answer with typed errors, never a
/// panic: `--features hip` here (no HIP runtime, or one without an AMD GPU) and
/// `--features cuda` on a machine without libcuda.
#[test]
fn gpu_backends_without_hardware_give_typed_errors() {
    #[cfg(feature = "hip")]
    {
        use rocm_safe::device::{BackendKind, Device};
        match Device::list(BackendKind::Hip) {
            Ok(list) => assert!(!list.is_empty()),
            Err(e) => assert!(
                // Printed for the CI log: which typed error this machine gives.
                {
                    eprintln!("hip: {e}");
                    true
                } && matches!(
                    e,
                    rocm_safe::Error::NoDevice { .. }
                        | rocm_safe::Error::NoRuntime { .. }
                        | rocm_safe::Error::RuntimeNotFound { .. }
                        | rocm_safe::Error::DevicePermission { .. }
                ),
                "{e}"
            ),
        }
        if let Err(e) = Device::open(BackendKind::Hip, 0) {
            assert!(
                matches!(
                    e,
                    rocm_safe::Error::NoDevice { .. }
                        | rocm_safe::Error::NoRuntime { .. }
                        | rocm_safe::Error::RuntimeNotFound { .. }
                        | rocm_safe::Error::DevicePermission { .. }
                ),
                "{e}"
            );
        }
        let e = Device::open(BackendKind::Hip, 4096).unwrap_err();
        assert!(
            matches!(
                e,
                rocm_safe::Error::NoDevice { .. }
                    | rocm_safe::Error::NoRuntime { .. }
                    | rocm_safe::Error::RuntimeNotFound { .. }
                    | rocm_safe::Error::DevicePermission { .. }
            ),
            "{e}"
        );
    }
    #[cfg(feature = "cuda")]
    {
        use rocm_safe::device::{BackendKind, Device};
        match Device::list(BackendKind::Cuda) {
            Ok(list) => {
                eprintln!("cuda: {list:?}");
                assert!(!list.is_empty())
            }
            Err(e) => assert!(
                {
                    eprintln!("cuda: {e}");
                    true
                } && matches!(
                    e,
                    rocm_safe::Error::NoRuntime {
                        library: "libcuda",
                        ..
                    } | rocm_safe::Error::NoDevice { .. }
                ),
                "{e}"
            ),
        }
        let e = Device::open(BackendKind::Cuda, 4096).unwrap_err();
        assert!(
            matches!(
                e,
                rocm_safe::Error::NoDevice {
                    ordinal: Some(4096),
                    ..
                } | rocm_safe::Error::NoRuntime { .. }
            ),
            "{e}"
        );
    }
}
