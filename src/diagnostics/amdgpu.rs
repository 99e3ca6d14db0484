//! AMD GPU memory as the amdgpu kernel driver reports it in sysfs, side by
//! side with what the HIP runtime says. On an APU the "VRAM" is a
//! carve-out of system RAM set in firmware, and the GPU can also map system
//! RAM through GTT, up to the smaller of amdgpu's GTT size and the TTM
//! limit (`ttm.pages_limit` pages). Depending on the kernel and ROCm
//! release, `hipMemGetInfo` on one gfx1151 machine has been seen to report
//! the carve-out (15.5 GiB), about half of RAM (~62 GiB: the default TTM
//! limit), or a free figure larger than its total; [`assess_memory`] says
//! which case a card is in and what follows for allocators.

use std::path::Path;

/// One amdgpu device's memory pools, the driver's limits, and the runtime's
/// figures for it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct AmdgpuMemory {
    /// The DRM card (`card0`).
    pub card: String,
    /// PCI address of the device, if readable.
    pub pci: Option<String>,
    /// `mem_info_vram_total` in bytes (the carve-out on an APU).
    pub vram_total_bytes: Option<u64>,
    /// `mem_info_vram_used` in bytes.
    #[serde(default)]
    pub vram_used_bytes: Option<u64>,
    /// `mem_info_gtt_total` in bytes (system RAM the GPU may map).
    pub gtt_total_bytes: Option<u64>,
    /// `mem_info_gtt_used` in bytes.
    #[serde(default)]
    pub gtt_used_bytes: Option<u64>,
    /// The TTM limit in bytes: `/sys/module/ttm/parameters/pages_limit`
    /// times the page size (no GTT allocation goes past it).
    #[serde(default)]
    pub ttm_limit_bytes: Option<u64>,
    /// `amdgpu.gttsize` in MiB as set (`/sys/module/amdgpu/parameters/
    /// gttsize`; -1: the driver's default), if readable.
    #[serde(default)]
    pub amdgpu_gttsize_mib: Option<i64>,
    /// The HIP device this card is (matched by PCI address, or the only
    /// card with the only device), if any.
    pub hip_ordinal: Option<usize>,
    /// Free bytes `hipMemGetInfo` reports for that device.
    pub runtime_free_bytes: Option<u64>,
    /// Total bytes `hipMemGetInfo` reports for that device.
    pub runtime_total_bytes: Option<u64>,
    /// What the figures say together (see [`MemoryAssessment`]).
    pub assessment: MemoryAssessment,
    /// What the assessment means and what to do, when something is to be
    /// done.
    pub warning: Option<String>,
}

/// How the runtime's memory figures compare with the amdgpu pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum MemoryAssessment {
    /// VRAM is the main pool (a discrete GPU, or an APU with a large
    /// carve-out): a runtime total near VRAM is right.
    VramSized,
    /// An APU (GTT at least twice VRAM) whose runtime total is the VRAM
    /// carve-out: allocators that trust it see far too little memory.
    CarveOutOnly,
    /// The runtime reports more free memory than its total: its figures
    /// are inconsistent, and neither can size work on its own.
    FreeAboveTotal,
    /// An APU whose runtime total is well above the carve-out but well
    /// below GTT: usually the TTM limit (by default half of RAM) caps what
    /// the GPU can map, whatever GTT says.
    BelowGtt,
    /// An APU whose runtime reports about GTT, but the TTM limit is well
    /// below GTT: allocations past the TTM limit fail.
    TtmCapped,
    /// An APU whose runtime reports the shared memory (GTT, or VRAM and
    /// GTT) within the TTM limit: nothing to do.
    SharedReported,
    /// An APU by its sysfs pools, but no runtime figure to compare (no HIP
    /// device opened for it).
    ApuNotCompared,
    /// The sysfs pools are not readable.
    Unknown,
}

/// The figures [`assess_memory`] compares, all in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryFigures {
    /// `hipMemGetInfo`'s total.
    pub runtime_total: Option<u64>,
    /// `hipMemGetInfo`'s free.
    pub runtime_free: Option<u64>,
    /// `mem_info_vram_total`.
    pub vram: Option<u64>,
    /// `mem_info_gtt_total`.
    pub gtt: Option<u64>,
    /// The TTM limit (`ttm.pages_limit` x page size).
    pub ttm_limit: Option<u64>,
}

/// What to set when the runtime's figure or the TTM limit is too small.
const FIX: &str = "raise the TTM limit and the GTT size together with the kernel parameters \
                   ttm.pages_limit=<pages of 4 KiB> and ttm.page_pool_size=<same> (amdgpu.gttsize \
                   on older kernels), or the UMA frame buffer (carve-out) in the firmware setup; \
                   size loads from the GTT figure, not from hipMemGetInfo";

/// Classifies one card's figures; returns the assessment and, where action
/// is needed, a warning saying what it means and what to set. A pure
/// function of its inputs.
///
/// GTT at least twice VRAM marks an APU-like card. On one, in this order:
/// a runtime total at most the carve-out plus an eighth (and 1 GiB) is the
/// carve-out ([`MemoryAssessment::CarveOutOnly`]); free above total (by
/// more than 1%) is [`MemoryAssessment::FreeAboveTotal`]; a total below
/// three quarters of GTT is [`MemoryAssessment::BelowGtt`] (the TTM limit
/// named when it explains the figure); a TTM limit below three quarters of
/// GTT is [`MemoryAssessment::TtmCapped`]; else
/// [`MemoryAssessment::SharedReported`]. Free above total is reported on a
/// discrete card too.
pub fn assess_memory(f: &MemoryFigures) -> (MemoryAssessment, Option<String>) {
    let (Some(v), Some(g)) = (f.vram, f.gtt) else {
        return (MemoryAssessment::Unknown, None);
    };
    let ttm = f
        .ttm_limit
        .map(|t| format!(", the TTM limit is {}", gib(t)))
        .unwrap_or_default();
    let free_above = match (f.runtime_free, f.runtime_total) {
        (Some(fr), Some(t)) if fr > t.saturating_add(t / 100) => Some((fr, t)),
        _ => None,
    };
    let free_above_warning = |fr: u64, t: u64| {
        format!(
            "hipMemGetInfo reports {} free of {} total: free larger than total, so the \
             runtime's figures are inconsistent (seen on APUs where free counts system RAM \
             and total does not); VRAM is {}, GTT {}{ttm}. Allocators that size work from \
             either figure (PyTorch's caching allocator, rocm-safe's load budget) may refuse \
             work that fits or attempt work that does not; size loads from GTT within the TTM \
             limit",
            gib(fr),
            gib(t),
            gib(v),
            gib(g)
        )
    };
    if g < v.saturating_mul(2) {
        return match free_above {
            Some((fr, t)) => (
                MemoryAssessment::FreeAboveTotal,
                Some(free_above_warning(fr, t)),
            ),
            None => (MemoryAssessment::VramSized, None),
        };
    }
    let Some(t) = f.runtime_total else {
        return (
            MemoryAssessment::ApuNotCompared,
            Some(format!(
                "VRAM is {} but GTT is {}{ttm}: this looks like an APU whose runtime may \
                 report only the VRAM carve-out, or a TTM-capped figure, as device memory (no \
                 HIP device figure to compare); allocators that trust hipMemGetInfo would then \
                 refuse work the GPU can do. If so, {FIX}",
                gib(v),
                gib(g)
            )),
        );
    };
    let carve_out_max = v.saturating_add((v / 8).max(1 << 30));
    if t <= carve_out_max {
        return (
            MemoryAssessment::CarveOutOnly,
            Some(format!(
                "hipMemGetInfo reports {} total, about the VRAM carve-out ({}), but the GPU \
                 can also map {} of system RAM (GTT){ttm}: allocators that size work from \
                 hipMemGetInfo (PyTorch's caching allocator, rocm-safe's load budget) will \
                 refuse or split work that fits. Use a runtime that reports GTT for APUs, or \
                 {FIX}",
                gib(t),
                gib(v),
                gib(g)
            )),
        );
    }
    if let Some((fr, t)) = free_above {
        return (
            MemoryAssessment::FreeAboveTotal,
            Some(free_above_warning(fr, t)),
        );
    }
    let three_quarters = |x: u64| x / 4 * 3;
    if t < three_quarters(g) {
        let why = match f.ttm_limit {
            Some(l) if t.abs_diff(l) <= l / 16 => format!(
                "that is the TTM limit ({}, ttm.pages_limit): GTT allocations past it fail \
                 whatever the GTT size says",
                gib(l)
            ),
            Some(l) => format!(
                "that is neither the carve-out nor the TTM limit ({}); a runtime that caps APU memory \
                 itself (HSA's system-memory share) gives figures like this",
                gib(l)
            ),
            None => "that is usually the TTM limit (by default half of RAM; \
                     /sys/module/ttm/parameters/pages_limit was not readable)"
                .to_owned(),
        };
        return (
            MemoryAssessment::BelowGtt,
            Some(format!(
                "hipMemGetInfo reports {} total while amdgpu's GTT is {} (VRAM {}): {why}. \
                 Work sized from GTT will fail past the runtime's figure; {FIX}",
                gib(t),
                gib(g),
                gib(v)
            )),
        );
    }
    if let Some(l) = f.ttm_limit.filter(|&l| l < three_quarters(g)) {
        return (
            MemoryAssessment::TtmCapped,
            Some(format!(
                "hipMemGetInfo reports {} total and amdgpu's GTT is {}, but the TTM limit is {} \
                 (ttm.pages_limit): allocations past the TTM limit fail although the runtime \
                 reports them as possible; {FIX}",
                gib(t),
                gib(g),
                gib(l)
            )),
        );
    }
    (MemoryAssessment::SharedReported, None)
}

/// The runtime's view of one HIP device, to compare with sysfs.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
        let (a, w) = assess_memory(&c.figures());
        c.assessment = a;
        c.warning = w;
    }
}

impl AmdgpuMemory {
    /// The figures [`assess_memory`] compares.
    pub fn figures(&self) -> MemoryFigures {
        MemoryFigures {
            runtime_total: self.runtime_total_bytes,
            runtime_free: self.runtime_free_bytes,
            vram: self.vram_total_bytes,
            gtt: self.gtt_total_bytes,
            ttm_limit: self.ttm_limit_bytes,
        }
    }
}

/// The driver limits shared by every card: the TTM limit in bytes and
/// `amdgpu.gttsize` in MiB, read under `modules` (normally `/sys/module`)
/// with pages of `page_size` bytes.
pub fn driver_limits(modules: &Path, page_size: u64) -> (Option<u64>, Option<i64>) {
    let ttm = read_u64(&modules.join("ttm/parameters/pages_limit"))
        .and_then(|pages| pages.checked_mul(page_size));
    let gttsize = std::fs::read_to_string(modules.join("amdgpu/parameters/gttsize"))
        .ok()
        .and_then(|s| s.trim().parse().ok());
    (ttm, gttsize)
}

/// This system's page size.
fn page_size() -> u64 {
    // SAFETY: sysconf only reads a system constant.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Reads every amdgpu card under `drm` (normally `/sys/class/drm`), with
/// the driver limits under `modules` (normally `/sys/module`). The runtime
/// fields are empty and the assessment is from sysfs alone until
/// [`attach_runtime`].
pub fn amdgpu_memory_in(drm: &Path, modules: &Path) -> Vec<AmdgpuMemory> {
    let Ok(entries) = std::fs::read_dir(drm) else {
        return Vec::new();
    };
    let (ttm_limit, gttsize) = driver_limits(modules, page_size());
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
            let pci = std::fs::read_link(&dev)
                .ok()
                .and_then(|l| l.file_name().map(|f| f.to_string_lossy().into_owned()));
            let mut m = AmdgpuMemory {
                card,
                pci,
                vram_total_bytes: read_u64(&dev.join("mem_info_vram_total")),
                vram_used_bytes: read_u64(&dev.join("mem_info_vram_used")),
                gtt_total_bytes: read_u64(&dev.join("mem_info_gtt_total")),
                gtt_used_bytes: read_u64(&dev.join("mem_info_gtt_used")),
                ttm_limit_bytes: ttm_limit,
                amdgpu_gttsize_mib: gttsize,
                hip_ordinal: None,
                runtime_free_bytes: None,
                runtime_total_bytes: None,
                assessment: MemoryAssessment::Unknown,
                warning: None,
            };
            (m.assessment, m.warning) = assess_memory(&m.figures());
            Some(m)
        })
        .collect();
    cards.sort_by(|a, b| a.card.cmp(&b.card));
    cards
}

/// `amdgpu_memory_in` of `/sys/class/drm` and `/sys/module`.
pub fn amdgpu_memory() -> Vec<AmdgpuMemory> {
    amdgpu_memory_in(Path::new("/sys/class/drm"), Path::new("/sys/module"))
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
            std::fs::write(dev.join("mem_info_vram_used"), format!("{}\n", v / 4)).unwrap();
        }
        if let Some(g) = gtt {
            std::fs::write(dev.join("mem_info_gtt_total"), format!("{g}\n")).unwrap();
            std::fs::write(dev.join("mem_info_gtt_used"), "4096\n").unwrap();
        }
    }

    fn modules(root: &Path, pages: Option<u64>, gttsize: Option<&str>) {
        if let Some(p) = pages {
            let d = root.join("ttm/parameters");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("pages_limit"), format!("{p}\n")).unwrap();
        }
        if let Some(g) = gttsize {
            let d = root.join("amdgpu/parameters");
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("gttsize"), format!("{g}\n")).unwrap();
        }
    }

    const GIB: u64 = 1 << 30;
    /// `x` GiB, fractional (62.47 GiB as reported).
    fn gib_f(x: f64) -> u64 {
        (x * GIB as f64) as u64
    }

    fn figures(
        total: Option<u64>,
        free: Option<u64>,
        vram: u64,
        gtt: u64,
        ttm: Option<u64>,
    ) -> MemoryFigures {
        MemoryFigures {
            runtime_total: total,
            runtime_free: free,
            vram: Some(vram),
            gtt: Some(gtt),
            ttm_limit: ttm,
        }
    }

    #[test]
    fn apu_gets_a_warning_discrete_does_not_others_are_skipped() {
        let d = tempfile::tempdir().unwrap();
        let m = d.path().join("module");
        // 16252928 pages of 4 KiB = 62 GiB; gttsize left at its default.
        modules(&m, Some(16_252_928), Some("-1"));
        card(d.path(), "card0", "0x1002", Some(512 << 20), Some(96 << 30)); // APU, 512 MiB carve-out
        card(d.path(), "card1", "0x1002", Some(24 << 30), Some(16 << 30)); // discrete
        card(d.path(), "card2", "0x10de", Some(80 << 30), None); // not AMD
        card(d.path(), "card0-DP-1", "0x1002", None, None); // a connector
        std::fs::create_dir_all(d.path().join("renderD128")).unwrap();
        let cards = amdgpu_memory_in(d.path(), &m);
        assert_eq!(cards.len(), 2, "{cards:?}");
        assert_eq!(cards[0].card, "card0");
        assert_eq!(cards[0].gtt_total_bytes, Some(96 << 30));
        assert_eq!(cards[0].gtt_used_bytes, Some(4096));
        assert_eq!(cards[0].vram_used_bytes, Some(128 << 20));
        let (ttm, gttsize) = driver_limits(&m, 4096);
        assert_eq!((ttm, gttsize), (Some(62 * GIB), Some(-1)));
        if page_size() == 4096 {
            assert_eq!(cards[0].ttm_limit_bytes, Some(62 * GIB));
        }
        assert_eq!(cards[0].amdgpu_gttsize_mib, Some(-1));
        let w = cards[0].warning.as_deref().unwrap();
        assert!(w.contains("0.5 GiB") && w.contains("96.0 GiB"), "{w}");
        assert_eq!(cards[0].assessment, MemoryAssessment::ApuNotCompared);
        assert_eq!(cards[1].warning, None);
        assert_eq!(cards[1].assessment, MemoryAssessment::VramSized);
        // No module parameters: the limits are unknown, not an error.
        assert_eq!(driver_limits(&d.path().join("none"), 4096), (None, None));
    }

    #[test]
    fn apu_runtime_reporting_only_the_carve_out_is_warned() {
        // Strix Halo with the default 512 MiB carve-out and ~62 GiB GTT;
        // hipMemGetInfo says 512 MiB.
        let f = figures(Some(GIB / 2), Some(GIB / 4), GIB / 2, 62 * GIB, None);
        let (a, w) = assess_memory(&f);
        assert_eq!(a, MemoryAssessment::CarveOutOnly);
        let w = w.unwrap();
        assert!(w.contains("hipMemGetInfo reports 0.5 GiB"), "{w}");
        assert!(
            w.contains("62.0 GiB") && w.contains("ttm.pages_limit"),
            "{w}"
        );
        // A runtime total a little above the carve-out is still the carve-out.
        let f = figures(Some(GIB), None, GIB / 2, 62 * GIB, None);
        assert_eq!(assess_memory(&f).0, MemoryAssessment::CarveOutOnly);
    }

    #[test]
    fn gfx1151_reports_as_seen_are_classified_right() {
        // 1. A 16 GiB carve-out reported as 15.5 GiB total, ~56 GiB GTT.
        let f = figures(
            Some(gib_f(15.5)),
            Some(gib_f(15.1)),
            16 * GIB,
            56 * GIB,
            Some(62 * GIB),
        );
        let (a, w) = assess_memory(&f);
        assert_eq!(a, MemoryAssessment::CarveOutOnly);
        let w = w.unwrap();
        assert!(
            w.contains("15.5 GiB total, about the VRAM carve-out (16.0 GiB)"),
            "{w}"
        );

        // 2. 62.47 GiB total with 120 GiB free, GTT raised to ~125 GiB: the
        // figures are inconsistent; it is not the carve-out (the doctor
        // used to say so: the total was under the VRAM/GTT midpoint).
        let f = figures(
            Some(gib_f(62.47)),
            Some(120 * GIB),
            GIB / 2,
            125 * GIB,
            Some(125 * GIB),
        );
        let (a, w) = assess_memory(&f);
        assert_eq!(a, MemoryAssessment::FreeAboveTotal);
        let w = w.unwrap();
        assert!(
            w.contains("120.0 GiB free of 62.5 GiB total: free larger than total"),
            "{w}"
        );
        assert!(!w.contains("about the VRAM carve-out"), "{w}");

        // 3. 61.35 GiB total with 115 GiB of GTT (the doctor used to say
        // nothing): the default TTM limit of half of RAM caps it.
        let f = figures(
            Some(gib_f(61.35)),
            Some(gib_f(60.9)),
            GIB / 2,
            115 * GIB,
            Some(62 * GIB),
        );
        let (a, w) = assess_memory(&f);
        assert_eq!(a, MemoryAssessment::BelowGtt);
        let w = w.unwrap();
        assert!(
            w.contains("61.3 GiB total while amdgpu's GTT is 115.0 GiB"),
            "{w}"
        );
        assert!(w.contains("that is the TTM limit (62.0 GiB"), "{w}");
        // The same without a readable TTM limit, and with one that does
        // not explain the figure.
        let (a, w) = assess_memory(&MemoryFigures {
            ttm_limit: None,
            ..f
        });
        assert_eq!(a, MemoryAssessment::BelowGtt);
        assert!(w.unwrap().contains("usually the TTM limit"));
        let (a, w) = assess_memory(&MemoryFigures {
            ttm_limit: Some(115 * GIB),
            ..f
        });
        assert_eq!(a, MemoryAssessment::BelowGtt);
        assert!(w
            .unwrap()
            .contains("neither the carve-out nor the TTM limit"));

        // ~62 GiB total with ~62 GiB GTT and the default TTM limit: the
        // shared memory reported, nothing to do.
        let f = figures(
            Some(gib_f(62.47)),
            Some(60 * GIB),
            GIB / 2,
            gib_f(62.5),
            Some(gib_f(62.5)),
        );
        assert_eq!(assess_memory(&f), (MemoryAssessment::SharedReported, None));
    }

    #[test]
    fn a_ttm_limit_below_gtt_is_warned_even_when_the_runtime_reports_gtt() {
        let f = figures(
            Some(115 * GIB),
            Some(110 * GIB),
            GIB / 2,
            115 * GIB,
            Some(62 * GIB),
        );
        let (a, w) = assess_memory(&f);
        assert_eq!(a, MemoryAssessment::TtmCapped);
        let w = w.unwrap();
        assert!(w.contains("the TTM limit is 62.0 GiB"), "{w}");
    }

    #[test]
    fn apu_runtime_reporting_gtt_is_fine() {
        let f = figures(Some(62 * GIB), Some(60 * GIB), GIB / 2, 62 * GIB, None);
        assert_eq!(assess_memory(&f), (MemoryAssessment::SharedReported, None));
        // VRAM + GTT reported as one pool.
        let f = figures(Some(63 * GIB), None, GIB, 62 * GIB, Some(62 * GIB));
        assert_eq!(assess_memory(&f), (MemoryAssessment::SharedReported, None));
    }

    #[test]
    fn discrete_gpu_and_large_carve_out_need_nothing() {
        // A 24 GiB discrete card with 16 GiB GTT, runtime reports 24 GiB.
        let f = figures(Some(24 * GIB), Some(20 * GIB), 24 * GIB, 16 * GIB, None);
        assert_eq!(assess_memory(&f), (MemoryAssessment::VramSized, None));
        // An APU set to a 96 GiB carve-out: VRAM is the main pool.
        let f = figures(Some(96 * GIB), None, 96 * GIB, 15 * GIB, None);
        assert_eq!(assess_memory(&f), (MemoryAssessment::VramSized, None));
        // A discrete card whose free exceeds its total: inconsistent.
        let f = figures(Some(24 * GIB), Some(30 * GIB), 24 * GIB, 16 * GIB, None);
        assert_eq!(assess_memory(&f).0, MemoryAssessment::FreeAboveTotal);
        // Free equal to total (an idle card) is fine.
        let f = figures(Some(24 * GIB), Some(24 * GIB), 24 * GIB, 16 * GIB, None);
        assert_eq!(assess_memory(&f).0, MemoryAssessment::VramSized);
        // Unreadable sysfs: unknown, no warning, whatever the runtime says.
        let f = MemoryFigures {
            runtime_total: Some(GIB),
            gtt: Some(GIB),
            ..MemoryFigures::default()
        };
        assert_eq!(assess_memory(&f), (MemoryAssessment::Unknown, None));
    }

    #[test]
    fn runtime_figures_attach_by_pci_or_single_device() {
        let card = |name: &str, pci: Option<&str>| AmdgpuMemory {
            card: name.into(),
            pci: pci.map(Into::into),
            vram_total_bytes: Some(GIB / 2),
            vram_used_bytes: None,
            gtt_total_bytes: Some(62 * GIB),
            gtt_used_bytes: None,
            ttm_limit_bytes: None,
            amdgpu_gttsize_mib: None,
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
        // The free figure takes part: free above total is reported.
        let mut odd = vec![card("card0", None)];
        attach_runtime(
            &mut odd,
            &[RuntimeMemory {
                ordinal: 0,
                pci: None,
                mem: Some((120 * GIB, 62 * GIB)),
            }],
        );
        assert_eq!(odd[0].assessment, MemoryAssessment::FreeAboveTotal);
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
        let none = Path::new("/nonexistent/module");
        assert!(amdgpu_memory_in(Path::new("/nonexistent/drm"), none).is_empty());
        let d = tempfile::tempdir().unwrap();
        card(d.path(), "card0", "0x1002", None, None);
        let m = amdgpu_memory_in(d.path(), none);
        assert_eq!(m.len(), 1);
        assert_eq!(
            (
                m[0].vram_total_bytes,
                m[0].gtt_total_bytes,
                m[0].ttm_limit_bytes,
                m[0].warning.clone()
            ),
            (None, None, None, None)
        );
    }
}
