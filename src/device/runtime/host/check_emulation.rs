//! The host backend's checks of conv3d results: the sampled-point checks
//! (forward and backward), the guard's fused check and its verdict, as the
//! kernels of `kernels/conv3d_check.hip` compute them, over host memory.

use super::conv3d_emulation::{
    backward_data, host_gate_closed, host_problem, host_slice, host_slice_mut,
};
use crate::conv3d::{
    backward_reference_point, reference_point, sample_index, Conv3dData, Conv3dProblem, RefPoint,
};
use crate::device::info::DevicePtr;
#[cfg(doc)]
use crate::device::raw::backend::{Backend, KernelOp};
use crate::device::raw::conv3d::{
    Conv3dBackwardCheckLaunch, Conv3dCheckLaunch, Conv3dGuardCheck, Conv3dGuardDecide, GuardStage,
    CHECK_WORDS, GUARD_RECORD_WORDS, GUARD_REPAIR_WORDS, VERDICT_MISMATCH, VERDICT_NON_FINITE,
    VERDICT_WORDS,
};
use crate::dtype::DType;
use crate::error::{Error, Result};

/// # Safety
/// `p` holds `len` readable elements of `dtype` (F32 or BF16).
unsafe fn host_data<'a>(p: DevicePtr, dtype: DType, len: usize) -> Result<Conv3dData<'a>> {
    // SAFETY: the caller's guarantees.
    unsafe {
        Ok(match dtype {
            DType::F32 => Conv3dData::F32(host_slice(p, len)),
            DType::BF16 => Conv3dData::BF16(host_slice(p, len)),
            other => {
                return Err(Error::Conv3dDType {
                    tensor: "input",
                    dtype: other,
                    expected: DType::F32,
                })
            }
        })
    }
}

/// The result words of a sampled-point check (`CHECK_WORDS` per point, as
/// `kernels/conv3d_check.hip` writes them) over the output `y` of `total`
/// points: with a `locate` slot, the first non-finite output's distance
/// from the end there (0: none) and that point in every result; else the
/// seeded sample of each. A point is its index, the output read there, and
/// `point`'s reference value and magnitude; none (past the output) is
/// `u64::MAX` and NaNs.
///
/// # Safety
/// `locate`, when given, is one live u64 that nothing else accesses.
unsafe fn fill_check(
    y: &Conv3dData<'_>,
    total: usize,
    locate: Option<DevicePtr>,
    seed: u64,
    results: &mut [u64],
    point: impl Fn(usize) -> Option<RefPoint>,
) {
    let located = match locate {
        Some(slot) => {
            let first = (0..total).find(|&i| y.get_f32(i).is_some_and(|v| !v.is_finite()));
            // SAFETY: the caller guarantees one exclusive u64 at `slot`.
            let s = unsafe { host_slice_mut::<u64>(slot, 1) };
            s[0] = first.map_or(0, |i| (total - i) as u64);
            Some(first)
        }
        None => None,
    };
    for (j, out) in results.chunks_exact_mut(CHECK_WORDS).enumerate() {
        let index = match located {
            Some(first) => first,
            None => sample_index(total, seed, j),
        };
        match index.and_then(|i| Some((i, point(i)?, y.get_f32(i)?))) {
            Some((i, r, v)) => {
                out[0] = i as u64;
                out[1] = f64::from(v).to_bits();
                out[2] = r.value.to_bits();
                out[3] = r.magnitude.to_bits();
            }
            None => {
                out[0] = u64::MAX;
                for o in &mut out[1..] {
                    *o = f64::NAN.to_bits();
                }
            }
        }
    }
}

/// The host backend's [`KernelOp::Conv3dCheck`]: [`reference_point`] at
/// each point, as the kernel computes it.
///
/// # Safety
/// As [`Backend::run`]: the launch's addresses are live
/// host allocations of the documented lengths, `results` (and the slot)
/// exclusive.
pub(crate) unsafe fn host_conv3d_check(a: &Conv3dCheckLaunch) -> Result<()> {
    let c = &a.conv;
    // SAFETY: a gate is one live u64 (the caller's guarantee).
    if unsafe { host_gate_closed(c.gate) } {
        return Ok(());
    }
    let g = &c.geometry;
    let total = g.output_len();
    // SAFETY: the caller guarantees the lengths and exclusivity.
    let (x, w, bias, y, results) = unsafe {
        (
            host_data(c.input, c.dtype, g.input_shape().iter().product())?,
            host_data(c.weight, c.dtype, g.weight_shape().iter().product())?,
            c.bias
                .map(|b| host_data(b, a.bias_dtype, g.out_channels))
                .transpose()?,
            host_data(c.output, a.output_dtype, total)?,
            host_slice_mut::<u64>(a.results, a.samples * CHECK_WORDS),
        )
    };
    let p = Conv3dProblem::new(g.params, x, &g.input_shape(), w, &g.weight_shape(), bias)?;
    // SAFETY: the caller guarantees one exclusive u64 at the locate slot.
    unsafe {
        fill_check(&y, total, a.locate, a.seed, results, |i| {
            reference_point(&p, i)
        })
    };
    Ok(())
}

/// The host backend's [`KernelOp::Conv3dBackwardCheck`]:
/// [`backward_reference_point`] at each point, as the kernel computes it.
///
/// # Safety
/// As [`Backend::run`] for a backward launch, `results` (and the slot) exclusive.
pub(crate) unsafe fn host_conv3d_backward_check(a: &Conv3dBackwardCheckLaunch) -> Result<()> {
    let c = &a.conv;
    let total = c.output_len();
    // SAFETY: the caller's guarantees.
    let (p, y, results) = unsafe {
        (
            host_problem(c, a.bias_dtype)?,
            backward_data(c.output, DType::F32, total)?,
            host_slice_mut::<u64>(a.results, a.samples * CHECK_WORDS),
        )
    };
    // SAFETY: the caller guarantees one exclusive u64 at the locate slot.
    unsafe {
        fill_check(&y, total, a.locate, a.seed, results, |i| {
            backward_reference_point(&p, i)
        })
    };
    Ok(())
}

/// The verdict over host values: what `conv3d_guard_decide` computes (and
/// the host backend runs). `results` holds `samples` points.
pub(crate) fn guard_verdict(
    out_counts: [u64; 2],
    in_counts: Option<[u64; 6]>,
    results: &[u64],
    rel: f64,
) -> [u64; VERDICT_WORDS] {
    let mut bits = 0;
    let operands_finite = in_counts.is_none_or(|c| c.iter().all(|&n| n == 0));
    if (out_counts[0] | out_counts[1]) != 0 && operands_finite {
        bits |= VERDICT_NON_FINITE;
    }
    let mut v = [0, 0, u64::MAX, 0, 0, 0];
    for r in results.chunks_exact(CHECK_WORDS) {
        if r[0] == u64::MAX {
            continue;
        }
        let (value, reference, magnitude) = (
            f64::from_bits(r[1]),
            f64::from_bits(r[2]),
            f64::from_bits(r[3]),
        );
        // Non-finite values and references are the counts' to judge.
        if !value.is_finite() || !reference.is_finite() {
            continue;
        }
        let tol = rel * magnitude + f64::from(f32::MIN_POSITIVE);
        // `!(a <= b)`, as the kernel writes it: a NaN difference is off.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !((value - reference).abs() <= tol) {
            bits |= VERDICT_MISMATCH;
            v[2..].copy_from_slice(&[r[0], r[1], r[2], tol.to_bits()]);
            break;
        }
    }
    v[0] = bits;
    v[1] = u64::from(bits != 0);
    v
}

/// The host backend's `conv3d_guard_decide`.
///
/// # Safety
/// Every address of `a` is live, aligned host memory of its documented
/// length; `verdict` is not read elsewhere during the call.
pub(crate) unsafe fn host_guard_decide(a: &Conv3dGuardDecide) -> Result<()> {
    // SAFETY: the caller's guarantees, for each range below.
    unsafe {
        if host_gate_closed(a.gate) {
            return Ok(());
        }
        let read =
            |p: DevicePtr, n: usize| std::slice::from_raw_parts(p.0 as usize as *const u64, n);
        let out_counts = [read(a.out_counts, 2)[0], read(a.out_counts, 2)[1]];
        let in_counts = a.in_counts.map(|p| {
            let s = read(p, 6);
            [s[0], s[1], s[2], s[3], s[4], s[5]]
        });
        let results = read(a.results, CHECK_WORDS * a.samples);
        let v = guard_verdict(out_counts, in_counts, results, a.rel_tol);
        std::slice::from_raw_parts_mut(a.verdict.0 as usize as *mut u64, VERDICT_WORDS)
            .copy_from_slice(&v);
    }
    Ok(())
}

/// NaN and Inf among `n` elements of `dtype` (F32 or BF16) at `p`.
///
/// # Safety
/// `p` holds `n` readable elements of `dtype`.
unsafe fn host_count(p: DevicePtr, dtype: DType, n: usize) -> Result<[u64; 2]> {
    let mut c = [0u64; 2];
    let mut add = |nan: bool, inf: bool| {
        c[0] += u64::from(nan);
        c[1] += u64::from(inf);
    };
    if n == 0 {
        return Ok(c);
    }
    match dtype {
        DType::F32 => {
            // SAFETY: the caller's guarantee.
            let v = unsafe { std::slice::from_raw_parts(p.0 as usize as *const u32, n) };
            for &b in v {
                let x = f32::from_bits(b);
                add(x.is_nan(), x.is_infinite());
            }
        }
        DType::BF16 => {
            // SAFETY: the caller's guarantee.
            let v = unsafe { std::slice::from_raw_parts(p.0 as usize as *const u16, n) };
            for &b in v {
                let x = half::bf16::from_bits(b);
                add(x.is_nan(), x.is_infinite());
            }
        }
        other => {
            return Err(Error::Conv3dDType {
                tensor: "output",
                dtype: other,
                expected: DType::F32,
            })
        }
    }
    Ok(c)
}

/// The host backend's [`KernelOp::Conv3dGuardCheck`]: the check, the
/// counts and [`guard_verdict`], as the kernel computes them (`acc` is not
/// touched).
///
/// # Safety
/// As [`host_conv3d_check`] for `a.check`; `a.record` holds the stage's
/// record words, exclusive; a gate is one live u64.
pub(crate) unsafe fn host_guard_check(a: &Conv3dGuardCheck) -> Result<()> {
    let c = &a.check.conv;
    // SAFETY: the caller's guarantees, for every range below.
    unsafe {
        if host_gate_closed(c.gate) {
            return Ok(());
        }
        if a.check.samples > 0 {
            host_conv3d_check(&a.check)?;
        }
        let g = &c.geometry;
        let out = host_count(c.output, a.check.output_dtype, g.output_len())?;
        let results = std::slice::from_raw_parts(
            a.check.results.0 as usize as *const u64,
            a.check.samples * CHECK_WORDS,
        );
        let record = |n: usize| std::slice::from_raw_parts_mut(a.record.0 as usize as *mut u64, n);
        match a.stage {
            GuardStage::Output => {
                let v = guard_verdict(out, None, results, a.rel_tol);
                let r = record(GUARD_RECORD_WORDS);
                r.fill(0);
                r[..2].copy_from_slice(&out);
                r[2..2 + VERDICT_WORDS].copy_from_slice(&v);
            }
            GuardStage::Repair => {
                let x = host_count(c.input, c.dtype, g.input_shape().iter().product())?;
                let w = host_count(c.weight, c.dtype, g.weight_shape().iter().product())?;
                let b = match c.bias {
                    Some(b) => host_count(b, a.check.bias_dtype, g.out_channels)?,
                    None => [0; 2],
                };
                let ins = [x[0], x[1], w[0], w[1], b[0], b[1]];
                let v = guard_verdict(out, Some(ins), results, a.rel_tol);
                let r = record(GUARD_REPAIR_WORDS);
                r[..6].copy_from_slice(&ins);
                r[6..8].copy_from_slice(&out);
                r[8..].copy_from_slice(&v);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::raw::conv3d::GuardVerdict;

    fn point(index: u64, value: f64, reference: f64, magnitude: f64) -> [u64; 4] {
        [
            index,
            value.to_bits(),
            reference.to_bits(),
            magnitude.to_bits(),
        ]
    }

    #[test]
    fn the_verdict_judges_counts_and_points() {
        // Nothing wrong.
        let ok = point(3, 1.0, 1.0 + 1e-9, 1.0);
        let v = guard_verdict([0, 0], None, &ok, 1e-5);
        assert_eq!(v[..3], [0, 0, u64::MAX]);
        assert!(!GuardVerdict::decode(&v).failed());
        // A NaN output: from finite operands it fails, from a NaN input not.
        let v = guard_verdict([1, 0], Some([0; 6]), &[], 1e-5);
        assert_eq!(v[..2], [VERDICT_NON_FINITE, 1]);
        assert!(GuardVerdict::decode(&v).non_finite);
        let v = guard_verdict([0, 2], Some([1, 0, 0, 0, 0, 0]), &[], 1e-5);
        assert_eq!(v[..2], [0, 0]);
        // The first point off is reported, with its tolerance.
        let mut words = Vec::new();
        words.extend(point(u64::MAX, 0.0, 0.0, 0.0));
        words.extend(ok);
        words.extend(point(7, 2.0, 1.0, 10.0));
        words.extend(point(9, 5.0, 1.0, 10.0));
        let v = guard_verdict([0, 0], None, &words, 1e-3);
        let d = GuardVerdict::decode(&v);
        assert_eq!(v[1], 1);
        let (i, val, r, tol) = d.off.unwrap();
        assert_eq!((i, val, r), (7, 2.0, 1.0));
        assert!((tol - 1e-2).abs() < 1e-12);
        // A non-finite value at a sampled point is the counts' to judge.
        let nan = point(4, f64::NAN, 1.0, 1.0);
        assert_eq!(guard_verdict([0, 0], None, &nan, 1e-5)[0], 0);
        // A short read decodes as no failure.
        assert!(!GuardVerdict::decode(&[3]).failed());
    }
}
