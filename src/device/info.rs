//! What a device is and the raw handles backends pass around: [`BackendKind`],
//! [`DeviceInfo`], [`KernelCaps`], [`DevicePtr`], [`RawStream`], [`RawEvent`],
//! [`ConvertOp`].

use super::VisibleDevices;
use crate::convert::table;
use crate::dtype::DType;

/// Which implementation runs a [`Device`](crate::device::Device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub enum BackendKind {
    /// The CPU: device memory is host memory, kernels are `crate::convert`.
    Host,
    /// AMD GPUs through the HIP runtime (feature `hip`).
    Hip,
    /// NVIDIA GPUs through the CUDA driver and NVRTC (feature `cuda`).
    Cuda,
}

impl BackendKind {
    /// The backend's lowercase name (`"host"`, `"hip"`, `"cuda"`).
    pub const fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Hip => "hip",
            BackendKind::Cuda => "cuda",
        }
    }

    /// Whether this build contains the backend (its cargo feature is on).
    pub const fn is_built(self) -> bool {
        match self {
            BackendKind::Host => true,
            BackendKind::Hip => cfg!(feature = "hip"),
            BackendKind::Cuda => cfg!(feature = "cuda"),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a backend reports about its device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct DeviceInfo {
    /// The backend.
    pub kind: BackendKind,
    /// The ordinal the device was opened with (after the runtime applied
    /// `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`).
    pub ordinal: usize,
    /// The device's name as the runtime gives it.
    pub name: String,
    /// The architecture: `gfx90a`, `gfx1151` (HIP), `sm_90` (CUDA), `host`.
    pub arch: String,
    /// Total device memory in bytes (0 where unknown).
    pub total_memory: u64,
    /// Compute units / streaming multiprocessors (sizes kernel grids).
    pub multiprocessors: u32,
    /// The visibility variable in effect and what this ordinal maps to.
    pub visible: VisibleDevices,
}

/// A device address as the backend hands it out (the host backend: a host
/// address). Only meaningful to the backend that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` further on.
    pub const fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes))
    }
}

/// A backend's stream handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawStream(pub u64);

/// A backend's event handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RawEvent(pub u64);

/// The dtypes of an elementwise conversion kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
pub struct ConvertOp {
    /// Source dtype.
    pub from: DType,
    /// Destination dtype.
    pub to: DType,
}

/// How many rows of the conversion table have a device kernel.
const DEVICE_ROWS: usize = {
    let (mut n, mut i) = (0, 0);
    while i < table::CONVERSIONS.len() {
        if table::CONVERSIONS[i].kernel.is_some() {
            n += 1;
        }
        i += 1;
    }
    n
};

impl ConvertOp {
    /// The conversions the device kernels implement: the rows of the
    /// conversion table ([`crate::convert::table`]) with a device kernel,
    /// in table order (f32 -> bf16/f16, bf16/f16 -> f32, f8 e4m3/e5m2 ->
    /// f32).
    pub const DEVICE: [ConvertOp; DEVICE_ROWS] = {
        let mut out = [ConvertOp {
            from: DType::F32,
            to: DType::F32,
        }; DEVICE_ROWS];
        let (mut n, mut i) = (0, 0);
        while i < table::CONVERSIONS.len() {
            let r = &table::CONVERSIONS[i];
            if r.kernel.is_some() {
                out[n] = ConvertOp {
                    from: r.from,
                    to: r.to,
                };
                n += 1;
            }
            i += 1;
        }
        out
    };

    /// Whether a device kernel implements this conversion.
    pub const fn on_device(self) -> bool {
        self.symbol().is_some()
    }

    /// The device kernel's symbol, `convert_{src}_{dst}` (its table row's).
    pub const fn symbol(self) -> Option<&'static str> {
        match table::find(self.from, self.to) {
            Some(r) => r.kernel,
            None => None,
        }
    }

    /// The fused convert + fingerprint kernel's symbol, where the row has
    /// one (`convert_fingerprint_{src}_f32`; bf16/f16 -> f32).
    pub const fn fused_symbol(self) -> Option<&'static str> {
        match table::find(self.from, self.to) {
            Some(r) => r.fused,
            None => None,
        }
    }

    /// The table row of this pair, `None` for a pair the crate does not
    /// convert.
    pub const fn row(self) -> Option<&'static table::Conversion> {
        table::find(self.from, self.to)
    }

    /// Whether the device has an exact check of this conversion's output
    /// (`widen_check_{src}_f32`, [`Stream::count_widen_mismatches`](super::Stream::count_widen_mismatches)):
    /// the lossless rows to f32 with a device kernel (bf16, f16, f8 e4m3
    /// and e5m2 sources).
    pub const fn widen_check_available(self) -> bool {
        match table::find(self.from, self.to) {
            Some(r) => {
                r.kernel.is_some()
                    && r.lossless
                    && matches!(self.to, DType::F32)
                    && matches!(
                        self.from,
                        DType::BF16 | DType::F16 | DType::F8_E4M3 | DType::F8_E5M2
                    )
            }
            None => false,
        }
    }
}

impl std::fmt::Display for ConvertOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}->{}",
            self.from.name().to_lowercase(),
            self.to.name().to_lowercase()
        )
    }
}

/// How a backend's kernels are built: at build time, at run time, or not
/// at all (a declaration in [`KernelCaps`]; what a device's kernels actually
/// came from is [`KernelSource`]). Called `KernelCode` before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[non_exhaustive]
pub enum KernelBuild {
    /// No device code: the kernels are the CPU implementations (host).
    Cpu,
    /// Code objects compiled at build time and embedded in the binary, one
    /// per GPU architecture (HIP: `hipcc --genco` / clang in build.rs).
    Embedded,
    /// Compiled at run time for the device found (CUDA: NVRTC, or PTX from
    /// nvcc that the driver finishes), kept in the kernel cache on disk
    /// (`crate::device::kernel_cache`).
    RunTime,
}

/// What a backend's kernels can do: the declaration the weight-layout
/// choice and the conv3d tiers query, so that no caller tests backend names
/// or build features.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
pub struct KernelCaps {
    /// How the kernels are obtained.
    pub code: KernelBuild,
    /// Separately loaded kernel modules (each loaded on first use). 0 on
    /// the host; 1 on HIP (one code object); 2 on CUDA (conversions, then
    /// conv3d, so a process that only converts never compiles conv3d).
    pub modules: usize,
    /// The tiled conv3d kernel has a bf16 tensor-core variant on this
    /// device (CUDA sm_80 and newer), which reads its weight packed
    /// ([`crate::device::raw::Conv3dWeightLayout::TiledPacked`]).
    pub bf16_tensor_cores: bool,
    /// The vendor convolution library this backend calls (`"miopen"`,
    /// `"cudnn"`: also the conv3d chain's name for its vendor tier), whether
    /// or not it is installed; `None` when it has none.
    pub vendor_library: Option<&'static str>,
}

impl KernelCaps {
    /// The host backend's: CPU code, no modules, no vendor library.
    pub const HOST: KernelCaps = KernelCaps {
        code: KernelBuild::Cpu,
        modules: 0,
        bf16_tensor_cores: false,
        vendor_library: None,
    };
}

/// One kernel module's load in this process: [`kernel_loads`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct KernelLoad {
    /// The device's backend.
    pub backend: &'static str,
    /// The device's arch (`sm_90`, `gfx1151`).
    pub arch: String,
    /// The module (`"core"`, `"conv3d_tiled_bf16_mma"`; `"all"` where one
    /// code object holds every kernel, as on HIP).
    pub module: &'static str,
    /// Where its code came from: [`KernelSource::Compiled`] is the slow
    /// case (a first use on this machine, or an emptied kernel cache).
    pub source: KernelSource,
    /// Wall time of the load, compile included.
    pub seconds: f64,
}

fn loads() -> &'static std::sync::Mutex<Vec<KernelLoad>> {
    static LOADS: std::sync::OnceLock<std::sync::Mutex<Vec<KernelLoad>>> =
        std::sync::OnceLock::new();
    LOADS.get_or_init(|| std::sync::Mutex::new(Vec::new()))
}

/// Every kernel module this process has loaded, in order: what a first
/// call's time went to (a module is loaded on the first launch of one of
/// its kernels, per device).
pub fn kernel_loads() -> Vec<KernelLoad> {
    match loads().lock() {
        Ok(v) => v.clone(),
        Err(p) => p.into_inner().clone(),
    }
}

/// Records one load ([`kernel_loads`]); logged at `info` when it compiled.
#[cfg_attr(not(any(feature = "hip", feature = "cuda")), allow(dead_code))]
pub(crate) fn record_kernel_load(load: KernelLoad) {
    if load.source == KernelSource::Compiled {
        tracing::info!(
            backend = load.backend,
            arch = %load.arch,
            module = load.module,
            seconds = load.seconds,
            "kernels compiled (cached for later processes)"
        );
    }
    match loads().lock() {
        Ok(mut v) => v.push(load),
        Err(p) => p.into_inner().push(load),
    }
}

/// How the kernels of a device were obtained (the first module loaded).
/// Serialized in snake case (`"disk_cache"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum KernelSource {
    /// The CPU implementations (host backend).
    Cpu,
    /// A code object embedded at build time for this device's arch (HIP).
    Embedded,
    /// PTX built by nvcc at build time (CUDA).
    Nvcc,
    /// Compiled at run time in this process (first use for this target).
    Compiled,
    /// Run-time compiler output reused from this process's cache.
    ProcessCache,
    /// Run-time compiler output of an earlier process, read from the
    /// kernel cache on disk (`crate::device::kernel_cache::dir`).
    DiskCache,
}
