//! Element types of safetensors files.

use std::fmt;
use std::str::FromStr;

/// Every element type a safetensors header may name. The set is closed: a
/// header naming anything else is rejected.
///
/// Sub-byte types (`F4`, `F6_*`) are sized in bits; a tensor of them must
/// occupy a whole number of bytes.
#[allow(non_camel_case_types)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[non_exhaustive]
pub enum DType {
    /// Boolean, one byte per element.
    BOOL,
    /// 4-bit MX float (E2M1).
    F4,
    /// 6-bit MX float (E2M3).
    F6_E2M3,
    /// 6-bit MX float (E3M2).
    F6_E3M2,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits.
    F8_E5M2,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits.
    F8_E4M3,
    /// 8-bit MX scale (exponent only).
    F8_E8M0,
    /// 8-bit float E4M3, finite, no negative zero (AMD CDNA3 flavour).
    F8_E4M3FNUZ,
    /// 8-bit float E5M2, finite, no negative zero (AMD CDNA3 flavour).
    F8_E5M2FNUZ,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE 754 half precision.
    F16,
    /// bfloat16: the upper half of an f32.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE 754 single precision.
    F32,
    /// Complex number of two f32.
    C64,
    /// IEEE 754 double precision.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl DType {
    /// Every dtype, in the safetensors specification's order.
    pub const ALL: [DType; 22] = [
        DType::BOOL,
        DType::F4,
        DType::F6_E2M3,
        DType::F6_E3M2,
        DType::U8,
        DType::I8,
        DType::F8_E5M2,
        DType::F8_E4M3,
        DType::F8_E8M0,
        DType::F8_E4M3FNUZ,
        DType::F8_E5M2FNUZ,
        DType::I16,
        DType::U16,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::F32,
        DType::C64,
        DType::F64,
        DType::I64,
        DType::U64,
    ];

    /// Size of one element in bits.
    pub const fn bits(self) -> u64 {
        match self {
            DType::F4 => 4,
            DType::F6_E2M3 | DType::F6_E3M2 => 6,
            DType::BOOL
            | DType::U8
            | DType::I8
            | DType::F8_E5M2
            | DType::F8_E4M3
            | DType::F8_E8M0
            | DType::F8_E4M3FNUZ
            | DType::F8_E5M2FNUZ => 8,
            DType::I16 | DType::U16 | DType::F16 | DType::BF16 => 16,
            DType::I32 | DType::U32 | DType::F32 => 32,
            DType::C64 | DType::F64 | DType::I64 | DType::U64 => 64,
        }
    }

    /// Size of one element in whole bytes, or `None` for sub-byte types.
    pub const fn size(self) -> Option<usize> {
        match self.bits() {
            b if b % 8 == 0 => Some((b / 8) as usize),
            _ => None,
        }
    }

    /// The name used in safetensors headers (`"BF16"`, `"F8_E4M3"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::BOOL => "BOOL",
            DType::F4 => "F4",
            DType::F6_E2M3 => "F6_E2M3",
            DType::F6_E3M2 => "F6_E3M2",
            DType::U8 => "U8",
            DType::I8 => "I8",
            DType::F8_E5M2 => "F8_E5M2",
            DType::F8_E4M3 => "F8_E4M3",
            DType::F8_E8M0 => "F8_E8M0",
            DType::F8_E4M3FNUZ => "F8_E4M3FNUZ",
            DType::F8_E5M2FNUZ => "F8_E5M2FNUZ",
            DType::I16 => "I16",
            DType::U16 => "U16",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::I32 => "I32",
            DType::U32 => "U32",
            DType::F32 => "F32",
            DType::C64 => "C64",
            DType::F64 => "F64",
            DType::I64 => "I64",
            DType::U64 => "U64",
        }
    }

    /// Whether this is one of the floating types rocm-safe converts from
    /// (F64, F32, F16, BF16, F8_E4M3, F8_E5M2), each to F32, F16 and BF16:
    /// the sources of `convert::table` (this layer sits below it; a test
    /// there checks that both agree). The FNUZ and MX types are carried but
    /// not converted.
    pub const fn is_convertible_float(self) -> bool {
        matches!(
            self,
            DType::F64 | DType::F32 | DType::F16 | DType::BF16 | DType::F8_E4M3 | DType::F8_E5M2
        )
    }

    /// Number of bytes `elements` elements occupy, or `None` on overflow or
    /// when sub-byte elements do not fill a whole number of bytes.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let bits = elements.checked_mul(self.bits())?;
        (bits % 8 == 0).then_some(bits / 8)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error of [`DType::from_str`]: the name is not a safetensors dtype.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype {0:?}")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;

    /// Parses the exact, case-sensitive header spelling (`"BF16"`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDType(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert!("bf16".parse::<DType>().is_err());
        assert!("F8".parse::<DType>().is_err());
    }

    #[test]
    fn byte_sizes() {
        assert_eq!(DType::BF16.bytes_for(3), Some(6));
        assert_eq!(DType::F4.bytes_for(3), None);
        assert_eq!(DType::F4.bytes_for(4), Some(2));
        assert_eq!(DType::F6_E2M3.bytes_for(4), Some(3));
        assert_eq!(DType::F64.bytes_for(u64::MAX / 4), None);
        assert_eq!(DType::F4.size(), None);
        assert_eq!(DType::C64.size(), Some(8));
    }
}
