//! Per-piece checks: the policy applied, host sums against the device's.
//!
//! The checks of each piece: the policy applied (the staged check's rule,
//! `verify::staged`, which also queues each piece's device work: copy
//! check, conversion, output check), the host's sums against the device's,
//! and the read-back.

use std::sync::Arc;

use super::source::{self, Item, Source, Sums};
use super::{Check, Failure, Loader};
use crate::convert::fingerprint::{self, finish};
use crate::device::{DeviceBuffer, DeviceViewMut};
use crate::error::Result;
use crate::verify::{self, staged, Policy};

impl Loader {
    /// The policy actually applied: the staged check's one rule
    /// (`verify::staged`) over every conversion of the load (without a
    /// trusted fingerprint kernel, fingerprints prove nothing, so the
    /// output is read back; without trusted fused kernels, the separate
    /// pass fingerprints it).
    pub(super) fn policy(&self) -> Policy {
        let st = self.device_self_test();
        staged::applied_policy(self.opts.policy, st.as_deref(), None)
    }

    /// Runs `work` while the device's self-test, when loading `items` calls
    /// for it and it has not run on this device yet, runs on a thread (and
    /// a stream) of its own: its few milliseconds (module loads, the
    /// patterns) overlap a first load's allocations. Returns `work`'s
    /// result with the self-test's report (`None` when the load does not
    /// call for one). Its error is the load's, as if it had run first.
    /// Where it ran already, or no thread or stream can be had, it runs (or
    /// is looked up) first, here.
    pub(super) fn during_self_test<R>(
        &mut self,
        items: &[Item],
        work: impl FnOnce(&mut Self) -> R,
    ) -> Result<(R, Option<Arc<verify::SelfTestReport>>)> {
        if !self.self_test_due(items) {
            return Ok((work(self), None));
        }
        let stream = if verify::self_test_cached(&self.device) {
            None
        } else {
            self.device.stream().ok()
        };
        std::thread::scope(|sc| {
            let test = stream.and_then(|s| {
                std::thread::Builder::new()
                    .name("rocm-safe-self-test".into())
                    .spawn_scoped(sc, move || verify::self_test(&s))
                    .ok()
            });
            let Some(test) = test else {
                let st = verify::self_test(&self.compute)?;
                return Ok((work(self), Some(st)));
            };
            let r = work(self);
            let st = match test.join() {
                Ok(t) => t?,
                // The thread panicked: run it again here.
                Err(_) => verify::self_test(&self.compute)?,
            };
            Ok((r, Some(st)))
        })
    }

    pub(super) fn device_self_test(&self) -> Option<std::sync::Arc<verify::SelfTestReport>> {
        if self.opts.self_test {
            verify::self_test(&self.compute).ok()
        } else {
            None
        }
    }

    /// [`Policy::ReadBack`]: the device output against the CPU's, byte for
    /// byte (the source is read again from the file).
    pub(super) fn readback(
        &self,
        sources: &[Source],
        item: &Item,
        out: Option<&DeviceBuffer<u8>>,
    ) -> Result<Option<Failure>> {
        let Some(out) = out else { return Ok(None) };
        let got = out.to_vec()?;
        let src = source::of_item(sources, item)?;
        let mut raw = crate::alloc::tensor_bytes(&src.path, &item.name, item.src_bytes)?;
        src.pread(&item.name, &mut raw, item.file_off)?;
        let want = source::cpu_output(&src.path, item, raw)?;
        if got == want {
            return Ok(None);
        }
        Ok(Some(Failure::FingerprintMismatch {
            check: Check::Output,
            expected: fingerprint::fingerprint_bytes(&want),
            actual: fingerprint::fingerprint_bytes(&got),
        }))
    }
}

pub(super) trait IntoPair<'a> {
    fn into_pair(self, at: usize) -> Result<(DeviceViewMut<'a, u64>, DeviceViewMut<'a, u64>)>;
}

impl<'a> IntoPair<'a> for (DeviceViewMut<'a, u64>, DeviceViewMut<'a, u64>) {
    /// From `(..=at, rest)`: element `at` and the element after it.
    fn into_pair(self, at: usize) -> Result<(DeviceViewMut<'a, u64>, DeviceViewMut<'a, u64>)> {
        let (head, tail) = self;
        let (_, a) = head.split_at_mut(at)?;
        let (b, _) = tail.split_at_mut(1)?;
        Ok((a, b))
    }
}

/// The copy and output checks of one piece: host sums against the device's.
pub(super) fn compare(sums: &Sums, item: &Item, len: usize, acc: [u64; 2]) -> Option<Failure> {
    let got_copy = finish(acc[0], len as u64);
    let got_out = finish(acc[1], item.out_len(len) as u64);
    if got_copy != sums.copy_fp(len) {
        return Some(Failure::FingerprintMismatch {
            check: Check::Copy,
            expected: sums.copy_fp(len),
            actual: got_copy,
        });
    }
    if got_out != sums.out_fp(item, len) {
        return Some(Failure::FingerprintMismatch {
            check: Check::Output,
            expected: sums.out_fp(item, len),
            actual: got_out,
        });
    }
    None
}
