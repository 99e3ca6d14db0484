//! AMD GPU memory as the amdgpu kernel driver reports it in sysfs. On an APU
//! the "VRAM" is a carve-out of system RAM set in firmware, and the GPU can
//! also use GTT (system RAM mapped for it) up to the driver's limit; runtimes
//! that report only the carve-out (`hipMemGetInfo` on several ROCm releases)
//! make allocators think the GPU is nearly full.

use std::path::Path;

/// One amdgpu device's memory pools.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AmdgpuMemory {
    /// The DRM card (`card0`).
    pub card: String,
    /// PCI address of the device, if readable.
    pub pci: Option<String>,
    /// `mem_info_vram_total` in bytes (the carve-out on an APU).
    pub vram_total_bytes: Option<u64>,
    /// `mem_info_gtt_total` in bytes (system RAM the GPU may map).
    pub gtt_total_bytes: Option<u64>,
    /// The HIP device this card is (matched by PCI address, or the only
    /// card with the only device), if any.
    pub hip_ordinal: Option<usize>,
    /// Free bytes `hipMemGetInfo` reports for that device.
    pub runtime_free_bytes: Option<u64>,
    /// Total bytes `hipMemGetInfo` reports for that device.
    pub runtime_total_bytes: Option<u64>,
    /// What the figures say together (see [`MemoryAssessment`]).
    pub assessment: MemoryAssessment,
    /// A warning when the runtime reports only the VRAM carve-out while GTT
    /// is much larger (or, without a runtime figure, when GTT dwarfs VRAM):
    /// what it means and what to set.
    pub warning: Option<String>,
}

/// How the runtime's memory figure compares with the amdgpu pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryAssessment {
    /// VRAM is the main pool (a discrete GPU, or an APU with a large
    /// carve-out): a runtime total near VRAM is right.
    VramSized,
    /// An APU (GTT at least twice VRAM) whose runtime reports only the VRAM
    /// carve-out: allocators that trust it see far too little memory.
    CarveOutOnly,
    /// An APU whose runtime reports more than the carve-out (GTT or unified
    /// memory): nothing to do.
    SharedReported,
    /// An APU by its sysfs pools, but no runtime figure to compare (no HIP
    /// device opened for it).
    ApuNotCompared,
    /// The sysfs pools are not readable.
    Unknown,
}

/// Compares a runtime's total memory (`hipMemGetInfo`) with the amdgpu
/// VRAM and GTT sizes; returns the assessment and, where action is needed,
/// a warning saying what it means and what to set. A pure function of its
/// inputs.
///
/// The rule: GTT at least twice VRAM marks an APU-like card; on one, a
/// runtime total below the midpoint of VRAM and GTT means the runtime counts
/// only the carve-out.
pub fn assess_memory(
    runtime_total: Option<u64>,
    vram: Option<u64>,
    gtt: Option<u64>,
) -> (MemoryAssessment, Option<String>) {
    let (Some(v), Some(g)) = (vram, gtt) else {
        return (MemoryAssessment::Unknown, None);
    };
    if g < v.saturating_mul(2) {
        return (MemoryAssessment::VramSized, None);
    }
    let fix = "Raise the UMA frame buffer (carve-out) in the firmware setup, or use a runtime \
               that reports GTT for APUs and raise the GTT limit with the kernel parameters \
               ttm.pages_limit and ttm.page_pool_size (amdgpu.gttsize on older kernels); size \
               loads from the GTT figure";
    match runtime_total {
        None => (
            MemoryAssessment::ApuNotCompared,
            Some(format!(
                "VRAM is {} but GTT is {}: this looks like an APU whose runtime may report \
                 only the VRAM carve-out as device memory (no HIP device figure to compare); \
                 allocators that trust hipMemGetInfo would then refuse work the GPU can do. {fix}",
                gib(v),
                gib(g)
            )),
        ),
        Some(t) if t < v + (g - v) / 2 => (
            MemoryAssessment::CarveOutOnly,
            Some(format!(
                "hipMemGetInfo reports {} total, the VRAM carve-out ({}), but the GPU can also \
                 map {} of system RAM (GTT): allocators that size work from hipMemGetInfo \
                 (PyTorch's caching allocator, rocm-safe's load budget) will refuse or split \
                 work that fits. {fix}",
                gib(t),
                gib(v),
                gib(g)
            )),
        ),
        Some(_) => (MemoryAssessment::SharedReported, None),
    }
}

/// The runtime's view of one HIP device, to compare with sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeMemory {
    /// HIP ordinal.
    pub ordinal: usize,
    /// The device's PCI bus id (`"0000:c3:00.0"`), if known.
    pub pci: Option<String>,
    /// `(free, total)` from `hipMemGetInfo`, if it answered.
    pub mem: Option<(u64, u64)>,
}

/// Pairs each card with its HIP device (by PCI address, case-insensitive;
/// else the only card with the only device) and fills in the runtime
/// figures, the assessment and the warning.
pub fn attach_runtime(cards: &mut [AmdgpuMemory], devices: &[RuntimeMemory]) {
    let single = cards.len() == 1 && devices.len() == 1;
    for c in cards.iter_mut() {
        let dev = devices
            .iter()
            .find(|d| match (&d.pci, &c.pci) {
                (Some(a), Some(b)) => a.eq_ignore_ascii_case(b),
                _ => false,
            })
            .or_else(|| devices.first().filter(|_| single));
        c.hip_ordinal = dev.map(|d| d.ordinal);
        let mem = dev.and_then(|d| d.mem);
        c.runtime_free_bytes = mem.map(|m| m.0);
        c.runtime_total_bytes = mem.map(|m| m.1);
        let (a, w) = assess_memory(c.runtime_total_bytes, c.vram_total_bytes, c.gtt_total_bytes);
        c.assessment = a;
        c.warning = w;
    }
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Reads every amdgpu card under `drm` (normally `/sys/class/drm`). The
/// runtime fields are empty and the assessment is from sysfs alone until
/// [`attach_runtime`].
pub fn amdgpu_memory_in(drm: &Path) -> Vec<AmdgpuMemory> {
    let Ok(entries) = std::fs::read_dir(drm) else {
        return Vec::new();
    };
    let mut cards: Vec<AmdgpuMemory> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let card = e.file_name().to_string_lossy().into_owned();
            // cardN only (not connectors like card0-DP-1, nor renderD*).
            if !card
                .strip_prefix("card")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            {
                return None;
            }
            let dev = e.path().join("device");
            let vendor = std::fs::read_to_string(dev.join("vendor")).ok()?;
            if vendor.trim() != "0x1002" {
                return None;
            }
            let vram = read_u64(&dev.join("mem_info_vram_total"));
            let gtt = read_u64(&dev.join("mem_info_gtt_total"));
            let pci = std::fs::read_link(&dev)
                .ok()
                .and_then(|l| l.file_name().map(|f| f.to_string_lossy().into_owned()));
            let (assessment, warning) = assess_memory(None, vram, gtt);
            Some(AmdgpuMemory {
                card,
                pci,
                vram_total_bytes: vram,
                gtt_total_bytes: gtt,
                hip_ordinal: None,
                runtime_free_bytes: None,
                runtime_total_bytes: None,
                assessment,
                warning,
            })
        })
        .collect();
    cards.sort_by(|a, b| a.card.cmp(&b.card));
    cards
}

/// [`amdgpu_memory_in`] of `/sys/class/drm`.
pub fn amdgpu_memory() -> Vec<AmdgpuMemory> {
    amdgpu_memory_in(Path::new("/sys/class/drm"))
}

fn gib(b: u64) -> String {
    format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card(root: &Path, name: &str, vendor: &str, vram: Option<u64>, gtt: Option<u64>) {
        let dev = root.join(name).join("device");
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("vendor"), format!("{vendor}\n")).unwrap();
        if let Some(v) = vram {
            std::fs::write(dev.join("mem_info_vram_total"), format!("{v}\n")).unwrap();
        }
        if let Some(g) = gtt {
            std::fs::write(dev.join("mem_info_gtt_total"), format!("{g}\n")).unwrap();
        }
    }

    #[test]
    fn apu_gets_a_warning_discrete_does_not_others_are_skipped() {
        let d = tempfile::tempdir().unwrap();
        card(d.path(), "card0", "0x1002", Some(512 << 20), Some(96 << 30)); // APU, 512 MiB carve-out
        card(d.path(), "card1", "0x1002", Some(24 << 30), Some(16 << 30)); // discrete
        card(d.path(), "card2", "0x10de", Some(80 << 30), None); // not AMD
        card(d.path(), "card0-DP-1", "0x1002", None, None); // a connector
        std::fs::create_dir_all(d.path().join("renderD128")).unwrap();
        let m = amdgpu_memory_in(d.path());
        assert_eq!(m.len(), 2, "{m:?}");
        assert_eq!(m[0].card, "card0");
        assert_eq!(m[0].gtt_total_bytes, Some(96 << 30));
        let w = m[0].warning.as_deref().unwrap();
        assert!(w.contains("0.5 GiB") && w.contains("96.0 GiB"), "{w}");
        assert_eq!(m[0].assessment, MemoryAssessment::ApuNotCompared);
        assert_eq!(m[1].warning, None);
        assert_eq!(m[1].assessment, MemoryAssessment::VramSized);
    }

    const GIB: u64 = 1 << 30;

    #[test]
    fn apu_runtime_reporting_only_the_carve_out_is_warned() {
        // Strix Halo with the default 512 MiB carve-out and ~62 GiB GTT;
        // hipMemGetInfo says 512 MiB.
        let (a, w) = assess_memory(Some(GIB / 2), Some(GIB / 2), Some(62 * GIB));
        assert_eq!(a, MemoryAssessment::CarveOutOnly);
        let w = w.unwrap();
        assert!(w.contains("hipMemGetInfo reports 0.5 GiB"), "{w}");
        assert!(
            w.contains("62.0 GiB") && w.contains("ttm.pages_limit"),
            "{w}"
        );
        // A runtime total a little above the carve-out is still the carve-out.
        let (a, _) = assess_memory(Some(GIB), Some(GIB / 2), Some(62 * GIB));
        assert_eq!(a, MemoryAssessment::CarveOutOnly);
    }

    #[test]
    fn apu_runtime_reporting_gtt_is_fine() {
        let (a, w) = assess_memory(Some(62 * GIB), Some(GIB / 2), Some(62 * GIB));
        assert_eq!((a, w), (MemoryAssessment::SharedReported, None));
        // VRAM + GTT reported as one pool.
        let (a, w) = assess_memory(Some(63 * GIB), Some(GIB), Some(62 * GIB));
        assert_eq!((a, w), (MemoryAssessment::SharedReported, None));
    }

    #[test]
    fn discrete_gpu_and_large_carve_out_need_nothing() {
        // A 24 GiB discrete card with 16 GiB GTT, runtime reports 24 GiB.
        let (a, w) = assess_memory(Some(24 * GIB), Some(24 * GIB), Some(16 * GIB));
        assert_eq!((a, w), (MemoryAssessment::VramSized, None));
        // An APU set to a 96 GiB carve-out: VRAM is the main pool.
        let (a, w) = assess_memory(Some(96 * GIB), Some(96 * GIB), Some(15 * GIB));
        assert_eq!((a, w), (MemoryAssessment::VramSized, None));
        // Unreadable sysfs: unknown, no warning, whatever the runtime says.
        assert_eq!(
            assess_memory(Some(GIB), None, Some(GIB)),
            (MemoryAssessment::Unknown, None)
        );
    }

    #[test]
    fn runtime_figures_attach_by_pci_or_single_device() {
        let card = |name: &str, pci: Option<&str>| AmdgpuMemory {
            card: name.into(),
            pci: pci.map(Into::into),
            vram_total_bytes: Some(GIB / 2),
            gtt_total_bytes: Some(62 * GIB),
            hip_ordinal: None,
            runtime_free_bytes: None,
            runtime_total_bytes: None,
            assessment: MemoryAssessment::ApuNotCompared,
            warning: None,
        };
        // Two cards, matched by PCI address (case-insensitive).
        let mut cards = vec![
            card("card0", Some("0000:c3:00.0")),
            card("card1", Some("0000:04:00.0")),
        ];
        let devs = [
            RuntimeMemory {
                ordinal: 0,
                pci: Some("0000:04:00.0".into()),
                mem: Some((GIB, 62 * GIB)),
            },
            RuntimeMemory {
                ordinal: 1,
                pci: Some("0000:C3:00.0".into()),
                mem: Some((GIB / 4, GIB / 2)),
            },
        ];
        attach_runtime(&mut cards, &devs);
        assert_eq!(cards[0].hip_ordinal, Some(1));
        assert_eq!(cards[0].runtime_total_bytes, Some(GIB / 2));
        assert_eq!(cards[0].runtime_free_bytes, Some(GIB / 4));
        assert_eq!(cards[0].assessment, MemoryAssessment::CarveOutOnly);
        assert!(cards[0].warning.is_some());
        assert_eq!(cards[1].hip_ordinal, Some(0));
        assert_eq!(cards[1].assessment, MemoryAssessment::SharedReported);
        assert!(cards[1].warning.is_none());
        // One card, one device without a PCI id: paired.
        let mut one = vec![card("card0", None)];
        attach_runtime(
            &mut one,
            &[RuntimeMemory {
                ordinal: 0,
                pci: None,
                mem: Some((1, GIB / 2)),
            }],
        );
        assert_eq!(one[0].hip_ordinal, Some(0));
        assert_eq!(one[0].assessment, MemoryAssessment::CarveOutOnly);
        // No device at all: the sysfs-only assessment remains.
        let mut none = vec![card("card0", Some("0000:c3:00.0"))];
        attach_runtime(&mut none, &[]);
        assert_eq!(none[0].hip_ordinal, None);
        assert_eq!(none[0].assessment, MemoryAssessment::ApuNotCompared);
        assert!(none[0]
            .warning
            .as_deref()
            .unwrap()
            .contains("no HIP device figure"));
    }

    #[test]
    fn missing_sysfs_is_empty_not_an_error() {
        assert!(amdgpu_memory_in(Path::new("/nonexistent/drm")).is_empty());
        let d = tempfile::tempdir().unwrap();
        card(d.path(), "card0", "0x1002", None, None);
        let m = amdgpu_memory_in(d.path());
        assert_eq!(m.len(), 1);
        assert_eq!(
            (
                m[0].vram_total_bytes,
                m[0].gtt_total_bytes,
                m[0].warning.clone()
            ),
            (None, None, None)
        );
    }
}
