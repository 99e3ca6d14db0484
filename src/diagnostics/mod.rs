//! Diagnostics: platform facts and self-tests, the engine behind the
//! `doctor` example. Everything is plain data that serialises to JSON with
//! stable field names.

pub mod platform;
pub mod selftest;

pub use platform::{Library, Platform};
pub use selftest::{cpu_self_tests, SelfTest, Verdict};

/// The complete doctor report.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Report {
    /// Version of the report's JSON layout; bumped when a field changes meaning.
    pub schema_version: u32,
    /// rocm-safe's version.
    pub crate_version: String,
    /// Cargo features this build was compiled with.
    pub features: Vec<String>,
    /// Platform facts.
    pub platform: Platform,
    /// Self-test results, CPU first.
    pub self_tests: Vec<SelfTest>,
}

impl Report {
    /// Detects the platform and runs every self-test.
    pub fn collect() -> Report {
        let mut features = Vec::new();
        if cfg!(feature = "hip") {
            features.push("hip".to_owned());
        }
        if cfg!(feature = "cuda") {
            features.push("cuda".to_owned());
        }
        Report {
            schema_version: 1,
            crate_version: env!("CARGO_PKG_VERSION").to_owned(),
            features,
            platform: Platform::detect(),
            self_tests: cpu_self_tests(),
        }
    }

    /// Whether every self-test passed.
    pub fn all_passed(&self) -> bool {
        self.self_tests.iter().all(|t| t.verdict == Verdict::Pass)
    }
}
