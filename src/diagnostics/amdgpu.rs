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
    /// A warning when the GTT pool dwarfs the VRAM one (an APU whose
    /// runtime-reported free memory will look far too small).
    pub warning: Option<String>,
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Reads every amdgpu card under `drm` (normally `/sys/class/drm`).
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
            let warning = match (vram, gtt) {
                (Some(v), Some(g)) if g >= v.saturating_mul(2) => Some(format!(
                    "VRAM is {} but GTT is {}: this looks like an APU whose runtime may report \
                     only the VRAM carve-out as device memory; allocators that trust it \
                     (hipMemGetInfo) will refuse work the GPU can do. Raise the carve-out in \
                     firmware or the GTT limit (kernel parameter ttm.pages_limit), and size \
                     loads from the GTT figure",
                    gib(v),
                    gib(g)
                )),
                _ => None,
            };
            Some(AmdgpuMemory {
                card,
                pci,
                vram_total_bytes: vram,
                gtt_total_bytes: gtt,
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
        assert_eq!(m[1].warning, None);
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
