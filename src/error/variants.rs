//! [`Error`]'s variants: what each failure carries and says (its message
//! beside it). Their kinds are in `kind.rs`.

use std::path::PathBuf;

use super::{at, log_note, ordinal_note, raw_bytes_hint, tensor_note};
use super::{BoxedSource, NotFound, TensorRef};
use crate::convert::fingerprint::value::Fingerprint;
use crate::device::fault_kind::FaultKind;
use crate::device::visible::VisibleDevices;
use crate::dtype::DType;

/// Everything that can go wrong in rocm-safe.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    // ----- general -------------------------------------------------------
    /// A buffer handed to an operation has the wrong length (for a
    /// reader's typed read: the caller's buffer does not have the tensor's,
    /// or the row range's, element count).
    #[error("{}{op}: length mismatch: expected {expected}, got {actual}", at(.tensor))]
    LengthMismatch {
        /// The operation that checked the length.
        op: &'static str,
        /// The length it needed (in the operation's unit: elements or bytes).
        expected: usize,
        /// The length it got.
        actual: usize,
        /// The file and tensor of a reader's read; `None` elsewhere.
        tensor: Option<TensorRef>,
    },
    /// A tensor read as another element type than its dtype.
    #[error("tensor {tensor}: holds {stored}, asked for {asked}")]
    DTypeMismatch {
        /// The tensor.
        tensor: String,
        /// Its dtype.
        stored: DType,
        /// The element type's dtype asked for.
        asked: DType,
    },
    /// A conversion between two dtypes that rocm-safe does not convert
    /// (a reader converts only F64, F32, F16 and BF16 tensors, to F32, F16
    /// or BF16; integer, bool and fp8 tensors are read as raw bytes).
    #[error("{}{op}: cannot convert {from} to {to}{}", at(.tensor), raw_bytes_hint(.tensor))]
    UnsupportedConversion {
        /// The operation asked to convert (`"read"` for a reader).
        op: &'static str,
        /// Source dtype.
        from: DType,
        /// Requested dtype.
        to: DType,
        /// The file and tensor of a reader's read; `None` elsewhere.
        tensor: Option<TensorRef>,
    },
    /// An I/O operation on a file failed.
    #[error("{path}: {op}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`"open"`, `"read header"`, ...).
        op: &'static str,
        /// The operating system's error.
        source: std::io::Error,
    },
    // ----- safetensors reader (src/safetensors) ----------------------------
    /// The file is shorter than the 8-byte header length prefix.
    #[error("{path}: not a safetensors file: {len} bytes, shorter than the 8-byte header length")]
    FileTooSmall {
        /// The file.
        path: PathBuf,
        /// Its length in bytes.
        len: u64,
    },
    /// The file is a Git LFS pointer, not the checkpoint itself (run
    /// `git lfs pull`, or download the real file).
    #[error("{path}: this is a git lfs pointer file, not safetensors data: fetch the real file (git lfs pull)")]
    LfsPointer {
        /// The file.
        path: PathBuf,
    },
    /// The header length prefix exceeds the 100 MB limit of the format.
    #[error("{path}: header length {len} exceeds the limit of {limit} bytes")]
    HeaderTooLarge {
        /// The file.
        path: PathBuf,
        /// The header length the prefix states (or the writer computed).
        len: u64,
        /// The limit (100 000 000 bytes).
        limit: u64,
    },
    /// The header length prefix points past the end of the file.
    #[error("{path}: header of {header_len} bytes does not fit in a file of {file_len} bytes")]
    HeaderOutOfBounds {
        /// The file.
        path: PathBuf,
        /// The header length the prefix states.
        header_len: u64,
        /// The file's length.
        file_len: u64,
    },
    /// The header is not valid UTF-8.
    #[error("{path}: header is not utf-8 (invalid byte at header offset {valid_up_to})")]
    HeaderNotUtf8 {
        /// The file.
        path: PathBuf,
        /// Length of the valid UTF-8 prefix of the header.
        valid_up_to: usize,
    },
    /// The header does not start with `{`, or is followed by padding other
    /// than spaces.
    #[error("{path}: header is not a json object padded with spaces: {reason}")]
    HeaderNotObject {
        /// The file.
        path: PathBuf,
        /// What is wrong (`"does not start with '{'"`, ...).
        reason: &'static str,
    },
    /// The header (or index file) is not well-formed JSON of the expected shape.
    #[error("{path}: invalid json: {source}")]
    HeaderJson {
        /// The file.
        path: PathBuf,
        /// serde_json's error (with line and column).
        source: serde_json::Error,
    },
    /// A key appears twice in one JSON object (after unescaping: `"a"` and
    /// `"\u0061"` are the same key).
    #[error("{path}: duplicate key {key:?} in {within}")]
    DuplicateKey {
        /// The file.
        path: PathBuf,
        /// The repeated key.
        key: String,
        /// The object holding it: `"the header"`, `"__metadata__"`,
        /// `"weight_map"`, or `tensor "name"`.
        within: String,
    },
    /// `__metadata__` is not an object whose values are all strings.
    #[error("{path}: __metadata__ must map strings to strings: {reason}")]
    InvalidMetadata {
        /// The file.
        path: PathBuf,
        /// The offending key, when one value is not a string.
        key: Option<String>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A tensor entry in the header is malformed: not an object, a field
    /// missing, unknown, or of the wrong type.
    #[error("{path}: tensor {tensor:?}: {field}: {reason}")]
    InvalidTensorEntry {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The field concerned (`"dtype"`, `"shape"`, `"data_offsets"`, an
        /// unknown field's name, or `"entry"` for the whole entry).
        field: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A tensor's dtype is not one of the safetensors dtypes.
    #[error("{path}: tensor {tensor:?}: unknown dtype {dtype:?}")]
    UnknownDType {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype string found.
        dtype: String,
    },
    /// A tensor's element count or byte size overflows 64 bits, or its
    /// sub-byte elements do not fill a whole number of bytes.
    #[error("{path}: tensor {tensor:?}: shape {shape:?} of {dtype}: {reason}")]
    InvalidTensorSize {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its dtype.
        dtype: DType,
        /// Its shape.
        shape: Vec<u64>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A tensor's `data_offsets` span disagrees with its dtype and shape, or
    /// its begin is after its end.
    #[error("{path}: tensor {tensor:?}: data_offsets [{begin}, {end}] but dtype and shape need {expected} bytes")]
    InvalidDataOffsets {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Start offset within the data section.
        begin: u64,
        /// End offset within the data section.
        end: u64,
        /// The byte size its dtype and shape give.
        expected: u64,
    },
    /// Sorted by offset, the tensors do not tile the data section: a gap,
    /// an overlap, a tensor past the end, or bytes after the last tensor.
    #[error("{path}: data section of {data_len} bytes: {problem} at offset {offset}{}", tensor_note(.tensor))]
    DataLayout {
        /// The file.
        path: PathBuf,
        /// The tensor where the problem shows, if any (none for trailing bytes).
        tensor: Option<String>,
        /// What is wrong: `"hole"`, `"overlap"`, `"tensor past the end"`,
        /// `"trailing bytes"`.
        problem: &'static str,
        /// The offset within the data section where it shows.
        offset: u64,
        /// The data section's length.
        data_len: u64,
    },
    /// No tensor of this name in the file or checkpoint.
    #[error("{path}: no tensor named {tensor:?}")]
    TensorNotFound {
        /// The file (or index file).
        path: PathBuf,
        /// The name asked for.
        tensor: String,
    },
    /// A tensor (or part) is too large to address in memory on this platform.
    #[error("{path}: tensor {tensor:?}: {bytes} bytes do not fit in memory on this platform")]
    TooLargeForPlatform {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The size in bytes.
        bytes: u64,
    },
    /// A row read of a tensor without rows: a scalar (shape `[]`), or rows
    /// of sub-byte elements not filling whole bytes.
    #[error("{path}: tensor {tensor:?}: shape {shape:?} has no byte-addressable rows")]
    NoRows {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A slice along a dimension the tensor does not have.
    #[error("{path}: tensor {tensor:?}: shape {shape:?} has no dimension {dim} to slice")]
    SliceDim {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dimension asked for.
        dim: usize,
        /// Its shape.
        shape: Vec<u64>,
    },
    /// A range `start..end` of a dimension (the rows, or the dimension of
    /// a slice) with `start > end` or `end` past its length (`rows`).
    #[error("{path}: tensor {tensor:?}: row range {start}..{end} invalid for {rows} rows")]
    RowRange {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// First row asked for.
        start: u64,
        /// One past the last row asked for.
        end: u64,
        /// Rows the tensor has.
        rows: u64,
    },
    /// The file became shorter than when it was opened (truncated or
    /// rewritten in place while being read).
    #[error("{path}: file shrank while reading tensor {tensor:?}: opened with {expected} bytes, now {actual}")]
    FileShrunk {
        /// The file.
        path: PathBuf,
        /// The tensor being read.
        tensor: String,
        /// Length at open.
        expected: u64,
        /// Length now (as far as it could be read).
        actual: u64,
    },
    /// A sharded checkpoint's index file is not of the expected form.
    #[error("{path}: invalid index: {reason}")]
    InvalidIndex {
        /// The index file.
        path: PathBuf,
        /// The tensor concerned, if any.
        tensor: Option<String>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A shard name in an index is not a plain file name inside the index's
    /// folder (absolute, `..`, separators, or a symlink leading outside).
    #[error("{path}: shard {shard:?} (tensor {tensor:?}): {reason}")]
    InvalidShardName {
        /// The index file.
        path: PathBuf,
        /// A tensor mapped to the shard.
        tensor: String,
        /// The shard name as written.
        shard: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A tensor of a checkpoint is stored in two shards (or listed in the
    /// index for one shard and found in another).
    #[error("{path}: tensor {tensor:?} is in both {first} and {second}")]
    TensorInTwoShards {
        /// The index file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// One shard holding it.
        first: PathBuf,
        /// The other shard holding it.
        second: PathBuf,
    },
    /// A shard holds a tensor that the index's `weight_map` does not list.
    #[error("{path}: tensor {tensor:?} of shard {shard} is not listed in weight_map")]
    TensorNotInIndex {
        /// The index file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The shard holding it.
        shard: PathBuf,
    },
    /// Shards of one checkpoint disagree on a `__metadata__` value.
    #[error(
        "{path}: __metadata__ key {key:?} is {first:?} in one shard and {second:?} in {shard}"
    )]
    MetadataConflict {
        /// The index file.
        path: PathBuf,
        /// The key.
        key: String,
        /// The value seen first.
        first: String,
        /// The conflicting value.
        second: String,
        /// The shard with the conflicting value.
        shard: PathBuf,
    },
    /// A writer was used out of order or given inconsistent input: a
    /// tensor written out of the declared order or twice, `finish` before
    /// all tensors, a duplicate or reserved name at creation.
    #[error("{path}: writer: tensor {tensor:?}: {reason}")]
    Writer {
        /// The file being written (final name).
        path: PathBuf,
        /// The tensor concerned.
        tensor: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A writer was given a tensor's data of the wrong byte length.
    #[error("{path}: writer: tensor {tensor:?}: got {actual} bytes, its dtype and shape need {expected}")]
    WriterSize {
        /// The file being written (final name).
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Bytes its dtype and shape need.
        expected: u64,
        /// Bytes given.
        actual: u64,
    },
    /// An input path that is not a regular file: a FIFO, a socket, a
    /// device node or a folder. It is refused at open, without blocking
    /// (a FIFO is opened non-blocking, then inspected).
    #[error("{path}: not a regular file ({kind}): refused")]
    NotRegularFile {
        /// The file.
        path: PathBuf,
        /// What it is (`"fifo"`, `"character device"`, `"folder"`, ...).
        kind: &'static str,
    },
    /// A file changed while it was being read: its identity, size or
    /// modification time (nanoseconds) differs from when it was opened, so
    /// the bytes read may mix old and new contents.
    #[error("{path}: changed while being read{}: {what} differs from when it was opened", tensor_note(.tensor))]
    FileChanged {
        /// The file.
        path: PathBuf,
        /// The tensor being read when the change was seen, if any.
        tensor: Option<String>,
        /// What differs (`"size"`, `"modification time"`, ...).
        what: &'static str,
    },
    /// A host buffer for a tensor cannot be allocated: larger than the
    /// machine's memory (RAM plus swap), or refused by the allocator.
    /// Nothing was allocated and the process goes on.
    #[error("{path}: tensor {tensor:?}: cannot allocate {bytes} bytes on the host ({reason}; memory: {limit} bytes)")]
    AllocationFailed {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The size asked for.
        bytes: u64,
        /// RAM plus swap of this machine.
        limit: u64,
        /// `"larger than memory"` or `"allocator refused"`.
        reason: &'static str,
    },
    /// A writer's output is the same file (device and inode) as a file
    /// being read: a safetensors file or index held open by a reader of
    /// this process, or one named in the writer's options. Writing it
    /// would destroy the input; nothing was written.
    #[error("{path}: output is the same file as the input {input}: refused, nothing written")]
    OutputIsInput {
        /// The output path.
        path: PathBuf,
        /// The input it resolves to (its path as the reader opened it).
        input: PathBuf,
    },
    /// A writer's output exists and is not a regular file (a device node,
    /// FIFO, socket or folder): it is never replaced; nothing was written.
    #[error("{path}: output exists and is not a regular file ({kind}): refused, nothing written")]
    OutputNotRegular {
        /// The output path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A write was cancelled through the writer's cancellation flag (for
    /// example by a signal handler); the temporary file was removed and
    /// the output was not created.
    #[error("{path}: write cancelled, temporary file removed, output not created")]
    Cancelled {
        /// The output path.
        path: PathBuf,
    },
    // ----- devices (src/device) -------------------------------------------
    /// A backend whose cargo feature is off in this build.
    #[error("{backend}: backend not built (enable the `{backend}` feature)")]
    BackendNotBuilt {
        /// The backend (`"hip"`, `"cuda"`).
        backend: &'static str,
    },
    /// The backend's runtime library could not be loaded.
    #[error("{backend}: runtime not available: {library} could not be loaded")]
    NoRuntime {
        /// The backend.
        backend: &'static str,
        /// The library looked for (`"libcuda"`, `"libnvrtc"`, `"libamdhip64"`).
        library: &'static str,
    },
    /// The backend's runtime library is in none of the places looked in
    /// (each place tried is listed, with why it did not load).
    #[error("{backend}: runtime not available: {source}")]
    RuntimeNotFound {
        /// The backend.
        backend: &'static str,
        /// Every place tried, in order.
        source: NotFound,
    },
    /// The user may not open the device node the runtime needs
    /// (`/dev/kfd` for HIP): a permission problem, not a missing device.
    #[error("{backend}: no permission to open {path}: {reason}")]
    DevicePermission {
        /// The backend.
        backend: &'static str,
        /// The device node.
        path: PathBuf,
        /// Why, and what to do (the groups to join).
        reason: String,
    },
    /// An environment variable the runtime reads holds a value it refuses
    /// (for example `HSA_OVERRIDE_GFX_VERSION=11.0`).
    #[error("{var}={value:?} is invalid: {reason}")]
    InvalidEnvironment {
        /// The variable.
        var: String,
        /// Its value.
        value: String,
        /// The format expected.
        reason: String,
    },
    /// No device (or not the one asked for).
    #[error("{backend}: no device{}: {count} visible ({visible})", ordinal_note(.ordinal))]
    NoDevice {
        /// The backend.
        backend: &'static str,
        /// The ordinal asked for (`None` when listing).
        ordinal: Option<usize>,
        /// How many devices the runtime reports.
        count: usize,
        /// The visibility variable in effect.
        visible: VisibleDevices,
    },
    /// An operation this backend does not implement (for example
    /// `device::Driver::mem_info` on a platform where the host
    /// backend cannot read the memory figures, or a kernel operation a
    /// backend has no kernel for).
    #[error("{backend}: {op} is not supported by this backend")]
    BackendUnsupported {
        /// The backend.
        backend: &'static str,
        /// The operation.
        op: &'static str,
    },
    /// A device selection (`doctor --device`) that matches no listed
    /// device.
    #[error("no device {wanted}: the devices are {available}")]
    NoSuchDevice {
        /// The selection (`"1"`, `"hip:0"`).
        wanted: String,
        /// The devices listed, with the reason for backends that have none.
        available: String,
    },
    /// A device operation ran out of memory.
    #[error("{backend}: {op}: out of memory allocating {bytes} bytes")]
    OutOfMemory {
        /// The backend.
        backend: &'static str,
        /// The operation.
        op: &'static str,
        /// The size asked for.
        bytes: u64,
    },
    /// An element count whose size in bytes does not fit in `usize`.
    #[error("{op}: {elements} elements overflow the address space")]
    SizeOverflow {
        /// The operation.
        op: &'static str,
        /// The element count.
        elements: usize,
    },
    /// Buffers, streams or events of different devices in one operation.
    #[error("{op}: operands belong to different devices")]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
    },
    /// Event timing asked of an event that was never recorded.
    #[error("{op}: event not recorded")]
    EventNotRecorded {
        /// The operation.
        op: &'static str,
    },
    /// A device address not aligned for the element type asked for.
    #[error("{op}: address {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The operation.
        op: &'static str,
        /// The address.
        addr: u64,
        /// The alignment required.
        align: u64,
    },
    /// An element range outside a buffer.
    #[error("{op}: range {start}..{end} out of bounds for length {len}")]
    OutOfBounds {
        /// The operation.
        op: &'static str,
        /// Range start.
        start: usize,
        /// Range end (exclusive).
        end: usize,
        /// The buffer's length.
        len: usize,
    },
    /// No kernel code for this device (no code object for its gfx arch).
    #[error("{backend}: no kernels for {arch} in this build (built for: {built})")]
    KernelUnavailable {
        /// The backend.
        backend: &'static str,
        /// The device's architecture.
        arch: String,
        /// The architectures the build embeds, comma separated.
        built: String,
    },
    /// A call into a device runtime failed: the HIP runtime's or the CUDA
    /// driver's error, boxed so that the enum is the same in every build
    /// (downcast `source` to `device::hip::HipError` or
    /// `cudarc::driver::DriverError` where that backend is built).
    #[error("{backend}: {op}: {source}")]
    RuntimeCall {
        /// The backend (`"hip"`, `"cuda"`).
        backend: &'static str,
        /// The runtime call (`"hipMalloc"`, `"cuMemAlloc"`).
        op: &'static str,
        /// The runtime's numeric code (`hipError_t`, `CUresult`).
        code: i64,
        /// The runtime's error (code and message).
        source: BoxedSource,
    },
    /// NVRTC could not compile the kernels.
    #[error("cuda: nvrtc compile for {arch}: {op}: {status} (status {code}){}", log_note(.log))]
    Nvrtc {
        /// The target (`compute_90`).
        arch: String,
        /// The NVRTC call that failed (`nvrtcCompileProgram`).
        op: &'static str,
        /// The `nvrtcResult` code (-1: a NUL byte in the source or an
        /// option, NVRTC not called).
        code: i32,
        /// Its name (`"NVRTC_ERROR_COMPILATION"`, ...).
        status: &'static str,
        /// NVRTC's log when the compile failed (empty otherwise).
        log: String,
    },
    /// A failure injected by the fault-injection backend
    /// (`device::faults`).
    #[error("{op}: injected fault: {fault}")]
    InjectedFault {
        /// The failure mode.
        fault: FaultKind,
        /// The backend operation hit.
        op: &'static str,
    },
    /// A device result whose fingerprint differs from the one the host
    /// computed from the source.
    #[error("{op}: verification failed on {device}: expected fingerprint {expected}, device gave {actual}")]
    VerificationFailed {
        /// The operation (`"convert bf16->f32"`).
        op: String,
        /// The device (`"cuda:0 sm_90"`).
        device: String,
        /// Fingerprint computed on the host.
        expected: Fingerprint,
        /// Fingerprint of the device's output.
        actual: Fingerprint,
    },
    /// A device kernel failed its self-test and the policy forbids the CPU
    /// fallback.
    #[error("{op}: the device kernel failed its self-test on {device} ({mismatches} of {tested} patterns wrong) and fallback is off")]
    KernelUntrusted {
        /// The conversion.
        op: String,
        /// The device.
        device: String,
        /// Patterns that differed from the CPU.
        mismatches: u64,
        /// Patterns tested.
        tested: u64,
    },
    // ----- conv3d (src/conv3d, src/conv3d_chain) ----------------------------
    /// A conv3d parameter is out of range (a zero stride, dilation or group
    /// count).
    #[error("conv3d: {param} {value:?}: {reason}")]
    Conv3dParam {
        /// The parameter (`"stride"`, `"dilation"`, `"groups"`).
        param: &'static str,
        /// Its value (per axis where it has axes).
        value: Vec<usize>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A conv3d tensor's shape does not fit the convolution (not 5-d,
    /// channels not divisible by groups, kernel larger than the padded
    /// input, sizes overflowing).
    #[error("conv3d: {tensor} shape {shape:?}: {reason}")]
    Conv3dShape {
        /// The tensor (`"input"`, `"weight"`, `"bias"`).
        tensor: &'static str,
        /// Its shape.
        shape: Vec<usize>,
        /// What is wrong.
        reason: &'static str,
    },
    /// A conv3d tensor has a dtype the call cannot take (input and weight
    /// must share one dtype, f32 or bf16).
    #[error("conv3d: {tensor} has dtype {dtype}, expected {expected}")]
    Conv3dDType {
        /// The tensor.
        tensor: &'static str,
        /// Its dtype.
        dtype: DType,
        /// The dtype it needs.
        expected: DType,
    },
    /// A conv3d call whose buffers (output plus the CPU tier's padded
    /// input copy) are larger than this machine's memory (RAM plus swap):
    /// refused before anything is allocated.
    #[error("conv3d: {what} needs {bytes} bytes, more than this machine's memory ({limit} bytes)")]
    Conv3dTooLarge {
        /// What is too large (`"output and scratch"`).
        what: &'static str,
        /// Bytes it needs (saturating).
        bytes: u64,
        /// RAM plus swap of this machine.
        limit: u64,
    },
    /// A conv3d whose exact result is beyond the range of f32 at some
    /// point although every input is finite: the f64 reference at the
    /// first non-finite output point is larger in magnitude than
    /// `f32::MAX`. This is a fact about the inputs, not a tier failure:
    /// no other tier is tried.
    #[error("conv3d: result overflows f32 at output index {index}: exact value {reference:e} (tier {tier} gave {value})")]
    Conv3dOverflow {
        /// Flat output index of the first overflowing point.
        index: usize,
        /// The f64 reference value there.
        reference: f64,
        /// What the tier computed (an infinity).
        value: f32,
        /// The tier whose output showed it.
        tier: String,
    },
    /// A conv3d tier failed for a reason of its own (an internal size check,
    /// an injected failure, sizes a kernel's grid cannot hold).
    #[error("conv3d tier {tier}: {reason}")]
    Conv3dTier {
        /// The tier's name.
        tier: &'static str,
        /// What went wrong.
        reason: &'static str,
    },
    /// No tier of the conv3d chain served the call: every tier was skipped
    /// (forbidden, unsupported, unavailable) or failed. The report says
    /// what happened at each; `conv3d_chain::Conv3dReport::of` gives it
    /// back typed.
    #[error("conv3d: no tier served the call: {report}")]
    Conv3dNoTier {
        /// What happened at each tier: a `conv3d_chain::Conv3dReport`.
        report: BoxedSource,
    },
    /// A cuDNN call of the conv3d vendor tier failed (no algorithm for the
    /// parameters, bad descriptor, ...).
    #[error("conv3d: cudnn: {op}: {status} (status {code})")]
    Conv3dCudnn {
        /// The cuDNN call.
        op: &'static str,
        /// The `cudnnStatus_t` code (cuDNN 9's numbering).
        code: i32,
        /// Its name (`"CUDNN_STATUS_NOT_SUPPORTED"`, ...).
        status: &'static str,
    },
    /// A backend's vendor convolution library cannot be used here: not
    /// installed or not on the loader path, a required symbol missing, or
    /// a backend without one (host). The conv3d chain skips its vendor
    /// tier then.
    #[error("{backend}: vendor library {library} unavailable: {reason}")]
    VendorUnavailable {
        /// The backend (`"hip"`, `"cuda"`, `"host"`).
        backend: &'static str,
        /// The library (`"libMIOpen"`, `"libcudnn"`).
        library: &'static str,
        /// Why (the loader's message, the missing symbol, ...).
        reason: String,
    },
    /// An MIOpen call of the conv3d vendor tier failed, or its algorithm
    /// search found no algorithm for the parameters.
    #[error("conv3d: miopen: {op}: {status} (status {code})")]
    Conv3dMiopen {
        /// The MIOpen call.
        op: &'static str,
        /// The `miopenStatus_t` code (-1: the search returned no algorithm).
        code: i32,
        /// Its name (`"miopenStatusNotImplemented"`, ...).
        status: &'static str,
    },
    // ----- transfer (src/transfer) ----------------------------------------
    /// Loading a tensor failed on a rung of the transfer ladder and no
    /// further rung was allowed (fallback forbidden or a rung forced).
    #[error("load {tensor:?}: rung {rung} failed and fallback is off: {failure}")]
    TransferFailed {
        /// The tensor.
        tensor: String,
        /// The rung that failed (`"pinned ring"`, ...).
        rung: &'static str,
        /// What failed (the rung's `fallback::Failure`, displayed).
        failure: String,
        /// The error, when the failure was one.
        source: Option<Box<Error>>,
    },
    /// A transfer option is out of its range.
    #[error("load options: {field}: {reason}")]
    InvalidLoadOptions {
        /// The option.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    // ----- dlpack (src/dlpack) --------------------------------------------
    /// A DLPack tensor that is valid DLPack but that rocm-safe cannot take
    /// (import) or a tensor it cannot describe (export): a device type or
    /// ordinal other than the importing device's, a dtype without a
    /// [`DType`], vector lanes, non-compact strides, a DLPack major version
    /// other than 1, a mutable view of a read-only tensor. An import that
    /// fails so has already called the producer's deleter.
    #[error("dlpack {op}: unsupported {what}: {found}")]
    DlpackUnsupported {
        /// The operation (`"import"`, `"export"`, `"view_mut"`).
        op: &'static str,
        /// What is unsupported (`"device"`, `"dtype"`, `"lanes"`,
        /// `"strides"`, `"version"`, `"flags"`, `"shape"`).
        what: &'static str,
        /// What was found, and what was needed where that helps.
        found: String,
    },
    /// A DLPack tensor that breaks the DLPack contract: a null managed
    /// tensor, a null data pointer with a non-zero size, a negative
    /// dimension, sizes that overflow, a null shape. An import that fails so
    /// after taking ownership has already called the producer's deleter.
    #[error("dlpack {op}: invalid {what}: {found}")]
    DlpackInvalid {
        /// The operation (`"import"`).
        op: &'static str,
        /// The part that is invalid (`"pointer"`, `"shape"`, `"data"`).
        what: &'static str,
        /// What was found.
        found: String,
    },
}
