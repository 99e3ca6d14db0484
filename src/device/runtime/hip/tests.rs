//! The HIP runtime layer's pure parts, without a GPU.

use super::*;

#[test]
fn versions_decode() {
    assert_eq!(decode_hip_version(50221153), "5.2.21153");
    assert_eq!(decode_hip_version(60342134), "6.3.42134");
    assert_eq!(decode_hip_version(71452802), "7.14.52802");
}

#[test]
fn without_a_runtime_every_entry_point_is_a_typed_error() {
    // In a process with a HIP runtime (a GPU machine, the stand-in) the
    // calls work or report the device; without one (CI without the
    // stand-in) each is the "no runtime" error listing the places.
    match runtime_version() {
        Ok((raw, text)) => {
            assert!(raw > 0 && text.starts_with(&format!("{}.", raw / 10_000_000)));
            let f = runtime_file().unwrap();
            assert!(!f.found_by.is_empty());
        }
        Err(e) => {
            let text = e.to_string();
            assert!(matches!(e, Error::RuntimeNotFound { .. }), "{text}");
            assert!(text.contains("runtime not available"), "{text}");
            assert!(text.contains("$ROCM_SAFE_HIP_RUNTIME"), "{text}");
            assert!(text.contains("loader path libamdhip64.so.7"), "{text}");
            assert!(text.contains("/opt/rocm/lib"), "{text}");
            for r in [
                list().map(|_| ()),
                driver_version().map(|_| ()),
                pci_bus_id(0).map(|_| ()),
                HipRuntime::open(0).map(|_| ()),
                arch_choice(0).map(|_| ()),
                runtime_file().map(|_| ()),
            ] {
                assert!(matches!(r, Err(Error::RuntimeNotFound { .. })), "{r:?}");
            }
            assert!(runtime_library().is_none());
        }
    }
}

fn node(arch: &str, n: u64) -> KfdNode {
    KfdNode {
        node: n,
        arch: arch.into(),
        domain: 0,
        location_id: 0,
        compute_units: 40,
    }
}

#[test]
fn the_override_chooses_the_code_object() {
    let built = ["gfx1151", "gfx1100"];
    let none = |_: &str| None;
    let c = choose_arch(Some(&node("gfx1151", 1)), &none, &built).unwrap();
    assert_eq!(
        (c.arch.as_str(), c.code_object.clone()),
        ("gfx1151", Ok("gfx1151"))
    );
    // The override names another arch: its code object is loaded.
    let over = |v: &str| (v == GFX_OVERRIDE_VAR).then(|| "11.0.0".to_owned());
    let c = choose_arch(Some(&node("gfx1151", 1)), &over, &built).unwrap();
    assert_eq!(c.device_arch.as_deref(), Some("gfx1151"));
    assert_eq!(
        (c.arch.as_str(), c.code_object.clone()),
        ("gfx1100", Ok("gfx1100"))
    );
    // No KFD topology (the stand-in): the override's arch.
    let c = choose_arch(None, &over, &built).unwrap();
    assert_eq!((c.device_arch.clone(), c.arch.as_str()), (None, "gfx1100"));
    // No topology, no override: unknown, refused with the reason.
    let c = choose_arch(None, &none, &built).unwrap();
    assert_eq!(c.arch, "unknown");
    assert!(c
        .code_object
        .unwrap_err()
        .contains("no unknown code object"));
    // An override to an arch this build lacks: refused, naming it.
    let over = |v: &str| (v == GFX_OVERRIDE_VAR).then(|| "10.3.0".to_owned());
    let c = choose_arch(Some(&node("gfx1151", 1)), &over, &built).unwrap();
    let why = c.code_object.unwrap_err();
    assert!(
        why.contains("HSA_OVERRIDE_GFX_VERSION=10.3.0")
            && why.contains("gfx1030")
            && why.contains("the GPU is gfx1151")
            && why.contains("built: gfx1151,gfx1100"),
        "{why}"
    );
    // An invalid value: the runtime refuses it; so do we, saying why.
    let bad = |v: &str| (v == GFX_OVERRIDE_VAR).then(|| "11.0".to_owned());
    let e = choose_arch(Some(&node("gfx1151", 1)), &bad, &built).unwrap_err();
    assert!(matches!(e, Error::InvalidEnvironment { .. }), "{e}");
    assert!(e.to_string().contains("major.minor.stepping"), "{e}");
}

#[test]
fn no_device_is_explained_by_permission_or_override() {
    let fallback = || no_device(None, 0);
    let e = explain_no_device_with(
        KfdAccess::Denied {
            group: Some("render".into()),
        },
        None,
        fallback(),
    );
    let text = e.to_string();
    assert!(matches!(e, Error::DevicePermission { .. }), "{text}");
    assert!(
        text.contains("/dev/kfd") && text.contains("render") && text.contains("video"),
        "{text}"
    );
    let bad = GfxOverride {
        var: GFX_OVERRIDE_VAR.into(),
        value: "x".into(),
        arch: Err("expected major.minor.stepping".into()),
    };
    let e = explain_no_device_with(KfdAccess::Allowed, Some(bad), fallback());
    assert!(matches!(e, Error::InvalidEnvironment { .. }), "{e}");
    let e = explain_no_device_with(KfdAccess::Missing, None, fallback());
    assert!(matches!(e, Error::NoDevice { .. }), "{e}");
    let e = explain_no_device_with(KfdAccess::Allowed, None, fallback());
    assert!(matches!(e, Error::NoDevice { .. }), "{e}");
}

#[test]
fn allocation_errors_are_typed() {
    let e = alloc_err("hipMalloc", 1 << 20, HipError::OUT_OF_MEMORY);
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    let e = alloc_err("hipHostRegister", 1 << 20, HipError::INVALID_VALUE);
    assert!(
        matches!(
            e,
            Error::RuntimeCall {
                backend: "hip",
                op: "hipHostRegister",
                code: 1,
                ..
            }
        ),
        "{e}"
    );
    // The boxed source is the runtime's own error.
    let Error::RuntimeCall { source, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(
        source.downcast_ref::<HipError>(),
        Some(&HipError::INVALID_VALUE)
    );
    let e = alloc_err("hipMalloc", 1, HipError(4242));
    assert!(e.to_string().contains("unknown hipError_t 4242"), "{e}");
}
