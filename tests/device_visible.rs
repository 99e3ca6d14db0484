//! The visibility mapping report (`HIP_VISIBLE_DEVICES` /
//! `CUDA_VISIBLE_DEVICES` are applied by the runtimes; rocm-safe reports
//! which physical device an ordinal is). One test per binary: it sets an
//! environment variable.

use rocm_safe::device::VisibleDevices;

#[test]
fn ordinal_maps_to_the_listed_entry() {
    const VAR: &str = "ROCM_SAFE_TEST_VISIBLE_DEVICES";
    std::env::remove_var(VAR);
    let v = VisibleDevices::read(VAR, Some(0));
    assert_eq!((v.value.as_deref(), v.physical.as_deref()), (None, None));
    assert_eq!(v.to_string(), format!("{VAR} unset"));

    std::env::set_var(VAR, "3, 1,GPU-5f2c");
    let v = VisibleDevices::read(VAR, Some(1));
    assert_eq!(v.physical.as_deref(), Some("1"));
    assert_eq!(v.to_string(), format!("{VAR}=\"3, 1,GPU-5f2c\", maps to 1"));
    assert_eq!(
        VisibleDevices::read(VAR, Some(2)).physical.as_deref(),
        Some("GPU-5f2c")
    );
    // More ordinals than entries, or no ordinal: no mapping.
    assert_eq!(VisibleDevices::read(VAR, Some(3)).physical, None);
    assert_eq!(VisibleDevices::read(VAR, None).physical, None);

    std::env::set_var(VAR, "");
    let v = VisibleDevices::read(VAR, Some(0));
    assert_eq!((v.value.as_deref(), v.physical), (Some(""), None));
    assert_eq!(VisibleDevices::none().to_string(), "no visibility variable");
    std::env::remove_var(VAR);
}
