//! One process, several devices: a checkpoint loaded onto every device,
//! each byte read from the host once ([`load_replicated`]).
//!
//! The tensors are shared out among the devices, balanced by bytes
//! ([`plan_owners`]: largest first, each to the device with the fewest
//! bytes so far), and each device loads its share with its own verified
//! [`Loader`] (pinned ring, fingerprints, ladder), all devices at once on
//! their own threads. The owner then fingerprints what it holds; every
//! other device receives each tensor through a [`PeerCopy`] and
//! fingerprints what landed, on that device, against the owner's
//! fingerprint. A mismatch is [`Error::VerificationFailed`] naming the
//! tensor and both devices: nothing unchecked is returned.
//!
//! # The peer copy hook
//!
//! [`PeerCopy`] is how bytes go from one device to another. [`DevicePeer`]
//! is the runtime's own copy between two of its devices (over NVLink /
//! xGMI where they have peer access), one copy per tensor. [`ViaHost`]
//! stages them through host memory in bounded chunks with the backends'
//! synchronous copies: it runs between any two devices, of any runtimes.
//! Both run on the host backend too (where CI runs this module with
//! several host "devices"). Whatever the copy, the check is the same, so a
//! faulty peer path cannot return wrong bytes.

use std::thread;

use crate::device::{Device, DeviceBuffer, DeviceView, DeviceViewMut, Stream};
use crate::error::{Error, Result};
use crate::safetensors::Checkpoint;

use super::{LoadOptions, LoadReport, LoadedTensor, Loader, TensorData};

/// Copies bytes between two devices of one process.
pub trait PeerCopy: Sync {
    /// Copies `src` (memory of `src_stream`'s device) into `dst` (memory of
    /// `dst_stream`'s device, the same length) and waits for the copy.
    fn copy(
        &self,
        src: &DeviceView<'_, u8>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, u8>,
        dst_stream: &Stream,
    ) -> Result<()>;

    /// The copy's name, for reports (`"via host"`).
    fn name(&self) -> &'static str;
}

/// The [`PeerCopy`] through host memory: each chunk of at most
/// `chunk_bytes` is copied to the host, then to the destination.
#[derive(Debug, Clone, Copy)]
pub struct ViaHost {
    /// Bytes per chunk (at least 1).
    pub chunk_bytes: usize,
}

impl Default for ViaHost {
    fn default() -> Self {
        ViaHost {
            chunk_bytes: 16 << 20,
        }
    }
}

impl PeerCopy for ViaHost {
    fn copy(
        &self,
        src: &DeviceView<'_, u8>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, u8>,
        dst_stream: &Stream,
    ) -> Result<()> {
        let n = src.len();
        if dst.len() != n {
            return Err(Error::LengthMismatch {
                op: "peer copy",
                expected: n,
                actual: dst.len(),
                tensor: None,
            });
        }
        let chunk = self.chunk_bytes.max(1);
        let mut tmp = vec![0u8; chunk.min(n)];
        let mut at = 0;
        while at < n {
            let end = (at + chunk).min(n);
            let part = &mut tmp[..end - at];
            src.slice(at..end)?.copy_dtoh(src_stream, part)?;
            dst.slice_mut(at..end)?.copy_htod(dst_stream, part)?;
            at = end;
        }
        Ok(())
    }

    fn name(&self) -> &'static str {
        "via host"
    }
}

/// The [`PeerCopy`] device to device: the runtime's copy across two of its
/// devices (`cuMemcpyDtoDAsync` under CUDA's unified addressing,
/// `hipMemcpyAsync` device to device: over NVLink / xGMI where the devices
/// have peer access, staged by the runtime otherwise), one copy per tensor,
/// no host memory. Devices of two runtimes are refused
/// ([`Error::BackendUnsupported`]); use [`ViaHost`] there.
#[derive(Debug, Clone, Copy, Default)]
pub struct DevicePeer;

impl PeerCopy for DevicePeer {
    fn copy(
        &self,
        src: &DeviceView<'_, u8>,
        src_stream: &Stream,
        dst: &mut DeviceViewMut<'_, u8>,
        dst_stream: &Stream,
    ) -> Result<()> {
        dst.copy_from_peer(dst_stream, src, src_stream)
    }

    fn name(&self) -> &'static str {
        "device to device"
    }
}

/// The owner (an index into the devices) of each of `sizes` (bytes):
/// largest first, each to the device with the fewest bytes so far (ties:
/// the earlier tensor, the lower device). The same inputs give the same
/// plan. Empty when `devices` is 0.
pub fn plan_owners(sizes: &[u64], devices: usize) -> Vec<usize> {
    if devices == 0 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(sizes[i]), i));
    let mut loads = vec![0u64; devices];
    let mut owner = vec![0usize; sizes.len()];
    for i in order {
        let mut best = 0;
        for (d, &l) in loads.iter().enumerate() {
            if l < loads[best] {
                best = d;
            }
        }
        owner[i] = best;
        loads[best] = loads[best].saturating_add(sizes[i]);
    }
    owner
}

/// What [`load_replicated`] returns.
#[derive(Debug)]
pub struct Replicated {
    /// Per device (in the order given), every tensor, in the order asked
    /// for. A tensor its owner's ladder kept on the host is
    /// [`TensorData::KeptOnHost`] on every device.
    pub devices: Vec<Vec<LoadedTensor>>,
    /// Each device's own load (of the tensors it owns).
    pub reports: Vec<LoadReport>,
    /// The owner of each tensor (an index into the devices).
    pub owners: Vec<usize>,
    /// Copies made to other devices and checked there.
    pub checked: usize,
    /// The peer copy's name.
    pub peer: &'static str,
}

impl Replicated {
    /// The tensor `name` on device `device` (an index).
    pub fn get(&self, device: usize, name: &str) -> Option<&LoadedTensor> {
        self.devices.get(device)?.iter().find(|t| t.name == name)
    }
}

/// A loaded tensor of its owner: where its bytes are.
enum Source<'a> {
    Device(&'a DeviceBuffer<u8>),
    Host(&'a [u8]),
}

/// Loads `names` of `ckpt` onto every one of `devices`, each byte read
/// from the host once (see the module docs): each device loads its share
/// with a [`Loader`] of `opts`, the others receive it through `peer`, and
/// every copy is checked on the device that received it.
///
/// Errors: [`Error::InvalidLoadOptions`] for no devices; a missing tensor
/// ([`Error::TensorNotFound`]); any device's load error (the first, in
/// device order); [`Error::VerificationFailed`] when a copy's fingerprint
/// on its device differs from the owner's; the peer copy's errors.
pub fn load_replicated(
    ckpt: &Checkpoint,
    names: &[&str],
    devices: &[Device],
    opts: &LoadOptions,
    peer: &dyn PeerCopy,
) -> Result<Replicated> {
    if devices.is_empty() {
        return Err(Error::InvalidLoadOptions {
            field: "devices",
            reason: "load_replicated needs at least one device",
        });
    }
    let mut sizes = Vec::with_capacity(names.len());
    for n in names {
        sizes.push(ckpt.info(n)?.num_bytes());
    }
    let owners = plan_owners(&sizes, devices.len());

    // Each device loads its share, all at once.
    let shares: Vec<Vec<&str>> = (0..devices.len())
        .map(|d| {
            names
                .iter()
                .zip(&owners)
                .filter(|(_, &o)| o == d)
                .map(|(n, _)| *n)
                .collect()
        })
        .collect();
    let loads: Vec<Result<super::Loaded>> = thread::scope(|s| {
        let handles: Vec<_> = devices
            .iter()
            .zip(&shares)
            .map(|(dev, share)| {
                s.spawn(move || {
                    let mut loader = Loader::new(dev, opts.clone())?;
                    loader.load_names(ckpt, share)
                })
            })
            .collect();
        join_all(handles)
    });
    let mut loaded = Vec::with_capacity(loads.len());
    for l in loads {
        loaded.push(l?);
    }

    // The owners' fingerprints, on their devices.
    let streams = devices
        .iter()
        .map(Device::stream)
        .collect::<Result<Vec<_>>>()?;
    // The loader returns its tensors in request order: tensor `i` is the
    // `k`-th of its owner's share.
    let mut at = vec![0usize; devices.len()];
    let mut slots = Vec::with_capacity(names.len());
    for &d in &owners {
        slots.push((d, at[d]));
        at[d] += 1;
    }
    for (d, l) in loaded.iter().enumerate() {
        if l.tensors.len() != shares[d].len() {
            return Err(Error::LengthMismatch {
                op: "load_replicated: tensors loaded by a device",
                expected: shares[d].len(),
                actual: l.tensors.len(),
                tensor: None,
            });
        }
    }
    let mut expected = Vec::with_capacity(names.len());
    for &(d, k) in &slots {
        let t = &loaded[d].tensors[k];
        let fp = match &t.data {
            TensorData::Buffer(b) => streams[d].fingerprint(&b.view())?,
            TensorData::KeptOnHost(v) => crate::convert::fingerprint::fingerprint_bytes(v),
        };
        expected.push(fp);
    }

    // Every other device receives each tensor and checks it.
    let results: Vec<Result<(Vec<LoadedTensor>, usize)>> = thread::scope(|s| {
        let handles: Vec<_> = (0..devices.len())
            .map(|e| {
                let (loaded, slots, expected, streams) = (&loaded, &slots, &expected, &streams);
                let (devices, owners) = (devices, &owners);
                s.spawn(move || -> Result<(Vec<LoadedTensor>, usize)> {
                    let mut out = Vec::new();
                    let mut checked = 0;
                    for (i, &(d, k)) in slots.iter().enumerate() {
                        if owners[i] == e {
                            continue;
                        }
                        let t = &loaded[d].tensors[k];
                        let src = match &t.data {
                            TensorData::Buffer(b) => Source::Device(b),
                            TensorData::KeptOnHost(v) => Source::Host(v),
                        };
                        let data = receive(
                            src,
                            &streams[d],
                            &devices[e],
                            &streams[e],
                            peer,
                            expected[i],
                            &t.name,
                            &devices[d],
                        )?;
                        checked += usize::from(matches!(data, TensorData::Buffer(_)));
                        out.push(LoadedTensor {
                            name: t.name.clone(),
                            dtype: t.dtype,
                            shape: t.shape.clone(),
                            data,
                        });
                    }
                    Ok((out, checked))
                })
            })
            .collect();
        join_all(handles)
    });
    let mut received = Vec::with_capacity(results.len());
    let mut checked = 0;
    for r in results {
        let (v, c) = r?;
        checked += c;
        received.push(v);
    }

    // Assemble each device's dict in the order asked for.
    let mut reports = Vec::with_capacity(loaded.len());
    let mut owned: Vec<Vec<Option<LoadedTensor>>> = Vec::with_capacity(loaded.len());
    for l in loaded {
        reports.push(l.report);
        owned.push(l.tensors.into_iter().map(Some).collect());
    }
    let mut devices_out = Vec::with_capacity(devices.len());
    for (e, recv) in received.into_iter().enumerate() {
        let mut recv = recv.into_iter();
        let mut list = Vec::with_capacity(names.len());
        for (i, &(d, k)) in slots.iter().enumerate() {
            let t = if owners[i] == e {
                owned[d][k].take()
            } else {
                recv.next()
            };
            if let Some(t) = t {
                list.push(t);
            }
        }
        devices_out.push(list);
    }
    Ok(Replicated {
        devices: devices_out,
        reports,
        owners,
        checked,
        peer: peer.name(),
    })
}

/// One tensor onto device `dev` from its owner, checked there against
/// `expected`.
#[allow(clippy::too_many_arguments)]
fn receive(
    src: Source<'_>,
    src_stream: &Stream,
    dev: &Device,
    stream: &Stream,
    peer: &dyn PeerCopy,
    expected: crate::convert::Fingerprint,
    name: &str,
    from: &Device,
) -> Result<TensorData> {
    let (buf, what) = match src {
        Source::Host(v) => {
            // Kept on the host by its owner's ladder: a host copy, checked
            // the same way.
            let copy = v.to_vec();
            let actual = crate::convert::fingerprint::fingerprint_bytes(&copy);
            if actual != expected {
                return Err(Error::VerificationFailed {
                    op: format!(
                        "host copy of tensor {name:?} kept on the host by {}",
                        from.info().name
                    ),
                    device: dev.info().name.clone(),
                    expected,
                    actual,
                });
            }
            return Ok(TensorData::KeptOnHost(copy));
        }
        Source::Device(b) => {
            let mut buf = stream.alloc::<u8>(b.len())?;
            peer.copy(&b.view(), src_stream, &mut buf.view_mut(), stream)?;
            (buf, b.len())
        }
    };
    let actual = stream.fingerprint(&buf.view())?;
    if actual != expected {
        return Err(Error::VerificationFailed {
            op: format!(
                "peer copy ({}) of tensor {name:?} ({what} bytes) from {}",
                peer.name(),
                from.info().name
            ),
            device: dev.info().name.clone(),
            expected,
            actual,
        });
    }
    Ok(TensorData::Buffer(buf))
}

/// The results of the devices' threads, in order; a thread that panicked
/// is an error (`TransferFailed`), never a panic of the caller.
fn join_all<T>(handles: Vec<thread::ScopedJoinHandle<'_, Result<T>>>) -> Vec<Result<T>> {
    handles
        .into_iter()
        .map(|h| {
            h.join().unwrap_or_else(|_| {
                Err(Error::TransferFailed {
                    tensor: String::new(),
                    rung: "load_replicated",
                    failure: "a device's thread panicked".into(),
                    source: None,
                })
            })
        })
        .collect()
}
