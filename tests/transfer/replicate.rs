//! One process, several devices (`transfer::replicate`), over the host
//! backend: every device ends with every tensor, exact; each tensor is
//! loaded by one device; a copy that lands wrong on a device (a peer copy
//! that flips a byte, a device whose copies land zeros) is caught on that
//! device; no devices, a missing tensor, a copy of the wrong length.

use crate::common;
use crate::common::faults::faulty;
use rocm_safe::device::host::HostBackend;

use rocm_safe::device::faults::{FaultHandle, FaultKind, FaultPlan, When};
use rocm_safe::device::{Device, DeviceView, DeviceViewMut, Stream};
use rocm_safe::safetensors::Checkpoint;
use rocm_safe::transfer::replicate::{load_replicated, plan_owners, DevicePeer, PeerCopy, ViaHost};
use rocm_safe::transfer::TensorData;
use rocm_safe::{DType, Error, Result};

use common::transfer::{mixed, small};

const NAMES: [&str; 9] = [
    "a.bf16",
    "b.big_bf16",
    "c.f16",
    "d.f32",
    "e.i32",
    "f.f64",
    "g.scalar",
    "h.u8",
    "i.empty",
];

fn want(ckpt: &Checkpoint, name: &str, dtype: DType) -> Vec<u8> {
    if ckpt.info(name).unwrap().dtype == dtype {
        ckpt.read_bytes(name).unwrap()
    } else {
        ckpt.read_converted_bytes(name, dtype).unwrap()
    }
}

/// Loads the mixed checkpoint onto `devices` (as stored and widened to
/// f32) and checks every tensor on every device, each loaded once, every
/// copy checked.
fn replicated_exactly(devices: &[Device], peer: &dyn PeerCopy) {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let n = devices.len();
    for dtype in [None, Some(DType::F32)] {
        let r = load_replicated(&ckpt, &NAMES, devices, &small(dtype), peer).unwrap();
        assert_eq!(r.devices.len(), n);
        assert_eq!(r.peer, peer.name());
        for (d, list) in r.devices.iter().enumerate() {
            let names: Vec<&str> = list.iter().map(|t| t.name.as_str()).collect();
            assert_eq!(names, NAMES, "device {d}: in the order asked for");
            for t in list {
                assert_eq!(
                    t.data.to_host().unwrap(),
                    want(&ckpt, &t.name, t.dtype),
                    "device {d} tensor {}",
                    t.name
                );
                if let TensorData::Buffer(b) = &t.data {
                    assert!(b.device().same(&devices[d]), "device {d} tensor {}", t.name);
                }
            }
        }
        // Each tensor loaded by exactly one device, every device some.
        let loaded: usize = r.reports.iter().map(|x| x.tensors.len()).sum();
        assert_eq!(loaded, NAMES.len());
        assert!(r.reports.iter().all(|x| !x.tensors.is_empty()));
        for (i, name) in NAMES.iter().enumerate() {
            assert!(r.reports[r.owners[i]].tensor(name).is_some(), "{name}");
        }
        // Every copy to another device was checked there.
        let buffers = r.devices[0].iter().filter(|t| t.data.is_device()).count();
        assert_eq!(r.checked, (n - 1) * buffers);
        assert_eq!(
            r.get(n - 1, "d.f32").map(|t| t.shape.clone()),
            Some(vec![70, 1001])
        );
    }
}

#[test]
fn every_device_gets_every_tensor_exactly_each_loaded_once() {
    let devices: Vec<Device> = (0..3).map(|_| Device::host()).collect();
    replicated_exactly(&devices, &ViaHost { chunk_bytes: 4099 });
    replicated_exactly(&devices, &DevicePeer);
}

/// Two GPUs of this build's backend (`cargo test --features cuda --test
/// transfer_replicate -- --ignored` on a machine with two).
#[cfg(any(feature = "cuda", feature = "hip"))]
#[test]
#[ignore = "needs two GPUs"]
fn two_gpus_get_every_tensor_exactly() {
    use rocm_safe::device::BackendKind;
    let kind = if cfg!(feature = "cuda") {
        BackendKind::Cuda
    } else {
        BackendKind::Hip
    };
    let devices: Vec<Device> = (0..2)
        .map(|i| Device::open(kind, i).unwrap_or_else(|e| panic!("open {}:{i}: {e}", kind.name())))
        .collect();
    replicated_exactly(&devices, &ViaHost { chunk_bytes: 4099 });
    replicated_exactly(&devices, &DevicePeer);
}

#[test]
fn one_device_is_a_plain_load() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let r = load_replicated(
        &ckpt,
        &NAMES,
        &[Device::host()],
        &small(None),
        &ViaHost::default(),
    )
    .unwrap();
    assert_eq!(r.checked, 0);
    assert_eq!(r.devices[0].len(), NAMES.len());
    for t in &r.devices[0] {
        assert_eq!(t.data.to_host().unwrap(), want(&ckpt, &t.name, t.dtype));
    }
}

/// A peer copy that flips one byte of the tensor whose size is `bytes`.
struct Flips {
    bytes: usize,
}

impl PeerCopy for Flips {
    fn copy(
        &self,
        src: &DeviceView<'_, u8>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, u8>,
        dst_stream: &Stream,
    ) -> Result<()> {
        let mut v = vec![0u8; src.len()];
        src.copy_dtoh(src_stream, &mut v)?;
        if v.len() == self.bytes {
            let mid = v.len() / 2;
            v[mid] ^= 0x10;
        }
        dst.copy_htod(dst_stream, &v)
    }

    fn name(&self) -> &'static str {
        "flips"
    }
}

#[test]
fn a_copy_that_lands_wrong_is_caught_on_the_device_that_got_it() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let devices: Vec<Device> = (0..2).map(|_| Device::host()).collect();
    let bytes = ckpt.info("d.f32").unwrap().num_bytes() as usize;
    let e = load_replicated(&ckpt, &NAMES, &devices, &small(None), &Flips { bytes }).unwrap_err();
    assert!(matches!(e, Error::VerificationFailed { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("\"d.f32\"") && msg.contains("flips"), "{msg}");
}

/// [`ViaHost`] that turns the faulty device's faults on at the first peer
/// copy and leaves them on (its own load runs clean before). Turning them
/// off again after each copy raced with the copies other threads ran at
/// the same time: a copy into the faulty device could run while another
/// thread had just turned the faults off, and land clean.
struct FaultsDuringCopy {
    handle: FaultHandle,
}

impl PeerCopy for FaultsDuringCopy {
    fn copy(
        &self,
        src: &DeviceView<'_, u8>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, u8>,
        dst_stream: &Stream,
    ) -> Result<()> {
        self.handle.set_enabled(true);
        ViaHost::default().copy(src, src_stream, dst, dst_stream)
    }

    fn name(&self) -> &'static str {
        "via host, faulty"
    }
}

#[test]
fn a_device_whose_copies_land_zeros_reports_it() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let (bad, handle) = faulty(
        HostBackend::new(),
        FaultPlan::one(FaultKind::CopyLandsZeros, When::Always),
    );
    handle.set_enabled(false);
    let devices = vec![Device::host(), bad];
    let e = load_replicated(
        &ckpt,
        &NAMES,
        &devices,
        &small(None),
        &FaultsDuringCopy {
            handle: handle.clone(),
        },
    )
    .unwrap_err();
    // The faults are on while a peer copy runs; the bad device's own load
    // runs on its own thread meanwhile and may meet them too (its every
    // rung landing zeros: a transfer failure). Either way the bad device's
    // bytes are refused with an error, never returned.
    assert!(
        matches!(
            e,
            Error::VerificationFailed { .. } | Error::TransferFailed { .. }
        ),
        "{e}"
    );
    assert!(!handle.injected().is_empty());
}

#[test]
fn bad_requests_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(mixed(dir.path())).unwrap();
    let e = load_replicated(&ckpt, &NAMES, &[], &small(None), &ViaHost::default()).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidLoadOptions {
                field: "devices",
                ..
            }
        ),
        "{e}"
    );
    let devices: Vec<Device> = (0..2).map(|_| Device::host()).collect();
    let e = load_replicated(
        &ckpt,
        &["a.bf16", "nope"],
        &devices,
        &small(None),
        &ViaHost::default(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::TensorNotFound { .. }), "{e}");
}

#[test]
fn via_host_refuses_a_copy_of_another_length() {
    let dev = Device::host();
    let s = dev.stream().unwrap();
    let a = s.clone_htod(&[1u8, 2, 3]).unwrap();
    let mut b = s.alloc_zeros::<u8>(2).unwrap();
    let e = ViaHost::default()
        .copy(&a.view(), &s, &mut b.view_mut(), &s)
        .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
}

#[test]
fn device_peer_refuses_a_copy_of_another_length() {
    let (d0, d1) = (Device::host(), Device::host());
    let (s0, s1) = (d0.stream().unwrap(), d1.stream().unwrap());
    let a = s0.clone_htod(&[1u8, 2, 3]).unwrap();
    let mut b = s1.alloc_zeros::<u8>(2).unwrap();
    let e = DevicePeer
        .copy(&a.view(), &s0, &mut b.view_mut(), &s1)
        .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    let mut c = s1.alloc_zeros::<u8>(3).unwrap();
    DevicePeer
        .copy(&a.view(), &s0, &mut c.view_mut(), &s1)
        .unwrap();
    assert_eq!(c.view().to_vec(&s1).unwrap(), [1, 2, 3]);
    // A view of the other device named as the source's stream's: refused.
    let e = DevicePeer
        .copy(&a.view(), &s1, &mut c.view_mut(), &s1)
        .unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
}

#[test]
fn owners_are_balanced_and_deterministic() {
    let sizes = [400, 20, 280, 120, 120, 4, 0];
    let o = plan_owners(&sizes, 3);
    assert_eq!(o, plan_owners(&sizes, 3));
    let mut loads = [0u64; 3];
    for (i, &d) in o.iter().enumerate() {
        loads[d] += sizes[i];
    }
    // Largest first to the least-loaded device: 400 | 280 | 120+120+20+4+0.
    assert_eq!(loads, [400, 280, 264]);
    assert!(plan_owners(&sizes, 0).is_empty());
    assert_eq!(plan_owners(&sizes, 1), vec![0; 7]);
}
