//! The exhaustive per-device self-test of the conversion and fingerprint
//! kernels, kept on the device (a slot of [`crate::device::Device`]).

use std::sync::Arc;
use std::time::Instant;

use rayon::prelude::*;

use super::{device_label, expected_fingerprint};
use crate::convert::fingerprint::{finish, Fingerprint};
use crate::convert::table::{self, Conversion};
use crate::device::{ConvertOp, Stream};
use crate::dtype::DType;
use crate::error::Result;

/// One kernel's self-test result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[non_exhaustive]
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
#[non_exhaustive]
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

/// Runs the exhaustive self-test on `stream`'s device once and keeps the
/// report on the device (dropped with it); later calls on the same device
/// return it. A device opened again is a new device: tested afresh.
///
/// Errors are device errors (allocation, copy, launch; not kept: the next
/// call tries again); wrong results are not errors but recorded in the
/// report.
pub fn self_test(stream: &Stream) -> Result<Arc<SelfTestReport>> {
    let device = stream.device();
    if let Some(r) = device.slot::<SelfTestReport>() {
        return Ok(r);
    }
    // The test takes a while: other threads may run it on the same device
    // meanwhile; the first report stored wins.
    let r = self_test_uncached(stream)?;
    Ok(device.slot_or_insert(r))
}

/// Whether [`self_test`] has a report for `device` already (so calling it
/// costs nothing).
pub(crate) fn self_test_cached(device: &crate::device::Device) -> bool {
    device.slot::<SelfTestReport>().is_some()
}

/// Alignment of every region of the self-test's device arena.
const ALIGN: usize = 256;

fn round_up(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// One device row of the conversion table, as the self-test runs it.
struct RowTest {
    op: ConvertOp,
    row: &'static Conversion,
    /// Where its source patterns start in the upload image.
    src: usize,
    /// Elements (patterns).
    n: usize,
    /// Where its output (then, with a fused kernel, the fused output)
    /// starts in the arena.
    out: usize,
    /// Its first accumulator: the output's fingerprint; with a fused
    /// kernel, then the fused kernel's own sum and the fused output's
    /// fingerprint.
    acc: usize,
    /// The fingerprint its output must have (the CPU's).
    expected: Fingerprint,
}

/// The CPU side of the self-test: every device row's patterns (generated
/// per row from its source dtype: [`Conversion::patterns`]) and what is
/// expected of them. The same for every device, so computed once per
/// process.
struct Reference {
    /// Upload image: each source dtype's patterns once, 256-aligned.
    image: Vec<u8>,
    rows: Vec<RowTest>,
    /// Fingerprint kernel cases over the image: (start, len, expected).
    fp_cases: Vec<(usize, usize, Fingerprint)>,
    /// Arena bytes: image, outputs, then the accumulators (u64).
    acc_at: usize,
    accs: usize,
}

impl Reference {
    fn src(&self, t: &RowTest) -> &[u8] {
        self.image
            .get(t.src..t.src + t.n * t.row.src_size)
            .unwrap_or(&[])
    }

    /// The expected output of row `t` (only needed to count and locate
    /// mismatches once its fingerprint differed).
    fn expected(&self, t: &RowTest) -> Result<Vec<u8>> {
        let mut out = vec![0u8; t.n * t.row.dst_size];
        crate::convert::convert_bytes(t.op.from, self.src(t), t.op.to, &mut out)?;
        Ok(out)
    }
}

fn reference() -> &'static Reference {
    static R: std::sync::OnceLock<Reference> = std::sync::OnceLock::new();
    R.get_or_init(|| {
        let mut image: Vec<u8> = Vec::new();
        let mut sources: Vec<(DType, usize, usize)> = Vec::new();
        let mut rows = Vec::new();
        for row in table::device_rows() {
            let src = match sources.iter().find(|(d, ..)| *d == row.from) {
                Some(&(_, at, n)) => (at, n),
                None => {
                    let p = row.patterns();
                    let at = image.len();
                    let n = p.len() / row.src_size.max(1);
                    image.extend_from_slice(&p);
                    image.resize(round_up(image.len()), 0);
                    sources.push((row.from, at, n));
                    (at, n)
                }
            };
            let op = ConvertOp {
                from: row.from,
                to: row.to,
            };
            rows.push(RowTest {
                op,
                row,
                src: src.0,
                n: src.1,
                out: 0,
                acc: 0,
                expected: Fingerprint(0),
            });
        }
        // Outputs after the image, then the accumulators.
        let mut at = image.len();
        let mut accs = 0;
        for t in &mut rows {
            t.out = at;
            let copies = if t.row.fused.is_some() { 2 } else { 1 };
            at += copies * round_up(t.n * t.row.dst_size);
            t.acc = accs;
            accs += if t.row.fused.is_some() { 3 } else { 1 };
        }
        // Parallel, table-driven (the sequential reference fingerprint of
        // these few MB would dominate the first call).
        for t in &mut rows {
            let src = image
                .get(t.src..t.src + t.n * t.row.src_size)
                .unwrap_or(&[]);
            t.expected = expected_fingerprint(t.op.from, src, t.op.to).unwrap_or(Fingerprint(0));
        }
        let base = image.get(..image.len().min(1 << 17)).unwrap_or(&[]);
        let fp_cases: Vec<(usize, usize, Fingerprint)> = crate::par::install(|| {
            (0..8usize)
                .flat_map(|start| {
                    [1usize, 3, 5, 17, 1000, 4097, base.len() - start]
                        .into_iter()
                        .map(move |len| (start, len))
                })
                .collect::<Vec<_>>()
                .into_par_iter()
                .map(|(start, len)| {
                    let bytes = base.get(start..start + len).unwrap_or(&[]);
                    let sum = crate::device::runtime::host::sum_bytes(0, bytes);
                    (start, len, finish(sum, len as u64))
                })
                .collect()
        });
        accs += fp_cases.len();
        Reference {
            image,
            rows,
            fp_cases,
            acc_at: round_up(at),
            accs,
        }
    })
}

/// Runs the exhaustive self-test now (no cache; [`self_test`] caches it).
///
/// Every row of the conversion table with a device kernel is tested over
/// its patterns ([`Conversion::patterns`]: every code of an 8- or 16-bit
/// source, the rounding-critical patterns of an f32 one), through its
/// plain and (where it has one) fused kernel; then the fingerprint kernel.
/// One allocation and one upload; all launches queued at once; every
/// output is fingerprinted on the device and only the sums come back. An
/// output whose fingerprint differs from the CPU's is downloaded and
/// compared value by value (so a broken fingerprint kernel cannot make a
/// good conversion kernel look bad). The CPU reference is computed once
/// per process ([`SelfTestReport::reference_ms`] says what the first call
/// paid).
pub fn self_test_uncached(stream: &Stream) -> Result<SelfTestReport> {
    let t0 = Instant::now();
    let r = reference();
    let reference_ms = t0.elapsed().as_secs_f32() * 1e3;
    let total = r.acc_at + 8 * r.accs;
    let t_up = Instant::now();
    let mut arena = stream.alloc::<u8>(total)?;
    arena
        .slice_mut(0..r.image.len())?
        .copy_htod(stream, &r.image)?;
    arena.slice_mut(r.acc_at..total)?.memset_zero(stream)?;
    let upload_ms = t_up.elapsed().as_secs_f32() * 1e3;
    let t_dev = Instant::now();
    {
        let (src, rest) = arena.view_mut().split_at_mut(r.image.len())?;
        let (mut outs, mut accs) = rest.split_at_mut(r.acc_at - r.image.len())?;
        let src = src.as_view();
        let mut acc = accs.cast_mut::<u64>()?;
        for t in &r.rows {
            let sv = src.slice(t.src..t.src + t.n * t.row.src_size)?;
            let len = t.n * t.row.dst_size;
            let out = t.out - r.image.len();
            let mut o = outs.slice_mut(out..out + len)?;
            stream.convert_raw(&sv, t.op.from, &mut o, t.op.to)?;
            let mut a = acc.slice_mut(t.acc..t.acc + 1)?;
            stream.fingerprint_sum_into(&o.as_view(), &mut a)?;
            if t.row.fused.is_some() {
                let at = out + round_up(len);
                let mut o = outs.slice_mut(at..at + len)?;
                let mut a = acc.slice_mut(t.acc + 1..t.acc + 2)?;
                stream.convert_fingerprint_raw(&sv, t.op.from, &mut o, t.op.to, &mut a)?;
                let mut a = acc.slice_mut(t.acc + 2..t.acc + 3)?;
                stream.fingerprint_sum_into(&o.as_view(), &mut a)?;
            }
        }
        let first = r.accs - r.fp_cases.len();
        for (i, &(start, len, _)) in r.fp_cases.iter().enumerate() {
            let view = src.slice(start..start + len)?;
            let mut a = acc.slice_mut(first + i..first + i + 1)?;
            stream.fingerprint_sum_into(&view, &mut a)?;
        }
    }
    let mut sums = vec![0u64; r.accs];
    arena
        .view()
        .slice(r.acc_at..total)?
        .cast::<u64>()?
        .copy_dtoh(stream, &mut sums)?;
    let device_ms = t_dev.elapsed().as_secs_f32() * 1e3;
    let sum = |i: usize| sums.get(i).copied().unwrap_or(0);

    // Compare: fingerprints first; an output that differs is downloaded.
    let mut kernels = Vec::new();
    for t in &r.rows {
        let len = t.n * t.row.dst_size;
        let fused = t.row.fused.is_some();
        for (k, name) in [(0, "convert"), (1, "fused")] {
            if k == 1 && !fused {
                continue;
            }
            let name = format!("{name} {}", t.op);
            let got_fp = finish(sum(t.acc + 2 * k), len as u64);
            let mut kt = if got_fp == t.expected {
                KernelTest {
                    kernel: name,
                    tested: t.n as u64,
                    mismatches: 0,
                    first_mismatch: None,
                }
            } else {
                let at = t.out + k * round_up(len);
                let mut got = vec![0u8; len];
                arena
                    .view()
                    .slice(at..at + len)?
                    .copy_dtoh(stream, &mut got)?;
                let want = r.expected(t)?;
                compare_rows(name, t, r.src(t), &want, &got)
            };
            if k == 1 {
                // The fused kernel's own sum must match too.
                let own = finish(sum(t.acc + 1), len as u64);
                if own != t.expected {
                    kt.mismatches += 1;
                    kt.first_mismatch
                        .get_or_insert((0, t.expected.0 as u32, own.0 as u32));
                }
            }
            kernels.push(kt);
        }
    }
    {
        let first = r.accs - r.fp_cases.len();
        let mut t = KernelTest {
            kernel: "fingerprint".into(),
            tested: r.fp_cases.len() as u64,
            mismatches: 0,
            first_mismatch: None,
        };
        for (i, &(start, len, want)) in r.fp_cases.iter().enumerate() {
            let got = finish(sum(first + i), len as u64);
            if got != want {
                t.mismatches += 1;
                t.first_mismatch
                    .get_or_insert((start as u32, want.0 as u32, got.0 as u32));
            }
        }
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

/// [`compare`] of a row's byte outputs, element by element (bit patterns
/// as `u32`, zero-extended).
fn compare_rows(name: String, t: &RowTest, src: &[u8], want: &[u8], got: &[u8]) -> KernelTest {
    let word = |b: &[u8]| {
        let mut w = [0u8; 4];
        for (x, y) in w.iter_mut().zip(b) {
            *x = *y;
        }
        u32::from_le_bytes(w)
    };
    let words = |b: &[u8], size: usize| -> Vec<u32> { b.chunks_exact(size).map(word).collect() };
    compare(
        name,
        &words(src, t.row.src_size),
        &words(want, t.row.dst_size),
        &words(got, t.row.dst_size),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::Device;

    #[test]
    fn the_report_is_kept_on_its_device_and_dropped_with_it() {
        let dev = Device::host();
        assert!(!self_test_cached(&dev));
        let s = dev.stream().unwrap();
        let r = self_test(&s).unwrap();
        assert!(r.all_passed());
        assert!(self_test_cached(&dev));
        assert!(Arc::ptr_eq(&r, &self_test(&s).unwrap()), "run once");
        // Another device (the same hardware opened again) is tested afresh.
        let other = Device::host();
        assert!(!self_test_cached(&other));
        let r2 = self_test(&other.stream().unwrap()).unwrap();
        assert!(!Arc::ptr_eq(&r, &r2));
        drop((s, dev));
        assert_eq!(Arc::strong_count(&r), 1, "dropped with its device");
    }
}
