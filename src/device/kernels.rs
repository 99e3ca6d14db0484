//! The kernels of `kernels/` as the GPU backends name and launch them.
// Without a GPU backend in the build nothing launches kernels.
#![cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]

#[cfg(any(feature = "hip", feature = "cuda"))]
include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

use std::ffi::c_void;

use super::info::ConvertOp;

mod conv3d_args;
use crate::convert::table;
use crate::device::raw::backend::KernelOp;
use crate::dtype::DType;
use crate::error::{Error, Result};
pub(crate) use conv3d_args::Conv3dArgs;

/// Threads per block for every kernel (fingerprint.hip's RS_FP_BLOCK).
#[allow(dead_code)]
pub(crate) const BLOCK: u32 = 256;
// The tiled weight gradient's split (`device::raw::conv3d`) counts on it.
const _: () = assert!(BLOCK == crate::device::raw::conv3d::WGRAD_BLOCK);

/// The CUDA backend's modules, each compiled and loaded on the first launch
/// of one of its kernels: a process that only converts or loads never waits
/// for the conv3d kernels' compile, and one that runs bf16 convolutions on
/// tensor cores compiles neither the f32 nor the naive kernels.
/// `kernels/core.hip` is one module; `kernels/conv3d.hip` is five,
/// one source compiled with `-DRS_PART=n` ([`KernelModule::part`]; its
/// kernels sit under `#if RS_BUILDS(n)`, `kernels/prelude.h`). Measured
/// on an H100 (NVRTC 13.0), the whole conv3d source took 15 s to PTX and
/// the driver 28 s more to machine code; the tiled kernels are most of it.
/// HIP builds all kernels into one code object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(dead_code)]
pub(crate) enum KernelModule {
    /// Conversions, fingerprints, non-finite scans.
    Core = 0,
    /// The conv3d checks, weight layouts, epilogues, gradients and the
    /// guard's verdict: everything of `conv3d.hip` not below.
    Conv3d = 1,
    /// `conv3d_naive_{f32,bf16}`.
    Conv3dNaive = 2,
    /// `conv3d_tiled_f32`.
    Conv3dTiledF32 = 3,
    /// `conv3d_tiled_bf16`.
    Conv3dTiledBf16 = 4,
    /// `conv3d_tiled_bf16_mma` (sm_80+; empty below).
    Conv3dTiledBf16Mma = 5,
}

#[allow(dead_code)]
impl KernelModule {
    /// Every module, in the order of `CUDA_PTX`.
    pub(crate) const ALL: [KernelModule; 6] = [
        KernelModule::Core,
        KernelModule::Conv3d,
        KernelModule::Conv3dNaive,
        KernelModule::Conv3dTiledF32,
        KernelModule::Conv3dTiledBf16,
        KernelModule::Conv3dTiledBf16Mma,
    ];

    /// Index into [`KernelModule::ALL`] and `CUDA_PTX`.
    pub(crate) const fn index(self) -> usize {
        self as usize
    }

    /// Index of the module's source in `CUDA_SOURCES` (`core.hip`,
    /// `conv3d.hip`).
    pub(crate) const fn source(self) -> usize {
        match self {
            KernelModule::Core => 0,
            _ => 1,
        }
    }

    /// The `RS_PART` the source is compiled with (`kernels/prelude.h`;
    /// 0: every kernel of the source).
    pub(crate) const fn part(self) -> u32 {
        match self {
            KernelModule::Core => 0,
            KernelModule::Conv3d => 1,
            KernelModule::Conv3dNaive => 2,
            KernelModule::Conv3dTiledF32 => 3,
            KernelModule::Conv3dTiledBf16 => 4,
            KernelModule::Conv3dTiledBf16Mma => 5,
        }
    }

    /// Short name (cache file names).
    pub(crate) const fn name(self) -> &'static str {
        match self {
            KernelModule::Core => "core",
            KernelModule::Conv3d => "conv3d",
            KernelModule::Conv3dNaive => "conv3d_naive",
            KernelModule::Conv3dTiledF32 => "conv3d_tiled_f32",
            KernelModule::Conv3dTiledBf16 => "conv3d_tiled_bf16",
            KernelModule::Conv3dTiledBf16Mma => "conv3d_tiled_bf16_mma",
        }
    }
}

/// Every kernel symbol the backends load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(dead_code)]
pub(crate) enum Kernel {
    /// `convert_{src}_{dst}`: a row of the conversion table with a device
    /// kernel (made by [`Kernel::convert`] only).
    Convert(ConvertOp),
    /// `convert_fingerprint_{src}_f32`: a row's fused kernel (made by
    /// [`Kernel::convert_fingerprint`] only).
    ConvertFingerprint(ConvertOp),
    /// `widen_check_{src}_f32`: a widening row's exact check (made by
    /// [`Kernel::widen_check`] only).
    WidenCheck(ConvertOp),
    FingerprintSum,
    NonfiniteF32,
    NonfiniteBf16,
    NonfiniteF16,
    Conv3dNaiveF32,
    Conv3dNaiveBf16,
    Conv3dTiledF32,
    Conv3dTiledBf16,
    Conv3dBiasF32,
    Conv3dWidenBiasBf16,
    Conv3dCheckF32,
    Conv3dCheckBf16,
    Conv3dLocateNonfiniteF32,
    Conv3dLayoutU32,
    Conv3dLayoutU16,
    Conv3dBwdDataF32,
    Conv3dBwdDataBf16,
    Conv3dBwdWeightF32,
    Conv3dBwdWeightBf16,
    Conv3dBwdBiasF32,
    Conv3dBwdBiasBf16,
    Conv3dBwdCheckF32,
    Conv3dBwdCheckBf16,
    Conv3dGuardDecide,
    Conv3dFlipWeightU32,
    Conv3dFlipWeightU16,
    Conv3dZeroInsertU32,
    Conv3dZeroInsertU16,
    Conv3dBwdWeightTiledF32,
    Conv3dBwdWeightTiledBf16,
    Conv3dGuardCheckF32,
    Conv3dGuardCheckBf16,
    /// Optional (CUDA sm_80+ only): not in [`Kernel::all`].
    Conv3dTiledBf16Mma,
}

#[allow(dead_code)]
impl Kernel {
    /// The kernels that are not conversions, in the order they are loaded
    /// after the conversion table's ([`Kernel::all`]).
    const FIXED: [Kernel; 32] = [
        Kernel::FingerprintSum,
        Kernel::NonfiniteF32,
        Kernel::NonfiniteBf16,
        Kernel::NonfiniteF16,
        Kernel::Conv3dNaiveF32,
        Kernel::Conv3dNaiveBf16,
        Kernel::Conv3dTiledF32,
        Kernel::Conv3dTiledBf16,
        Kernel::Conv3dBiasF32,
        Kernel::Conv3dWidenBiasBf16,
        Kernel::Conv3dCheckF32,
        Kernel::Conv3dCheckBf16,
        Kernel::Conv3dLocateNonfiniteF32,
        Kernel::Conv3dLayoutU32,
        Kernel::Conv3dLayoutU16,
        Kernel::Conv3dBwdDataF32,
        Kernel::Conv3dBwdDataBf16,
        Kernel::Conv3dBwdWeightF32,
        Kernel::Conv3dBwdWeightBf16,
        Kernel::Conv3dBwdBiasF32,
        Kernel::Conv3dBwdBiasBf16,
        Kernel::Conv3dBwdCheckF32,
        Kernel::Conv3dBwdCheckBf16,
        Kernel::Conv3dGuardDecide,
        Kernel::Conv3dFlipWeightU32,
        Kernel::Conv3dFlipWeightU16,
        Kernel::Conv3dZeroInsertU32,
        Kernel::Conv3dZeroInsertU16,
        Kernel::Conv3dBwdWeightTiledF32,
        Kernel::Conv3dBwdWeightTiledBf16,
        Kernel::Conv3dGuardCheckF32,
        Kernel::Conv3dGuardCheckBf16,
    ];

    /// Every kernel a backend loads (and every code object must hold): the
    /// conversion table's device and fused kernels, then the rest.
    pub(crate) fn all() -> Vec<Kernel> {
        let mut v = Vec::with_capacity(Self::FIXED.len() + 16);
        for r in table::device_rows() {
            let op = ConvertOp {
                from: r.from,
                to: r.to,
            };
            v.push(Kernel::Convert(op));
            if r.fused.is_some() {
                v.push(Kernel::ConvertFingerprint(op));
            }
            if op.widen_check_available() {
                v.push(Kernel::WidenCheck(op));
            }
        }
        v.extend(Self::FIXED);
        v
    }

    /// The CUDA module the kernel is built into.
    pub(crate) const fn module(self) -> KernelModule {
        match self {
            Kernel::Convert(_)
            | Kernel::ConvertFingerprint(_)
            | Kernel::WidenCheck(_)
            | Kernel::FingerprintSum
            | Kernel::NonfiniteF32
            | Kernel::NonfiniteBf16
            | Kernel::NonfiniteF16 => KernelModule::Core,
            Kernel::Conv3dNaiveF32 | Kernel::Conv3dNaiveBf16 => KernelModule::Conv3dNaive,
            Kernel::Conv3dTiledF32 => KernelModule::Conv3dTiledF32,
            Kernel::Conv3dTiledBf16 => KernelModule::Conv3dTiledBf16,
            Kernel::Conv3dTiledBf16Mma => KernelModule::Conv3dTiledBf16Mma,
            Kernel::Conv3dBiasF32
            | Kernel::Conv3dWidenBiasBf16
            | Kernel::Conv3dCheckF32
            | Kernel::Conv3dCheckBf16
            | Kernel::Conv3dLocateNonfiniteF32
            | Kernel::Conv3dLayoutU32
            | Kernel::Conv3dLayoutU16
            | Kernel::Conv3dBwdDataF32
            | Kernel::Conv3dBwdDataBf16
            | Kernel::Conv3dBwdWeightF32
            | Kernel::Conv3dBwdWeightBf16
            | Kernel::Conv3dBwdBiasF32
            | Kernel::Conv3dBwdBiasBf16
            | Kernel::Conv3dBwdCheckF32
            | Kernel::Conv3dBwdCheckBf16
            | Kernel::Conv3dGuardDecide
            | Kernel::Conv3dFlipWeightU32
            | Kernel::Conv3dFlipWeightU16
            | Kernel::Conv3dZeroInsertU32
            | Kernel::Conv3dZeroInsertU16
            | Kernel::Conv3dBwdWeightTiledF32
            | Kernel::Conv3dBwdWeightTiledBf16
            | Kernel::Conv3dGuardCheckF32
            | Kernel::Conv3dGuardCheckBf16 => KernelModule::Conv3d,
        }
    }

    /// The extern "C" symbol (a conversion's from its table row).
    pub(crate) const fn symbol(self) -> &'static str {
        match self {
            Kernel::Convert(op) => match table::find(op.from, op.to) {
                Some(table::Conversion {
                    kernel: Some(k), ..
                }) => k,
                // Not made: `Kernel::convert` checks the row.
                _ => "",
            },
            Kernel::ConvertFingerprint(op) => match table::find(op.from, op.to) {
                Some(table::Conversion { fused: Some(k), .. }) => k,
                _ => "",
            },
            Kernel::WidenCheck(op) => match op.from {
                DType::BF16 => "widen_check_bf16_f32",
                DType::F16 => "widen_check_f16_f32",
                DType::F8_E4M3 => "widen_check_f8_e4m3_f32",
                DType::F8_E5M2 => "widen_check_f8_e5m2_f32",
                // Not made: `Kernel::widen_check` checks the row.
                _ => "",
            },
            Kernel::FingerprintSum => "fingerprint_sum_u8",
            Kernel::NonfiniteF32 => "nonfinite_f32",
            Kernel::NonfiniteBf16 => "nonfinite_bf16",
            Kernel::NonfiniteF16 => "nonfinite_f16",
            Kernel::Conv3dNaiveF32 => "conv3d_naive_f32",
            Kernel::Conv3dNaiveBf16 => "conv3d_naive_bf16",
            Kernel::Conv3dTiledF32 => "conv3d_tiled_f32",
            Kernel::Conv3dTiledBf16 => "conv3d_tiled_bf16",
            Kernel::Conv3dBiasF32 => "conv3d_bias_f32",
            Kernel::Conv3dWidenBiasBf16 => "conv3d_widen_bias_bf16",
            Kernel::Conv3dCheckF32 => "conv3d_check_f32",
            Kernel::Conv3dCheckBf16 => "conv3d_check_bf16",
            Kernel::Conv3dLocateNonfiniteF32 => "conv3d_locate_nonfinite_f32",
            Kernel::Conv3dLayoutU32 => "conv3d_layout_u32",
            Kernel::Conv3dLayoutU16 => "conv3d_layout_u16",
            Kernel::Conv3dBwdDataF32 => "conv3d_bwd_data_f32",
            Kernel::Conv3dBwdDataBf16 => "conv3d_bwd_data_bf16",
            Kernel::Conv3dBwdWeightF32 => "conv3d_bwd_weight_f32",
            Kernel::Conv3dBwdWeightBf16 => "conv3d_bwd_weight_bf16",
            Kernel::Conv3dBwdBiasF32 => "conv3d_bwd_bias_f32",
            Kernel::Conv3dBwdBiasBf16 => "conv3d_bwd_bias_bf16",
            Kernel::Conv3dBwdCheckF32 => "conv3d_bwd_check_f32",
            Kernel::Conv3dBwdCheckBf16 => "conv3d_bwd_check_bf16",
            Kernel::Conv3dGuardDecide => "conv3d_guard_decide",
            Kernel::Conv3dFlipWeightU32 => "conv3d_flip_weight_u32",
            Kernel::Conv3dFlipWeightU16 => "conv3d_flip_weight_u16",
            Kernel::Conv3dZeroInsertU32 => "conv3d_zero_insert_u32",
            Kernel::Conv3dZeroInsertU16 => "conv3d_zero_insert_u16",
            Kernel::Conv3dBwdWeightTiledF32 => "conv3d_bwd_weight_tiled_f32",
            Kernel::Conv3dBwdWeightTiledBf16 => "conv3d_bwd_weight_tiled_bf16",
            Kernel::Conv3dGuardCheckF32 => "conv3d_guard_check_f32",
            Kernel::Conv3dGuardCheckBf16 => "conv3d_guard_check_bf16",
            Kernel::Conv3dTiledBf16Mma => "conv3d_tiled_bf16_mma",
        }
    }

    /// The kernel of `op`'s table row: [`Error::UnsupportedConversion`]
    /// where the row has none.
    pub(crate) fn convert(op: ConvertOp) -> Result<Kernel> {
        match table::find(op.from, op.to) {
            Some(r) if r.kernel.is_some() => Ok(Kernel::Convert(op)),
            _ => Err(unsupported("convert", op)),
        }
    }

    /// The exact check of `op`'s widening ([`ConvertOp::widen_check_available`]).
    pub(crate) fn widen_check(op: ConvertOp) -> Result<Kernel> {
        if op.widen_check_available() {
            Ok(Kernel::WidenCheck(op))
        } else {
            Err(unsupported("widen_check", op))
        }
    }

    /// The fused convert + fingerprint kernel of `op`'s table row.
    pub(crate) fn convert_fingerprint(op: ConvertOp) -> Result<Kernel> {
        match table::find(op.from, op.to) {
            Some(r) if r.fused.is_some() => Ok(Kernel::ConvertFingerprint(op)),
            _ => Err(unsupported("convert_fingerprint", op)),
        }
    }

    /// Elements one work item of a conversion kernel converts (its row's
    /// `per_item`; 8 for a row without, which is never launched).
    fn per_item(op: ConvertOp) -> u64 {
        table::find(op.from, op.to).map_or(8, |r| u64::from(r.per_item.max(1)))
    }

    pub(crate) fn nonfinite(t: DType) -> Result<Kernel> {
        Ok(match t {
            DType::F32 => Kernel::NonfiniteF32,
            DType::BF16 => Kernel::NonfiniteBf16,
            DType::F16 => Kernel::NonfiniteF16,
            other => {
                return Err(Error::UnsupportedConversion {
                    op: "nonfinite",
                    from: other,
                    to: other,
                    tensor: None,
                })
            }
        })
    }
}

/// Blocks of [`BLOCK`] threads for `items` work items (16-byte vectors,
/// elements) of kernel `k` on a device with `mps` multiprocessors.
///
/// Measured on an H100 (BENCHMARKS.md, "Grid sizes"): the plain conversions run fastest
/// with one item per thread (a grid covering everything, capped so that the
/// total thread count stays below 2^32 as HIP requires; the grid-stride loop
/// covers the rest); the reductions (fingerprint, fused, nonfinite) with
/// about 32 to 64 blocks per multiprocessor, so that each thread's fixed
/// lane keys and its partial sum are reused over many items.
#[allow(dead_code)]
pub(crate) fn grid_for(k: Kernel, items: u64, mps: u32) -> u32 {
    let need = items.div_ceil(u64::from(BLOCK)).max(1);
    let cap = match k {
        Kernel::Convert(_) => 1u64 << 22,
        Kernel::ConvertFingerprint(_) => u64::from(mps.max(1)) * 64,
        _ => u64::from(mps.max(1)) * 32,
    };
    // Clamp rather than truncate.
    u32::try_from(need.min(cap)).unwrap_or(u32::MAX)
}

/// One kernel argument, by value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) enum KernelArg {
    /// A 64-bit integer or a device address.
    U64(u64),
    /// A 32-bit integer.
    U32(u32),
    /// The conv3d sizes struct.
    Conv3d(Conv3dArgs),
}

/// One kernel launch described independently of the backend: the kernel,
/// its grid, block and dynamic shared memory, and its arguments in the
/// kernel's parameter order. Each constructor below is the one place where
/// a kernel's parameter list is written down; both GPU backends marshal
/// the result the same way ([`KernelCall::arg_ptrs`] into
/// `cuLaunchKernel` / `hipModuleLaunchKernel`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(dead_code)]
pub(crate) struct KernelCall {
    pub(crate) kernel: Kernel,
    pub(crate) grid: [u32; 3],
    pub(crate) block: u32,
    pub(crate) shared_bytes: u32,
    pub(crate) args: Vec<KernelArg>,
}

#[allow(dead_code)]
impl KernelCall {
    pub(crate) fn one_d(kernel: Kernel, items: u64, mps: u32, args: Vec<KernelArg>) -> KernelCall {
        KernelCall {
            kernel,
            grid: [grid_for(kernel, items, mps), 1, 1],
            block: BLOCK,
            shared_bytes: 0,
            args,
        }
    }

    /// Pointers to each argument's value, in order: what the launch APIs
    /// take as `kernelParams`. Valid while `self` is neither moved nor
    /// changed.
    pub(crate) fn arg_ptrs(&mut self) -> Vec<*mut c_void> {
        self.args
            .iter_mut()
            .map(|a| match a {
                KernelArg::U64(v) => (v as *mut u64).cast(),
                KernelArg::U32(v) => (v as *mut u32).cast(),
                KernelArg::Conv3d(v) => (v as *mut Conv3dArgs).cast(),
            })
            .collect()
    }

    /// The launch of an elementwise `op` (conversions, fingerprints,
    /// non-finite scans; conv3d has [`KernelCall::conv3d`] and the vendor
    /// call launches no kernel of ours: both are
    /// [`Error::BackendUnsupported`] here). The kernels' parameters:
    ///
    /// - `convert_{src}_{dst}(const src*, dst*, u64 n)`, the row's
    ///   `per_item` elements per item (8; 16 for 8-bit sources);
    /// - `fingerprint_sum_u8(const u8*, u64 nbytes, u64 first_word, u64*
    ///   acc)`, 16 bytes per item;
    /// - `convert_fingerprint_{src}_f32(const u16*, u32*, u64 n, u64* acc)`,
    ///   8 elements per item;
    /// - `nonfinite_{t}(T*, u64 n, u32 clamp, u64* counts)`.
    pub(crate) fn for_op(op: &KernelOp<'_>, mps: u32) -> Result<KernelCall> {
        use KernelArg::{U32, U64};
        let (k, items, args) = match *op {
            KernelOp::Convert { op, src, dst, n } => (
                Kernel::convert(op)?,
                n.div_ceil(Kernel::per_item(op)),
                vec![U64(src.0), U64(dst.0), U64(n)],
            ),
            KernelOp::FingerprintSum {
                src,
                bytes,
                first_word,
                acc,
            } => (
                Kernel::FingerprintSum,
                bytes.div_ceil(16),
                vec![U64(src.0), U64(bytes), U64(first_word), U64(acc.0)],
            ),
            KernelOp::ConvertFingerprint {
                op,
                src,
                dst,
                n,
                acc,
            } => (
                Kernel::convert_fingerprint(op)?,
                n.div_ceil(Kernel::per_item(op)),
                vec![U64(src.0), U64(dst.0), U64(n), U64(acc.0)],
            ),
            KernelOp::WidenCheck {
                op,
                src,
                dst,
                n,
                count,
            } => (
                Kernel::widen_check(op)?,
                n,
                vec![U64(src.0), U64(dst.0), U64(n), U64(count.0)],
            ),
            KernelOp::CountNonFinite {
                dtype,
                ptr,
                n,
                counts,
                gate,
            } => (
                Kernel::nonfinite(dtype)?,
                // Behind a gate (mostly closed: every block reads it and
                // returns) four blocks per multiprocessor: the grid-stride
                // loop covers the rest when it is open.
                match gate {
                    Some(_) => n.min(u64::from(mps.max(1)) * 4 * u64::from(BLOCK)),
                    None => n,
                },
                vec![
                    U64(ptr.0),
                    U64(n),
                    U32(0),
                    U64(counts.0),
                    U64(gate.map_or(0, |g| g.0)),
                ],
            ),
            KernelOp::ClampNonFinite {
                dtype,
                ptr,
                n,
                counts,
            } => (
                Kernel::nonfinite(dtype)?,
                n,
                vec![U64(ptr.0), U64(n), U32(1), U64(counts.0), U64(0)],
            ),
            KernelOp::Conv3d { .. }
            | KernelOp::Conv3dVendor { .. }
            | KernelOp::Conv3dCheck { .. }
            | KernelOp::Conv3dLayout { .. }
            | KernelOp::Conv3dGuardDecide { .. }
            | KernelOp::Conv3dGuardCheck { .. }
            | KernelOp::Conv3dBackward { .. }
            | KernelOp::Conv3dBackwardVendor { .. }
            | KernelOp::Conv3dBackwardCheck { .. }
            | KernelOp::Conv3dBackwardWeightTiled { .. }
            | KernelOp::Conv3dFlipWeight { .. }
            | KernelOp::Conv3dZeroInsert { .. } => {
                return Err(Error::BackendUnsupported {
                    backend: "gpu",
                    op: op.name(),
                })
            }
        };
        Ok(Self::one_d(k, items, mps, args))
    }
}

fn unsupported(op: &'static str, c: ConvertOp) -> Error {
    Error::UnsupportedConversion {
        op,
        from: c.from,
        to: c.to,
        tensor: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::info::DevicePtr;
    #[cfg(feature = "cuda")]
    use std::collections::HashMap;

    fn read_u64(p: *mut c_void) -> u64 {
        // SAFETY: the test reads back pointers `arg_ptrs` made to u64s.
        unsafe { *p.cast::<u64>() }
    }

    /// The module split agrees in its three places: `KernelModule`,
    /// build.rs's list and `kernels/prelude.h`'s part numbers; and each
    /// conv3d kernel is defined only under its own module's guard.
    #[cfg(feature = "cuda")]
    #[test]
    fn every_conv3d_kernel_sits_in_its_modules_part() {
        let names: Vec<(&str, u32)> = KernelModule::ALL
            .iter()
            .map(|m| (m.name(), m.part()))
            .collect();
        assert_eq!(names, CUDA_MODULE_PARTS.to_vec());
        let prelude = include_str!("../../kernels/prelude.h");
        for m in KernelModule::ALL.iter().filter(|m| m.part() != 0) {
            let define = format!("#define RS_PART_{} {}", m.name().to_uppercase(), m.part());
            assert!(prelude.contains(&define), "{define}");
        }
        // Walk the flattened conv3d source keeping the stack of `#if`s:
        // a kernel's definition must sit under exactly its part's guard.
        let src = CUDA_SOURCES[KernelModule::Conv3d.source()];
        let conv3d: Vec<Kernel> = Kernel::all()
            .into_iter()
            .chain([Kernel::Conv3dTiledBf16Mma])
            .filter(|k| k.module().source() == 1)
            .collect();
        let mut stack: Vec<Option<u32>> = Vec::new();
        let mut found = HashMap::new();
        let part_of = |cond: &str| {
            KernelModule::ALL
                .iter()
                .find(|m| {
                    m.part() != 0
                        && cond.contains(&format!("RS_BUILDS(RS_PART_{})", m.name().to_uppercase()))
                })
                .map(|m| m.part())
        };
        let mut pending_kernel = false;
        for line in src.lines() {
            let t = line.trim_start();
            if let Some(cond) = t.strip_prefix("#if") {
                stack.push(part_of(cond));
            } else if t.starts_with("#endif") {
                stack.pop();
            }
            // `KERNEL void ... name(` (the name may be on the next line),
            // or a kernel-defining macro's `RS_..._KERNEL(name, ...)`.
            if t.starts_with("KERNEL void") {
                pending_kernel = true;
            }
            if t.starts_with("RS_") && t.contains("_KERNEL(") && !t.starts_with("RS_DEVICE") {
                for &k in &conv3d {
                    if t.contains(&format!("({},", k.symbol())) {
                        found.insert(k, stack.iter().flatten().copied().collect());
                    }
                }
            }
            if pending_kernel {
                for &k in &conv3d {
                    if t.contains(&format!("{}(", k.symbol())) {
                        let parts: Vec<u32> = stack.iter().flatten().copied().collect();
                        found.insert(k, parts);
                        pending_kernel = false;
                    }
                }
                if t.contains('{') {
                    pending_kernel = false;
                }
            }
        }
        for &k in &conv3d {
            let parts = found.get(&k);
            assert_eq!(
                parts,
                Some(&vec![k.module().part()]),
                "{} must be defined under RS_BUILDS of its module {}",
                k.symbol(),
                k.module().name()
            );
        }
    }

    #[test]
    fn conversion_kernels_come_from_the_table() {
        let all = Kernel::all();
        for r in table::CONVERSIONS {
            let op = ConvertOp {
                from: r.from,
                to: r.to,
            };
            assert_eq!(Kernel::convert(op).is_ok(), r.kernel.is_some(), "{op}");
            assert_eq!(Kernel::convert_fingerprint(op).is_ok(), r.fused.is_some());
            if let Ok(k) = Kernel::convert(op) {
                assert!(all.contains(&k));
                assert_eq!(Some(k.symbol()), r.kernel);
                assert_eq!(k.module(), KernelModule::Core);
                // 16 f8 elements per item: the grid covers n / 16 items.
                let c = KernelCall::for_op(
                    &KernelOp::Convert {
                        op,
                        src: DevicePtr(0),
                        dst: DevicePtr(0),
                        n: 4096 * 256,
                    },
                    4,
                )
                .unwrap();
                assert_eq!(u64::from(c.grid[0]), 4096 / u64::from(r.per_item));
            }
        }
        assert!(matches!(
            Kernel::convert(ConvertOp {
                from: DType::F64,
                to: DType::F32
            }),
            Err(Error::UnsupportedConversion { op: "convert", .. })
        ));
        assert!(all.contains(&Kernel::Conv3dBwdCheckBf16));
        assert!(!all.contains(&Kernel::Conv3dTiledBf16Mma));
        let mut syms: Vec<_> = all.iter().map(|k| k.symbol()).collect();
        syms.sort_unstable();
        syms.dedup();
        assert_eq!(syms.len(), all.len(), "no symbol twice, none empty");
        assert!(!syms.contains(&""));
    }

    #[test]
    fn calls_carry_the_kernel_parameter_lists() {
        let op = ConvertOp {
            from: DType::BF16,
            to: DType::F32,
        };
        let (src, dst) = (DevicePtr(16), DevicePtr(32));
        let convert = KernelOp::Convert {
            op,
            src,
            dst,
            n: 1000,
        };
        let mut c = KernelCall::for_op(&convert, 4).unwrap();
        assert_eq!(c.kernel, Kernel::Convert(op));
        assert_eq!(c.kernel.symbol(), "convert_bf16_f32");
        assert_eq!((c.grid, c.block, c.shared_bytes), ([1, 1, 1], BLOCK, 0));
        let p = c.arg_ptrs();
        assert_eq!(
            p.iter().map(|&q| read_u64(q)).collect::<Vec<_>>(),
            [16, 32, 1000]
        );
        let scan = |dtype, clamp| {
            let (ptr, counts, n) = (DevicePtr(8), DevicePtr(64), 5);
            let op = if clamp {
                KernelOp::ClampNonFinite {
                    dtype,
                    ptr,
                    n,
                    counts,
                }
            } else {
                KernelOp::CountNonFinite {
                    dtype,
                    ptr,
                    n,
                    counts,
                    gate: None,
                }
            };
            KernelCall::for_op(&op, 4)
        };
        assert_eq!(scan(DType::F16, false).unwrap().args[2], KernelArg::U32(0));
        let mut c = scan(DType::F16, true).unwrap();
        assert_eq!(c.args[2], KernelArg::U32(1));
        let p = c.arg_ptrs();
        // SAFETY: the third argument is a u32.
        assert_eq!(unsafe { *p[2].cast::<u32>() }, 1);
        assert!(scan(DType::I8, true).is_err());
        // A gated scan: the gate is the last argument, and the grid is four
        // blocks per multiprocessor at most (a plain scan takes 32).
        let big = |gate| {
            KernelCall::for_op(
                &KernelOp::CountNonFinite {
                    dtype: DType::F32,
                    ptr: DevicePtr(8),
                    n: 1 << 30,
                    counts: DevicePtr(64),
                    gate,
                },
                4,
            )
            .unwrap()
        };
        let gated = big(Some(DevicePtr(128)));
        assert_eq!((gated.grid[0], gated.args[4]), (16, KernelArg::U64(128)));
        assert_eq!(big(None).grid[0], 128);
        let f = KernelCall::for_op(
            &KernelOp::FingerprintSum {
                src: DevicePtr(8),
                bytes: 1 << 20,
                first_word: 3,
                acc: DevicePtr(64),
            },
            2,
        )
        .unwrap();
        assert_eq!(f.args.len(), 4);
        assert_eq!(
            f.grid[0],
            grid_for(Kernel::FingerprintSum, (1 << 20) / 16, 2)
        );
    }
}
