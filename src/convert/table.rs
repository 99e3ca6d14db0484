//! The conversion table: one row per `(source, target)` pair the crate
//! converts, and everything else about conversions derived from it.
//!
//! A row names the pair, the element sizes, the scalar reference (the
//! contract, [`crate::convert::scalar`]), the CPU bulk loop, the device
//! kernel symbol (`convert_{src}_{dst}` in `kernels/convert.hip`) and
//! the fused convert+fingerprint symbol where one exists, the elements one
//! device work item converts, and whether every number converts exactly.
//! From the rows come: [`supported`](crate::convert::supported) and the CPU
//! dispatch, the kernels the GPU backends load and launch
//! (`device::kernels`), [`ConvertOp::DEVICE`](crate::device::ConvertOp)'s
//! list, the per-device self-test's patterns (`verify::self_test`, one
//! pattern set per row, [`Conversion::patterns`]), the loader's routing
//! (a pair without a device kernel converts on the CPU), and Python's
//! tables (`rocm_safe._native.conversions()`).
//!
//! Adding a dtype: ARCHITECTURE.md, "The conversion table".

use super::kernels::{self, Kernel};
use super::scalar as sc;
use crate::dtype::DType;

/// One conversion pair and how each path performs it.
#[derive(Clone, Copy)]
pub struct Conversion {
    /// Source dtype.
    pub from: DType,
    /// Target dtype.
    pub to: DType,
    /// Source element size in bytes.
    pub src_size: usize,
    /// Target element size in bytes.
    pub dst_size: usize,
    /// The scalar reference: one element's bit pattern in (zero-extended to
    /// 64 bits), the target's out (zero-extended). Every other path is
    /// tested bit for bit against it.
    pub scalar: fn(u64) -> u64,
    /// The device kernel's symbol, `None` where only the CPU converts the
    /// pair (the loader then routes it to its CPU rung).
    pub kernel: Option<&'static str>,
    /// The fused convert + fingerprint kernel's symbol (widening to f32
    /// only), `None` where the output is fingerprinted by a separate pass.
    pub fused: Option<&'static str>,
    /// Elements one work item of the device kernels converts (one 16-byte
    /// vector step); sizes their grids. 0 without a device kernel.
    pub per_item: u32,
    /// Every number of the source is a number of the target (a widening):
    /// the conversion loses nothing but possibly NaN payload bits.
    pub lossless: bool,
    /// The CPU bulk loop (three builds).
    pub(crate) bulk: Kernel,
}

impl std::fmt::Debug for Conversion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conversion")
            .field("from", &self.from)
            .field("to", &self.to)
            .field("kernel", &self.kernel)
            .field("fused", &self.fused)
            .field("per_item", &self.per_item)
            .field("lossless", &self.lossless)
            .finish_non_exhaustive()
    }
}

/// Where a row runs besides the CPU.
#[derive(Clone, Copy)]
enum On {
    /// The CPU only.
    Cpu,
    /// A device kernel converting `per_item` elements per work item.
    Device(&'static str, u32),
    /// A device kernel and its fused convert + fingerprint twin.
    Fused(&'static str, &'static str, u32),
}

const fn size(d: DType) -> usize {
    match d.size() {
        Some(s) => s,
        None => 0,
    }
}

const fn row(
    from: DType,
    to: DType,
    scalar: fn(u64) -> u64,
    bulk: kernels::Builds,
    on: On,
    lossless: bool,
) -> Conversion {
    let (kernel, fused, per_item) = match on {
        On::Cpu => (None, None, 0),
        On::Device(k, n) => (Some(k), None, n),
        On::Fused(k, f, n) => (Some(k), Some(f), n),
    };
    Conversion {
        from,
        to,
        src_size: size(from),
        dst_size: size(to),
        scalar,
        kernel,
        fused,
        per_item,
        lossless,
        bulk: Kernel::of(size(from), size(to), bulk),
    }
}

/// The three builds of a bulk loop named `$k` (`$k`, `$k_stream`,
/// `$k_portable` in `kernels`).
macro_rules! b {
    (copy) => {
        [kernels::copy, kernels::copy, kernels::copy]
    };
    ($k:ident, $s:ident, $p:ident) => {
        [kernels::$k, kernels::$s, kernels::$p]
    };
}

use DType::{BF16, F16, F32, F64, F8_E4M3, F8_E5M2};

/// Every conversion the crate performs, by source (bf16, f16, f32, f64,
/// f8; the device rows in [`ConvertOp::DEVICE`](crate::device::ConvertOp)'s
/// order) then target.
pub const CONVERSIONS: [Conversion; 18] = [
    // bf16 sources.
    row(
        BF16,
        F32,
        |b| sc::bf16_to_f32(b as u16) as u64,
        b!(bf16_f32, bf16_f32_stream, bf16_f32_portable),
        On::Fused("convert_bf16_f32", "convert_fingerprint_bf16_f32", 8),
        true,
    ),
    row(BF16, BF16, |b| b as u16 as u64, b!(copy), On::Cpu, true),
    row(
        BF16,
        F16,
        |b| sc::bf16_to_f16(b as u16) as u64,
        b!(bf16_f16, bf16_f16_stream, bf16_f16_portable),
        On::Cpu,
        false,
    ),
    // f16 sources.
    row(
        F16,
        F32,
        |b| sc::f16_to_f32(b as u16) as u64,
        b!(f16_f32, f16_f32_stream, f16_f32_portable),
        On::Fused("convert_f16_f32", "convert_fingerprint_f16_f32", 8),
        true,
    ),
    row(
        F16,
        BF16,
        |b| sc::f16_to_bf16(b as u16) as u64,
        b!(f16_bf16, f16_bf16_stream, f16_bf16_portable),
        On::Cpu,
        false,
    ),
    row(F16, F16, |b| b as u16 as u64, b!(copy), On::Cpu, true),
    // f32 sources.
    row(F32, F32, |b| b as u32 as u64, b!(copy), On::Cpu, true),
    row(
        F32,
        BF16,
        |b| sc::f32_to_bf16(b as u32) as u64,
        b!(f32_bf16, f32_bf16_stream, f32_bf16_portable),
        On::Device("convert_f32_bf16", 8),
        false,
    ),
    row(
        F32,
        F16,
        |b| sc::f32_to_f16(b as u32) as u64,
        b!(f32_f16, f32_f16_stream, f32_f16_portable),
        On::Device("convert_f32_f16", 8),
        false,
    ),
    // f64 sources: CPU only (the loader converts them on its CPU rung).
    row(
        F64,
        F32,
        |b| sc::f64_to_f32(b) as u64,
        b!(f64_f32, f64_f32_stream, f64_f32_portable),
        On::Cpu,
        false,
    ),
    row(
        F64,
        BF16,
        |b| sc::f64_to_bf16(b) as u64,
        b!(f64_bf16, f64_bf16_stream, f64_bf16_portable),
        On::Cpu,
        false,
    ),
    row(
        F64,
        F16,
        |b| sc::f64_to_f16(b) as u64,
        b!(f64_f16, f64_f16_stream, f64_f16_portable),
        On::Cpu,
        false,
    ),
    // f8 sources (e4m3fn, e5m2): exact widenings.
    row(
        F8_E4M3,
        F32,
        |b| sc::f8_e4m3_to_f32(b as u8) as u64,
        b!(f8e4m3_f32, f8e4m3_f32_stream, f8e4m3_f32_portable),
        On::Device("convert_f8_e4m3_f32", 16),
        true,
    ),
    row(
        F8_E4M3,
        BF16,
        |b| sc::f8_e4m3_to_bf16(b as u8) as u64,
        b!(f8e4m3_bf16, f8e4m3_bf16_stream, f8e4m3_bf16_portable),
        On::Cpu,
        true,
    ),
    row(
        F8_E4M3,
        F16,
        |b| sc::f8_e4m3_to_f16(b as u8) as u64,
        b!(f8e4m3_f16, f8e4m3_f16_stream, f8e4m3_f16_portable),
        On::Cpu,
        true,
    ),
    row(
        F8_E5M2,
        F32,
        |b| sc::f8_e5m2_to_f32(b as u8) as u64,
        b!(f8e5m2_f32, f8e5m2_f32_stream, f8e5m2_f32_portable),
        On::Device("convert_f8_e5m2_f32", 16),
        true,
    ),
    row(
        F8_E5M2,
        BF16,
        |b| sc::f8_e5m2_to_bf16(b as u8) as u64,
        b!(f8e5m2_bf16, f8e5m2_bf16_stream, f8e5m2_bf16_portable),
        On::Cpu,
        true,
    ),
    row(
        F8_E5M2,
        F16,
        |b| sc::f8_e5m2_to_f16(b as u8) as u64,
        b!(f8e5m2_f16, f8e5m2_f16_stream, f8e5m2_f16_portable),
        On::Cpu,
        true,
    ),
];

/// The row of `from -> to`, `None` for a pair the crate does not convert.
pub const fn find(from: DType, to: DType) -> Option<&'static Conversion> {
    let mut i = 0;
    while i < CONVERSIONS.len() {
        let r = &CONVERSIONS[i];
        if r.from as u8 == from as u8 && r.to as u8 == to as u8 {
            return Some(r);
        }
        i += 1;
    }
    None
}

/// Whether some row converts from `from` (the dtypes a load's `dtype=`
/// converts; [`DType::is_convertible_float`] says the same, checked by a
/// test, from the layer below).
pub const fn converts_from(from: DType) -> bool {
    let mut i = 0;
    while i < CONVERSIONS.len() {
        if CONVERSIONS[i].from as u8 == from as u8 {
            return true;
        }
        i += 1;
    }
    false
}

/// The targets of the table (F32, BF16, F16), each once, in table order.
pub fn targets() -> Vec<DType> {
    let mut out: Vec<DType> = Vec::new();
    for r in &CONVERSIONS {
        if !out.contains(&r.to) {
            out.push(r.to);
        }
    }
    out
}

/// The rows with a device kernel, in table order.
pub fn device_rows() -> impl Iterator<Item = &'static Conversion> {
    CONVERSIONS.iter().filter(|r| r.kernel.is_some())
}

/// Low halves combined with every upper half for the f32 patterns: the
/// rounding boundaries of bf16 (bit 15) and f16 (bit 12 and, for f16
/// subnormal results, up to bit 23 through the shift).
const TRICKY_LOW: [u32; 12] = [
    0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff,
];

impl Conversion {
    /// The source patterns the device self-test runs through this row's
    /// kernels, as little-endian source bytes: every code of an 8- or
    /// 16-bit source; for a 32-bit source every upper half combined with
    /// the rounding-critical lower halves (786 432 patterns); for a 64-bit
    /// source every upper 16 bits with the same lower halves at the
    /// rounding points of f32.
    pub fn patterns(&self) -> Vec<u8> {
        match self.src_size {
            1 => (0..=u8::MAX).collect(),
            2 => (0..=u16::MAX).flat_map(u16::to_le_bytes).collect(),
            4 => (0..=u32::from(u16::MAX))
                .flat_map(|hi| TRICKY_LOW.map(|lo| (hi << 16) | lo))
                .flat_map(u32::to_le_bytes)
                .collect(),
            _ => (0..=u64::from(u16::MAX))
                .flat_map(|hi| TRICKY_LOW.map(|lo| (hi << 48) | (u64::from(lo) << 13)))
                .flat_map(u64::to_le_bytes)
                .collect(),
        }
    }

    /// `"bf16->f32"`: the pair as reports and kernel-test names write it.
    pub fn label(&self) -> String {
        format!(
            "{}->{}",
            self.from.name().to_lowercase(),
            self.to.name().to_lowercase()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_unique_sized_and_consistent() {
        for (i, r) in CONVERSIONS.iter().enumerate() {
            assert_eq!(Some(r.src_size), r.from.size(), "{r:?}");
            assert_eq!(Some(r.dst_size), r.to.size(), "{r:?}");
            assert_eq!((r.bulk.src_size, r.bulk.dst_size), (r.src_size, r.dst_size));
            assert!(
                CONVERSIONS[..i]
                    .iter()
                    .all(|o| (o.from, o.to) != (r.from, r.to)),
                "{r:?} twice"
            );
            assert_eq!(find(r.from, r.to).map(|f| f.label()), Some(r.label()));
            // A device kernel follows the naming rule and sizes its grid;
            // a fused kernel exists only beside a plain one, widening to f32.
            match r.kernel {
                Some(k) => {
                    assert_eq!(k, format!("convert_{}", r.label().replace("->", "_")));
                    assert!(r.per_item > 0 && 16 % r.src_size.min(r.dst_size) == 0);
                }
                None => assert_eq!((r.fused, r.per_item), (None, 0)),
            }
            if let Some(f) = r.fused {
                assert_eq!(r.to, DType::F32);
                assert_eq!(
                    f,
                    format!("convert_fingerprint_{}", r.label().replace("->", "_"))
                );
            }
        }
    }

    #[test]
    fn the_dtype_layer_agrees_with_the_table() {
        for d in DType::ALL {
            assert_eq!(d.is_convertible_float(), converts_from(d), "{d}");
            if converts_from(d) {
                // Every source converts to every target.
                for t in targets() {
                    assert!(find(d, t).is_some(), "{d}->{t}");
                }
            }
        }
        assert_eq!(targets(), [DType::F32, DType::BF16, DType::F16]);
    }

    #[test]
    fn lossless_rows_keep_every_number() {
        // Widening rows: every non-NaN source round-trips through f64.
        for r in CONVERSIONS.iter().filter(|r| r.lossless && r.src_size <= 2) {
            let pats = r.patterns();
            for code in pats.chunks_exact(r.src_size) {
                let mut b = [0u8; 8];
                b[..r.src_size].copy_from_slice(code);
                let bits = u64::from_le_bytes(b);
                let (x, y) = (decode(r.from, bits), decode(r.to, (r.scalar)(bits)));
                assert!(
                    x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                    "{} of {bits:#x}: {x} -> {y}",
                    r.label()
                );
            }
        }
    }

    /// An f64 decode independent of the crate's conversions (for the
    /// dtypes of the lossless rows).
    fn decode(d: DType, bits: u64) -> f64 {
        let (e_bits, m_bits, inf_nan) = match d {
            DType::F32 => return f64::from(f32::from_bits(bits as u32)),
            DType::F16 => (5, 10, true),
            DType::BF16 => (8, 7, true),
            DType::F8_E5M2 => (5, 2, true),
            DType::F8_E4M3 => (4, 3, false),
            _ => unreachable!("{d}"),
        };
        let width = 1 + e_bits + m_bits;
        let sign = if (bits >> (width - 1)) & 1 == 1 {
            -1.0
        } else {
            1.0
        };
        let e = ((bits >> m_bits) & ((1 << e_bits) - 1)) as i32;
        let m = (bits & ((1 << m_bits) - 1)) as f64;
        let bias = (1 << (e_bits - 1)) - 1;
        let emax = (1 << e_bits) - 1;
        let scale = f64::from(1u32 << m_bits);
        if inf_nan && e == emax {
            return if m == 0.0 {
                sign * f64::INFINITY
            } else {
                f64::NAN
            };
        }
        if !inf_nan && e == emax && m == scale - 1.0 {
            return f64::NAN;
        }
        if e == 0 {
            return sign * (m / scale) * 2f64.powi(1 - bias);
        }
        sign * (1.0 + m / scale) * 2f64.powi(e - bias)
    }
}
