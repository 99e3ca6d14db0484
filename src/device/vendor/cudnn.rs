//! cuDNN, the CUDA backend's vendor convolution library (feature `cuda`),
//! loaded at run time by cudarc. cudarc panics when a cuDNN symbol is used
//! without the library, so its presence is probed first
//! ([`available`]: [`Error::VendorUnavailable`] when absent).
//!
//! Only cudarc's thin `cudnn::result` layer is used, over raw device
//! addresses. Descriptors are created per (geometry, dtype), cached with
//! the chosen algorithm, and destroyed here with the `result` functions
//! (whose errors are dropped): cudarc's safe descriptor types, whose `Drop`
//! unwraps the destroy status and so can panic at teardown, are not used.
//!
//! f32 runs with `CUDNN_FMA_MATH` (true f32, no TF32); bf16 with tensor
//! cores and f32 accumulation, writing a bf16 output that the backend
//! widens (with the bias) into the f32 output.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::cudnn::result as dnn;
use cudarc::cudnn::sys;

use super::{VendorBuffers, VendorConv};
use crate::conv3d::Conv3dGeometry;
use crate::device::conv3d::Conv3dLaunch;
use crate::device::info::{DevicePtr, RawStream};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// `Ok` when libcudnn can be loaded, else [`Error::VendorUnavailable`].
pub(crate) fn available() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only tries to dlopen the candidate library names.
    if *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(Error::VendorUnavailable {
            backend: "cuda",
            library: "libcudnn",
            reason: "not found on the loader path (LD_LIBRARY_PATH)".into(),
        })
    }
}

fn err(op: &'static str) -> impl Fn(dnn::CudnnError) -> Error {
    move |source| Error::Conv3dCudnn { op, source }
}

fn c_int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Conv3dTier {
        tier: "cudnn",
        reason: "a size does not fit cudnn's 32-bit dimensions",
    })
}

fn dims(s: [usize; 5]) -> Result<([i32; 5], [i32; 5])> {
    let mut d = [0i32; 5];
    for (o, &v) in d.iter_mut().zip(&s) {
        *o = c_int(v)?;
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
    x: sys::cudnnTensorDescriptor_t,
    y: sys::cudnnTensorDescriptor_t,
    w: sys::cudnnFilterDescriptor_t,
    conv: sys::cudnnConvolutionDescriptor_t,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    workspace: usize,
}

/// A cuDNN handle and its plans (one per CUDA device, used under a lock).
#[derive(Debug)]
pub(crate) struct Cudnn {
    handle: sys::cudnnHandle_t,
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
    pub(crate) fn new() -> Result<Cudnn> {
        available()?;
        let handle = dnn::create_handle().map_err(err("cudnnCreate"))?;
        Ok(Cudnn {
            handle,
            plans: HashMap::new(),
            buffers: VendorBuffers::default(),
        })
    }

    fn build(&self, a: &Conv3dLaunch) -> Result<Plan> {
        use sys::{cudnnConvolutionMode_t, cudnnDataType_t, cudnnMathType_t, cudnnTensorFormat_t};
        let g = &a.geometry;
        let (dt, math) = match a.dtype {
            DType::F32 => (
                cudnnDataType_t::CUDNN_DATA_FLOAT,
                cudnnMathType_t::CUDNN_FMA_MATH,
            ),
            DType::BF16 => (
                cudnnDataType_t::CUDNN_DATA_BFLOAT16,
                cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            ),
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
            pads[i] = c_int(p.padding[i])?;
            strides[i] = c_int(p.stride[i])?;
            dils[i] = c_int(p.dilation[i])?;
        }
        let groups = c_int(p.groups)?;
        let mut plan = Plan {
            x: std::ptr::null_mut(),
            y: std::ptr::null_mut(),
            w: std::ptr::null_mut(),
            conv: std::ptr::null_mut(),
            algo: sys::cudnnConvolutionFwdAlgo_t::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            workspace: 0,
        };
        // Whatever fails below, `destroy` frees what was created.
        let r = (|| -> Result<()> {
            plan.x = dnn::create_tensor_descriptor().map_err(err("cudnnCreateTensorDescriptor"))?;
            plan.y = dnn::create_tensor_descriptor().map_err(err("cudnnCreateTensorDescriptor"))?;
            plan.w = dnn::create_filter_descriptor().map_err(err("cudnnCreateFilterDescriptor"))?;
            plan.conv = dnn::create_convolution_descriptor()
                .map_err(err("cudnnCreateConvolutionDescriptor"))?;
            // SAFETY: live descriptors; each array holds the count given.
            unsafe {
                dnn::set_tensornd_descriptor(plan.x, dt, 5, xd.as_ptr(), xs.as_ptr())
                    .map_err(err("cudnnSetTensorNdDescriptor"))?;
                dnn::set_tensornd_descriptor(plan.y, dt, 5, yd.as_ptr(), ys.as_ptr())
                    .map_err(err("cudnnSetTensorNdDescriptor"))?;
                dnn::set_filternd_descriptor(
                    plan.w,
                    dt,
                    cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
                    5,
                    wd.as_ptr(),
                )
                .map_err(err("cudnnSetFilterNdDescriptor"))?;
                dnn::set_convolutionnd_descriptor(
                    plan.conv,
                    3,
                    pads.as_ptr(),
                    strides.as_ptr(),
                    dils.as_ptr(),
                    cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                    cudnnDataType_t::CUDNN_DATA_FLOAT,
                )
                .map_err(err("cudnnSetConvolutionNdDescriptor"))?;
                dnn::set_convolution_group_count(plan.conv, groups)
                    .map_err(err("cudnnSetConvolutionGroupCount"))?;
                dnn::set_convolution_math_type(plan.conv, math)
                    .map_err(err("cudnnSetConvolutionMathType"))?;
            }
            const N: usize = 8;
            // SAFETY: a plain C struct of enums, floats and ints, for
            // which all zeros is a valid value.
            let mut perf: [sys::cudnnConvolutionFwdAlgoPerf_t; N] = unsafe { std::mem::zeroed() };
            let mut n = 0i32;
            // SAFETY: live handle and descriptors; `perf` holds N results.
            unsafe {
                dnn::get_convolution_forward_algorithm(
                    self.handle,
                    plan.x,
                    plan.w,
                    plan.conv,
                    plan.y,
                    N as i32,
                    &mut n,
                    perf.as_mut_ptr(),
                )
            }
            .map_err(err("cudnnGetConvolutionForwardAlgorithm_v7"))?;
            let best = perf
                .get(..usize::try_from(n).unwrap_or(0).min(N))
                .and_then(|p| {
                    p.iter()
                        .find(|r| r.status == sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
                });
            let Some(best) = best else {
                return Err(Error::Conv3dCudnn {
                    op: "cudnnGetConvolutionForwardAlgorithm_v7",
                    source: dnn::CudnnError(sys::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED),
                });
            };
            plan.algo = best.algo;
            // SAFETY: live handle and descriptors.
            plan.workspace = unsafe {
                dnn::get_convolution_forward_workspace_size(
                    self.handle,
                    plan.x,
                    plan.w,
                    plan.conv,
                    plan.y,
                    plan.algo,
                )
            }
            .map_err(err("cudnnGetConvolutionForwardWorkspaceSize"))?;
            Ok(())
        })();
        match r {
            Ok(()) => Ok(plan),
            Err(e) => {
                destroy(plan);
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
        let ptr = |p: DevicePtr| p.0 as usize as *mut c_void;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: live handle and stream (caller).
        unsafe { dnn::set_stream(self.handle, stream.0 as usize as sys::cudaStream_t) }
            .map_err(err("cudnnSetStream"))?;
        // SAFETY: live handle and descriptors built for this geometry and
        // dtype; the buffers match them (caller); the workspace has the size
        // cuDNN asked for this algorithm; alpha and beta are host floats
        // (cuDNN's scaling parameters are float for float and bf16 data).
        unsafe {
            dnn::convolution_forward(
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
        }
        .map_err(err("cudnnConvolutionForward"))
    }
}

/// Destroys a plan's descriptors (errors have nowhere to go: dropped).
fn destroy(p: Plan) {
    // SAFETY: each non-null descriptor was created by us and is destroyed
    // once, here.
    unsafe {
        if !p.x.is_null() {
            let _ = dnn::destroy_tensor_descriptor(p.x);
        }
        if !p.y.is_null() {
            let _ = dnn::destroy_tensor_descriptor(p.y);
        }
        if !p.w.is_null() {
            let _ = dnn::destroy_filter_descriptor(p.w);
        }
        if !p.conv.is_null() {
            let _ = dnn::destroy_convolution_descriptor(p.conv);
        }
    }
}

impl Drop for Cudnn {
    fn drop(&mut self) {
        for (_, p) in self.plans.drain() {
            destroy(p);
        }
        // SAFETY: created in `new`, destroyed once; the error is dropped.
        let _ = unsafe { dnn::destroy_handle(self.handle) };
    }
}
