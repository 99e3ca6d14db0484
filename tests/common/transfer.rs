//! Shared by the loader's tests (`tests/transfer/ladder.rs`,
//! `tests/transfer/loads.rs`): checkpoints written with random contents
//! (mixed dtypes and sizes; many tiny tensors), small and roomy load
//! options, `Faults` over the host backend, and the checks of a load
//! against the CPU reader.

use std::path::{Path, PathBuf};

use rocm_safe::device::{
    host::HostBackend,
    raw::{Backend, Driver, Wrap},
    Device,
};
use rocm_safe::safetensors::{Checkpoint, SafeTensorsWriter, TensorSpec};
use rocm_safe::transfer::{LoadOptions, Loaded, Rung};
use rocm_safe::DType;

use super::Rng;

/// Writes a checkpoint of `(name, dtype, shape)` with random contents.
pub fn write(dir: &Path, file: &str, specs: &[(&str, DType, Vec<u64>)], seed: u64) -> PathBuf {
    let path = dir.join(file);
    let mut rng = Rng::new(seed);
    let mut w = SafeTensorsWriter::create(
        &path,
        specs
            .iter()
            .map(|(n, d, s)| TensorSpec::new(*n, *d, s.clone())),
        None,
    )
    .unwrap();
    for (n, d, s) in specs {
        let elems: u64 = s.iter().product();
        let bytes = rng.bytes(d.bytes_for(elems).unwrap() as usize);
        w.write_tensor(n, &bytes).unwrap();
    }
    w.finish().unwrap()
}

/// A mixed checkpoint: small tensors (coalesced), tensors spanning several
/// 64 KiB ring buffers, a scalar, integers, f64.
pub fn mixed(dir: &Path) -> PathBuf {
    write(
        dir,
        "mixed.safetensors",
        &[
            ("a.bf16", DType::BF16, vec![3, 5]),
            ("b.big_bf16", DType::BF16, vec![300, 333]),
            ("c.f16", DType::F16, vec![1000]),
            ("d.f32", DType::F32, vec![70, 1001]),
            ("e.i32", DType::I32, vec![17]),
            ("f.f64", DType::F64, vec![33]),
            ("g.scalar", DType::BF16, vec![]),
            ("h.u8", DType::U8, vec![3]),
            ("i.empty", DType::BF16, vec![0, 4]),
        ],
        7,
    )
}

pub fn small(dtype: Option<DType>) -> LoadOptions {
    LoadOptions::default()
        .with_dtype(dtype)
        .with_ring_buffers(2)
        .with_buffer_bytes(64 * 1024)
        .with_small_chunk_bytes(16 * 1024)
}

/// The host backend as a GPU's copy engine sees registered memory: it
/// accepts read-only registrations (the host backend itself refuses them),
/// so the loader's direct path runs over it. Its "DMA" is a CPU read of
/// the mapping: tests must not change a file while it loads.
#[derive(Debug)]
pub struct Dma(pub HostBackend);

impl Wrap for Dma {
    type Inner = HostBackend;
    fn inner(&self) -> &HostBackend {
        &self.0
    }
}

// SAFETY: every operation is the host backend's; a registration does
// nothing (host memory is what the host backend copies from anyway).
unsafe impl Driver for Dma {
    rocm_safe::forward_driver!(
        info,
        alloc,
        free,
        alloc_pinned,
        free_pinned,
        stream_create,
        stream_destroy,
        stream_synchronize,
        synchronize,
        event_create,
        event_destroy,
        event_record,
        event_synchronize,
        stream_wait_event,
        event_elapsed_ms,
        copy,
        memset_zero,
        mem_info,
    );
    unsafe fn register_read_only(&self, _p: *const u8, _bytes: usize) -> rocm_safe::Result<()> {
        Ok(())
    }
    unsafe fn unregister_read_only(&self, _p: *const u8) -> rocm_safe::Result<()> {
        Ok(())
    }
}

// SAFETY: as above.
unsafe impl Backend for Dma {
    rocm_safe::forward_backend!(all);
}

/// A device over [`Dma`].
pub fn dma() -> Device {
    Device::from_backend(Box::new(Dma(HostBackend::new())))
}

/// `Faults` over [`Dma`].
/// The direct path's backend under fault injection:
/// `faults::faulty(Dma(HostBackend::new()), plan)`.
impl super::faults::Target for Dma {
    fn backend(self) -> Box<dyn Backend> {
        Box::new(self)
    }
}

/// Every loaded tensor equals the CPU reader's result, byte for byte.
pub fn assert_exact(ckpt: &Checkpoint, loaded: &Loaded) {
    for t in &loaded.tensors {
        let info = ckpt.info(&t.name).unwrap();
        let want = if t.dtype == info.dtype {
            ckpt.read_bytes(&t.name).unwrap()
        } else {
            ckpt.read_converted_bytes(&t.name, t.dtype).unwrap()
        };
        assert_eq!(t.data.to_host().unwrap(), want, "tensor {}", t.name);
        let rep = loaded.report.tensor(&t.name).unwrap();
        assert_eq!(rep.out_bytes as usize, want.len());
        assert_eq!(t.data.is_device(), rep.rung != Rung::KeepOnHost);
        // Kept on the host means host memory; a buffer is host memory
        // exactly when its device is the host backend (or Faults over it).
        match t.data.device_buffer() {
            None => assert!(t.data.is_host_memory(), "tensor {}", t.name),
            Some(b) => assert_eq!(
                t.data.is_host_memory(),
                b.device().kind() == rocm_safe::device::BackendKind::Host,
                "tensor {}",
                t.name
            ),
        }
    }
}

/// A checkpoint of `n` tiny bf16 tensors (`t000`, ...: 2 to 5 elements
/// each), and their names in order.
pub fn tiny(dir: &Path, n: usize) -> (PathBuf, Vec<String>) {
    let names: Vec<String> = (0..n).map(|i| format!("t{i:03}")).collect();
    let specs: Vec<(&str, DType, Vec<u64>)> = names
        .iter()
        .enumerate()
        .map(|(i, nm)| (nm.as_str(), DType::BF16, vec![2 + i as u64 % 4]))
        .collect();
    (write(dir, "tiny.safetensors", &specs, 11), names)
}

/// bf16 -> f32 with slots of 1 MiB: room for 4096 tiny pieces (256 bytes
/// each, the piece alignment), so the limit of 256 pieces per slot is what
/// splits the jobs.
pub fn roomy() -> LoadOptions {
    LoadOptions::default()
        .with_dtype(Some(DType::F32))
        .with_ring_buffers(2)
        .with_buffer_bytes(1 << 20)
        .with_small_chunk_bytes(16 * 1024)
}

/// Each loaded tensor is the CPU's widening of its bf16 bits.
pub fn assert_widened(ckpt: &Checkpoint, loaded: &Loaded) {
    for t in &loaded.tensors {
        let raw = ckpt.read_bytes(&t.name).unwrap();
        let want: Vec<u8> = raw
            .chunks_exact(2)
            .flat_map(|b| {
                rocm_safe::convert::scalar::bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
                    .to_le_bytes()
            })
            .collect();
        assert_eq!(t.data.to_host().unwrap(), want, "tensor {}", t.name);
    }
}
