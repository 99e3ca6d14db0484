//! `HIP_VISIBLE_DEVICES` / `CUDA_VISIBLE_DEVICES`: the runtimes apply them;
//! [`VisibleDevices`] only reports which physical device an ordinal maps
//! to. A leaf (it names nothing of the crate), so that
//! [`Error::NoDevice`](crate::Error::NoDevice) can carry it.

use std::fmt;

/// The device-visibility variable in effect for a backend, and what one
/// ordinal maps to under it (`HIP_VISIBLE_DEVICES`, `CUDA_VISIBLE_DEVICES`:
/// the runtimes apply them; this only reports which physical device an
/// ordinal maps to).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct VisibleDevices {
    /// The variable the runtime reads (`HIP_VISIBLE_DEVICES`,
    /// `CUDA_VISIBLE_DEVICES`), or empty for the host backend.
    pub var: &'static str,
    /// Its value, when set.
    pub value: Option<String>,
    /// The entry of the list the ordinal maps to (a physical index or UUID),
    /// when the variable is set and has that many entries.
    pub physical: Option<String>,
}

impl VisibleDevices {
    /// No visibility variable (host backend).
    pub fn none() -> VisibleDevices {
        VisibleDevices::default()
    }

    /// Reads `var` and maps `ordinal` to its entry (comma separated, blanks
    /// trimmed). Only `var` is reported: HIP also applies
    /// `ROCR_VISIBLE_DEVICES` below it, which this does not model.
    pub fn read(var: &'static str, ordinal: Option<usize>) -> VisibleDevices {
        let value = std::env::var(var).ok();
        let physical = match (&value, ordinal) {
            (Some(v), Some(i)) => v
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .nth(i)
                .map(str::to_owned),
            _ => None,
        };
        VisibleDevices {
            var,
            value,
            physical,
        }
    }
}

impl fmt::Display for VisibleDevices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.var.is_empty() {
            return f.write_str("no visibility variable");
        }
        match (&self.value, &self.physical) {
            (None, _) => write!(f, "{} unset", self.var),
            (Some(v), Some(p)) => write!(f, "{}={v:?}, maps to {p}", self.var),
            (Some(v), None) => write!(f, "{}={v:?}", self.var),
        }
    }
}
