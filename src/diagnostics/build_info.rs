//! What this build compiled for HIP (the gfx archs, the compiler, the code
//! object version, as `build.rs` recorded them) and, per HIP device,
//! whether its arch is among them, with the command that rebuilds with it.

/// `build.rs`'s record (`$OUT_DIR/hip_build.rs`, written on every build:
/// empty without the `hip` feature or with `DOCS_RS` set).
mod generated {
    include!(concat!(env!("OUT_DIR"), "/hip_build.rs"));
}

/// The command that builds and runs the doctor with the HIP backend.
pub const HIP_DOCTOR_COMMAND: &str = "cargo run --release --features hip --example doctor";

/// The command that installs the Python package with the HIP backend, from
/// a checkout of the repository (the package is built from source).
pub const HIP_PIP_COMMAND: &str = "MATURIN_PEP517_ARGS=\"--features hip\" pip install ./python";

/// Who reads the report, which decides how its commands are written: a
/// Rust user runs cargo in a checkout, a Python user reinstalls the package
/// with pip. Not part of the JSON (the commands in it are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Audience {
    /// `cargo run --release --features hip --example doctor`.
    #[default]
    Cargo,
    /// `MATURIN_PEP517_ARGS="--features hip" pip install ./python`.
    Pip,
}

impl Audience {
    /// The command that rebuilds with the HIP backend, for the gfx targets
    /// `archs` (comma-separated; `None`: the build's default list).
    pub fn hip_rebuild(self, archs: Option<&str>) -> String {
        let command = match self {
            Audience::Cargo => HIP_DOCTOR_COMMAND,
            Audience::Pip => HIP_PIP_COMMAND,
        };
        match archs {
            Some(a) => format!("ROCM_SAFE_OFFLOAD_ARCH={a} {command}"),
            None => command.to_owned(),
        }
    }
}

/// The HIP side of this build, and whether it covers the HIP devices seen.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct HipBuild {
    /// Whether the `hip` cargo feature is on.
    pub built: bool,
    /// The gfx archs this build has code objects for (`["gfx1151", ...]`).
    pub archs: Vec<String>,
    /// The compiler that built them, its version and how it was driven;
    /// `None` without `hip`.
    pub compiler: Option<String>,
    /// The code object version they were built for (pinned by `build.rs`).
    pub code_object_version: Option<u32>,
    /// Archs of the default list that the compiler could not target (left
    /// out of this build; a newer compiler builds them).
    pub left_out: Vec<String>,
    /// Each HIP device and whether its arch is among `archs`.
    pub devices: Vec<HipDeviceBuild>,
    /// When `hip` is off, or a device's arch is not among `archs`: the
    /// command that rebuilds (and runs) the doctor with what is missing.
    pub rebuild_command: Option<String>,
}

/// One HIP device against this build.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct HipDeviceBuild {
    /// HIP ordinal.
    pub ordinal: usize,
    /// The device's gfx arch.
    pub arch: String,
    /// Whether this build has a code object for it.
    pub built: bool,
}

#[cfg(all(test, feature = "hip"))] // used by the unit tests only
/// The code object version `build.rs` pinned (`None` without `hip`).
pub fn code_object_version() -> Option<u32> {
    generated::CODE_OBJECT_VERSION
}

/// The compiler an arch needs, from what `build.rs` knows and CI checks:
/// the gfx9 archs before gfx940 and gfx103x build with any HIP compiler
/// (Debian's hipcc 5.2 too); gfx940-942, gfx11 and gfx12 need clang >= 19
/// with lld or ROCm >= 6.
pub fn compiler_needed(arch: &str) -> &'static str {
    let base = arch.split(':').next().unwrap_or(arch);
    match base {
        "gfx900" | "gfx906" | "gfx908" | "gfx90a" | "gfx1030" | "gfx1031" | "gfx1032" => {
            "any HIP compiler (Debian's hipcc 5.2, clang >= 15, ROCm)"
        }
        _ => "clang >= 19 with lld (`apt install clang-19 lld-19`) or ROCm >= 6",
    }
}

/// The command that rebuilds for the HIP devices seen: with the `hip`
/// feature when it is off (for the devices' archs when there are some), or
/// for every device's arch when one has no kernels in this build; `None`
/// when nothing needs rebuilding.
fn rebuild_command(built: bool, devices: &[HipDeviceBuild], audience: Audience) -> Option<String> {
    // Every device's arch, so the rebuild serves them all.
    let mut want: Vec<&str> = devices
        .iter()
        .map(|d| d.arch.split(':').next().unwrap_or(&d.arch))
        .filter(|a| *a != "unknown")
        .collect();
    want.sort_unstable();
    want.dedup();
    let archs = if !want.is_empty() {
        Some(want.join(","))
    } else if !devices.is_empty() {
        // Devices whose arch nobody could tell.
        Some("<your gfx arch>".to_owned())
    } else {
        None
    };
    if !built || devices.iter().any(|d| !d.built) {
        Some(audience.hip_rebuild(archs.as_deref()))
    } else {
        None
    }
}

impl HipBuild {
    /// The rebuild command written for `audience` (the report is collected
    /// with cargo's; see [`Report::for_audience`](super::Report::for_audience)).
    pub fn retarget(&mut self, audience: Audience) {
        self.rebuild_command = rebuild_command(self.built, &self.devices, audience);
    }

    /// This build's record, checked against the HIP devices `(ordinal,
    /// arch)` seen on this machine.
    pub fn for_devices(devices: &[(usize, String)]) -> HipBuild {
        Self::from_parts(
            cfg!(feature = "hip"),
            generated::ARCHS,
            generated::COMPILER,
            generated::CODE_OBJECT_VERSION,
            generated::LEFT_OUT,
            devices,
        )
    }

    fn from_parts(
        built: bool,
        archs: &[&str],
        compiler: Option<&str>,
        code_object_version: Option<u32>,
        left_out: &[&str],
        devices: &[(usize, String)],
    ) -> HipBuild {
        let devices: Vec<HipDeviceBuild> = devices
            .iter()
            .map(|(ordinal, arch)| {
                let base = arch.split(':').next().unwrap_or(arch);
                HipDeviceBuild {
                    ordinal: *ordinal,
                    arch: arch.clone(),
                    built: archs.contains(&base),
                }
            })
            .collect();
        let rebuild_command = rebuild_command(built, &devices, Audience::Cargo);
        HipBuild {
            built,
            archs: archs.iter().map(|a| a.to_string()).collect(),
            compiler: compiler.map(str::to_owned),
            code_object_version,
            left_out: left_out.iter().map(|a| a.to_string()).collect(),
            devices,
            rebuild_command,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_built_says_the_command_to_run() {
        let b = HipBuild::from_parts(false, &[], None, None, &[], &[]);
        assert!(!b.built && b.archs.is_empty() && b.compiler.is_none());
        assert_eq!(b.rebuild_command.as_deref(), Some(HIP_DOCTOR_COMMAND));
    }

    #[test]
    fn a_device_arch_not_built_gets_the_rebuild_command() {
        let devices = [
            (0, "gfx1151".to_owned()),
            (1, "gfx90a:sramecc+:xnack-".to_owned()),
        ];
        let b = HipBuild::from_parts(
            true,
            &["gfx90a", "gfx1030"],
            Some("hipcc (HIP 5.2.21153)"),
            Some(4),
            &["gfx1151"],
            &devices,
        );
        assert_eq!(
            b.devices.iter().map(|d| d.built).collect::<Vec<_>>(),
            [false, true]
        );
        assert_eq!(
            b.rebuild_command.as_deref(),
            Some("ROCM_SAFE_OFFLOAD_ARCH=gfx1151,gfx90a cargo run --release --features hip --example doctor")
        );
        let ok = HipBuild::from_parts(
            true,
            &["gfx1151"],
            Some("clang"),
            Some(5),
            &[],
            &devices[..1],
        );
        assert_eq!(ok.rebuild_command, None);
        assert!(ok.devices[0].built);
    }

    #[test]
    fn a_pip_user_gets_a_pip_command_for_the_same_archs() {
        let devices = [(0, "gfx1151".to_owned())];
        let mut b = HipBuild::from_parts(true, &["gfx90a"], None, Some(5), &[], &devices);
        b.retarget(Audience::Pip);
        assert_eq!(
            b.rebuild_command.as_deref(),
            Some("ROCM_SAFE_OFFLOAD_ARCH=gfx1151 MATURIN_PEP517_ARGS=\"--features hip\" pip install ./python")
        );
        b.retarget(Audience::Cargo);
        assert_eq!(
            b.rebuild_command.as_deref(),
            Some("ROCM_SAFE_OFFLOAD_ARCH=gfx1151 cargo run --release --features hip --example doctor")
        );
        let mut none = HipBuild::from_parts(false, &[], None, None, &[], &[]);
        none.retarget(Audience::Pip);
        assert_eq!(none.rebuild_command.as_deref(), Some(HIP_PIP_COMMAND));
    }

    #[test]
    fn a_device_of_unknown_arch_gets_no_rebuild_for_an_arch_called_unknown() {
        let devices = [(0, "unknown".to_owned())];
        let b = HipBuild::from_parts(true, &["gfx1151"], None, Some(5), &[], &devices);
        assert_eq!(
            b.rebuild_command.as_deref(),
            Some("ROCM_SAFE_OFFLOAD_ARCH=<your gfx arch> cargo run --release --features hip --example doctor")
        );
    }

    #[test]
    fn this_build_is_described() {
        let b = HipBuild::for_devices(&[]);
        assert_eq!(b.built, cfg!(feature = "hip"));
        // With `hip` (and no DOCS_RS) the compiler and archs are recorded.
        if b.built && b.compiler.is_some() {
            assert!(!b.archs.is_empty());
            assert!(b.code_object_version.is_some());
        }
        if !b.built {
            assert!(b.archs.is_empty() && b.compiler.is_none());
        }
        assert!(compiler_needed("gfx1151").contains("clang-19"));
        assert!(compiler_needed("gfx90a").contains("hipcc 5.2"));
    }
}
