//! Handing device memory and streams across the boundary with another
//! framework: raw parts, borrowed views of outside memory, borrowed streams,
//! deferred frees and the device's accounting of what it owns. `host::*`
//! always; `cuda::*` / `hip::*` with `--ignored` on a GPU.

use half::bf16;
use rocm_safe::convert::scalar;
use rocm_safe::device::{
    raw::DevicePtr, BackendKind, Device, DeviceBuffer, DeviceView, DeviceViewMut, Stream,
};
use rocm_safe::Error;

per_device!(
    raw_parts_round_trip_and_account,
    outside_memory_borrowed_as_views,
    borrowed_stream_is_never_destroyed,
    drops_defer_frees_to_the_next_sync_point,
);

fn raw_parts_round_trip_and_account(dev: &Device) {
    dev.synchronize().unwrap();
    let base = dev.owned_bytes();
    let s = dev.stream().unwrap();
    let data: Vec<u32> = (0..1000).collect();
    let b = s.clone_htod(&data).unwrap();
    assert_eq!(dev.owned_bytes(), base + 4000);
    let (ptr, len, stream) = b.into_raw_parts();
    assert_eq!(len, 1000);
    // Given away: no longer ours, and not freed.
    assert_eq!(dev.owned_bytes(), base);
    dev.synchronize().unwrap();
    assert_eq!(dev.pending_free_bytes(), 0);
    // SAFETY: the parts just given up, taken back once.
    let back = unsafe { DeviceBuffer::<u32>::from_raw_parts(ptr, len, stream) };
    assert_eq!(dev.owned_bytes(), base + 4000);
    assert_eq!(back.to_vec().unwrap(), data);
    drop(back);
    dev.synchronize().unwrap();
    assert_eq!(dev.owned_bytes(), base);
    assert!(dev.take_errors().is_empty());
}

fn outside_memory_borrowed_as_views(dev: &Device) {
    let s = dev.stream().unwrap();
    // "Another framework's" memory: allocated, then given up by rocm-safe.
    let all: Vec<bf16> = (0..=u16::MAX).map(bf16::from_bits).collect();
    let (src_ptr, n, _) = s.clone_htod(&all).unwrap().into_raw_parts();
    let (dst_ptr, _, _) = s.alloc::<f32>(n).unwrap().into_raw_parts();
    {
        // SAFETY: both are live allocations of `dev` of `n` elements that
        // nothing else uses while the views live.
        let (src, mut dst) = unsafe {
            (
                DeviceView::<bf16>::from_raw(dev, src_ptr, n).unwrap(),
                DeviceViewMut::<f32>::from_raw(dev, dst_ptr, n).unwrap(),
            )
        };
        s.convert(&src, &mut dst).unwrap();
        let got = dst.as_view().to_vec(&s).unwrap();
        for (b, x) in all.iter().zip(&got) {
            assert_eq!(x.to_bits(), scalar::bf16_to_f32(b.to_bits()));
        }
        assert_eq!(
            s.fingerprint(&src).unwrap(),
            s.fingerprint(&src.slice(..).unwrap()).unwrap()
        );
    }
    // A misaligned address is refused, not read.
    // SAFETY: refused before any use.
    let e = unsafe { DeviceView::<f32>::from_raw(dev, src_ptr.offset(2), 4) }.unwrap_err();
    assert!(matches!(e, Error::Misaligned { .. }), "{e}");
    // SAFETY: refused before any use.
    let e = unsafe { DeviceView::<f32>::from_raw(dev, src_ptr, usize::MAX) }.unwrap_err();
    assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
    // The views freed nothing: give the memory back to be freed.
    // SAFETY: the parts given up above, taken back once.
    unsafe {
        drop(DeviceBuffer::<bf16>::from_raw_parts(src_ptr, n, s.clone()));
        drop(DeviceBuffer::<f32>::from_raw_parts(dst_ptr, n, s.clone()));
    }
    dev.synchronize().unwrap();
    assert!(dev.take_errors().is_empty());
}

fn borrowed_stream_is_never_destroyed(dev: &Device) {
    let raw = dev.backend().stream_create().unwrap();
    {
        // SAFETY: `raw` is a live stream of `dev`, destroyed below after
        // every user is gone.
        let s = unsafe { Stream::from_raw(dev, raw) };
        assert!(!s.is_owned());
        let x: Vec<bf16> = (0..4096u16).map(bf16::from_bits).collect();
        let src = s.clone_htod(&x).unwrap();
        let mut out = s.alloc::<f32>(x.len()).unwrap();
        s.convert(&src.view(), &mut out.view_mut()).unwrap();
        s.synchronize().unwrap();
        let got = out.to_vec().unwrap();
        assert_eq!(got[4095].to_bits(), scalar::bf16_to_f32(4095));
    }
    // Still live: rocm-safe neither synchronized-and-destroyed it nor
    // recorded an error.
    // SAFETY: `raw` is live (never destroyed by the wrapper).
    unsafe { dev.backend().stream_synchronize(raw) }.unwrap();
    // SAFETY: destroyed once, by its owner, nothing uses it.
    unsafe { dev.backend().stream_destroy(raw) }.unwrap();
    dev.synchronize().unwrap();
    assert!(dev.take_errors().is_empty());
    assert!(dev.stream().unwrap().is_owned());
}

fn drops_defer_frees_to_the_next_sync_point(dev: &Device) {
    dev.synchronize().unwrap();
    let base = dev.owned_bytes();
    let s = dev.stream().unwrap();
    let b = s.alloc_zeros::<u8>(1 << 20).unwrap();
    drop(b);
    // Not waited for, not freed yet.
    assert_eq!(dev.pending_free_bytes(), 1 << 20);
    assert_eq!(dev.owned_bytes(), base + (1 << 20));
    dev.synchronize().unwrap();
    assert_eq!(dev.pending_free_bytes(), 0);
    assert_eq!(dev.owned_bytes(), base);
    // Past the cap, a drop frees everything waiting at once.
    let big: Vec<DeviceBuffer<u8>> = (0..5).map(|_| s.alloc::<u8>(64 << 20).unwrap()).collect();
    drop(big);
    assert!(
        dev.pending_free_bytes() <= 256 << 20,
        "{}",
        dev.pending_free_bytes()
    );
    dev.synchronize().unwrap();
    assert_eq!(dev.owned_bytes(), base);
    assert!(dev.take_errors().is_empty());
}

#[test]
fn first_available_falls_back_to_the_host() {
    let d = Device::first_available();
    let gpu_opens = [BackendKind::Hip, BackendKind::Cuda]
        .into_iter()
        .find(|k| k.is_built() && Device::open(*k, 0).is_ok());
    assert_eq!(d.kind(), gpu_opens.unwrap_or(BackendKind::Host));
}

#[test]
fn views_of_outside_memory_on_the_host_read_host_memory() {
    let dev = Device::host();
    let mine = vec![1.5f32, -2.0, 3.25];
    // SAFETY: host-backend "device" memory is host memory; `mine` outlives
    // the view and is not written meanwhile.
    let v =
        unsafe { DeviceView::<f32>::from_raw(&dev, DevicePtr(mine.as_ptr() as u64), 3) }.unwrap();
    assert_eq!(v.to_vec(&dev.stream().unwrap()).unwrap(), mine);
    assert_eq!(dev.owned_bytes(), 0);
}
