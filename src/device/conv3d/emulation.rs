//! The host backend's conv3d: the CPU implementation over host memory,
//! behind the same launch description the GPU kernels take.

use std::borrow::Cow;

use super::layout::standard_weight_layout;
use super::{Conv3dKernel, Conv3dLaunch};
use crate::conv3d::{
    conv3d_cpu, conv3d_cpu_with, Conv3dData, Conv3dGeometry, Conv3dProblem, CpuKernel,
};
use crate::device::info::DevicePtr;
use crate::dtype::DType;
use crate::error::{Error, Result};

unsafe fn host_slice<'a, T>(p: DevicePtr, len: usize) -> &'a [T] {
    if len == 0 {
        return &[];
    }
    // SAFETY: guaranteed by the caller (host "device" addresses are host
    // addresses).
    unsafe { std::slice::from_raw_parts(p.0 as usize as *const T, len) }
}

/// The host backend's `conv3d`: the CPU implementation over host memory
/// ([`Conv3dKernel::Naive`] with the portable CPU kernel,
/// [`Conv3dKernel::Tiled`] with the fastest one after undoing the tiled
/// weight layout), refusing what the GPU kernel would refuse.
///
/// # Safety
/// As [`super::Backend::conv3d`]: the launch's addresses are live host
/// allocations of the documented lengths, `output` exclusive.
pub(crate) unsafe fn host_conv3d(kernel: Conv3dKernel, a: &Conv3dLaunch) -> Result<()> {
    let g = &a.geometry;
    kernel.grid(g)?;
    if kernel == Conv3dKernel::Naive {
        a.plain("naive")?;
    }
    // SAFETY: a gate is one live u64 (the caller's guarantee).
    if unsafe { super::gate::host_gate_closed(a.gate) } {
        return Ok(());
    }
    match a.output_dtype {
        DType::F32 => {}
        DType::BF16 => {
            // The tiled kernels' bf16 output: computed in f32, rounded to
            // nearest even.
            let mut f = Vec::new();
            f.try_reserve_exact(g.output_len())
                .map_err(|_| Error::OutOfMemory {
                    backend: "host",
                    op: "conv3d bf16 output",
                    bytes: (g.output_len() as u64).saturating_mul(4),
                })?;
            f.resize(g.output_len(), 0f32);
            let widened = Conv3dLaunch {
                output: DevicePtr(f.as_mut_ptr() as usize as u64),
                output_dtype: DType::F32,
                gate: None,
                ..*a
            };
            // SAFETY: as the caller's, with the output now `f`, owned here.
            unsafe { host_conv3d(kernel, &widened) }?;
            // SAFETY: the caller guarantees `output_len` exclusive bf16s.
            let out = unsafe {
                std::slice::from_raw_parts_mut(
                    a.output.0 as usize as *mut half::bf16,
                    g.output_len(),
                )
            };
            for (o, v) in out.iter_mut().zip(&f) {
                *o = half::bf16::from_f32(*v);
            }
            return Ok(());
        }
        other => {
            return Err(Error::Conv3dDType {
                tensor: "output",
                dtype: other,
                expected: DType::F32,
            })
        }
    }
    let in_len: usize = g.input_shape().iter().product();
    let w_len: usize = g.weight_shape().iter().product();
    // SAFETY: the caller guarantees the lengths, alignment and exclusivity.
    let (bias, out) = unsafe {
        (
            a.bias.map(|b| host_slice::<f32>(b, g.out_channels)),
            std::slice::from_raw_parts_mut(a.output.0 as usize as *mut f32, g.output_len()),
        )
    };
    match a.dtype {
        DType::F32 => {
            // SAFETY: as above.
            let (x, w) = unsafe {
                (
                    host_slice::<f32>(a.input, in_len),
                    host_slice::<f32>(a.weight, w_len),
                )
            };
            host_run(kernel, g, x, w, bias, out)
        }
        DType::BF16 => {
            // SAFETY: as above.
            let (x, w) = unsafe {
                (
                    host_slice::<half::bf16>(a.input, in_len),
                    host_slice::<half::bf16>(a.weight, w_len),
                )
            };
            host_run(kernel, g, x, w, bias, out)
        }
        other => Err(Error::Conv3dDType {
            tensor: "input",
            dtype: other,
            expected: DType::F32,
        }),
    }
}

/// The two element types conv3d takes.
trait HostElem: Copy + Default {
    fn wrap(s: &[Self]) -> Conv3dData<'_>;
}
impl HostElem for f32 {
    fn wrap(s: &[f32]) -> Conv3dData<'_> {
        Conv3dData::F32(s)
    }
}
impl HostElem for half::bf16 {
    fn wrap(s: &[half::bf16]) -> Conv3dData<'_> {
        Conv3dData::BF16(s)
    }
}

fn host_run<T: HostElem>(
    kernel: Conv3dKernel,
    g: &Conv3dGeometry,
    x: &[T],
    w: &[T],
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<()> {
    let wrap = T::wrap;
    let w: Cow<'_, [T]> = match kernel {
        Conv3dKernel::Tiled => Cow::Owned(standard_weight_layout(g, w)),
        Conv3dKernel::Naive => Cow::Borrowed(w),
    };
    let p = Conv3dProblem::new(
        g.params,
        wrap(x),
        &g.input_shape(),
        wrap(&w),
        &g.weight_shape(),
        bias.map(Conv3dData::F32),
    )?;
    match kernel {
        Conv3dKernel::Tiled => conv3d_cpu(&p, out),
        Conv3dKernel::Naive => conv3d_cpu_with(&p, out, CpuKernel::Portable),
    }
}
