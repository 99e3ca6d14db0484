//! Platform facts: OS, kernel, CPU, memory, and which GPU runtime libraries
//! the dynamic loader can find. Everything is read from `/proc`, `/etc` and
//! the loader; nothing here needs a GPU or a feature flag.

use std::ffi::CString;

/// What the machine is, as far as rocm-safe cares.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Platform {
    /// Operating system (`PRETTY_NAME` of /etc/os-release, else the target OS).
    pub os: String,
    /// Kernel release (`/proc/sys/kernel/osrelease`), if readable.
    pub kernel: Option<String>,
    /// CPU model name (`/proc/cpuinfo`), if readable.
    pub cpu: Option<String>,
    /// Logical cores this process may use.
    pub cores: usize,
    /// Total memory in bytes (`MemTotal`), if readable.
    pub memory_total_bytes: Option<u64>,
    /// Available memory in bytes (`MemAvailable`), if readable.
    pub memory_available_bytes: Option<u64>,
    /// The HIP runtime library (libamdhip64), if the loader finds it.
    pub hip_runtime: Option<Library>,
    /// The CUDA driver library (libcuda), if the loader finds it.
    pub cuda_driver: Option<Library>,
    /// The NVRTC library, if the loader finds it.
    pub nvrtc: Option<Library>,
}

/// A shared library the dynamic loader could open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Library {
    /// The soname that was opened (`libamdhip64.so.5`, ...).
    pub soname: String,
    /// The file it resolved to, if the loader reports it.
    pub path: Option<String>,
}

impl Platform {
    /// Reads the platform facts. Never fails: what cannot be read is `None`.
    pub fn detect() -> Platform {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        Platform {
            os: os_name(),
            kernel: read_trimmed("/proc/sys/kernel/osrelease"),
            cpu: cpu_model(),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_total_bytes: meminfo_field(&meminfo, "MemTotal:"),
            memory_available_bytes: meminfo_field(&meminfo, "MemAvailable:"),
            hip_runtime: find_library(&["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"]),
            cuda_driver: find_library(&["libcuda.so", "libcuda.so.1"]),
            nvrtc: find_library(&[
                "libnvrtc.so",
                "libnvrtc.so.13",
                "libnvrtc.so.12",
                "libnvrtc.so.11.2",
            ]),
        }
    }
}

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

fn os_name() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("PRETTY_NAME="))
                .map(|v| v.trim_matches('"').to_owned())
        })
        .unwrap_or_else(|| std::env::consts::OS.to_owned())
}

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

/// Parses a `/proc/meminfo` field given in kB into bytes.
pub(crate) fn meminfo_field(meminfo: &str, key: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

/// Opens the first of `sonames` the dynamic loader can find, reports where it
/// resolved, and closes it again.
fn find_library(sonames: &[&str]) -> Option<Library> {
    sonames.iter().find_map(|name| {
        let c = CString::new(*name).ok()?;
        // SAFETY: `c` is a valid NUL-terminated string that outlives the call;
        // RTLD_LAZY defers symbol resolution, so no library code beyond its
        // initialisers runs, and the handle is closed below.
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if handle.is_null() {
            return None;
        }
        let path = library_path(handle);
        // SAFETY: `handle` came from a successful dlopen above and is closed
        // exactly once; nothing obtained through it is used afterwards.
        unsafe { libc::dlclose(handle) };
        Some(Library {
            soname: (*name).to_owned(),
            path,
        })
    })
}

#[cfg(target_os = "linux")]
fn library_path(handle: *mut libc::c_void) -> Option<String> {
    let mut map: *mut libc::c_void = std::ptr::null_mut();
    // SAFETY: `handle` is a live dlopen handle; RTLD_DI_LINKMAP writes a
    // `struct link_map *` into `map`, which we pass as a pointer to a pointer.
    let rc = unsafe {
        libc::dlinfo(
            handle,
            libc::RTLD_DI_LINKMAP,
            (&mut map as *mut *mut libc::c_void).cast(),
        )
    };
    if rc != 0 || map.is_null() {
        return None;
    }
    // glibc's link_map starts with `ElfW(Addr) l_addr; char *l_name;`.
    #[repr(C)]
    struct LinkMapHead {
        l_addr: usize,
        l_name: *const libc::c_char,
    }
    // SAFETY: dlinfo succeeded, so `map` points to the loader's live link_map
    // for this handle, whose first two fields have the layout above; the handle
    // is still open, so the name string is alive while we copy it.
    let name = unsafe {
        let head = &*(map as *const LinkMapHead);
        if head.l_name.is_null() {
            return None;
        }
        std::ffi::CStr::from_ptr(head.l_name)
    };
    let s = name.to_string_lossy().into_owned();
    (!s.is_empty()).then_some(s)
}

#[cfg(not(target_os = "linux"))]
fn library_path(_handle: *mut libc::c_void) -> Option<String> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parsing() {
        let m = "MemTotal:       24576000 kB\nMemAvailable:    1000 kB\nBad: x kB\n";
        assert_eq!(meminfo_field(m, "MemTotal:"), Some(24_576_000 * 1024));
        assert_eq!(meminfo_field(m, "MemAvailable:"), Some(1_024_000));
        assert_eq!(meminfo_field(m, "Bad:"), None);
        assert_eq!(meminfo_field(m, "Missing:"), None);
    }

    #[test]
    fn detect_reads_this_machine() {
        let p = Platform::detect();
        assert!(p.cores >= 1);
        assert!(!p.os.is_empty());
        if cfg!(target_os = "linux") {
            assert!(p.memory_total_bytes.unwrap_or(0) > 0);
            assert!(p.kernel.is_some());
        }
    }

    #[test]
    fn loader_finds_libc_and_not_nonsense() {
        let libc = find_library(&["libc.so.6"]).expect("libc is loadable");
        assert_eq!(libc.soname, "libc.so.6");
        if cfg!(target_os = "linux") {
            assert!(libc.path.as_deref().unwrap_or("").contains("libc"));
        }
        assert_eq!(find_library(&["librocm-safe-does-not-exist.so"]), None);
    }
}
