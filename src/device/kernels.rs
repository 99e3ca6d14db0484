//! The kernels of `hip-kernels/` as the GPU backends name and launch them.

#[cfg(any(feature = "hip", feature = "cuda"))]
include!(concat!(env!("OUT_DIR"), "/kernels.rs"));

use super::ConvertOp;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Threads per block for every kernel (fingerprint.hip's RS_FP_BLOCK).
#[allow(dead_code)]
pub(crate) const BLOCK: u32 = 256;

/// Every kernel symbol the backends load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(dead_code)]
pub(crate) enum Kernel {
    ConvertBf16F32,
    ConvertF16F32,
    ConvertF32Bf16,
    ConvertF32F16,
    FingerprintSum,
    ConvertFingerprintBf16F32,
    ConvertFingerprintF16F32,
    NonfiniteF32,
    NonfiniteBf16,
    NonfiniteF16,
}

#[allow(dead_code)]
impl Kernel {
    pub(crate) const ALL: [Kernel; 10] = [
        Kernel::ConvertBf16F32,
        Kernel::ConvertF16F32,
        Kernel::ConvertF32Bf16,
        Kernel::ConvertF32F16,
        Kernel::FingerprintSum,
        Kernel::ConvertFingerprintBf16F32,
        Kernel::ConvertFingerprintF16F32,
        Kernel::NonfiniteF32,
        Kernel::NonfiniteBf16,
        Kernel::NonfiniteF16,
    ];

    /// The extern "C" symbol.
    pub(crate) const fn symbol(self) -> &'static str {
        match self {
            Kernel::ConvertBf16F32 => "convert_bf16_f32",
            Kernel::ConvertF16F32 => "convert_f16_f32",
            Kernel::ConvertF32Bf16 => "convert_f32_bf16",
            Kernel::ConvertF32F16 => "convert_f32_f16",
            Kernel::FingerprintSum => "fingerprint_sum_u8",
            Kernel::ConvertFingerprintBf16F32 => "convert_fingerprint_bf16_f32",
            Kernel::ConvertFingerprintF16F32 => "convert_fingerprint_f16_f32",
            Kernel::NonfiniteF32 => "nonfinite_f32",
            Kernel::NonfiniteBf16 => "nonfinite_bf16",
            Kernel::NonfiniteF16 => "nonfinite_f16",
        }
    }

    pub(crate) fn convert(op: ConvertOp) -> Result<Kernel> {
        Ok(match (op.from, op.to) {
            (DType::BF16, DType::F32) => Kernel::ConvertBf16F32,
            (DType::F16, DType::F32) => Kernel::ConvertF16F32,
            (DType::F32, DType::BF16) => Kernel::ConvertF32Bf16,
            (DType::F32, DType::F16) => Kernel::ConvertF32F16,
            _ => return Err(unsupported("convert", op)),
        })
    }

    pub(crate) fn convert_fingerprint(op: ConvertOp) -> Result<Kernel> {
        Ok(match (op.from, op.to) {
            (DType::BF16, DType::F32) => Kernel::ConvertFingerprintBf16F32,
            (DType::F16, DType::F32) => Kernel::ConvertFingerprintF16F32,
            _ => return Err(unsupported("convert_fingerprint", op)),
        })
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
                })
            }
        })
    }
}

/// Blocks of [`BLOCK`] threads for `items` work items (16-byte vectors,
/// elements) of kernel `k` on a device with `mps` multiprocessors.
///
/// Measured on an H100 (BENCHMARKS.md): the plain conversions run fastest
/// with one item per thread (a grid covering everything, capped so that the
/// total thread count stays below 2^32 as HIP requires; the grid-stride loop
/// covers the rest); the reductions (fingerprint, fused, nonfinite) with
/// about 32 to 64 blocks per multiprocessor, so that each thread's fixed
/// lane keys and its partial sum are reused over many items.
#[allow(dead_code)]
pub(crate) fn grid_for(k: Kernel, items: u64, mps: u32) -> u32 {
    let need = items.div_ceil(u64::from(BLOCK)).max(1);
    let cap = match k {
        Kernel::ConvertBf16F32
        | Kernel::ConvertF16F32
        | Kernel::ConvertF32Bf16
        | Kernel::ConvertF32F16 => 1u64 << 22,
        Kernel::ConvertFingerprintBf16F32 | Kernel::ConvertFingerprintF16F32 => {
            u64::from(mps.max(1)) * 64
        }
        _ => u64::from(mps.max(1)) * 32,
    };
    // Clamp rather than truncate.
    u32::try_from(need.min(cap)).unwrap_or(u32::MAX)
}

fn unsupported(op: &'static str, c: ConvertOp) -> Error {
    Error::UnsupportedConversion {
        op,
        from: c.from,
        to: c.to,
    }
}
