//! Fault injection: a [`Backend`] that wraps another and injects the failure
//! modes seen on ROCm (see [the contracts](crate#contracts)), so every detection and fallback path can
//! be exercised on any backend, the host one included.
//!
//! | [`FaultKind`] | where | what happens |
//! | --- | --- | --- |
//! | `CopyLandsZeros` | host-to-device copies | the destination is zeroed instead of written |
//! | `CopyLandsStale` | host-to-device copies | the copy is dropped: the destination keeps its old contents |
//! | `CopyLandsGarbage` | host-to-device copies | the copy lands, then a chunk of it (at most 4 KiB, at a seeded place) is overwritten with bytes that all differ from the source's |
//! | `InvalidValueOnCopy` | host-to-device copies | the copy fails ([`Error::InjectedFault`]), like `hipErrorInvalidValue` |
//! | `ConvertWritesZeros` | conversion kernels | the output is zeros (the fused kernel's fingerprint is of those zeros, as a kernel that computed zeros would give) |
//! | `OutOfMemoryOnAlloc` | device allocations | [`Error::OutOfMemory`] |
//! | `OutOfMemoryOnPinned` | pinned host allocations | [`Error::OutOfMemory`] |
//! | `LaunchFailure` | every kernel | the launch fails ([`Error::InjectedFault`]) |
//! | `TeardownFailure` | frees, stream and event destruction | fails ([`Error::InjectedFault`]); the resource is leaked, as after a sticky device error |
//! | `Conv3dLaunchFailure` | conv3d kernels and vendor calls | the call fails ([`Error::InjectedFault`]) |
//! | `Conv3dWritesZeros` | conv3d kernels and vendor calls | the call runs, then its whole output is zeroed |
//! | `Conv3dWritesGarbage` | conv3d kernels and vendor calls | the call runs, then its whole output is overwritten with seeded finite values of magnitude up to 1e4 |
//! | `Conv3dWritesNonFinite` | conv3d kernels and vendor calls | the call runs, then one output point (at a seeded place) is set to NaN |
//! | `VendorNoAlgorithm` | vendor conv3d calls, forward and backward | the call fails as MIOpen's "no suitable algorithm" does ([`Error::InjectedFault`]) |
//! | `Conv3dCheckFailure` | the conv3d chain's device checks | the check fails ([`Error::InjectedFault`]): the output it was to check is not trusted |
//! | `Conv3dBackwardLaunchFailure` | conv3d backward kernels (gradients, transposed convolution, the tiled weight gradient `conv3d_bwd_weight_tiled`), vendor backward calls, and the tiled tier's weight flip and zero insertion (`conv3d_flip_weight`, `conv3d_zero_insert`) | the call fails ([`Error::InjectedFault`]) |
//! | `Conv3dBackwardWritesGarbage` | conv3d backward kernels, vendor backward calls, the weight flip and the zero insertion | the call runs, then its whole result (the flipped weight, the spread `dy`) is overwritten with seeded finite values of magnitude up to 1e4 |
//! | `Conv3dBackwardWritesNonFinite` | conv3d backward kernels, vendor backward calls, the weight flip and the zero insertion | the call runs, then one result element (at a seeded place) is set to NaN |
//! | `SmallCopyLost` | host-to-device copies of at most 64 KiB | the copy is lost and the destination reads zeros (the gfx11 staging failure: its lost copies are the odd-numbered ones, `When::EveryNth(2)`) |
//! | `CopyZeroedRange` | host-to-device copies | the copy lands, then a range of it (at most 4 KiB, at a seeded place) is zeroed |
//! | `DownloadTruncated` | device-to-host copies | only the bytes below the copy's last 4 GiB boundary land (the first half of a copy of 4 GiB or less) |
//! | `InvalidValueOnLargeCopy` | copies of more than 1 MiB, either direction | the copy fails ([`Error::InjectedFault`]), like `hipErrorInvalidValue` |
//! | `PinnedRefusedSticky` | pinned host allocations | the allocation fails ([`Error::InjectedFault`]) and leaves a sticky error: the next allocation, copy or launch fails once with it |
//! | `RegistrationRefused` | read-only registrations of mapped file pages ([`Driver::register_read_only`], the loader's direct path) | the registration fails ([`Error::InjectedFault`]) |
//!
//! Which operations are hit is decided by each rule's [`When`], counting
//! the operations a kind applies to; [`When::Random`] draws from a
//! generator seeded by [`FaultPlan::seed`], so a run is reproducible. The
//! [`FaultHandle`] returned with the backend reads the log of injected faults
//! and switches injection on and off.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::info::{DevicePtr, RawEvent, RawStream};
use super::raw::conv3d::Conv3dLaunch;
use crate::device::raw::backend::{Backend, CopyOp, Driver, KernelOp};
use crate::device::raw::op_table::FaultClass;
use crate::device::raw::wrap::Wrap;
use crate::error::{Error, Result};

/// A failure mode to inject (defined with the error's data, which names it).
pub use super::fault_kind::FaultKind;

/// Which of the operations a rule applies to are hit.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub enum When {
    /// Every one.
    Always,
    /// Only the `n`-th (0-based).
    Nth(u64),
    /// Every `n`-th (the `n-1`-th, `2n-1`-th, ...); `0` never.
    EveryNth(u64),
    /// Each independently with probability `per_million / 1e6`, from the
    /// plan's seed.
    Random {
        /// Probability in millionths.
        per_million: u32,
    },
}

/// One injection rule.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct FaultRule {
    /// What to inject.
    pub kind: FaultKind,
    /// When.
    pub when: When,
}

/// The rules of a [`Faults`] backend.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize)]
pub struct FaultPlan {
    /// Seed of [`When::Random`].
    pub seed: u64,
    /// The rules (several may name the same kind; any that fires injects).
    pub rules: Vec<FaultRule>,
}

impl FaultPlan {
    /// A plan of one rule.
    pub fn one(kind: FaultKind, when: When) -> FaultPlan {
        FaultPlan {
            seed: 0,
            rules: vec![FaultRule { kind, when }],
        }
    }
}

/// One injected fault, as logged.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InjectedFault {
    /// What was injected.
    pub kind: FaultKind,
    /// The backend operation hit (`"copy_htod"`, `"convert"`, ...).
    pub op: &'static str,
    /// The operation's index among those the kind applies to.
    pub index: u64,
}

#[derive(Debug)]
struct State {
    counts: [u64; FaultKind::ALL.len()],
    rng: u64,
    log: Vec<InjectedFault>,
    /// A sticky error left by `PinnedRefusedSticky`, returned once by the
    /// next allocation, copy or launch.
    sticky: bool,
}

#[derive(Debug)]
struct Shared {
    plan: FaultPlan,
    enabled: AtomicBool,
    state: Mutex<State>,
}

/// Reads the log of a [`Faults`] backend and switches it on and off (the
/// backend itself is owned by its [`Device`](super::Device)).
#[derive(Debug, Clone)]
pub struct FaultHandle(Arc<Shared>);

impl FaultHandle {
    /// The faults injected so far, in order.
    pub fn injected(&self) -> Vec<InjectedFault> {
        match self.0.state.lock() {
            Ok(s) => s.log.clone(),
            Err(p) => p.into_inner().log.clone(),
        }
    }

    /// Turns injection on or off (operations are still counted only while on).
    pub fn set_enabled(&self, on: bool) {
        self.0.enabled.store(on, Ordering::SeqCst);
    }
}

/// A backend that injects faults into another (see the module docs).
#[derive(Debug)]
pub struct Faults<B> {
    inner: B,
    shared: Arc<Shared>,
}

fn mix64_step(x: u64) -> u64 {
    crate::convert::fingerprint::mix64(x.wrapping_add(0x9E37_79B9_7F4A_7C15))
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    crate::convert::fingerprint::mix64(*x)
}

impl<B: Backend> Faults<B> {
    /// Wraps `inner` with `plan`; the handle reads the log.
    pub fn new(inner: B, plan: FaultPlan) -> (Faults<B>, FaultHandle) {
        let shared = Arc::new(Shared {
            enabled: AtomicBool::new(true),
            state: Mutex::new(State {
                counts: [0; FaultKind::ALL.len()],
                rng: plan.seed,
                log: Vec::new(),
                sticky: false,
            }),
            plan,
        });
        (
            Faults {
                inner,
                shared: Arc::clone(&shared),
            },
            FaultHandle(shared),
        )
    }

    /// [`Error::OutOfMemory`] for an allocation (`op`: the operation as
    /// logged, and as the error names it) when a rule of `kind` fires.
    fn out_of_memory(&self, kind: FaultKind, op: [&'static str; 2], bytes: usize) -> Result<()> {
        if self.fires(kind, op[0]) {
            return Err(Error::OutOfMemory {
                backend: self.inner.info().kind.name(),
                op: op[1],
                bytes: bytes as u64,
            });
        }
        Ok(())
    }

    /// Counts one operation that `kind` applies to and says whether a rule
    /// fires for it (logging it).
    fn fires(&self, kind: FaultKind, op: &'static str) -> bool {
        let sh = &self.shared;
        if !sh.enabled.load(Ordering::SeqCst) || !sh.plan.rules.iter().any(|r| r.kind == kind) {
            return false;
        }
        let mut st = match sh.state.lock() {
            Ok(s) => s,
            Err(p) => p.into_inner(),
        };
        let i = kind.index();
        let index = st.counts[i];
        st.counts[i] += 1;
        let mut hit = false;
        for r in sh.plan.rules.iter().filter(|r| r.kind == kind) {
            hit |= match r.when {
                When::Always => true,
                When::Nth(n) => index == n,
                When::EveryNth(n) => n != 0 && (index + 1) % n == 0,
                When::Random { per_million } => {
                    splitmix(&mut st.rng) % 1_000_000 < u64::from(per_million)
                }
            };
        }
        if hit {
            st.log.push(InjectedFault { kind, op, index });
        }
        hit
    }

    /// Overwrites a chunk of the copy `src -> dst` of `bytes` bytes (just
    /// queued on `s`) with bytes that each differ from the source's, then
    /// waits for `s` so the garbage can be freed.
    ///
    /// # Safety
    /// As [`Driver::copy`] of [`CopyOp::HtoD`] for `dst`, `src`, `bytes`, `s`.
    unsafe fn garbage(
        &self,
        dst: DevicePtr,
        src: *const u8,
        bytes: usize,
        s: RawStream,
    ) -> Result<()> {
        let (r1, r2) = {
            let mut st = match self.shared.state.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            (splitmix(&mut st.rng), splitmix(&mut st.rng))
        };
        let len = bytes.min(4096);
        let start = (r1 % (bytes - len + 1) as u64) as usize;
        // SAFETY: `src` is readable for `bytes` bytes (caller) and
        // `start + len <= bytes`.
        let source = unsafe { std::slice::from_raw_parts(src.add(start), len) };
        let mut x = r2;
        let chunk: Vec<u8> = source
            .iter()
            .map(|&b| {
                x = mix64_step(x);
                // A non-zero xor changes every byte.
                b ^ ((x as u8) | 1)
            })
            .collect();
        // SAFETY: `dst + start .. + len` lies inside the caller's
        // destination; `chunk` stays alive until the synchronize below.
        unsafe {
            let op = CopyOp::HtoD {
                dst: dst.offset(start as u64),
                src: chunk.as_ptr(),
            };
            self.inner.copy(op, len, s)?;
            self.inner.stream_synchronize(s)
        }
    }

    /// The sticky error left by a refused registration, returned (and
    /// cleared) by the first operation after it.
    fn sticky(&self, op: &'static str) -> Result<()> {
        let mut st = match self.shared.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if std::mem::take(&mut st.sticky) {
            return Err(Self::injected(FaultKind::PinnedRefusedSticky, op));
        }
        Ok(())
    }

    fn set_sticky(&self) {
        match self.shared.state.lock() {
            Ok(mut g) => g.sticky = true,
            Err(p) => p.into_inner().sticky = true,
        }
    }

    /// Zeroes a range (at most 4 KiB, at a seeded place) of the `bytes`
    /// just copied to `dst` on `s`.
    ///
    /// # Safety
    /// `dst` is a live device range of `bytes` bytes, `s` a live stream.
    unsafe fn zero_range(&self, dst: DevicePtr, bytes: usize, s: RawStream) -> Result<()> {
        let len = bytes.min(4096);
        let start = (self.rng() % (bytes - len + 1) as u64) as usize;
        // SAFETY: `start + len <= bytes` inside the caller's range.
        unsafe { self.inner.memset_zero(dst.offset(start as u64), len, s) }
    }

    fn injected(kind: FaultKind, op: &'static str) -> Error {
        Error::InjectedFault { fault: kind, op }
    }

    fn teardown(&self, op: &'static str) -> Result<()> {
        if self.fires(FaultKind::TeardownFailure, op) {
            return Err(Self::injected(FaultKind::TeardownFailure, op));
        }
        Ok(())
    }

    fn launch(&self, op: &'static str) -> Result<()> {
        if self.fires(FaultKind::LaunchFailure, op) {
            return Err(Self::injected(FaultKind::LaunchFailure, op));
        }
        Ok(())
    }

    fn rng(&self) -> u64 {
        let mut st = match self.shared.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        splitmix(&mut st.rng)
    }

    /// The conv3d faults around `run` (the real call on `inner`).
    ///
    /// # Safety
    /// As [`Backend::run`] of a conv3d op for `a` and `s`.
    unsafe fn conv3d_faults(
        &self,
        op: &'static str,
        a: &Conv3dLaunch,
        s: RawStream,
        run: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let kinds = OutputFaults {
            launch: FaultKind::Conv3dLaunchFailure,
            zeros: Some(FaultKind::Conv3dWritesZeros),
            garbage: FaultKind::Conv3dWritesGarbage,
            nan: FaultKind::Conv3dWritesNonFinite,
        };
        let out = OutputRange {
            ptr: a.output,
            n: a.geometry.output_len(),
            bf16: a.output_dtype == crate::dtype::DType::BF16,
            gate: a.gate,
        };
        // SAFETY: the caller's guarantees: `a.output` holds the output.
        unsafe { self.output_faults(op, kinds, out, s, run) }
    }

    /// Whether a gated op ran: its gate (read back, waiting for `s`) is
    /// non-zero; `true` without a gate.
    ///
    /// # Safety
    /// `gate` is one live `u64` of this device.
    unsafe fn gate_open(&self, gate: Option<DevicePtr>, s: RawStream) -> Result<bool> {
        let Some(g) = gate else { return Ok(true) };
        let mut v = 0u64;
        // SAFETY: `g` holds one u64 (caller); `v` lives until the
        // synchronize.
        unsafe {
            let op = CopyOp::DtoH {
                dst: (&mut v as *mut u64).cast::<u8>(),
                src: g,
            };
            self.inner.copy(op, 8, s)?;
            self.inner.stream_synchronize(s)?;
        }
        Ok(v != 0)
    }

    /// The faults `kinds` around `run` (the real call on `inner`), over
    /// the output `out` (f32, or bf16 where it says so).
    ///
    /// # Safety
    /// As [`Backend::run`] of the op for `s`; `out` is the range the op
    /// writes.
    unsafe fn output_faults(
        &self,
        op: &'static str,
        kinds: OutputFaults,
        out: OutputRange,
        s: RawStream,
        run: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        self.launch(op)?;
        if self.fires(kinds.launch, op) {
            return Err(Self::injected(kinds.launch, op));
        }
        run()?;
        // SAFETY: the gate, if any, is one live u64 of the device (caller).
        if !unsafe { self.gate_open(out.gate, s) }? {
            // A gated kernel that did not run wrote nothing to corrupt.
            return Ok(());
        }
        let OutputRange {
            ptr: output,
            n,
            bf16,
            ..
        } = out;
        let elem = if bf16 { 2 } else { 4 };
        let bytes = n * elem;
        if kinds.zeros.is_some_and(|k| self.fires(k, op)) {
            // SAFETY: the output range is valid for `bytes` (caller).
            return unsafe { self.inner.memset_zero(output, bytes, s) };
        }
        let garbage = self.fires(kinds.garbage, op);
        let nan = !garbage && self.fires(kinds.nan, op);
        let (data, at): (Vec<f32>, usize) = if garbage {
            let mut x = self.rng();
            let v = (0..n)
                .map(|_| {
                    x = mix64_step(x);
                    // Finite, in [-1e4, 1e4), never a plausible result.
                    ((x >> 40) % 20_000) as f32 - 10_000.0 + 0.5
                })
                .collect();
            (v, 0)
        } else if nan {
            (vec![f32::NAN], (self.rng() % n.max(1) as u64) as usize)
        } else {
            return Ok(());
        };
        let narrowed: Vec<half::bf16> = if bf16 {
            data.iter().map(|&v| half::bf16::from_f32(v)).collect()
        } else {
            Vec::new()
        };
        let src: *const u8 = if bf16 {
            narrowed.as_ptr().cast()
        } else {
            data.as_ptr().cast()
        };
        // SAFETY: `at + data.len() <= n` output elements of `elem` bytes,
        // inside the caller's output range; `data` and `narrowed` live
        // until the synchronize below.
        unsafe {
            let op = CopyOp::HtoD {
                dst: output.offset((at * elem) as u64),
                src,
            };
            self.inner.copy(op, data.len() * elem, s)?;
            self.inner.stream_synchronize(s)
        }
    }
}

/// The output a faulted op writes: `n` elements at `ptr`, f32 or bf16,
/// and the op's gate (a gated op writes only when it is open).
#[derive(Debug, Clone, Copy)]
struct OutputRange {
    ptr: DevicePtr,
    n: usize,
    bf16: bool,
    gate: Option<DevicePtr>,
}

/// The faults of the tiled tier's backward steps (the weight flip, the
/// zero insertion): those of the backward kernels, since their result (the
/// flipped weight, the spread `dy`) is what the convolution after them
/// reads.
const TILED_BACKWARD: OutputFaults = OutputFaults {
    launch: FaultKind::Conv3dBackwardLaunchFailure,
    zeros: None,
    garbage: FaultKind::Conv3dBackwardWritesGarbage,
    nan: FaultKind::Conv3dBackwardWritesNonFinite,
};

/// The fault kinds of one kind of kernel that writes an f32 output.
#[derive(Debug, Clone, Copy)]
struct OutputFaults {
    launch: FaultKind,
    zeros: Option<FaultKind>,
    garbage: FaultKind,
    nan: FaultKind,
}

impl<B: Backend> Wrap for Faults<B> {
    type Inner = B;
    fn inner(&self) -> &B {
        &self.inner
    }
}

// SAFETY: every operation forwards to `inner` (a correct backend) or is
// replaced by another operation of `inner` on the same range (memset_zero,
// fingerprint_sum) or by nothing; allocations are `inner`'s.
unsafe impl<B: Backend> Driver for Faults<B> {
    crate::forward_driver!(
        info,
        stream_create,
        stream_synchronize,
        synchronize,
        event_create,
        event_record,
        event_synchronize,
        stream_wait_event,
        event_elapsed_ms,
        memset_zero,
        mem_info,
        unregister_read_only,
    );

    unsafe fn register_read_only(&self, p: *const u8, bytes: usize) -> Result<()> {
        let op = "register_read_only";
        self.sticky(op)?;
        if self.fires(FaultKind::RegistrationRefused, op) {
            return Err(Self::injected(FaultKind::RegistrationRefused, op));
        }
        // SAFETY: the caller's guarantees, forwarded unchanged.
        unsafe { self.inner.register_read_only(p, bytes) }
    }

    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.sticky("alloc")?;
        self.out_of_memory(
            FaultKind::OutOfMemoryOnAlloc,
            ["alloc", "alloc (injected)"],
            bytes,
        )?;
        self.inner.alloc(bytes)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        let op = ["alloc_pinned", "alloc_pinned (injected)"];
        self.sticky("alloc_pinned")?;
        if self.fires(FaultKind::PinnedRefusedSticky, op[0]) {
            self.set_sticky();
            return Err(Self::injected(FaultKind::PinnedRefusedSticky, op[0]));
        }
        self.out_of_memory(FaultKind::OutOfMemoryOnPinned, op, bytes)?;
        self.inner.alloc_pinned(bytes)
    }

    unsafe fn free(&self, ptr: DevicePtr, bytes: usize) -> Result<()> {
        self.teardown("free")?;
        // SAFETY: forwards the caller's guarantees unchanged.
        unsafe { self.inner.free(ptr, bytes) }
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) -> Result<()> {
        self.teardown("free_pinned")?;
        // SAFETY: forwards the caller's guarantees unchanged.
        unsafe { self.inner.free_pinned(ptr, bytes) }
    }

    unsafe fn stream_destroy(&self, s: RawStream) -> Result<()> {
        self.teardown("stream_destroy")?;
        // SAFETY: forwards the caller's guarantees unchanged.
        unsafe { self.inner.stream_destroy(s) }
    }

    unsafe fn event_destroy(&self, e: RawEvent) -> Result<()> {
        self.teardown("event_destroy")?;
        // SAFETY: forwards the caller's guarantees unchanged.
        unsafe { self.inner.event_destroy(e) }
    }

    unsafe fn copy(&self, op: CopyOp, bytes: usize, s: RawStream) -> Result<()> {
        let name = op.name();
        self.sticky(name)?;
        if bytes > 1 << 20 && self.fires(FaultKind::InvalidValueOnLargeCopy, name) {
            return Err(Self::injected(FaultKind::InvalidValueOnLargeCopy, name));
        }
        if let CopyOp::DtoH { .. } = op {
            if self.fires(FaultKind::DownloadTruncated, name) {
                const FOUR_GIB: usize = 4 << 30;
                let landed = if bytes > FOUR_GIB {
                    (bytes - 1) / FOUR_GIB * FOUR_GIB
                } else {
                    bytes / 2
                };
                // SAFETY: the caller's ranges, shortened.
                return unsafe { self.inner.copy(op, landed, s) };
            }
        }
        let CopyOp::HtoD { dst, src } = op else {
            // SAFETY: forwards the caller's guarantees unchanged.
            return unsafe { self.inner.copy(op, bytes, s) };
        };
        if bytes <= 64 << 10 && self.fires(FaultKind::SmallCopyLost, name) {
            // SAFETY: the destination range is valid for `bytes` (caller).
            return unsafe { self.inner.memset_zero(dst, bytes, s) };
        }
        if self.fires(FaultKind::InvalidValueOnCopy, name) {
            return Err(Self::injected(FaultKind::InvalidValueOnCopy, name));
        }
        if self.fires(FaultKind::CopyLandsStale, name) {
            return Ok(());
        }
        if self.fires(FaultKind::CopyLandsZeros, name) {
            // SAFETY: the destination range is valid for `bytes` (caller).
            return unsafe { self.inner.memset_zero(dst, bytes, s) };
        }
        // SAFETY: forwards the caller's guarantees unchanged.
        unsafe { self.inner.copy(op, bytes, s)? };
        if self.fires(FaultKind::CopyLandsGarbage, name) {
            // SAFETY: the caller's guarantees (live `dst` and `src` for
            // `bytes`, live `s`) are what `garbage` needs; it writes only
            // inside `dst..dst + bytes`.
            return unsafe { self.garbage(dst, src, bytes, s) };
        }
        if bytes > 0 && self.fires(FaultKind::CopyZeroedRange, name) {
            // SAFETY: the destination range is valid for `bytes` (caller).
            return unsafe { self.zero_range(dst, bytes, s) };
        }
        Ok(())
    }
}

// SAFETY: as above.
unsafe impl<B: Backend> Backend for Faults<B> {
    crate::forward_backend!(
        caps,
        kernel_source,
        conv3d_weight_layout,
        conv3d_vendor_available,
        conv3d_vendor_backward_available
    );

    unsafe fn run(&self, op: &KernelOp<'_>, s: RawStream) -> Result<()> {
        // The op's fault class, from the op table (`raw/op_table.rs`).
        let entry = op.entry();
        let name = entry.name;
        self.sticky(name)?;
        match entry.faults {
            FaultClass::Conv3d { args, vendor } => {
                if vendor && self.fires(FaultKind::VendorNoAlgorithm, name) {
                    return Err(Self::injected(FaultKind::VendorNoAlgorithm, name));
                }
                // SAFETY: forwards the caller's guarantees unchanged; the
                // faults write only inside the output range.
                unsafe { self.conv3d_faults(name, args, s, || self.inner.run(op, s)) }
            }
            FaultClass::Conv3dBackward { args, vendor } => {
                if vendor && self.fires(FaultKind::VendorNoAlgorithm, name) {
                    return Err(Self::injected(FaultKind::VendorNoAlgorithm, name));
                }
                let kinds = OutputFaults {
                    launch: FaultKind::Conv3dBackwardLaunchFailure,
                    zeros: None,
                    garbage: FaultKind::Conv3dBackwardWritesGarbage,
                    nan: FaultKind::Conv3dBackwardWritesNonFinite,
                };
                let out = OutputRange {
                    ptr: args.output,
                    n: args.output_len(),
                    bf16: false,
                    gate: None,
                };
                // SAFETY: as above: the result range is the caller's.
                unsafe { self.output_faults(name, kinds, out, s, || self.inner.run(op, s)) }
            }
            FaultClass::TiledBackward { dst, n, dtype } => {
                let out = OutputRange {
                    ptr: dst,
                    n,
                    bf16: dtype == crate::dtype::DType::BF16,
                    gate: None,
                };
                // SAFETY: as above: the destination range is the caller's.
                unsafe {
                    self.output_faults(name, TILED_BACKWARD, out, s, || self.inner.run(op, s))
                }
            }
            FaultClass::Check => {
                self.launch(name)?;
                if self.fires(FaultKind::Conv3dCheckFailure, name) {
                    return Err(Self::injected(FaultKind::Conv3dCheckFailure, name));
                }
                // SAFETY: forwards the caller's guarantees unchanged.
                unsafe { self.inner.run(op, s) }
            }
            FaultClass::Convert { op: c, dst, n, acc } => {
                self.launch(name)?;
                if !self.fires(FaultKind::ConvertWritesZeros, name) {
                    // SAFETY: forwards the caller's guarantees unchanged.
                    return unsafe { self.inner.run(op, s) };
                }
                let bytes = n * c.to.size().unwrap_or(1) as u64;
                // SAFETY: the output range is valid for `n` elements of
                // `c.to` (caller); for the fused op `acc` is the caller's
                // accumulator, and the zeros are summed as a kernel that
                // computed zeros would sum them.
                unsafe {
                    self.inner.memset_zero(dst, bytes as usize, s)?;
                    if let Some(acc) = acc {
                        let sum = KernelOp::FingerprintSum {
                            src: dst,
                            bytes,
                            first_word: 0,
                            acc,
                        };
                        self.inner.run(&sum, s)?;
                    }
                }
                Ok(())
            }
            FaultClass::Launch => {
                self.launch(name)?;
                // SAFETY: forwards the caller's guarantees unchanged.
                unsafe { self.inner.run(op, s) }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{runtime::host::HostBackend, Device};

    /// A garbage chunk: the copy lands, then at most 4 KiB of it, at a
    /// seeded place, differ from the source in every byte; the rest is
    /// intact; the same seed hits the same place.
    #[test]
    fn copy_lands_garbage_changes_one_chunk() {
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let mut places = Vec::new();
        for _ in 0..2 {
            let plan = FaultPlan {
                seed: 11,
                rules: vec![FaultRule {
                    kind: FaultKind::CopyLandsGarbage,
                    when: When::Always,
                }],
            };
            let (f, h) = Faults::new(HostBackend::new(), plan);
            let dev = Device::from_backend(Box::new(f));
            let s = dev.stream().unwrap();
            let got = s.clone_htod(&src).unwrap().to_vec().unwrap();
            let diff: Vec<usize> = (0..src.len()).filter(|&i| got[i] != src[i]).collect();
            assert_eq!(diff.len(), 4096);
            assert_eq!(
                diff.last().unwrap() - diff[0] + 1,
                4096,
                "one contiguous chunk"
            );
            assert_eq!(h.injected()[0].kind, FaultKind::CopyLandsGarbage);
            places.push(diff[0]);
        }
        assert_eq!(places[0], places[1]);
    }

    /// The memory figures are forwarded unchanged, whatever the plan
    /// injects into allocations, through the boxed backend of a `Device`.
    #[test]
    fn mem_info_is_forwarded() {
        let plan = FaultPlan {
            seed: 1,
            rules: vec![FaultRule {
                kind: FaultKind::OutOfMemoryOnAlloc,
                when: When::Always,
            }],
        };
        let (f, _h) = Faults::new(HostBackend::new(), plan);
        let dev = Device::from_backend(Box::new(f));
        match (dev.mem_info(), Device::host().mem_info()) {
            (Ok((free, total)), Ok((_, host_total))) => {
                assert_eq!(total, host_total);
                assert!(free <= total);
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
            (a, b) => panic!("{a:?} vs {b:?}"),
        }
        assert!(
            dev.stream().unwrap().alloc::<u8>(16).is_err(),
            "the plan is active"
        );
    }
}
