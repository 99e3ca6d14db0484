//! The CPU kernel: a direct convolution on rayon for every parameter combination.
//!
//! It is the conv3d chain's CPU tier and the host backend's stand-in for
//! the GPU kernels.
//!
//! Per batch item the input is widened to f32 once (bf16 exactly, bits
//! shifted left by 16) into a zero-padded copy, so the inner loops need no
//! bounds logic for padding. Weights are packed per block of `OCB` output
//! channels as `[C/groups][KD][KH][KW][OCB]`. A task computes a few output
//! rows of one depth plane for one channel block; its inner kernel keeps an
//! `OCB x OWB` tile of f32 accumulators in registers and streams input rows
//! (contiguous when the width stride is 1) against broadcast weights. On
//! x86-64 the same code is also compiled for AVX2+FMA (4 x 16 tile) and
//! AVX-512 (8 x 32 tile), chosen at run time; elsewhere a portable
//! instantiation (4 x 16, separate multiply and add) runs.

use std::sync::Mutex;

use rayon::prelude::*;

use super::params::{Conv3dGeometry, Conv3dProblem};
use crate::error::{Error, Result};

/// The register tile of the portable and AVX2 kernels: output channels x
/// output points along the width.
const TILE_AVX2: (usize, usize) = (4, 16);
/// The register tile of the AVX-512 kernel (32 vector registers).
const TILE_AVX512: (usize, usize) = (8, 32);
/// Output rows per rayon task.
const ROWS_PER_TASK: usize = 4;
/// Bytes of packed weights a task keeps hot per input-channel chunk.
const L1_WEIGHT_BYTES: usize = 16 * 1024;

fn internal(reason: &'static str) -> Error {
    Error::Conv3dTier {
        tier: "cpu",
        reason,
    }
}

/// Sizes of the padded input copy of one batch item: `[C][DP][HP][WP]`.
#[derive(Debug, Clone, Copy)]
struct Padded {
    dp: usize,
    hp: usize,
    wp: usize,
}

/// Which compiled CPU kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CpuKernel {
    /// The best this CPU has (checked at run time).
    Auto,
    /// Portable code, separate multiply and add (any CPU).
    Portable,
    /// x86-64 AVX2 + FMA, 4 x 16 register tile.
    Avx2Fma,
    /// x86-64 AVX-512F, 8 x 32 register tile.
    Avx512,
}

impl CpuKernel {
    /// The kernels this CPU can run, `Portable` first.
    pub fn available() -> Vec<CpuKernel> {
        let mut v = vec![CpuKernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                v.push(CpuKernel::Avx2Fma);
                if has!("avx512f") {
                    v.push(CpuKernel::Avx512);
                }
            }
        }
        v
    }
}

/// Which compiled kernel runs (a [`CpuKernel`] this CPU has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The ISA for `kernel`, `None` when this CPU lacks it.
    fn for_kernel(kernel: CpuKernel) -> Option<Isa> {
        if kernel == CpuKernel::Auto {
            return Some(Isa::detect());
        }
        if !CpuKernel::available().contains(&kernel) {
            return None;
        }
        match kernel {
            #[cfg(target_arch = "x86_64")]
            CpuKernel::Avx2Fma => Some(Isa::Avx2Fma),
            #[cfg(target_arch = "x86_64")]
            CpuKernel::Avx512 => Some(Isa::Avx512),
            _ => Some(Isa::Portable),
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn detect() -> Isa {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx2") && has!("fma") {
            Isa::Avx512
        } else if has!("avx2") && has!("fma") {
            Isa::Avx2Fma
        } else {
            Isa::Portable
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn detect() -> Isa {
        Isa::Portable
    }

    /// `(OCB, OWB)` of its register tile.
    fn tile(self) -> (usize, usize) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => TILE_AVX512,
            _ => TILE_AVX2,
        }
    }
}

struct Ctx<'a> {
    isa: Isa,
    /// Output channels per block (the tile's first size).
    ocb: usize,
    g: Conv3dGeometry,
    pad: Padded,
    /// Padded input of the current batch item.
    x: &'a [f32],
    /// Packed weights of every (group, block).
    w: &'a [f32],
    /// Bias per output channel (zeros without a bias).
    bias: &'a [f32],
    /// Channel blocks per group.
    blocks: usize,
}

/// One task: `rows[o]` are output rows `oh0..` of depth `od` of channel
/// `first + o` (a channel of block `block` of group `group`).
struct Task<'a> {
    group: usize,
    block: usize,
    first: usize,
    od: usize,
    oh0: usize,
    rows: Vec<&'a mut [f32]>,
}

/// Computes the convolution of `p` on the CPU into `out` (`[N, K, OD, OH,
/// OW]`, f32) with the best kernel this CPU has.
///
/// Errors: [`Error::LengthMismatch`] when `out` does not have the output's
/// length; [`Error::Conv3dTier`] if an internal size check fails (a bug,
/// reported rather than panicking).
pub fn conv3d_cpu(p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
    conv3d_cpu_with(p, out, CpuKernel::Auto)
}

/// [`conv3d_cpu`] with a chosen kernel (to test or compare them).
///
/// Errors: those of [`conv3d_cpu`], and [`Error::Conv3dTier`] when this CPU
/// lacks `kernel`'s instructions.
pub fn conv3d_cpu_with(p: &Conv3dProblem<'_>, out: &mut [f32], kernel: CpuKernel) -> Result<()> {
    // Every parallel loop below runs on a pool that works in this process
    // (a fork()ed child included: crate::par).
    crate::par::install(|| cpu_with(p, out, kernel))
}

fn cpu_with(p: &Conv3dProblem<'_>, out: &mut [f32], kernel: CpuKernel) -> Result<()> {
    let isa = Isa::for_kernel(kernel)
        .ok_or_else(|| internal("this cpu lacks the instructions of the requested kernel"))?;
    let g = p.geometry;
    if out.len() != g.output_len() {
        return Err(Error::LengthMismatch {
            op: "conv3d cpu output",
            expected: g.output_len(),
            actual: out.len(),
            tensor: None,
        });
    }
    if out.is_empty() {
        return Ok(());
    }
    let (ocb, owb) = isa.tile();
    let [d, h, w] = g.input;
    let kw = g.kernel[2];
    let ow_n = g.output[2];
    let pr = g.params;
    // With a unit width stride the last tile reads whole OWB-wide windows:
    // the padded rows get room for them (at most OWB - 1 more columns).
    // Other strides gather lane by lane and read nothing past the row.
    let tiles = ow_n.div_ceil(owb);
    let wp_needed = if pr.stride[2] == 1 {
        tiles * owb + (kw - 1) * pr.dilation[2]
    } else {
        0
    };
    let pad = Padded {
        dp: d + 2 * pr.padding[0],
        hp: h + 2 * pr.padding[1],
        wp: wp_needed.max(w + 2 * pr.padding[2]),
    };
    let plane = pad
        .dp
        .checked_mul(pad.hp)
        .and_then(|v| v.checked_mul(pad.wp))
        .ok_or_else(|| internal("padded input overflows"))?;
    let padded_len = plane
        .checked_mul(g.in_channels)
        .ok_or_else(|| internal("padded input overflows"))?;

    let plan = Plan {
        isa,
        ocb,
        pad,
        plane,
        w_packed: pack_weights(p, ocb)?,
        bias: (0..g.out_channels).map(|k| p.bias_f32(k)).collect(),
        blocks: g.out_per_group().div_ceil(ocb),
    };

    let mut x = take_scratch(padded_len);
    let result = run_items(p, out, &plan, &mut x);
    return_scratch(x);
    result
}

/// What every batch item of one call shares: the kernel, the padded sizes,
/// the packed weights and the bias.
struct Plan {
    isa: Isa,
    /// Output channels per block (the tile's first size).
    ocb: usize,
    pad: Padded,
    /// Elements of one padded channel.
    plane: usize,
    /// Packed weights of every (group, block).
    w_packed: Vec<f32>,
    /// Bias per output channel (zeros without a bias).
    bias: Vec<f32>,
    /// Channel blocks per group.
    blocks: usize,
}

/// Runs every batch item of `p` into `out`, widening each into `x` first.
fn run_items(p: &Conv3dProblem<'_>, out: &mut [f32], plan: &Plan, x: &mut [f32]) -> Result<()> {
    let g = p.geometry;
    let [od_n, oh_n, ow_n] = g.output;
    let out_item = g.out_channels * od_n * oh_n * ow_n;
    let (ocb, blocks) = (plan.ocb, plan.blocks);
    for (n, out_n) in out.chunks_mut(out_item).enumerate() {
        fill_padded(p, n, plan.pad, plan.plane, x)?;
        let ctx = Ctx {
            isa: plan.isa,
            ocb,
            g,
            pad: plan.pad,
            x,
            w: &plan.w_packed,
            bias: &plan.bias,
            blocks,
        };
        let tasks = make_tasks(&g, blocks, ocb, out_n);
        let failed = tasks
            .into_par_iter()
            .map(|mut t| run_task(&ctx, &mut t))
            .any(|r| r.is_none());
        if failed {
            return Err(internal("an index fell outside its buffer"));
        }
    }
    Ok(())
}

/// Widens batch item `n` into the zero-padded buffer `x`.
fn fill_padded(
    p: &Conv3dProblem<'_>,
    n: usize,
    pad: Padded,
    plane: usize,
    x: &mut [f32],
) -> Result<()> {
    let g = &p.geometry;
    let [d, h, w] = g.input;
    let [pd, ph, pw] = g.params.padding;
    let ok = x.par_chunks_mut(plane).enumerate().all(|(c, dst)| {
        dst.fill(0.0);
        let base = (n * g.in_channels + c) * d * h * w;
        for z in 0..d {
            for y in 0..h {
                let at = ((z + pd) * pad.hp + y + ph) * pad.wp + pw;
                let src = base + (z * h + y) * w;
                let Some(row) = dst.get_mut(at..at + w) else {
                    return false;
                };
                if p.input.widen_into(src, row).is_none() {
                    return false;
                }
            }
        }
        true
    });
    if ok {
        Ok(())
    } else {
        Err(internal("padded input copy out of bounds"))
    }
}

/// Weights as `[group][block][C/groups][KD][KH][KW][ocb]`, zero for the
/// channels past the end of a group's last block. Parallel over blocks.
fn pack_weights(p: &Conv3dProblem<'_>, ocb: usize) -> Result<Vec<f32>> {
    let g = &p.geometry;
    let cg = g.in_per_group();
    let kg = g.out_per_group();
    let taps: usize = g.kernel.iter().product();
    let blocks = kg.div_ceil(ocb);
    let per_block = cg * taps * ocb;
    let mut packed = vec![0f32; g.params.groups * blocks * per_block];
    if per_block == 0 {
        return Ok(packed);
    }
    let ok = packed
        .par_chunks_mut(per_block)
        .enumerate()
        .all(|(gb, dst)| {
            let (grp, b) = (gb / blocks, gb % blocks);
            for o in 0..ocb {
                let kl = b * ocb + o;
                if kl >= kg {
                    break;
                }
                let src = (grp * kg + kl) * cg * taps;
                for (i, chunk) in dst.chunks_exact_mut(ocb).enumerate() {
                    match (p.weight.get_f32(src + i), chunk.get_mut(o)) {
                        (Some(v), Some(d)) => *d = v,
                        _ => return false,
                    }
                }
            }
            true
        });
    if ok {
        Ok(packed)
    } else {
        Err(internal("weight index out of bounds"))
    }
}

/// Reusable padded-input buffers: the padded copy of one batch item is
/// large (the input's size), and allocating it per call costs page faults.
/// At most one buffer is kept (the largest returned);
/// [`release_cpu_scratch`] frees it.
static SCRATCH: Mutex<Vec<f32>> = Mutex::new(Vec::new());

fn take_scratch(len: usize) -> Vec<f32> {
    let mut kept = SCRATCH.lock().unwrap_or_else(|p| p.into_inner());
    let mut v = std::mem::take(&mut *kept);
    drop(kept);
    if v.len() < len {
        v = vec![0f32; len];
    }
    v.truncate(len);
    v
}

fn return_scratch(v: Vec<f32>) {
    let mut kept = SCRATCH.lock().unwrap_or_else(|p| p.into_inner());
    if v.capacity() > kept.capacity() {
        *kept = v;
    }
}

/// Frees the padded-input buffer the CPU tier keeps between calls.
pub fn release_cpu_scratch() {
    let mut kept = SCRATCH.lock().unwrap_or_else(|p| p.into_inner());
    *kept = Vec::new();
}

fn make_tasks<'a>(
    g: &Conv3dGeometry,
    blocks: usize,
    ocb: usize,
    out_n: &'a mut [f32],
) -> Vec<Task<'a>> {
    let [od_n, oh_n, ow_n] = g.output;
    let kg = g.out_per_group();
    let chunk = ROWS_PER_TASK * ow_n;
    // Per channel: its pieces in (od, row chunk) order.
    let mut per_channel: Vec<std::vec::IntoIter<&'a mut [f32]>> = out_n
        .chunks_mut(od_n * oh_n * ow_n)
        .map(|ch| {
            ch.chunks_mut(oh_n * ow_n)
                .flat_map(|plane| plane.chunks_mut(chunk))
                .collect::<Vec<_>>()
                .into_iter()
        })
        .collect();
    let pieces_per_plane = oh_n.div_ceil(ROWS_PER_TASK);
    let mut tasks = Vec::new();
    for group in 0..g.params.groups {
        for block in 0..blocks {
            let first = group * kg + block * ocb;
            let last = (first + ocb).min((group + 1) * kg);
            for od in 0..od_n {
                for piece in 0..pieces_per_plane {
                    let rows = per_channel
                        .get_mut(first..last)
                        .into_iter()
                        .flatten()
                        .filter_map(|it| it.next())
                        .collect();
                    tasks.push(Task {
                        group,
                        block,
                        first,
                        od,
                        oh0: piece * ROWS_PER_TASK,
                        rows,
                    });
                }
            }
        }
    }
    tasks
}

fn run_task(ctx: &Ctx<'_>, t: &mut Task<'_>) -> Option<()> {
    match ctx.isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` chose `Avx2Fma` only after checking at run
        // time that this CPU has the AVX2 and FMA instructions
        // `task_avx2_fma` is compiled for.
        Isa::Avx2Fma => unsafe { task_avx2_fma(ctx, t) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::detect` chose `Avx512` only after checking at run
        // time that this CPU has AVX-512F, AVX2 and FMA, the features
        // `task_avx512` is compiled for.
        Isa::Avx512 => unsafe { task_avx512(ctx, t) },
        Isa::Portable => task::<false, { TILE_AVX2.0 }, { TILE_AVX2.1 }>(ctx, t),
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn task_avx2_fma(ctx: &Ctx<'_>, t: &mut Task<'_>) -> Option<()> {
    task::<true, { TILE_AVX2.0 }, { TILE_AVX2.1 }>(ctx, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn task_avx512(ctx: &Ctx<'_>, t: &mut Task<'_>) -> Option<()> {
    task::<true, { TILE_AVX512.0 }, { TILE_AVX512.1 }>(ctx, t)
}

#[inline(always)]
fn task<const FMA: bool, const OCB: usize, const OWB: usize>(
    ctx: &Ctx<'_>,
    t: &mut Task<'_>,
) -> Option<()> {
    if ctx.ocb != OCB {
        return None;
    }
    let [_, _, ow_n] = ctx.g.output;
    let unit_stride = ctx.g.params.stride[2] == 1;
    let rows = t.rows.first().map_or(0, |r| r.len() / ow_n.max(1));
    // Input channels in chunks whose packed weights (OCB channels) stay in
    // L1 while every tile of the task uses them; partial sums go through
    // the output rows between chunks.
    let cg = ctx.g.in_per_group();
    let taps: usize = ctx.g.kernel.iter().product();
    let chunk = (L1_WEIGHT_BYTES / (taps * OCB * 4)).clamp(1, cg.max(1));
    let mut c0 = 0;
    loop {
        let c1 = (c0 + chunk).min(cg);
        for r in 0..rows {
            let oh = t.oh0 + r;
            for ow0 in (0..ow_n).step_by(OWB) {
                let valid = OWB.min(ow_n - ow0);
                let at = r * ow_n + ow0;
                let sum = if unit_stride {
                    tile::<FMA, true, OCB, OWB>(ctx, t, oh, ow0, c0..c1)?
                } else {
                    tile::<FMA, false, OCB, OWB>(ctx, t, oh, ow0, c0..c1)?
                };
                // The first chunk starts from the bias, later ones from the
                // partial sums already in the output.
                for (o, (row, a)) in t.rows.iter_mut().zip(&sum).enumerate() {
                    let dst = row.get_mut(at..at + valid)?;
                    if c0 == 0 {
                        let b = *ctx.bias.get(t.first + o)?;
                        for (d, v) in dst.iter_mut().zip(a) {
                            *d = b + v;
                        }
                    } else {
                        for (d, v) in dst.iter_mut().zip(a) {
                            *d += v;
                        }
                    }
                }
            }
        }
        if c1 >= cg {
            break;
        }
        c0 = c1;
    }
    Some(())
}

#[inline(always)]
fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The contributions of input channels `channels` (within the group) to the `OCB x OWB` tile of output points `(the task's channels,
/// od, oh, ow0..ow0 + OWB)`. `UNIT` is `stride[2] == 1` (contiguous loads).
#[inline(always)]
fn tile<const FMA: bool, const UNIT: bool, const OCB: usize, const OWB: usize>(
    ctx: &Ctx<'_>,
    t: &Task<'_>,
    oh: usize,
    ow0: usize,
    channels: std::ops::Range<usize>,
) -> Option<[[f32; OWB]; OCB]> {
    let (group, block, od) = (t.group, t.block, t.od);
    let g = &ctx.g;
    let [kd_n, kh_n, kw_n] = g.kernel;
    let [sd, sh, sw] = g.params.stride;
    let [dd, dh, dw] = g.params.dilation;
    let cg = g.in_per_group();
    let Padded { dp, hp, wp } = ctx.pad;
    let taps = kd_n * kh_n * kw_n;
    let wbase = ((group * ctx.blocks + block) * cg + channels.start) * taps * OCB;
    let mut acc = [[0f32; OWB]; OCB];
    let mut wi = wbase;
    let x0 = ow0 * sw;
    // What a row segment must hold: the OWB-wide windows of every tap
    // (unit stride), or up to the row's end (other strides; lanes past the
    // last output point may fall beyond it and read as zero).
    let span = if UNIT {
        (kw_n - 1) * dw + OWB
    } else {
        wp.checked_sub(x0)?
    };
    for ci in channels {
        let c = group * cg + ci;
        for kd in 0..kd_n {
            let z = od * sd + kd * dd;
            for kh in 0..kh_n {
                let y = oh * sh + kh * dh;
                let start = ((c * dp + z) * hp + y) * wp + x0;
                let seg = ctx.x.get(start..start + span)?;
                let wrow = ctx.w.get(wi..wi + kw_n * OCB)?;
                wi += kw_n * OCB;
                if UNIT {
                    for (kw, wv) in wrow.chunks_exact(OCB).enumerate() {
                        let wv: &[f32; OCB] = wv.first_chunk()?;
                        let off = kw * dw;
                        // SAFETY: with a unit width stride `seg` holds
                        // `span = (kw_n - 1) * dw + OWB` floats (checked by
                        // `get` above) and `kw < kw_n`, so the OWB floats
                        // at `off` lie inside it; `read_unaligned` needs no
                        // alignment and f32 has no invalid bit patterns.
                        let xs: [f32; OWB] =
                            unsafe { seg.as_ptr().add(off).cast::<[f32; OWB]>().read_unaligned() };
                        for o in 0..OCB {
                            for j in 0..OWB {
                                acc[o][j] = madd::<FMA>(wv[o], xs[j], acc[o][j]);
                            }
                        }
                    }
                } else {
                    for (kw, wv) in wrow.chunks_exact(OCB).enumerate() {
                        let wv: &[f32; OCB] = wv.first_chunk()?;
                        let mut xs = [0f32; OWB];
                        for (j, e) in xs.iter_mut().enumerate() {
                            // Valid lanes are inside the row by construction.
                            *e = j
                                .checked_mul(sw)
                                .and_then(|v| v.checked_add(kw * dw))
                                .and_then(|i| seg.get(i))
                                .copied()
                                .unwrap_or(0.0);
                        }
                        for o in 0..OCB {
                            for j in 0..OWB {
                                acc[o][j] = madd::<FMA>(wv[o], xs[j], acc[o][j]);
                            }
                        }
                    }
                }
            }
        }
    }
    Some(acc)
}
