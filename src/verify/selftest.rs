//! The exhaustive per-device self-test of the conversion and fingerprint
//! kernels, cached per device for the process.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use rayon::prelude::*;

use super::{device_label, expected_fingerprint};
use crate::convert::fingerprint::{finish, Fingerprint};
use crate::convert::scalar;
use crate::device::{ConvertOp, DeviceView, DeviceViewMut, Stream};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One kernel's self-test result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelTest {
    /// The kernel (`"convert bf16->f32"`, `"fused bf16->f32"`, `"fingerprint"`).
    pub kernel: String,
    /// Patterns tested.
    pub tested: u64,
    /// Patterns whose output differed from the CPU's.
    pub mismatches: u64,
    /// The first mismatch: (input bits, expected output bits, device output bits).
    pub first_mismatch: Option<(u32, u32, u32)>,
}

/// The exhaustive self-test of one device.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SelfTestReport {
    /// The device.
    pub device: String,
    /// Per kernel.
    pub kernels: Vec<KernelTest>,
    /// Wall time of the whole test.
    pub elapsed_ms: f32,
    /// Of which: the CPU reference (computed on the first call in the
    /// process, near zero afterwards).
    pub reference_ms: f32,
    /// Of which: allocating and uploading the patterns.
    pub upload_ms: f32,
    /// Of which: from queuing the kernels to having the sums back.
    pub device_ms: f32,
}

impl SelfTestReport {
    pub(crate) fn find(&self, name: &str) -> Option<&KernelTest> {
        self.kernels.iter().find(|k| k.kernel == name)
    }

    /// Whether the conversion kernel for `op` passed.
    pub fn trusted(&self, op: ConvertOp) -> bool {
        self.find(&format!("convert {op}"))
            .is_some_and(|k| k.mismatches == 0)
    }

    /// Whether the fused convert+fingerprint kernel for `op` passed.
    pub fn fused_trusted(&self, op: ConvertOp) -> bool {
        self.find(&format!("fused {op}"))
            .is_some_and(|k| k.mismatches == 0)
    }

    /// Whether the fingerprint kernel passed.
    pub fn fingerprint_trusted(&self) -> bool {
        self.find("fingerprint").is_some_and(|k| k.mismatches == 0)
    }

    /// Whether every kernel passed.
    pub fn all_passed(&self) -> bool {
        self.kernels.iter().all(|k| k.mismatches == 0)
    }
}
/// Low halves combined with every upper half for the f32 -> 16-bit tests:
/// the rounding boundaries of bf16 (bit 15) and f16 (bit 12 and, for f16
/// subnormal results, up to bit 23 through the shift).
const TRICKY_LOW: [u32; 12] = [
    0x0000, 0x0001, 0x0fff, 0x1000, 0x1001, 0x1fff, 0x2000, 0x7fff, 0x8000, 0x8001, 0xc000, 0xffff,
];

fn compare(kernel: String, inputs: &[u32], expected: &[u32], got: &[u32]) -> KernelTest {
    let mut mismatches = 0u64;
    let mut first = None;
    for ((&i, &e), &g) in inputs.iter().zip(expected).zip(got) {
        if e != g {
            mismatches += 1;
            first.get_or_insert((i, e, g));
        }
    }
    KernelTest {
        kernel,
        tested: inputs.len() as u64,
        mismatches,
        first_mismatch: first,
    }
}

/// The self-test reports of this process, per [`crate::device::Device::id`]
/// (kept here, above the device layer, rather than on the device: a
/// device knows nothing of verification). A few hundred bytes per device
/// ever opened.
fn self_tests() -> std::sync::MutexGuard<'static, HashMap<u64, Arc<SelfTestReport>>> {
    static CACHE: OnceLock<Mutex<HashMap<u64, Arc<SelfTestReport>>>> = OnceLock::new();
    match CACHE.get_or_init(|| Mutex::new(HashMap::new())).lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// Runs the exhaustive self-test on `stream`'s device once and caches it
/// for the device; later calls return the cached report.
///
/// Errors are device errors (allocation, copy, launch); wrong results are
/// not errors but recorded in the report.
pub fn self_test(stream: &Stream) -> Result<Arc<SelfTestReport>> {
    let id = stream.device().id();
    let hit = self_tests().get(&id).cloned();
    if let Some(r) = hit {
        return Ok(r);
    }
    // Not under the lock: the test takes a while and other devices may
    // run theirs meanwhile; the first report stored wins.
    let r = Arc::new(self_test_uncached(stream)?);
    Ok(Arc::clone(self_tests().entry(id).or_insert(r)))
}

/// Whether [`self_test`] has a report for `device` already (so calling it
/// costs nothing).
pub(crate) fn self_test_cached(device: &crate::device::Device) -> bool {
    self_tests().contains_key(&device.id())
}

/// The CPU side of the self-test: the patterns and everything expected of
/// them. The same for every device, so computed once per process.
struct Reference {
    /// Upload image: the 65 536 16-bit patterns (packed two per word), then
    /// the f32 inputs of the narrowing tests.
    host_in: Vec<u32>,
    /// Where the f32 inputs start in `host_in`.
    half: usize,
    all16_u32: Vec<u32>,
    /// Fingerprints of the expected output regions as the device stores
    /// them: bf16 plain, bf16 fused, f16 plain, f16 fused, f32->bf16,
    /// f32->f16.
    region_fp: [Fingerprint; 6],
    /// Fingerprint kernel cases (start, len) and their expected values.
    fp_cases: Vec<(usize, usize, Fingerprint)>,
}

impl Reference {
    /// The f32 inputs of the narrowing tests.
    fn inputs32(&self) -> &[u32] {
        self.host_in.get(self.half..).unwrap_or(&[])
    }

    /// Expected outputs (as u32) of bf16->f32, f16->f32, f32->bf16,
    /// f32->f16 (`which` 0..4): only needed to count and locate mismatches
    /// once a region's fingerprint differed.
    fn expected(&self, which: usize) -> Vec<u32> {
        let narrow = |f: fn(u32) -> u16| -> Vec<u32> {
            crate::par::install(|| {
                self.inputs32()
                    .par_iter()
                    .map(|&x| u32::from(f(x)))
                    .collect()
            })
        };
        let wide = |f: fn(u16) -> u32| -> Vec<u32> {
            crate::par::install(|| self.all16_u32.par_iter().map(|&h| f(h as u16)).collect())
        };
        match which {
            0 => wide(scalar::bf16_to_f32),
            1 => wide(scalar::f16_to_f32),
            2 => narrow(scalar::f32_to_bf16),
            _ => narrow(scalar::f32_to_f16),
        }
    }
}

fn reference() -> &'static Reference {
    static R: std::sync::OnceLock<Reference> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        let all16: Vec<u16> = (0..=u16::MAX).collect();
        // The upload image, built in place (one allocation: fresh pages are
        // a large part of this function's cost).
        let half = all16.len() / 2;
        let m = (usize::from(u16::MAX) + 1) * TRICKY_LOW.len();
        let mut host_in: Vec<u32> = Vec::with_capacity(half + m);
        host_in.extend(
            all16
                .chunks_exact(2)
                .map(|p| u32::from(p[0]) | (u32::from(p[1]) << 16)),
        );
        host_in
            .extend((0..=u32::from(u16::MAX)).flat_map(|hi| TRICKY_LOW.map(|lo| (hi << 16) | lo)));
        let inputs32 = host_in.get(half..).unwrap_or(&[]);
        let bytes16: &[u8] = bytemuck::cast_slice(&all16);
        let fp_cases = crate::par::install(|| {
            (0..8usize)
                .flat_map(|start| {
                    [1usize, 3, 5, 17, 1000, 4097, bytes16.len() - start]
                        .into_iter()
                        .map(move |len| (start, len))
                })
                .collect::<Vec<_>>()
                .into_par_iter()
                .map(|(start, len)| {
                    let bytes = bytes16.get(start..start + len).unwrap_or(&[]);
                    let sum = crate::device::host::sum_bytes(0, bytes);
                    (start, len, finish(sum, len as u64))
                })
                .collect()
        });
        // Parallel, table-driven (the sequential reference fingerprint of
        // these 3.3 MB would dominate the first call).
        let in32: &[u8] = bytemuck::cast_slice(inputs32);
        let fp = |from, src, to| expected_fingerprint(from, src, to).unwrap_or(Fingerprint(0));
        let w0 = fp(DType::BF16, bytes16, DType::F32);
        let w1 = fp(DType::F16, bytes16, DType::F32);
        let region_fp = [
            w0,
            w0,
            w1,
            w1,
            fp(DType::F32, in32, DType::BF16),
            fp(DType::F32, in32, DType::F16),
        ];
        Reference {
            all16_u32: all16.iter().map(|&h| u32::from(h)).collect(),
            half,
            host_in,
            region_fp,
            fp_cases,
        }
    })
}

/// Runs the exhaustive self-test now (no cache; [`self_test`] caches it).
///
/// One allocation and one upload; all launches queued at once; every
/// output region is fingerprinted on the device and only the sums come
/// back. A region whose fingerprint differs from the CPU's is downloaded
/// and compared value by value (so a broken fingerprint kernel cannot make
/// a good conversion kernel look bad). The CPU reference is computed once
/// per process ([`SelfTestReport::reference_ms`] says what the first call
/// paid).
pub fn self_test_uncached(stream: &Stream) -> Result<SelfTestReport> {
    let t0 = Instant::now();
    let r = reference();
    let reference_ms = t0.elapsed().as_secs_f32() * 1e3;
    let n = r.all16_u32.len();
    let m = r.inputs32().len();
    // Arena layout in u32 units.
    let a_src32 = n / 2;
    let a_wide = a_src32 + m; // 4 regions of n u32
    let a_narrow = a_wide + 4 * n; // 2 regions of m u16
    let a_acc = a_narrow + m; // accumulators (u64)
    let n_acc = 2 + 6 + r.fp_cases.len();
    let total = a_acc + 2 * n_acc;
    let t_up = Instant::now();
    let mut arena = stream.alloc::<u32>(total)?;
    arena.slice_mut(0..a_wide)?.copy_htod(stream, &r.host_in)?;
    arena.slice_mut(a_acc..total)?.memset_zero(stream)?;
    let upload_ms = t_up.elapsed().as_secs_f32() * 1e3;
    let t_dev = Instant::now();
    {
        let (src, rest) = arena.view_mut().split_at_mut(a_wide)?;
        let (mut wide, rest) = rest.split_at_mut(a_narrow - a_wide)?;
        let (mut narrow, mut accs) = rest.split_at_mut(a_acc - a_narrow)?;
        let d16 = src.as_view().slice(0..a_src32)?.cast::<u16>()?;
        let d32 = src.as_view().slice(a_src32..a_wide)?;
        let mut acc = accs.cast_mut::<u64>()?;
        for (k, op) in [ConvertOp::DEVICE[0], ConvertOp::DEVICE[1]]
            .iter()
            .enumerate()
        {
            let mut out = wide.slice_mut(2 * k * n..(2 * k + 1) * n)?;
            launch_convert_raw(stream, *op, &d16, &mut out)?;
            let mut out = wide.slice_mut((2 * k + 1) * n..(2 * k + 2) * n)?;
            let mut a = acc.slice_mut(k..k + 1)?;
            launch_fused_raw(stream, *op, &d16, &mut out, &mut a)?;
        }
        let mut narrow16 = narrow.cast_mut::<u16>()?;
        for (k, op) in [ConvertOp::DEVICE[2], ConvertOp::DEVICE[3]]
            .iter()
            .enumerate()
        {
            let mut out = narrow16.slice_mut(k * m..(k + 1) * m)?;
            launch_convert_raw(stream, *op, &d32, &mut out)?;
        }
        for k in 0..4 {
            let region = wide.as_view().slice(k * n..(k + 1) * n)?;
            let mut a = acc.slice_mut(2 + k..3 + k)?;
            stream.fingerprint_sum_into(&region, &mut a)?;
        }
        for k in 0..2 {
            let region = narrow16.as_view().slice(k * m..(k + 1) * m)?;
            let mut a = acc.slice_mut(6 + k..7 + k)?;
            stream.fingerprint_sum_into(&region, &mut a)?;
        }
        let dbytes = d16.cast::<u8>()?;
        for (i, &(start, len, _)) in r.fp_cases.iter().enumerate() {
            let view = dbytes.slice(start..start + len)?;
            let mut a = acc.slice_mut(8 + i..9 + i)?;
            stream.fingerprint_sum_into(&view, &mut a)?;
        }
    }
    let mut sums = vec![0u32; 2 * n_acc];
    arena
        .view()
        .slice(a_acc..total)?
        .copy_dtoh(stream, &mut sums)?;
    let device_ms = t_dev.elapsed().as_secs_f32() * 1e3;
    let sum = |i: usize| {
        let lo = sums.get(2 * i).copied().unwrap_or(0);
        let hi = sums.get(2 * i + 1).copied().unwrap_or(0);
        u64::from(lo) | (u64::from(hi) << 32)
    };

    // Compare: fingerprints first; a region that differs is downloaded.
    let mut kernels = Vec::new();
    let names = [
        format!("convert {}", ConvertOp::DEVICE[0]),
        format!("fused {}", ConvertOp::DEVICE[0]),
        format!("convert {}", ConvertOp::DEVICE[1]),
        format!("fused {}", ConvertOp::DEVICE[1]),
    ];
    for (k, name) in names.into_iter().enumerate() {
        let exp = || r.expected(k / 2);
        let got_fp = finish(sum(2 + k), 4 * n as u64);
        let mut t = if got_fp == r.region_fp[k] {
            KernelTest {
                kernel: name,
                tested: n as u64,
                mismatches: 0,
                first_mismatch: None,
            }
        } else {
            let mut got = vec![0u32; n];
            arena
                .view()
                .slice(a_wide + k * n..a_wide + (k + 1) * n)?
                .copy_dtoh(stream, &mut got)?;
            compare(name, &r.all16_u32, &exp(), &got)
        };
        if k % 2 == 1 {
            // The fused kernel's own sum must match too.
            let fused_fp = finish(sum(k / 2), 4 * n as u64);
            if fused_fp != r.region_fp[k] {
                t.mismatches += 1;
                t.first_mismatch
                    .get_or_insert((0, r.region_fp[k].0 as u32, fused_fp.0 as u32));
            }
        }
        kernels.push(t);
    }
    {
        let mut t = KernelTest {
            kernel: "fingerprint".into(),
            tested: r.fp_cases.len() as u64,
            mismatches: 0,
            first_mismatch: None,
        };
        for (i, &(start, len, want)) in r.fp_cases.iter().enumerate() {
            let got = finish(sum(8 + i), len as u64);
            if got != want {
                t.mismatches += 1;
                t.first_mismatch
                    .get_or_insert((start as u32, want.0 as u32, got.0 as u32));
            }
        }
        kernels.push(t);
    }
    for k in 0..2 {
        let op = ConvertOp::DEVICE[2 + k];
        let name = format!("convert {op}");
        let got_fp = finish(sum(6 + k), 2 * m as u64);
        let t = if got_fp == r.region_fp[4 + k] {
            KernelTest {
                kernel: name,
                tested: m as u64,
                mismatches: 0,
                first_mismatch: None,
            }
        } else {
            let mut got16 = vec![0u16; m];
            arena
                .view()
                .slice(a_narrow..a_acc)?
                .cast::<u16>()?
                .slice(k * m..(k + 1) * m)?
                .copy_dtoh(stream, &mut got16)?;
            let got: Vec<u32> = got16.into_iter().map(u32::from).collect();
            compare(name, r.inputs32(), &r.expected(2 + k), &got)
        };
        kernels.push(t);
    }
    Ok(SelfTestReport {
        device: device_label(stream.device()),
        kernels,
        elapsed_ms: t0.elapsed().as_secs_f32() * 1e3,
        reference_ms,
        upload_ms,
        device_ms,
    })
}

/// Launches the conversion `op` on raw bit-pattern buffers (u16 / u32 views
/// standing for bf16/f16 / f32).
fn launch_convert_raw<A: bytemuck::Pod, B: bytemuck::Pod>(
    stream: &Stream,
    op: ConvertOp,
    src: &DeviceView<'_, A>,
    dst: &mut DeviceViewMut<'_, B>,
) -> Result<()> {
    use half::{bf16, f16};
    // Reinterpret the views as the op's element types (same sizes).
    match (op.from, op.to) {
        (DType::BF16, DType::F32) => stream.convert::<bf16, f32>(&cast(src)?, &mut cast_mut(dst)?),
        (DType::F16, DType::F32) => stream.convert::<f16, f32>(&cast(src)?, &mut cast_mut(dst)?),
        (DType::F32, DType::BF16) => stream.convert::<f32, bf16>(&cast(src)?, &mut cast_mut(dst)?),
        (DType::F32, DType::F16) => stream.convert::<f32, f16>(&cast(src)?, &mut cast_mut(dst)?),
        _ => Err(Error::UnsupportedConversion {
            op: "self_test",
            from: op.from,
            to: op.to,
            tensor: None,
        }),
    }
}

fn launch_fused_raw<A: bytemuck::Pod, B: bytemuck::Pod>(
    stream: &Stream,
    op: ConvertOp,
    src: &DeviceView<'_, A>,
    dst: &mut DeviceViewMut<'_, B>,
    acc: &mut DeviceViewMut<'_, u64>,
) -> Result<()> {
    use half::{bf16, f16};
    match op.from {
        DType::BF16 => {
            stream.convert_fingerprint_into::<bf16>(&cast(src)?, &mut cast_mut(dst)?, acc)
        }
        DType::F16 => stream.convert_fingerprint_into::<f16>(&cast(src)?, &mut cast_mut(dst)?, acc),
        _ => Err(Error::UnsupportedConversion {
            op: "self_test fused",
            from: op.from,
            to: op.to,
            tensor: None,
        }),
    }
}

fn cast<'a, A: bytemuck::Pod, B: bytemuck::Pod>(
    v: &DeviceView<'a, A>,
) -> Result<DeviceView<'a, B>> {
    v.cast::<B>()
}
fn cast_mut<'b, A: bytemuck::Pod, B: bytemuck::Pod>(
    v: &'b mut DeviceViewMut<'_, A>,
) -> Result<DeviceViewMut<'b, B>> {
    v.cast_mut::<B>()
}
