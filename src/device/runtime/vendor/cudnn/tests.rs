//! cuDNN's bindings without a GPU: statuses, library refusals, sizes.

use super::*;
use std::path::PathBuf;

#[test]
fn status_codes_map_to_typed_errors() {
    assert!(check("cudnnCreate", 0).is_ok());
    let e = check("cudnnConvolutionForward", 1002).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dCudnn {
                op: "cudnnConvolutionForward",
                code: 1002,
                status: "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH"
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "conv3d: cudnn: cudnnConvolutionForward: \
         CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH (status 1002)"
    );
    assert_eq!(status_name(NOT_SUPPORTED), "CUDNN_STATUS_NOT_SUPPORTED");
    assert_eq!(status_name(2001), "CUDNN_STATUS_INVALID_VALUE");
    assert_eq!(status_name(7), "unknown cudnnStatus_t");
    assert_eq!(version_text(91900), "9.19.0");
    assert_eq!(version_text(90100), "9.1.0");
}

#[test]
fn two_mapped_copies_are_refused_with_both_paths() {
    assert_eq!(duplicate_reason(&[]), None);
    assert_eq!(duplicate_reason(&[PathBuf::from("/a/libcudnn.so.9")]), None);
    let why = duplicate_reason(&[
        PathBuf::from("/venv/nvidia/cudnn/lib/libcudnn.so.9"),
        PathBuf::from("/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"),
    ])
    .unwrap();
    assert!(why.contains("maps 2 cuDNN files"), "{why}");
    assert!(
        why.contains("/venv/nvidia/cudnn/lib/libcudnn.so.9"),
        "{why}"
    );
    assert!(why.contains("libcudnn.so.9.14.0"), "{why}");
    assert!(why.contains("ROCM_SAFE_CUDNN"), "{why}");
}

#[test]
fn missing_library_and_symbols_are_typed() {
    let spec = Spec {
        what: "cuDNN (libcudnn)",
        sonames: vec!["libcudnn-rocm-safe-absent.so.9"],
        stem: "libcudnn-rocm-safe-absent.so",
        env_var: Some("ROCM_SAFE_TEST_CUDNN_UNSET"),
        ..Spec::default()
    };
    let e = load(&spec).unwrap_err();
    assert!(e.starts_with("cuDNN (libcudnn) not found; tried "), "{e}");
    assert!(
        e.contains("loader path libcudnn-rocm-safe-absent.so.9"),
        "{e}"
    );
    // A library that loads but is not cuDNN.
    let libc = Spec {
        what: "cuDNN",
        sonames: vec!["libc.so.6"],
        stem: "libc.so",
        ..Spec::default()
    };
    let e = load(&libc).unwrap_err();
    assert!(e.ends_with(": symbol cudnnGetVersion not found"), "{e}");
    // This machine's cuDNN: absent (a typed error saying why) or bound.
    match library() {
        Err(Error::VendorUnavailable {
            backend: "cuda",
            library: "libcudnn",
            reason,
        }) => {
            assert!(!reason.is_empty());
            assert_eq!(loaded(), Err(reason));
        }
        Err(other) => panic!("{other}"),
        Ok(lib) => {
            let l = lib.loaded();
            assert!(
                l.version.as_deref().unwrap_or("").starts_with("9."),
                "{l:?}"
            );
            assert!(available().is_ok());
            // One cuDNN in this process, the one bound.
            assert_eq!(dynlib::mapped_copies("libcudnn.so").len(), 1);
        }
    }
}

#[test]
fn sizes_beyond_32_bits_are_typed() {
    let (d, s) = dims([2, 3, 4, 5, 6]).unwrap();
    assert_eq!(d, [2, 3, 4, 5, 6]);
    assert_eq!(s, [360, 120, 30, 6, 1]);
    assert!(matches!(
        dims([1, 1, 1, 1, 1 << 40]),
        Err(Error::Conv3dTier { tier: "cudnn", .. })
    ));
    assert!(matches!(
        dims([1, 1 << 16, 1 << 16, 2, 1]),
        Err(Error::Conv3dTier { tier: "cudnn", .. })
    ));
}
