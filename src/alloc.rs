//! Host allocations that can fail: sizes checked against the machine's
//! memory before they are tried, and tried fallibly.
//!
//! Rust's `vec![0; n]` aborts the process when the allocator refuses. A
//! size that comes from a file or a user (a tensor's declared shape, a
//! convolution's padding) must instead become a typed error, so every
//! such allocation goes through [`try_zeroed_vec`], after a check against
//! [`memory_limit`] (an allocation larger than all of RAM plus swap can
//! only fail, or succeed on an overcommitting kernel and be killed later).

use std::sync::OnceLock;

/// Bytes of RAM plus swap of this machine (`sysinfo(2)`), read once;
/// `u64::MAX` where it cannot be read (the fallible allocation is then the
/// only check). No host allocation larger than this is tried.
pub(crate) fn memory_limit() -> u64 {
    static LIMIT: OnceLock<u64> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        // SAFETY: `sysinfo` is plain old data; all-zero is a valid value.
        let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable `sysinfo` for the call.
        let rc = unsafe { libc::sysinfo(&mut info) };
        if rc != 0 {
            return u64::MAX;
        }
        let unit = u64::from(info.mem_unit.max(1));
        #[allow(clippy::useless_conversion)] // c_ulong: u32 on 32-bit targets
        let ram = u64::from(info.totalram).saturating_mul(unit);
        #[allow(clippy::useless_conversion)]
        let swap = u64::from(info.totalswap).saturating_mul(unit);
        match ram.saturating_add(swap) {
            0 => u64::MAX,
            n => n,
        }
    })
}

/// Why a host allocation was not made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocFailure {
    /// The size is above [`memory_limit`]; nothing was tried.
    AboveLimit,
    /// The allocator refused.
    Refused,
}

/// A vector of `n` zeroed `T`, or why it could not be allocated. Zeroed
/// memory comes from `alloc_zeroed` (the kernel's zero pages for large
/// sizes, so untouched pages cost nothing), never from a write pass.
pub(crate) fn try_zeroed_vec<T: bytemuck::Zeroable>(
    n: usize,
) -> std::result::Result<Vec<T>, AllocFailure> {
    let Ok(layout) = std::alloc::Layout::array::<T>(n) else {
        return Err(AllocFailure::AboveLimit);
    };
    if layout.size() as u64 > memory_limit() {
        return Err(AllocFailure::AboveLimit);
    }
    if layout.size() == 0 {
        // Zero-sized: no allocation (a dangling, aligned pointer).
        return Ok(bytemuck::zeroed_vec(n));
    }
    // SAFETY: `layout` has a non-zero size (checked above).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(AllocFailure::Refused);
    }
    // SAFETY: `ptr` was allocated by the global allocator with the layout
    // of `[T; n]` (same size and alignment as `Vec<T>` with capacity `n`
    // uses), it is non-null, and all `n` elements are initialised: the
    // memory is zeroed and `T: Zeroable` makes all-zero a valid `T`.
    Ok(unsafe { Vec::from_raw_parts(ptr.cast::<T>(), n, n) })
}

/// `n` zeroed elements for tensor `tensor` of the file `path`, or
/// [`Error::AllocationFailed`](crate::Error::AllocationFailed): every host
/// buffer whose size a file declares goes through here, so a huge declared
/// size is an error, never an abort.
pub(crate) fn tensor_vec<T: bytemuck::Zeroable>(
    path: &std::path::Path,
    tensor: &str,
    n: u64,
) -> crate::Result<Vec<T>> {
    let failed = |reason| crate::Error::AllocationFailed {
        path: path.to_owned(),
        tensor: tensor.to_owned(),
        bytes: n.saturating_mul(std::mem::size_of::<T>() as u64),
        limit: memory_limit(),
        reason,
    };
    let n = usize::try_from(n).map_err(|_| failed("larger than memory"))?;
    try_zeroed_vec(n).map_err(|f| {
        failed(match f {
            AllocFailure::AboveLimit => "larger than memory",
            AllocFailure::Refused => "allocator refused",
        })
    })
}

/// [`tensor_vec`] of `n` bytes.
pub(crate) fn tensor_bytes(path: &std::path::Path, tensor: &str, n: u64) -> crate::Result<Vec<u8>> {
    tensor_vec(path, tensor, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_vec_small_zero_and_huge() {
        let v: Vec<u32> = try_zeroed_vec(1000).unwrap();
        assert_eq!(v.len(), 1000);
        assert!(v.iter().all(|&x| x == 0));
        let e: Vec<u64> = try_zeroed_vec(0).unwrap();
        assert!(e.is_empty());
        let limit = memory_limit();
        assert!(limit > 1 << 20);
        let n = usize::try_from(limit / 4 + 1).unwrap_or(usize::MAX);
        assert_eq!(
            try_zeroed_vec::<f32>(n).err(),
            Some(AllocFailure::AboveLimit)
        );
        assert_eq!(
            try_zeroed_vec::<f64>(usize::MAX).err(),
            Some(AllocFailure::AboveLimit)
        );
    }
}
