//! The one way the tests wrap a backend in fault injection: [`faulty`],
//! over a backend opener or a backend, with a plan or its rules.

use rocm_safe::device::faults::{FaultHandle, FaultKind, FaultPlan, FaultRule, Faults, When};
use rocm_safe::device::host::HostBackend;
use rocm_safe::device::{raw::Backend, Device};

/// What [`faulty`] wraps: a backend opener (`Open`, or any `&Fn`) or the
/// host backend.
pub trait Target {
    fn backend(self) -> Box<dyn Backend>;
}

impl<F: Fn() -> Box<dyn Backend> + ?Sized> Target for &F {
    fn backend(self) -> Box<dyn Backend> {
        self()
    }
}

impl Target for HostBackend {
    fn backend(self) -> Box<dyn Backend> {
        Box::new(self)
    }
}

/// What [`faulty`] injects: a plan, `(kind, when)` (`FaultPlan::one`,
/// seed 0), or rules with seed 7 (`&[(kind, when), ...]`) or a seed of
/// their own (`(seed, &[...])`).
pub trait Rules {
    fn plan(self) -> FaultPlan;
}

impl Rules for FaultPlan {
    fn plan(self) -> FaultPlan {
        self
    }
}

impl Rules for (FaultKind, When) {
    fn plan(self) -> FaultPlan {
        FaultPlan::one(self.0, self.1)
    }
}

impl Rules for (u64, &[(FaultKind, When)]) {
    fn plan(self) -> FaultPlan {
        FaultPlan {
            seed: self.0,
            rules: self
                .1
                .iter()
                .map(|&(kind, when)| FaultRule { kind, when })
                .collect(),
        }
    }
}

impl<const N: usize> Rules for (u64, &[(FaultKind, When); N]) {
    fn plan(self) -> FaultPlan {
        (self.0, &self.1[..]).plan()
    }
}

impl<const N: usize> Rules for &[(FaultKind, When); N] {
    fn plan(self) -> FaultPlan {
        (7, &self[..]).plan()
    }
}

impl Rules for &[(FaultKind, When)] {
    fn plan(self) -> FaultPlan {
        (7, self).plan()
    }
}

/// A device over a fresh backend of `target` that injects `rules`, and the
/// handle that turns them on and off and reads what was injected.
pub fn faulty(target: impl Target, rules: impl Rules) -> (Device, FaultHandle) {
    let (f, h) = Faults::new(target.backend(), rules.plan());
    (Device::from_backend(Box::new(f)), h)
}
