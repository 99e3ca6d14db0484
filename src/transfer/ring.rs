//! The pinned ring: its device slots and pinned buffers, and how it grows.
//!
//! Every device slot is made at once; the pinned buffers come from a
//! [`Grower`] (`grow.rs`, which knows nothing of the ring) and join the
//! pass (`pass.rs`) as they are pinned. The ring is the loader's, kept
//! between loads.

use std::ops::Range;

use super::grow::{Grower, Grown};
use super::plan::MAX_PIECES;
use crate::device::{Device, DeviceBuffer, Event, PinnedBuffer, Stream};
use crate::error::{Error, Result};

/// The device side of one ring slot (also the staging of the lower rungs).
pub(super) struct Slot {
    /// The staged bytes, copied from a pinned buffer.
    pub stage: DeviceBuffer<u8>,
    /// Fingerprint sums of each piece: copy, output.
    pub acc: DeviceBuffer<u64>,
    /// `acc` copied back.
    pub acc_host: PinnedBuffer<u64>,
    /// Recorded on the copy stream after the copy into `stage`.
    pub copied: Event,
    /// Recorded on the compute stream after the last read of `stage`.
    pub consumed: Event,
}

impl Slot {
    /// Device elements of a slot's accumulators: two sums per piece.
    pub const ACC_LEN: usize = 2 * MAX_PIECES;

    /// A slot over its device staging buffer and accumulators
    /// ([`Slot::ACC_LEN`]): the pinned copy of the sums and the two
    /// events, recorded so the slot starts free.
    pub fn new(
        device: &Device,
        copy: &Stream,
        compute: &Stream,
        stage: DeviceBuffer<u8>,
        acc: DeviceBuffer<u64>,
    ) -> Result<Slot> {
        let slot = Slot {
            stage,
            acc,
            acc_host: device.alloc_pinned::<u64>(Slot::ACC_LEN)?,
            copied: device.event()?,
            consumed: device.event()?,
        };
        compute.record(&slot.consumed)?;
        copy.record(&slot.copied)?;
        Ok(slot)
    }
}

/// Device resources of the pinned ring, allocated on first use.
#[derive(Default)]
pub(super) struct Ring {
    /// The pinned buffers (`None` while a fill holds one, or while the
    /// grower still pins it).
    pub pinned: Vec<Option<PinnedBuffer<u8>>>,
    /// Their device slots.
    pub slots: Vec<Slot>,
    /// Pins the buffers of the slots still without one.
    grower: Option<Grower>,
}

impl Ring {
    /// Grows the ring to `want` slots of `bytes`: every device slot at once
    /// (as far as device memory allows; `make(first)` makes one, `first`
    /// for the ring's first), then a [`Grower`] pinning their host buffers
    /// on a thread of its own, so the load goes on while they are pinned.
    /// A ring left short (an allocation or a pinning failed) grows again
    /// here at the next load; one still growing is left to its grower.
    /// Errors only when not even one slot can be made.
    pub fn grow(
        &mut self,
        device: &Device,
        want: usize,
        bytes: usize,
        make: &mut dyn FnMut(bool) -> Result<Slot>,
    ) -> Result<()> {
        let from = self.slots.len();
        if self.grower.is_none() {
            while self.slots.len() < want {
                match make(self.slots.is_empty()) {
                    Ok(slot) => {
                        self.slots.push(slot);
                        self.pinned.push(None);
                    }
                    Err(e) if self.slots.is_empty() => return Err(e),
                    Err(e) => {
                        tracing::debug!(error = %e, slots = self.slots.len(), "pinned ring: short");
                        break;
                    }
                }
            }
        }
        let new: Range<usize> = from..self.slots.len();
        if !new.is_empty() {
            self.grower = Some(Grower::start(device, new, bytes));
        }
        Ok(())
    }

    /// Hands each buffer the grower has pinned since the last call to
    /// `put` with its slot; with `wait` (nothing else to do), first blocks
    /// until one comes, where one is owed. A pinning that failed ends the
    /// growth and drops the slots left without a buffer (the ring works
    /// with those before); the error is returned when no slot is left.
    pub fn take_grown(
        &mut self,
        wait: bool,
        put: &mut dyn FnMut(usize, PinnedBuffer<u8>),
    ) -> Option<Error> {
        match self.grower.as_mut()?.take(wait, put) {
            Grown::Pending => None,
            Grown::Done => {
                self.grower = None;
                None
            }
            Grown::Stopped { at, error } => {
                tracing::debug!(error = %error, slots = at, "pinned ring: not grown further");
                self.grower = None;
                self.slots.truncate(at);
                self.pinned.truncate(at);
                self.slots.is_empty().then_some(error)
            }
        }
    }

    /// Puts a buffer back in its slot (after a fill, or unused).
    pub fn put_back(&mut self, s: usize, buf: PinnedBuffer<u8>) {
        if let Some(p) = self.pinned.get_mut(s) {
            *p = Some(buf);
        }
    }

    /// Takes the buffers in their slots, in slot order.
    pub fn take_pinned(&mut self) -> Vec<(usize, PinnedBuffer<u8>)> {
        (self.pinned.iter_mut().enumerate())
            .filter_map(|(s, p)| p.take().map(|b| (s, b)))
            .collect()
    }

    /// Every slot has its buffer, or is owed one by a grower still at work.
    pub fn whole(&self) -> bool {
        !self.slots.is_empty()
            && self
                .pinned
                .iter()
                .enumerate()
                .all(|(s, p)| p.is_some() || self.grower.as_ref().is_some_and(|g| g.owes(s)))
    }
}
