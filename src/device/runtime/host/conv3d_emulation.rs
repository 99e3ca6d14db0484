//! The host backend's conv3d kernels: the CPU implementations of
//! `crate::conv3d` over host memory, behind the same launch descriptors
//! (`device::raw::conv3d`) the GPU kernels take, refusing what the GPU
//! kernels refuse: the forward convolution, the backward ops, the weight
//! layouts, the flip and the zero insertion, and the gate they share with
//! the checks (`check_emulation.rs`).

use std::borrow::Cow;

use crate::conv3d::{
    conv3d_backward_cpu, conv3d_cpu, conv3d_cpu_with, flip_weight, zero_insert, Conv3dBackwardOp,
    Conv3dBackwardProblem, Conv3dData, Conv3dGeometry, Conv3dProblem, CpuKernel,
};
use crate::device::info::DevicePtr;
#[cfg(doc)]
use crate::device::raw::backend::{Backend, KernelOp};
use crate::device::raw::conv3d::{
    check_len, standard_weight_layout, tiled_wgrad_unsupported, Conv3dBackwardLaunch,
    Conv3dFlipLaunch, Conv3dKernel, Conv3dLaunch, Conv3dLayoutLaunch, Conv3dZeroInsertLaunch,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Whether a gate is given and closed (zero).
///
/// # Safety
/// A gate is one live, aligned `u64` of host memory (the host backend).
pub(crate) unsafe fn host_gate_closed(gate: Option<DevicePtr>) -> bool {
    match gate {
        None => false,
        // SAFETY: the caller's guarantee.
        Some(g) => unsafe { *(g.0 as usize as *const u64) == 0 },
    }
}

/// # Safety
/// `p` holds `len` writable `T`s that nothing else accesses meanwhile.
pub(super) unsafe fn host_slice_mut<'a, T>(p: DevicePtr, len: usize) -> &'a mut [T] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: guaranteed by the caller.
    unsafe { std::slice::from_raw_parts_mut(p.0 as usize as *mut T, len) }
}

/// # Safety
/// `p` holds `len` readable `T`s that nothing writes meanwhile.
pub(super) unsafe fn host_slice<'a, T>(p: DevicePtr, len: usize) -> &'a [T] {
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
/// As [`Backend::run`]: the launch's addresses are live host
/// allocations of the documented lengths, `output` exclusive.
pub(crate) unsafe fn host_conv3d(kernel: Conv3dKernel, a: &Conv3dLaunch) -> Result<()> {
    let g = &a.geometry;
    kernel.grid(g)?;
    if kernel == Conv3dKernel::Naive {
        a.plain("naive")?;
    }
    // SAFETY: a gate is one live u64 (the caller's guarantee).
    if unsafe { host_gate_closed(a.gate) } {
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

/// # Safety
/// `p` holds `len` readable elements of `dtype` (F32 or BF16) that nothing
/// writes meanwhile.
pub(super) unsafe fn backward_data<'a>(
    p: DevicePtr,
    dtype: DType,
    len: usize,
) -> Result<Conv3dData<'a>> {
    if len == 0 {
        return Ok(match dtype {
            DType::BF16 => Conv3dData::BF16(&[]),
            _ => Conv3dData::F32(&[]),
        });
    }
    let addr = p.0 as usize;
    // SAFETY: the caller's guarantees (host "device" addresses are host
    // addresses).
    unsafe {
        Ok(match dtype {
            DType::F32 => Conv3dData::F32(std::slice::from_raw_parts(addr as *const f32, len)),
            DType::BF16 => {
                Conv3dData::BF16(std::slice::from_raw_parts(addr as *const half::bf16, len))
            }
            other => {
                return Err(Error::Conv3dDType {
                    tensor: "grad_output",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        })
    }
}

/// The problem a launch describes, over host memory.
///
/// # Safety
/// The launch's operand addresses hold their documented lengths, unwritten
/// meanwhile; `bias_dtype` is the bias's.
pub(super) unsafe fn host_problem<'a>(
    a: &Conv3dBackwardLaunch,
    bias_dtype: DType,
) -> Result<Conv3dBackwardProblem<'a>> {
    let g = &a.geometry;
    // SAFETY: the caller's guarantees.
    unsafe {
        let dy = backward_data(a.grad_output, a.dtype, g.output_len())?;
        let other = match (a.other, a.op.other_len(g)) {
            (Some(p), Some(n)) => Some(backward_data(p, a.dtype, n)?),
            _ => None,
        };
        let bias = a
            .bias
            .map(|b| backward_data(b, bias_dtype, g.in_channels))
            .transpose()?;
        Conv3dBackwardProblem::new(a.op, *g, dy, other, bias)
    }
}

/// The host backend's [`KernelOp::Conv3dBackward`]: the CPU kernels
/// ([`conv3d_backward_cpu`]).
///
/// # Safety
/// As [`Backend::run`]: the launch's addresses are live host
/// allocations of the documented lengths, `output` exclusive.
pub(crate) unsafe fn host_conv3d_backward(a: &Conv3dBackwardLaunch) -> Result<()> {
    if let Some(reason) = a.op.unsupported(&a.geometry) {
        return Err(Error::Conv3dTier {
            tier: "naive",
            reason,
        });
    }
    // SAFETY: the caller's guarantees; the output does not overlap the
    // operands (it is borrowed mutably by the safe entry point).
    unsafe {
        let p = host_problem(a, DType::F32)?;
        let out = host_slice_mut::<f32>(a.output, a.output_len());
        conv3d_backward_cpu(&p, out)
    }
}

/// The host backend's [`KernelOp::Conv3dBackwardWeightTiled`]: the CPU
/// kernels, as [`KernelOp::Conv3dBackward`] (the result written whole, as
/// the GPU backends' memset and atomic adds leave it).
///
/// # Safety
/// As [`Backend::run`]: the launch's addresses are live host
/// allocations of the documented lengths, `output` exclusive.
pub(crate) unsafe fn host_conv3d_backward_weight_tiled(a: &Conv3dBackwardLaunch) -> Result<()> {
    if a.op != Conv3dBackwardOp::Weight {
        return Err(Error::Conv3dTier {
            tier: "tiled",
            reason: "the tiled backward kernel computes the weight gradient only",
        });
    }
    if let Some(reason) = tiled_wgrad_unsupported(&a.geometry) {
        return Err(Error::Conv3dTier {
            tier: "tiled",
            reason,
        });
    }
    // SAFETY: the caller's guarantees, forwarded.
    unsafe { host_conv3d_backward(a) }
}

/// The host backend's [`KernelOp::Conv3dLayout`]: [`Conv3dWeightLayout::arrange`].
///
/// # Safety
/// As [`Backend::run`]: `src` holds the weight, `dst` the layout's
/// length, exclusive.
pub(crate) unsafe fn host_conv3d_layout(a: &Conv3dLayoutLaunch) -> Result<()> {
    // SAFETY: a gate is one live u64 (the caller's guarantee).
    if unsafe { host_gate_closed(a.gate) } {
        return Ok(());
    }
    let g = &a.geometry;
    let (n, m) = (g.weight_shape().iter().product(), a.layout.len(g));
    match a.dtype {
        // SAFETY: the caller's guarantees.
        DType::F32 => unsafe { arrange_into::<f32>(a, n, m) },
        // SAFETY: the caller's guarantees.
        DType::BF16 => unsafe { arrange_into::<half::bf16>(a, n, m) },
        other => Err(Error::Conv3dDType {
            tensor: "weight",
            dtype: other,
            expected: DType::F32,
        }),
    }
}

/// # Safety
/// As [`host_conv3d_layout`], with `n` source and `m` destination elements.
unsafe fn arrange_into<T: Copy + Default + Send + Sync>(
    a: &Conv3dLayoutLaunch,
    n: usize,
    m: usize,
) -> Result<()> {
    // SAFETY: the caller's guarantees.
    let (src, dst) = unsafe { (host_slice::<T>(a.src, n), host_slice_mut::<T>(a.dst, m)) };
    let arranged = a.layout.arrange(&a.geometry, src)?;
    check_len("conv3d layout destination", dst.len(), arranged.len())?;
    dst.copy_from_slice(&arranged);
    Ok(())
}

/// The host backend's [`KernelOp::Conv3dFlipWeight`]: [`flip_weight`].
///
/// # Safety
/// As [`Backend::run`]: `src` and `dst` are live host
/// allocations of the weight's length, `dst` exclusive.
pub(crate) unsafe fn host_conv3d_flip(a: &Conv3dFlipLaunch) -> Result<()> {
    let n = a.len();
    if n == 0 {
        return Ok(());
    }
    // SAFETY: the caller's guarantees (host "device" addresses are host
    // addresses); the element size matches the dtype.
    unsafe {
        match a.dtype {
            DType::F32 => flip_typed::<u32>(a, n),
            DType::BF16 => flip_typed::<u16>(a, n),
            other => Err(Error::Conv3dDType {
                tensor: "weight",
                dtype: other,
                expected: DType::F32,
            }),
        }
    }
}

/// # Safety
/// As [`host_conv3d_flip`], with `n` elements of `T`'s size each way.
unsafe fn flip_typed<T: Copy + Send + Sync>(a: &Conv3dFlipLaunch, n: usize) -> Result<()> {
    // SAFETY: the caller's guarantees.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts(a.src.0 as usize as *const T, n),
            std::slice::from_raw_parts_mut(a.dst.0 as usize as *mut T, n),
        )
    };
    flip_weight(&a.geometry, src, dst)
}

/// The host backend's [`KernelOp::Conv3dZeroInsert`]: [`zero_insert`].
///
/// # Safety
/// As [`Backend::run`]: `src` holds `dy`, `dst` the
/// destination's length, exclusive.
pub(crate) unsafe fn host_conv3d_zero_insert(a: &Conv3dZeroInsertLaunch) -> Result<()> {
    let (n, m) = (a.geometry.output_len(), a.len());
    if n == 0 || m == 0 {
        return Ok(());
    }
    // SAFETY: the caller's guarantees; the element size matches the dtype.
    unsafe {
        match a.dtype {
            DType::F32 => insert_typed::<u32>(a, n, m),
            DType::BF16 => insert_typed::<u16>(a, n, m),
            other => Err(Error::Conv3dDType {
                tensor: "grad_output",
                dtype: other,
                expected: DType::F32,
            }),
        }
    }
}

/// # Safety
/// As [`host_conv3d_zero_insert`], with `n` source and `m` destination
/// elements of `T`'s size.
unsafe fn insert_typed<T: Copy + Default + Send + Sync>(
    a: &Conv3dZeroInsertLaunch,
    n: usize,
    m: usize,
) -> Result<()> {
    // SAFETY: the caller's guarantees.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts(a.src.0 as usize as *const T, n),
            std::slice::from_raw_parts_mut(a.dst.0 as usize as *mut T, m),
        )
    };
    zero_insert(&a.geometry, a.expanded, src, dst)
}
