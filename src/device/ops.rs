//! The kernel operations queued on a [`Stream`]: conversions,
//! fingerprints and non-finite scans, checked before they reach a backend.

use super::buffer::{DeviceView, DeviceViewMut};
use super::info::ConvertOp;
use super::stream::Stream;
use crate::convert::fingerprint::{finish, Fingerprint};
use crate::convert::Element;
use crate::device::raw::backend::KernelOp;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The byte views of a typed conversion's operands, checked in the order
/// the typed calls always checked them (device, a kernel for the pair,
/// equal element counts); a byte view of a typed view is whole and
/// aligned.
fn typed_pair<'s, 'd, S: Element, D: Element>(
    stream: &Stream,
    op: &'static str,
    src: &DeviceView<'s, S>,
    dst: &'d mut DeviceViewMut<'_, D>,
) -> Result<(DeviceView<'s, u8>, DeviceViewMut<'d, u8>)> {
    stream.check_device(op, src.device())?;
    stream.check_device(op, dst.device())?;
    let c = ConvertOp {
        from: S::DTYPE,
        to: D::DTYPE,
    };
    let kernel = if op == "convert" {
        c.symbol()
    } else {
        c.fused_symbol()
    };
    if kernel.is_none() {
        return Err(Error::UnsupportedConversion {
            op,
            from: S::DTYPE,
            to: D::DTYPE,
            tensor: None,
        });
    }
    if src.len() != dst.len() {
        return Err(Error::LengthMismatch {
            op,
            expected: src.len(),
            actual: dst.len(),
            tensor: None,
        });
    }
    Ok((src.cast::<u8>()?, dst.cast_mut::<u8>()?))
}

/// NaN and Inf counts of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct NonFinite {
    /// NaN values.
    pub nan: u64,
    /// Infinite values (either sign).
    pub inf: u64,
}

impl Stream {
    /// Queues the conversion of `src` (elements of `from`) into `dst`
    /// (elements of `to`) on this stream, with the runtime dtypes of a
    /// checkpoint: the byte views hold whole, aligned elements, as many in
    /// `dst` as in `src`. The typed [`Stream::convert`] is this call.
    ///
    /// Errors: [`Error::UnsupportedConversion`] for a pair without a device
    /// kernel (see [`ConvertOp::DEVICE`]); [`Error::LengthMismatch`] when
    /// `src` is not whole elements or `dst` has room for a different count;
    /// [`Error::Misaligned`] for a view not aligned to its element;
    /// [`Error::DeviceMismatch`].
    pub fn convert_raw(
        &self,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &mut DeviceViewMut<'_, u8>,
        to: DType,
    ) -> Result<()> {
        let (op, n) = self.check_convert_raw("convert", src, from, dst, to, false)?;
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both views are live ranges of allocations on this device
        // (checked), `dst` is borrowed mutably so nothing else writes it,
        // both hold `n` whole elements of their dtypes, aligned (checked),
        // and `op` has a device kernel.
        unsafe {
            let op = KernelOp::Convert {
                op,
                src: src.device_ptr(),
                dst: dst.device_ptr(),
                n,
            };
            self.backend().run(&op, self.raw())
        }
    }

    /// [`Stream::convert_raw`] with the fused kernel: also adds the
    /// fingerprint sum of the output (as the kernel wrote it, word 0 at
    /// `dst`) to `acc[0]`. For the rows with a fused kernel
    /// ([`ConvertOp::fused_symbol`]: bf16/f16 -> f32); others are
    /// [`Error::UnsupportedConversion`] (run [`Stream::convert_raw`] and
    /// [`Stream::fingerprint_sum_into`] instead).
    pub fn convert_fingerprint_raw(
        &self,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &mut DeviceViewMut<'_, u8>,
        to: DType,
        acc: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        const OP: &str = "convert_fingerprint";
        let (op, n) = self.check_convert_raw(OP, src, from, dst, to, true)?;
        self.check_device(OP, acc.device())?;
        if acc.len() != 1 {
            return Err(Error::LengthMismatch {
                op: "fingerprint accumulator",
                expected: 1,
                actual: acc.len(),
                tensor: None,
            });
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY: as in `convert_raw`; `acc` is a live, aligned u64 of this
        // device borrowed mutably, and `op` has a fused kernel.
        unsafe {
            let op = KernelOp::ConvertFingerprint {
                op,
                src: src.device_ptr(),
                dst: dst.device_ptr(),
                n,
                acc: acc.device_ptr(),
            };
            self.backend().run(&op, self.raw())
        }
    }

    /// The checks of the conversions: same device, a device (or `fused`)
    /// kernel for the pair, whole aligned elements, equal counts. Returns
    /// the op and the element count.
    fn check_convert_raw(
        &self,
        op: &'static str,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &DeviceViewMut<'_, u8>,
        to: DType,
        fused: bool,
    ) -> Result<(ConvertOp, u64)> {
        self.check_device(op, src.device())?;
        self.check_device(op, dst.device())?;
        let c = ConvertOp { from, to };
        let kernel = if fused { c.fused_symbol() } else { c.symbol() };
        let (Some(_), Some(row)) = (kernel, c.row()) else {
            return Err(Error::UnsupportedConversion {
                op,
                from,
                to,
                tensor: None,
            });
        };
        let (ss, ds) = (row.src_size, row.dst_size);
        let n = src.len() / ss;
        if n * ss != src.len() {
            return Err(Error::LengthMismatch {
                op,
                expected: n * ss,
                actual: src.len(),
                tensor: None,
            });
        }
        if dst.len() != n * ds {
            return Err(Error::LengthMismatch {
                op,
                expected: n * ds,
                actual: dst.len(),
                tensor: None,
            });
        }
        for (addr, size) in [(src.device_ptr().0, ss), (dst.device_ptr().0, ds)] {
            if !addr.is_multiple_of(size as u64) {
                return Err(Error::Misaligned {
                    op,
                    addr,
                    align: size as u64,
                });
            }
        }
        Ok((c, n as u64))
    }

    /// Queues the conversion of `src` into `dst` (same length) on this
    /// stream: [`Stream::convert_raw`] with the dtypes of the element types.
    pub fn convert<S: Element, D: Element>(
        &self,
        src: &DeviceView<'_, S>,
        dst: &mut DeviceViewMut<'_, D>,
    ) -> Result<()> {
        let (src, mut dst) = typed_pair(self, "convert", src, dst)?;
        self.convert_raw(&src, S::DTYPE, &mut dst, D::DTYPE)
    }

    /// Queues the fingerprint sum of `src`'s bytes (word 0 = its first byte)
    /// into `acc` (one `u64`; added, wrapping). Finish with
    /// [`crate::convert::fingerprint::finish`].
    pub fn fingerprint_sum_into<T: bytemuck::Pod>(
        &self,
        src: &DeviceView<'_, T>,
        acc: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        self.check_device("fingerprint", src.device())?;
        self.check_device("fingerprint", acc.device())?;
        if acc.len() != 1 {
            return Err(Error::LengthMismatch {
                op: "fingerprint accumulator",
                expected: 1,
                actual: acc.len(),
                tensor: None,
            });
        }
        let bytes = src.num_bytes() as u64;
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `src` is a live range on this device, `acc` a live,
        // 256-aligned one-element u64 buffer borrowed mutably.
        unsafe {
            let op = KernelOp::FingerprintSum {
                src: src.device_ptr(),
                bytes,
                first_word: 0,
                acc: acc.device_ptr(),
            };
            self.backend().run(&op, self.raw())
        }
    }

    /// The fingerprint of `src`'s bytes, computed on the device (waits for it).
    pub fn fingerprint<T: bytemuck::Pod>(&self, src: &DeviceView<'_, T>) -> Result<Fingerprint> {
        let mut acc = self.alloc_zeros::<u64>(1)?;
        self.fingerprint_sum_into(src, &mut acc.view_mut())?;
        let mut s = [0u64];
        acc.copy_dtoh(&mut s)?;
        Ok(finish(s[0], src.num_bytes() as u64))
    }

    /// [`Stream::convert`] of bf16/f16 -> f32 that also adds the fingerprint
    /// sum of the output (as the kernel wrote it) to `acc[0]`:
    /// [`Stream::convert_fingerprint_raw`] with the element types' dtypes.
    pub fn convert_fingerprint_into<S: Element>(
        &self,
        src: &DeviceView<'_, S>,
        dst: &mut DeviceViewMut<'_, f32>,
        acc: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        let (src, mut dst) = typed_pair(self, "convert_fingerprint", src, dst)?;
        self.convert_fingerprint_raw(&src, S::DTYPE, &mut dst, DType::F32, acc)
    }

    /// Counts the elements of `dst` (f32, as bytes) that differ, bit for
    /// bit, from the exact widening of the same element of `src` (bytes of
    /// `from`): the check of a widening that already ran, a separate launch
    /// reading both buffers. Waits for the result.
    ///
    /// Errors: [`Error::UnsupportedConversion`] where
    /// [`ConvertOp::widen_check_available`] is false for `from -> f32`;
    /// [`Error::LengthMismatch`] when the counts differ;
    /// [`Error::Misaligned`]; [`Error::DeviceMismatch`].
    pub fn count_widen_mismatches(
        &self,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &DeviceView<'_, u8>,
    ) -> Result<u64> {
        let mut count = self.alloc_zeros::<u64>(1)?;
        self.widen_check_into(src, from, dst, &mut count.view_mut())?;
        let mut c = [0u64];
        count.copy_dtoh(&mut c)?;
        Ok(c[0])
    }

    /// Queues [`Stream::count_widen_mismatches`]'s check on this stream,
    /// adding the count to `count[0]` (one `u64`, wrapping) instead of
    /// waiting for it. Errors as that method's, and
    /// [`Error::LengthMismatch`] for a `count` other than one element.
    pub fn widen_check_into(
        &self,
        src: &DeviceView<'_, u8>,
        from: DType,
        dst: &DeviceView<'_, u8>,
        count: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        const OP: &str = "widen_check";
        self.check_device(OP, count.device())?;
        if count.len() != 1 {
            return Err(Error::LengthMismatch {
                op: "widen_check count",
                expected: 1,
                actual: count.len(),
                tensor: None,
            });
        }
        self.check_device(OP, src.device())?;
        self.check_device(OP, dst.device())?;
        let op = ConvertOp {
            from,
            to: DType::F32,
        };
        let (true, Some(ss)) = (op.widen_check_available(), from.size()) else {
            return Err(Error::UnsupportedConversion {
                op: OP,
                from,
                to: DType::F32,
                tensor: None,
            });
        };
        let n = src.len() / ss;
        if n * ss != src.len() || dst.len() != n * 4 {
            return Err(Error::LengthMismatch {
                op: OP,
                expected: n * 4,
                actual: dst.len(),
                tensor: None,
            });
        }
        for (addr, size) in [(src.device_ptr().0, ss), (dst.device_ptr().0, 4)] {
            if !addr.is_multiple_of(size as u64) {
                return Err(Error::Misaligned {
                    op: OP,
                    addr,
                    align: size as u64,
                });
            }
        }
        if n == 0 {
            return Ok(());
        }
        // SAFETY: both views are live ranges of this device holding `n`
        // aligned elements of their dtypes (checked); `count` is a live,
        // aligned u64 of this device, borrowed mutably; `op` has a check
        // kernel (checked).
        unsafe {
            let k = KernelOp::WidenCheck {
                op,
                src: src.device_ptr(),
                dst: dst.device_ptr(),
                n: n as u64,
                count: count.device_ptr(),
            };
            self.backend().run(&k, self.raw())
        }
    }

    /// Counts NaN and Inf in `buf` (f32, bf16, f16) without changing it.
    /// Waits for the result.
    ///
    /// Errors: [`Error::UnsupportedConversion`] for other dtypes.
    pub fn count_nonfinite<T: Element>(&self, buf: &DeviceView<'_, T>) -> Result<NonFinite> {
        self.scan_nonfinite::<T>(
            "count_nonfinite",
            buf.device(),
            buf.device_ptr(),
            buf.len(),
            false,
        )
    }

    /// Queues counting NaN and Inf in `buf` (f32, bf16, f16), added to
    /// `counts[0]` (NaN) and `counts[1]` (Inf), without waiting: read
    /// `counts` back after it (the conv3d chain's scan, read back with its
    /// other check results in one copy).
    ///
    /// Errors: [`Error::UnsupportedConversion`] for other dtypes;
    /// [`Error::DeviceMismatch`]; [`Error::LengthMismatch`] for `counts`
    /// not two elements.
    pub fn count_nonfinite_into<T: Element>(
        &self,
        buf: &DeviceView<'_, T>,
        counts: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        self.count_nonfinite_gated_into(buf, counts, None)
    }

    /// As [`Stream::count_nonfinite_into`], and with a `gate` (one `u64`
    /// of this device) the scan runs only when the gate is non-zero as it
    /// starts (the guarded conv3d fallback's scans of work it may skip).
    ///
    /// Errors: as [`Stream::count_nonfinite_into`], and
    /// [`Error::LengthMismatch`] for a gate that is not one element.
    pub fn count_nonfinite_gated_into<T: Element>(
        &self,
        buf: &DeviceView<'_, T>,
        counts: &mut DeviceViewMut<'_, u64>,
        gate: Option<&DeviceView<'_, u64>>,
    ) -> Result<()> {
        const OP: &str = "count_nonfinite";
        self.check_device(OP, buf.device())?;
        self.check_device(OP, counts.device())?;
        let gate = self.gate_ptr((OP, "nonfinite gate"), gate)?;
        if !matches!(T::DTYPE, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::UnsupportedConversion {
                op: OP,
                from: T::DTYPE,
                to: T::DTYPE,
                tensor: None,
            });
        }
        if counts.len() != 2 {
            return Err(Error::LengthMismatch {
                op: "nonfinite counts",
                expected: 2,
                actual: counts.len(),
                tensor: None,
            });
        }
        if buf.is_empty() {
            return Ok(());
        }
        let op = KernelOp::CountNonFinite {
            dtype: T::DTYPE,
            ptr: buf.device_ptr(),
            n: buf.len() as u64,
            counts: counts.device_ptr(),
            gate,
        };
        // SAFETY: `buf` is a live range of `len` elements on this device,
        // only read; `counts` two aligned u64s of this device, borrowed
        // mutably; the gate one u64 of this device, only read.
        unsafe { self.backend().run(&op, self.raw()) }
    }

    /// Counts NaN and Inf in `buf` (f32, bf16, f16) and rewrites NaN to 0
    /// and +-Inf to +-max finite, in place. Waits for the result; the
    /// counts are of the values before the rewrite.
    ///
    /// Errors: [`Error::UnsupportedConversion`] for other dtypes.
    pub fn clamp_nonfinite<T: Element>(&self, buf: &mut DeviceViewMut<'_, T>) -> Result<NonFinite> {
        let (device, ptr, len) = (buf.device(), buf.device_ptr(), buf.len());
        self.scan_nonfinite::<T>("clamp_nonfinite", device, ptr, len, true)
    }

    /// The scan of [`Stream::count_nonfinite`] (`clamp` false; the range
    /// shared-borrowed) and [`Stream::clamp_nonfinite`] (`clamp` true; the
    /// range borrowed mutably by the caller).
    fn scan_nonfinite<T: Element>(
        &self,
        op: &'static str,
        device: &super::Device,
        ptr: super::info::DevicePtr,
        len: usize,
        clamp: bool,
    ) -> Result<NonFinite> {
        self.check_device(op, device)?;
        if !matches!(T::DTYPE, DType::F32 | DType::BF16 | DType::F16) {
            return Err(Error::UnsupportedConversion {
                op,
                from: T::DTYPE,
                to: T::DTYPE,
                tensor: None,
            });
        }
        if len == 0 {
            return Ok(NonFinite::default());
        }
        let counts = self.alloc_zeros::<u64>(2)?;
        let (dtype, n, counts_ptr) = (T::DTYPE, len as u64, counts.device_ptr());
        let op = if clamp {
            KernelOp::ClampNonFinite {
                dtype,
                ptr,
                n,
                counts: counts_ptr,
            }
        } else {
            KernelOp::CountNonFinite {
                dtype,
                ptr,
                n,
                counts: counts_ptr,
                gate: None,
            }
        };
        // SAFETY: `ptr` is a live range of `len` elements on this device
        // (from a view, checked above), exclusively borrowed by the caller
        // when `clamp` rewrites it; `counts` holds two aligned u64s.
        unsafe { self.backend().run(&op, self.raw())? };
        let mut out = [0u64; 2];
        counts.copy_dtoh(&mut out)?;
        Ok(NonFinite {
            nan: out[0],
            inf: out[1],
        })
    }
}
