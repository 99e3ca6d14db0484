//! The conv3d chain on tensors handed over by DLPack capsules:
//! `conv3d`, its verification of a result computed elsewhere, the backward
//! ops, `conv_transpose3d` and the per-tier statistics. One chain per
//! device, made once.

use std::sync::{Arc, Mutex, OnceLock};

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use rocm_safe::conv3d::Conv3dParams;
use rocm_safe::conv3d_chain::{
    device_tiers, BackwardInputs, Conv3dChain, Conv3dOptions, Conv3dReport, DeviceConv3dData,
};
use rocm_safe::device::{raw::RawStream, BackendKind, Device, Stream};
use rocm_safe::dlpack::Imported;
use rocm_safe::DType;

use crate::errors::op_to_py;
use crate::interop::{device_of, lock, take_capsule};

// ---------------------------------------------------------------- conv3d

/// Each device's chain.
type Chains = Mutex<Vec<(Device, Arc<Conv3dChain>)>>;

/// The chain of each device, made once (statistics accumulate there).
/// Per process, not in the device's slot: a chain holds its device, and a
/// slot holding its own device would never be dropped (the devices live
/// for the process anyway: [`device_of`]).
fn chains() -> &'static Chains {
    static C: OnceLock<Chains> = OnceLock::new();
    C.get_or_init(Default::default)
}

pub(crate) fn chain_of(dev: &Device) -> Arc<Conv3dChain> {
    let mut v = lock(chains());
    if let Some((_, c)) = v.iter().find(|(d, _)| d.same(dev)) {
        return c.clone();
    }
    let tiers = device_tiers(dev);
    // With the `testing` feature, tiers that can be made to fail (tests).
    #[cfg(feature = "testing")]
    let tiers = crate::inject::wrap(tiers);
    let c = Arc::new(Conv3dChain::with_tiers(tiers, Conv3dOptions::default()));
    v.push((dev.clone(), c.clone()));
    c
}

pub(crate) fn import_data<'a>(imp: &'a Imported, what: &str) -> PyResult<DeviceConv3dData<'a>> {
    let map = |e: rocm_safe::Error| PyValueError::new_err(format!("{what}: {e}"));
    match imp.dtype() {
        DType::F32 => Ok(DeviceConv3dData::F32(imp.view().map_err(map)?)),
        DType::BF16 => Ok(DeviceConv3dData::BF16(imp.view().map_err(map)?)),
        d => Err(PyTypeError::new_err(format!(
            "{what}: dtype {} is not supported by the conv3d chain (float32 and bfloat16)",
            d.name()
        ))),
    }
}

/// The capsules of one call whose operands are an input, a weight, an
/// optional bias and an output, imported for one device (`op` names them
/// in errors), and what every such call needs besides.
pub(crate) struct Call {
    pub(crate) dev: Device,
    pub(crate) x: Imported,
    pub(crate) w: Imported,
    pub(crate) b: Option<Imported>,
    pub(crate) y: Imported,
}

/// A call's Python operands: input, weight, bias, output.
pub(crate) type PyOperands<'a, 'py> = (
    &'a Bound<'py, PyAny>,
    &'a Bound<'py, PyAny>,
    Option<&'a Bound<'py, PyAny>>,
    &'a Bound<'py, PyAny>,
);

impl Call {
    /// Opens `device` and takes the capsules (errors: `ValueError` /
    /// `TypeError` for a device or capsule the chain does not take).
    pub(crate) fn take(
        op: &'static str,
        device: &str,
        backend: Option<&str>,
        (input, weight, bias, out): PyOperands<'_, '_>,
    ) -> PyResult<Call> {
        let dev = device_of(device, backend)?;
        let what = |t: &str| format!("{op} {t}");
        let x = take_capsule(&dev, input, &what("input"))?;
        let w = take_capsule(&dev, weight, &what("weight"))?;
        let b = bias
            .map(|b| take_capsule(&dev, b, &what("bias")))
            .transpose()?;
        let y = take_capsule(&dev, out, &what("output"))?;
        Ok(Call { dev, x, w, b, y })
    }

    /// `TypeError` unless the output is float32 (`who` names the call).
    pub(crate) fn f32_output(&self, who: &str) -> PyResult<()> {
        if self.y.dtype() == DType::F32 {
            Ok(())
        } else {
            Err(PyTypeError::new_err(format!(
                "{who} output: must be float32"
            )))
        }
    }

    /// The stream the call runs on ([`call_stream`]).
    pub(crate) fn stream(&self, raw: u64) -> PyResult<Stream> {
        call_stream(&self.dev, raw)
    }
}

/// Input, weight and bias as the chain takes them, and the input's and
/// weight's shapes (`op` names them in errors).
pub(crate) fn operands_of<'a>(
    x: &'a Imported,
    w: &'a Imported,
    b: Option<&'a Imported>,
    op: &str,
) -> PyResult<CallOperands<'a>> {
    let what = |t: &str| format!("{op} {t}");
    let xd = import_data(x, &what("input"))?;
    let wd = import_data(w, &what("weight"))?;
    let bd = b.map(|b| import_data(b, &what("bias"))).transpose()?;
    Ok((xd, wd, bd, x.shape().to_vec(), w.shape().to_vec()))
}

/// Input, weight, bias, the input's shape and the weight's shape.
pub(crate) type CallOperands<'a> = (
    DeviceConv3dData<'a>,
    DeviceConv3dData<'a>,
    Option<DeviceConv3dData<'a>>,
    Vec<u64>,
    Vec<u64>,
);

/// The parameters of a call.
pub(crate) fn params(
    stride: [usize; 3],
    padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
) -> Conv3dParams {
    Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    }
}

/// `conv3d(device, stream, input, weight, bias, out, stride, padding,
/// dilation, groups, backend=None)`: the conv3d chain on tensors borrowed
/// through DLPack capsules (`out`: f32, the output's shape, written in
/// place), with its device work on `stream` (PyTorch's current stream's
/// handle; ignored on `"cpu"`). Returns `(served tier name, report)`.
/// Errors: `TypeError` / `ValueError` for what the chain does not take,
/// `RuntimeError` when no tier served (with the report).
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, dilation, groups, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv3d(
    py: Python<'_>,
    device: &str,
    stream: u64,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    stride: [usize; 3],
    padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
) -> PyResult<(String, String)> {
    let call = Call::take("conv3d", device, backend, (input, weight, bias, out))?;
    call.f32_output("conv3d")?;
    let s = call.stream(stream)?;
    let params = params(stride, padding, dilation, groups);
    let chain = chain_of(&call.dev);
    let Call { x, w, b, mut y, .. } = call;
    let (xd, wd, bd, xs, ws) = operands_of(&x, &w, b.as_ref(), "conv3d")?;
    let mut yv = y
        .view_mut::<f32>()
        .map_err(|e| PyValueError::new_err(format!("conv3d output: {e}")))?;
    let r = py.detach(|| chain.run_device(&s, params, xd, &xs, wd, &ws, bd, &mut yv));
    match r {
        Ok(report) => {
            let served = report.served().map(|a| a.name.clone()).unwrap_or_default();
            Ok((served, report.to_string()))
        }
        Err(e) => Err(op_to_py("conv3d", e)),
    }
}

/// `conv3d_verify(device, stream, input, weight, bias, out, stride,
/// padding, dilation, groups, backend=None)`: checks `out` (float32 or
/// bfloat16, computed by something else: torch's own conv3d) at the
/// chain's sampled points on the device, on `stream` (the f64
/// recomputation from the operands, one small read-back). Returns `None`
/// when every sampled point agrees, else the mismatch as text. No NaN/Inf
/// scan (the caller has `torch.isfinite`). `rel_tol`: the tolerance when
/// the output was computed at a lower precision (TF32), else the chain's.
/// Errors as `conv3d`.
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, dilation, groups, backend=None, rel_tol=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv3d_verify(
    py: Python<'_>,
    device: &str,
    stream: u64,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    stride: [usize; 3],
    padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
    rel_tol: Option<f64>,
) -> PyResult<Option<String>> {
    let call = Call::take("conv3d", device, backend, (input, weight, bias, out))?;
    let s = call.stream(stream)?;
    let params = params(stride, padding, dilation, groups);
    let chain = chain_of(&call.dev);
    let (xd, wd, bd, xs, ws) = operands_of(&call.x, &call.w, call.b.as_ref(), "conv3d")?;
    let yd = import_data(&call.y, "conv3d output")?;
    let r = py.detach(|| match rel_tol {
        None => chain.verify_device(&s, params, xd, &xs, wd, &ws, bd, yd),
        Some(rel) => chain.verify_device_within(&s, params, (xd, &xs), (wd, &ws), bd, yd, rel),
    });
    match r {
        Ok(Ok(())) => Ok(None),
        Ok(Err(failure)) => Ok(Some(failure.to_string())),
        Err(e) => Err(op_to_py("conv3d_verify", e)),
    }
}

/// The stream a chain call runs on: a stream of the host backend, or
/// PyTorch's current stream of the device, borrowed.
fn call_stream(dev: &Device, stream: u64) -> PyResult<Stream> {
    if dev.kind() == BackendKind::Host {
        dev.stream()
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    } else {
        // SAFETY: as in `conv3d`: `stream` is PyTorch's current stream of
        // this device, alive for the call; the `Stream` is dropped before
        // the caller returns (never destroyed by rocm-safe).
        Ok(unsafe { Stream::from_raw(dev, RawStream(stream)) })
    }
}

/// A chain call's result for Python: `(served tier, report)`, or the
/// error ([`op_to_py`]: `ValueError` for what the chain does not take).
fn chain_result(what: &str, r: rocm_safe::Result<Conv3dReport>) -> PyResult<(String, String)> {
    match r {
        Ok(report) => {
            let served = report.served().map(|a| a.name.clone()).unwrap_or_default();
            Ok((served, report.to_string()))
        }
        Err(e) => Err(op_to_py(what, e)),
    }
}

/// `conv3d_backward(device, stream, op, grad_output, other, out,
/// input_shape, weight_shape, stride, padding, dilation, groups,
/// backend=None)`: a gradient of the forward conv3d `(input_shape,
/// weight_shape, stride, padding, dilation, groups)` through the chain on
/// tensors borrowed through DLPack, on `stream`, into `out` (f32, written
/// in place): `op` `"data"` (`other`: the weight; `out` the input's
/// shape), `"weight"` (`other`: the forward input; `out` the weight's
/// shape) or `"bias"` (`other` None, `out` `[K]`; the shapes and
/// parameters are not used). Returns `(served tier name, report)`.
#[pyfunction]
#[pyo3(signature = (device, stream, op, grad_output, other, out, input_shape, weight_shape, stride, padding, dilation, groups, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv3d_backward(
    py: Python<'_>,
    device: &str,
    stream: u64,
    op: &str,
    grad_output: &Bound<'_, PyAny>,
    other: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    input_shape: Vec<i64>,
    weight_shape: Vec<i64>,
    stride: [usize; 3],
    padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
) -> PyResult<(String, String)> {
    let dev = device_of(device, backend)?;
    let dy = take_capsule(&dev, grad_output, "conv3d backward grad_output")?;
    let o = other
        .map(|o| take_capsule(&dev, o, "conv3d backward operand"))
        .transpose()?;
    let mut y = take_capsule(&dev, out, "conv3d backward output")?;
    if y.dtype() != DType::F32 {
        return Err(PyTypeError::new_err(
            "conv3d backward output: must be float32",
        ));
    }
    let s = call_stream(&dev, stream)?;
    let params = Conv3dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    let chain = chain_of(&dev);
    let dyd = import_data(&dy, "conv3d backward grad_output")?;
    let od = o
        .as_ref()
        .map(|o| import_data(o, "conv3d backward operand"))
        .transpose()?;
    let dy_shape = dy.shape().to_vec();
    let mut yv = y
        .view_mut::<f32>()
        .map_err(|e| PyValueError::new_err(format!("conv3d backward output: {e}")))?;
    let inputs = match (op, od) {
        ("data", Some(weight)) => Some(BackwardInputs::Data {
            grad_output: dyd,
            weight,
        }),
        ("weight", Some(input)) => Some(BackwardInputs::Weight {
            input,
            grad_output: dyd,
        }),
        ("bias", None) => None,
        _ => {
            return Err(PyValueError::new_err(format!(
                "conv3d_backward: op {op:?} with{} a second operand: \"data\" and \"weight\" take one, \"bias\" none",
                if o.is_some() { "" } else { "out" }
            )))
        }
    };
    let r = py.detach(|| match inputs {
        Some(i) => chain.backward_device(&s, params, &input_shape, &weight_shape, i, &mut yv),
        None => chain.backward_bias_device(&s, dyd, &dy_shape, &mut yv),
    });
    chain_result("conv3d_backward", r)
}

/// `conv_transpose3d(device, stream, input, weight, bias, out, stride,
/// padding, output_padding, dilation, groups, backend=None)`: the
/// transposed convolution (PyTorch's semantics; weight `[C_in,
/// C_out/groups, KD, KH, KW]`) through the chain on tensors borrowed
/// through DLPack, on `stream`, into `out` (f32, written in place).
/// Returns `(served tier name, report)`; errors as `conv3d`.
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, output_padding, dilation, groups, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose3d(
    py: Python<'_>,
    device: &str,
    stream: u64,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    stride: [usize; 3],
    padding: [usize; 3],
    output_padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
) -> PyResult<(String, String)> {
    let call = Call::take(
        "conv_transpose3d",
        device,
        backend,
        (input, weight, bias, out),
    )?;
    call.f32_output("conv_transpose3d")?;
    let s = call.stream(stream)?;
    let params = params(stride, padding, dilation, groups);
    let chain = chain_of(&call.dev);
    let Call { x, w, b, mut y, .. } = call;
    let (xd, wd, bd, xs, ws) = operands_of(&x, &w, b.as_ref(), "conv_transpose3d")?;
    let mut yv = y
        .view_mut::<f32>()
        .map_err(|e| PyValueError::new_err(format!("conv_transpose3d output: {e}")))?;
    let r = py.detach(|| {
        chain.conv_transpose3d_device(&s, params, output_padding, xd, &xs, wd, &ws, bd, &mut yv)
    });
    chain_result("conv_transpose3d", r)
}

/// `conv_transpose3d_verify(device, stream, input, weight, bias, out,
/// stride, padding, output_padding, dilation, groups, backend=None)`:
/// checks `out` (float32, computed by something else: torch's own
/// conv_transpose3d) at the chain's sampled points on the device, on
/// `stream`. Returns `None` when every sampled point agrees, else the
/// mismatch as text. Errors as `conv_transpose3d`.
#[pyfunction]
#[pyo3(signature = (device, stream, input, weight, bias, out, stride, padding, output_padding, dilation, groups, backend=None))]
#[allow(clippy::too_many_arguments)]
pub fn conv_transpose3d_verify(
    py: Python<'_>,
    device: &str,
    stream: u64,
    input: &Bound<'_, PyAny>,
    weight: &Bound<'_, PyAny>,
    bias: Option<&Bound<'_, PyAny>>,
    out: &Bound<'_, PyAny>,
    stride: [usize; 3],
    padding: [usize; 3],
    output_padding: [usize; 3],
    dilation: [usize; 3],
    groups: usize,
    backend: Option<&str>,
) -> PyResult<Option<String>> {
    let call = Call::take(
        "conv_transpose3d",
        device,
        backend,
        (input, weight, bias, out),
    )?;
    call.f32_output("conv_transpose3d_verify")?;
    let s = call.stream(stream)?;
    let params = params(stride, padding, dilation, groups);
    let chain = chain_of(&call.dev);
    let Call { x, w, b, y, .. } = call;
    let (xd, wd, bd, xs, ws) = operands_of(&x, &w, b.as_ref(), "conv_transpose3d")?;
    let yv = y
        .view::<f32>()
        .map_err(|e| PyValueError::new_err(format!("conv_transpose3d output: {e}")))?;
    let r = py.detach(|| {
        chain.verify_conv_transpose3d_device(&s, params, output_padding, xd, &xs, wd, &ws, bd, yv)
    });
    match r {
        Ok(Ok(())) => Ok(None),
        Ok(Err(failure)) => Ok(Some(failure.to_string())),
        Err(e) => chain_result("conv_transpose3d_verify", Err(e)).map(|_| None),
    }
}

/// `(name, attempts, successes, skips, errors, non_finite, mismatches,
/// seconds)` of one tier.
type StatsRow = (String, u64, u64, u64, u64, u64, u64, f64);

/// `conv3d_stats()`: per tier name (over every device's chain), the
/// counters `(attempts, successes, skips, errors, non_finite, mismatches,
/// seconds)`.
#[pyfunction]
pub fn conv3d_stats() -> Vec<StatsRow> {
    let chains: Vec<Arc<Conv3dChain>> = lock(chains()).iter().map(|(_, c)| c.clone()).collect();
    let mut out: Vec<StatsRow> = Vec::new();
    for c in chains {
        for s in c.stats() {
            match out.iter_mut().find(|o| o.0 == s.name) {
                Some(o) => {
                    o.1 += s.attempts;
                    o.2 += s.successes;
                    o.3 += s.skips;
                    o.4 += s.errors;
                    o.5 += s.non_finite;
                    o.6 += s.mismatches;
                    o.7 += s.time.as_secs_f64();
                }
                None => out.push((
                    s.name.clone(),
                    s.attempts,
                    s.successes,
                    s.skips,
                    s.errors,
                    s.non_finite,
                    s.mismatches,
                    s.time.as_secs_f64(),
                )),
            }
        }
    }
    out
}
