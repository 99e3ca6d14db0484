//! The `interop` example, as a trainer would run it: a sharded demo
//! checkpoint loaded onto the first available device, every tensor exported
//! through DLPack, two taken back, a verified conversion and a conv3d on
//! that borrowed memory on a borrowed stream.

use crate::example_bin;

#[test]
fn interop_example_runs_end_to_end() {
    let o = std::process::Command::new(example_bin::example("interop"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    for want in [
        "load report:",
        "exported conv.weight",
        "exported x",
        "exported step",
        "verified conversion of conv.weight on the trainer's stream",
        "served by the device",
        "output [1, 8, 4, 8, 8], largest relative difference to the CPU",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    // Every tensor of the demo was served by the pinned ring: nothing fell
    // back on a load where nothing went wrong.
    assert!(out.contains("pinned ring: 3"), "{out}");
}

#[test]
fn interop_example_names_a_missing_checkpoint() {
    let o = std::process::Command::new(example_bin::example("interop"))
        .arg("/nonexistent/model.safetensors.index.json")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("/nonexistent/model.safetensors.index.json"),
        "{err}"
    );
}
