//! Shared by the tests of conv3d gradients and `conv_transpose3d`
//! (`tests/conv3d_backward.rs`, `tests/conv3d_transpose.rs`): bf16
//! operands, the comparison with the f64 backward reference, the chain of
//! a device, and operands uploaded as f32 or bf16.

use half::bf16;
use rocm_safe::conv3d::{backward_reference_point, Conv3dBackwardProblem, Conv3dData};
use rocm_safe::conv3d_chain::{Conv3dChain, DeviceConv3dData};
use rocm_safe::device::{Device, DeviceBuffer, Stream};

pub fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

/// Asserts `out` equals the f64 reference of `p` within `rel` of each
/// element's magnitude, everywhere.
pub fn assert_backward_close(what: &str, p: &Conv3dBackwardProblem<'_>, out: &[f32], rel: f64) {
    assert_eq!(out.len(), p.output_len(), "{what}: result length");
    for (i, &got) in out.iter().enumerate() {
        let r = backward_reference_point(p, i).unwrap();
        let tol = rel * r.magnitude + 1e-30;
        assert!(
            (f64::from(got) - r.value).abs() <= tol,
            "{what}: {} index {i} of {:?}: got {got}, expected {} (tolerance {tol:e})",
            p.op,
            p.output_shape(),
            r.value
        );
    }
}

/// The chain of `dev` (its vendor tier is skipped: no backward binding).
pub fn chain(dev: &Device) -> Conv3dChain {
    Conv3dChain::for_device(dev)
}

pub enum Buf {
    F32(DeviceBuffer<f32>),
    BF16(DeviceBuffer<bf16>),
}

impl Buf {
    pub fn up(s: &Stream, d: Conv3dData<'_>) -> Buf {
        match d {
            Conv3dData::F32(v) => Buf::F32(s.clone_htod(v).unwrap()),
            Conv3dData::BF16(v) => Buf::BF16(s.clone_htod(v).unwrap()),
            other => panic!("no buffer for {other:?}"),
        }
    }
    pub fn data(&self) -> DeviceConv3dData<'_> {
        match self {
            Buf::F32(b) => DeviceConv3dData::F32(b.view()),
            Buf::BF16(b) => DeviceConv3dData::BF16(b.view()),
        }
    }
}
