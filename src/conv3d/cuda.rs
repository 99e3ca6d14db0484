//! The GPU tiers on CUDA (feature `cuda`): cuDNN (vendor, loaded at run
//! time), and the tiled and naive kernels of `hip-kernels/conv3d.hip`,
//! compiled with NVRTC on first use.
//!
//! Everything is loaded at run time through cudarc's dynamic loading, which
//! panics when a library is missing, so libcuda, libnvrtc and libcudnn are
//! probed first and a missing one makes its tiers *unavailable* (skipped,
//! with the reason in the report), never a panic. The cuDNN binding is
//! additionally run under `catch_unwind`, because cudarc's safe cuDNN layer
//! asserts on some results.
//!
//! [`CudaConv3d`] is the engine the tiers share (one context, one stream,
//! the loaded module). Its [`forward`](CudaConv3d::forward) works on data
//! already on the device, for benches and callers that keep tensors there;
//! the tiers copy in, run, and copy out.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use cudarc::cudnn::{self, Cudnn};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg,
};

use super::chain::{Conv3dTier, Support, TierKind};
use super::params::{Conv3dData, Conv3dGeometry, Conv3dProblem};
use crate::error::{Error, Result};

/// The kernel source for NVRTC: the prelude, then conv3d.hip without its
/// `#include`/`#pragma once` lines (NVRTC gets no include paths).
fn source() -> String {
    let mut s = String::new();
    for text in [
        include_str!("../../hip-kernels/prelude.h"),
        include_str!("../../hip-kernels/conv3d.hip"),
    ] {
        for line in text.lines() {
            let t = line.trim();
            if t == "#pragma once" || t.starts_with("#include \"") {
                continue;
            }
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}

fn cuda_err(op: &'static str) -> impl Fn(DriverError) -> Error {
    move |source| Error::Cuda { op, source }
}

/// The sizes a kernel gets (`rs_conv3d_args` in conv3d.hip).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KernelArgs {
    n: u64,
    c: u64,
    d: u64,
    h: u64,
    w: u64,
    k: u64,
    kd: u64,
    kh: u64,
    kw: u64,
    od: u64,
    oh: u64,
    ow: u64,
    sd: u64,
    sh: u64,
    sw: u64,
    pd: u64,
    ph: u64,
    pw: u64,
    dd: u64,
    dh: u64,
    dw: u64,
    groups: u64,
    has_bias: u64,
}

// SAFETY: a repr(C) struct of 23 u64s with no padding, matching the
// kernel's `rs_conv3d_args` field for field; passed by value.
unsafe impl DeviceRepr for KernelArgs {}

impl KernelArgs {
    fn new(g: &Conv3dGeometry, has_bias: bool) -> Self {
        let u = |v: usize| v as u64;
        let p = &g.params;
        KernelArgs {
            n: u(g.batch),
            c: u(g.in_channels),
            d: u(g.input[0]),
            h: u(g.input[1]),
            w: u(g.input[2]),
            k: u(g.out_channels),
            kd: u(g.kernel[0]),
            kh: u(g.kernel[1]),
            kw: u(g.kernel[2]),
            od: u(g.output[0]),
            oh: u(g.output[1]),
            ow: u(g.output[2]),
            sd: u(p.stride[0]),
            sh: u(p.stride[1]),
            sw: u(p.stride[2]),
            pd: u(p.padding[0]),
            ph: u(p.padding[1]),
            pw: u(p.padding[2]),
            dd: u(p.dilation[0]),
            dh: u(p.dilation[1]),
            dw: u(p.dilation[2]),
            groups: u(p.groups),
            has_bias: u64::from(has_bias),
        }
    }
}

/// Input and weight on the device, in their dtype.
#[derive(Debug)]
pub enum DeviceData {
    /// f32.
    F32(CudaSlice<f32>),
    /// bf16.
    BF16(CudaSlice<half::bf16>),
}

/// A problem whose tensors are on the device.
#[derive(Debug)]
pub struct DeviceProblem {
    geometry: Conv3dGeometry,
    x: DeviceData,
    w: DeviceData,
    /// The weights transposed per group, `[G][C/G * KD * KH * KW][K/G]`
    /// (what the tiled kernel reads, coalesced).
    w_t: DeviceData,
    /// The bias, or one zero when there is none (kernels get a valid pointer).
    bias: CudaSlice<f32>,
    has_bias: bool,
}

impl DeviceProblem {
    /// The validated sizes.
    pub fn geometry(&self) -> &Conv3dGeometry {
        &self.geometry
    }
}

/// Which GPU computation [`CudaConv3d::forward`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GpuKernel {
    /// `conv3d_naive_*`.
    Naive,
    /// `conv3d_tiled_*`.
    Tiled,
}

/// Functions of the loaded module.
#[derive(Debug)]
struct Functions {
    naive_f32: CudaFunction,
    naive_bf16: CudaFunction,
    tiled_f32: CudaFunction,
    tiled_bf16: CudaFunction,
    bias_f32: CudaFunction,
    widen_bias_bf16: CudaFunction,
}

/// One CUDA device with the conv3d kernels loaded.
#[derive(Debug)]
pub struct CudaConv3d {
    stream: Arc<CudaStream>,
    f: Functions,
}

/// Tile sizes of `conv3d_tiled_*` (RS_TBM, RS_TBN) and its block size.
const TILE_M: usize = 128;
const TILE_N: usize = 128;
const THREADS: u32 = 256;
/// RS_MAX_TAPS of conv3d.hip.
const MAX_TAPS: usize = 1024;

fn unavailable_reason(e: &Error) -> String {
    e.to_string()
}

impl CudaConv3d {
    /// Opens device `ordinal` and compiles the kernels with NVRTC for it.
    ///
    /// Errors: [`Error::NoRuntime`] when libcuda or libnvrtc cannot be
    /// loaded; [`Error::Cuda`] for a driver failure (no device, ...);
    /// [`Error::Nvrtc`] when the kernels do not compile.
    pub fn open(ordinal: usize) -> Result<Self> {
        // SAFETY: only tries to dlopen the candidate library names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(Error::NoRuntime {
                backend: "cuda",
                library: "libcuda",
            });
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            return Err(Error::NoRuntime {
                backend: "cuda",
                library: "libnvrtc",
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(cuda_err("cuCtxCreate"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(cuda_err("cuDeviceGetAttribute"))?;
        let arch = format!("compute_{major}{minor}");
        let opts = cudarc::nvrtc::CompileOptions {
            options: vec![
                format!("--gpu-architecture={arch}"),
                "-default-device".into(),
            ],
            name: Some("rocm_safe_conv3d.cu".into()),
            ..Default::default()
        };
        let ptx = cudarc::nvrtc::compile_ptx_with_opts(source(), opts)
            .map_err(|source| Error::Nvrtc { arch, source })?;
        let module = ctx.load_module(ptx).map_err(cuda_err("cuModuleLoadData"))?;
        let load = |name: &str| {
            module
                .load_function(name)
                .map_err(cuda_err("cuModuleGetFunction"))
        };
        let f = Functions {
            naive_f32: load("conv3d_naive_f32")?,
            naive_bf16: load("conv3d_naive_bf16")?,
            tiled_f32: load("conv3d_tiled_f32")?,
            tiled_bf16: load("conv3d_tiled_bf16")?,
            bias_f32: load("conv3d_bias_f32")?,
            widen_bias_bf16: load("conv3d_widen_bias_bf16")?,
        };
        let stream = ctx.default_stream();
        Ok(CudaConv3d { stream, f })
    }

    /// The stream all work is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Waits for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda_err("cuStreamSynchronize"))
    }

    /// Copies a problem's tensors to the device.
    ///
    /// Errors: [`Error::Conv3dTier`] for a tensor of zero elements (the GPU
    /// tiers do not take those); [`Error::Cuda`] when a copy fails.
    pub fn upload(&self, p: &Conv3dProblem<'_>) -> Result<DeviceProblem> {
        if p.input.is_empty() || p.weight.is_empty() || p.geometry.output_len() == 0 {
            return Err(Error::Conv3dTier {
                tier: "cuda",
                reason: "zero-size tensors are not sent to the gpu",
            });
        }
        let up = |d: &Conv3dData<'_>| -> Result<DeviceData> {
            Ok(match d {
                Conv3dData::F32(s) => DeviceData::F32(
                    self.stream
                        .clone_htod(*s)
                        .map_err(cuda_err("cuMemcpyHtoD"))?,
                ),
                Conv3dData::BF16(s) => DeviceData::BF16(
                    self.stream
                        .clone_htod(*s)
                        .map_err(cuda_err("cuMemcpyHtoD"))?,
                ),
            })
        };
        let w_t = match &p.weight {
            Conv3dData::F32(s) => self.upload_f32(&transpose_groups(&p.geometry, s))?,
            Conv3dData::BF16(s) => DeviceData::BF16(
                self.stream
                    .clone_htod(&transpose_groups(&p.geometry, s))
                    .map_err(cuda_err("cuMemcpyHtoD"))?,
            ),
        };
        let bias: Vec<f32> = match p.bias {
            Some(_) => (0..p.geometry.out_channels)
                .map(|k| p.bias_f32(k))
                .collect(),
            None => vec![0.0],
        };
        Ok(DeviceProblem {
            geometry: p.geometry,
            x: up(&p.input)?,
            w: up(&p.weight)?,
            w_t,
            bias: self
                .stream
                .clone_htod(&bias)
                .map_err(cuda_err("cuMemcpyHtoD"))?,
            has_bias: p.bias.is_some(),
        })
    }

    fn upload_f32(&self, v: &[f32]) -> Result<DeviceData> {
        Ok(DeviceData::F32(
            self.stream
                .clone_htod(v)
                .map_err(cuda_err("cuMemcpyHtoD"))?,
        ))
    }

    /// A device buffer for the output of `dp`.
    pub fn alloc_output(&self, dp: &DeviceProblem) -> Result<CudaSlice<f32>> {
        self.stream
            .alloc_zeros::<f32>(dp.geometry.output_len())
            .map_err(cuda_err("cuMemAlloc"))
    }

    /// Why the tiled kernel cannot take `g` (grid limits), if it cannot.
    pub fn tiled_unsupported(g: &Conv3dGeometry) -> Option<&'static str> {
        let points = g.batch * g.output.iter().product::<usize>();
        if points.div_ceil(TILE_N) > i32::MAX as usize {
            return Some("more output points than the grid's x dimension holds");
        }
        if g.out_per_group().div_ceil(TILE_M) > 65_535 || g.params.groups > 65_535 {
            return Some("more channel tiles or groups than the grid's y/z dimensions hold");
        }
        let taps: usize = g.kernel.iter().product();
        if taps > MAX_TAPS {
            return Some("more than 1024 kernel taps (KD * KH * KW)");
        }
        let fits = (0..3).all(|a| {
            (g.kernel[a] - 1)
                .checked_mul(g.params.dilation[a])
                .is_some_and(|v| v <= i32::MAX as usize)
        });
        if !fits {
            return Some("a dilated kernel offset does not fit 32 bits");
        }
        if u32::try_from(g.in_per_group()).is_err() {
            return Some("more than 2^32 input channels per group");
        }
        if g.out_per_group() < 8 {
            return Some("fewer than 8 output channels per group (depthwise-like): the naive kernel fits better");
        }
        None
    }

    /// Queues `kernel` on `dp` into `out` (no synchronisation).
    ///
    /// Errors: [`Error::LengthMismatch`] for a wrong `out` length,
    /// [`Error::Conv3dTier`] for sizes the tiled grid cannot hold,
    /// [`Error::Cuda`] when the launch fails.
    pub fn forward(
        &self,
        kernel: GpuKernel,
        dp: &DeviceProblem,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let g = &dp.geometry;
        if out.len() != g.output_len() {
            return Err(Error::LengthMismatch {
                op: "conv3d cuda output",
                expected: g.output_len(),
                actual: out.len(),
            });
        }
        let args = KernelArgs::new(g, dp.has_bias);
        let cfg = match kernel {
            GpuKernel::Naive => {
                let blocks = g.output_len().div_ceil(THREADS as usize).min(1 << 20);
                LaunchConfig {
                    grid_dim: (blocks as u32, 1, 1),
                    block_dim: (THREADS, 1, 1),
                    shared_mem_bytes: 0,
                }
            }
            GpuKernel::Tiled => {
                if let Some(reason) = Self::tiled_unsupported(g) {
                    return Err(Error::Conv3dTier {
                        tier: "tiled",
                        reason,
                    });
                }
                let points = g.batch * g.output.iter().product::<usize>();
                LaunchConfig {
                    // Each fits: checked by `tiled_unsupported`.
                    grid_dim: (
                        points.div_ceil(TILE_N) as u32,
                        g.out_per_group().div_ceil(TILE_M) as u32,
                        g.params.groups as u32,
                    ),
                    block_dim: (THREADS, 1, 1),
                    shared_mem_bytes: 0,
                }
            }
        };
        let f = match (kernel, &dp.x) {
            (GpuKernel::Naive, DeviceData::F32(_)) => &self.f.naive_f32,
            (GpuKernel::Naive, DeviceData::BF16(_)) => &self.f.naive_bf16,
            (GpuKernel::Tiled, DeviceData::F32(_)) => &self.f.tiled_f32,
            (GpuKernel::Tiled, DeviceData::BF16(_)) => &self.f.tiled_bf16,
        };
        let mut b = self.stream.launch_builder(f);
        let w = match kernel {
            GpuKernel::Naive => &dp.w,
            GpuKernel::Tiled => &dp.w_t,
        };
        match (&dp.x, w) {
            (DeviceData::F32(x), DeviceData::F32(w)) => {
                b.arg(x).arg(w);
            }
            (DeviceData::BF16(x), DeviceData::BF16(w)) => {
                b.arg(x).arg(w);
            }
            _ => {
                return Err(Error::Conv3dTier {
                    tier: "cuda",
                    reason: "input and weight of different dtypes on the device",
                })
            }
        }
        b.arg(&dp.bias).arg(out).arg(&args);
        // SAFETY: the kernel's parameters are (x, w, bias, y, args) of the
        // types pushed above: x and w hold the input and weight of `g` in
        // the kernel's element type, bias holds K floats (or one when
        // has_bias is 0 and it is not read), y holds output_len floats
        // (checked above), and the kernel reads and writes only inside
        // those extents (64-bit indices, bounds-checked). The grid matches
        // the kernel's expectation (256 threads; tiled: the tile grid).
        unsafe { b.launch(cfg) }.map_err(cuda_err("cuLaunchKernel"))?;
        Ok(())
    }

    /// Host in, host out: upload, run `kernel`, download into `out`.
    pub fn run_host(
        &self,
        kernel: GpuKernel,
        p: &Conv3dProblem<'_>,
        out: &mut [f32],
    ) -> Result<()> {
        let dp = self.upload(p)?;
        let mut y = self.alloc_output(&dp)?;
        self.forward(kernel, &dp, &mut y)?;
        self.download(&y, out)
    }

    /// Copies the device output into `out` and waits for it.
    pub fn download(&self, y: &CudaSlice<f32>, out: &mut [f32]) -> Result<()> {
        if out.len() != y.len() {
            return Err(Error::LengthMismatch {
                op: "conv3d cuda download",
                expected: y.len(),
                actual: out.len(),
            });
        }
        self.stream
            .memcpy_dtoh(y, out)
            .map_err(cuda_err("cuMemcpyDtoH"))?;
        self.synchronize()
    }
}

/// `w` `[G * K/G][R]` transposed per group into `[G][R][K/G]`.
fn transpose_groups<T: Copy + Default + Send + Sync>(g: &Conv3dGeometry, w: &[T]) -> Vec<T> {
    use rayon::prelude::*;
    let kg = g.out_per_group();
    let r_len = g.in_per_group() * g.kernel.iter().product::<usize>();
    let mut out = vec![T::default(); w.len()];
    if kg == 0 || r_len == 0 {
        return out;
    }
    // Each output row (group, r) gathers one column of the group's block.
    out.par_chunks_mut(kg).enumerate().for_each(|(row, dst)| {
        let (grp, r) = (row / r_len, row % r_len);
        for (m, d) in dst.iter_mut().enumerate() {
            if let Some(v) = w.get((grp * kg + m) * r_len + r) {
                *d = *v;
            }
        }
    });
    out
}

/// Registers per thread and local (spill) bytes of the kernels, for
/// diagnosis: `[(name, registers, local bytes)]`.
pub fn kernel_resources(engine: &CudaConv3d) -> Vec<(&'static str, i32, i32)> {
    use cudarc::driver::sys::CUfunction_attribute_enum as A;
    let f = &engine.f;
    [
        ("conv3d_naive_f32", &f.naive_f32),
        ("conv3d_tiled_f32", &f.tiled_f32),
        ("conv3d_tiled_bf16", &f.tiled_bf16),
    ]
    .into_iter()
    .map(|(n, func)| {
        (
            n,
            func.num_regs().unwrap_or(-1),
            func.get_attribute(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)
                .unwrap_or(-1),
        )
    })
    .collect()
}

// ----- cuDNN ---------------------------------------------------------------

/// Whether libcudnn can be loaded (it must be on the loader path, e.g. via
/// `LD_LIBRARY_PATH` for the copy inside PyTorch's `nvidia-cudnn-cu*` wheel).
pub fn cudnn_present() -> bool {
    // SAFETY: only tries to dlopen the candidate library names.
    unsafe { cudnn::sys::is_culib_present() }
}

fn cudnn_err(op: &'static str) -> impl Fn(cudnn::CudnnError) -> Error {
    move |source| Error::Conv3dCudnn { op, source }
}

fn c_int(v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::Conv3dTier {
        tier: "cudnn",
        reason: "a size does not fit cudnn's 32-bit dimensions",
    })
}

fn dims(s: [usize; 5]) -> Result<([i32; 5], [i32; 5])> {
    let d = [
        c_int(s[0])?,
        c_int(s[1])?,
        c_int(s[2])?,
        c_int(s[3])?,
        c_int(s[4])?,
    ];
    let mut st = [1i32; 5];
    for i in (0..4).rev() {
        st[i] = st[i + 1].checked_mul(d[i + 1]).ok_or(Error::Conv3dTier {
            tier: "cudnn",
            reason: "a size does not fit cudnn's 32-bit dimensions",
        })?;
    }
    Ok((d, st))
}

/// A cuDNN forward convolution set up for one geometry: handle,
/// descriptors, algorithm and workspace. Not `Send` (cuDNN handles are
/// per thread); build it on the thread that launches.
pub struct CudnnConv {
    handle: Arc<Cudnn>,
    algo: cudnn::sys::cudnnConvolutionFwdAlgo_t,
    workspace: Option<CudaSlice<u8>>,
    plan: Plan,
}

enum Plan {
    F32 {
        conv: cudnn::ConvDescriptor<f32>,
        x: cudnn::TensorDescriptor<f32>,
        w: cudnn::FilterDescriptor<f32>,
        y: cudnn::TensorDescriptor<f32>,
    },
    BF16 {
        conv: cudnn::ConvDescriptor<f32>,
        x: cudnn::TensorDescriptor<half::bf16>,
        w: cudnn::FilterDescriptor<half::bf16>,
        y: cudnn::TensorDescriptor<half::bf16>,
        /// cuDNN writes bf16; the epilogue widens it into the f32 output.
        out: CudaSlice<half::bf16>,
    },
}

impl std::fmt::Debug for CudnnConv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudnnConv")
            .field("algo", &self.algo)
            .finish()
    }
}

fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(Err(Error::Conv3dTier {
        tier: "cudnn",
        reason: "the cudnn binding panicked (an assertion on a cudnn result)",
    }))
}

impl CudnnConv {
    /// Sets up cuDNN for `dp`'s geometry and dtype: true f32 arithmetic for
    /// f32 (`CUDNN_FMA_MATH`, no TF32), tensor cores with f32 accumulation
    /// for bf16.
    ///
    /// Errors: [`Error::Conv3dTier`] when libcudnn is absent or a size does
    /// not fit 32 bits; [`Error::Conv3dCudnn`] when cuDNN refuses (no
    /// algorithm for these parameters, ...).
    pub fn new(engine: &CudaConv3d, dp: &DeviceProblem) -> Result<Self> {
        if !cudnn_present() {
            return Err(Error::Conv3dTier {
                tier: "cudnn",
                reason: "libcudnn could not be loaded",
            });
        }
        guarded(|| Self::build(engine, dp))
    }

    fn build(engine: &CudaConv3d, dp: &DeviceProblem) -> Result<Self> {
        use cudnn::sys::{cudnnConvolutionMode_t, cudnnMathType_t, cudnnTensorFormat_t};
        let g = &dp.geometry;
        let handle = Cudnn::new(engine.stream.clone()).map_err(cudnn_err("cudnnCreate"))?;
        let (xd, xs) = dims(g.input_shape())?;
        let (yd, ys) = dims(g.output_shape())?;
        let (wd, _) = dims(g.weight_shape())?;
        let p = &g.params;
        let pads = [
            c_int(p.padding[0])?,
            c_int(p.padding[1])?,
            c_int(p.padding[2])?,
        ];
        let strides = [
            c_int(p.stride[0])?,
            c_int(p.stride[1])?,
            c_int(p.stride[2])?,
        ];
        let dil = [
            c_int(p.dilation[0])?,
            c_int(p.dilation[1])?,
            c_int(p.dilation[2])?,
        ];
        let mut conv = handle
            .create_convnd::<f32>(
                &pads,
                &strides,
                &dil,
                cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            )
            .map_err(cudnn_err("cudnnSetConvolutionNdDescriptor"))?;
        conv.set_group_count(c_int(p.groups)?)
            .map_err(cudnn_err("cudnnSetConvolutionGroupCount"))?;
        let bf16 = matches!(dp.x, DeviceData::BF16(_));
        conv.set_math_type(if bf16 {
            cudnnMathType_t::CUDNN_TENSOR_OP_MATH
        } else {
            cudnnMathType_t::CUDNN_FMA_MATH
        })
        .map_err(cudnn_err("cudnnSetConvolutionMathType"))?;
        let nchw = cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let (plan, algo, ws) = if bf16 {
            let x = handle
                .create_nd_tensor::<half::bf16>(&xd, &xs)
                .map_err(cudnn_err("cudnnSetTensorNdDescriptor"))?;
            let y = handle
                .create_nd_tensor::<half::bf16>(&yd, &ys)
                .map_err(cudnn_err("cudnnSetTensorNdDescriptor"))?;
            let w = handle
                .create_5d_filter::<half::bf16>(nchw, wd)
                .map_err(cudnn_err("cudnnSetFilterNdDescriptor"))?;
            let op = cudnn::ConvForward {
                conv: &conv,
                x: &x,
                w: &w,
                y: &y,
            };
            let algo = op
                .pick_algorithm()
                .map_err(cudnn_err("cudnnGetConvolutionForwardAlgorithm_v7"))?;
            let ws = op
                .get_workspace_size(algo)
                .map_err(cudnn_err("cudnnGetConvolutionForwardWorkspaceSize"))?;
            let out = engine
                .stream
                .alloc_zeros::<half::bf16>(g.output_len())
                .map_err(cuda_err("cuMemAlloc"))?;
            (Plan::BF16 { conv, x, w, y, out }, algo, ws)
        } else {
            let x = handle
                .create_nd_tensor::<f32>(&xd, &xs)
                .map_err(cudnn_err("cudnnSetTensorNdDescriptor"))?;
            let y = handle
                .create_nd_tensor::<f32>(&yd, &ys)
                .map_err(cudnn_err("cudnnSetTensorNdDescriptor"))?;
            let w = handle
                .create_5d_filter::<f32>(nchw, wd)
                .map_err(cudnn_err("cudnnSetFilterNdDescriptor"))?;
            let op = cudnn::ConvForward {
                conv: &conv,
                x: &x,
                w: &w,
                y: &y,
            };
            let algo = op
                .pick_algorithm()
                .map_err(cudnn_err("cudnnGetConvolutionForwardAlgorithm_v7"))?;
            let ws = op
                .get_workspace_size(algo)
                .map_err(cudnn_err("cudnnGetConvolutionForwardWorkspaceSize"))?;
            (Plan::F32 { conv, x, w, y }, algo, ws)
        };
        let workspace = if ws > 0 {
            Some(
                engine
                    .stream
                    .alloc_zeros::<u8>(ws)
                    .map_err(cuda_err("cuMemAlloc"))?,
            )
        } else {
            None
        };
        Ok(CudnnConv {
            handle,
            algo,
            workspace,
            plan,
        })
    }

    /// Queues the convolution (and its bias / widening epilogue) of `dp`
    /// into `out` (no synchronisation).
    ///
    /// Errors: [`Error::LengthMismatch`], [`Error::Conv3dCudnn`],
    /// [`Error::Cuda`], [`Error::Conv3dTier`] for a dtype other than
    /// the one it was set up for.
    pub fn forward(
        &mut self,
        engine: &CudaConv3d,
        dp: &DeviceProblem,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        guarded(|| self.forward_inner(engine, dp, out))
    }

    fn forward_inner(
        &mut self,
        engine: &CudaConv3d,
        dp: &DeviceProblem,
        out: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let g = &dp.geometry;
        let total = g.output_len();
        if out.len() != total {
            return Err(Error::LengthMismatch {
                op: "conv3d cudnn output",
                expected: total,
                actual: out.len(),
            });
        }
        let _ = &self.handle;
        let spatial = g.output.iter().product::<usize>() as u64;
        let blocks = total.div_ceil(THREADS as usize).min(1 << 16) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (k, n) = (g.out_channels as u64, total as u64);
        match (&mut self.plan, &dp.x, &dp.w) {
            (Plan::F32 { conv, x, w, y }, DeviceData::F32(xs), DeviceData::F32(ws)) => {
                let op = cudnn::ConvForward {
                    conv: &*conv,
                    x: &*x,
                    w: &*w,
                    y: &*y,
                };
                // SAFETY: xs, ws and out hold f32 tensors of exactly the
                // shapes the descriptors were built from (this geometry,
                // contiguous NCDHW); the workspace has the size cuDNN asked
                // for this algorithm.
                unsafe {
                    op.launch(
                        self.algo,
                        self.workspace.as_mut(),
                        (1.0f32, 0.0f32),
                        xs,
                        ws,
                        out,
                    )
                }
                .map_err(cudnn_err("cudnnConvolutionForward"))?;
                if dp.has_bias {
                    let mut b = engine.stream.launch_builder(&engine.f.bias_f32);
                    b.arg(out).arg(&dp.bias).arg(&n).arg(&spatial).arg(&k);
                    // SAFETY: conv3d_bias_f32(y, bias, total, spatial, k)
                    // reads bias[0..k) (K floats uploaded) and updates
                    // y[0..total) (out holds total floats).
                    unsafe { b.launch(cfg) }.map_err(cuda_err("cuLaunchKernel"))?;
                }
            }
            (
                Plan::BF16 {
                    conv,
                    x,
                    w,
                    y,
                    out: ybf,
                },
                DeviceData::BF16(xs),
                DeviceData::BF16(ws),
            ) => {
                let op = cudnn::ConvForward {
                    conv: &*conv,
                    x: &*x,
                    w: &*w,
                    y: &*y,
                };
                // SAFETY: as for f32, with bf16 tensors and the bf16 output
                // buffer allocated for this geometry in `build`.
                unsafe {
                    op.launch(
                        self.algo,
                        self.workspace.as_mut(),
                        (half::bf16::ONE, half::bf16::ZERO),
                        xs,
                        ws,
                        ybf,
                    )
                }
                .map_err(cudnn_err("cudnnConvolutionForward"))?;
                let has_bias = u64::from(dp.has_bias);
                let mut b = engine.stream.launch_builder(&engine.f.widen_bias_bf16);
                b.arg(&*ybf)
                    .arg(out)
                    .arg(&dp.bias)
                    .arg(&n)
                    .arg(&spatial)
                    .arg(&k)
                    .arg(&has_bias);
                // SAFETY: conv3d_widen_bias_bf16(src, y, bias, total,
                // spatial, k, has_bias) reads src[0..total) (ybf holds the
                // output in bf16), writes y[0..total) (out), and reads
                // bias[0..k) only when has_bias (K floats uploaded then).
                unsafe { b.launch(cfg) }.map_err(cuda_err("cuLaunchKernel"))?;
            }
            _ => {
                return Err(Error::Conv3dTier {
                    tier: "cudnn",
                    reason: "the problem's dtype is not the one cudnn was set up for",
                })
            }
        }
        Ok(())
    }
}

// ----- tiers ---------------------------------------------------------------

/// The engine on device `ordinal`, opened on first use and shared by the
/// tiers of one chain; `Err` holds why it could not be opened.
#[derive(Debug, Clone)]
pub struct SharedEngine {
    ordinal: usize,
    cell: Arc<OnceLock<std::result::Result<CudaConv3d, String>>>,
}

impl SharedEngine {
    /// An engine for device `ordinal`, opened lazily.
    pub fn new(ordinal: usize) -> Self {
        SharedEngine {
            ordinal,
            cell: Arc::new(OnceLock::new()),
        }
    }

    /// The opened engine, or why it is not available.
    pub fn get(&self) -> std::result::Result<&CudaConv3d, &str> {
        self.cell
            .get_or_init(|| CudaConv3d::open(self.ordinal).map_err(|e| unavailable_reason(&e)))
            .as_ref()
            .map_err(|s| s.as_str())
    }
}

fn gpu_support(engine: &SharedEngine, p: &Conv3dProblem<'_>) -> Support {
    if let Err(why) = engine.get() {
        return Support::Unavailable(why.to_owned());
    }
    if p.input.is_empty() || p.weight.is_empty() || p.geometry.output_len() == 0 {
        return Support::Unsupported("zero-size tensors stay on the cpu".into());
    }
    Support::Yes
}

fn engine_of<'a>(engine: &'a SharedEngine, tier: &'static str) -> Result<&'a CudaConv3d> {
    engine.get().map_err(|_| Error::Conv3dTier {
        tier,
        reason: "the cuda engine is not available",
    })
}

/// The naive kernel on CUDA as a tier.
#[derive(Debug, Clone)]
pub struct CudaNaiveTier(pub SharedEngine);

impl Conv3dTier for CudaNaiveTier {
    fn kind(&self) -> TierKind {
        TierKind::Naive
    }
    fn name(&self) -> &str {
        "naive"
    }
    fn support(&self, p: &Conv3dProblem<'_>) -> Support {
        gpu_support(&self.0, p)
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        engine_of(&self.0, "naive")?.run_host(GpuKernel::Naive, p, out)
    }
}

/// The tiled implicit-GEMM kernel on CUDA as a tier.
#[derive(Debug, Clone)]
pub struct CudaTiledTier(pub SharedEngine);

impl Conv3dTier for CudaTiledTier {
    fn kind(&self) -> TierKind {
        TierKind::Tiled
    }
    fn name(&self) -> &str {
        "tiled"
    }
    fn support(&self, p: &Conv3dProblem<'_>) -> Support {
        match gpu_support(&self.0, p) {
            Support::Yes => match CudaConv3d::tiled_unsupported(&p.geometry) {
                Some(why) => Support::Unsupported(why.into()),
                None => Support::Yes,
            },
            other => other,
        }
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        engine_of(&self.0, "tiled")?.run_host(GpuKernel::Tiled, p, out)
    }
}

/// cuDNN as the vendor tier (skipped when libcudnn is not found).
#[derive(Debug, Clone)]
pub struct CudnnTier(pub SharedEngine);

impl Conv3dTier for CudnnTier {
    fn kind(&self) -> TierKind {
        TierKind::Vendor
    }
    fn name(&self) -> &str {
        "cudnn"
    }
    fn support(&self, p: &Conv3dProblem<'_>) -> Support {
        if !cudnn_present() {
            return Support::Unavailable(
                "libcudnn not found on the loader path (LD_LIBRARY_PATH)".into(),
            );
        }
        gpu_support(&self.0, p)
    }
    fn run(&self, p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
        let engine = engine_of(&self.0, "cudnn")?;
        let dp = engine.upload(p)?;
        let mut y = engine.alloc_output(&dp)?;
        let mut conv = CudnnConv::new(engine, &dp)?;
        conv.forward(engine, &dp, &mut y)?;
        engine.download(&y, out)
    }
}

/// The tiers of the default chain on this build: cuDNN, tiled, naive on
/// CUDA device 0.
pub(crate) fn tiers() -> Vec<Box<dyn Conv3dTier>> {
    let e = SharedEngine::new(0);
    vec![
        Box::new(CudnnTier(e.clone())),
        Box::new(CudaTiledTier(e.clone())),
        Box::new(CudaNaiveTier(e)),
    ]
}
