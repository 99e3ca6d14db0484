//! [`DeviceOptions`]: what a device is opened with. The environment is
//! read in one place, [`DeviceOptions::from_env`], which [`Device::open`]
//! uses; [`Device::open_with`] takes options from the caller and reads no
//! environment variable.

#[cfg(doc)]
use super::Device;

/// The environment variable [`DeviceOptions::from_env`] reads for
/// [`DeviceOptions::pinning`].
pub const PINNED_VAR: &str = "ROCM_SAFE_PINNED";

/// How a GPU device pins host memory for the loader's ring and other large
/// pinned buffers ([`Device::alloc_pinned`]). The host backend ignores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Pinning {
    /// Map huge pages, fault them in on the rayon pool, register them with
    /// the runtime (`register`, the default: 4-7x faster to pin than the
    /// runtime's allocator). Falls back to [`Pinning::HostAlloc`] for the
    /// rest of the device's life if the runtime refuses a registration.
    #[default]
    Register,
    /// The runtime's own pinned allocator (`hostalloc`).
    HostAlloc,
}

impl Pinning {
    /// Parses a [`PINNED_VAR`] value: `register` or `hostalloc` (any case,
    /// surrounding blanks ignored); unset and empty mean `register`; `None`
    /// for anything else.
    pub fn parse(v: Option<&str>) -> Option<Pinning> {
        match v.map(str::trim) {
            None | Some("") => Some(Pinning::Register),
            Some(s) if s.eq_ignore_ascii_case("register") => Some(Pinning::Register),
            Some(s) if s.eq_ignore_ascii_case("hostalloc") => Some(Pinning::HostAlloc),
            Some(_) => None,
        }
    }
}

/// What a device is opened with ([`Device::open_with`]). Non-exhaustive:
/// build it from [`DeviceOptions::default`] (no environment) or
/// [`DeviceOptions::from_env`] and the `with_*` methods.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceOptions {
    /// How large pinned host buffers are made.
    pub pinning: Pinning,
}

impl DeviceOptions {
    /// The options the environment asks for: the one place rocm-safe reads
    /// the device's environment variables. [`PINNED_VAR`]
    /// (`ROCM_SAFE_PINNED`): `register` (also unset) or `hostalloc`; any
    /// other value is logged and means `register`.
    pub fn from_env() -> DeviceOptions {
        let v = std::env::var(PINNED_VAR).ok();
        let pinning = Pinning::parse(v.as_deref()).unwrap_or_else(|| {
            tracing::warn!(value = ?v, "{PINNED_VAR}: expected `register` or `hostalloc`; using `register`");
            Pinning::Register
        });
        DeviceOptions { pinning }
    }

    /// How pinned host buffers are made.
    pub fn with_pinning(mut self, pinning: Pinning) -> Self {
        self.pinning = pinning;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_values() {
        assert_eq!(Pinning::parse(None), Some(Pinning::Register));
        assert_eq!(Pinning::parse(Some("")), Some(Pinning::Register));
        assert_eq!(Pinning::parse(Some("register")), Some(Pinning::Register));
        assert_eq!(
            Pinning::parse(Some(" HostAlloc ")),
            Some(Pinning::HostAlloc)
        );
        assert_eq!(Pinning::parse(Some("mmap")), None);
    }

    #[test]
    fn options_build() {
        let o = DeviceOptions::default();
        assert_eq!(o.pinning, Pinning::Register);
        assert_eq!(
            o.with_pinning(Pinning::HostAlloc).pinning,
            Pinning::HostAlloc
        );
    }
}
