//! The CPU tier: a direct convolution on rayon, for every parameter
//! combination.
//!
//! Per batch item the input is widened to f32 once (bf16 exactly, bits
//! shifted left by 16) into a zero-padded copy, so the inner loops need no
//! bounds logic for padding. Weights are packed per block of [`OCB`] output
//! channels as `[C/groups][KD][KH][KW][OCB]`. A task computes a few output
//! rows of one depth plane for one channel block; its inner kernel keeps an
//! `OCB x OWB` tile of f32 accumulators in registers and streams input rows
//! (contiguous when the width stride is 1) against broadcast weights. On
//! x86-64 with AVX2 and FMA the same code is compiled a second time with
//! those features and chosen at run time.

use rayon::prelude::*;

use super::params::{Conv3dGeometry, Conv3dProblem};
use crate::error::{Error, Result};

/// Output channels per register tile.
pub const OCB: usize = 4;
/// Output points along the width per register tile.
pub const OWB: usize = 16;
/// Output rows per rayon task.
const ROWS_PER_TASK: usize = 4;

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

struct Ctx<'a> {
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
/// OW]`, f32).
///
/// Errors: [`Error::LengthMismatch`] when `out` does not have the output's
/// length; [`Error::Conv3dTier`] if an internal size check fails (a bug,
/// reported rather than panicking).
pub fn conv3d_cpu(p: &Conv3dProblem<'_>, out: &mut [f32]) -> Result<()> {
    let g = p.geometry;
    if out.len() != g.output_len() {
        return Err(Error::LengthMismatch {
            op: "conv3d cpu output",
            expected: g.output_len(),
            actual: out.len(),
        });
    }
    if out.is_empty() {
        return Ok(());
    }
    let [d, h, w] = g.input;
    let [_, kh, kw] = g.kernel;
    let [od_n, oh_n, ow_n] = g.output;
    let pr = g.params;
    let tiles = ow_n.div_ceil(OWB);
    let wp_needed = ((tiles * OWB - 1) * pr.stride[2] + (kw - 1) * pr.dilation[2]).checked_add(1);
    let pad = Padded {
        dp: d + 2 * pr.padding[0],
        hp: h + 2 * pr.padding[1],
        wp: wp_needed
            .ok_or_else(|| internal("padded width overflows"))?
            .max(w + 2 * pr.padding[2]),
    };
    let _ = kh;
    let plane = pad
        .dp
        .checked_mul(pad.hp)
        .and_then(|v| v.checked_mul(pad.wp))
        .ok_or_else(|| internal("padded input overflows"))?;
    let padded_len = plane
        .checked_mul(g.in_channels)
        .ok_or_else(|| internal("padded input overflows"))?;

    let w_packed = pack_weights(p)?;
    let bias: Vec<f32> = (0..g.out_channels).map(|k| p.bias_f32(k)).collect();
    let blocks = g.out_per_group().div_ceil(OCB);

    let use_fma = fma_available();
    let mut x = vec![0f32; padded_len];
    let out_item = g.out_channels * od_n * oh_n * ow_n;
    for (n, out_n) in out.chunks_mut(out_item).enumerate() {
        fill_padded(p, n, pad, plane, &mut x)?;
        let ctx = Ctx {
            g,
            pad,
            x: &x,
            w: &w_packed,
            bias: &bias,
            blocks,
        };
        let tasks = make_tasks(&g, blocks, out_n);
        let failed = tasks
            .into_par_iter()
            .map(|mut t| run_task(&ctx, &mut t, use_fma))
            .any(|r| r.is_none());
        if failed {
            return Err(internal("an index fell outside its buffer"));
        }
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
fn fma_available() -> bool {
    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn fma_available() -> bool {
    false
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

/// Weights as `[group][block][C/groups][KD][KH][KW][OCB]`, zero for the
/// channels past the end of a group's last block.
fn pack_weights(p: &Conv3dProblem<'_>) -> Result<Vec<f32>> {
    let g = &p.geometry;
    let cg = g.in_per_group();
    let kg = g.out_per_group();
    let taps: usize = g.kernel.iter().product();
    let blocks = kg.div_ceil(OCB);
    let len = g.params.groups * blocks * cg * taps * OCB;
    let mut packed = vec![0f32; len];
    for (i, v) in packed.iter_mut().enumerate() {
        let o = i % OCB;
        let tap = i / OCB % taps;
        let ci = i / (OCB * taps) % cg;
        let b = i / (OCB * taps * cg) % blocks;
        let grp = i / (OCB * taps * cg * blocks);
        let kl = b * OCB + o;
        if kl < kg {
            let k = grp * kg + kl;
            *v = p
                .weight
                .get_f32((k * cg + ci) * taps + tap)
                .ok_or_else(|| internal("weight index out of bounds"))?;
        }
    }
    Ok(packed)
}

fn make_tasks<'a>(g: &Conv3dGeometry, blocks: usize, out_n: &'a mut [f32]) -> Vec<Task<'a>> {
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
            let first = group * kg + block * OCB;
            let last = (first + OCB).min((group + 1) * kg);
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

fn run_task(ctx: &Ctx<'_>, t: &mut Task<'_>, use_fma: bool) -> Option<()> {
    #[cfg(target_arch = "x86_64")]
    if use_fma {
        // SAFETY: `fma_available` checked at run time that this CPU has the
        // AVX2 and FMA instructions `task_avx2_fma` is compiled for.
        return unsafe { task_avx2_fma(ctx, t) };
    }
    let _ = use_fma;
    task::<false>(ctx, t)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn task_avx2_fma(ctx: &Ctx<'_>, t: &mut Task<'_>) -> Option<()> {
    task::<true>(ctx, t)
}

#[inline(always)]
fn task<const FMA: bool>(ctx: &Ctx<'_>, t: &mut Task<'_>) -> Option<()> {
    let [_, _, ow_n] = ctx.g.output;
    let unit_stride = ctx.g.params.stride[2] == 1;
    let rows = t.rows.first().map_or(0, |r| r.len() / ow_n.max(1));
    for r in 0..rows {
        let oh = t.oh0 + r;
        for ow0 in (0..ow_n).step_by(OWB) {
            let acc = if unit_stride {
                tile::<FMA, true>(ctx, t.group, t.block, t.od, oh, ow0)?
            } else {
                tile::<FMA, false>(ctx, t.group, t.block, t.od, oh, ow0)?
            };
            let valid = OWB.min(ow_n - ow0);
            for (o, (row, a)) in t.rows.iter_mut().zip(&acc).enumerate() {
                let b = *ctx.bias.get(t.first + o)?;
                let at = r * ow_n + ow0;
                let dst = row.get_mut(at..at + valid)?;
                for (d, v) in dst.iter_mut().zip(a) {
                    *d = v + b;
                }
            }
        }
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

/// Accumulates the `OCB x OWB` tile of output points `(block channels, od,
/// oh, ow0..ow0 + OWB)`. `UNIT` is `stride[2] == 1` (contiguous loads).
#[inline(always)]
fn tile<const FMA: bool, const UNIT: bool>(
    ctx: &Ctx<'_>,
    group: usize,
    block: usize,
    od: usize,
    oh: usize,
    ow0: usize,
) -> Option<[[f32; OWB]; OCB]> {
    let g = &ctx.g;
    let [kd_n, kh_n, kw_n] = g.kernel;
    let [sd, sh, sw] = g.params.stride;
    let [dd, dh, dw] = g.params.dilation;
    let cg = g.in_per_group();
    let Padded { dp, hp, wp } = ctx.pad;
    let taps = kd_n * kh_n * kw_n;
    let wbase = (group * ctx.blocks + block) * cg * taps * OCB;
    let mut acc = [[0f32; OWB]; OCB];
    let mut wi = wbase;
    let x0 = ow0 * sw;
    let span = (kw_n - 1) * dw + (OWB - 1) * sw + 1;
    for ci in 0..cg {
        let c = group * cg + ci;
        for kd in 0..kd_n {
            let z = od * sd + kd * dd;
            for kh in 0..kh_n {
                let y = oh * sh + kh * dh;
                let start = ((c * dp + z) * hp + y) * wp + x0;
                let seg = ctx.x.get(start..start + span)?;
                let wrow = ctx.w.get(wi..wi + kw_n * OCB)?;
                wi += kw_n * OCB;
                for kw in 0..kw_n {
                    let wv: &[f32; OCB] = wrow.get(kw * OCB..)?.first_chunk()?;
                    let xs: [f32; OWB] = if UNIT {
                        *seg.get(kw * dw..)?.first_chunk()?
                    } else {
                        let mut v = [0f32; OWB];
                        for (j, e) in v.iter_mut().enumerate() {
                            *e = *seg.get(kw * dw + j * sw)?;
                        }
                        v
                    };
                    for o in 0..OCB {
                        for j in 0..OWB {
                            acc[o][j] = madd::<FMA>(wv[o], xs[j], acc[o][j]);
                        }
                    }
                }
            }
        }
    }
    let _ = dp;
    Some(acc)
}
