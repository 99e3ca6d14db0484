//! DLPack descriptors of rocm-safe's element types and devices, both ways.

use super::ffi::{DLDataType, DLDataTypeCode, DLDevice, DLDeviceType};

use crate::device::{BackendKind, Device};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The DLPack element type of `dtype` (one lane). Every [`DType`] has one
/// in DLPack 1.3: `BF16` is `kDLBfloat` 16, `C64` `kDLComplex` 64, `BOOL`
/// `kDLBool` 8, `F8_E4M3` `kDLFloat8_e4m3fn` (the safetensors and PyTorch
/// `float8_e4m3fn`), `F8_E5M2` `kDLFloat8_e5m2`, `F8_E8M0`
/// `kDLFloat8_e8m0fnu`, the `FNUZ` pair their `fnuz` codes, `F6_E2M3` /
/// `F6_E3M2` `kDLFloat6_e2m3fn` / `kDLFloat6_e3m2fn` 6 and `F4`
/// `kDLFloat4_e2m1fn` 4 (packed).
pub fn data_type(dtype: DType) -> DLDataType {
    use DLDataTypeCode as C;
    let (code, bits) = match dtype {
        DType::BOOL => (C::BOOL, 8),
        DType::F4 => (C::FLOAT4_E2M1FN, 4),
        DType::F6_E2M3 => (C::FLOAT6_E2M3FN, 6),
        DType::F6_E3M2 => (C::FLOAT6_E3M2FN, 6),
        DType::U8 => (C::UINT, 8),
        DType::I8 => (C::INT, 8),
        DType::F8_E5M2 => (C::FLOAT8_E5M2, 8),
        DType::F8_E4M3 => (C::FLOAT8_E4M3FN, 8),
        DType::F8_E8M0 => (C::FLOAT8_E8M0FNU, 8),
        DType::F8_E4M3FNUZ => (C::FLOAT8_E4M3FNUZ, 8),
        DType::F8_E5M2FNUZ => (C::FLOAT8_E5M2FNUZ, 8),
        DType::I16 => (C::INT, 16),
        DType::U16 => (C::UINT, 16),
        DType::F16 => (C::FLOAT, 16),
        DType::BF16 => (C::BFLOAT, 16),
        DType::I32 => (C::INT, 32),
        DType::U32 => (C::UINT, 32),
        DType::F32 => (C::FLOAT, 32),
        DType::C64 => (C::COMPLEX, 64),
        DType::F64 => (C::FLOAT, 64),
        DType::I64 => (C::INT, 64),
        DType::U64 => (C::UINT, 64),
    };
    DLDataType::scalar(code, bits)
}

/// The [`DType`] of a DLPack element type: the inverse of [`data_type`].
///
/// Errors: [`Error::DlpackUnsupported`] (`what: "lanes"`) for vector types,
/// (`what: "dtype"`) for a code and width rocm-safe has no dtype for
/// (`kDLFloat8_e4m3`, `kDLFloat8_e3m4`, `kDLFloat8_e4m3b11fnuz`,
/// `kDLComplex` 128, opaque handles, unknown codes).
pub fn dtype(dt: DLDataType) -> Result<DType> {
    if dt.lanes != 1 {
        return Err(Error::DlpackUnsupported {
            op: "import",
            what: "lanes",
            found: format!("{} lanes (only 1)", dt.lanes),
        });
    }
    DType::ALL
        .into_iter()
        .find(|&d| data_type(d) == dt)
        .ok_or_else(|| Error::DlpackUnsupported {
            op: "import",
            what: "dtype",
            found: format!("code {} with {} bits", dt.code.0, dt.bits),
        })
}

/// Where `device`'s memory is, as DLPack names it: `kDLROCM` on HIP,
/// `kDLCUDA` on CUDA, `kDLCPU` on the host backend, with the device's
/// ordinal (what a Python `__dlpack_device__` returns).
///
/// Errors: [`Error::DlpackUnsupported`] (`what: "device"`) when the ordinal
/// does not fit DLPack's `int32_t`.
pub fn dl_device(device: &Device) -> Result<DLDevice> {
    let ordinal = device.info().ordinal;
    let device_id = i32::try_from(ordinal).map_err(|_| Error::DlpackUnsupported {
        op: "export",
        what: "device",
        found: format!("ordinal {ordinal} does not fit an int32"),
    })?;
    let device_type = match device.kind() {
        BackendKind::Host => DLDeviceType::CPU,
        BackendKind::Hip => DLDeviceType::ROCM,
        BackendKind::Cuda => DLDeviceType::CUDA,
    };
    Ok(DLDevice {
        device_type,
        device_id,
    })
}

/// Whether memory at `dl` can be read through `device`'s backend: the
/// device's own type and ordinal; on the host backend also pinned host
/// memory (`kDLCUDAHost`, `kDLROCMHost`), which is host memory there.
pub(super) fn usable_on(dl: DLDevice, device: &Device) -> bool {
    let Ok(own) = dl_device(device) else {
        return false;
    };
    let host_memory = [
        DLDeviceType::CPU,
        DLDeviceType::CUDAHOST,
        DLDeviceType::ROCMHOST,
    ];
    let type_ok = dl.device_type == own.device_type
        || (device.kind() == BackendKind::Host && host_memory.contains(&dl.device_type));
    type_ok && dl.device_id == own.device_id
}

/// `"rocm:0"`, `"cpu:0"`, `"device type 99:0"`: a DLPack device for
/// messages.
pub(super) fn device_name(dl: DLDevice) -> String {
    let name = match dl.device_type.0 {
        1 => "cpu",
        2 => "cuda",
        3 => "cuda_host",
        4 => "opencl",
        7 => "vulkan",
        8 => "metal",
        9 => "vpi",
        10 => "rocm",
        11 => "rocm_host",
        12 => "ext_dev",
        13 => "cuda_managed",
        14 => "oneapi",
        15 => "webgpu",
        16 => "hexagon",
        17 => "maia",
        18 => "trn",
        n => return format!("device type {n}:{}", dl.device_id),
    };
    format!("{name}:{}", dl.device_id)
}

/// dlpark's device of ours (the same C structure; dlpark builds and reads
/// the managed tensors).
pub(super) fn to_dlpark_device(d: DLDevice) -> dlpark::ffi::DLDevice {
    dlpark::ffi::DLDevice {
        device_type: dlpark::ffi::DLDeviceType(d.device_type.0),
        device_id: d.device_id,
    }
}

/// Ours of dlpark's device.
pub(super) fn from_dlpark_device(d: dlpark::ffi::DLDevice) -> DLDevice {
    DLDevice {
        device_type: DLDeviceType(d.device_type.0),
        device_id: d.device_id,
    }
}

/// dlpark's element type of ours.
pub(super) fn to_dlpark_dtype(t: DLDataType) -> dlpark::ffi::DLDataType {
    dlpark::ffi::DLDataType {
        code: dlpark::ffi::DLDataTypeCode(t.code.0),
        bits: t.bits,
        lanes: t.lanes,
    }
}

/// Ours of dlpark's element type.
pub(super) fn from_dlpark_dtype(t: dlpark::ffi::DLDataType) -> DLDataType {
    DLDataType {
        code: DLDataTypeCode(t.code.0),
        bits: t.bits,
        lanes: t.lanes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_dtype_round_trips_and_codes_are_distinct() {
        for d in DType::ALL {
            let dt = data_type(d);
            assert_eq!(dt.lanes, 1);
            assert_eq!(u64::from(dt.bits), d.bits(), "{d}");
            assert_eq!(dtype(dt).ok(), Some(d));
        }
        let mut all: Vec<_> = DType::ALL
            .iter()
            .map(|&d| (data_type(d).code.0, data_type(d).bits))
            .collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), DType::ALL.len());
    }

    #[test]
    fn device_names() {
        let d = DLDevice {
            device_type: DLDeviceType::ROCM,
            device_id: 1,
        };
        assert_eq!(device_name(d), "rocm:1");
        let d = DLDevice {
            device_type: DLDeviceType(99),
            device_id: 0,
        };
        assert_eq!(device_name(d), "device type 99:0");
    }
}
