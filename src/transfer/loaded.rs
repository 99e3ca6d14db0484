//! What a load returns: the loaded tensors and the progress.

use super::LoadReport;
use crate::device::DeviceBuffer;
use crate::dtype::DType;
use crate::error::Result;

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
