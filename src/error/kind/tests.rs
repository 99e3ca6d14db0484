//! Every variant's kind, checked against a table written apart from
//! [`Error::kind`]: a variant added without a kind, or without a sample
//! here, fails to compile or fails [`every_variant_has_its_kind`].

use std::collections::BTreeSet;
use std::path::PathBuf;

use super::super::{Error, ErrorKind as K, NotFound, TensorRef};
use crate::convert::fingerprint::value::Fingerprint;
use crate::device::fault_kind::FaultKind;
use crate::device::visible::VisibleDevices;
use crate::dtype::DType;

/// The variant's name and the kind it should have. No wildcard: a new
/// variant is a compile error here until it is given an expected kind.
fn expected(e: &Error) -> (&'static str, K) {
    match e {
        Error::LengthMismatch { .. } => ("LengthMismatch", K::Usage),
        Error::DTypeMismatch { .. } => ("DTypeMismatch", K::Usage),
        Error::UnsupportedConversion { .. } => ("UnsupportedConversion", K::Unsupported),
        Error::Io { .. } => ("Io", K::Io),
        Error::FileTooSmall { .. } => ("FileTooSmall", K::InvalidFile),
        Error::LfsPointer { .. } => ("LfsPointer", K::InvalidFile),
        Error::HeaderTooLarge { .. } => ("HeaderTooLarge", K::InvalidFile),
        Error::HeaderOutOfBounds { .. } => ("HeaderOutOfBounds", K::InvalidFile),
        Error::HeaderNotUtf8 { .. } => ("HeaderNotUtf8", K::InvalidFile),
        Error::HeaderNotObject { .. } => ("HeaderNotObject", K::InvalidFile),
        Error::HeaderJson { .. } => ("HeaderJson", K::InvalidFile),
        Error::DuplicateKey { .. } => ("DuplicateKey", K::InvalidFile),
        Error::InvalidMetadata { .. } => ("InvalidMetadata", K::InvalidFile),
        Error::InvalidTensorEntry { .. } => ("InvalidTensorEntry", K::InvalidFile),
        Error::UnknownDType { .. } => ("UnknownDType", K::InvalidFile),
        Error::InvalidTensorSize { .. } => ("InvalidTensorSize", K::InvalidFile),
        Error::InvalidDataOffsets { .. } => ("InvalidDataOffsets", K::InvalidFile),
        Error::DataLayout { .. } => ("DataLayout", K::InvalidFile),
        Error::TensorNotFound { .. } => ("TensorNotFound", K::NotFound),
        Error::TooLargeForPlatform { .. } => ("TooLargeForPlatform", K::Unsupported),
        Error::NoRows { .. } => ("NoRows", K::Usage),
        Error::SliceDim { .. } => ("SliceDim", K::Usage),
        Error::RowRange { .. } => ("RowRange", K::Usage),
        Error::FileShrunk { .. } => ("FileShrunk", K::Changed),
        Error::InvalidIndex { .. } => ("InvalidIndex", K::InvalidFile),
        Error::InvalidShardName { .. } => ("InvalidShardName", K::InvalidFile),
        Error::TensorInTwoShards { .. } => ("TensorInTwoShards", K::InvalidFile),
        Error::TensorNotInIndex { .. } => ("TensorNotInIndex", K::InvalidFile),
        Error::MetadataConflict { .. } => ("MetadataConflict", K::InvalidFile),
        Error::Writer { .. } => ("Writer", K::Usage),
        Error::WriterSize { .. } => ("WriterSize", K::Usage),
        Error::NotRegularFile { .. } => ("NotRegularFile", K::Io),
        Error::FileChanged { .. } => ("FileChanged", K::Changed),
        Error::AllocationFailed { .. } => ("AllocationFailed", K::OutOfMemory),
        Error::OutputIsInput { .. } => ("OutputIsInput", K::Usage),
        Error::OutputNotRegular { .. } => ("OutputNotRegular", K::Usage),
        Error::Cancelled { .. } => ("Cancelled", K::Cancelled),
        Error::BackendNotBuilt { .. } => ("BackendNotBuilt", K::Unavailable),
        Error::NoRuntime { .. } => ("NoRuntime", K::Unavailable),
        Error::RuntimeNotFound { .. } => ("RuntimeNotFound", K::Unavailable),
        Error::DevicePermission { .. } => ("DevicePermission", K::Unavailable),
        Error::InvalidEnvironment { .. } => ("InvalidEnvironment", K::Unavailable),
        Error::NoDevice { .. } => ("NoDevice", K::Unavailable),
        Error::BackendUnsupported { .. } => ("BackendUnsupported", K::Unavailable),
        Error::NoSuchDevice { .. } => ("NoSuchDevice", K::Unavailable),
        Error::OutOfMemory { .. } => ("OutOfMemory", K::OutOfMemory),
        Error::SizeOverflow { .. } => ("SizeOverflow", K::Overflow),
        Error::DeviceMismatch { .. } => ("DeviceMismatch", K::Usage),
        Error::EventNotRecorded { .. } => ("EventNotRecorded", K::Usage),
        Error::Misaligned { .. } => ("Misaligned", K::Usage),
        Error::OutOfBounds { .. } => ("OutOfBounds", K::Usage),
        Error::KernelUnavailable { .. } => ("KernelUnavailable", K::Unavailable),
        Error::RuntimeCall { .. } => ("RuntimeCall", K::Device),
        Error::Nvrtc { .. } => ("Nvrtc", K::Device),
        Error::InjectedFault { .. } => ("InjectedFault", K::Device),
        Error::VerificationFailed { .. } => ("VerificationFailed", K::Verification),
        Error::KernelUntrusted { .. } => ("KernelUntrusted", K::Verification),
        Error::Conv3dParam { .. } => ("Conv3dParam", K::Usage),
        Error::Conv3dShape { .. } => ("Conv3dShape", K::Usage),
        Error::Conv3dDType { .. } => ("Conv3dDType", K::Usage),
        Error::Conv3dTooLarge { .. } => ("Conv3dTooLarge", K::OutOfMemory),
        Error::Conv3dOverflow { .. } => ("Conv3dOverflow", K::Overflow),
        Error::Conv3dTier { .. } => ("Conv3dTier", K::Device),
        Error::Conv3dNoTier { .. } => ("Conv3dNoTier", K::Device),
        Error::Conv3dCudnn { .. } => ("Conv3dCudnn", K::Device),
        Error::VendorUnavailable { .. } => ("VendorUnavailable", K::Unavailable),
        Error::Conv3dMiopen { .. } => ("Conv3dMiopen", K::Device),
        // A failed rung without an error is a failed check.
        Error::TransferFailed { source: None, .. } => ("TransferFailed", K::Verification),
        Error::TransferFailed {
            source: Some(_), ..
        } => ("TransferFailed(source)", K::Io),
        Error::InvalidLoadOptions { .. } => ("InvalidLoadOptions", K::Usage),
        Error::DlpackUnsupported { .. } => ("DlpackUnsupported", K::Unsupported),
        Error::DlpackInvalid { .. } => ("DlpackInvalid", K::Usage),
    }
}

/// One sample of every variant (two of `TransferFailed`: with and
/// without the error it carries).
fn samples() -> Vec<Error> {
    let p = || PathBuf::from("m.safetensors");
    let t = || "w".to_owned();
    let io = || std::io::Error::from_raw_os_error(2);
    vec![
        Error::LengthMismatch {
            op: "read_into",
            expected: 6,
            actual: 5,
            tensor: Some(TensorRef::new(p(), t())),
        },
        Error::DTypeMismatch {
            tensor: t(),
            stored: DType::BF16,
            asked: DType::F32,
        },
        Error::UnsupportedConversion {
            op: "convert_bytes",
            from: DType::I8,
            to: DType::F32,
            tensor: None,
        },
        Error::Io {
            path: p(),
            op: "open",
            source: io(),
        },
        Error::FileTooSmall { path: p(), len: 3 },
        Error::LfsPointer { path: p() },
        Error::HeaderTooLarge {
            path: p(),
            len: 1 << 40,
            limit: 100_000_000,
        },
        Error::HeaderOutOfBounds {
            path: p(),
            header_len: 100,
            file_len: 10,
        },
        Error::HeaderNotUtf8 {
            path: p(),
            valid_up_to: 4,
        },
        Error::HeaderNotObject {
            path: p(),
            reason: "does not start with '{'",
        },
        Error::HeaderJson {
            path: p(),
            source: serde_json::from_str::<u8>("x").unwrap_err(),
        },
        Error::DuplicateKey {
            path: p(),
            key: "a".into(),
            within: "the header".into(),
        },
        Error::InvalidMetadata {
            path: p(),
            key: None,
            reason: "not an object",
        },
        Error::InvalidTensorEntry {
            path: p(),
            tensor: t(),
            field: "dtype".into(),
            reason: "not a string",
        },
        Error::UnknownDType {
            path: p(),
            tensor: t(),
            dtype: "Q7".into(),
        },
        Error::InvalidTensorSize {
            path: p(),
            tensor: t(),
            dtype: DType::F32,
            shape: vec![u64::MAX, 2],
            reason: "overflows",
        },
        Error::InvalidDataOffsets {
            path: p(),
            tensor: t(),
            begin: 0,
            end: 3,
            expected: 4,
        },
        Error::DataLayout {
            path: p(),
            tensor: None,
            problem: "trailing bytes",
            offset: 8,
            data_len: 9,
        },
        Error::TensorNotFound {
            path: p(),
            tensor: t(),
        },
        Error::TooLargeForPlatform {
            path: p(),
            tensor: t(),
            bytes: u64::MAX,
        },
        Error::NoRows {
            path: p(),
            tensor: t(),
            shape: vec![],
        },
        Error::SliceDim {
            path: p(),
            tensor: t(),
            dim: 3,
            shape: vec![2, 2],
        },
        Error::RowRange {
            path: p(),
            tensor: t(),
            start: 2,
            end: 1,
            rows: 4,
        },
        Error::FileShrunk {
            path: p(),
            tensor: t(),
            expected: 100,
            actual: 50,
        },
        Error::InvalidIndex {
            path: p(),
            tensor: None,
            reason: "no weight_map",
        },
        Error::InvalidShardName {
            path: p(),
            tensor: t(),
            shard: "../x".into(),
            reason: "outside",
        },
        Error::TensorInTwoShards {
            path: p(),
            tensor: t(),
            first: p(),
            second: p(),
        },
        Error::TensorNotInIndex {
            path: p(),
            tensor: t(),
            shard: p(),
        },
        Error::MetadataConflict {
            path: p(),
            key: "k".into(),
            first: "1".into(),
            second: "2".into(),
            shard: p(),
        },
        Error::Writer {
            path: p(),
            tensor: t(),
            reason: "out of order",
        },
        Error::WriterSize {
            path: p(),
            tensor: t(),
            expected: 8,
            actual: 4,
        },
        Error::NotRegularFile {
            path: p(),
            kind: "fifo",
        },
        Error::FileChanged {
            path: p(),
            tensor: Some(t()),
            what: "size",
        },
        Error::AllocationFailed {
            path: p(),
            tensor: t(),
            bytes: 1 << 50,
            limit: 1 << 40,
            reason: "larger than memory",
        },
        Error::OutputIsInput {
            path: p(),
            input: p(),
        },
        Error::OutputNotRegular {
            path: p(),
            kind: "character device",
        },
        Error::Cancelled { path: p() },
        Error::BackendNotBuilt { backend: "hip" },
        Error::NoRuntime {
            backend: "cuda",
            library: "libcuda",
        },
        Error::RuntimeNotFound {
            backend: "hip",
            source: NotFound {
                what: "the HIP runtime".into(),
                tried: vec![],
            },
        },
        Error::DevicePermission {
            backend: "hip",
            path: "/dev/kfd".into(),
            reason: "join render".into(),
        },
        Error::InvalidEnvironment {
            var: "HSA_OVERRIDE_GFX_VERSION".into(),
            value: "11".into(),
            reason: "x.y.z".into(),
        },
        Error::NoDevice {
            backend: "hip",
            ordinal: Some(1),
            count: 1,
            visible: VisibleDevices::none(),
        },
        Error::BackendUnsupported {
            backend: "host",
            op: "mem_info",
        },
        Error::NoSuchDevice {
            wanted: "hip:3".into(),
            available: "host:0".into(),
        },
        Error::OutOfMemory {
            backend: "hip",
            op: "alloc",
            bytes: 1 << 30,
        },
        Error::SizeOverflow {
            op: "alloc",
            elements: usize::MAX,
        },
        Error::DeviceMismatch { op: "copy" },
        Error::EventNotRecorded { op: "elapsed_ms" },
        Error::Misaligned {
            op: "view",
            addr: 3,
            align: 4,
        },
        Error::OutOfBounds {
            op: "slice",
            start: 2,
            end: 9,
            len: 4,
        },
        Error::KernelUnavailable {
            backend: "hip",
            arch: "gfx906".into(),
            built: "gfx1151".into(),
        },
        Error::RuntimeCall {
            backend: "hip",
            op: "hipMalloc",
            code: 1,
            source: "invalid value".into(),
        },
        Error::Nvrtc {
            arch: "compute_90".into(),
            op: "nvrtcCompileProgram",
            code: 6,
            status: "NVRTC_ERROR_COMPILATION",
            log: String::new(),
        },
        Error::InjectedFault {
            fault: FaultKind::LaunchFailure,
            op: "convert",
        },
        Error::VerificationFailed {
            op: "convert".into(),
            device: "host:0".into(),
            expected: Fingerprint(1),
            actual: Fingerprint(2),
        },
        Error::KernelUntrusted {
            op: "convert".into(),
            device: "host:0".into(),
            mismatches: 3,
            tested: 65536,
        },
        Error::Conv3dParam {
            param: "stride",
            value: vec![0, 1, 1],
            reason: "zero",
        },
        Error::Conv3dShape {
            tensor: "input",
            shape: vec![1, 2],
            reason: "not 5-d",
        },
        Error::Conv3dDType {
            tensor: "weight",
            dtype: DType::F16,
            expected: DType::F32,
        },
        Error::Conv3dTooLarge {
            what: "output and scratch",
            bytes: u64::MAX,
            limit: 1 << 40,
        },
        Error::Conv3dOverflow {
            index: 0,
            reference: 1e39,
            value: f32::INFINITY,
            tier: "cpu".into(),
        },
        Error::Conv3dTier {
            tier: "naive",
            reason: "grid too large",
        },
        Error::Conv3dNoTier {
            report: "cpu: failed".into(),
        },
        Error::Conv3dCudnn {
            op: "cudnnConvolutionForward",
            code: 9,
            status: "CUDNN_STATUS_NOT_SUPPORTED",
        },
        Error::VendorUnavailable {
            backend: "host",
            library: "none",
            reason: "none".into(),
        },
        Error::Conv3dMiopen {
            op: "miopenFindConvolutionForwardAlgorithm",
            code: -1,
            status: "no algorithm",
        },
        Error::TransferFailed {
            tensor: t(),
            rung: "pinned ring",
            failure: "mismatch".into(),
            source: None,
        },
        Error::TransferFailed {
            tensor: t(),
            rung: "pinned ring",
            failure: "error".into(),
            source: Some(Box::new(Error::Io {
                path: p(),
                op: "read",
                source: io(),
            })),
        },
        Error::InvalidLoadOptions {
            field: "ring_slots",
            reason: "zero",
        },
        Error::DlpackUnsupported {
            op: "import",
            what: "lanes",
            found: "4".into(),
        },
        Error::DlpackInvalid {
            op: "import",
            what: "shape",
            found: "null".into(),
        },
    ]
}

/// Every variant (72 arms of `expected`: 71 variants, `TransferFailed`
/// twice; one sample each) has the kind the
/// table above gives it, a message, and, where it carries one, a source.
#[test]
fn every_variant_has_its_kind() {
    let samples = samples();
    let mut names = BTreeSet::new();
    for e in &samples {
        let (name, kind) = expected(e);
        assert!(names.insert(name), "two samples of {name}");
        assert_eq!(e.kind(), kind, "{name}: {e}");
        assert!(!e.to_string().is_empty(), "{name}");
    }
    assert_eq!(names.len(), 72, "one sample per arm of `expected`");
    let with_source = samples
        .iter()
        .filter(|e| std::error::Error::source(*e).is_some())
        .count();
    // Io, HeaderJson, RuntimeNotFound, RuntimeCall, TransferFailed(source).
    assert_eq!(with_source, 5);
    // Every kind is some variant's.
    let kinds: BTreeSet<_> = samples.iter().map(|e| e.kind().name()).collect();
    assert_eq!(kinds.len(), K::ALL.len());
}

/// The merged variants name the file and tensor of a reader's read, and
/// only the operation elsewhere.
#[test]
fn merged_variants_name_the_tensor_where_there_is_one() {
    let e = Error::LengthMismatch {
        op: "read_into",
        expected: 6,
        actual: 5,
        tensor: Some(TensorRef::new("m.safetensors", "w")),
    };
    assert_eq!(
        e.to_string(),
        "m.safetensors: tensor \"w\": read_into: length mismatch: expected 6, got 5"
    );
    let e = Error::UnsupportedConversion {
        op: "convert_bytes",
        from: DType::I8,
        to: DType::F32,
        tensor: None,
    };
    assert_eq!(e.to_string(), "convert_bytes: cannot convert I8 to F32");
    let e = Error::UnsupportedConversion {
        op: "read",
        from: DType::I8,
        to: DType::F32,
        tensor: Some(TensorRef::new("m.safetensors", "q")),
    };
    assert_eq!(e.to_string(), "m.safetensors: tensor \"q\": read: cannot convert I8 to F32 (read such a tensor as raw bytes)");
}

/// A backend error is boxed: its message is the runtime's, its source
/// downcasts to the runtime's type.
#[test]
fn runtime_errors_are_boxed_and_downcast() {
    #[derive(Debug)]
    struct Code(u32);
    impl std::fmt::Display for Code {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "code {}", self.0)
        }
    }
    impl std::error::Error for Code {}
    let e = Error::RuntimeCall {
        backend: "hip",
        op: "hipMalloc",
        code: 2,
        source: Box::new(Code(2)),
    };
    assert_eq!(e.to_string(), "hip: hipMalloc: code 2");
    let Error::RuntimeCall { source, .. } = &e else {
        unreachable!()
    };
    assert_eq!(source.downcast_ref::<Code>().map(|c| c.0), Some(2));
    assert_eq!(e.kind(), K::Device);
}

/// `or_out_of_memory` gives the OutOfMemory kind only when the runtime said so.
#[test]
fn or_out_of_memory_sorts_allocation_failures() {
    let other = || Error::RuntimeCall {
        backend: "cuda",
        op: "cuMemAlloc",
        code: 1,
        source: "invalid".into(),
    };
    assert_eq!(
        Error::or_out_of_memory(true, "cuda", "cuMemAlloc", 8, other).kind(),
        K::OutOfMemory
    );
    assert_eq!(
        Error::or_out_of_memory(false, "cuda", "cuMemAlloc", 8, other).kind(),
        K::Device
    );
}
