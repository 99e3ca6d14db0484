//! Sources: the items read, positioned reads of shard files, host sums.
//!
//! Which bytes of which file become which tensor (`Item`), the positioned
//! reads, and the host's expected fingerprint sums.

use std::path::PathBuf;

use crate::convert::fingerprint::{self, sum_bytes};
use crate::convert::{self, Fingerprint};
use crate::device::ConvertOp;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// One shard file: a second descriptor of the file the checkpoint validated
/// (never opened again by name, which a swapped symlink or a FIFO could
/// redirect or block), for positioned reads straight into the loader's
/// staging buffers (never mapped).
#[derive(Debug)]
pub(crate) struct Source {
    pub path: PathBuf,
    pub file: crate::safetensors::handle::FileHandle,
    /// The length the checkpoint was opened with.
    pub len: u64,
}

impl Source {
    pub fn of(shard: &crate::safetensors::SafeTensors) -> Result<Source> {
        Ok(Source {
            path: shard.path().to_owned(),
            file: shard.try_clone_file()?,
            len: shard.file_len(),
        })
    }

    /// Hints that bytes `off..off + len` will be read soon (asynchronous
    /// readahead); failures are ignored (it is only a hint).
    pub fn advise_willneed(&self, off: u64, len: u64) {
        use std::os::fd::AsRawFd;
        let (Ok(o), Ok(l)) = (libc::off_t::try_from(off), libc::off_t::try_from(len)) else {
            return;
        };
        let Ok(file) = self.file.get(&self.path) else {
            return; // only a hint: the read will report the error
        };
        // SAFETY: `posix_fadvise` only reads its integer arguments; the
        // descriptor is owned by `file` and open for this call.
        let _ = unsafe { libc::posix_fadvise(file.as_raw_fd(), o, l, libc::POSIX_FADV_WILLNEED) };
    }

    /// Reads exactly `dst.len()` bytes at `off`; a short read is
    /// [`Error::FileShrunk`] naming `tensor`.
    pub fn pread(&self, tensor: &str, dst: &mut [u8], off: u64) -> Result<()> {
        let file = self.file.get(&self.path)?;
        crate::safetensors::file::pread_tensor(&file, &self.path, self.len, tensor, dst, off)
    }
}

/// The source `item` reads from (`OutOfBounds` only for an item of another
/// plan: every planned item's source exists).
pub(crate) fn of_item<'s>(sources: &'s [Source], item: &Item) -> Result<&'s Source> {
    sources.get(item.source).ok_or(Error::OutOfBounds {
        op: "transfer source",
        start: item.source,
        end: item.source + 1,
        len: sources.len(),
    })
}

/// One tensor (or row slice) to load.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub name: String,
    pub source: usize,
    /// Absolute file offset of the first byte.
    pub file_off: u64,
    pub src_bytes: u64,
    pub dtype: DType,
    pub out_dtype: DType,
    pub shape: Vec<u64>,
    pub out_bytes: u64,
    /// The conversion, when the output dtype differs.
    pub op: Option<ConvertOp>,
    /// A slice of a later dimension: its bytes are runs spread over the
    /// file (`None`: `src_bytes` contiguous bytes at `file_off`).
    pub runs: Option<Runs>,
}

/// Where a strided item's bytes are: runs of `run` bytes, the first at the
/// item's `file_off`, each `stride` bytes after the one before; the item's
/// source bytes are the runs back to back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Runs {
    /// Bytes of one run (> 0).
    pub run: u64,
    /// File bytes from one run's start to the next's (> `run`).
    pub stride: u64,
}

impl Item {
    /// Output bytes of `src` source bytes (whole source elements).
    pub fn out_len(&self, src: usize) -> usize {
        match self.op {
            Some(op) => {
                let (ss, ds) = (op.from.size().unwrap_or(1), op.to.size().unwrap_or(1));
                src / ss * ds
            }
            None => src,
        }
    }

    /// Source elements before source byte `src_off`.
    pub fn out_off(&self, src_off: u64) -> u64 {
        self.out_len(src_off as usize) as u64
    }

    /// The file offset of source byte `src_off`.
    pub fn file_at(&self, src_off: u64) -> u64 {
        match self.runs {
            None => self.file_off + src_off,
            Some(r) => self.file_off + src_off / r.run * r.stride + src_off % r.run,
        }
    }

    /// Reads source bytes `src_off..src_off + dst.len()` of the item from
    /// `src` into `dst`: one positioned read, or one per run it touches.
    pub fn pread(&self, src: &Source, dst: &mut [u8], src_off: u64) -> Result<()> {
        let Some(r) = self.runs else {
            return src.pread(&self.name, dst, self.file_off + src_off);
        };
        let mut at = src_off;
        let mut rest = dst;
        while !rest.is_empty() {
            let left = r.run - at % r.run;
            let n = usize::try_from(left).map_or(rest.len(), |l| l.min(rest.len()));
            let (part, tail) = rest.split_at_mut(n);
            src.pread(&self.name, part, self.file_at(at))?;
            at += n as u64;
            rest = tail;
        }
        Ok(())
    }
}

/// The host's expectations of one staged piece.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Sums {
    /// Partial fingerprint sum of the staged bytes (word 0 at the piece).
    pub raw: u64,
    /// Partial fingerprint sum of the converted output (word 0 at the
    /// piece's output), when the piece is converted.
    pub conv: u64,
}

impl Sums {
    pub fn add(&mut self, o: Sums) {
        self.raw = self.raw.wrapping_add(o.raw);
        self.conv = self.conv.wrapping_add(o.conv);
    }

    pub fn copy_fp(&self, len: usize) -> Fingerprint {
        fingerprint::finish(self.raw, len as u64)
    }

    pub fn out_fp(&self, item: &Item, len: usize) -> Fingerprint {
        match item.op {
            Some(_) => fingerprint::finish(self.conv, item.out_len(len) as u64),
            None => self.copy_fp(len),
        }
    }
}

/// Elements converted at a time into a stack buffer.
const CONV_PIECE: usize = 4096;

/// The sums of `bytes`, which start at byte `off` of a piece (`off` a
/// multiple of `CONV_PIECE * 8`, so every word and conversion block lines
/// up); `op` when the piece is converted.
///
/// bf16 -> f32 and f16 -> f32 pieces (the usual checkpoint loads) take
/// both sums in one pass over the bytes
/// ([`fingerprint::sum_raw_and_widened`]); any other piece, or one that
/// does not start on a word or is not a whole number of elements (never the
/// case for the loader's pieces; the separate path reports the latter as
/// an error), takes the two separate passes.
pub(crate) fn sums(op: Option<ConvertOp>, off: usize, bytes: &[u8]) -> Result<Sums> {
    if let Some(op) = op {
        if op.to == DType::F32 && off.is_multiple_of(4) && bytes.len().is_multiple_of(2) {
            // `from` is bf16 or f16 here when this is `Some`.
            if let Some(s) = fingerprint::sum_raw_and_widened(op.from, (off / 4) as u64, bytes) {
                return Ok(Sums {
                    raw: s.raw,
                    conv: s.widened,
                });
            }
        }
    }
    let raw = sum_bytes((off / 4) as u64, bytes);
    let conv = match op {
        None => 0,
        Some(op) => converted_sum(op.from, op.to, off, bytes)?,
    };
    Ok(Sums { raw, conv })
}

/// Fingerprint partial sum of `convert(src)` where `src` starts at byte
/// `off` of the piece's source.
pub(crate) fn converted_sum(from: DType, to: DType, off: usize, src: &[u8]) -> Result<u64> {
    let ss = from.size().unwrap_or(1);
    let ds = to.size().unwrap_or(1);
    let first = off / ss;
    let mut sum = 0u64;
    let mut done = 0usize;
    if (from, to) == (DType::BF16, DType::F32) && first.is_multiple_of(256) {
        let (blocks, _) = src.as_chunks::<512>();
        sum = fingerprint::sum_bf16_as_f32_blocks((first / 256) as u64, blocks);
        done = 512 * blocks.len();
    }
    let mut buf = [0u8; CONV_PIECE * 4];
    let rest = src.get(done..).unwrap_or(&[]);
    let mut elem = first + done / ss;
    for piece in rest.chunks(CONV_PIECE * ss) {
        let len = piece.len() / ss * ds;
        let (out, _) = buf.split_at_mut(len.min(CONV_PIECE * 4));
        convert::convert_bytes(from, piece, to, out)?;
        sum = sum.wrapping_add(sum_bytes((elem * ds / 4) as u64, out));
        elem += piece.len() / ss;
    }
    Ok(sum)
}

/// Reads `dst.len()` bytes of `item` starting at source byte `src_off`
/// into `dst` and returns their sums (`dst` is the piece: sums are
/// relative to its start; zero without `check`). Parallel over sub-pieces
/// of `sub` bytes (a multiple of 64 KiB, so words and conversion blocks
/// line up).
pub(crate) fn read_piece(
    sources: &[Source],
    item: &Item,
    src_off: u64,
    dst: &mut [u8],
    sub: usize,
    check: bool,
) -> Result<Sums> {
    use rayon::prelude::*;
    let src = of_item(sources, item)?;
    let sub = sub.max(1);
    let work = |(k, part): (usize, &mut [u8])| -> Result<Sums> {
        let off = k * sub;
        item.pread(src, part, src_off + off as u64)?;
        if !check {
            return Ok(Sums::default());
        }
        sums(item.op, off, part)
    };
    if dst.len() <= sub {
        return work((0, dst));
    }
    crate::par::install(|| {
        dst.par_chunks_mut(sub)
            .enumerate()
            .map(work)
            .try_reduce(Sums::default, |mut a, b| {
                a.add(b);
                Ok(a)
            })
    })
}

/// The sums of `len` bytes of `item` from source byte `src_off`, read
/// from the file into a per-thread buffer of `sub` bytes that stays in the
/// CPU cache (the direct path's host pass: the bytes are only read, never
/// kept). Parallel over sub-pieces as [`read_piece`].
pub(crate) fn sum_piece(
    sources: &[Source],
    item: &Item,
    src_off: u64,
    len: usize,
    sub: usize,
) -> Result<Sums> {
    use rayon::prelude::*;
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let src = of_item(sources, item)?;
    let sub = sub.max(1);
    let work = |k: usize| -> Result<Sums> {
        let off = k * sub;
        let n = sub.min(len - off);
        SCRATCH.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < n {
                *buf = crate::alloc::tensor_bytes(&src.path, &item.name, n as u64)?;
            }
            let part = buf.get_mut(..n).unwrap_or_default();
            item.pread(src, part, src_off + off as u64)?;
            sums(item.op, off, part)
        })
    };
    let chunks = len.div_ceil(sub);
    if chunks <= 1 {
        return if len == 0 {
            Ok(Sums::default())
        } else {
            work(0)
        };
    }
    crate::par::install(|| {
        (0..chunks)
            .into_par_iter()
            .map(work)
            .try_reduce(Sums::default, |mut a, b| {
                a.add(b);
                Ok(a)
            })
    })
}

/// The tensor's output computed on the CPU from `src` (its staged bytes,
/// read from the file `path`); the output is allocated fallibly.
pub(crate) fn cpu_output(path: &std::path::Path, item: &Item, src: Vec<u8>) -> Result<Vec<u8>> {
    if item.out_dtype == item.dtype {
        return Ok(src);
    }
    let mut out = crate::alloc::tensor_bytes(path, &item.name, item.out_len(src.len()) as u64)?;
    convert::convert_bytes(item.dtype, &src, item.out_dtype, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        (0..len)
            .map(|_| {
                s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
                fingerprint::mix64(s) as u8
            })
            .collect()
    }

    /// The one-pass sums of bf16/f16 -> f32 pieces equal the two separate
    /// passes at the offsets the loader uses (multiples of 64 KiB) and at
    /// others, with odd tails; an odd byte count is still an error.
    #[test]
    fn one_pass_sums_equal_the_separate_passes() {
        let bytes = random_bytes(3 * 65_536 + 64, 21);
        for from in [DType::BF16, DType::F16] {
            let op = ConvertOp {
                from,
                to: DType::F32,
            };
            for off in [0usize, 4, 1024, 65_536, 2 * 65_536] {
                for len in [0usize, 2, 6, 1022, 65_536, 65_536 + 6, 3 * 65_536 + 2] {
                    let b = &bytes[..len];
                    let got = sums(Some(op), off, b).unwrap();
                    assert_eq!(got.raw, sum_bytes((off / 4) as u64, b));
                    assert_eq!(
                        got.conv,
                        converted_sum(from, DType::F32, off, b).unwrap(),
                        "{from:?} off {off} len {len}"
                    );
                }
            }
            assert!(sums(Some(op), 0, &bytes[..7]).is_err());
        }
    }
}
