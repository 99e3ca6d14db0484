//! MIOpen's bindings without a GPU: statuses, library refusals, sizes.

use super::*;

#[test]
fn status_codes_map_to_typed_errors() {
    assert!(check("miopenCreate", 0).is_ok());
    let e = check("miopenFindConvolutionForwardAlgorithm", 3).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Conv3dMiopen {
                op: "miopenFindConvolutionForwardAlgorithm",
                code: 3,
                status: "miopenStatusBadParm"
            }
        ),
        "{e}"
    );
    assert_eq!(status_name(6), "miopenStatusNotImplemented");
    assert_eq!(status_name(10), "miopenStatusVersionMismatch");
    assert_eq!(status_name(77), "unknown miopenStatus");
    let e = check("miopenFindConvolutionForwardAlgorithm", NO_ALGORITHM).unwrap_err();
    assert!(e.to_string().contains("no suitable algorithm"), "{e}");
    assert!(e.to_string().starts_with("conv3d: miopen: "), "{e}");
}

#[test]
fn missing_library_and_symbols_are_typed() {
    let spec = Spec {
        what: "MIOpen (libMIOpen)",
        sonames: vec!["libMIOpen-rocm-safe-absent.so.1"],
        stem: "libMIOpen-rocm-safe-absent.so",
        folders: vec![(
            "/nonexistent/rocm/lib".into(),
            "the HIP runtime's folder".into(),
        )],
        ..Spec::default()
    };
    let e = load(&spec).unwrap_err();
    assert!(e.starts_with("MIOpen (libMIOpen) not found; tried "), "{e}");
    assert!(
        e.contains("the HIP runtime's folder (/nonexistent/rocm/lib)"),
        "{e}"
    );
    assert!(
        e.contains("loader path libMIOpen-rocm-safe-absent.so.1"),
        "{e}"
    );
    // A library that loads but is not MIOpen.
    let libc = Spec {
        what: "MIOpen",
        sonames: vec!["libc.so.6"],
        stem: "libc.so",
        ..Spec::default()
    };
    let e = load(&libc).unwrap_err();
    assert!(e.ends_with(": symbol miopenCreate not found"), "{e}");
    // This machine's MIOpen: either absent (a typed error naming it)
    // or present and bound.
    match library() {
        Err(Error::VendorUnavailable {
            backend: "hip",
            library: "libMIOpen",
            reason,
        }) => {
            assert!(reason.contains("libMIOpen"), "{reason}");
            assert_eq!(loaded(), Err(reason));
        }
        Err(other) => panic!("{other}"),
        // Loaded: `load` returns Ok only when every symbol was bound
        // and one HIP runtime is mapped.
        Ok(lib) => {
            assert!(format!("{lib:?}").contains("create"));
            assert!(super::super::libs::hip_runtime_copies().len() <= 1);
        }
    }
}

#[test]
fn a_second_hip_runtime_refuses_miopen_naming_both() {
    assert_eq!(
        second_runtime_reason("/opt/rocm/lib/libMIOpen.so.1", &[]),
        None
    );
    let one = [PathBuf::from("/opt/rocm/lib/libamdhip64.so.7")];
    assert_eq!(second_runtime_reason("m", &one), None);
    let two = [
        PathBuf::from("/venv/torch/lib/libamdhip64.so"),
        PathBuf::from("/opt/rocm-6.4.0/lib/libamdhip64.so.6.4.60400"),
    ];
    let why = second_runtime_reason("/opt/rocm-6.4.0/lib/libMIOpen.so.1", &two).unwrap();
    for part in [
        "/opt/rocm-6.4.0/lib/libMIOpen.so.1 brought a second HIP runtime",
        "/venv/torch/lib/libamdhip64.so, /opt/rocm-6.4.0/lib/libamdhip64.so.6.4.60400",
        "the library stays loaded",
        "ROCM_SAFE_MIOPEN",
    ] {
        assert!(why.contains(part), "{part:?} missing from {why}");
    }
}

#[test]
fn sizes_beyond_32_bits_are_typed() {
    let (d, s) = dims([2, 3, 4, 5, 6]).unwrap();
    assert_eq!(d, [2, 3, 4, 5, 6]);
    assert_eq!(s, [360, 120, 30, 6, 1]);
    assert!(matches!(
        dims([1, 1, 1, 1, 1 << 40]),
        Err(Error::Conv3dTier { tier: "miopen", .. })
    ));
    assert!(matches!(
        dims([1, 1 << 16, 1 << 16, 2, 1]),
        Err(Error::Conv3dTier { tier: "miopen", .. })
    ));
}
