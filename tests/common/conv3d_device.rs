//! Shared by the tests of the conv3d chain over device memory
//! (`tests/conv3d/device_checks.rs`, `tests/conv3d/device_kernels.rs`):
//! the tiled kernel's case, the chain without its vendor tier, operands
//! uploaded as f32 or bf16, and one `run_device` call read back.

use half::bf16;
use rocm_safe::conv3d::{Conv3dData, Conv3dProblem};
use rocm_safe::conv3d_chain::{Conv3dChain, Conv3dReport, DeviceConv3dData, TierKind};
use rocm_safe::device::{Device, Stream};
use rocm_safe::Result;

use super::conv3d::{cases, Case, Data};

/// A case the tiled kernel takes (16 output channels, stride, dilation).
pub fn tiled_case() -> (Case, Data) {
    let case = cases()
        .into_iter()
        .find(|c| c.name == "tiled: stride 2, dilation, 16 out")
        .unwrap();
    let data = Data::new(&case);
    (case, data)
}

/// The chain of `dev` without its vendor tier (so the tiled kernel runs
/// first on every backend).
pub fn chain(dev: &Device) -> Conv3dChain {
    let mut c = Conv3dChain::for_device(dev);
    c.options_mut().forbid = vec![TierKind::Vendor];
    c
}

/// The operands of one call uploaded to `s` (bias as f32 or bf16).
pub struct Uploaded {
    pub x: DeviceData,
    pub w: DeviceData,
    pub b: Option<DeviceData>,
}

pub enum DeviceData {
    F32(rocm_safe::device::DeviceBuffer<f32>),
    BF16(rocm_safe::device::DeviceBuffer<bf16>),
}

impl DeviceData {
    pub fn f32(s: &Stream, v: &[f32]) -> DeviceData {
        DeviceData::F32(s.clone_htod(v).unwrap())
    }
    pub fn bf16(s: &Stream, v: &[bf16]) -> DeviceData {
        DeviceData::BF16(s.clone_htod(v).unwrap())
    }
    pub fn data(&self) -> DeviceConv3dData<'_> {
        match self {
            DeviceData::F32(b) => DeviceConv3dData::F32(b.view()),
            DeviceData::BF16(b) => DeviceConv3dData::BF16(b.view()),
        }
    }
}

pub fn upload(s: &Stream, p: &Conv3dProblem<'_>, bias_bf16: bool) -> Uploaded {
    let up = |d: Conv3dData<'_>| match d {
        Conv3dData::F32(v) => DeviceData::f32(s, v),
        Conv3dData::BF16(v) => DeviceData::bf16(s, v),
        other => panic!("no upload for {other:?}"),
    };
    let b = p.bias.map(|b| match b {
        Conv3dData::F32(v) if bias_bf16 => {
            let h: Vec<bf16> = v.iter().map(|&x| bf16::from_f32(x)).collect();
            DeviceData::bf16(s, &h)
        }
        other => up(other),
    });
    Uploaded {
        x: up(p.input),
        w: up(p.weight),
        b,
    }
}

/// `run_device` of `p` on a new stream of `dev`: the report or error and
/// the output read back.
pub fn run_device(
    chain: &Conv3dChain,
    dev: &Device,
    p: &Conv3dProblem<'_>,
    u: &Uploaded,
) -> (Result<Conv3dReport>, Vec<f32>) {
    let s = dev.stream().unwrap();
    let g = p.geometry;
    let mut out = s.alloc_zeros::<f32>(g.output_len()).unwrap();
    let r = chain.run_device(
        &s,
        g.params,
        u.x.data(),
        &g.input_shape(),
        u.w.data(),
        &g.weight_shape(),
        u.b.as_ref().map(DeviceData::data),
        &mut out.view_mut(),
    );
    (r, out.to_vec().unwrap())
}

/// The problem with its bias rounded to bf16 (what a bf16 bias holds).
pub fn with_bf16_bias<'a>(p: &Conv3dProblem<'a>, b: &'a [bf16]) -> Conv3dProblem<'a> {
    Conv3dProblem {
        bias: Some(Conv3dData::BF16(b)),
        ..*p
    }
}
