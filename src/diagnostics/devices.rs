//! Which GPU backends this build has, which devices they see (with the
//! runtime's memory figures), and whether each device's conversion kernels
//! pass the exhaustive self-test.

use std::time::Instant;

use super::selftest::{SelfTest, Verdict};
use crate::device::{BackendKind, Device};
use crate::verify;

/// One backend as this build and machine see it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct BackendReport {
    /// `"host"`, `"hip"` or `"cuda"`.
    pub backend: String,
    /// Whether this build contains the backend (its cargo feature is on).
    pub built: bool,
    /// The devices it sees (empty when none, or not built).
    pub devices: Vec<DeviceReport>,
    /// Why there are no devices (`"not built: ..."`, the runtime's typed
    /// error such as "no device"), if so.
    pub error: Option<String>,
}

/// One device, the runtime's memory figures, and its self-test.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct DeviceReport {
    /// Ordinal after `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`.
    pub ordinal: usize,
    /// The runtime's name for the device.
    pub name: String,
    /// `gfx1151`, `sm_90`, `host`, ...
    pub arch: String,
    /// Total device memory in bytes as the device query gives it
    /// (`hipDeviceTotalMem`, `cuDeviceTotalMem`; 0 where unknown, as on the
    /// host device).
    pub total_memory_bytes: u64,
    /// Compute units / streaming multiprocessors.
    pub multiprocessors: u32,
    /// The device's PCI bus id (`"0000:c3:00.0"`; HIP devices only).
    pub pci_bus_id: Option<String>,
    /// Free bytes as the runtime reports them (`Device::mem_info`:
    /// `hipMemGetInfo`, `cuMemGetInfo`, the host's `MemAvailable`).
    pub memory_free_bytes: Option<u64>,
    /// Total bytes as the runtime reports them with the free figure (on an
    /// APU possibly only the VRAM carve-out; see `amdgpu_memory`).
    pub memory_reported_total_bytes: Option<u64>,
    /// Why the two figures above are missing, if they are.
    pub memory_info_error: Option<String>,
    /// Whether `--device` selected it (always true without `--device`):
    /// only selected devices are self-tested and enter the matrix.
    pub selected: bool,
    /// The exhaustive conversion-kernel self-test on this device (`None`
    /// when not selected).
    pub self_test: Option<SelfTest>,
}

/// Every backend kind, in report order.
pub const KINDS: [BackendKind; 3] = [BackendKind::Host, BackendKind::Hip, BackendKind::Cuda];

/// Lists each backend's devices and their memory figures, without
/// self-tests (`self_test` is `None`, `selected` true). Never fails: what
/// cannot be done is reported in the fields.
pub fn list_backends() -> Vec<BackendReport> {
    KINDS.iter().map(|&k| list(k)).collect()
}

/// [`list_backends`], then the kernel self-test on every device.
pub fn probe_backends() -> Vec<BackendReport> {
    let mut reports = list_backends();
    for (b, kind) in reports.iter_mut().zip(KINDS) {
        for d in &mut b.devices {
            d.self_test = Some(kernel_self_test(kind, d.ordinal));
        }
    }
    reports
}

fn list(kind: BackendKind) -> BackendReport {
    let backend = kind.name().to_owned();
    if !kind.is_built() {
        return BackendReport {
            backend,
            built: false,
            devices: Vec::new(),
            error: Some(format!(
                "not built (cargo feature `{}` is off)",
                kind.name()
            )),
        };
    }
    match Device::list(kind) {
        Ok(infos) => BackendReport {
            backend,
            built: true,
            devices: infos
                .into_iter()
                .map(|i| {
                    let mem = Device::open(kind, i.ordinal).and_then(|d| d.mem_info());
                    DeviceReport {
                        pci_bus_id: pci_bus_id(kind, i.ordinal),
                        memory_free_bytes: mem.as_ref().ok().map(|m| m.0),
                        memory_reported_total_bytes: mem.as_ref().ok().map(|m| m.1),
                        memory_info_error: mem.err().map(|e| e.to_string()),
                        selected: true,
                        self_test: None,
                        ordinal: i.ordinal,
                        name: i.name,
                        arch: i.arch,
                        total_memory_bytes: i.total_memory,
                        multiprocessors: i.multiprocessors,
                    }
                })
                .collect(),
            error: None,
        },
        Err(e) => BackendReport {
            backend,
            built: true,
            devices: Vec::new(),
            error: Some(e.to_string()),
        },
    }
}

#[cfg(feature = "hip")]
fn pci_bus_id(kind: BackendKind, ordinal: usize) -> Option<String> {
    (kind == BackendKind::Hip)
        .then(|| crate::device::runtime::hip::pci_bus_id(ordinal).ok())
        .flatten()
}

#[cfg(not(feature = "hip"))]
fn pci_bus_id(_kind: BackendKind, _ordinal: usize) -> Option<String> {
    None
}

/// The exhaustive conversion-kernel self-test on device `kind:ordinal`
/// (every 16-bit pattern through each device kernel, compared with the CPU).
pub fn kernel_self_test(kind: BackendKind, ordinal: usize) -> SelfTest {
    let name = format!("{}:{ordinal}.conversion_kernels", kind.name());
    let t = Instant::now();
    let r = Device::open(kind, ordinal)
        .and_then(|d| d.stream())
        .and_then(|s| verify::self_test_uncached(&s));
    let millis = t.elapsed().as_secs_f64() * 1e3;
    let (verdict, detail) = match r {
        Ok(rep) if rep.all_passed() => {
            let patterns: u64 = rep.kernels.iter().map(|k| k.tested).sum();
            (
                Verdict::Pass,
                format!(
                    "{} kernels, {patterns} patterns bit-exact",
                    rep.kernels.len()
                ),
            )
        }
        Ok(rep) => {
            let bad: Vec<String> = rep
                .kernels
                .iter()
                .filter(|k| k.mismatches > 0)
                .map(|k| match k.first_mismatch {
                    Some((i, want, got)) => format!(
                        "{}: {} mismatches, first {i:#x} -> {got:#x} (expected {want:#x})",
                        k.kernel, k.mismatches
                    ),
                    None => format!("{}: {} mismatches", k.kernel, k.mismatches),
                })
                .collect();
            (
                Verdict::Fail,
                format!(
                    "untrusted, conversions fall back to the CPU: {}",
                    bad.join("; ")
                ),
            )
        }
        Err(e) => (Verdict::Fail, format!("self-test could not run: {e}")),
    };
    SelfTest {
        name,
        verdict,
        detail,
        millis,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_backend_is_probed_and_passes() {
        let reports = probe_backends();
        assert_eq!(reports.len(), 3);
        let host = &reports[0];
        assert_eq!(host.backend, "host");
        assert!(host.built && host.error.is_none());
        assert_eq!(host.devices.len(), 1);
        let d = &host.devices[0];
        let t = d.self_test.as_ref().unwrap();
        assert_eq!(t.verdict, Verdict::Pass, "{}", t.detail);
        assert!(t.detail.contains("bit-exact"), "{}", t.detail);
        assert!(d.selected);
        if cfg!(target_os = "linux") {
            // The host device's memory is host RAM, from /proc/meminfo.
            let (free, total) = (
                d.memory_free_bytes.unwrap(),
                d.memory_reported_total_bytes.unwrap(),
            );
            assert!(total > 0 && free <= total, "{d:?}");
            assert_eq!(d.memory_info_error, None);
        }
    }

    #[test]
    fn listing_runs_no_self_test() {
        let host = &list_backends()[0];
        assert_eq!(host.devices[0].self_test, None);
    }

    #[test]
    fn unbuilt_or_absent_gpu_backends_report_why() {
        for r in &probe_backends()[1..] {
            if !r.built {
                assert!(r.devices.is_empty());
                assert!(
                    r.error.as_deref().unwrap_or("").contains("not built"),
                    "{r:?}"
                );
            } else if r.devices.is_empty() {
                // Built but no GPU here (CI): the typed error is reported, not swallowed.
                assert!(r.error.is_some(), "{r:?}");
            }
        }
    }
}
