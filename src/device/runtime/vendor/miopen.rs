//! MIOpen, the HIP backend's vendor convolution library, loaded at run time
//! through [`dynlib`](crate::device::dynlib) with [`miopen_spec`]: a MIOpen
//! already in the process first (PyTorch's), else the one beside the HIP
//! runtime in use (the same ROCm), then `$ROCM_PATH/lib`, `$HIP_PATH/lib`,
//! the loader path and `/opt/rocm/lib`. Never unloaded, as MIOpen keeps
//! process-wide state. MIOpen links `libamdhip64` itself: when loading it
//! brought a second HIP runtime into the process (a MIOpen of another
//! ROCm), the vendor tier is refused with both files named (the library
//! stays loaded: nothing is ever unloaded). Only the calls the conv3d
//! vendor tier needs are bound, with the C signatures of MIOpen's
//! `include/miopen/miopen.h`:
//!
//! ```c
//! miopenStatus_t miopenGetVersion(size_t* major, size_t* minor, size_t* patch);
//! miopenStatus_t miopenCreate(miopenHandle_t* handle);
//! miopenStatus_t miopenDestroy(miopenHandle_t handle);
//! miopenStatus_t miopenSetStream(miopenHandle_t handle, miopenAcceleratorQueue_t streamID);
//! miopenStatus_t miopenCreateTensorDescriptor(miopenTensorDescriptor_t* tensorDesc);
//! miopenStatus_t miopenSetTensorDescriptor(miopenTensorDescriptor_t tensorDesc,
//!     miopenDataType_t dataType, int nbDims, int* dimsA, int* stridesA);
//! miopenStatus_t miopenDestroyTensorDescriptor(miopenTensorDescriptor_t tensorDesc);
//! miopenStatus_t miopenCreateConvolutionDescriptor(miopenConvolutionDescriptor_t* convDesc);
//! miopenStatus_t miopenInitConvolutionNdDescriptor(miopenConvolutionDescriptor_t convDesc,
//!     int spatialDim, int* padA, int* strideA, int* dilationA, miopenConvolutionMode_t c_mode);
//! miopenStatus_t miopenSetConvolutionGroupCount(miopenConvolutionDescriptor_t convDesc,
//!     int groupCount);
//! miopenStatus_t miopenDestroyConvolutionDescriptor(miopenConvolutionDescriptor_t convDesc);
//! miopenStatus_t miopenConvolutionForwardGetWorkSpaceSize(miopenHandle_t handle,
//!     const miopenTensorDescriptor_t wDesc, const miopenTensorDescriptor_t xDesc,
//!     const miopenConvolutionDescriptor_t convDesc, const miopenTensorDescriptor_t yDesc,
//!     size_t* workSpaceSize);
//! miopenStatus_t miopenFindConvolutionForwardAlgorithm(miopenHandle_t handle,
//!     const miopenTensorDescriptor_t xDesc, const void* x,
//!     const miopenTensorDescriptor_t wDesc, const void* w,
//!     const miopenConvolutionDescriptor_t convDesc,
//!     const miopenTensorDescriptor_t yDesc, void* y,
//!     const int requestAlgoCount, int* returnedAlgoCount,
//!     miopenConvAlgoPerf_t* perfResults, void* workSpace, size_t workSpaceSize,
//!     bool exhaustiveSearch);
//! miopenStatus_t miopenConvolutionForward(miopenHandle_t handle, const void* alpha,
//!     const miopenTensorDescriptor_t xDesc, const void* x,
//!     const miopenTensorDescriptor_t wDesc, const void* w,
//!     const miopenConvolutionDescriptor_t convDesc, miopenConvFwdAlgorithm_t algo,
//!     const void* beta, const miopenTensorDescriptor_t yDesc, void* y,
//!     void* workSpace, size_t workSpaceSize);
//! ```
//!
//! and, bound apart (`miopen/miopen_backward.rs`: a MIOpen without them keeps the
//! forward tier), the gradients' calls (the perf results are the same
//! `miopenConvAlgoPerf_t`, whose union holds `bwd_data_algo` or
//! `bwd_weights_algo`):
//!
//! ```c
//! miopenStatus_t miopenConvolutionBackwardDataGetWorkSpaceSize(miopenHandle_t handle,
//!     const miopenTensorDescriptor_t dyDesc, const miopenTensorDescriptor_t wDesc,
//!     const miopenConvolutionDescriptor_t convDesc, const miopenTensorDescriptor_t dxDesc,
//!     size_t* workSpaceSize);
//! miopenStatus_t miopenFindConvolutionBackwardDataAlgorithm(miopenHandle_t handle,
//!     const miopenTensorDescriptor_t dyDesc, const void* dy,
//!     const miopenTensorDescriptor_t wDesc, const void* w,
//!     const miopenConvolutionDescriptor_t convDesc,
//!     const miopenTensorDescriptor_t dxDesc, void* dx,
//!     const int requestAlgoCount, int* returnedAlgoCount,
//!     miopenConvAlgoPerf_t* perfResults, void* workSpace, size_t workSpaceSize,
//!     bool exhaustiveSearch);
//! miopenStatus_t miopenConvolutionBackwardData(miopenHandle_t handle, const void* alpha,
//!     const miopenTensorDescriptor_t dyDesc, const void* dy,
//!     const miopenTensorDescriptor_t wDesc, const void* w,
//!     const miopenConvolutionDescriptor_t convDesc, miopenConvBwdDataAlgorithm_t algo,
//!     const void* beta, const miopenTensorDescriptor_t dxDesc, void* dx,
//!     void* workSpace, size_t workSpaceSize);
//! miopenStatus_t miopenConvolutionBackwardWeightsGetWorkSpaceSize(miopenHandle_t handle,
//!     const miopenTensorDescriptor_t dyDesc, const miopenTensorDescriptor_t xDesc,
//!     const miopenConvolutionDescriptor_t convDesc, const miopenTensorDescriptor_t dwDesc,
//!     size_t* workSpaceSize);
//! miopenStatus_t miopenFindConvolutionBackwardWeightsAlgorithm(miopenHandle_t handle,
//!     const miopenTensorDescriptor_t dyDesc, const void* dy,
//!     const miopenTensorDescriptor_t xDesc, const void* x,
//!     const miopenConvolutionDescriptor_t convDesc,
//!     const miopenTensorDescriptor_t dwDesc, void* dw,
//!     const int requestAlgoCount, int* returnedAlgoCount,
//!     miopenConvAlgoPerf_t* perfResults, void* workSpace, size_t workSpaceSize,
//!     bool exhaustiveSearch);
//! miopenStatus_t miopenConvolutionBackwardWeights(miopenHandle_t handle, const void* alpha,
//!     const miopenTensorDescriptor_t dyDesc, const void* dy,
//!     const miopenTensorDescriptor_t xDesc, const void* x,
//!     const miopenConvolutionDescriptor_t convDesc, miopenConvBwdWeightsAlgorithm_t algo,
//!     const void* beta, const miopenTensorDescriptor_t dwDesc, void* dw,
//!     void* workSpace, size_t workSpaceSize);
//! ```
//!
//! C enums (`miopenStatus_t`, `miopenDataType_t`, ...) are taken as `int`,
//! so an unknown status code is just a number, never undefined behaviour.
//!
//! The algorithm is chosen once per (geometry, dtype) with
//! `miopenFindConvolutionForwardAlgorithm` (find mode, not exhaustive) and
//! cached with its descriptors. MIOpen writes an output of the input's
//! dtype: for bf16 the backend gives it a bf16 scratch buffer and widens it
//! into the f32 output (with the bias) with `conv3d_widen_bias_bf16`.

#![cfg_attr(not(feature = "hip"), allow(dead_code))]

mod miopen_backward;

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
#[cfg(feature = "hip")]
use std::path::Path;
use std::path::PathBuf;
use std::sync::OnceLock;

#[cfg(feature = "doctor")]
use super::libs::Loaded;
use super::libs::{bind_fn, miopen_spec};
use super::VendorBuffers;
#[cfg(feature = "hip")]
use super::VendorConv;
use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
use crate::device::dynlib::{self, Spec};
use crate::device::info::DevicePtr;
#[cfg(feature = "hip")]
use crate::device::info::RawStream;
#[cfg(feature = "hip")]
use crate::device::raw::conv3d::Conv3dBackwardLaunch;
use crate::device::raw::conv3d::Conv3dLaunch;
use crate::dtype::DType;
use crate::error::{Error, Result};
use miopen_backward::BwdFns;

type Handle = *mut c_void;
type TensorDesc = *mut c_void;
type ConvDesc = *mut c_void;
type Status = c_int;

/// `miopenFloat`.
const MIOPEN_FLOAT: c_int = 1;
/// `miopenBFloat16`.
const MIOPEN_BFLOAT16: c_int = 5;
/// `miopenConvolution` (cross-correlation, what PyTorch's conv3d computes).
const MIOPEN_CONVOLUTION: c_int = 0;
/// The code [`check`] reports when the search returned no algorithm.
pub(crate) const NO_ALGORITHM: c_int = -1;

/// `miopenConvAlgoPerf_t`: a union of 4-byte enums, a float, a size_t.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct ConvAlgoPerf {
    fwd_algo: c_int,
    time: f32,
    memory: usize,
}

#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<ConvAlgoPerf>() == 16);

/// The bound functions.
#[derive(Debug)]
pub(crate) struct Lib {
    /// Holds the library open (read only by the doctor otherwise).
    #[cfg_attr(not(feature = "doctor"), allow(dead_code))]
    lib: dynlib::Lib,
    /// `miopenGetVersion` (`"3.4.0"`), when the library has it.
    #[cfg_attr(not(feature = "doctor"), allow(dead_code))]
    version: Option<String>,
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    set_stream: unsafe extern "C" fn(Handle, *mut c_void) -> Status,
    create_tensor: unsafe extern "C" fn(*mut TensorDesc) -> Status,
    set_tensor: unsafe extern "C" fn(TensorDesc, c_int, c_int, *mut c_int, *mut c_int) -> Status,
    destroy_tensor: unsafe extern "C" fn(TensorDesc) -> Status,
    create_conv: unsafe extern "C" fn(*mut ConvDesc) -> Status,
    init_conv_nd:
        unsafe extern "C" fn(ConvDesc, c_int, *mut c_int, *mut c_int, *mut c_int, c_int) -> Status,
    set_group_count: unsafe extern "C" fn(ConvDesc, c_int) -> Status,
    destroy_conv: unsafe extern "C" fn(ConvDesc) -> Status,
    workspace: unsafe extern "C" fn(
        Handle,
        TensorDesc,
        TensorDesc,
        ConvDesc,
        TensorDesc,
        *mut usize,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    find: unsafe extern "C" fn(
        Handle,
        TensorDesc,
        *const c_void,
        TensorDesc,
        *const c_void,
        ConvDesc,
        TensorDesc,
        *mut c_void,
        c_int,
        *mut c_int,
        *mut ConvAlgoPerf,
        *mut c_void,
        usize,
        bool,
    ) -> Status,
    #[allow(clippy::type_complexity)]
    forward: unsafe extern "C" fn(
        Handle,
        *const c_void,
        TensorDesc,
        *const c_void,
        TensorDesc,
        *const c_void,
        ConvDesc,
        c_int,
        *const c_void,
        TensorDesc,
        *mut c_void,
        *mut c_void,
        usize,
    ) -> Status,
    /// The backward calls, or the first one missing (only the backward ops
    /// are then unavailable).
    backward: std::result::Result<BwdFns, &'static str>,
}

fn unavailable(reason: String) -> Error {
    Error::VendorUnavailable {
        backend: "hip",
        library: "libMIOpen",
        reason,
    }
}

fn library_result() -> &'static std::result::Result<Lib, String> {
    static LIB: OnceLock<std::result::Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(|| {
        let runtime = hip_runtime_file();
        load(&miopen_spec(runtime.as_deref()))
    })
}

/// The loaded library (loaded on the first call), or
/// [`Error::VendorUnavailable`] saying why it cannot be used.
pub(crate) fn library() -> Result<&'static Lib> {
    library_result()
        .as_ref()
        .map_err(|reason| unavailable(reason.clone()))
}

/// `Ok` when MIOpen's backward calls can be used here, else
/// [`Error::VendorUnavailable`] (the library, or one of its backward
/// symbols, is missing).
pub(crate) fn backward_available() -> Result<()> {
    let lib = library()?;
    lib.backward.as_ref().map(|_| ()).map_err(|sym| {
        let at = lib
            .lib
            .path()
            .map_or_else(|| "MIOpen".to_owned(), |p| p.display().to_string());
        unavailable(format!(
            "{at}: symbol {sym} not found: the backward ops are not served by MIOpen"
        ))
    })
}

/// The MIOpen in use (opening it if need be), or why there is none: for
/// the doctor.
#[cfg(feature = "doctor")]
pub(crate) fn loaded() -> std::result::Result<Loaded, String> {
    library_result()
        .as_ref()
        .map(Lib::loaded)
        .map_err(Clone::clone)
}

/// The file of the HIP runtime the HIP backend uses (opening it if need
/// be), so that MIOpen is looked for beside it.
#[cfg(feature = "hip")]
fn hip_runtime_file() -> Option<PathBuf> {
    crate::device::runtime::hip::runtime_library()
        .and_then(|l| l.path().map(Path::to_path_buf))
        .or_else(super::libs::hip_runtime_path)
}

/// Without the HIP backend: the first HIP runtime mapped, if any.
#[cfg(not(feature = "hip"))]
fn hip_runtime_file() -> Option<PathBuf> {
    super::libs::hip_runtime_path()
}

/// Why the process cannot use MIOpen when it maps `copies` (the distinct
/// `libamdhip64` files) after loading `miopen`: `None` for one (or none).
pub(crate) fn second_runtime_reason(miopen: &str, copies: &[PathBuf]) -> Option<String> {
    (copies.len() > 1).then(|| {
        let list: Vec<String> = copies.iter().map(|p| p.display().to_string()).collect();
        format!(
            "{miopen} brought a second HIP runtime into the process ({} are all mapped): its \
             calls would use another runtime's streams and memory, so the vendor tier is not \
             used (the library stays loaded: nothing is unloaded); point {} at the MIOpen of \
             the ROCm the HIP runtime comes from",
            list.join(", "),
            super::libs::MIOPEN_VAR
        )
    })
}

/// Opens MIOpen by `spec`, binds the functions, and refuses it when the
/// process then maps two HIP runtimes; the message says why not.
pub(crate) fn load(spec: &Spec) -> std::result::Result<Lib, String> {
    let lib = dynlib::open(spec).map_err(|e| e.to_string())?;
    let at = lib
        .path()
        .map_or_else(|| "MIOpen".to_owned(), |p| p.display().to_string());
    // SAFETY: the library is a libMIOpen (found by its names), never closed.
    let bound = unsafe { bind(lib) }.map_err(|sym| format!("{at}: symbol {sym} not found"))?;
    if let Some(why) = second_runtime_reason(&at, &super::libs::hip_runtime_copies()) {
        return Err(why);
    }
    Ok(bound)
}

/// # Safety
/// `lib` is MIOpen's library; it is never closed.
unsafe fn bind(lib: dynlib::Lib) -> std::result::Result<Lib, &'static str> {
    // SAFETY: (every bind below) each field's type is the C signature of
    // the function of that name in miopen.h (module docs), enums as int;
    // the library is never closed.
    let version = unsafe {
        bind_fn::<unsafe extern "C" fn(*mut usize, *mut usize, *mut usize) -> Status>(
            &lib,
            c"miopenGetVersion",
        )
    }
    .ok()
    .and_then(|f| {
        let (mut a, mut b, mut c) = (0usize, 0usize, 0usize);
        // SAFETY: writes three size_t.
        (unsafe { f(&mut a, &mut b, &mut c) } == 0).then(|| format!("{a}.{b}.{c}"))
    });
    // SAFETY: as above.
    unsafe {
        Ok(Lib {
            version,
            create: bind_fn(&lib, c"miopenCreate")?,
            destroy: bind_fn(&lib, c"miopenDestroy")?,
            set_stream: bind_fn(&lib, c"miopenSetStream")?,
            create_tensor: bind_fn(&lib, c"miopenCreateTensorDescriptor")?,
            set_tensor: bind_fn(&lib, c"miopenSetTensorDescriptor")?,
            destroy_tensor: bind_fn(&lib, c"miopenDestroyTensorDescriptor")?,
            create_conv: bind_fn(&lib, c"miopenCreateConvolutionDescriptor")?,
            init_conv_nd: bind_fn(&lib, c"miopenInitConvolutionNdDescriptor")?,
            set_group_count: bind_fn(&lib, c"miopenSetConvolutionGroupCount")?,
            destroy_conv: bind_fn(&lib, c"miopenDestroyConvolutionDescriptor")?,
            workspace: bind_fn(&lib, c"miopenConvolutionForwardGetWorkSpaceSize")?,
            find: bind_fn(&lib, c"miopenFindConvolutionForwardAlgorithm")?,
            forward: bind_fn(&lib, c"miopenConvolutionForward")?,
            backward: BwdFns::bind(&lib),
            lib,
        })
    }
}

impl Lib {
    /// What the doctor shows of this copy.
    #[cfg(feature = "doctor")]
    pub(crate) fn loaded(&self) -> Loaded {
        Loaded::of(&self.lib, self.version.clone())
    }
}

/// The name of a `miopenStatus_t` code.
pub(crate) fn status_name(code: c_int) -> &'static str {
    match code {
        0 => "miopenStatusSuccess",
        1 => "miopenStatusNotInitialized",
        2 => "miopenStatusInvalidValue",
        3 => "miopenStatusBadParm",
        4 => "miopenStatusAllocFailed",
        5 => "miopenStatusInternalError",
        6 => "miopenStatusNotImplemented",
        7 => "miopenStatusUnknownError",
        8 => "miopenStatusUnsupportedOp",
        9 => "miopenStatusGpuOperationsSkipped",
        10 => "miopenStatusVersionMismatch",
        NO_ALGORITHM => "no suitable algorithm (the search returned none)",
        _ => "unknown miopenStatus",
    }
}

/// `Ok` for `miopenStatusSuccess`, else [`Error::Conv3dMiopen`].
pub(crate) fn check(op: &'static str, code: c_int) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Conv3dMiopen {
            op,
            code,
            status: status_name(code),
        })
    }
}

fn c_int_of(v: usize) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::Conv3dTier {
        tier: "miopen",
        reason: "a size does not fit miopen's 32-bit dimensions",
    })
}

/// Dimensions and contiguous strides of a 5-d shape as `int`s.
fn dims(s: [usize; 5]) -> Result<([c_int; 5], [c_int; 5])> {
    let mut d: [c_int; 5] = [0; 5];
    for (o, &v) in d.iter_mut().zip(&s) {
        *o = c_int_of(v)?;
    }
    let mut st: [c_int; 5] = [1; 5];
    for i in (0..4).rev() {
        st[i] = st[i + 1].checked_mul(d[i + 1]).ok_or(Error::Conv3dTier {
            tier: "miopen",
            reason: "a size does not fit miopen's 32-bit dimensions",
        })?;
    }
    Ok((d, st))
}

/// Descriptors and the chosen algorithm of one (geometry, dtype).
#[derive(Debug)]
struct Plan {
    x: TensorDesc,
    w: TensorDesc,
    y: TensorDesc,
    conv: ConvDesc,
    workspace: usize,
    algo: Option<c_int>,
}

/// A MIOpen handle and its plans (one per HIP device, used under a lock).
#[derive(Debug)]
pub(crate) struct Miopen {
    lib: &'static Lib,
    handle: Handle,
    plans: HashMap<(Conv3dGeometry, DType), Plan>,
    /// The f32 plans of the backward ops.
    bwd_plans: HashMap<(Conv3dBackwardOp, Conv3dGeometry), Plan>,
    /// Scratch and workspace kept between calls.
    buffers: VendorBuffers,
}

// SAFETY: the handle and descriptors are heap objects of MIOpen that may be
// used from any thread, one thread at a time; `Miopen` is only used behind
// the backend's Mutex.
unsafe impl Send for Miopen {}

impl Miopen {
    /// Creates a handle (the HIP device must be current).
    ///
    /// Errors: [`Error::VendorUnavailable`], or [`Error::Conv3dMiopen`].
    pub(crate) fn new() -> Result<Miopen> {
        let lib = library()?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: writes one handle.
        check("miopenCreate", unsafe { (lib.create)(&mut handle) })?;
        Ok(Miopen {
            lib,
            handle,
            plans: HashMap::new(),
            bwd_plans: HashMap::new(),
            buffers: VendorBuffers::default(),
        })
    }

    fn tensor(&self, dtype: c_int, shape: [usize; 5]) -> Result<TensorDesc> {
        let (mut d, mut s) = dims(shape)?;
        let mut t: TensorDesc = std::ptr::null_mut();
        // SAFETY: writes one descriptor.
        check("miopenCreateTensorDescriptor", unsafe {
            (self.lib.create_tensor)(&mut t)
        })?;
        // SAFETY: `t` was just created; `d` and `s` hold 5 ints each.
        let r = check("miopenSetTensorDescriptor", unsafe {
            (self.lib.set_tensor)(t, dtype, 5, d.as_mut_ptr(), s.as_mut_ptr())
        });
        if let Err(e) = r {
            // SAFETY: created above, destroyed once.
            unsafe { (self.lib.destroy_tensor)(t) };
            return Err(e);
        }
        Ok(t)
    }

    /// The descriptors of the convolution `g` on data of `dtype`, workspace
    /// and algorithm unset.
    fn descriptors(&self, g: &Conv3dGeometry, dtype: DType) -> Result<Plan> {
        let dtype = match dtype {
            DType::F32 => MIOPEN_FLOAT,
            DType::BF16 => MIOPEN_BFLOAT16,
            other => {
                return Err(Error::Conv3dDType {
                    tensor: "input",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        };
        let p = &g.params;
        let mut pads = [0; 3];
        let mut strides = [0; 3];
        let mut dils = [0; 3];
        for i in 0..3 {
            pads[i] = c_int_of(p.padding[i])?;
            strides[i] = c_int_of(p.stride[i])?;
            dils[i] = c_int_of(p.dilation[i])?;
        }
        let groups = c_int_of(p.groups)?;
        let mut plan = Plan {
            x: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            workspace: 0,
            algo: None,
        };
        // Whatever fails below, `plan` destroys what was created.
        let r = (|| -> Result<()> {
            plan.x = self.tensor(dtype, g.input_shape())?;
            plan.w = self.tensor(dtype, g.weight_shape())?;
            plan.y = self.tensor(dtype, g.output_shape())?;
            // SAFETY: writes one descriptor.
            check("miopenCreateConvolutionDescriptor", unsafe {
                (self.lib.create_conv)(&mut plan.conv)
            })?;
            // SAFETY: a live descriptor; three arrays of 3 ints.
            check("miopenInitConvolutionNdDescriptor", unsafe {
                (self.lib.init_conv_nd)(
                    plan.conv,
                    3,
                    pads.as_mut_ptr(),
                    strides.as_mut_ptr(),
                    dils.as_mut_ptr(),
                    MIOPEN_CONVOLUTION,
                )
            })?;
            // SAFETY: a live descriptor.
            check("miopenSetConvolutionGroupCount", unsafe {
                (self.lib.set_group_count)(plan.conv, groups)
            })
        })();
        match r {
            Ok(()) => Ok(plan),
            Err(e) => {
                self.destroy(plan);
                Err(e)
            }
        }
    }

    fn build(&self, a: &Conv3dLaunch) -> Result<Plan> {
        let mut plan = self.descriptors(&a.geometry, a.dtype)?;
        let r = (|| -> Result<()> {
            // SAFETY: live handle and descriptors; writes one size_t.
            check("miopenConvolutionForwardGetWorkSpaceSize", unsafe {
                (self.lib.workspace)(
                    self.handle,
                    plan.w,
                    plan.x,
                    plan.conv,
                    plan.y,
                    &mut plan.workspace,
                )
            })?;
            Ok(())
        })();
        match r {
            Ok(()) => Ok(plan),
            Err(e) => {
                self.destroy(plan);
                Err(e)
            }
        }
    }

    fn destroy(&self, p: Plan) {
        // Errors have nowhere to go; every non-null descriptor was created
        // by us and is destroyed once, here.
        for t in [p.x, p.w, p.y] {
            if !t.is_null() {
                // SAFETY: see above.
                unsafe { (self.lib.destroy_tensor)(t) };
            }
        }
        if !p.conv.is_null() {
            // SAFETY: see above.
            unsafe { (self.lib.destroy_conv)(p.conv) };
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

    /// The convolution of `a` into `y` on `stream`, after choosing the
    /// algorithm with a find on the first call of this plan.
    ///
    /// # Safety
    /// As [`VendorConv::forward`].
    unsafe fn run(
        &mut self,
        a: &Conv3dLaunch,
        stream: *mut c_void,
        y: DevicePtr,
        workspace: DevicePtr,
    ) -> Result<()> {
        let ws_bytes = self.plan_workspace(a)?;
        let key = (a.geometry, a.dtype);
        let (lib, handle) = (self.lib, self.handle);
        let Some(plan) = self.plans.get_mut(&key) else {
            return Err(Error::Conv3dTier {
                tier: "miopen",
                reason: "the plan vanished",
            });
        };
        let ptr = |p: DevicePtr| p.0 as usize as *mut c_void;
        // SAFETY: live handle; a live stream (caller).
        check("miopenSetStream", unsafe {
            (lib.set_stream)(handle, stream)
        })?;
        let algo = match plan.algo {
            Some(a) => a,
            None => {
                let mut perf = [ConvAlgoPerf::default(); 4];
                let mut n: c_int = 0;
                // SAFETY: live handle and descriptors matching the buffers
                // (caller), `perf` holds 4 results, the workspace is as
                // large as MIOpen asked for.
                check("miopenFindConvolutionForwardAlgorithm", unsafe {
                    (lib.find)(
                        handle,
                        plan.x,
                        ptr(a.input),
                        plan.w,
                        ptr(a.weight),
                        plan.conv,
                        plan.y,
                        ptr(y),
                        4,
                        &mut n,
                        perf.as_mut_ptr(),
                        ptr(workspace),
                        ws_bytes,
                        false,
                    )
                })?;
                let best = perf
                    .get(..usize::try_from(n).unwrap_or(0).min(4))
                    .and_then(|p| p.iter().find(|p| p.memory <= ws_bytes));
                let Some(best) = best else {
                    return check("miopenFindConvolutionForwardAlgorithm", NO_ALGORITHM);
                };
                plan.algo = Some(best.fwd_algo);
                best.fwd_algo
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: as for the find; alpha and beta are host floats (MIOpen's
        // scaling parameters are float for float and bfloat16 data).
        check("miopenConvolutionForward", unsafe {
            (lib.forward)(
                handle,
                (&alpha as *const f32).cast(),
                plan.x,
                ptr(a.input),
                plan.w,
                ptr(a.weight),
                plan.conv,
                algo,
                (&beta as *const f32).cast(),
                plan.y,
                ptr(y),
                ptr(workspace),
                ws_bytes,
            )
        })
    }
}

#[cfg(feature = "hip")]
impl VendorConv for Miopen {
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
        unsafe { self.run_backward(a, stream.0 as usize as *mut c_void, workspace) }
    }
    unsafe fn forward(
        &mut self,
        a: &Conv3dLaunch,
        stream: RawStream,
        y: DevicePtr,
        workspace: DevicePtr,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees (the same contract).
        unsafe { self.run(a, stream.0 as usize as *mut c_void, y, workspace) }
    }
}

impl Drop for Miopen {
    fn drop(&mut self) {
        let fwd = self.plans.drain().map(|(_, p)| p);
        let plans: Vec<Plan> = fwd.chain(self.bwd_plans.drain().map(|(_, p)| p)).collect();
        for p in plans {
            self.destroy(p);
        }
        // SAFETY: created in `new`, destroyed once; errors have nowhere to
        // go.
        unsafe { (self.lib.destroy)(self.handle) };
    }
}

#[cfg(test)]
mod tests;
