//! rocm-safe's development features, turned on: the doctor's engine
//! ([`rocm_safe::diagnostics`], feature `doctor`, re-exported here as
//! [`diagnostics`]) and fault injection ([`rocm_safe::device::faults`],
//! feature `testing`, re-exported as [`faults`]).
//!
//! rocm-safe lists this crate as a dev-dependency, so its examples and
//! tests have both while a crate that depends on rocm-safe compiles
//! neither. See `docs/internals.md`, "The doctor".
#![deny(missing_docs)]

pub use rocm_safe::device::faults;
pub use rocm_safe::diagnostics;

#[cfg(test)]
mod tests {
    #[test]
    fn the_engine_and_fault_injection_are_reachable_through_this_crate() {
        // The quick parts of a report, through the re-export.
        let env = super::diagnostics::read_env();
        assert!(env.iter().any(|v| v.name == "ROCM_SAFE_OFFLOAD_ARCH"));
        assert_eq!(super::diagnostics::SCHEMA_VERSION, 5);
        // And fault injection.
        let plan = super::faults::FaultPlan::default();
        assert!(format!("{plan:?}").contains("FaultPlan"));
    }
}
