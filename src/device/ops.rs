//! The kernel operations queued on a [`Stream`]: conversions,
//! fingerprints and non-finite scans, checked before they reach a backend.

use super::backend::KernelOp;
use super::buffer::{DeviceView, DeviceViewMut};
use super::info::ConvertOp;
use super::stream::Stream;
use crate::convert::fingerprint::{finish, Fingerprint};
use crate::convert::Element;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// NaN and Inf counts of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct NonFinite {
    /// NaN values.
    pub nan: u64,
    /// Infinite values (either sign).
    pub inf: u64,
}

impl Stream {
    /// this stream; lengths must be equal.
    pub fn convert<S: Element, D: Element>(
        &self,
        src: &DeviceView<'_, S>,
        dst: &mut DeviceViewMut<'_, D>,
    ) -> Result<()> {
        let op = self.check_convert("convert", src, dst)?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: both views are live ranges of allocations on this device
        // (checked), `dst` is borrowed mutably so nothing else writes it, the
        // lengths are equal and non-zero, and the element types match `op`.
        unsafe {
            let op = KernelOp::Convert {
                op,
                src: src.device_ptr(),
                dst: dst.device_ptr(),
                n: src.len() as u64,
            };
            self.backend().run(&op, self.raw())
        }
    }

    fn check_convert<S: Element, D: Element>(
        &self,
        op: &'static str,
        src: &DeviceView<'_, S>,
        dst: &DeviceViewMut<'_, D>,
    ) -> Result<ConvertOp> {
        self.check_device(op, src.device())?;
        self.check_device(op, dst.device())?;
        let c = ConvertOp {
            from: S::DTYPE,
            to: D::DTYPE,
        };
        if !c.on_device() {
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
        Ok(c)
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
    /// sum of the output (as the kernel wrote it) to `acc[0]`.
    pub fn convert_fingerprint_into<S: Element>(
        &self,
        src: &DeviceView<'_, S>,
        dst: &mut DeviceViewMut<'_, f32>,
        acc: &mut DeviceViewMut<'_, u64>,
    ) -> Result<()> {
        let op = self.check_convert("convert_fingerprint", src, dst)?;
        self.check_device("convert_fingerprint", acc.device())?;
        if acc.len() != 1 {
            return Err(Error::LengthMismatch {
                op: "fingerprint accumulator",
                expected: 1,
                actual: acc.len(),
                tensor: None,
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `convert` and `fingerprint_sum_into`; `op` is a
        // widening to f32 (checked by `check_convert` with D = f32).
        unsafe {
            let op = KernelOp::ConvertFingerprint {
                op,
                src: src.device_ptr(),
                dst: dst.device_ptr(),
                n: src.len() as u64,
                acc: acc.device_ptr(),
            };
            self.backend().run(&op, self.raw())
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
        const OP: &str = "count_nonfinite";
        self.check_device(OP, buf.device())?;
        self.check_device(OP, counts.device())?;
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
        };
        // SAFETY: `buf` is a live range of `len` elements on this device,
        // only read; `counts` two aligned u64s of this device, borrowed
        // mutably.
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
        ptr: super::DevicePtr,
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
