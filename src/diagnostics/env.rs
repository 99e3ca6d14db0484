//! The environment variables that change how ROCm and PyTorch behave, their
//! current values, and advice per GPU architecture. The advice is data (the
//! [`ADVICE`] table), each line with its reason, so it can be reviewed and
//! extended without touching logic.

/// Variables `doctor` always reports (plus every `MIOPEN_DEBUG_*` that is set).
pub const WATCHED: &[&str] = &[
    "HSA_OVERRIDE_GFX_VERSION",
    "PYTORCH_ROCM_ARCH",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "PYTORCH_HIP_ALLOC_CONF",
    "PYTORCH_NO_HIP_MEMORY_CACHING",
    "MIOPEN_FIND_MODE",
    "ROCBLAS_USE_HIPBLASLT",
    "AMD_SERIALIZE_KERNEL",
    "HIP_LAUNCH_BLOCKING",
    "ROCM_SAFE_OFFLOAD_ARCH",
    "ROCM_SAFE_HIP_CLANG",
    "ROCM_SAFE_CODE_OBJECT_VERSION",
    "ROCM_SAFE_PINNED",
];

/// `HSA_OVERRIDE_GFX_VERSION` as the HIP runtime reads it: the arch whose
/// code object it loads instead of the GPU's own.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct GfxOverrideReport {
    /// The variable.
    pub var: String,
    /// Its value.
    pub value: String,
    /// The arch it names (`"gfx1100"` for `11.0.0`), when the value is
    /// valid and the `hip` feature is built.
    pub arch: Option<String>,
    /// Why no arch: the runtime refuses the value (the format expected), or
    /// the `hip` feature is off.
    pub error: Option<String>,
    /// Whether this build has a code object for `arch`.
    pub built_in: Option<bool>,
}

/// The `HSA_OVERRIDE_GFX_VERSION` in effect, if set.
#[cfg(feature = "hip")]
pub fn gfx_override() -> Option<GfxOverrideReport> {
    let o = crate::device::runtime::hip::gfx_override()?;
    let built = crate::device::runtime::hip::built_archs();
    Some(GfxOverrideReport {
        built_in: o.arch.as_ref().ok().map(|a| built.contains(&a.as_str())),
        arch: o.arch.as_ref().ok().cloned(),
        error: o.arch.err(),
        var: o.var,
        value: o.value,
    })
}

/// The `HSA_OVERRIDE_GFX_VERSION` in effect, if set (not interpreted: the
/// HIP backend is not built).
#[cfg(not(feature = "hip"))]
pub fn gfx_override() -> Option<GfxOverrideReport> {
    let value = std::env::var("HSA_OVERRIDE_GFX_VERSION")
        .ok()
        .filter(|v| !v.is_empty())?;
    Some(GfxOverrideReport {
        var: "HSA_OVERRIDE_GFX_VERSION".into(),
        value,
        arch: None,
        error: Some("not interpreted: cargo feature `hip` is off".into()),
        built_in: None,
    })
}

/// One variable and its value in this process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct EnvVar {
    /// The variable's name.
    pub name: String,
    /// Its value, or `None` when unset.
    pub value: Option<String>,
}

/// Reads the watched variables and every `MIOPEN_DEBUG_*` that is set.
pub fn read_env() -> Vec<EnvVar> {
    // `vars_os`, not `vars`: a variable whose name or value is not UTF-8
    // (any bytes are allowed) must not panic the doctor; such a name is
    // not one of ours and is skipped, such a value reads as unset.
    read_env_from(
        |k| std::env::var(k).ok(),
        std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()),
    )
}

/// [`read_env`] over any environment (for tests).
pub fn read_env_from(
    get: impl Fn(&str) -> Option<String>,
    names: impl Iterator<Item = String>,
) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = WATCHED
        .iter()
        .map(|n| EnvVar {
            name: (*n).to_owned(),
            value: get(n),
        })
        .collect();
    let mut debug: Vec<String> = names.filter(|n| n.starts_with("MIOPEN_DEBUG_")).collect();
    debug.sort();
    debug.dedup();
    out.extend(debug.into_iter().map(|n| EnvVar {
        value: get(&n),
        name: n,
    }));
    out
}

/// Architecture families the advice distinguishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ArchFamily {
    /// gfx1151: Strix Halo (Ryzen AI Max), RDNA 3.5 APU with unified memory.
    Gfx1151,
    /// gfx1150 (and gfx1152/gfx1153): Strix Point / Krackan, RDNA 3.5 APUs.
    Gfx1150,
    /// gfx1100-gfx1103: RDNA 3.
    Rdna3,
    /// gfx1200/gfx1201: RDNA 4.
    Rdna4,
    /// gfx908, gfx90a, gfx94x, gfx95x: CDNA (Instinct).
    Cdna,
    /// Anything else (older GCN/RDNA, unknown).
    Other,
}

impl ArchFamily {
    /// The family of a gfx target name (`"gfx1151"`, `"gfx90a:sramecc+"`).
    pub fn of(arch: &str) -> ArchFamily {
        let base = arch.split(':').next().unwrap_or(arch);
        match base {
            "gfx1151" => ArchFamily::Gfx1151,
            "gfx1150" | "gfx1152" | "gfx1153" => ArchFamily::Gfx1150,
            "gfx1100" | "gfx1101" | "gfx1102" | "gfx1103" => ArchFamily::Rdna3,
            "gfx1200" | "gfx1201" => ArchFamily::Rdna4,
            "gfx908" | "gfx90a" | "gfx940" | "gfx941" | "gfx942" | "gfx950" => ArchFamily::Cdna,
            _ => ArchFamily::Other,
        }
    }

    #[cfg(test)] // used by the unit tests only
    /// Whether the GPU shares system RAM (an APU).
    pub const fn is_apu(self) -> bool {
        matches!(self, ArchFamily::Gfx1151 | ArchFamily::Gfx1150)
    }
}

/// What to do with a variable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Action {
    /// Leave it unset.
    Unset,
    /// Set it to the device's gfx target (e.g. `gfx1151`).
    SetToArch,
    /// Set it to the given value.
    Set(&'static str),
    /// Worth considering; the reason says when.
    Consider(&'static str),
}

/// One line of advice: for these families, do this with that variable, because.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdviceRule {
    /// The families it applies to.
    pub families: &'static [ArchFamily],
    /// The variable (a trailing `*` matches a prefix).
    pub variable: &'static str,
    /// What to do.
    pub action: Action,
    /// Why.
    pub reason: &'static str,
}

use ArchFamily::*;

const ALL_AMD: &[ArchFamily] = &[Gfx1151, Gfx1150, Rdna3, Rdna4, Cdna, Other];
const NATIVE: &[ArchFamily] = &[Gfx1151, Gfx1150, Rdna4, Cdna];
const APU: &[ArchFamily] = &[Gfx1151, Gfx1150];
const DISCRETE: &[ArchFamily] = &[Rdna3, Rdna4, Cdna];

/// The advice table.
pub const ADVICE: &[AdviceRule] = &[
    AdviceRule {
        families: NATIVE,
        variable: "HSA_OVERRIDE_GFX_VERSION",
        action: Action::Unset,
        reason: "it makes the runtime report another gfx target and load code objects built for \
                 that ISA; on gfx1151 the common 11.0.0 runs gfx1100 kernels, which crash or \
                 compute wrong values. ROCm builds with native code objects for this arch need no \
                 override",
    },
    AdviceRule {
        families: ALL_AMD,
        variable: "PYTORCH_ROCM_ARCH",
        action: Action::SetToArch,
        reason: "extensions (and rocm-safe's build.rs) compile kernels for exactly these targets; \
                 a missing target means 'invalid device function' at the first launch",
    },
    AdviceRule {
        families: ALL_AMD,
        variable: "AMD_SERIALIZE_KERNEL",
        action: Action::Unset,
        reason: "it serialises kernel launches; a debugging aid that costs throughput",
    },
    AdviceRule {
        families: ALL_AMD,
        variable: "HIP_LAUNCH_BLOCKING",
        action: Action::Unset,
        reason: "it makes every launch synchronous; for debugging only",
    },
    AdviceRule {
        families: APU,
        variable: "PYTORCH_NO_HIP_MEMORY_CACHING",
        action: Action::Consider("1"),
        reason: "on an APU the GPU's memory is system RAM: blocks PyTorch's caching allocator \
                 keeps are RAM nothing else can use. 1 returns them at once, at the cost of \
                 slower allocation",
    },
    AdviceRule {
        families: DISCRETE,
        variable: "PYTORCH_NO_HIP_MEMORY_CACHING",
        action: Action::Unset,
        reason: "the caching allocator avoids a hipMalloc/hipFree per tensor; disabling it only \
                 helps when hunting memory errors",
    },
    AdviceRule {
        families: APU,
        variable: "PYTORCH_HIP_ALLOC_CONF",
        action: Action::Consider("garbage_collection_threshold:0.8"),
        reason: "it reclaims cached blocks before the pool is exhausted, so a large allocation on \
                 shared memory does not fail while freed blocks sit in the cache",
    },
    AdviceRule {
        families: ALL_AMD,
        variable: "MIOPEN_FIND_MODE",
        action: Action::Consider("FAST"),
        reason: "it uses the find database and immediate mode instead of benchmarking solvers on \
                 the first use of each shape: video VAEs with many conv3d shapes stall far less \
                 on their first iteration",
    },
    AdviceRule {
        families: ALL_AMD,
        variable: "MIOPEN_DEBUG_*",
        action: Action::Unset,
        reason: "debug switches disable MIOpen solvers; a leftover one can leave a conv3d with \
                 no applicable algorithm (rocm-safe's conv3d chain then falls back, but slowly)",
    },
    AdviceRule {
        families: ALL_AMD,
        variable: "ROCBLAS_USE_HIPBLASLT",
        action: Action::Consider("1"),
        reason: "it routes GEMMs to hipBLASLt; its coverage and speed differ by arch and ROCm \
                 release, so measure both settings",
    },
];

/// Whether the current value already follows an action.
fn follows(action: Action, arch: &str, value: Option<&str>) -> bool {
    match action {
        Action::Unset => value.is_none_or(str::is_empty),
        Action::SetToArch => value.is_some_and(|v| {
            let base = arch.split(':').next().unwrap_or(arch);
            v.split([';', ',', ' '])
                .any(|a| a.split(':').next() == Some(base))
        }),
        Action::Set(want) => value == Some(want),
        Action::Consider(_) => true,
    }
}

/// One piece of advice for one device, with whether it is already followed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct Advice {
    /// The device's gfx target.
    pub arch: String,
    /// The variable.
    pub variable: String,
    /// Its current value.
    pub current: Option<String>,
    /// What to do, in words (`unset`, `set to gfx1151`, `consider FAST`).
    pub recommendation: String,
    /// Whether the current value already follows it (`consider` lines: true).
    pub ok: bool,
    /// Why.
    pub reason: String,
}

/// The advice for a device of `arch`, given the environment `env`.
pub fn advise(arch: &str, env: &[EnvVar]) -> Vec<Advice> {
    let family = ArchFamily::of(arch);
    let mut out = Vec::new();
    for rule in ADVICE.iter().filter(|r| r.families.contains(&family)) {
        let recommendation = match rule.action {
            Action::Unset => "unset".to_owned(),
            Action::SetToArch => {
                format!("set to include {}", arch.split(':').next().unwrap_or(arch))
            }
            Action::Set(v) => format!("set to {v}"),
            Action::Consider(v) => format!("consider {v}"),
        };
        let matching: Vec<&EnvVar> = match rule.variable.strip_suffix('*') {
            Some(prefix) => env.iter().filter(|e| e.name.starts_with(prefix)).collect(),
            None => env.iter().filter(|e| e.name == rule.variable).collect(),
        };
        if matching.is_empty() && rule.variable.ends_with('*') {
            continue; // no MIOPEN_DEBUG_* set: nothing to say
        }
        let vars: Vec<(String, Option<String>)> = if matching.is_empty() {
            vec![(rule.variable.to_owned(), None)]
        } else {
            matching
                .iter()
                .map(|e| (e.name.clone(), e.value.clone()))
                .collect()
        };
        for (variable, current) in vars {
            out.push(Advice {
                arch: arch.to_owned(),
                ok: follows(rule.action, arch, current.as_deref()),
                variable,
                current,
                recommendation: recommendation.clone(),
                reason: rule.reason.to_owned(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<EnvVar> {
        let get = |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        read_env_from(get, pairs.iter().map(|(n, _)| (*n).to_owned()))
    }

    #[test]
    fn families() {
        assert_eq!(ArchFamily::of("gfx1151"), Gfx1151);
        assert_eq!(ArchFamily::of("gfx90a:sramecc+:xnack-"), Cdna);
        assert_eq!(ArchFamily::of("gfx1201"), Rdna4);
        assert_eq!(ArchFamily::of("gfx1152"), Gfx1150);
        assert_eq!(ArchFamily::of("sm_90"), Other);
        assert!(Gfx1151.is_apu() && !Cdna.is_apu());
    }

    #[test]
    fn override_on_gfx1151_is_flagged_and_unset_is_fine() {
        let bad = advise("gfx1151", &env(&[("HSA_OVERRIDE_GFX_VERSION", "11.0.0")]));
        let line = bad
            .iter()
            .find(|a| a.variable == "HSA_OVERRIDE_GFX_VERSION")
            .unwrap();
        assert!(!line.ok);
        assert_eq!(line.current.as_deref(), Some("11.0.0"));
        assert!(line.reason.contains("gfx1100"));
        let good = advise("gfx1151", &env(&[]));
        assert!(
            good.iter()
                .find(|a| a.variable == "HSA_OVERRIDE_GFX_VERSION")
                .unwrap()
                .ok
        );
    }

    #[test]
    fn rocm_arch_must_include_the_device() {
        let a = advise("gfx1151", &env(&[("PYTORCH_ROCM_ARCH", "gfx1100;gfx1151")]));
        assert!(
            a.iter()
                .find(|a| a.variable == "PYTORCH_ROCM_ARCH")
                .unwrap()
                .ok
        );
        let a = advise("gfx1151", &env(&[("PYTORCH_ROCM_ARCH", "gfx1100")]));
        assert!(
            !a.iter()
                .find(|a| a.variable == "PYTORCH_ROCM_ARCH")
                .unwrap()
                .ok
        );
        let a = advise("gfx90a:sramecc+", &env(&[("PYTORCH_ROCM_ARCH", "gfx90a")]));
        assert!(
            a.iter()
                .find(|a| a.variable == "PYTORCH_ROCM_ARCH")
                .unwrap()
                .ok
        );
    }

    #[test]
    fn miopen_debug_switches_are_listed_only_when_set() {
        let none = advise("gfx1100", &env(&[]));
        assert!(!none.iter().any(|a| a.variable.starts_with("MIOPEN_DEBUG_")));
        let set = advise("gfx1100", &env(&[("MIOPEN_DEBUG_CONV_DIRECT", "0")]));
        let line = set
            .iter()
            .find(|a| a.variable == "MIOPEN_DEBUG_CONV_DIRECT")
            .unwrap();
        assert!(!line.ok);
    }

    #[test]
    fn apu_and_discrete_get_opposite_caching_advice() {
        let apu = advise("gfx1151", &env(&[]));
        let dgpu = advise("gfx1100", &env(&[]));
        let caching = |v: &[Advice]| {
            v.iter()
                .find(|a| a.variable == "PYTORCH_NO_HIP_MEMORY_CACHING")
                .unwrap()
                .recommendation
                .clone()
        };
        assert_eq!(caching(&apu), "consider 1");
        assert_eq!(caching(&dgpu), "unset");
    }

    #[test]
    fn every_rule_has_a_reason_and_a_family() {
        for r in ADVICE {
            assert!(r.reason.len() > 20, "{}", r.variable);
            assert!(!r.families.is_empty(), "{}", r.variable);
        }
        // Every variable named by a rule is reported by read_env.
        for r in ADVICE.iter().filter(|r| !r.variable.ends_with('*')) {
            assert!(WATCHED.contains(&r.variable), "{}", r.variable);
        }
    }
}
