//! The `safetensors` crate (a dev-dependency: the reference the reader and
//! writer are compared with), seen from rocm-safe's types.

use rocm_safe::DType;

/// The `safetensors` crate's dtype of the same name (both spell it as the
/// header does).
pub fn to_st(d: DType) -> safetensors::Dtype {
    serde_json::from_value(serde_json::Value::String(d.name().to_owned()))
        .unwrap_or_else(|e| panic!("safetensors has no dtype {d}: {e}"))
}
