//! The KFD topology in sysfs (`/sys/class/kfd/kfd/topology/nodes/*/properties`):
//! each GPU's gfx arch and compute units, matched to a HIP ordinal by PCI
//! location (never read from `hipDeviceProp_t`, whose layout changed in
//! ROCm 6).

use std::collections::HashMap;

/// One GPU node of the KFD topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KfdNode {
    /// `gfx90a`, `gfx1151`, ...
    pub(crate) arch: String,
    /// PCI domain.
    pub(crate) domain: u32,
    /// PCI location (`bus << 8 | device << 3 | function`).
    pub(crate) location_id: u32,
    /// Compute units (`simd_count / simd_per_cu`).
    pub(crate) compute_units: u32,
}

/// The gfx name of a KFD `gfx_target_version` (`90010` -> `gfx90a`,
/// `110501` -> `gfx1151`); `None` for 0 (a CPU node).
pub(crate) fn gfx_name(target_version: u32) -> Option<String> {
    if target_version == 0 {
        return None;
    }
    let major = target_version / 10_000;
    let minor = (target_version / 100) % 100;
    let step = target_version % 100;
    Some(format!("gfx{major}{minor:x}{step:x}"))
}

/// Parses one node's `properties` text.
pub(crate) fn parse_kfd_properties(text: &str) -> Option<KfdNode> {
    let mut props = HashMap::new();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if let (Some(k), Some(v)) = (it.next(), it.next()) {
            if let Ok(v) = v.parse::<u64>() {
                props.insert(k, v);
            }
        }
    }
    let get = |k: &str| props.get(k).copied().unwrap_or(0);
    let arch = gfx_name(u32::try_from(get("gfx_target_version")).ok()?)?;
    let simd_per_cu = get("simd_per_cu").max(1);
    Some(KfdNode {
        arch,
        domain: u32::try_from(get("domain")).unwrap_or(0),
        location_id: u32::try_from(get("location_id")).unwrap_or(0),
        compute_units: u32::try_from(get("simd_count") / simd_per_cu).unwrap_or(0),
    })
}

/// The GPU nodes of `/sys/class/kfd/kfd/topology/nodes`, in node order.
pub(crate) fn kfd_nodes() -> Vec<KfdNode> {
    let Ok(dir) = std::fs::read_dir("/sys/class/kfd/kfd/topology/nodes") else {
        return Vec::new();
    };
    let mut nodes: Vec<(u64, KfdNode)> = dir
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let idx = e.file_name().to_str()?.parse::<u64>().ok()?;
            let text = std::fs::read_to_string(e.path().join("properties")).ok()?;
            Some((idx, parse_kfd_properties(&text)?))
        })
        .collect();
    nodes.sort_by_key(|(i, _)| *i);
    nodes.into_iter().map(|(_, n)| n).collect()
}

/// `(domain, location_id)` of a `"dddd:bb:dd.f"` PCI bus id.
pub(crate) fn parse_pci_bus_id(id: &str) -> Option<(u32, u32)> {
    let (domain, rest) = id.trim().split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (dev, func) = rest.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u32::from_str_radix(bus, 16).ok()?;
    let dev = u32::from_str_radix(dev, 16).ok()?;
    let func = u32::from_str_radix(func, 16).ok()?;
    Some((domain, (bus << 8) | (dev << 3) | func))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_names_from_target_versions() {
        assert_eq!(gfx_name(90010).as_deref(), Some("gfx90a"));
        assert_eq!(gfx_name(90402).as_deref(), Some("gfx942"));
        assert_eq!(gfx_name(100300).as_deref(), Some("gfx1030"));
        assert_eq!(gfx_name(110501).as_deref(), Some("gfx1151"));
        assert_eq!(gfx_name(0), None);
    }

    #[test]
    fn kfd_properties_and_pci_ids_parse() {
        let text = "cpu_cores_count 0\nsimd_count 80\nsimd_per_cu 2\ngfx_target_version 110501\n\
                    location_id 49408\ndomain 0\n";
        let n = parse_kfd_properties(text).unwrap();
        assert_eq!(n.arch, "gfx1151");
        assert_eq!(n.compute_units, 40);
        assert_eq!(n.location_id, 49408);
        assert_eq!(parse_pci_bus_id("0000:c1:00.0"), Some((0, 0xc1 << 8)));
        assert_eq!(
            parse_pci_bus_id("0001:03:02.1"),
            Some((1, (3 << 8) | (2 << 3) | 1))
        );
        assert_eq!(parse_pci_bus_id("garbage"), None);
        assert!(parse_kfd_properties("gfx_target_version 0\n").is_none());
        assert!(parse_kfd_properties("").is_none());
    }
}
