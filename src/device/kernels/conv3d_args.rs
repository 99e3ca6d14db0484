//! The by-value argument block of the conv3d kernels ([`Conv3dArgs`]):
//! one of the argument types every launch marshals
//! ([`KernelArg::Conv3d`](super::KernelArg::Conv3d)), filled from a
//! geometry by the conv3d launches (`runtime/gpu/conv3d_launch.rs`).

use crate::conv3d::Conv3dGeometry;

/// The sizes a conv3d kernel gets by value (`rs_conv3d_args` in
/// conv3d.hip, field for field).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Conv3dArgs {
    pub(crate) n: u64,
    pub(crate) c: u64,
    pub(crate) d: u64,
    pub(crate) h: u64,
    pub(crate) w: u64,
    pub(crate) k: u64,
    pub(crate) kd: u64,
    pub(crate) kh: u64,
    pub(crate) kw: u64,
    pub(crate) od: u64,
    pub(crate) oh: u64,
    pub(crate) ow: u64,
    pub(crate) sd: u64,
    pub(crate) sh: u64,
    pub(crate) sw: u64,
    pub(crate) pd: u64,
    pub(crate) ph: u64,
    pub(crate) pw: u64,
    pub(crate) dd: u64,
    pub(crate) dh: u64,
    pub(crate) dw: u64,
    pub(crate) groups: u64,
    pub(crate) has_bias: u64,
}

// 23 u64s, no padding: the kernel's struct exactly.
const _: () = assert!(std::mem::size_of::<Conv3dArgs>() == 23 * 8);

impl Conv3dArgs {
    /// The sizes of `g`, with or without a bias.
    pub(crate) fn of(g: &Conv3dGeometry, has_bias: bool) -> Self {
        let u = |v: usize| v as u64;
        let p = &g.params;
        Conv3dArgs {
            n: u(g.batch),
            c: u(g.in_channels),
            d: u(g.input[0]),
            h: u(g.input[1]),
            w: u(g.input[2]),
            k: u(g.out_channels),
            kd: u(g.kernel[0]),
            kh: u(g.kernel[1]),
            kw: u(g.kernel[2]),
            od: u(g.output[0]),
            oh: u(g.output[1]),
            ow: u(g.output[2]),
            sd: u(p.stride[0]),
            sh: u(p.stride[1]),
            sw: u(p.stride[2]),
            pd: u(p.padding[0]),
            ph: u(p.padding[1]),
            pw: u(p.padding[2]),
            dd: u(p.dilation[0]),
            dh: u(p.dilation[1]),
            dw: u(p.dilation[2]),
            groups: u(p.groups),
            has_bias: u64::from(has_bias),
        }
    }
}
