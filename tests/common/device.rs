//! What [`per_device!`](crate::per_device) runs: a test function of either
//! shape, on ordinal 0 of one backend.
//!
//! A test takes either the opened device (`fn name(dev: &Device)`) or a
//! backend opener (`fn name(open: Open<'_>)`), for tests that wrap the raw
//! backend (in [`Faults`](rocm_safe::device::faults::Faults), a tamperer)
//! and open a fresh one per case. The shape is told apart by the function's
//! signature: [`run`] takes anything that is [`DeviceTest`] for one of the
//! two marker types.

use rocm_safe::device::{
    raw::{open_backend, Backend},
    BackendKind, Device,
};

/// Opens a fresh backend of the kind under test, ordinal 0 (panics if it
/// cannot: a GPU test is only run where the GPU is).
pub type Open<'a> = &'a dyn Fn() -> Box<dyn Backend>;

/// Marker of tests taking `&Device`.
pub enum TakesDevice {}
/// Marker of tests taking an [`Open`].
pub enum TakesOpener {}

/// A per-device test body of shape `Shape`.
pub trait DeviceTest<Shape> {
    /// Runs the test on ordinal 0 of `kind`.
    fn run_on(self, kind: BackendKind);
}

impl<F: FnOnce(&Device)> DeviceTest<TakesDevice> for F {
    fn run_on(self, kind: BackendKind) {
        self(&device(kind))
    }
}

impl<F: FnOnce(Open<'_>)> DeviceTest<TakesOpener> for F {
    fn run_on(self, kind: BackendKind) {
        self(&move || backend(kind))
    }
}

/// Runs `test` on ordinal 0 of `kind`.
pub fn run<Shape>(kind: BackendKind, test: impl DeviceTest<Shape>) {
    test.run_on(kind)
}

/// Ordinal 0 of `kind`, opened.
pub fn device(kind: BackendKind) -> Device {
    Device::open(kind, 0).unwrap_or_else(|e| panic!("open {}:0: {e}", kind.name()))
}

/// A fresh backend of ordinal 0 of `kind`.
pub fn backend(kind: BackendKind) -> Box<dyn Backend> {
    open_backend(kind, 0).unwrap_or_else(|e| panic!("open {} backend 0: {e}", kind.name()))
}
