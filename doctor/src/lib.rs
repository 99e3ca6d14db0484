//! The rocm-safe doctor's engine, [`rocm_safe::diagnostics`], re-exported.
//!
//! rocm-safe compiles its diagnostics only with its `doctor` feature; this
//! crate turns that feature on. rocm-safe itself lists this crate as a
//! dev-dependency, so its `doctor` example and its tests have the engine
//! while a crate that depends on rocm-safe does not compile it. See
//! `ARCHITECTURE.md`, "The doctor".
#![deny(missing_docs)]

pub use rocm_safe::diagnostics::*;

#[cfg(test)]
mod tests {
    #[test]
    fn the_engine_is_reachable_through_this_crate() {
        // The quick parts of a report, through the re-export.
        let env = super::read_env();
        assert!(env.iter().any(|v| v.name == "ROCM_SAFE_OFFLOAD_ARCH"));
        assert_eq!(super::SCHEMA_VERSION, 5);
    }
}
