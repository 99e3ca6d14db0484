//! [`Managed`]: the owning handle of a managed tensor that an [`Export`]
//! made, until it is given up as a pointer.
//!
//! [`Export`]: super::Export

use std::ptr::NonNull;

use super::ffi::{DLManagedTensor, DLManagedTensorVersioned, DLTensor, ManagedTensor};

/// A managed tensor of either ABI ([`DLManagedTensor`] or
/// [`DLManagedTensorVersioned`], version 1.3) that this handle owns:
/// dropping it calls the deleter (the memory goes back to rocm-safe);
/// [`Managed::into_raw`] gives it up to a consumer (a capsule, a C
/// caller), who must call the deleter exactly once.
pub struct Managed<M: ManagedTensor> {
    ptr: NonNull<M>,
}

// SAFETY: the handle owns the structure alone; its deleter (rocm-safe's
// own) may run on any thread, and the owner it frees is `Send`.
unsafe impl<M: ManagedTensor> Send for Managed<M> {}

impl<M: ManagedTensor> Managed<M> {
    /// Takes ownership of a managed tensor.
    ///
    /// # Safety
    /// `ptr` is a valid managed tensor of this ABI, owned by the caller and
    /// given up here, whose `dl_tensor` stays readable until its deleter.
    pub(super) unsafe fn from_raw(ptr: NonNull<M>) -> Managed<M> {
        Managed { ptr }
    }

    /// The structure's address, still owned by this handle.
    pub fn as_ptr(&self) -> *mut M {
        self.ptr.as_ptr()
    }

    /// Gives the structure up: the caller owns it and must call its deleter
    /// exactly once.
    pub fn into_raw(self) -> *mut M {
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        p
    }
}

impl Managed<DLManagedTensor> {
    /// The tensor's description, while this handle owns it.
    pub fn tensor(&self) -> &DLTensor {
        // SAFETY: valid while owned (`from_raw`'s contract).
        unsafe { &(*self.ptr.as_ptr()).dl_tensor }
    }
}

impl Managed<DLManagedTensorVersioned> {
    /// The tensor's description, while this handle owns it (version 1.3:
    /// the field is where this layout has it).
    pub fn tensor(&self) -> &DLTensor {
        // SAFETY: as above.
        unsafe { &(*self.ptr.as_ptr()).dl_tensor }
    }
}

impl<M: ManagedTensor> Drop for Managed<M> {
    fn drop(&mut self) {
        // SAFETY: owned here alone, and not used again.
        unsafe { M::delete(self.ptr.as_ptr()) }
    }
}

impl<M: ManagedTensor> std::fmt::Debug for Managed<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Managed").field("ptr", &self.ptr).finish()
    }
}
