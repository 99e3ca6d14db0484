//! MIOpen's data and weight gradients (`miopenConvolutionBackwardData`,
//! `miopenConvolutionBackwardWeights`, their workspace sizes and Find
//! calls; the C signatures are in the parent module's docs).
//!
//! Bound apart from the forward calls ([`BwdFns::bind`]): a MIOpen without
//! one of them keeps the forward tier and refuses only the backward ops
//! ([`super::backward_available`]). A plan per (op, geometry) holds the f32
//! descriptors and the workspace size; the algorithm is chosen by a Find
//! (not exhaustive) on the first call of the plan, with the call's own
//! tensors and workspace, as the forward call does. The operands are
//! always f32 here: `vendor/vendor_backward.rs` widens bf16 first. The bias
//! gradient is no MIOpen call: the chain's naive tier reduces `dy`.

use std::ffi::{c_int, c_void};

#[cfg(feature = "hip")]
use super::NO_ALGORITHM;
use super::{check, ConvAlgoPerf, ConvDesc, Handle, Miopen, Plan, Status, TensorDesc};
use crate::conv3d::{Conv3dBackwardOp, Conv3dGeometry};
use crate::device::dynlib;
#[cfg(feature = "hip")]
use crate::device::info::DevicePtr;
#[cfg(feature = "hip")]
use crate::device::raw::conv3d::Conv3dBackwardLaunch;
use crate::device::runtime::vendor::libs::bind_fn;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// `miopenConvolutionBackward{Data,Weights}GetWorkSpaceSize(handle, dyDesc,
/// wDesc | xDesc, convDesc, dxDesc | dwDesc, size_t*)`.
type WorkspaceFn = unsafe extern "C" fn(
    Handle,
    TensorDesc,
    TensorDesc,
    ConvDesc,
    TensorDesc,
    *mut usize,
) -> Status;
/// `miopenFindConvolutionBackward{Data,Weights}Algorithm(handle, dyDesc, dy,
/// wDesc | xDesc, w | x, convDesc, dxDesc | dwDesc, dx | dw, count,
/// returned, perf, workSpace, workSpaceSize, exhaustive)`.
type FindFn = unsafe extern "C" fn(
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
) -> Status;
/// `miopenConvolutionBackward{Data,Weights}(handle, alpha, dyDesc, dy,
/// wDesc | xDesc, w | x, convDesc, algo, beta, dxDesc | dwDesc, dx | dw,
/// workSpace, workSpaceSize)`.
type RunFn = unsafe extern "C" fn(
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
) -> Status;

/// The backward functions of one MIOpen.
#[derive(Debug)]
pub(crate) struct BwdFns {
    data_workspace: WorkspaceFn,
    data_find: FindFn,
    data: RunFn,
    weights_workspace: WorkspaceFn,
    weights_find: FindFn,
    weights: RunFn,
}

impl BwdFns {
    /// Binds the six functions, or names the first one missing.
    pub(crate) fn bind(lib: &dynlib::Lib) -> std::result::Result<BwdFns, &'static str> {
        // SAFETY: (every bind) each type is the C signature of the function
        // of that name in miopen.h (parent module docs), enums as int; the
        // library is never closed.
        unsafe {
            Ok(BwdFns {
                data_workspace: bind_fn(lib, c"miopenConvolutionBackwardDataGetWorkSpaceSize")?,
                data_find: bind_fn(lib, c"miopenFindConvolutionBackwardDataAlgorithm")?,
                data: bind_fn(lib, c"miopenConvolutionBackwardData")?,
                weights_workspace: bind_fn(
                    lib,
                    c"miopenConvolutionBackwardWeightsGetWorkSpaceSize",
                )?,
                weights_find: bind_fn(lib, c"miopenFindConvolutionBackwardWeightsAlgorithm")?,
                weights: bind_fn(lib, c"miopenConvolutionBackwardWeights")?,
            })
        }
    }
}

/// The names of an op's three calls: workspace, Find, run.
pub(crate) fn op_names(op: Conv3dBackwardOp) -> Result<[&'static str; 3]> {
    match op {
        Conv3dBackwardOp::Data => Ok([
            "miopenConvolutionBackwardDataGetWorkSpaceSize",
            "miopenFindConvolutionBackwardDataAlgorithm",
            "miopenConvolutionBackwardData",
        ]),
        Conv3dBackwardOp::Weight => Ok([
            "miopenConvolutionBackwardWeightsGetWorkSpaceSize",
            "miopenFindConvolutionBackwardWeightsAlgorithm",
            "miopenConvolutionBackwardWeights",
        ]),
        _ => Err(Error::Conv3dTier {
            tier: "miopen",
            reason: "the bias gradient is not a MIOpen call",
        }),
    }
}

/// The algorithm of the first of the `n` results returned (at most
/// `perf.len()`) whose workspace fits `ws_bytes` (MIOpen lists the fastest
/// first; the union's member read is the op's, all at offset 0).
pub(crate) fn first_fitting(perf: &[ConvAlgoPerf], n: c_int, ws_bytes: usize) -> Option<c_int> {
    perf.get(..usize::try_from(n).unwrap_or(0).min(perf.len()))
        .and_then(|p| p.iter().find(|p| p.memory <= ws_bytes))
        .map(|p| p.fwd_algo)
}

impl Miopen {
    fn fns(&self) -> Result<&'static BwdFns> {
        self.lib.backward.as_ref().map_err(|_| Error::Conv3dTier {
            tier: "miopen",
            reason: "this MIOpen has no backward calls",
        })
    }

    /// The plan of `op` on `g` (built on first use): f32 descriptors and
    /// the workspace size; the algorithm is found on the first run.
    pub(super) fn bwd_plan(&mut self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Result<&Plan> {
        let key = (op, *g);
        if !self.bwd_plans.contains_key(&key) {
            let plan = self.build_backward(op, g)?;
            self.bwd_plans.insert(key, plan);
        }
        self.bwd_plans.get(&key).ok_or(Error::Conv3dTier {
            tier: "miopen",
            reason: "the plan vanished",
        })
    }

    fn build_backward(&self, op: Conv3dBackwardOp, g: &Conv3dGeometry) -> Result<Plan> {
        let [ws_name, ..] = op_names(op)?;
        let fns = self.fns()?;
        let mut plan = self.descriptors(g, DType::F32)?;
        // Data: (dy, w, conv, dx); Weights: (dy, x, conv, dw).
        let (ws, b, d) = match op {
            Conv3dBackwardOp::Data => (fns.data_workspace, plan.w, plan.x),
            _ => (fns.weights_workspace, plan.x, plan.w),
        };
        // SAFETY: live handle and descriptors in the function's order;
        // writes one size_t.
        let r = check(ws_name, unsafe {
            ws(self.handle, plan.y, b, plan.conv, d, &mut plan.workspace)
        });
        match r {
            Ok(()) => Ok(plan),
            Err(e) => {
                self.destroy(plan);
                Err(e)
            }
        }
    }

    /// Queues the f32 gradient `a` into `a.output` on `stream`, after
    /// choosing the algorithm with a Find on the first call of its plan.
    ///
    /// # Safety
    /// As [`crate::device::runtime::vendor::VendorConv::backward`].
    #[cfg(feature = "hip")]
    pub(super) unsafe fn run_backward(
        &mut self,
        a: &Conv3dBackwardLaunch,
        stream: *mut c_void,
        workspace: DevicePtr,
    ) -> Result<()> {
        if a.dtype != DType::F32 || a.bias.is_some() {
            return Err(Error::Conv3dTier {
                tier: "miopen",
                reason: "the backward call takes f32 operands and no bias",
            });
        }
        let [_, find_name, run_name] = op_names(a.op)?;
        let fns = self.fns()?;
        let Some(other) = a.other else {
            return Err(Error::Conv3dTier {
                tier: "miopen",
                reason: "a backward op without its second operand",
            });
        };
        let (lib, handle) = (self.lib, self.handle);
        self.bwd_plan(a.op, &a.geometry)?;
        let Some(plan) = self.bwd_plans.get_mut(&(a.op, a.geometry)) else {
            return Err(Error::Conv3dTier {
                tier: "miopen",
                reason: "the plan vanished",
            });
        };
        let ptr = |p: DevicePtr| p.0 as usize as *mut c_void;
        let ws_bytes = plan.workspace;
        let (find, run, b, d) = match a.op {
            Conv3dBackwardOp::Data => (fns.data_find, fns.data, plan.w, plan.x),
            _ => (fns.weights_find, fns.weights, plan.x, plan.w),
        };
        // SAFETY: live handle; a live stream (caller).
        check("miopenSetStream", unsafe {
            (lib.set_stream)(handle, stream)
        })?;
        let algo = match plan.algo {
            Some(a) => a,
            None => {
                let mut perf = [ConvAlgoPerf::default(); 4];
                let mut n: c_int = 0;
                // SAFETY: live handle and descriptors matching the f32
                // buffers (caller); the result buffer is written (the call
                // below overwrites it); `perf` holds 4 results; the
                // workspace is as large as MIOpen asked for.
                check(find_name, unsafe {
                    find(
                        handle,
                        plan.y,
                        ptr(a.grad_output),
                        b,
                        ptr(other),
                        plan.conv,
                        d,
                        ptr(a.output),
                        4,
                        &mut n,
                        perf.as_mut_ptr(),
                        ptr(workspace),
                        ws_bytes,
                        false,
                    )
                })?;
                let Some(best) = first_fitting(&perf, n, ws_bytes) else {
                    return check(find_name, NO_ALGORITHM);
                };
                plan.algo = Some(best);
                best
            }
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: as for the Find; alpha and beta are host floats (float
        // data).
        check(run_name, unsafe {
            run(
                handle,
                (&alpha as *const f32).cast(),
                plan.y,
                ptr(a.grad_output),
                b,
                ptr(other),
                plan.conv,
                algo,
                (&beta as *const f32).cast(),
                d,
                ptr(a.output),
                ptr(workspace),
                ws_bytes,
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
        let libc = Spec {
            what: "MIOpen",
            sonames: vec!["libc.so.6"],
            stem: "libc.so",
            ..Spec::default()
        };
        let lib = dynlib::open(&libc).unwrap();
        assert_eq!(
            BwdFns::bind(&lib).unwrap_err(),
            "miopenConvolutionBackwardDataGetWorkSpaceSize"
        );
    }

    #[test]
    fn op_names_find_and_status_mapping() {
        assert_eq!(
            op_names(Conv3dBackwardOp::Weight).unwrap(),
            [
                "miopenConvolutionBackwardWeightsGetWorkSpaceSize",
                "miopenFindConvolutionBackwardWeightsAlgorithm",
                "miopenConvolutionBackwardWeights"
            ]
        );
        assert_eq!(
            op_names(Conv3dBackwardOp::Data).unwrap()[2],
            "miopenConvolutionBackwardData"
        );
        assert!(op_names(Conv3dBackwardOp::Bias).is_err());
        let mut perf = [ConvAlgoPerf::default(); 4];
        perf[0] = ConvAlgoPerf {
            fwd_algo: 3,
            time: 1.0,
            memory: 1 << 40,
        };
        perf[1].fwd_algo = 5;
        assert_eq!(first_fitting(&perf, 2, 1 << 20), Some(5));
        assert_eq!(first_fitting(&perf, 2, 1 << 41), Some(3));
        assert_eq!(first_fitting(&perf, 0, 1 << 41), None);
        assert_eq!(first_fitting(&perf, -3, 1 << 41), None);
        let e = check("miopenConvolutionBackwardWeights", 8).unwrap_err();
        assert_eq!(
            e.to_string(),
            "conv3d: miopen: miopenConvolutionBackwardWeights: \
             miopenStatusUnsupportedOp (status 8)"
        );
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
                Err(Error::Conv3dTier { tier: "miopen", .. })
            ));
        }
        assert!(super::super::dims(g.weight_shape()).is_ok());
    }
}
