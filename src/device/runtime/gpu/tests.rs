//! The generic body over a recording runtime, so that CI executes what HIP
//! and CUDA share: the module cache, kernel lookup (optional kernels
//! included), the launches each operation makes, the weight-layout choice
//! from [`KernelCaps`], the vendor slot, the teardown order and which
//! pinned buffers are registered mappings.

use super::*;
use crate::conv3d::{Conv3dData, Conv3dParams, Conv3dProblem};
use crate::device::info::{ConvertOp, DevicePtr};
use crate::device::runtime::host::HostBackend;
use crate::device::runtime::vendor::VendorBuffers;

/// What the recording runtime saw, in order.
type Log = Arc<Mutex<Vec<String>>>;

fn push(log: &Log, s: impl Into<String>) {
    lock(log).push(s.into());
}

#[derive(Debug)]
struct Recording {
    host: HostBackend,
    caps: KernelCaps,
    log: Log,
    /// Symbols `function` does not find.
    absent: Vec<&'static str>,
    /// `host_register` / `host_unregister` fail.
    refuse: (bool, bool),
}

impl Drop for Recording {
    fn drop(&mut self) {
        push(&self.log, "runtime dropped");
    }
}

impl Wrap for Recording {
    type Inner = HostBackend;
    fn inner(&self) -> &HostBackend {
        &self.host
    }
}

// SAFETY: memory and streams are the host backend's.
unsafe impl Driver for Recording {
    crate::forward_driver!(
        info,
        alloc,
        stream_create,
        stream_destroy,
        stream_synchronize,
        synchronize,
        event_create,
        event_destroy,
        event_record,
        event_synchronize,
        stream_wait_event,
        event_elapsed_ms,
        copy,
        mem_info,
        register_read_only,
        unregister_read_only,
    );
    unsafe fn memset_zero(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()> {
        push(&self.log, format!("memset {bytes}"));
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { self.host.memset_zero(dst, bytes, s) }
    }
    unsafe fn free(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        push(&self.log, format!("free {bytes}"));
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { self.host.free(ptr, bytes) }
    }
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        push(&self.log, format!("runtime alloc_pinned {bytes}"));
        self.host.alloc_pinned(bytes)
    }
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        push(&self.log, format!("runtime free_pinned {bytes}"));
        // SAFETY: the caller's guarantees, forwarded.
        unsafe { self.host.free_pinned(ptr, bytes) }
    }
}

struct Vendor {
    log: Log,
    buffers: VendorBuffers,
}

impl Drop for Vendor {
    fn drop(&mut self) {
        push(&self.log, "vendor dropped");
    }
}

impl VendorConv for Vendor {
    fn workspace(&mut self, _a: &Conv3dLaunch) -> Result<usize> {
        Ok(1000)
    }
    unsafe fn forward(
        &mut self,
        _a: &Conv3dLaunch,
        _s: RawStream,
        _y: DevicePtr,
        _ws: DevicePtr,
    ) -> Result<()> {
        push(&self.log, "vendor forward");
        Ok(())
    }
    fn buffers(&mut self) -> &mut VendorBuffers {
        &mut self.buffers
    }
    fn backward_workspace(
        &mut self,
        _op: crate::conv3d::Conv3dBackwardOp,
        _g: &Conv3dGeometry,
    ) -> Result<usize> {
        Ok(2000)
    }
    unsafe fn backward(
        &mut self,
        a: &Conv3dBackwardLaunch,
        _s: RawStream,
        _ws: DevicePtr,
    ) -> Result<()> {
        assert_eq!((a.dtype, a.bias), (DType::F32, None), "f32, no bias");
        push(&self.log, format!("vendor backward {}", a.op));
        Ok(())
    }
}

// SAFETY: `launch` only records the call (it touches no memory).
unsafe impl Runtime for Recording {
    type Module = KernelModule;
    type Function = &'static str;
    type Vendor = Vendor;
    fn caps(&self) -> KernelCaps {
        self.caps
    }
    fn bind(&self) -> Result<()> {
        Ok(())
    }
    fn load_module(&self, which: KernelModule) -> Result<(KernelModule, KernelSource)> {
        push(&self.log, format!("load {}", which.name()));
        Ok((which, KernelSource::Compiled))
    }
    fn function(&self, _m: &KernelModule, symbol: &'static str) -> Result<&'static str> {
        if self.absent.contains(&symbol) {
            return Err(Error::KernelUnavailable {
                backend: "test",
                arch: "test".into(),
                built: symbol.into(),
            });
        }
        Ok(symbol)
    }
    unsafe fn unload_module(&self, m: KernelModule) -> Result<()> {
        push(&self.log, format!("unload {}", m.name()));
        Ok(())
    }
    unsafe fn launch(&self, f: &'static str, call: &mut KernelCall, _s: RawStream) -> Result<()> {
        assert_eq!(f, call.kernel.symbol());
        assert!(call.block > 0 && call.grid.iter().all(|&g| g > 0));
        push(&self.log, format!("launch {f}"));
        Ok(())
    }
    fn vendor_available(&self) -> Result<()> {
        Ok(())
    }
    fn vendor_backward_available(&self) -> Result<()> {
        Ok(())
    }
    fn vendor_open(&self) -> Result<Vendor> {
        push(&self.log, "vendor opened");
        Ok(Vendor {
            log: Arc::clone(&self.log),
            buffers: VendorBuffers::default(),
        })
    }
    unsafe fn host_register(&self, p: *mut u8, bytes: usize) -> Result<()> {
        push(&self.log, format!("register {bytes}"));
        assert_eq!(p as usize % crate::device::hostmem::HUGE_PAGE, 0);
        if self.refuse.0 {
            return Err(Error::BackendUnsupported {
                backend: "test",
                op: "host_register",
            });
        }
        Ok(())
    }
    unsafe fn host_unregister(&self, _p: *mut u8) -> Result<()> {
        push(&self.log, "unregister");
        if self.refuse.1 {
            return Err(Error::BackendUnsupported {
                backend: "test",
                op: "host_unregister",
            });
        }
        Ok(())
    }
}

fn gpu(modules: usize, tensor_cores: bool, absent: Vec<&'static str>) -> (Gpu<Recording>, Log) {
    gpu_pinning(
        modules,
        tensor_cores,
        absent,
        Pinning::Register,
        (false, false),
    )
}

fn gpu_pinning(
    modules: usize,
    tensor_cores: bool,
    absent: Vec<&'static str>,
    pin: Pinning,
    refuse: (bool, bool),
) -> (Gpu<Recording>, Log) {
    let log = Log::default();
    let caps = KernelCaps {
        code: crate::device::KernelBuild::RunTime,
        modules,
        bf16_tensor_cores: tensor_cores,
        vendor_library: Some("test"),
    };
    let rt = Recording {
        host: HostBackend::new(),
        caps,
        log: Arc::clone(&log),
        absent,
        refuse,
    };
    (Gpu::new(rt, pin), log)
}

fn taken(log: &Log) -> Vec<String> {
    std::mem::take(&mut *lock(log))
}

/// Large pinned buffers are mapped here and registered (rounded up to
/// whole 2 MiB pages), zeroed and writable, and unregistered when
/// freed; small ones come from the runtime's allocator.
#[test]
fn large_pinned_buffers_are_registered_mappings_small_ones_the_runtimes() {
    let (g, log) = gpu(1, false, vec![]);
    let big = 3 << 20;
    let p = g.alloc_pinned(big).unwrap();
    assert_eq!(taken(&log), ["register 4194304"]);
    // SAFETY: `big` bytes of host memory, ours alone until freed.
    let s = unsafe { std::slice::from_raw_parts_mut(p, big) };
    assert!(s.iter().all(|&b| b == 0));
    s.fill(0x5A);
    // SAFETY: allocated above with `big`, freed once, idle.
    unsafe { g.free_pinned(p, big) }.unwrap();
    assert_eq!(taken(&log), ["unregister"]);
    assert!(lock(&g.mapped).is_empty());

    let small = REGISTER_MIN - 256;
    let p = g.alloc_pinned(small).unwrap();
    // SAFETY: as above.
    unsafe { g.free_pinned(p, small) }.unwrap();
    assert_eq!(
        taken(&log),
        [
            format!("runtime alloc_pinned {small}"),
            format!("runtime free_pinned {small}")
        ]
    );
}

/// `ROCM_SAFE_PINNED=hostalloc` never registers; a runtime that refuses
/// one registration is not asked again, and its buffers go back to its
/// allocator.
#[test]
fn hostalloc_or_a_refused_registration_uses_the_runtimes_allocator() {
    let big = 4 << 20;
    let (g, log) = gpu_pinning(1, false, vec![], Pinning::HostAlloc, (false, false));
    let p = g.alloc_pinned(big).unwrap();
    // SAFETY: allocated above with `big`, freed once, idle.
    unsafe { g.free_pinned(p, big) }.unwrap();
    assert_eq!(
        taken(&log),
        [
            format!("runtime alloc_pinned {big}"),
            format!("runtime free_pinned {big}")
        ]
    );

    let (g, log) = gpu_pinning(1, false, vec![], Pinning::Register, (true, false));
    let a = g.alloc_pinned(big).unwrap();
    let b = g.alloc_pinned(big).unwrap();
    // SAFETY: as above, each once.
    unsafe {
        g.free_pinned(a, big).unwrap();
        g.free_pinned(b, big).unwrap();
    }
    assert_eq!(
        taken(&log),
        [
            format!("register {big}"),
            format!("runtime alloc_pinned {big}"),
            format!("runtime alloc_pinned {big}"),
            format!("runtime free_pinned {big}"),
            format!("runtime free_pinned {big}"),
        ]
    );
}

/// A failed unregistration is the caller's error (the mapping stays,
/// never unmapped under the runtime); a buffer leaked past the device's
/// end is unregistered before the runtime goes.
#[test]
fn unregistration_failures_and_leaks() {
    let big = 2 << 20;
    let (g, log) = gpu_pinning(1, false, vec![], Pinning::Register, (false, true));
    let p = g.alloc_pinned(big).unwrap();
    // SAFETY: allocated above with `big`, freed once, idle.
    let e = unsafe { g.free_pinned(p, big) }.unwrap_err();
    assert!(
        matches!(
            e,
            Error::BackendUnsupported {
                op: "host_unregister",
                ..
            }
        ),
        "{e:?}"
    );
    assert!(lock(&g.mapped).is_empty());

    let (g, log2) = gpu(1, false, vec![]);
    let _leaked = g.alloc_pinned(big).unwrap();
    drop(g);
    assert_eq!(
        taken(&log2),
        ["register 2097152", "unregister", "runtime dropped"]
    );
    drop(log);
}

fn geometry(dtype_bf16: bool) -> Conv3dLaunch {
    let (input, weight) = ([1, 16, 4, 8, 8], [16, 16, 3, 3, 3]);
    let x = vec![0f32; input.iter().product()];
    let w = vec![0f32; weight.iter().product()];
    let g = Conv3dProblem::new(
        Conv3dParams::default().with_padding([1; 3]),
        Conv3dData::F32(&x),
        &input,
        Conv3dData::F32(&w),
        &weight,
        None,
    )
    .unwrap()
    .geometry;
    Conv3dLaunch {
        geometry: g,
        dtype: if dtype_bf16 { DType::BF16 } else { DType::F32 },
        input: DevicePtr(256),
        weight: DevicePtr(512),
        bias: Some(DevicePtr(768)),
        output: DevicePtr(1024),
        output_dtype: DType::F32,
        gate: None,
    }
}

fn convert(op: ConvertOp, n: u64) -> KernelOp<'static> {
    KernelOp::Convert {
        op,
        src: DevicePtr(0),
        dst: DevicePtr(0),
        n,
    }
}

fn scan(dtype: DType, clamp: bool) -> KernelOp<'static> {
    let (ptr, n, counts) = (DevicePtr(0), 10, DevicePtr(0));
    if clamp {
        KernelOp::ClampNonFinite {
            dtype,
            ptr,
            n,
            counts,
        }
    } else {
        KernelOp::CountNonFinite {
            dtype,
            ptr,
            n,
            counts,
            gate: None,
        }
    }
}

fn fingerprint() -> KernelOp<'static> {
    KernelOp::FingerprintSum {
        src: DevicePtr(0),
        bytes: 64,
        first_word: 0,
        acc: DevicePtr(0),
    }
}

fn conv(kernel: Conv3dKernel, args: &Conv3dLaunch) -> KernelOp<'_> {
    KernelOp::Conv3d { kernel, args }
}

fn count(log: &Log, s: &str) -> usize {
    lock(log).iter().filter(|l| *l == s).count()
}

#[test]
fn modules_load_once_each_on_first_use_and_unload_in_order() {
    let (g, log) = gpu(KernelModule::ALL.len(), false, vec![]);
    let s = RawStream(0);
    let op = ConvertOp::DEVICE[0];
    // SAFETY: the recording runtime touches no memory.
    unsafe {
        g.run(&convert(op, 10), s).unwrap();
        g.run(&convert(op, 10), s).unwrap();
        g.run(&scan(DType::F32, false), s).unwrap();
        g.run(&scan(DType::BF16, true), s).unwrap();
    }
    assert_eq!(count(&log, "load core"), 1, "{:?}", lock(&log));
    assert_eq!(
        count(&log, "load conv3d"),
        0,
        "conv3d not compiled for conversions"
    );
    assert_eq!(count(&log, "launch convert_bf16_f32"), 2);
    assert_eq!(count(&log, "launch nonfinite_f32"), 1);
    assert_eq!(count(&log, "launch nonfinite_bf16"), 1);
    assert_eq!(g.kernel_source().unwrap(), KernelSource::Compiled);
    let a = geometry(false);
    // SAFETY: as above.
    unsafe { g.run(&conv(Conv3dKernel::Naive, &a), s) }.unwrap();
    // The naive kernels are a module of their own: neither the tiled
    // kernels nor the checks are compiled for them.
    assert_eq!(count(&log, "load conv3d_naive"), 1);
    assert_eq!(count(&log, "load conv3d_tiled_f32"), 0);
    assert_eq!(count(&log, "load conv3d"), 0);
    // SAFETY: as above.
    unsafe { g.run(&conv(Conv3dKernel::Tiled, &a), s) }.unwrap();
    assert_eq!(count(&log, "load conv3d_tiled_f32"), 1);
    assert_eq!(count(&log, "load conv3d_tiled_bf16"), 0);
    // Each load is on record for the process, with its source.
    let loads = crate::device::kernel_loads();
    for m in ["core", "conv3d_naive", "conv3d_tiled_f32"] {
        assert!(
            loads
                .iter()
                .any(|l| l.module == m && l.source == KernelSource::Compiled && l.seconds >= 0.0),
            "{m}: {loads:?}"
        );
    }
    drop(g);
    let l = lock(&log).clone();
    let at = |s: &str| l.iter().position(|x| x == s).unwrap();
    assert!(at("unload core") < at("runtime dropped"), "{l:?}");
    assert!(at("unload conv3d_naive") < at("runtime dropped"), "{l:?}");
    assert!(
        at("unload conv3d_tiled_f32") < at("runtime dropped"),
        "{l:?}"
    );
}

#[test]
fn one_module_holds_every_kernel() {
    let (g, log) = gpu(1, false, vec![]);
    // SAFETY: the recording runtime touches no memory.
    unsafe {
        g.run(&conv(Conv3dKernel::Tiled, &geometry(false)), RawStream(0))
            .unwrap();
        g.run(&fingerprint(), RawStream(0)).unwrap();
    }
    assert_eq!(count(&log, "load core"), 1, "{:?}", lock(&log));
    assert_eq!(count(&log, "launch conv3d_tiled_f32"), 1);
    assert_eq!(count(&log, "launch fingerprint_sum_u8"), 1);
}

#[test]
fn a_missing_kernel_fails_the_load_and_unloads_the_module() {
    let (g, log) = gpu(KernelModule::ALL.len(), false, vec!["convert_f16_f32"]);
    let op = ConvertOp::DEVICE[0];
    // SAFETY: the recording runtime touches no memory.
    let e = unsafe { g.run(&convert(op, 1), RawStream(0)) };
    assert!(matches!(e, Err(Error::KernelUnavailable { .. })), "{e:?}");
    assert_eq!(count(&log, "unload core"), 1, "{:?}", lock(&log));
    // Not cached: the next call tries again.
    // SAFETY: as above.
    let _ = unsafe { g.run(&convert(op, 1), RawStream(0)) };
    assert_eq!(count(&log, "load core"), 2);
}

#[test]
fn tensor_cores_are_declared_then_confirmed_by_the_module() {
    let bf16 = geometry(true);
    let layout = |g: &Gpu<Recording>, dtype| {
        g.conv3d_weight_layout(Conv3dKernel::Tiled, dtype, &bf16.geometry)
    };
    let (with, _) = gpu(KernelModule::ALL.len(), true, vec![]);
    assert!(matches!(
        layout(&with, DType::BF16),
        Conv3dWeightLayout::TiledPacked { .. }
    ));
    assert_eq!(
        layout(&with, DType::F32),
        Conv3dWeightLayout::TiledTransposed
    );
    // SAFETY: the recording runtime touches no memory.
    unsafe { with.run(&conv(Conv3dKernel::Tiled, &bf16), RawStream(0)) }.unwrap();
    let (without, _) = gpu(KernelModule::ALL.len(), false, vec![]);
    assert_eq!(
        layout(&without, DType::BF16),
        Conv3dWeightLayout::TiledTransposed
    );
    // Declared, but the module was built without the kernel.
    let (absent, log) = gpu(KernelModule::ALL.len(), true, vec!["conv3d_tiled_bf16_mma"]);
    assert_eq!(
        layout(&absent, DType::BF16),
        Conv3dWeightLayout::TiledTransposed
    );
    // SAFETY: as above.
    unsafe { absent.run(&conv(Conv3dKernel::Tiled, &bf16), RawStream(0)) }.unwrap();
    assert_eq!(
        count(&log, "launch conv3d_tiled_bf16"),
        1,
        "{:?}",
        lock(&log)
    );
    assert_eq!(
        gpu(KernelModule::ALL.len(), false, vec![])
            .0
            .conv3d_weight_layout(Conv3dKernel::Naive, DType::BF16, &bf16.geometry),
        Conv3dWeightLayout::Standard
    );
}

#[test]
fn the_vendor_slot_opens_once_keeps_buffers_and_tears_down_first() {
    let (g, log) = gpu(KernelModule::ALL.len(), false, vec![]);
    for dtype_bf16 in [false, true, false] {
        // SAFETY: the recording runtime's vendor and launches touch no
        // memory; its buffers are host allocations.
        unsafe {
            g.run(
                &KernelOp::Conv3dVendor {
                    args: &geometry(dtype_bf16),
                },
                RawStream(0),
            )
        }
        .unwrap();
    }
    let l = lock(&log).clone();
    assert_eq!(
        l.iter().filter(|x| *x == "vendor opened").count(),
        1,
        "{l:?}"
    );
    assert_eq!(l.iter().filter(|x| *x == "vendor forward").count(), 3);
    // f32 with bias: the bias epilogue; bf16: the widening epilogue.
    assert_eq!(
        l.iter().filter(|x| *x == "launch conv3d_bias_f32").count(),
        2
    );
    assert_eq!(
        l.iter()
            .filter(|x| *x == "launch conv3d_widen_bias_bf16")
            .count(),
        1
    );
    // The 1000-byte workspace was kept, not freed between calls.
    assert_eq!(l.iter().filter(|x| *x == "free 1000").count(), 0, "{l:?}");
    let before = l.len();
    drop(g);
    let l = lock(&log).clone();
    let tail = &l[before..];
    let at = |s: &str| {
        tail.iter()
            .position(|x| x == s)
            .unwrap_or_else(|| panic!("{s} not in {tail:?}"))
    };
    assert!(at("free 1000") < at("vendor dropped"), "{tail:?}");
    assert!(at("vendor dropped") < at("unload conv3d"), "{tail:?}");
    assert!(at("unload conv3d") < at("runtime dropped"), "{tail:?}");
    // The epilogues live in the conv3d module: the core one never loaded.
    assert!(!tail.iter().any(|x| x == "unload core"), "{tail:?}");
}

#[test]
fn vendor_backward_widens_bf16_adds_the_bias_and_keeps_its_buffers() {
    use crate::conv3d::Conv3dBackwardOp;
    let (g, log) = gpu(KernelModule::ALL.len(), false, vec![]);
    let geometry = geometry(false).geometry;
    let len = |op: Conv3dBackwardOp| op.output_len(&geometry);
    // The recording runtime touches no memory: addresses only.
    let (dy, w, x, out, b) = (
        DevicePtr(256),
        DevicePtr(512),
        DevicePtr(768),
        DevicePtr(1024),
        DevicePtr(1280),
    );
    let launch = |op, dtype, other, bias| Conv3dBackwardLaunch {
        op,
        geometry,
        dtype,
        grad_output: dy,
        other: Some(other),
        bias,
        output: out,
    };
    let calls = [
        launch(Conv3dBackwardOp::Data, DType::BF16, w, Some(b)),
        launch(Conv3dBackwardOp::Weight, DType::F32, x, None),
        launch(Conv3dBackwardOp::Data, DType::BF16, w, None),
    ];
    for a in &calls {
        // SAFETY: the recording runtime's vendor and launches touch no
        // memory; its buffers are host allocations.
        unsafe { g.run(&KernelOp::Conv3dBackwardVendor { args: a }, RawStream(0)) }.unwrap();
    }
    let l = lock(&log).clone();
    let count = |s: &str| l.iter().filter(|x| *x == s).count();
    assert_eq!(count("vendor opened"), 1, "{l:?}");
    assert_eq!(count("vendor backward data"), 2, "{l:?}");
    assert_eq!(count("vendor backward weight"), 1, "{l:?}");
    // bf16: both operands widened, each call; the bias once.
    assert_eq!(count("launch convert_bf16_f32"), 4, "{l:?}");
    assert_eq!(count("launch conv3d_bias_f32"), 1, "{l:?}");
    // Kept between calls: nothing freed yet.
    assert!(!l.iter().any(|x| x.starts_with("free ")), "{l:?}");
    // The bias gradient is no vendor call.
    let bias = Conv3dBackwardLaunch {
        op: Conv3dBackwardOp::Bias,
        other: None,
        ..calls[1]
    };
    // SAFETY: as above.
    let e = unsafe {
        g.run(
            &KernelOp::Conv3dBackwardVendor { args: &bias },
            RawStream(0),
        )
    }
    .unwrap_err();
    assert!(matches!(e, Error::Conv3dTier { tier: "vendor", .. }), "{e}");
    let before = lock(&log).len();
    drop(g);
    let l = lock(&log).clone();
    let tail = &l[before..];
    for bytes in [
        2000,
        geometry.output_len() * 4,
        len(Conv3dBackwardOp::Weight) * 4,
    ] {
        assert!(tail.contains(&format!("free {bytes}")), "{bytes}: {tail:?}");
    }
}

/// The tiled weight gradient: the result zeroed on the stream, then one
/// launch of `conv3d_bwd_weight_tiled_*` on the split-K grid (which adds
/// into it); another op is refused before anything runs.
#[test]
fn the_tiled_weight_gradient_zeroes_then_launches() {
    use crate::conv3d::Conv3dBackwardOp;
    use crate::device::raw::conv3d::tiled_wgrad_split;
    let (g, log) = gpu(KernelModule::ALL.len(), false, vec![]);
    let geometry = geometry(false).geometry;
    let n = Conv3dBackwardOp::Weight.output_len(&geometry);
    let out = g.alloc(n * 4).unwrap();
    let mut a = Conv3dBackwardLaunch {
        op: Conv3dBackwardOp::Weight,
        geometry,
        dtype: DType::BF16,
        grad_output: DevicePtr(256),
        other: Some(DevicePtr(512)),
        bias: None,
        output: out,
    };
    taken(&log);
    // SAFETY: the recording runtime's launches touch no memory; the
    // memset writes the output, a host allocation of its length.
    unsafe {
        g.run(
            &KernelOp::Conv3dBackwardWeightTiled { args: &a },
            RawStream(0),
        )
    }
    .unwrap();
    assert_eq!(
        taken(&log),
        [
            format!("memset {}", n * 4),
            "load conv3d".to_owned(),
            "launch conv3d_bwd_weight_tiled_bf16".to_owned()
        ]
    );
    assert!(tiled_wgrad_split(&geometry, g.mps()).is_ok());
    a.op = Conv3dBackwardOp::Data;
    // SAFETY: as above; refused before any memory is touched.
    let e = unsafe {
        g.run(
            &KernelOp::Conv3dBackwardWeightTiled { args: &a },
            RawStream(0),
        )
    }
    .unwrap_err();
    assert!(matches!(e, Error::Conv3dTier { tier: "tiled", .. }), "{e}");
    assert!(taken(&log).is_empty());
    // SAFETY: allocated above, no longer used.
    unsafe { g.free(out, n * 4) }.unwrap();
}
