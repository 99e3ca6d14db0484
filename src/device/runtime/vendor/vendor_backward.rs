//! The vendor call of the data and weight gradients
//! ([`vendor_conv3d_backward`]), which both GPU runtimes make for
//! [`KernelOp::Conv3dBackwardVendor`](crate::device::raw::KernelOp::Conv3dBackwardVendor).
//!
//! The libraries compute a gradient in the operands' dtype (cuDNN's legacy
//! API and MIOpen take `dy`, the other operand and the result in one
//! dtype): bf16 operands would give a bf16 gradient, 8 bits of mantissa
//! where the chain's other tiers deliver f32. So bf16 operands are widened
//! to f32 on the device first (the conversion table's `convert_bf16_f32`
//! kernel, exact), and the library always runs in f32 with f32
//! accumulation (cuDNN: `CUDNN_FMA_MATH`, no TF32), writing the caller's
//! f32 result directly. A Data bias (the transposed convolution's) is added
//! after by the forward vendor call's epilogue kernel, `conv3d_bias_f32`,
//! over the result's channels.

use super::{free_kept, settle, take_buffer, Kept, VendorConv};
use crate::conv3d::Conv3dBackwardOp;
use crate::device::info::{ConvertOp, DevicePtr, RawStream};
use crate::device::kernels::{Kernel, KernelArg, KernelCall};
use crate::device::raw::backend::{Driver, KernelOp};
use crate::device::raw::conv3d::Conv3dBackwardLaunch;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// What the vendor tier refuses among the backward ops: the bias gradient
/// (a reduction of `dy`, no library call), dtypes other than f32 and bf16,
/// a bias outside Data, a missing second operand, zero-size calls, and a
/// transposed geometry whose `dy` is not the forward output of its input
/// ([`crate::conv3d::Conv3dGeometry::output_is_forward`]: the libraries
/// check it).
pub(crate) fn refusal(a: &Conv3dBackwardLaunch) -> Option<Error> {
    let tier = |reason| {
        Some(Error::Conv3dTier {
            tier: "vendor",
            reason,
        })
    };
    if !matches!(a.dtype, DType::F32 | DType::BF16) {
        return Some(Error::Conv3dDType {
            tensor: "grad_output",
            dtype: a.dtype,
            expected: DType::F32,
        });
    }
    match (a.op, a.other, a.bias) {
        (Conv3dBackwardOp::Bias, ..) => tier("the bias gradient is not a vendor call"),
        (_, None, _) => tier("a backward op without its second operand"),
        (Conv3dBackwardOp::Weight, _, Some(_)) => tier("only the data op takes a bias"),
        _ if !a.geometry.output_is_forward() => tier(NOT_FORWARD),
        _ => a.op.unsupported(&a.geometry).and_then(tier),
    }
}

/// Why the libraries refuse a transposed geometry whose output_padding
/// reaches the stride.
pub(crate) const NOT_FORWARD: &str = "dy is not the forward output of the input \
     (a conv_transpose3d output_padding at or past the stride): the vendor libraries refuse it";

/// `a` with f32 operands at `dy` and `other`, and no bias: what the
/// library computes.
fn f32_launch(a: &Conv3dBackwardLaunch, dy: DevicePtr, other: DevicePtr) -> Conv3dBackwardLaunch {
    Conv3dBackwardLaunch {
        dtype: DType::F32,
        grad_output: dy,
        other: Some(other),
        bias: None,
        ..*a
    }
}

/// The epilogue adding the Data op's f32 bias (one per input channel of
/// the forward convolution) to the result `[N, C, D, H, W]`: the forward
/// vendor call's `conv3d_bias_f32(float* y, const float* bias, u64 total,
/// u64 spatial, u64 k)`, `y[i] += bias[(i / spatial) % k]`, with the
/// input's spatial size and channels.
pub(crate) fn bias_epilogue(a: &Conv3dBackwardLaunch, bias: DevicePtr, mps: u32) -> KernelCall {
    let g = &a.geometry;
    let total = a.output_len() as u64;
    KernelCall::one_d(
        Kernel::Conv3dBiasF32,
        total,
        mps,
        vec![
            KernelArg::U64(a.output.0),
            KernelArg::U64(bias.0),
            KernelArg::U64(total),
            KernelArg::U64(g.input.iter().product::<usize>() as u64),
            KernelArg::U64(g.in_channels as u64),
        ],
    )
}

/// The widening of `n` bf16 at `src` into f32 at `dst`.
fn widen(src: DevicePtr, dst: DevicePtr, n: usize, mps: u32) -> Result<KernelCall> {
    let op = KernelOp::Convert {
        op: ConvertOp {
            from: DType::BF16,
            to: DType::F32,
        },
        src,
        dst,
        n: n as u64,
    };
    KernelCall::for_op(&op, mps)
}

/// The bytes of the f32 copies of `dy` and the other operand that bf16
/// operands are widened into (none for f32 operands).
fn widened_bytes(a: &Conv3dBackwardLaunch) -> Result<[usize; 2]> {
    if a.dtype != DType::BF16 {
        return Ok([0, 0]);
    }
    let f32_bytes = |n: Option<usize>| {
        n.and_then(|n| n.checked_mul(4)).ok_or(Error::Conv3dTier {
            tier: "vendor",
            reason: "an operand's f32 copy does not fit in memory",
        })
    };
    let g = &a.geometry;
    Ok([
        f32_bytes(Some(g.output_len()))?,
        f32_bytes(a.op.other_len(g))?,
    ])
}

/// Takes the kept buffers of `slots` for `bytes` each (none for 0); on an
/// error frees those already taken.
///
/// # Safety
/// As [`take_buffer`] for every slot.
unsafe fn take_all<const N: usize>(
    backend: &dyn Driver,
    slots: [&mut Kept; N],
    bytes: [usize; N],
) -> Result<[Kept; N]> {
    let mut out: [Kept; N] = [None; N];
    for (i, (slot, b)) in slots.into_iter().zip(bytes).enumerate() {
        // SAFETY: the caller's guarantees.
        match unsafe { take_buffer(backend, slot, b) } {
            Ok(k) => out[i] = k,
            Err(e) => {
                for k in out.iter_mut().take(i) {
                    // SAFETY: taken just above; nothing was queued on it.
                    let _ = unsafe { free_kept(backend, k.take()) };
                }
                return Err(e);
            }
        }
    }
    Ok(out)
}

/// The vendor call of a data or weight gradient: for bf16 operands the
/// widening of both into f32 buffers, the workspace, the library's
/// backward call into the caller's f32 result, the bias epilogue (Data
/// with a bias) through `launch`, then a wait for `s`. The buffers are the
/// library state's kept ones ([`super::VendorBuffers`]) when large enough,
/// kept or freed after the wait as [`super::vendor_conv3d`] does.
///
/// # Safety
/// As [`crate::device::raw::Backend::run`] of
/// [`KernelOp::Conv3dBackwardVendor`] for `a` and `s` on `backend`;
/// `launch` queues a kernel call on `s` of `backend`, and `lib` belongs to
/// `backend`'s device, which is current.
pub(crate) unsafe fn vendor_conv3d_backward(
    backend: &dyn Driver,
    lib: &mut dyn VendorConv,
    a: &Conv3dBackwardLaunch,
    s: RawStream,
    launch: &dyn Fn(KernelCall) -> Result<()>,
) -> Result<()> {
    if let Some(e) = refusal(a) {
        return Err(e);
    }
    let (Some(other), Some(other_len)) = (a.other, a.op.other_len(&a.geometry)) else {
        return Err(Error::Conv3dTier {
            tier: "vendor",
            reason: "a backward op without its second operand",
        });
    };
    let dy_len = a.geometry.output_len();
    let mps = backend.info().multiprocessors;
    let widened_bytes = widened_bytes(a)?;
    let ws_bytes = lib.backward_workspace(a.op, &a.geometry)?;
    let bufs = lib.buffers();
    let [c, d] = &mut bufs.widened;
    // SAFETY: the kept buffers are this device's and idle (every vendor
    // call waits for its stream before returning).
    let [wdy, wother, ws] = unsafe {
        take_all(
            backend,
            [c, d, &mut bufs.workspace],
            [widened_bytes[0], widened_bytes[1], ws_bytes],
        )
    }?;
    let run = (|| {
        let (dy, o) = match (wdy, wother) {
            (Some((p, _)), Some((q, _))) => {
                launch(widen(a.grad_output, p, dy_len, mps)?)?;
                launch(widen(other, q, other_len, mps)?)?;
                (p, q)
            }
            _ => (a.grad_output, other),
        };
        let f = f32_launch(a, dy, o);
        // SAFETY: the operands are the caller's f32 ranges or f32 buffers
        // of their lengths (written by the widening, queued before on
        // `s`); the result is the caller's; the workspace has at least the
        // size the library asked for; `s` is live.
        unsafe { lib.backward(&f, s, ws.map_or(DevicePtr(0), |(p, _)| p)) }?;
        match a.bias {
            Some(b) => launch(bias_epilogue(a, b, mps)),
            None => Ok(()),
        }
    })();
    let bufs = lib.buffers();
    let [c, d] = &mut bufs.widened;
    let taken = [
        (c, wdy),
        (d, wother),
        (&mut bufs.workspace, ws),
        (&mut bufs.scratch, None),
    ];
    // SAFETY: the buffers were taken above for this device and used only
    // by the work queued on `s`, which is live (caller).
    unsafe { settle(backend, s, taken, run) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv3d::{Conv3dGeometry, Conv3dParams};

    fn launch(op: Conv3dBackwardOp, dtype: DType) -> Conv3dBackwardLaunch {
        let params = Conv3dParams::default()
            .with_stride([2, 1, 1])
            .with_groups(2);
        let g = Conv3dGeometry::new(params, &[2, 4, 5, 6, 7], &[6, 2, 3, 3, 3]).unwrap();
        Conv3dBackwardLaunch {
            op,
            geometry: g,
            dtype,
            grad_output: DevicePtr(0x1000),
            other: Some(DevicePtr(0x2000)),
            bias: None,
            output: DevicePtr(0x3000),
        }
    }

    #[test]
    fn refusals_are_typed() {
        assert!(refusal(&launch(Conv3dBackwardOp::Data, DType::F32)).is_none());
        assert!(refusal(&launch(Conv3dBackwardOp::Weight, DType::BF16)).is_none());
        let bias = Conv3dBackwardLaunch {
            other: None,
            ..launch(Conv3dBackwardOp::Bias, DType::F32)
        };
        assert!(matches!(
            refusal(&bias),
            Some(Error::Conv3dTier { tier: "vendor", reason }) if reason.contains("bias gradient")
        ));
        assert!(matches!(
            refusal(&launch(Conv3dBackwardOp::Data, DType::F16)),
            Some(Error::Conv3dDType {
                dtype: DType::F16,
                ..
            })
        ));
        let no_other = Conv3dBackwardLaunch {
            other: None,
            ..launch(Conv3dBackwardOp::Weight, DType::F32)
        };
        assert!(refusal(&no_other).is_some());
        let weight_bias = Conv3dBackwardLaunch {
            bias: Some(DevicePtr(8)),
            ..launch(Conv3dBackwardOp::Weight, DType::F32)
        };
        assert!(refusal(&weight_bias).is_some());
        let params = Conv3dParams::default();
        let zero = Conv3dBackwardLaunch {
            geometry: Conv3dGeometry::new(params, &[0, 4, 5, 6, 7], &[6, 4, 3, 3, 3]).unwrap(),
            ..launch(Conv3dBackwardOp::Data, DType::F32)
        };
        assert!(refusal(&zero).is_some());
        // conv_transpose3d with output_padding 2 at stride 1 (dilation 3):
        // dy is shorter than the forward output of dx.
        let t = Conv3dGeometry::transposed(
            Conv3dParams::default().with_dilation([3; 3]),
            [2, 0, 0],
            &[1, 2, 3, 3, 3],
            &[2, 2, 2, 2, 2],
        )
        .unwrap();
        assert!(!t.output_is_forward());
        let short = Conv3dBackwardLaunch {
            geometry: t,
            ..launch(Conv3dBackwardOp::Data, DType::F32)
        };
        assert!(matches!(
            refusal(&short),
            Some(Error::Conv3dTier {
                reason: NOT_FORWARD,
                ..
            })
        ));
        let fine = Conv3dGeometry::transposed(
            Conv3dParams::default().with_stride([2; 3]),
            [1, 0, 1],
            &[1, 2, 3, 3, 3],
            &[2, 2, 2, 2, 2],
        )
        .unwrap();
        assert!(fine.output_is_forward());
    }

    #[test]
    fn the_bias_epilogue_spans_the_input_channels() {
        let a = launch(Conv3dBackwardOp::Data, DType::F32);
        let call = bias_epilogue(&a, DevicePtr(0x4000), 4);
        assert_eq!(call.kernel, Kernel::Conv3dBiasF32);
        let total = 2 * 4 * 5 * 6 * 7u64;
        assert!(matches!(
            call.args[..],
            [
                KernelArg::U64(0x3000),
                KernelArg::U64(0x4000),
                KernelArg::U64(t),
                KernelArg::U64(210),
                KernelArg::U64(4)
            ] if t == total
        ));
        // The f32 launch the library gets: no bias, the widened operands.
        let f = f32_launch(
            &Conv3dBackwardLaunch {
                bias: Some(DevicePtr(0x4000)),
                ..launch(Conv3dBackwardOp::Data, DType::BF16)
            },
            DevicePtr(0x5000),
            DevicePtr(0x6000),
        );
        assert_eq!(
            (f.dtype, f.grad_output, f.other, f.bias, f.output),
            (
                DType::F32,
                DevicePtr(0x5000),
                Some(DevicePtr(0x6000)),
                None,
                DevicePtr(0x3000)
            )
        );
        let w = widen(DevicePtr(1), DevicePtr(2), 10, 4).unwrap();
        assert_eq!(w.kernel.symbol(), "convert_bf16_f32");
    }

    #[test]
    fn sizes_beyond_32_bits_are_exact_and_beyond_the_libraries() {
        // 2^33 input elements: the widened copies' byte counts are exact...
        // (Built by hand: `new` also checks the sizes against this machine's
        // memory.)
        let one = Conv3dGeometry::new(Conv3dParams::default(), &[1; 5], &[1; 5]).unwrap();
        let g = Conv3dGeometry {
            batch: 2,
            input: [2048, 2048, 1024],
            output: [2048, 2048, 1024],
            ..one
        };
        let a = Conv3dBackwardLaunch {
            geometry: g,
            ..launch(Conv3dBackwardOp::Weight, DType::BF16)
        };
        assert_eq!(widened_bytes(&a).unwrap(), [1 << 35, 1 << 35]);
        let f = Conv3dBackwardLaunch {
            dtype: DType::F32,
            ..a
        };
        assert_eq!(widened_bytes(&f).unwrap(), [0, 0]);
        // ...and the bias epilogue's sizes are 64-bit.
        let d = Conv3dBackwardLaunch {
            op: Conv3dBackwardOp::Data,
            ..a
        };
        let call = bias_epilogue(&d, DevicePtr(8), 4);
        assert_eq!(call.args[2], KernelArg::U64(1 << 33));
        assert_eq!(call.args[3], KernelArg::U64(1 << 32));
        // The libraries' 32-bit descriptors refuse them: cudnn/cudnn_backward.rs,
        // miopen/miopen_backward.rs.
    }
}
