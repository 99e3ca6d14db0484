//! The messages ([`std::fmt::Display`]) and sources of [`Error`]'s
//! variants, kept apart from the enum so that each file stays short.

use std::fmt;

use super::{at, Error};

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::LengthMismatch {
                op,
                expected,
                actual,
                tensor,
            } => write!(
                f,
                "{}{op}: length mismatch: expected {expected}, got {actual}",
                at(tensor)
            ),
            Error::DTypeMismatch {
                tensor,
                stored,
                asked,
            } => write!(f, "tensor {tensor}: holds {stored}, asked for {asked}"),
            Error::UnsupportedConversion {
                op,
                from,
                to,
                tensor,
            } => write!(
                f,
                "{}{op}: cannot convert {from} to {to}{}",
                at(tensor),
                if tensor.is_some() {
                    " (read such a tensor as raw bytes)"
                } else {
                    ""
                }
            ),
            Error::Io { path, op, source } => {
                write!(f, "{path}: {op}: {source}", path = path.display())
            }
            Error::FileTooSmall { path, len } => write!(
                f,
                "{path}: not a safetensors file: {len} bytes, shorter than the 8-byte header \
                length",
                path = path.display()
            ),
            Error::LfsPointer { path } => write!(
                f,
                "{path}: this is a git lfs pointer file, not safetensors data: fetch the real \
                file (git lfs pull)",
                path = path.display()
            ),
            Error::HeaderTooLarge { path, len, limit } => write!(
                f,
                "{path}: header length {len} exceeds the limit of {limit} bytes",
                path = path.display()
            ),
            Error::HeaderOutOfBounds {
                path,
                header_len,
                file_len,
            } => write!(
                f,
                "{path}: header of {header_len} bytes does not fit in a file of {file_len} bytes",
                path = path.display()
            ),
            Error::HeaderNotUtf8 { path, valid_up_to } => write!(
                f,
                "{path}: header is not utf-8 (invalid byte at header offset {valid_up_to})",
                path = path.display()
            ),
            Error::HeaderNotObject { path, reason } => write!(
                f,
                "{path}: header is not a json object padded with spaces: {reason}",
                path = path.display()
            ),
            Error::HeaderJson { path, source } => {
                write!(f, "{path}: invalid json: {source}", path = path.display())
            }
            Error::DuplicateKey { path, key, within } => write!(
                f,
                "{path}: duplicate key {key:?} in {within}",
                path = path.display()
            ),
            Error::InvalidMetadata { path, reason, .. } => write!(
                f,
                "{path}: __metadata__ must map strings to strings: {reason}",
                path = path.display()
            ),
            Error::InvalidTensorEntry {
                path,
                tensor,
                field,
                reason,
            } => write!(
                f,
                "{path}: tensor {tensor:?}: {field}: {reason}",
                path = path.display()
            ),
            Error::UnknownDType {
                path,
                tensor,
                dtype,
            } => write!(
                f,
                "{path}: tensor {tensor:?}: unknown dtype {dtype:?}",
                path = path.display()
            ),
            Error::InvalidTensorSize {
                path,
                tensor,
                dtype,
                shape,
                reason,
            } => write!(
                f,
                "{path}: tensor {tensor:?}: shape {shape:?} of {dtype}: {reason}",
                path = path.display()
            ),
            Error::InvalidDataOffsets {
                path,
                tensor,
                begin,
                end,
                expected,
            } => write!(
                f,
                "{path}: tensor {tensor:?}: data_offsets [{begin}, {end}] but dtype and shape \
                need {expected} bytes",
                path = path.display()
            ),
            Error::DataLayout {
                path,
                tensor,
                problem,
                offset,
                data_len,
            } => write!(
                f,
                "{path}: data section of {data_len} bytes: {problem} at offset {offset}{}",
                tensor
                    .as_ref()
                    .map(|t| format!(" (tensor {t:?})"))
                    .unwrap_or_default(),
                path = path.display()
            ),
            Error::TensorNotFound { path, tensor } => write!(
                f,
                "{path}: no tensor named {tensor:?}",
                path = path.display()
            ),
            Error::TooLargeForPlatform {
                path,
                tensor,
                bytes,
            } => write!(
                f,
                "{path}: tensor {tensor:?}: {bytes} bytes do not fit in memory on this platform",
                path = path.display()
            ),
            Error::NoRows {
                path,
                tensor,
                shape,
            } => write!(
                f,
                "{path}: tensor {tensor:?}: shape {shape:?} has no byte-addressable rows",
                path = path.display()
            ),
            Error::RowRange {
                path,
                tensor,
                start,
                end,
                rows,
            } => write!(
                f,
                "{path}: tensor {tensor:?}: row range {start}..{end} invalid for {rows} rows",
                path = path.display()
            ),
            Error::FileShrunk {
                path,
                tensor,
                expected,
                actual,
            } => write!(
                f,
                "{path}: file shrank while reading tensor {tensor:?}: opened with {expected} \
                bytes, now {actual}",
                path = path.display()
            ),
            Error::InvalidIndex { path, reason, .. } => {
                write!(f, "{path}: invalid index: {reason}", path = path.display())
            }
            Error::InvalidShardName {
                path,
                tensor,
                shard,
                reason,
            } => write!(
                f,
                "{path}: shard {shard:?} (tensor {tensor:?}): {reason}",
                path = path.display()
            ),
            Error::TensorInTwoShards {
                path,
                tensor,
                first,
                second,
            } => write!(
                f,
                "{path}: tensor {tensor:?} is in both {first} and {second}",
                path = path.display(),
                first = first.display(),
                second = second.display()
            ),
            Error::TensorNotInIndex {
                path,
                tensor,
                shard,
            } => write!(
                f,
                "{path}: tensor {tensor:?} of shard {shard} is not listed in weight_map",
                path = path.display(),
                shard = shard.display()
            ),
            Error::MetadataConflict {
                path,
                key,
                first,
                second,
                shard,
            } => write!(
                f,
                "{path}: __metadata__ key {key:?} is {first:?} in one shard and {second:?} in \
                {shard}",
                path = path.display(),
                shard = shard.display()
            ),
            Error::Writer {
                path,
                tensor,
                reason,
            } => write!(
                f,
                "{path}: writer: tensor {tensor:?}: {reason}",
                path = path.display()
            ),
            Error::WriterSize {
                path,
                tensor,
                expected,
                actual,
            } => write!(
                f,
                "{path}: writer: tensor {tensor:?}: got {actual} bytes, its dtype and shape \
                need {expected}",
                path = path.display()
            ),
            Error::NotRegularFile { path, kind } => write!(
                f,
                "{path}: not a regular file ({kind}): refused",
                path = path.display()
            ),
            Error::FileChanged { path, tensor, what } => write!(
                f,
                "{path}: changed while being read{}: {what} differs from when it was opened",
                tensor
                    .as_ref()
                    .map(|t| format!(" (tensor {t:?})"))
                    .unwrap_or_default(),
                path = path.display()
            ),
            Error::AllocationFailed {
                path,
                tensor,
                bytes,
                limit,
                reason,
            } => write!(
                f,
                "{path}: tensor {tensor:?}: cannot allocate {bytes} bytes on the host \
                ({reason}; memory: {limit} bytes)",
                path = path.display()
            ),
            Error::OutputIsInput { path, input } => write!(
                f,
                "{path}: output is the same file as the input {input}: refused, nothing written",
                path = path.display(),
                input = input.display()
            ),
            Error::OutputNotRegular { path, kind } => write!(
                f,
                "{path}: output exists and is not a regular file ({kind}): refused, nothing \
                written",
                path = path.display()
            ),
            Error::Cancelled { path } => write!(
                f,
                "{path}: write cancelled, temporary file removed, output not created",
                path = path.display()
            ),
            Error::BackendNotBuilt { backend } => write!(
                f,
                "{backend}: backend not built (enable the `{backend}` feature)"
            ),
            Error::NoRuntime { backend, library } => write!(
                f,
                "{backend}: runtime not available: {library} could not be loaded"
            ),
            Error::RuntimeNotFound { backend, source } => {
                write!(f, "{backend}: runtime not available: {source}")
            }
            Error::DevicePermission {
                backend,
                path,
                reason,
            } => write!(
                f,
                "{backend}: no permission to open {path}: {reason}",
                path = path.display()
            ),
            Error::InvalidEnvironment { var, value, reason } => {
                write!(f, "{var}={value:?} is invalid: {reason}")
            }
            Error::NoDevice {
                backend,
                ordinal,
                count,
                visible,
            } => write!(
                f,
                "{backend}: no device{}: {count} visible ({visible})",
                ordinal.map(|o| format!(" {o}")).unwrap_or_default()
            ),
            Error::BackendUnsupported { backend, op } => {
                write!(f, "{backend}: {op} is not supported by this backend")
            }
            Error::NoSuchDevice { wanted, available } => {
                write!(f, "no device {wanted}: the devices are {available}")
            }
            Error::OutOfMemory { backend, op, bytes } => {
                write!(f, "{backend}: {op}: out of memory allocating {bytes} bytes")
            }
            Error::SizeOverflow { op, elements } => {
                write!(f, "{op}: {elements} elements overflow the address space")
            }
            Error::DeviceMismatch { op } => write!(f, "{op}: operands belong to different devices"),
            Error::EventNotRecorded { op } => write!(f, "{op}: event not recorded"),
            Error::Misaligned { op, addr, align } => {
                write!(f, "{op}: address {addr:#x} is not aligned to {align} bytes")
            }
            Error::OutOfBounds {
                op,
                start,
                end,
                len,
            } => write!(
                f,
                "{op}: range {start}..{end} out of bounds for length {len}"
            ),
            Error::KernelUnavailable {
                backend,
                arch,
                built,
            } => write!(
                f,
                "{backend}: no kernels for {arch} in this build (built for: {built})"
            ),
            Error::RuntimeCall {
                backend,
                op,
                source,
                ..
            } => write!(f, "{backend}: {op}: {source}"),
            Error::Nvrtc {
                arch,
                op,
                code,
                status,
                log,
            } => write!(
                f,
                "cuda: nvrtc compile for {arch}: {op}: {status} (status {code}){}",
                if log.is_empty() {
                    String::new()
                } else {
                    format!("\n{log}")
                }
            ),
            Error::InjectedFault { fault, op } => write!(f, "{op}: injected fault: {fault}"),
            Error::VerificationFailed {
                op,
                device,
                expected,
                actual,
            } => write!(
                f,
                "{op}: verification failed on {device}: expected fingerprint {expected}, \
                device gave {actual}"
            ),
            Error::KernelUntrusted {
                op,
                device,
                mismatches,
                tested,
            } => write!(
                f,
                "{op}: the device kernel failed its self-test on {device} ({mismatches} of \
                {tested} patterns wrong) and fallback is off"
            ),
            Error::Conv3dParam {
                param,
                value,
                reason,
            } => write!(f, "conv3d: {param} {value:?}: {reason}"),
            Error::Conv3dShape {
                tensor,
                shape,
                reason,
            } => write!(f, "conv3d: {tensor} shape {shape:?}: {reason}"),
            Error::Conv3dDType {
                tensor,
                dtype,
                expected,
            } => write!(f, "conv3d: {tensor} has dtype {dtype}, expected {expected}"),
            Error::Conv3dTooLarge { what, bytes, limit } => write!(
                f,
                "conv3d: {what} needs {bytes} bytes, more than this machine's memory ({limit} \
                bytes)"
            ),
            Error::Conv3dOverflow {
                index,
                reference,
                value,
                tier,
            } => write!(
                f,
                "conv3d: result overflows f32 at output index {index}: exact value \
                {reference:e} (tier {tier} gave {value})"
            ),
            Error::Conv3dTier { tier, reason } => write!(f, "conv3d tier {tier}: {reason}"),
            Error::Conv3dNoTier { report } => {
                write!(f, "conv3d: no tier served the call: {report}")
            }
            Error::Conv3dCudnn { op, code, status } => {
                write!(f, "conv3d: cudnn: {op}: {status} (status {code})")
            }
            Error::VendorUnavailable {
                backend,
                library,
                reason,
            } => write!(
                f,
                "{backend}: vendor library {library} unavailable: {reason}"
            ),
            Error::Conv3dMiopen { op, code, status } => {
                write!(f, "conv3d: miopen: {op}: {status} (status {code})")
            }
            Error::TransferFailed {
                tensor,
                rung,
                failure,
                ..
            } => write!(
                f,
                "load {tensor:?}: rung {rung} failed and fallback is off: {failure}"
            ),
            Error::InvalidLoadOptions { field, reason } => {
                write!(f, "load options: {field}: {reason}")
            }
            Error::DlpackUnsupported { op, what, found } => {
                write!(f, "dlpack {op}: unsupported {what}: {found}")
            }
            Error::DlpackInvalid { op, what, found } => {
                write!(f, "dlpack {op}: invalid {what}: {found}")
            }
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            Error::HeaderJson { source, .. } => Some(source),
            Error::RuntimeNotFound { source, .. } => Some(source),
            Error::RuntimeCall { source, .. } => Some(&**source),
            Error::TransferFailed { source, .. } => source.as_deref().map(|e| e as _),
            _ => None,
        }
    }
}
