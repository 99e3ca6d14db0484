//! cuDNN 9, the CUDA backend's vendor convolution library (feature
//! `cuda`), bound here (not through cudarc, whose choice of library file is
//! its own: inside a PyTorch process it mapped the system's cuDNN beside
//! pip's, and every call failed with
//! `CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH`). Opened through
//! [`dynlib`](crate::device::dynlib) with [`cudnn_spec`]: a copy already in
//! the process first, never unloaded; refused ([`Error::VendorUnavailable`])
//! when absent, older or newer than cuDNN 9, or when the process maps two
//! cuDNN files. Only the calls the vendor tier needs are bound, with the C
//! signatures of cuDNN 9's `cudnn_graph.h`, `cudnn_ops.h` and
//! `cudnn_cnn.h`:
//!
//! ```c
//! size_t cudnnGetVersion(void);
//! cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
//! cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
//! cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId);
//! cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc);
//! cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc,
//!     cudnnDataType_t dataType, int nbDims, const int dimA[], const int strideA[]);
//! cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc);
//! cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc);
//! cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t filterDesc,
//!     cudnnDataType_t dataType, cudnnTensorFormat_t format, int nbDims,
//!     const int filterDimA[]);
//! cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc);
//! cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc);
//! cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t convDesc,
//!     int arrayLength, const int padA[], const int filterStrideA[],
//!     const int dilationA[], cudnnConvolutionMode_t mode, cudnnDataType_t computeType);
//! cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc,
//!     int groupCount);
//! cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
//!     cudnnMathType_t mathType);
//! cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc);
//! cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle,
//!     const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
//!     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc,
//!     const int requestedAlgoCount, int *returnedAlgoCount,
//!     cudnnConvolutionFwdAlgoPerf_t *perfResults);
//! cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
//!     const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
//!     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
//!     cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes);
//! cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
//!     const cudnnTensorDescriptor_t xDesc, const void *x,
//!     const cudnnFilterDescriptor_t wDesc, const void *w,
//!     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
//!     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
//!     const cudnnTensorDescriptor_t yDesc, void *y);
//! ```
//!
//! and, bound apart (`cudnn/cudnn_backward.rs`: a cuDNN without them keeps the
//! forward tier), the gradients' calls; `cudnnConvolutionBwdDataAlgoPerf_t`
//! and `cudnnConvolutionBwdFilterAlgoPerf_t` have the forward perf struct's
//! fields (`algo, status, float time, size_t memory, determinism, mathType,
//! int reserved[3]`):
//!
//! ```c
//! cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle,
//!     const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
//!     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc,
//!     const int requestedAlgoCount, int *returnedAlgoCount,
//!     cudnnConvolutionBwdDataAlgoPerf_t *perfResults);
//! cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle,
//!     const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
//!     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
//!     cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes);
//! cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
//!     const cudnnFilterDescriptor_t wDesc, const void *w,
//!     const cudnnTensorDescriptor_t dyDesc, const void *dy,
//!     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdDataAlgo_t algo,
//!     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
//!     const cudnnTensorDescriptor_t dxDesc, void *dx);
//! cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle,
//!     const cudnnTensorDescriptor_t srcDesc, const cudnnTensorDescriptor_t diffDesc,
//!     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
//!     const int requestedAlgoCount, int *returnedAlgoCount,
//!     cudnnConvolutionBwdFilterAlgoPerf_t *perfResults);
//! cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle,
//!     const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
//!     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
//!     cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes);
//! cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
//!     const cudnnTensorDescriptor_t xDesc, const void *x,
//!     const cudnnTensorDescriptor_t dyDesc, const void *dy,
//!     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdFilterAlgo_t algo,
//!     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
//!     const cudnnFilterDescriptor_t dwDesc, void *dw);
//! ```
//!
//! C enums are taken as `int`: an unknown status is a number, never
//! undefined behaviour. Descriptors are created per (geometry, dtype),
//! cached with the chosen algorithm, and destroyed here (destroy errors are
//! dropped: nothing at teardown panics).
//!
//! f32 runs with `CUDNN_FMA_MATH` (true f32, no TF32); bf16 with tensor
//! cores and f32 accumulation, writing a bf16 output that the backend
//! widens (with the bias) into the f32 output. The gradients always run in
//! f32 (bf16 operands are widened first: `vendor/vendor_backward.rs`).
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

mod cudnn_backward;

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

#[cfg(feature = "doctor")]
use super::libs::Loaded;
use super::libs::{bind_fn, cudnn_spec};
use super::VendorBuffers;
#[cfg(feature = "cuda")]
use super::VendorConv;
use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
use crate::device::dynlib::{self, Spec};
#[cfg(feature = "cuda")]
use crate::device::info::{DevicePtr, RawStream};
#[cfg(feature = "cuda")]
use crate::device::raw::conv3d::Conv3dBackwardLaunch;
use crate::device::raw::conv3d::Conv3dLaunch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use cudnn_backward::BwdFns;

type Handle = *mut c_void;
type TensorDesc = *mut c_void;
type FilterDesc = *mut c_void;
type ConvDesc = *mut c_void;
type Status = c_int;

/// `CUDNN_DATA_FLOAT`.
const DATA_FLOAT: c_int = 0;
/// `CUDNN_DATA_BFLOAT16`.
const DATA_BFLOAT16: c_int = 9;
/// `CUDNN_TENSOR_OP_MATH`.
const TENSOR_OP_MATH: c_int = 1;
/// `CUDNN_FMA_MATH`.
const FMA_MATH: c_int = 3;
/// `CUDNN_TENSOR_NCHW`.
const TENSOR_NCHW: c_int = 0;
/// `CUDNN_CROSS_CORRELATION` (what PyTorch's conv3d computes).
const CROSS_CORRELATION: c_int = 1;
/// `CUDNN_STATUS_NOT_SUPPORTED`: reported when the algorithm query
/// returned no usable algorithm.
pub(crate) const NOT_SUPPORTED: c_int = 3000;

/// `cudnnConvolutionFwdAlgoPerf_t`: enums as `int`, a float, a size_t.
/// `cudnnConvolutionBwdDataAlgoPerf_t` and `cudnnConvolutionBwdFilterAlgoPerf_t`
/// have the same fields in the same order (`cudnn_cnn.h`), so this struct
/// serves all three.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FwdAlgoPerf {
    algo: c_int,
    status: c_int,
    time: f32,
    memory: usize,
    determinism: c_int,
    math_type: c_int,
    reserved: [c_int; 3],
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<FwdAlgoPerf>() == 48);

/// The bound functions.
#[derive(Debug)]
pub(crate) struct Lib {
    /// Holds the library open (read only by the doctor otherwise).
    #[cfg_attr(not(feature = "doctor"), allow(dead_code))]
    lib: dynlib::Lib,
    /// `cudnnGetVersion` (`91900` for 9.19.0).
    #[cfg_attr(not(feature = "doctor"), allow(dead_code))]
    version: usize,
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    create_tensor: unsafe extern "C" fn(*mut TensorDesc) -> Status,
    set_tensor:
        unsafe extern "C" fn(TensorDesc, c_int, c_int, *const c_int, *const c_int) -> Status,
    destroy_tensor: unsafe extern "C" fn(TensorDesc) -> Status,
    create_filter: unsafe extern "C" fn(*mut FilterDesc) -> Status,
    set_filter: unsafe extern "C" fn(FilterDesc, c_int, c_int, c_int, *const c_int) -> Status,
    destroy_filter: unsafe extern "C" fn(FilterDesc) -> Status,
    create_conv: unsafe extern "C" fn(*mut ConvDesc) -> Status,
    #[allow(clippy::type_complexity)]
    set_conv: unsafe extern "C" fn(
        ConvDesc,
        c_int,
        *const c_int,
        *const c_int,
        *const c_int,
        c_int,
        c_int,
    ) -> Status,
    set_group_count: unsafe extern "C" fn(ConvDesc, c_int) -> Status,
    set_math_type: unsafe extern "C" fn(ConvDesc, c_int) -> Status,
    destroy_conv: unsafe extern "C" fn(ConvDesc) -> Status,
    #[allow(clippy::type_complexity)]
    find_algo: unsafe extern "C" fn(
        Handle,
        TensorDesc,
        FilterDesc,
        ConvDesc,
        TensorDesc,
        c_int,
        *mut c_int,
        *mut FwdAlgoPerf,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    workspace: unsafe extern "C" fn(
        Handle,
        TensorDesc,
        FilterDesc,
        ConvDesc,
        TensorDesc,
        c_int,
        *mut usize,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    forward: unsafe extern "C" fn(
        Handle,
        *const c_void,
        TensorDesc,
        *const c_void,
        FilterDesc,
        *const c_void,
        ConvDesc,
        c_int,
        *mut c_void,
        usize,
        *const c_void,
        TensorDesc,
        *mut c_void,
    ) -> Status,
    /// The backward calls, or why they are not bound (a symbol missing:
    /// only the backward ops are then unavailable).
    backward: std::result::Result<BwdFns, String>,
}

impl Lib {
    /// What the doctor shows of this copy (`9.19.0`).
    #[cfg(feature = "doctor")]
    pub(crate) fn loaded(&self) -> Loaded {
        Loaded::of(&self.lib, Some(version_text(self.version)))
    }
}

/// cuDNN 9's version number as text: `91900` -> `9.19.0`.
pub(crate) fn version_text(v: usize) -> String {
    format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
}

/// Why two mapped cuDNN files make the library unusable, or `None` for
/// one (or none).
pub(crate) fn duplicate_reason(copies: &[std::path::PathBuf]) -> Option<String> {
    (copies.len() > 1).then(|| {
        let list: Vec<String> = copies.iter().map(|p| p.display().to_string()).collect();
        format!(
            "this process maps {} cuDNN files ({}): their sub-libraries resolve to each \
             other's and calls fail with CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH; load one \
             cuDNN per process (set {} to the one the framework uses)",
            copies.len(),
            list.join(", "),
            super::libs::CUDNN_VAR
        )
    })
}

/// Opens cuDNN by `spec`, binds its functions and checks that it is cuDNN
/// 9 and the only cuDNN mapped; the message says why not.
pub(crate) fn load(spec: &Spec) -> std::result::Result<Lib, String> {
    let lib = dynlib::open(spec).map_err(|e| e.to_string())?;
    let at = lib
        .path()
        .map_or_else(|| "cuDNN".to_owned(), |p| p.display().to_string());
    let missing = |sym: &str| format!("{at}: symbol {sym} not found");
    // SAFETY: (every bind below) each field's type is the C signature of
    // the function of that name in cuDNN 9's headers (module docs), enums
    // as int; the library is never closed.
    let get_version =
        unsafe { bind_fn::<unsafe extern "C" fn() -> usize>(&lib, c"cudnnGetVersion") }
            .map_err(missing)?;
    // SAFETY: takes nothing, returns a number.
    let version = unsafe { get_version() };
    if version / 10000 != 9 {
        return Err(format!(
            "{at} is cuDNN {}: rocm-safe binds cuDNN 9 (its status codes and calls)",
            version_text(version)
        ));
    }
    if let Some(why) = duplicate_reason(&dynlib::mapped_copies(spec.stem)) {
        return Err(why);
    }
    // SAFETY: as above.
    unsafe {
        Ok(Lib {
            version,
            create: bind_fn(&lib, c"cudnnCreate").map_err(missing)?,
            destroy: bind_fn(&lib, c"cudnnDestroy").map_err(missing)?,
            set_stream: bind_fn(&lib, c"cudnnSetStream").map_err(missing)?,
            create_tensor: bind_fn(&lib, c"cudnnCreateTensorDescriptor").map_err(missing)?,
            set_tensor: bind_fn(&lib, c"cudnnSetTensorNdDescriptor").map_err(missing)?,
            destroy_tensor: bind_fn(&lib, c"cudnnDestroyTensorDescriptor").map_err(missing)?,
            create_filter: bind_fn(&lib, c"cudnnCreateFilterDescriptor").map_err(missing)?,
            set_filter: bind_fn(&lib, c"cudnnSetFilterNdDescriptor").map_err(missing)?,
            destroy_filter: bind_fn(&lib, c"cudnnDestroyFilterDescriptor").map_err(missing)?,
            create_conv: bind_fn(&lib, c"cudnnCreateConvolutionDescriptor").map_err(missing)?,
            set_conv: bind_fn(&lib, c"cudnnSetConvolutionNdDescriptor").map_err(missing)?,
            set_group_count: bind_fn(&lib, c"cudnnSetConvolutionGroupCount").map_err(missing)?,
            set_math_type: bind_fn(&lib, c"cudnnSetConvolutionMathType").map_err(missing)?,
            destroy_conv: bind_fn(&lib, c"cudnnDestroyConvolutionDescriptor").map_err(missing)?,
            find_algo: bind_fn(&lib, c"cudnnGetConvolutionForwardAlgorithm_v7").map_err(missing)?,
            workspace: bind_fn(&lib, c"cudnnGetConvolutionForwardWorkspaceSize")
                .map_err(missing)?,
            forward: bind_fn(&lib, c"cudnnConvolutionForward").map_err(missing)?,
            backward: BwdFns::bind(&lib).map_err(missing),
            lib,
        })
    }
}

fn library_result() -> &'static std::result::Result<Lib, String> {
    static LIB: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| load(&cudnn_spec()))
}

fn unavailable(reason: String) -> Error {
    Error::VendorUnavailable {
        backend: "cuda",
        library: "libcudnn",
        reason,
    }
}

/// This process's cuDNN (opened on the first call), or
/// [`Error::VendorUnavailable`] saying why it cannot be used.
pub(crate) fn library() -> Result<&'static Lib> {
    library_result()
        .as_ref()
        .map_err(|why| unavailable(why.clone()))
}

/// `Ok` when cuDNN can be used here, else [`Error::VendorUnavailable`].
pub(crate) fn available() -> Result<()> {
    library().map(|_| ())
}

/// `Ok` when cuDNN's backward calls can be used here, else
/// [`Error::VendorUnavailable`] (the library, or one of its backward
/// symbols, is missing).
pub(crate) fn backward_available() -> Result<()> {
    let lib = library()?;
    lib.backward
        .as_ref()
        .map(|_| ())
        .map_err(|why| unavailable(format!("{why}: the backward ops are not served by cuDNN")))
}

/// The cuDNN in use (opening it if need be), or why there is none: for
/// the doctor.
#[cfg(feature = "doctor")]
pub(crate) fn loaded() -> std::result::Result<Loaded, String> {
    library_result()
        .as_ref()
        .map(Lib::loaded)
        .map_err(Clone::clone)
}

/// The name of a cuDNN 9 `cudnnStatus_t` code (`cudnn_graph.h`).
pub(crate) fn status_name(code: c_int) -> &'static str {
    match code {
        0 => "CUDNN_STATUS_SUCCESS",
        1001 => "CUDNN_STATUS_NOT_INITIALIZED",
        1002 => "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH",
        1003 => "CUDNN_STATUS_SERIALIZATION_VERSION_MISMATCH",
        1004 => "CUDNN_STATUS_DEPRECATED",
        1005 => "CUDNN_STATUS_LICENSE_ERROR",
        1006 => "CUDNN_STATUS_RUNTIME_IN_PROGRESS",
        1007 => "CUDNN_STATUS_RUNTIME_FP_OVERFLOW",
        1008 => "CUDNN_STATUS_SUBLIBRARY_LOADING_FAILED",
        2000 => "CUDNN_STATUS_BAD_PARAM",
        2001 => "CUDNN_STATUS_INVALID_VALUE",
        2002 => "CUDNN_STATUS_BAD_PARAM_NULL_POINTER",
        2003 => "CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER",
        2004 => "CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED",
        2005 => "CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND",
        2006 => "CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT",
        2007 => "CUDNN_STATUS_BAD_PARAM_STREAM_MISMATCH",
        2008 => "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH",
        2009 => "CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES",
        2010 => "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE",
        2011 => "CUDNN_STATUS_BAD_PARAM_CUDA_GRAPH_MISMATCH",
        2012 => "CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE",
        3000 => "CUDNN_STATUS_NOT_SUPPORTED",
        3001 => "CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN",
        3002 => "CUDNN_STATUS_NOT_SUPPORTED_SHAPE",
        3003 => "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE",
        3004 => "CUDNN_STATUS_NOT_SUPPORTED_LAYOUT",
        3005 => "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDA_DRIVER",
        3006 => "CUDNN_STATUS_NOT_SUPPORTED_INCOMPATIBLE_CUDART",
        3007 => "CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH",
        3008 => "CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING",
        3009 => "CUDNN_STATUS_NOT_SUPPORTED_SUBLIBRARY_UNAVAILABLE",
        3010 => "CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT",
        3011 => "CUDNN_STATUS_NOT_SUPPORTED_PADDING",
        3012 => "CUDNN_STATUS_NOT_SUPPORTED_BAD_LAUNCH_PARAM",
        3013 => "CUDNN_STATUS_NOT_SUPPORTED_CUDA_GRAPH_NATIVE_API",
        4000 => "CUDNN_STATUS_INTERNAL_ERROR",
        4001 => "CUDNN_STATUS_INTERNAL_ERROR_COMPILATION_FAILED",
        4002 => "CUDNN_STATUS_INTERNAL_ERROR_UNEXPECTED_VALUE",
        4003 => "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED",
        4004 => "CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED",
        4005 => "CUDNN_STATUS_INTERNAL_ERROR_BAD_LAUNCH_PARAM",
        4006 => "CUDNN_STATUS_INTERNAL_ERROR_TEXTURE_CREATION_FAILED",
        5000 => "CUDNN_STATUS_EXECUTION_FAILED",
        5001 => "CUDNN_STATUS_EXECUTION_FAILED_CUDA_DRIVER",
        5002 => "CUDNN_STATUS_EXECUTION_FAILED_CUBLAS",
        5003 => "CUDNN_STATUS_EXECUTION_FAILED_CUDART",
        5004 => "CUDNN_STATUS_EXECUTION_FAILED_CURAND",
        _ => "unknown cudnnStatus_t",
    }
}

/// `Ok` for `CUDNN_STATUS_SUCCESS`, else [`Error::Conv3dCudnn`].
pub(crate) fn check(op: &'static str, code: c_int) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Conv3dCudnn {
            op,
            code,
            status: status_name(code),
        })
    }
}

fn c_int_of(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Conv3dTier {
        tier: "cudnn",
        reason: "a size does not fit cudnn's 32-bit dimensions",
    })
}

fn dims(s: [usize; 5]) -> Result<([i32; 5], [i32; 5])> {
    let mut d = [0i32; 5];
    for (o, &v) in d.iter_mut().zip(&s) {
        *o = c_int_of(v)?;
    }
    let mut st = [1i32; 5];
    for i in (0..4).rev() {
        st[i] = st[i + 1].checked_mul(d[i + 1]).ok_or(Error::Conv3dTier {
            tier: "cudnn",
            reason: "a size does not fit cudnn's 32-bit dimensions",
        })?;
    }
    Ok((d, st))
}

/// Descriptors, algorithm and workspace size of one (geometry, dtype), or
/// of one backward op (`cudnn_backward.rs`; `y` describes `dy` there).
#[derive(Debug)]
struct Plan {
    x: TensorDesc,
    y: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    algo: c_int,
    workspace: usize,
}

/// The algorithm of the first of the `n` results returned (at most
/// `perf.len()`) whose status is `CUDNN_STATUS_SUCCESS`: cuDNN lists them
/// best first, and fills the forward and backward perf structs alike.
fn first_usable(perf: &[FwdAlgoPerf], n: c_int) -> Option<c_int> {
    perf.get(..usize::try_from(n).unwrap_or(0).min(perf.len()))
        .and_then(|p| p.iter().find(|r| r.status == 0))
        .map(|r| r.algo)
}

/// A cuDNN handle and its plans (one per CUDA device, used under a lock).
#[derive(Debug)]
pub(crate) struct Cudnn {
    lib: &'static Lib,
    handle: Handle,
    plans: HashMap<(Conv3dGeometry, DType), Plan>,
    /// The f32 plans of the backward ops.
    bwd_plans: HashMap<(Conv3dBackwardOp, Conv3dGeometry), Plan>,
    /// Scratch and workspace kept between calls.
    buffers: VendorBuffers,
}

// SAFETY: cuDNN handles and descriptors may be used from any thread, one
// at a time; `Cudnn` is only used behind the backend's Mutex, with the
// device's context current.
unsafe impl Send for Cudnn {}

impl Cudnn {
    /// Creates a handle (the device's context must be current).
    ///
    /// Errors: [`Error::VendorUnavailable`], or [`Error::Conv3dCudnn`].
    pub(crate) fn new() -> Result<Cudnn> {
        let lib = library()?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("cudnnCreate", unsafe { (lib.create)(&mut handle) })?;
        Ok(Cudnn {
            lib,
            handle,
            plans: HashMap::new(),
            bwd_plans: HashMap::new(),
            buffers: VendorBuffers::default(),
        })
    }

    /// The descriptors of the convolution `g` on data of `dtype` (f32: FMA
    /// math; bf16: tensor cores), algorithm and workspace unset.
    fn descriptors(&self, g: &Conv3dGeometry, dtype: DType) -> Result<Plan> {
        let lib = self.lib;
        let (dt, math) = match dtype {
            DType::F32 => (DATA_FLOAT, FMA_MATH),
            DType::BF16 => (DATA_BFLOAT16, TENSOR_OP_MATH),
            other => {
                return Err(Error::Conv3dDType {
                    tensor: "input",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        };
        let (xd, xs) = dims(g.input_shape())?;
        let (yd, ys) = dims(g.output_shape())?;
        let (wd, _) = dims(g.weight_shape())?;
        let p = &g.params;
        let mut pads = [0i32; 3];
        let mut strides = [0i32; 3];
        let mut dils = [0i32; 3];
        for i in 0..3 {
            pads[i] = c_int_of(p.padding[i])?;
            strides[i] = c_int_of(p.stride[i])?;
            dils[i] = c_int_of(p.dilation[i])?;
        }
        let groups = c_int_of(p.groups)?;
        let mut plan = Plan {
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: 0,
            workspace: 0,
        };
        // Whatever fails below, `destroy` frees what was created.
        let r = (|| -> Result<()> {
            // SAFETY: (each create) writes one descriptor.
            check("cudnnCreateTensorDescriptor", unsafe {
                (lib.create_tensor)(&mut plan.x)
            })?;
            // SAFETY: as above.
            check("cudnnCreateTensorDescriptor", unsafe {
                (lib.create_tensor)(&mut plan.y)
            })?;
            // SAFETY: as above.
            check("cudnnCreateFilterDescriptor", unsafe {
                (lib.create_filter)(&mut plan.w)
            })?;
            // SAFETY: as above.
            check("cudnnCreateConvolutionDescriptor", unsafe {
                (lib.create_conv)(&mut plan.conv)
            })?;
            // SAFETY: (each set) a live descriptor; each array holds the
            // count given.
            check("cudnnSetTensorNdDescriptor", unsafe {
                (lib.set_tensor)(plan.x, dt, 5, xd.as_ptr(), xs.as_ptr())
            })?;
            // SAFETY: as above.
            check("cudnnSetTensorNdDescriptor", unsafe {
                (lib.set_tensor)(plan.y, dt, 5, yd.as_ptr(), ys.as_ptr())
            })?;
            // SAFETY: as above.
            check("cudnnSetFilterNdDescriptor", unsafe {
                (lib.set_filter)(plan.w, dt, TENSOR_NCHW, 5, wd.as_ptr())
            })?;
            // SAFETY: as above (three arrays of 3).
            check("cudnnSetConvolutionNdDescriptor", unsafe {
                (lib.set_conv)(
                    plan.conv,
                    3,
                    pads.as_ptr(),
                    strides.as_ptr(),
                    dils.as_ptr(),
                    CROSS_CORRELATION,
                    DATA_FLOAT,
                )
            })?;
            // SAFETY: a live descriptor.
            check("cudnnSetConvolutionGroupCount", unsafe {
                (lib.set_group_count)(plan.conv, groups)
            })?;
            // SAFETY: a live descriptor.
            check("cudnnSetConvolutionMathType", unsafe {
                (lib.set_math_type)(plan.conv, math)
            })
        })();
        match r {
            Ok(()) => Ok(plan),
            Err(e) => {
                destroy(lib, plan);
                Err(e)
            }
        }
    }

    fn build(&self, a: &Conv3dLaunch) -> Result<Plan> {
        let lib = self.lib;
        let mut plan = self.descriptors(&a.geometry, a.dtype)?;
        // Whatever fails below, `destroy` frees the descriptors.
        let r = (|| -> Result<()> {
            const N: usize = 8;
            let mut perf = [FwdAlgoPerf::default(); N];
            let mut n: c_int = 0;
            // SAFETY: live handle and descriptors; `perf` holds N results.
            check("cudnnGetConvolutionForwardAlgorithm_v7", unsafe {
                (lib.find_algo)(
                    self.handle,
                    plan.x,
                    plan.w,
                    plan.conv,
                    plan.y,
                    N as c_int,
                    &mut n,
                    perf.as_mut_ptr(),
                )
            })?;
            let Some(best) = first_usable(&perf, n) else {
                return check("cudnnGetConvolutionForwardAlgorithm_v7", NOT_SUPPORTED);
            };
            plan.algo = best;
            // SAFETY: live handle and descriptors; writes one size_t.
            check("cudnnGetConvolutionForwardWorkspaceSize", unsafe {
                (lib.workspace)(
                    self.handle,
                    plan.x,
                    plan.w,
                    plan.conv,
                    plan.y,
                    plan.algo,
                    &mut plan.workspace,
                )
            })
        })();
        match r {
            Ok(()) => Ok(plan),
            Err(e) => {
                destroy(lib, plan);
                Err(e)
            }
        }
    }

    /// The workspace bytes `a` needs (sets up its plan on first use).
    fn plan_workspace(&mut self, a: &Conv3dLaunch) -> Result<usize> {
        let key = (a.geometry, a.dtype);
        if let Some(p) = self.plans.get(&key) {
            return Ok(p.workspace);
        }
        let plan = self.build(a)?;
        let ws = plan.workspace;
        self.plans.insert(key, plan);
        Ok(ws)
    }
}

#[cfg(feature = "cuda")]
impl VendorConv for Cudnn {
    fn buffers(&mut self) -> &mut VendorBuffers {
        &mut self.buffers
    }

    fn workspace(&mut self, a: &Conv3dLaunch) -> Result<usize> {
        self.plan_workspace(a)
    }

    fn backward_workspace(&mut self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Result<usize> {
        self.bwd_plan(op, g).map(|p| p.workspace)
    }

    unsafe fn backward(
        &mut self,
        a: &Conv3dBackwardLaunch,
        stream: RawStream,
        workspace: DevicePtr,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees (the same contract).
        unsafe { self.run_backward(a, stream, workspace) }
    }

    unsafe fn forward(
        &mut self,
        a: &Conv3dLaunch,
        stream: RawStream,
        y: DevicePtr,
        workspace: DevicePtr,
    ) -> Result<()> {
        let ws_bytes = self.plan_workspace(a)?;
        let Some(plan) = self.plans.get(&(a.geometry, a.dtype)) else {
            return Err(Error::Conv3dTier {
                tier: "cudnn",
                reason: "the plan vanished",
            });
        };
        let lib = self.lib;
        let ptr = |p: DevicePtr| p.0 as usize as *mut c_void;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: live handle and stream (caller).
        check("cudnnSetStream", unsafe {
            (lib.set_stream)(self.handle, stream.0 as usize as *mut c_void)
        })?;
        // SAFETY: live handle and descriptors built for this geometry and
        // dtype; the buffers match them (caller); the workspace has the size
        // cuDNN asked for this algorithm; alpha and beta are host floats
        // (cuDNN's scaling parameters are float for float and bf16 data).
        check("cudnnConvolutionForward", unsafe {
            (lib.forward)(
                self.handle,
                (&alpha as *const f32).cast(),
                plan.x,
                ptr(a.input),
                plan.w,
                ptr(a.weight),
                plan.conv,
                plan.algo,
                if ws_bytes == 0 {
                    std::ptr::null_mut()
                } else {
                    ptr(workspace)
                },
                ws_bytes,
                (&beta as *const f32).cast(),
                plan.y,
                ptr(y),
            )
        })
    }
}

/// Destroys a plan's descriptors (errors have nowhere to go: dropped).
fn destroy(lib: &Lib, p: Plan) {
    // SAFETY: each non-null descriptor was created by us and is destroyed
    // once, here.
    unsafe {
        for t in [p.x, p.y] {
            if !t.is_null() {
                (lib.destroy_tensor)(t);
            }
        }
        if !p.w.is_null() {
            (lib.destroy_filter)(p.w);
        }
        if !p.conv.is_null() {
            (lib.destroy_conv)(p.conv);
        }
    }
}

impl Drop for Cudnn {
    fn drop(&mut self) {
        let fwd = self.plans.drain().map(|(_, p)| p);
        for p in fwd.chain(self.bwd_plans.drain().map(|(_, p)| p)) {
            destroy(self.lib, p);
        }
        // SAFETY: created in `new`, destroyed once; the error is dropped.
        unsafe { (self.lib.destroy)(self.handle) };
    }
}

#[cfg(test)]
mod tests;
