//! What a load returns: the loaded tensors and the progress.

use super::LoadReport;
use crate::convert::Element;
use crate::device::{DeviceBuffer, DeviceView};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Where a loaded tensor's bytes are: where the load was asked to put them,
/// or kept on the host instead.
///
/// (Renamed from `Device`/`Host`: a load onto the host backend returns
/// `Buffer`s of host memory, which the old name called "Device".)
#[derive(Debug)]
#[non_exhaustive]
pub enum TensorData {
    /// A buffer of the load's device: GPU memory on a GPU, host memory when
    /// the device is the host backend. Cast its views to the dtype:
    /// `buf.view().cast::<f32>()`.
    Buffer(DeviceBuffer<u8>),
    /// Kept in host memory although the load's device is a GPU (the
    /// keep-on-host rung of the ladder, or offloaded by the memory budget).
    KeptOnHost(Vec<u8>),
}

impl TensorData {
    /// The buffer of the load's device, unless the data was kept on the host.
    pub fn device_buffer(&self) -> Option<&DeviceBuffer<u8>> {
        match self {
            TensorData::Buffer(b) => Some(b),
            TensorData::KeptOnHost(_) => None,
        }
    }

    /// The bytes (copied back from the device when there).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        match self {
            TensorData::Buffer(b) => b.to_vec(),
            TensorData::KeptOnHost(v) => Ok(v.clone()),
        }
    }

    /// Whether the data is in a buffer of the load's device (not
    /// [`TensorData::KeptOnHost`]). On the host backend that buffer is host
    /// memory: [`TensorData::is_host_memory`] says where the bytes live.
    pub fn is_device(&self) -> bool {
        matches!(self, TensorData::Buffer(_))
    }

    /// Whether the bytes are in host memory: kept on the host, or a buffer
    /// of the host backend.
    pub fn is_host_memory(&self) -> bool {
        match self {
            TensorData::Buffer(b) => b.device().kind() == crate::device::BackendKind::Host,
            TensorData::KeptOnHost(_) => true,
        }
    }
}

/// One loaded tensor.
#[derive(Debug)]
pub struct LoadedTensor {
    /// The tensor's name.
    pub name: String,
    /// The dtype of `data`.
    pub dtype: DType,
    /// The shape of `data`.
    pub shape: Vec<u64>,
    /// The bytes.
    pub data: TensorData,
}

impl LoadedTensor {
    /// Its elements as `T` on the device, borrowed; `None` when it was kept
    /// on the host ([`TensorData::KeptOnHost`]).
    ///
    /// Errors: [`Error::DTypeMismatch`] when `T` is not its dtype,
    /// [`Error::Misaligned`] / [`Error::LengthMismatch`] from the cast.
    pub fn device_view<T: Element>(&self) -> Result<Option<DeviceView<'_, T>>> {
        self.check::<T>()?;
        match &self.data {
            TensorData::Buffer(b) => Ok(Some(b.view().cast::<T>()?)),
            TensorData::KeptOnHost(_) => Ok(None),
        }
    }

    /// Its elements as a vector of `T` (copied back from the device when
    /// there; decoded from bytes, never assuming alignment, on the host).
    ///
    /// Errors: [`Error::DTypeMismatch`] when `T` is not its dtype; device
    /// copy errors.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check::<T>()?;
        let bytes = match &self.data {
            TensorData::Buffer(b) => {
                return b.view().cast::<T>()?.to_vec(b.stream());
            }
            TensorData::KeptOnHost(v) => v,
        };
        let size = std::mem::size_of::<T>();
        if bytes.len() % size != 0 {
            return Err(Error::LengthMismatch {
                op: "LoadedTensor::to_vec",
                expected: bytes.len() / size * size,
                actual: bytes.len(),
                tensor: None,
            });
        }
        Ok(bytemuck::pod_collect_to_vec(bytes))
    }

    fn check<T: Element>(&self) -> Result<()> {
        if T::DTYPE == self.dtype {
            Ok(())
        } else {
            Err(Error::DTypeMismatch {
                tensor: self.name.clone(),
                stored: self.dtype,
                asked: T::DTYPE,
            })
        }
    }
}

/// The result of a load.
#[derive(Debug)]
pub struct Loaded {
    /// The tensors, in request order.
    pub tensors: Vec<LoadedTensor>,
    /// What happened.
    pub report: LoadReport,
}

impl Loaded {
    /// The tensor `name`.
    pub fn get(&self, name: &str) -> Option<&LoadedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Progress of a load, passed to the callback of
/// [`Loader::load_with_progress`](super::Loader::load_with_progress).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadProgress {
    /// File bytes loaded and checked so far.
    pub done_bytes: u64,
    /// File bytes of the whole load.
    pub total_bytes: u64,
    /// Tensors finished.
    pub done_tensors: usize,
    /// Tensors in the load.
    pub total_tensors: usize,
}
