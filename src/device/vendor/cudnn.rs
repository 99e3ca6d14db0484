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
//! C enums are taken as `int`: an unknown status is a number, never
//! undefined behaviour. Descriptors are created per (geometry, dtype),
//! cached with the chosen algorithm, and destroyed here (destroy errors are
//! dropped: nothing at teardown panics).
//!
//! f32 runs with `CUDNN_FMA_MATH` (true f32, no TF32); bf16 with tensor
//! cores and f32 accumulation, writing a bf16 output that the backend
//! widens (with the bias) into the f32 output.
#![cfg_attr(not(feature = "cuda"), allow(dead_code))]

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

#[cfg(feature = "doctor")]
use super::libs::Loaded;
use super::libs::{bind_fn, cudnn_spec};
use super::VendorBuffers;
#[cfg(feature = "cuda")]
use super::VendorConv;
use crate::conv3d::Conv3dGeometry;
use crate::device::conv3d::Conv3dLaunch;
use crate::device::dynlib::{self, Spec};
#[cfg(feature = "cuda")]
use crate::device::info::{DevicePtr, RawStream};
use crate::dtype::DType;
use crate::error::{Error, Result};

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

/// Descriptors, algorithm and workspace size of one (geometry, dtype).
#[derive(Debug)]
struct Plan {
    x: TensorDesc,
    y: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    algo: c_int,
    workspace: usize,
}

/// A cuDNN handle and its plans (one per CUDA device, used under a lock).
#[derive(Debug)]
pub(crate) struct Cudnn {
    lib: &'static Lib,
    handle: Handle,
    plans: HashMap<(Conv3dGeometry, DType), Plan>,
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
            buffers: VendorBuffers::default(),
        })
    }

    fn build(&self, a: &Conv3dLaunch) -> Result<Plan> {
        let lib = self.lib;
        let g = &a.geometry;
        let (dt, math) = match a.dtype {
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
            })?;
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
            let best = perf
                .get(..usize::try_from(n).unwrap_or(0).min(N))
                .and_then(|p| p.iter().find(|r| r.status == 0));
            let Some(best) = best else {
                return check("cudnnGetConvolutionForwardAlgorithm_v7", NOT_SUPPORTED);
            };
            plan.algo = best.algo;
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
        for (_, p) in self.plans.drain() {
            destroy(self.lib, p);
        }
        // SAFETY: created in `new`, destroyed once; the error is dropped.
        unsafe { (self.lib.destroy)(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn status_codes_map_to_typed_errors() {
        assert!(check("cudnnCreate", 0).is_ok());
        let e = check("cudnnConvolutionForward", 1002).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Conv3dCudnn {
                    op: "cudnnConvolutionForward",
                    code: 1002,
                    status: "CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH"
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "conv3d: cudnn: cudnnConvolutionForward: \
             CUDNN_STATUS_SUBLIBRARY_VERSION_MISMATCH (status 1002)"
        );
        assert_eq!(status_name(NOT_SUPPORTED), "CUDNN_STATUS_NOT_SUPPORTED");
        assert_eq!(status_name(2001), "CUDNN_STATUS_INVALID_VALUE");
        assert_eq!(status_name(7), "unknown cudnnStatus_t");
        assert_eq!(version_text(91900), "9.19.0");
        assert_eq!(version_text(90100), "9.1.0");
    }

    #[test]
    fn two_mapped_copies_are_refused_with_both_paths() {
        assert_eq!(duplicate_reason(&[]), None);
        assert_eq!(duplicate_reason(&[PathBuf::from("/a/libcudnn.so.9")]), None);
        let why = duplicate_reason(&[
            PathBuf::from("/venv/nvidia/cudnn/lib/libcudnn.so.9"),
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libcudnn.so.9.14.0"),
        ])
        .unwrap();
        assert!(why.contains("maps 2 cuDNN files"), "{why}");
        assert!(
            why.contains("/venv/nvidia/cudnn/lib/libcudnn.so.9"),
            "{why}"
        );
        assert!(why.contains("libcudnn.so.9.14.0"), "{why}");
        assert!(why.contains("ROCM_SAFE_CUDNN"), "{why}");
    }

    #[test]
    fn missing_library_and_symbols_are_typed() {
        let spec = Spec {
            what: "cuDNN (libcudnn)",
            sonames: vec!["libcudnn-rocm-safe-absent.so.9"],
            stem: "libcudnn-rocm-safe-absent.so",
            env_var: Some("ROCM_SAFE_TEST_CUDNN_UNSET"),
            ..Spec::default()
        };
        let e = load(&spec).unwrap_err();
        assert!(e.starts_with("cuDNN (libcudnn) not found; tried "), "{e}");
        assert!(
            e.contains("loader path libcudnn-rocm-safe-absent.so.9"),
            "{e}"
        );
        // A library that loads but is not cuDNN.
        let libc = Spec {
            what: "cuDNN",
            sonames: vec!["libc.so.6"],
            stem: "libc.so",
            ..Spec::default()
        };
        let e = load(&libc).unwrap_err();
        assert!(e.ends_with(": symbol cudnnGetVersion not found"), "{e}");
        // This machine's cuDNN: absent (a typed error saying why) or bound.
        match library() {
            Err(Error::VendorUnavailable {
                backend: "cuda",
                library: "libcudnn",
                reason,
            }) => {
                assert!(!reason.is_empty());
                assert_eq!(loaded(), Err(reason));
            }
            Err(other) => panic!("{other}"),
            Ok(lib) => {
                let l = lib.loaded();
                assert!(
                    l.version.as_deref().unwrap_or("").starts_with("9."),
                    "{l:?}"
                );
                assert!(available().is_ok());
                // One cuDNN in this process, the one bound.
                assert_eq!(dynlib::mapped_copies("libcudnn.so").len(), 1);
            }
        }
    }

    #[test]
    fn sizes_beyond_32_bits_are_typed() {
        let (d, s) = dims([2, 3, 4, 5, 6]).unwrap();
        assert_eq!(d, [2, 3, 4, 5, 6]);
        assert_eq!(s, [360, 120, 30, 6, 1]);
        assert!(matches!(
            dims([1, 1, 1, 1, 1 << 40]),
            Err(Error::Conv3dTier { tier: "cudnn", .. })
        ));
        assert!(matches!(
            dims([1, 1 << 16, 1 << 16, 2, 1]),
            Err(Error::Conv3dTier { tier: "cudnn", .. })
        ));
    }
}
