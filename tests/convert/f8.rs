//! FP8 (e4m3fn, e5m2) sources: the scalar functions exhaustively against an
//! independent f64 decode, the bulk loops, the device path over the host
//! backend and `Faults`, the reader and the loader (`dtype=` conversions of
//! an fp8 checkpoint), and the per-device self-test.

use std::path::{Path, PathBuf};

use rocm_safe::convert::{self, scalar, table};
use rocm_safe::device::faults::{FaultKind, FaultPlan, Faults, When};
use rocm_safe::device::{host::HostBackend, ConvertOp, Device};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{LoadOptions, Loader, Rung};
use rocm_safe::verify;
use rocm_safe::{DType, Error};

/// The value of an f8 code, decoded from the format's definition in f64
/// (no shifts into f32 fields): e4m3fn has bias 7, subnormals, no
/// infinities and NaN at `S.1111.111`; e5m2 is IEEE-like with bias 15.
fn decode(d: DType, b: u8) -> f64 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let (e, m, bias, mant, ieee) = match d {
        DType::F8_E4M3 => (i32::from((b >> 3) & 0xf), f64::from(b & 7), 7, 8.0, false),
        DType::F8_E5M2 => (i32::from((b >> 2) & 0x1f), f64::from(b & 3), 15, 4.0, true),
        _ => unreachable!(),
    };
    let emax = if ieee { 31 } else { 15 };
    if ieee && e == emax {
        return if m == 0.0 {
            sign * f64::INFINITY
        } else {
            f64::NAN
        };
    }
    if !ieee && e == emax && m == 7.0 {
        return f64::NAN;
    }
    if e == 0 {
        sign * (m / mant) * 2f64.powi(1 - bias)
    } else {
        sign * (1.0 + m / mant) * 2f64.powi(e - bias)
    }
}

fn f8_to_f32(d: DType, b: u8) -> u32 {
    match d {
        DType::F8_E4M3 => scalar::f8_e4m3_to_f32(b),
        _ => scalar::f8_e5m2_to_f32(b),
    }
}

const F8: [DType; 2] = [DType::F8_E4M3, DType::F8_E5M2];

#[test]
fn every_code_converts_exactly_to_f32() {
    for d in F8 {
        let (mut nans, mut infs) = (0, 0);
        for b in 0..=u8::MAX {
            let want = decode(d, b);
            let got = f32::from_bits(f8_to_f32(d, b));
            if want.is_nan() {
                nans += 1;
                assert!(got.is_nan(), "{d} {b:#04x}: {got}");
                // Sign kept.
                assert_eq!(got.is_sign_negative(), b & 0x80 != 0, "{d} {b:#04x}");
            } else {
                // Exact, and -0 stays -0 (compare bits through f64).
                assert_eq!(f64::from(got).to_bits(), want.to_bits(), "{d} {b:#04x}");
                infs += usize::from(want.is_infinite());
            }
        }
        match d {
            DType::F8_E4M3 => assert_eq!((nans, infs), (2, 0)),
            _ => assert_eq!((nans, infs), (6, 2)),
        }
    }
    // Landmarks: largest finite, smallest subnormal, smallest normal; and
    // the NaN PyTorch gives for e4m3fn's 0x7F.
    assert_eq!(f32::from_bits(scalar::f8_e4m3_to_f32(0x7e)), 448.0);
    assert_eq!(f32::from_bits(scalar::f8_e4m3_to_f32(0x01)), 2f32.powi(-9));
    assert_eq!(f32::from_bits(scalar::f8_e4m3_to_f32(0x08)), 2f32.powi(-6));
    assert_eq!(scalar::f8_e4m3_to_f32(0x7f), 0x7ff0_0000);
    assert_eq!(f32::from_bits(scalar::f8_e5m2_to_f32(0x7b)), 57344.0);
    assert_eq!(f32::from_bits(scalar::f8_e5m2_to_f32(0x01)), 2f32.powi(-16));
    assert_eq!(scalar::f8_e5m2_to_f32(0xfc), f32::NEG_INFINITY.to_bits());
}

#[test]
fn every_code_converts_exactly_to_bf16_and_f16_in_bulk() {
    let codes: Vec<u8> = (0..=u8::MAX).collect();
    for d in F8 {
        for to in [DType::F32, DType::BF16, DType::F16] {
            let row = table::find(d, to).unwrap();
            assert!(row.lossless);
            let mut out = vec![0u8; 256 * row.dst_size];
            convert::convert_bytes(d, &codes, to, &mut out).unwrap();
            let mut reference = vec![0u8; out.len()];
            scalar::convert_bytes_reference(d, &codes, to, &mut reference).unwrap();
            assert_eq!(out, reference, "{d}->{to}");
            for (b, o) in codes.iter().zip(out.chunks_exact(row.dst_size)) {
                let got = match to {
                    DType::F32 => f64::from(f32::from_le_bytes(o.try_into().unwrap())),
                    DType::BF16 => f64::from(half::bf16::from_le_bytes(o.try_into().unwrap())),
                    _ => f64::from(half::f16::from_le_bytes(o.try_into().unwrap())),
                };
                let want = decode(d, *b);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "{d}->{to} of {b:#04x}: {got} vs {want}"
                );
            }
        }
    }
    // Not targets.
    let mut out = [0u8; 4];
    let e = convert::convert_bytes(DType::F32, &[0; 4], DType::F8_E4M3, &mut out).unwrap_err();
    assert!(matches!(e, Error::UnsupportedConversion { .. }), "{e}");
}

fn host() -> Device {
    Device::from_backend(Box::new(HostBackend::new()))
}

#[test]
fn the_device_path_converts_f8_to_f32_and_refuses_the_rest() {
    let dev = host();
    let s = dev.stream().unwrap();
    let codes: Vec<u8> = (0..=u8::MAX).cycle().take(1000).collect();
    let src = s.clone_htod(&codes).unwrap();
    for d in F8 {
        assert!(ConvertOp {
            from: d,
            to: DType::F32
        }
        .on_device());
        let mut dst = s.alloc::<u8>(4 * codes.len()).unwrap();
        s.convert_raw(&src.view(), d, &mut dst.view_mut(), DType::F32)
            .unwrap();
        let mut want = vec![0u8; 4 * codes.len()];
        convert::convert_bytes(d, &codes, DType::F32, &mut want).unwrap();
        assert_eq!(dst.to_vec().unwrap(), want, "{d}");
        // No device kernel for f8 -> bf16 (the CPU converts it), no fused
        // kernel for f8 -> f32.
        let mut d16 = s.alloc::<u8>(2 * codes.len()).unwrap();
        let e = s
            .convert_raw(&src.view(), d, &mut d16.view_mut(), DType::BF16)
            .unwrap_err();
        assert!(matches!(e, Error::UnsupportedConversion { .. }), "{e}");
        let mut acc = s.alloc_zeros::<u64>(1).unwrap();
        let e = s
            .convert_fingerprint_raw(
                &src.view(),
                d,
                &mut dst.view_mut(),
                DType::F32,
                &mut acc.view_mut(),
            )
            .unwrap_err();
        assert!(matches!(e, Error::UnsupportedConversion { .. }), "{e}");
        // Room for a different count; an output not aligned to f32.
        let e = s
            .convert_raw(
                &src.view(),
                d,
                &mut dst.slice_mut(..4 * codes.len() - 4).unwrap(),
                DType::F32,
            )
            .unwrap_err();
        assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
        let e = s
            .convert_raw(
                &src.view().slice(..999).unwrap(),
                d,
                &mut dst.slice_mut(2..3998).unwrap(),
                DType::F32,
            )
            .unwrap_err();
        assert!(matches!(e, Error::Misaligned { align: 4, .. }), "{e}");
    }
}

#[test]
fn the_self_test_covers_the_f8_kernels_and_catches_a_bad_one() {
    let dev = host();
    let r = verify::self_test(&dev.stream().unwrap()).unwrap();
    assert!(r.all_passed(), "{r:#?}");
    for d in F8 {
        let op = ConvertOp {
            from: d,
            to: DType::F32,
        };
        assert!(r.trusted(op));
    }
    let (f, _h) = Faults::new(
        HostBackend::new(),
        FaultPlan::one(FaultKind::ConvertWritesZeros, When::Always),
    );
    let dev = Device::from_backend(Box::new(f));
    let r = verify::self_test(&dev.stream().unwrap()).unwrap();
    let k = r
        .kernels
        .iter()
        .find(|k| k.kernel == "convert f8_e4m3->f32")
        .unwrap();
    assert_eq!(k.tested, 256);
    // Every code but +0 converts to non-zero bits (-0 is 0x8000_0000).
    assert_eq!(k.mismatches, 255);
    assert_eq!(k.first_mismatch, Some((1, 0x3b00_0000, 0)));
}

/// An fp8 checkpoint: both formats, every code, and a bf16 tensor.
fn checkpoint(dir: &Path) -> PathBuf {
    let path = dir.join("fp8.safetensors");
    let specs = [
        ("e4m3", DType::F8_E4M3, vec![4u64, 256]),
        ("e5m2", DType::F8_E5M2, vec![1024]),
        ("b", DType::BF16, vec![3]),
    ];
    let mut w = SafeTensorsWriter::create(
        &path,
        specs
            .iter()
            .map(|(n, d, s)| TensorSpec::new(*n, *d, s.clone())),
        None,
    )
    .unwrap();
    let codes: Vec<u8> = (0..=u8::MAX).cycle().take(1024).collect();
    w.write_tensor("e4m3", &codes).unwrap();
    w.write_tensor("e5m2", &codes).unwrap();
    w.write_tensor("b", &[0, 0x3f, 0x80, 0x3f, 0, 0xc0])
        .unwrap();
    w.finish().unwrap()
}

fn opts(to: DType) -> LoadOptions {
    LoadOptions::to_dtype(to)
        .with_buffer_bytes(64 * 1024)
        .with_ring_buffers(2)
        .with_small_chunk_bytes(16 * 1024)
}

fn want(d: DType, to: DType) -> Vec<u8> {
    let codes: Vec<u8> = (0..=u8::MAX).cycle().take(1024).collect();
    let mut out = vec![0u8; 1024 * to.size().unwrap()];
    convert::convert_bytes(d, &codes, to, &mut out).unwrap();
    out
}

#[test]
fn the_reader_converts_fp8_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    for (name, d) in [("e4m3", DType::F8_E4M3), ("e5m2", DType::F8_E5M2)] {
        for to in [DType::F32, DType::BF16, DType::F16] {
            assert_eq!(ckpt.read_converted_bytes(name, to).unwrap(), want(d, to));
        }
        let stored = ckpt.read_converted_bytes(name, d).unwrap();
        assert_eq!(stored.len(), 1024);
    }
}

#[test]
fn a_load_converts_an_fp8_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    // To f32: the device kernel on the ring.
    let dev = host();
    let loaded = Loader::new(&dev, opts(DType::F32))
        .unwrap()
        .load_all(&ckpt)
        .unwrap();
    assert!(loaded.report.all_fast(), "{}", loaded.report);
    for (name, d) in [("e4m3", DType::F8_E4M3), ("e5m2", DType::F8_E5M2)] {
        let t = loaded.report.tensor(name).unwrap();
        assert_eq!(
            (t.rung, t.out_dtype, t.routed.as_deref()),
            (Rung::PinnedRing, DType::F32, None)
        );
        let got: Vec<f32> = loaded.get(name).unwrap().to_vec().unwrap();
        assert_eq!(
            bytemuck::cast_slice::<f32, u8>(&got),
            &want(d, DType::F32)[..]
        );
    }
    // To f16: no device kernel, so the loader routes it to the CPU rung.
    let loaded = Loader::new(&dev, opts(DType::F16))
        .unwrap()
        .load_all(&ckpt)
        .unwrap();
    let t = loaded.report.tensor("e5m2").unwrap();
    assert_eq!(t.rung, Rung::CpuConvert, "{}", loaded.report);
    assert!(t.routed.as_deref().unwrap().contains("no device kernel"));
    let got: Vec<half::f16> = loaded.get("e5m2").unwrap().to_vec().unwrap();
    assert_eq!(
        bytemuck::cast_slice::<half::f16, u8>(&got),
        &want(DType::F8_E5M2, DType::F16)[..]
    );
}

#[test]
fn a_bad_f8_kernel_is_caught_and_the_load_stays_exact() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = Checkpoint::open(checkpoint(dir.path())).unwrap();
    // The first conversion writes zeros: the output check catches it on
    // the ring and a lower rung serves the tensor exactly.
    let (f, h) = Faults::new(
        HostBackend::new(),
        FaultPlan::one(FaultKind::ConvertWritesZeros, When::Nth(0)),
    );
    let dev = Device::from_backend(Box::new(f));
    let o = opts(DType::F32).with_self_test(false);
    let loaded = Loader::new(&dev, o).unwrap().load_all(&ckpt).unwrap();
    assert_eq!(h.injected().len(), 1);
    let bad: Vec<_> = loaded
        .report
        .tensors
        .iter()
        .filter(|t| !t.attempts.is_empty())
        .collect();
    assert_eq!(bad.len(), 1, "{}", loaded.report);
    assert_ne!(bad[0].rung, Rung::PinnedRing);
    for (name, d) in [("e4m3", DType::F8_E4M3), ("e5m2", DType::F8_E5M2)] {
        let got: Vec<f32> = loaded.get(name).unwrap().to_vec().unwrap();
        assert_eq!(
            bytemuck::cast_slice::<f32, u8>(&got),
            &want(d, DType::F32)[..]
        );
    }
    // Every f8 conversion is bad: the self-test finds out first, and the
    // loader never trusts the kernel.
    let (f, _h) = Faults::new(
        HostBackend::new(),
        FaultPlan::one(FaultKind::ConvertWritesZeros, When::Always),
    );
    let dev = Device::from_backend(Box::new(f));
    let loaded = Loader::new(&dev, opts(DType::F32))
        .unwrap()
        .load_all(&ckpt)
        .unwrap();
    let t = loaded.report.tensor("e4m3").unwrap();
    assert_eq!(t.rung, Rung::CpuConvert, "{}", loaded.report);
    let got: Vec<f32> = loaded.get("e4m3").unwrap().to_vec().unwrap();
    assert_eq!(
        bytemuck::cast_slice::<f32, u8>(&got),
        &want(DType::F8_E4M3, DType::F32)[..]
    );
}
