//! The KFD topology in sysfs (`/sys/class/kfd/kfd/topology/nodes/*/properties`):
//! each GPU's gfx arch and compute units, matched to a HIP ordinal by PCI
//! location (never read from `hipDeviceProp_t`, whose layout changed in
//! ROCm 6).

use std::collections::HashMap;

/// One GPU node of the KFD topology.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KfdNode {
    /// The node's number in the topology (CPU nodes count too): the `N`
    /// of `HSA_OVERRIDE_GFX_VERSION_N`.
    pub(crate) node: u64,
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
        node: 0,
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
            let mut node = parse_kfd_properties(&text)?;
            node.node = idx;
            Some((idx, node))
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

/// The variable that makes the HSA runtime treat every GPU as another gfx
/// arch (`11.0.0` = gfx1100); `HSA_OVERRIDE_GFX_VERSION_<node>` does it for
/// one KFD node and wins over it.
pub const GFX_OVERRIDE_VAR: &str = "HSA_OVERRIDE_GFX_VERSION";

/// An `HSA_OVERRIDE_GFX_VERSION` in effect: with it the runtime loads the
/// code object of `arch`, not the GPU's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GfxOverride {
    /// The variable (`HSA_OVERRIDE_GFX_VERSION`, or `..._<node>`).
    pub var: String,
    /// Its value as set.
    pub value: String,
    /// The arch it names (`gfx1100`), or why the runtime refuses the value.
    pub arch: Result<String, String>,
}

/// Parses an override value as ROCm's thunk (libhsakmt `topology.c`) does:
/// `sscanf("%u.%u.%u%c") == 3`, three decimal numbers and nothing after,
/// major <= 63, minor and stepping <= 255. The arch name writes minor and
/// stepping in hex, as KFD's `gfx_target_version` (`9.0.10` = gfx90a).
pub fn parse_gfx_override(value: &str) -> Result<String, String> {
    let bad = || {
        "expected major.minor.stepping, three decimal numbers (e.g. 11.0.0 for gfx1100, \
         9.0.10 for gfx90a), major <= 63, minor and stepping <= 255"
            .to_owned()
    };
    let parts: Vec<&str> = value.trim_start().split('.').collect();
    let [major, minor, step] = parts.as_slice() else {
        return Err(bad());
    };
    let num = |s: &str| -> Option<u32> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (num(major), num(minor), num(step)) {
        (Some(ma), Some(mi), Some(st)) if ma <= 63 && mi <= 255 && st <= 255 => {
            Ok(format!("gfx{ma}{mi:x}{st:x}"))
        }
        _ => Err(bad()),
    }
}

/// The override in effect for KFD node `node` (`None`: the global one),
/// read from `env`.
pub(crate) fn gfx_override_from(
    node: Option<u64>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<GfxOverride> {
    let per_node = node.map(|n| format!("{GFX_OVERRIDE_VAR}_{n}"));
    let (var, value) = per_node
        .and_then(|v| env(&v).map(|value| (v, value)))
        .or_else(|| env(GFX_OVERRIDE_VAR).map(|value| (GFX_OVERRIDE_VAR.to_owned(), value)))?;
    Some(GfxOverride {
        arch: parse_gfx_override(&value),
        var,
        value,
    })
}

/// The process environment, as [`gfx_override_from`] reads it (set and
/// non-empty values only).
pub(crate) fn process_env(var: &str) -> Option<String> {
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

/// The device node the HIP runtime opens.
pub(crate) const KFD_PATH: &str = "/dev/kfd";

/// Whether this process may open `/dev/kfd` for reading and writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KfdAccess {
    /// No such node: no amdgpu driver (or none exposed to this container).
    Missing,
    /// Readable and writable.
    Allowed,
    /// There, but this user may not open it; the group owning it, if known.
    Denied { group: Option<String> },
}

/// `access(path, R_OK | W_OK)`, which opens nothing.
pub(crate) fn kfd_access(path: &std::path::Path) -> KfdAccess {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return KfdAccess::Missing;
    };
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return KfdAccess::Missing;
    };
    // SAFETY: `c` is a NUL-terminated path; access() only checks it.
    let rc = unsafe { libc::access(c.as_ptr(), libc::R_OK | libc::W_OK) };
    if rc == 0 {
        return KfdAccess::Allowed;
    }
    let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
    KfdAccess::Denied {
        group: group_name(&groups, meta.gid()),
    }
}

/// The name of group `gid` in an `/etc/group` text.
pub(crate) fn group_name(etc_group: &str, gid: u32) -> Option<String> {
    etc_group.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        let id = f.nth(1)?.parse::<u32>().ok()?;
        (id == gid).then(|| name.to_owned())
    })
}

/// What a user denied `/dev/kfd` should do, naming the node's group.
pub(crate) fn permission_advice(group: Option<&str>) -> String {
    let owner = group.map_or_else(String::new, |g| format!(" (it belongs to the group {g})"));
    format!(
        "this user may not read and write it{owner}, so the HIP runtime sees no GPU; \
         add the user to the render and video groups (`sudo usermod -aG render,video $USER`) \
         and log in again"
    )
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

    #[test]
    fn gfx_overrides_parse_as_the_thunk_does() {
        assert_eq!(parse_gfx_override("11.0.0").as_deref(), Ok("gfx1100"));
        assert_eq!(parse_gfx_override("11.5.1").as_deref(), Ok("gfx1151"));
        assert_eq!(parse_gfx_override("9.0.10").as_deref(), Ok("gfx90a"));
        assert_eq!(parse_gfx_override("9.4.2").as_deref(), Ok("gfx942"));
        assert_eq!(parse_gfx_override("10.3.0").as_deref(), Ok("gfx1030"));
        for bad in [
            "11.0", "11.0.0.0", "11.0.0x", "gfx1100", "", "64.0.0", "9.256.0", "9.0.a", "-1.0.0",
        ] {
            let e = parse_gfx_override(bad).unwrap_err();
            assert!(e.contains("major.minor.stepping"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_per_node_override_wins_over_the_global_one() {
        let env = |v: &str| match v {
            "HSA_OVERRIDE_GFX_VERSION" => Some("11.0.0".to_owned()),
            "HSA_OVERRIDE_GFX_VERSION_2" => Some("11.0.1".to_owned()),
            _ => None,
        };
        let o = gfx_override_from(Some(2), &env).unwrap();
        assert_eq!(
            (o.var.as_str(), o.arch.as_deref()),
            ("HSA_OVERRIDE_GFX_VERSION_2", Ok("gfx1101"))
        );
        let o = gfx_override_from(Some(1), &env).unwrap();
        assert_eq!(
            (o.var.as_str(), o.arch.as_deref()),
            ("HSA_OVERRIDE_GFX_VERSION", Ok("gfx1100"))
        );
        let o = gfx_override_from(None, &env).unwrap();
        assert_eq!(o.value, "11.0.0");
        assert_eq!(gfx_override_from(Some(1), &|_| None), None);
        let bad = gfx_override_from(None, &|_| Some("11".to_owned())).unwrap();
        assert!(bad.arch.is_err());
    }

    #[test]
    fn kfd_access_and_its_advice() {
        assert_eq!(
            kfd_access(std::path::Path::new("/nonexistent/kfd")),
            KfdAccess::Missing
        );
        // A file this process may read and write.
        let f = std::env::temp_dir().join(format!("rocm-safe-kfd-{}", std::process::id()));
        std::fs::write(&f, b"").unwrap();
        assert_eq!(kfd_access(&f), KfdAccess::Allowed);
        std::fs::remove_file(&f).unwrap();
        let groups = "root:x:0:\nvideo:x:44:alice\nrender:x:992:\n";
        assert_eq!(group_name(groups, 992).as_deref(), Some("render"));
        assert_eq!(group_name(groups, 44).as_deref(), Some("video"));
        assert_eq!(group_name(groups, 7), None);
        let a = permission_advice(Some("render"));
        assert!(
            a.contains("group render") && a.contains("usermod -aG render,video"),
            "{a}"
        );
    }
}
