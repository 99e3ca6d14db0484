//! The conv3d kernels' launch encoding: each kernel's parameter list and
//! grid, as the [`KernelCall`] the GPU body launches (the vendor tier's
//! epilogues too). Only the GPU runtimes use it.
// Without a GPU backend in the build nothing launches kernels.
#![cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]

use crate::conv3d::Conv3dBackwardOp;
use crate::device::info::DevicePtr;
use crate::device::kernels::{Conv3dArgs, Kernel, KernelArg, KernelCall, BLOCK};
use crate::device::raw::conv3d::{
    mma_tiles_m, tiled_wgrad_split, Conv3dBackwardCheckLaunch, Conv3dBackwardLaunch,
    Conv3dCheckLaunch, Conv3dFlipLaunch, Conv3dGuardCheck, Conv3dGuardDecide, Conv3dKernel,
    Conv3dLaunch, Conv3dLayoutLaunch, Conv3dWeightLayout, Conv3dZeroInsertLaunch, GuardStage,
    CHECK_MAX_SAMPLES,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The tiled kernels' trailing `const u64* gate, u64 y_bf16`.
fn gate_args(a: &Conv3dLaunch) -> Result<[KernelArg; 2]> {
    let y_bf16 = match a.output_dtype {
        DType::F32 => 0,
        DType::BF16 => 1,
        other => {
            return Err(Error::Conv3dDType {
                tensor: "output",
                dtype: other,
                expected: DType::F32,
            })
        }
    };
    Ok([
        KernelArg::U64(a.gate.map_or(0, |g| g.0)),
        KernelArg::U64(y_bf16),
    ])
}

/// The kernel of a pair (f32 or 32-bit words, bf16 or 16-bit words) for
/// `dtype`; [`Error::Conv3dDType`] naming `tensor` for any other dtype.
pub(crate) fn by_dtype(
    dtype: DType,
    [f32, bf16]: [Kernel; 2],
    tensor: &'static str,
) -> Result<Kernel> {
    match dtype {
        DType::F32 => Ok(f32),
        DType::BF16 => Ok(bf16),
        other => Err(Error::Conv3dDType {
            tensor,
            dtype: other,
            expected: DType::F32,
        }),
    }
}

#[allow(dead_code)]
impl KernelCall {
    /// `conv3d_naive_{f32,bf16}(const T* x, const T* w, const float*
    /// bias, float* y, rs_conv3d_args a)`, and the tiled kernels with two
    /// more, `const u64* gate, u64 y_bf16` (0 / 0: no gate, f32 output).
    /// Without a bias the bias address is 0 and `a.has_bias` is 0 (the
    /// kernels never read it then). A gate or a bf16 output on the naive
    /// kernel is refused.
    pub(crate) fn conv3d(kernel: Conv3dKernel, a: &Conv3dLaunch) -> Result<KernelCall> {
        if kernel == Conv3dKernel::Naive {
            a.plain("naive")?;
        }
        let k = match (kernel, a.dtype) {
            (Conv3dKernel::Naive, DType::F32) => Kernel::Conv3dNaiveF32,
            (Conv3dKernel::Naive, DType::BF16) => Kernel::Conv3dNaiveBf16,
            (Conv3dKernel::Tiled, DType::F32) => Kernel::Conv3dTiledF32,
            (Conv3dKernel::Tiled, DType::BF16) => Kernel::Conv3dTiledBf16,
            (_, other) => {
                return Err(Error::Conv3dDType {
                    tensor: "input",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        };
        Ok(KernelCall {
            kernel: k,
            grid: kernel.grid(&a.geometry)?,
            block: BLOCK,
            shared_bytes: 0,
            args: {
                let mut v = vec![
                    KernelArg::U64(a.input.0),
                    KernelArg::U64(a.weight.0),
                    KernelArg::U64(a.bias.map_or(0, |b| b.0)),
                    KernelArg::U64(a.output.0),
                    KernelArg::Conv3d(Conv3dArgs::of(&a.geometry, a.bias.is_some())),
                ];
                if kernel == Conv3dKernel::Tiled {
                    v.extend(gate_args(a)?);
                }
                v
            },
        })
    }

    /// `conv3d_tiled_bf16_mma(const u16* x, const u16* wp, const float*
    /// bias, float* y, rs_conv3d_args a, u64 rp, u64 mp)`: the weight packed
    /// `[G][mp][rp]` ([`Conv3dWeightLayout::TiledPacked`] with
    /// `rows = mp`, `cols = rp`); grid `(ceil(P / 128), ceil(K/G / BM), G)`
    /// with BM = `mma_tile_m` (96 or 128).
    pub(crate) fn conv3d_tiled_mma(
        a: &Conv3dLaunch,
        rows: usize,
        cols: usize,
    ) -> Result<KernelCall> {
        let g = &a.geometry;
        let packed = Conv3dWeightLayout::packed_for(g);
        if a.dtype != DType::BF16 || packed != Some(Conv3dWeightLayout::TiledPacked { rows, cols })
        {
            return Err(Error::Conv3dTier {
                tier: "tiled",
                reason: "the tensor-core kernel does not take this call",
            });
        }
        let [gx, _, gz] = Conv3dKernel::Tiled.grid(g)?;
        let gate = gate_args(a)?;
        Ok(KernelCall {
            kernel: Kernel::Conv3dTiledBf16Mma,
            // At most 65535 channel tiles: checked by `packed_for`.
            grid: [
                gx,
                u32::try_from(mma_tiles_m(g.out_per_group())).unwrap_or(u32::MAX),
                gz,
            ],
            block: BLOCK,
            shared_bytes: 0,
            args: vec![
                KernelArg::U64(a.input.0),
                KernelArg::U64(a.weight.0),
                KernelArg::U64(a.bias.map_or(0, |b| b.0)),
                KernelArg::U64(a.output.0),
                KernelArg::Conv3d(Conv3dArgs::of(&a.geometry, a.bias.is_some())),
                KernelArg::U64(cols as u64),
                KernelArg::U64(rows as u64),
                gate[0],
                gate[1],
            ],
        })
    }

    /// The vendor tier's epilogue: `conv3d_bias_f32(float* y, const float*
    /// bias, u64 total, u64 spatial, u64 k)` (adds the bias in place).
    pub(crate) fn conv3d_bias(a: &Conv3dLaunch, bias: DevicePtr, mps: u32) -> KernelCall {
        let g = &a.geometry;
        Self::one_d(
            Kernel::Conv3dBiasF32,
            g.output_len() as u64,
            mps,
            vec![
                KernelArg::U64(a.output.0),
                KernelArg::U64(bias.0),
                KernelArg::U64(g.output_len() as u64),
                KernelArg::U64(g.output.iter().product::<usize>() as u64),
                KernelArg::U64(g.out_channels as u64),
            ],
        )
    }

    /// The vendor tier's bf16 epilogue: `conv3d_widen_bias_bf16(const u16*
    /// src, float* y, const float* bias, u64 total, u64 spatial, u64 k, u64
    /// has_bias)` widens the library's bf16 output `src` into `a.output`.
    pub(crate) fn conv3d_widen_bias(a: &Conv3dLaunch, src: DevicePtr, mps: u32) -> KernelCall {
        let g = &a.geometry;
        Self::one_d(
            Kernel::Conv3dWidenBiasBf16,
            g.output_len() as u64,
            mps,
            vec![
                KernelArg::U64(src.0),
                KernelArg::U64(a.output.0),
                KernelArg::U64(a.bias.map_or(0, |b| b.0)),
                KernelArg::U64(g.output_len() as u64),
                KernelArg::U64(g.output.iter().product::<usize>() as u64),
                KernelArg::U64(g.out_channels as u64),
                KernelArg::U64(u64::from(a.bias.is_some())),
            ],
        )
    }
}

impl KernelCall {
    /// The device check, one or two launches:
    /// `conv3d_locate_nonfinite_f32(const u32* y, u64 n, u64* slot)` first
    /// when [`Conv3dCheckLaunch::locate`] is set, then
    /// `conv3d_check_{f32,bf16}(const T* x, const T* w, const void* bias,
    /// u64 bias_kind, const void* y, u64 y_kind, u64* res, rs_conv3d_args a,
    /// u64 nsamples, u64 seed, const u64* located)` with one 256-thread
    /// block per sampled point (`bias_kind`: 0 none, 1 f32, 2 bf16;
    /// `y_kind`: 1 f32, 2 bf16; `located`: the slot, or 0).
    pub(crate) fn conv3d_check(a: &Conv3dCheckLaunch, mps: u32) -> Result<Vec<KernelCall>> {
        let c = &a.conv;
        let (k, mut args) = check_args(a, [Kernel::Conv3dCheckF32, Kernel::Conv3dCheckBf16])?;
        let samples = u32::try_from(a.samples)
            .ok()
            .filter(|&n| n > 0 && n as usize <= CHECK_MAX_SAMPLES)
            .ok_or(Error::Conv3dTier {
                tier: "check",
                reason: "the sampled points must number 1 to CHECK_MAX_SAMPLES",
            })?;
        let total = c.geometry.output_len() as u64;
        let mut calls = Vec::with_capacity(2);
        if let Some(slot) = a.locate {
            calls.push(Self::one_d(
                Kernel::Conv3dLocateNonfiniteF32,
                total,
                mps,
                vec![
                    KernelArg::U64(c.output.0),
                    KernelArg::U64(total),
                    KernelArg::U64(slot.0),
                ],
            ));
        }
        calls.push(KernelCall {
            kernel: k,
            grid: [samples, 1, 1],
            block: BLOCK,
            shared_bytes: 0,
            args: {
                args.extend([
                    KernelArg::U64(a.locate.map_or(0, |s| s.0)),
                    KernelArg::U64(c.gate.map_or(0, |g| g.0)),
                ]);
                args
            },
        });
        Ok(calls)
    }

    /// `conv3d_guard_decide(const u64* gate, const u64* out_counts, const
    /// u64* in_counts, const u64* res, u64 nsamples, double rel, u64*
    /// verdict)`: one block. `rel` travels as its bits in a `U64` (the
    /// same eight bytes the kernel's `double` parameter reads).
    pub(crate) fn conv3d_guard_decide(a: &Conv3dGuardDecide) -> Result<KernelCall> {
        if a.samples > CHECK_MAX_SAMPLES {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason: "the sampled points must number at most CHECK_MAX_SAMPLES",
            });
        }
        Ok(KernelCall {
            kernel: Kernel::Conv3dGuardDecide,
            grid: [1, 1, 1],
            block: BLOCK,
            shared_bytes: 0,
            args: vec![
                KernelArg::U64(a.gate.map_or(0, |g| g.0)),
                KernelArg::U64(a.out_counts.0),
                KernelArg::U64(a.in_counts.map_or(0, |c| c.0)),
                KernelArg::U64(a.results.0),
                KernelArg::U64(a.samples as u64),
                KernelArg::U64(a.rel_tol.to_bits()),
                KernelArg::U64(a.verdict.0),
            ],
        })
    }

    /// `conv3d_guard_check_{f32,bf16}(const T* x, const T* w, const void*
    /// bias, u64 bias_kind, const void* y, u64 y_kind, u64* res,
    /// rs_conv3d_args a, u64 nsamples, u64 seed, double rel, u64 repair,
    /// u64* acc, u64* rec, const u64* gate)` (kinds as in
    /// [`KernelCall::conv3d_check`]; `rel` as its bits). The grid: a block
    /// per sampled point at least, and enough for the grid-stride counts:
    /// as a NaN/Inf scan's (32 blocks per multiprocessor at most), or
    /// behind a gate (mostly closed: every block reads it and returns) four
    /// per multiprocessor at most.
    pub(crate) fn conv3d_guard_check(a: &Conv3dGuardCheck, mps: u32) -> Result<KernelCall> {
        let c = &a.check.conv;
        if a.check.samples > CHECK_MAX_SAMPLES || a.check.locate.is_some() {
            return Err(Error::Conv3dTier {
                tier: "check",
                reason: "a guard check takes at most CHECK_MAX_SAMPLES points and none located",
            });
        }
        let g = &c.geometry;
        let repair = a.stage == GuardStage::Repair;
        let mut items = g.output_len() as u64;
        if repair {
            let x = g.input_shape().iter().product::<usize>() as u64;
            let w = g.weight_shape().iter().product::<usize>() as u64;
            items = items.max(x).max(w);
        }
        let per_mp = if c.gate.is_some() { 4 } else { 32 };
        let count_blocks = items
            .div_ceil(u64::from(BLOCK))
            .min(u64::from(mps.max(1)) * per_mp);
        let blocks = count_blocks.max(a.check.samples as u64).max(1);
        let (k, mut args) = check_args(
            &a.check,
            [Kernel::Conv3dGuardCheckF32, Kernel::Conv3dGuardCheckBf16],
        )?;
        args.extend([
            KernelArg::U64(a.rel_tol.to_bits()),
            KernelArg::U64(u64::from(repair)),
            KernelArg::U64(a.acc.0),
            KernelArg::U64(a.record.0),
            KernelArg::U64(c.gate.map_or(0, |g| g.0)),
        ]);
        Ok(KernelCall {
            kernel: k,
            grid: [u32::try_from(blocks).unwrap_or(u32::MAX), 1, 1],
            block: BLOCK,
            shared_bytes: 0,
            args,
        })
    }

    /// `conv3d_layout_{u32,u16}(const T* w, T* out, u64 total, u64 kg, u64
    /// r, u64 rows, u64 cols, u64 packed, const u64* gate)`, one output element per thread
    /// (grid-stride).
    pub(crate) fn conv3d_layout(a: &Conv3dLayoutLaunch, mps: u32) -> Result<KernelCall> {
        let g = &a.geometry;
        let k = by_dtype(
            a.dtype,
            [Kernel::Conv3dLayoutU32, Kernel::Conv3dLayoutU16],
            "weight",
        )?;
        let kg = g.out_per_group() as u64;
        let r = (g.in_per_group() * g.kernel.iter().product::<usize>()) as u64;
        let (rows, cols, packed) = match a.layout {
            Conv3dWeightLayout::TiledTransposed => (kg, r, 0),
            Conv3dWeightLayout::TiledPacked { rows, cols } => (rows as u64, cols as u64, 1),
            Conv3dWeightLayout::Standard => {
                return Err(Error::BackendUnsupported {
                    backend: "gpu",
                    op: "conv3d_layout of the standard layout (a copy)",
                })
            }
        };
        let total = a.layout.len(g) as u64;
        Ok(Self::one_d(
            k,
            total,
            mps,
            [
                a.src.0,
                a.dst.0,
                total,
                kg,
                r,
                rows,
                cols,
                packed,
                a.gate.map_or(0, |g| g.0),
            ]
            .into_iter()
            .map(KernelArg::U64)
            .collect(),
        ))
    }
}

impl KernelCall {
    /// `conv3d_flip_weight_{u32,u16}(const T* w, T* out, u64 total, u64 cg,
    /// u64 kg, u64 kd, u64 kh, u64 kw)`, one output element per thread
    /// (grid-stride over `total`, the weight's length); `cg` and `kg` are
    /// the forward convolution's input and output channels per group.
    pub(crate) fn conv3d_flip_weight(a: &Conv3dFlipLaunch, mps: u32) -> Result<KernelCall> {
        let k = by_dtype(
            a.dtype,
            [Kernel::Conv3dFlipWeightU32, Kernel::Conv3dFlipWeightU16],
            "weight",
        )?;
        let g = &a.geometry;
        let total = a.len() as u64;
        let [kd, kh, kw] = g.kernel;
        Ok(Self::one_d(
            k,
            total,
            mps,
            [
                a.src.0,
                a.dst.0,
                total,
                g.in_per_group() as u64,
                g.out_per_group() as u64,
                kd as u64,
                kh as u64,
                kw as u64,
            ]
            .into_iter()
            .map(KernelArg::U64)
            .collect(),
        ))
    }
}

impl KernelCall {
    /// `conv3d_zero_insert_{u32,u16}(const T* dy, T* out, u64 total, u64
    /// od, u64 oh, u64 ow, u64 zd, u64 zh, u64 zw, u64 sd, u64 sh, u64 sw)`,
    /// one output element per thread (grid-stride over `total`, the
    /// destination's length).
    pub(crate) fn conv3d_zero_insert(a: &Conv3dZeroInsertLaunch, mps: u32) -> Result<KernelCall> {
        let k = by_dtype(
            a.dtype,
            [Kernel::Conv3dZeroInsertU32, Kernel::Conv3dZeroInsertU16],
            "grad_output",
        )?;
        let g = &a.geometry;
        let total = a.len() as u64;
        let [od, oh, ow] = g.output.map(|v| v as u64);
        let [zd, zh, zw] = a.expanded.map(|v| v as u64);
        let [sd, sh, sw] = g.params.stride.map(|v| v as u64);
        let args = [a.src.0, a.dst.0, total, od, oh, ow, zd, zh, zw, sd, sh, sw];
        Ok(Self::one_d(
            k,
            total,
            mps,
            args.into_iter().map(KernelArg::U64).collect(),
        ))
    }
}

/// Most blocks of a grid-stride backward launch: the total thread count
/// stays below 2^32 as HIP requires.
const BACKWARD_MAX_BLOCKS: usize = 1 << 20;

impl KernelCall {
    /// A backward op (see [`Conv3dBackwardLaunch`]), 256 threads per block:
    ///
    /// - `conv3d_bwd_data_{f32,bf16}(const T* dy, const T* w, const float*
    ///   bias, float* dx, rs_conv3d_args a)`, one thread per dx element
    ///   (grid-stride; `a.has_bias` says whether `bias` is read);
    /// - `conv3d_bwd_weight_{f32,bf16}(const T* x, const T* dy, float* dw,
    ///   rs_conv3d_args a)`, one block per dw element (grid-stride);
    /// - `conv3d_bwd_bias_{f32,bf16}(const T* dy, float* db, rs_conv3d_args
    ///   a)`, one block per channel (grid-stride).
    pub(crate) fn conv3d_backward(a: &Conv3dBackwardLaunch) -> Result<KernelCall> {
        use Conv3dBackwardOp::{Bias, Data, Weight};
        let bf16 = match a.dtype {
            DType::F32 => false,
            DType::BF16 => true,
            other => {
                return Err(Error::Conv3dDType {
                    tensor: "grad_output",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        };
        let g = &a.geometry;
        if let Some(reason) = a.op.unsupported(g) {
            return Err(Error::Conv3dTier {
                tier: "naive",
                reason,
            });
        }
        let len = a.output_len();
        let missing = || Error::Conv3dTier {
            tier: "naive",
            reason: "a backward op without its second operand",
        };
        let args = Conv3dArgs::of(g, a.bias.is_some() && a.op == Data);
        let (kernel, blocks, ptrs) = match a.op {
            Data => (
                if bf16 {
                    Kernel::Conv3dBwdDataBf16
                } else {
                    Kernel::Conv3dBwdDataF32
                },
                len.div_ceil(BLOCK as usize),
                vec![
                    a.grad_output.0,
                    a.other.ok_or_else(missing)?.0,
                    a.bias.map_or(0, |b| b.0),
                    a.output.0,
                ],
            ),
            Weight => (
                if bf16 {
                    Kernel::Conv3dBwdWeightBf16
                } else {
                    Kernel::Conv3dBwdWeightF32
                },
                len,
                vec![a.other.ok_or_else(missing)?.0, a.grad_output.0, a.output.0],
            ),
            Bias => (
                if bf16 {
                    Kernel::Conv3dBwdBiasBf16
                } else {
                    Kernel::Conv3dBwdBiasF32
                },
                len,
                vec![a.grad_output.0, a.output.0],
            ),
        };
        let mut args_list: Vec<KernelArg> = ptrs.into_iter().map(KernelArg::U64).collect();
        args_list.push(KernelArg::Conv3d(args));
        Ok(KernelCall {
            kernel,
            // At most 2^20: fits.
            grid: [blocks.clamp(1, BACKWARD_MAX_BLOCKS) as u32, 1, 1],
            block: BLOCK,
            shared_bytes: 0,
            args: args_list,
        })
    }

    /// The backward check, one or two launches:
    /// `conv3d_locate_nonfinite_f32(const u32* y, u64 n, u64* slot)` first
    /// with a locate slot, then `conv3d_bwd_check_{f32,bf16}(const T* dy,
    /// const T* other, const void* bias, u64 bias_kind, const float* out,
    /// u64* res, rs_conv3d_args a, u64 op, u64 nsamples, u64 seed, const
    /// u64* located)`, one 256-thread block per sampled point (`op`: 0
    /// data, 1 weight, 2 bias; `bias_kind`: 0 none, 1 f32, 2 bf16).
    pub(crate) fn conv3d_backward_check(
        a: &Conv3dBackwardCheckLaunch,
        mps: u32,
    ) -> Result<Vec<KernelCall>> {
        let c = &a.conv;
        let kernel = by_dtype(
            c.dtype,
            [Kernel::Conv3dBwdCheckF32, Kernel::Conv3dBwdCheckBf16],
            "grad_output",
        )?;
        let bias_kind = bias_kind(c.bias, a.bias_dtype)?;
        let samples = u32::try_from(a.samples)
            .ok()
            .filter(|&n| n > 0 && n as usize <= CHECK_MAX_SAMPLES)
            .ok_or(Error::Conv3dTier {
                tier: "check",
                reason: "the sampled points must number 1 to CHECK_MAX_SAMPLES",
            })?;
        let op = match c.op {
            Conv3dBackwardOp::Data => 0,
            Conv3dBackwardOp::Weight => 1,
            Conv3dBackwardOp::Bias => 2,
        };
        let total = c.output_len() as u64;
        let mut calls = Vec::with_capacity(2);
        if let Some(slot) = a.locate {
            calls.push(Self::one_d(
                Kernel::Conv3dLocateNonfiniteF32,
                total,
                mps,
                vec![
                    KernelArg::U64(c.output.0),
                    KernelArg::U64(total),
                    KernelArg::U64(slot.0),
                ],
            ));
        }
        calls.push(KernelCall {
            kernel,
            grid: [samples, 1, 1],
            block: BLOCK,
            shared_bytes: 0,
            args: vec![
                KernelArg::U64(c.grad_output.0),
                KernelArg::U64(c.other.map_or(0, |o| o.0)),
                KernelArg::U64(c.bias.map_or(0, |b| b.0)),
                KernelArg::U64(bias_kind),
                KernelArg::U64(c.output.0),
                KernelArg::U64(a.results.0),
                KernelArg::Conv3d(Conv3dArgs::of(&c.geometry, c.bias.is_some())),
                KernelArg::U64(op),
                KernelArg::U64(u64::from(samples)),
                KernelArg::U64(a.seed),
                KernelArg::U64(a.locate.map_or(0, |s| s.0)),
            ],
        });
        Ok(calls)
    }
}

impl KernelCall {
    /// `conv3d_bwd_weight_tiled_{f32,bf16}(const T* x, const T* dy, float*
    /// dw, rs_conv3d_args a, u64 chunk)` on the grid of
    /// [`tiled_wgrad_split`]: the kernel ADDS into `dw`, which the caller
    /// zeroes first on the same stream.
    pub(crate) fn conv3d_bwd_weight_tiled(
        a: &Conv3dBackwardLaunch,
        mps: u32,
    ) -> Result<KernelCall> {
        let kernel = by_dtype(
            a.dtype,
            [
                Kernel::Conv3dBwdWeightTiledF32,
                Kernel::Conv3dBwdWeightTiledBf16,
            ],
            "grad_output",
        )?;
        let (Conv3dBackwardOp::Weight, Some(x)) = (a.op, a.other) else {
            return Err(Error::Conv3dTier {
                tier: "tiled",
                reason: "the tiled backward kernel computes the weight gradient only",
            });
        };
        let split = tiled_wgrad_split(&a.geometry, mps)?;
        Ok(KernelCall {
            kernel,
            grid: split.grid,
            block: BLOCK,
            shared_bytes: 0,
            args: vec![
                KernelArg::U64(x.0),
                KernelArg::U64(a.grad_output.0),
                KernelArg::U64(a.output.0),
                KernelArg::Conv3d(Conv3dArgs::of(&a.geometry, false)),
                KernelArg::U64(split.chunk),
            ],
        })
    }
}

#[cfg(test)]
mod tests;

/// The kernel of a device check (`kernels`: its f32 and bf16 entries) and
/// the arguments its kinds share, in order: `x, w, bias, bias_kind, y,
/// y_kind, res, a, nsamples, seed` (`bias_kind`: 0 none, 1 f32, 2 bf16;
/// `y_kind`: 1 f32, 2 bf16, an f32 output only where a point is located).
fn check_args(a: &Conv3dCheckLaunch, kernels: [Kernel; 2]) -> Result<(Kernel, Vec<KernelArg>)> {
    let c = &a.conv;
    let k = by_dtype(c.dtype, kernels, "input")?;
    let bias_kind = bias_kind(c.bias, a.bias_dtype)?;
    let y_kind = match (a.output_dtype, a.locate) {
        (DType::F32, _) => 1,
        (DType::BF16, None) => 2,
        (other, _) => {
            return Err(Error::Conv3dDType {
                tensor: "output",
                dtype: other,
                expected: DType::F32,
            })
        }
    };
    let args = vec![
        KernelArg::U64(c.input.0),
        KernelArg::U64(c.weight.0),
        KernelArg::U64(c.bias.map_or(0, |b| b.0)),
        KernelArg::U64(bias_kind),
        KernelArg::U64(c.output.0),
        KernelArg::U64(y_kind),
        KernelArg::U64(a.results.0),
        KernelArg::Conv3d(Conv3dArgs::of(&c.geometry, c.bias.is_some())),
        KernelArg::U64(a.samples as u64),
        KernelArg::U64(a.seed),
    ];
    Ok((k, args))
}

/// A check kernel's `bias_kind`: 0 none, 1 f32, 2 bf16 (another dtype is
/// [`Error::Conv3dDType`]).
fn bias_kind<P>(bias: Option<P>, dtype: DType) -> Result<u64> {
    match (bias, dtype) {
        (None, _) => Ok(0),
        (Some(_), DType::F32) => Ok(1),
        (Some(_), DType::BF16) => Ok(2),
        (Some(_), other) => Err(Error::Conv3dDType {
            tensor: "bias",
            dtype: other,
            expected: DType::F32,
        }),
    }
}
