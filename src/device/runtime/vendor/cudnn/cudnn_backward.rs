//! cuDNN's data and weight gradients (`cudnnConvolutionBackwardData`,
//! `cudnnConvolutionBackwardFilter`, their `_v7` algorithm queries and
//! workspace sizes; the C signatures are in the parent module's docs).
//!
//! Bound apart from the forward calls ([`BwdFns::bind`]): a cuDNN without
//! one of them keeps the forward tier and refuses only the backward ops
//! ([`super::backward_available`]). A plan per (op, geometry) holds the f32
//! descriptors (`CUDNN_FMA_MATH`: true f32, no TF32), the algorithm
//! (the first the heuristics list as usable) and its workspace size. The
//! operands are always f32 here: `vendor/vendor_backward.rs` widens bf16 first.
//! The bias gradient is not bound (`cudnnConvolutionBackwardBias`): the
//! chain's naive tier reduces `dy` itself.

use std::ffi::{c_int, c_void};

use super::{
    check, destroy, first_usable, ConvDesc, Cudnn, FwdAlgoPerf, Handle, Plan, Status, TensorDesc,
    NOT_SUPPORTED,
};
use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
use crate::device::dynlib;
#[cfg(feature = "cuda")]
use crate::device::info::{DevicePtr, RawStream};
#[cfg(feature = "cuda")]
use crate::device::raw::conv3d::Conv3dBackwardLaunch;
use crate::device::runtime::vendor::libs::bind_fn;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// `cudnnGetConvolutionBackwardDataAlgorithm_v7` (w, dy, conv, dx, ...) and
/// `cudnnGetConvolutionBackwardFilterAlgorithm_v7` (x, dy, conv, dw, ...):
/// three descriptors of the op's order, then the filter or tensor one.
type AlgoFn = unsafe extern "C" fn(
    Handle,
    *mut c_void,
    *mut c_void,
    ConvDesc,
    *mut c_void,
    c_int,
    *mut c_int,
    *mut FwdAlgoPerf,
) -> Status;
/// The workspace sizes, in the same descriptor order as [`AlgoFn`].
type WorkspaceFn = unsafe extern "C" fn(
    Handle,
    *mut c_void,
    *mut c_void,
    ConvDesc,
    *mut c_void,
    c_int,
    *mut usize,
) -> Status;
/// `cudnnConvolutionBackwardData(handle, alpha, wDesc, w, dyDesc, dy, conv,
/// algo, ws, wsSize, beta, dxDesc, dx)` and
/// `cudnnConvolutionBackwardFilter(handle, alpha, xDesc, x, dyDesc, dy,
/// conv, algo, ws, wsSize, beta, dwDesc, dw)`: one shape.
type RunFn = unsafe extern "C" fn(
    Handle,
    *const c_void,
    *mut c_void,
    *const c_void,
    TensorDesc,
    *const c_void,
    ConvDesc,
    c_int,
    *mut c_void,
    usize,
    *const c_void,
    *mut c_void,
    *mut c_void,
) -> Status;

/// The backward functions of one cuDNN.
#[derive(Debug)]
pub(crate) struct BwdFns {
    data_algo: AlgoFn,
    data_workspace: WorkspaceFn,
    data: RunFn,
    filter_algo: AlgoFn,
    filter_workspace: WorkspaceFn,
    filter: RunFn,
}

impl BwdFns {
    /// Binds the six functions, or names the first one missing.
    pub(crate) fn bind(lib: &dynlib::Lib) -> std::result::Result<BwdFns, &'static str> {
        // SAFETY: (every bind) each type is the C signature of the function
        // of that name in cuDNN 9's `cudnn_cnn.h` (parent module docs),
        // descriptors as pointers and enums as int; the library is never
        // closed.
        unsafe {
            Ok(BwdFns {
                data_algo: bind_fn(lib, c"cudnnGetConvolutionBackwardDataAlgorithm_v7")?,
                data_workspace: bind_fn(lib, c"cudnnGetConvolutionBackwardDataWorkspaceSize")?,
                data: bind_fn(lib, c"cudnnConvolutionBackwardData")?,
                filter_algo: bind_fn(lib, c"cudnnGetConvolutionBackwardFilterAlgorithm_v7")?,
                filter_workspace: bind_fn(lib, c"cudnnGetConvolutionBackwardFilterWorkspaceSize")?,
                filter: bind_fn(lib, c"cudnnConvolutionBackwardFilter")?,
            })
        }
    }
}

/// The names of an op's three calls: algorithm query, workspace, run.
pub(crate) fn op_names(op: Conv3dBackwardOp) -> Result<[&'static str; 3]> {
    match op {
        Conv3dBackwardOp::Data => Ok([
            "cudnnGetConvolutionBackwardDataAlgorithm_v7",
            "cudnnGetConvolutionBackwardDataWorkspaceSize",
            "cudnnConvolutionBackwardData",
        ]),
        Conv3dBackwardOp::Weight => Ok([
            "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
            "cudnnGetConvolutionBackwardFilterWorkspaceSize",
            "cudnnConvolutionBackwardFilter",
        ]),
        _ => Err(Error::Conv3dTier {
            tier: "cudnn",
            reason: "the bias gradient is not a cuDNN call",
        }),
    }
}

impl Cudnn {
    fn fns(&self) -> Result<&'static BwdFns> {
        self.lib.backward.as_ref().map_err(|_| Error::Conv3dTier {
            tier: "cudnn",
            reason: "this cuDNN has no backward calls",
        })
    }

    /// The plan of `op` on `g` (built on first use): f32 descriptors, the
    /// first usable algorithm, its workspace.
    pub(super) fn bwd_plan(&mut self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Result<&Plan> {
        let key = (op, *g);
        if !self.bwd_plans.contains_key(&key) {
            let plan = self.build_backward(op, g)?;
            self.bwd_plans.insert(key, plan);
        }
        self.bwd_plans.get(&key).ok_or(Error::Conv3dTier {
            tier: "cudnn",
            reason: "the plan vanished",
        })
    }

    fn build_backward(&self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Result<Plan> {
        let [algo_name, ws_name, _] = op_names(op)?;
        let fns = self.fns()?;
        let mut plan = self.descriptors(g, DType::F32)?;
        // Whatever fails below, `destroy` frees the descriptors.
        let r = (|| -> Result<()> {
            let (algo, ws) = match op {
                Conv3dBackwardOp::Data => (fns.data_algo, fns.data_workspace),
                _ => (fns.filter_algo, fns.filter_workspace),
            };
            // Data: (w, dy, conv, dx); Weight: (x, dy, conv, dw).
            let [a, b, d] = match op {
                Conv3dBackwardOp::Data => [plan.w, plan.y, plan.x],
                _ => [plan.x, plan.y, plan.w],
            };
            const N: usize = 8;
            let mut perf = [FwdAlgoPerf::default(); N];
            let mut n: c_int = 0;
            // SAFETY: live handle and descriptors in the function's order;
            // `perf` holds N results (the backward perf structs have the
            // forward one's layout).
            check(algo_name, unsafe {
                algo(
                    self.handle,
                    a,
                    b,
                    plan.conv,
                    d,
                    N as c_int,
                    &mut n,
                    perf.as_mut_ptr(),
                )
            })?;
            let Some(best) = first_usable(&perf, n) else {
                return check(algo_name, NOT_SUPPORTED);
            };
            plan.algo = best;
            // SAFETY: live handle and descriptors; writes one size_t.
            check(ws_name, unsafe {
                ws(self.handle, a, b, plan.conv, d, best, &mut plan.workspace)
            })
        })();
        match r {
            Ok(()) => Ok(plan),
            Err(e) => {
                destroy(self.lib, plan);
                Err(e)
            }
        }
    }

    /// Queues the f32 gradient `a` into `a.output` on `stream`.
    ///
    /// # Safety
    /// As [`crate::device::runtime::vendor::VendorConv::backward`].
    #[cfg(feature = "cuda")]
    pub(super) unsafe fn run_backward(
        &mut self,
        a: &Conv3dBackwardLaunch,
        stream: RawStream,
        workspace: DevicePtr,
    ) -> Result<()> {
        if a.dtype != DType::F32 || a.bias.is_some() {
            return Err(Error::Conv3dTier {
                tier: "cudnn",
                reason: "the backward call takes f32 operands and no bias",
            });
        }
        let [.., run_name] = op_names(a.op)?;
        let fns = self.fns()?;
        let (handle, lib) = (self.handle, self.lib);
        let plan = self.bwd_plan(a.op, &a.geometry)?;
        let Some(other) = a.other else {
            return Err(Error::Conv3dTier {
                tier: "cudnn",
                reason: "a backward op without its second operand",
            });
        };
        let ptr = |p: DevicePtr| p.0 as usize as *mut c_void;
        // Data: (w, dy) -> dx; Weight: (x, dy) -> dw.
        let (run, first, out) = match a.op {
            Conv3dBackwardOp::Data => (fns.data, plan.w, plan.x),
            _ => (fns.filter, plan.x, plan.w),
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ws_bytes = plan.workspace;
        // SAFETY: live handle and stream (caller).
        check("cudnnSetStream", unsafe {
            (lib.set_stream)(handle, stream.0 as usize as *mut c_void)
        })?;
        // SAFETY: live handle and descriptors built for this op and
        // geometry in f32; the buffers are f32 of those shapes (caller); the
        // workspace has the size cuDNN asked for this algorithm; alpha and
        // beta are host floats (float data).
        check(run_name, unsafe {
            run(
                handle,
                (&alpha as *const f32).cast(),
                first,
                ptr(other),
                plan.y,
                ptr(a.grad_output),
                plan.conv,
                plan.algo,
                if ws_bytes == 0 {
                    std::ptr::null_mut()
                } else {
                    ptr(workspace)
                },
                ws_bytes,
                (&beta as *const f32).cast(),
                out,
                ptr(a.output),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::dynlib::Spec;

    #[test]
    fn missing_backward_symbols_are_named() {
        // A library that loads but has none of them.
        let libc = Spec {
            what: "cuDNN",
            sonames: vec!["libc.so.6"],
            stem: "libc.so",
            ..Spec::default()
        };
        let lib = dynlib::open(&libc).unwrap();
        assert_eq!(
            BwdFns::bind(&lib).unwrap_err(),
            "cudnnGetConvolutionBackwardDataAlgorithm_v7"
        );
    }

    #[test]
    fn op_names_and_status_mapping() {
        let [a, w, r] = op_names(Conv3dBackwardOp::Weight).unwrap();
        assert_eq!(
            (a, w, r),
            (
                "cudnnGetConvolutionBackwardFilterAlgorithm_v7",
                "cudnnGetConvolutionBackwardFilterWorkspaceSize",
                "cudnnConvolutionBackwardFilter"
            )
        );
        assert_eq!(
            op_names(Conv3dBackwardOp::Data).unwrap()[2],
            "cudnnConvolutionBackwardData"
        );
        assert!(matches!(
            op_names(Conv3dBackwardOp::Bias),
            Err(Error::Conv3dTier { tier: "cudnn", .. })
        ));
        let e = check("cudnnConvolutionBackwardData", 3002).unwrap_err();
        assert_eq!(
            e.to_string(),
            "conv3d: cudnn: cudnnConvolutionBackwardData: \
             CUDNN_STATUS_NOT_SUPPORTED_SHAPE (status 3002)"
        );
    }

    #[test]
    fn the_first_usable_algorithm_is_chosen() {
        let mut perf = [FwdAlgoPerf::default(); 4];
        perf[0].status = 3000;
        perf[1].algo = 5;
        perf[2].algo = 6;
        assert_eq!(first_usable(&perf, 3), Some(5));
        // The count cuDNN returned bounds the search, the array too.
        assert_eq!(first_usable(&perf, 1), None);
        assert_eq!(first_usable(&perf, -1), None);
        assert_eq!(first_usable(&perf[..2], 99), Some(5));
        // The backward perf structs: algo, status, float, size_t,
        // determinism, mathType, int[3] (48 bytes, as the forward one).
        #[cfg(target_pointer_width = "64")]
        assert_eq!(std::mem::size_of::<FwdAlgoPerf>(), 48);
    }

    #[test]
    fn backward_plans_refuse_sizes_beyond_32_bits() {
        // The backward plans' descriptors are the forward plans' (`dims`):
        // an input of 2^33 elements, or a stride past i32, is refused typed
        // before any library call; the weight's shape still fits.
        // (Built by hand: `new` also checks the sizes against this machine's
        // memory.)
        let one =
            Conv3dGeometry::new(crate::conv3d::Conv3dParams::default(), &[1; 5], &[1; 5]).unwrap();
        let g = Conv3dGeometry {
            batch: 2,
            input: [2048, 2048, 1024],
            output: [2048, 2048, 1024],
            ..one
        };
        for shape in [g.input_shape(), g.output_shape()] {
            assert!(matches!(
                super::super::dims(shape),
                Err(Error::Conv3dTier { tier: "cudnn", .. })
            ));
        }
        assert!(super::super::dims(g.weight_shape()).is_ok());
    }
}
