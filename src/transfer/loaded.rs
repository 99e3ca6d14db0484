//! What a load returns: the loaded tensors and the progress.

use super::LoadReport;
use crate::convert::Element;
use crate::device::{DeviceBuffer, DeviceView};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// Where a loaded tensor's bytes are.
#[derive(Debug)]
pub enum TensorData {
    /// Device memory (cast its views to the dtype:
    /// `buf.view().cast::<f32>()`).
    Device(DeviceBuffer<u8>),
    /// Host memory (the keep-on-host rung, or offloaded by the budget).
    Host(Vec<u8>),
}

impl TensorData {
    /// The device buffer, if on the device.
    pub fn device_buffer(&self) -> Option<&DeviceBuffer<u8>> {
        match self {
            TensorData::Device(b) => Some(b),
            TensorData::Host(_) => None,
        }
    }

    /// The bytes (copied back from the device when there).
    pub fn to_host(&self) -> Result<Vec<u8>> {
        match self {
            TensorData::Device(b) => b.to_vec(),
            TensorData::Host(v) => Ok(v.clone()),
        }
    }

    /// Whether the data is on the device.
    pub fn is_device(&self) -> bool {
        matches!(self, TensorData::Device(_))
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
    /// on the host ([`TensorData::Host`]).
    ///
    /// Errors: [`Error::DTypeMismatch`] when `T` is not its dtype,
    /// [`Error::Misaligned`] / [`Error::LengthMismatch`] from the cast.
    pub fn device_view<T: Element>(&self) -> Result<Option<DeviceView<'_, T>>> {
        self.check::<T>()?;
        match &self.data {
            TensorData::Device(b) => Ok(Some(b.view().cast::<T>()?)),
            TensorData::Host(_) => Ok(None),
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
            TensorData::Device(b) => {
                return b.view().cast::<T>()?.to_vec(b.stream());
            }
            TensorData::Host(v) => v,
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
