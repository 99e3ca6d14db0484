//! Per-piece checks: host sums against the device's, and the read-back.
//!
//! The checks of each piece: the host's sums against the device's, and the
//! read-back. The policy applied is the staged check's rule
//! (`verify::staged`, which also queues each piece's device work: copy
//! check, conversion, output check; `Staging::policy`).

use super::source::{self, Item, Source, Sums};
use super::{Check, Failure};
use crate::convert::fingerprint::{self, finish};
use crate::device::{DeviceBuffer, DeviceViewMut};
use crate::error::Result;

/// [`Policy::ReadBack`](crate::verify::Policy::ReadBack): the device output
/// against the CPU's, byte for byte (the source is read again from the
/// file).
pub(super) fn readback(
    sources: &[Source],
    item: &Item,
    out: Option<&DeviceBuffer<u8>>,
) -> Result<Option<Failure>> {
    let Some(out) = out else { return Ok(None) };
    let got = out.to_vec()?;
    let src = source::of_item(sources, item)?;
    let mut raw = crate::alloc::tensor_bytes(&src.path, &item.name, item.src_bytes)?;
    item.pread(src, &mut raw, 0)?;
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

/// Two adjacent accumulators out of a split accumulator buffer.
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
