//! The host side of a move: a span of bytes made of pieces at offsets
//! (zeros between them), copied into staging while its fingerprint sum is
//! taken, and the parallel copies of large pieces.

use rayon::prelude::*;

use crate::convert::fingerprint::{copy_and_sum, sum_bytes};
use crate::error::{Error, Result};

/// Bytes per parallel task of a fill or copy (a multiple of 4, so each
/// task's words start at a whole word of the span).
const PIECE: usize = 256 * 1024;

/// Host pieces at byte offsets of one span of `len` bytes; the bytes that
/// no piece covers are zeros.
#[derive(Debug)]
pub(crate) struct Span<'a> {
    /// `(offset, bytes)`, sorted by offset, not overlapping.
    parts: Vec<(usize, &'a [u8])>,
    len: usize,
}

impl<'a> Span<'a> {
    /// A span of `len` bytes of `parts`.
    ///
    /// Errors: [`Error::OutOfBounds`] when a part passes `len` or two
    /// overlap.
    pub(crate) fn new(mut parts: Vec<(usize, &'a [u8])>, len: usize) -> Result<Span<'a>> {
        parts.sort_by_key(|p| p.0);
        let mut end = 0usize;
        for &(off, b) in &parts {
            let e = off.checked_add(b.len()).filter(|&e| e <= len);
            match e {
                Some(e) if off >= end => end = e,
                _ => {
                    return Err(Error::OutOfBounds {
                        op: "move: packed piece",
                        start: off,
                        end: off.saturating_add(b.len()),
                        len,
                    })
                }
            }
        }
        Ok(Span { parts, len })
    }

    /// Bytes of the span.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The pieces (sorted by offset).
    pub(crate) fn parts(&self) -> &[(usize, &'a [u8])] {
        &self.parts
    }

    /// Whether some bytes of the span are in no piece.
    pub(crate) fn has_gaps(&self) -> bool {
        self.parts.iter().map(|p| p.1.len()).sum::<usize>() != self.len
    }

    /// The source bytes `start .. start + len` when one piece holds them all.
    fn within_one_part(&self, start: usize, len: usize) -> Option<&'a [u8]> {
        let i = self.parts.partition_point(|p| p.0 + p.1.len() <= start);
        let &(off, b) = self.parts.get(i)?;
        (off <= start && start + len <= off + b.len()).then(|| &b[start - off..start - off + len])
    }

    /// Writes the span's bytes `start .. start + out.len()` into `out`.
    fn fill(&self, start: usize, out: &mut [u8]) {
        let end = start + out.len();
        // The first part that may overlap: parts are sorted and disjoint.
        let first = self.parts.partition_point(|p| p.0 + p.1.len() <= start);
        let mut at = start;
        for &(off, b) in &self.parts[first..] {
            if off >= end {
                break;
            }
            let (s, e) = (off.max(start), (off + b.len()).min(end));
            if s > at {
                out[at - start..s - start].fill(0);
            }
            out[s - start..e - start].copy_from_slice(&b[s - off..e - off]);
            at = e;
        }
        if at < end {
            out[at - start..].fill(0);
        }
    }

    /// Writes bytes `start ..` of the span into `out` (its length) and
    /// returns their fingerprint sum, taken of what was written (the staged
    /// bytes), in parallel for large pieces. `start` is a multiple of 4.
    pub(crate) fn fill_and_sum(&self, start: usize, out: &mut [u8]) -> u64 {
        debug_assert!(start.is_multiple_of(4));
        let one = |k: usize, piece: &mut [u8]| {
            let at = start + k * PIECE;
            if let Some(src) = self.within_one_part(at, piece.len()) {
                // One pass over the source: copied as it is summed.
                return copy_and_sum((at / 4) as u64, src, piece);
            }
            self.fill(at, piece);
            sum_bytes((at / 4) as u64, piece)
        };
        if out.len() <= PIECE || crate::par::threads() < 2 {
            return one(0, out);
        }
        crate::par::install(|| {
            out.par_chunks_mut(PIECE)
                .enumerate()
                .map(|(k, p)| one(k, p))
                .reduce(|| 0, u64::wrapping_add)
        })
    }

    /// The fingerprint sum of the whole span (pieces and zeros).
    pub(crate) fn sum(&self) -> u64 {
        let mut scratch = vec![0u8; PIECE.min(self.len.max(4))];
        let mut s = 0u64;
        let mut at = 0;
        while at < self.len {
            let n = (self.len - at).min(scratch.len());
            s = s.wrapping_add(self.fill_and_sum(at, &mut scratch[..n]));
            at += n;
        }
        s
    }
}

/// Copies `src` into `dst` (same length), in parallel for large buffers.
pub(crate) fn par_copy(dst: &mut [u8], src: &[u8]) {
    if dst.len() <= 4 * PIECE || crate::par::threads() < 2 {
        dst.copy_from_slice(src);
        return;
    }
    crate::par::install(|| {
        dst.par_chunks_mut(PIECE)
            .zip(src.par_chunks(PIECE))
            .for_each(|(d, s)| d.copy_from_slice(s));
    });
}

/// The fingerprint sum of `bytes`, the first of which is byte `start`
/// (a multiple of 4) of the buffer; parallel for large buffers.
pub(crate) fn par_sum_at(start: usize, bytes: &[u8]) -> u64 {
    crate::convert::fingerprint::par_sum_bytes((start / 4) as u64, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::convert::fingerprint::sum_bytes;

    #[test]
    fn fill_writes_parts_and_zeros_and_sums_what_it_wrote() {
        let a: Vec<u8> = (0..10u8).collect();
        let b: Vec<u8> = (100..103u8).collect();
        let span = Span::new(vec![(16, &b[..]), (0, &a[..])], 24).unwrap();
        assert!(span.has_gaps());
        let mut out = vec![0xAAu8; 24];
        let s = span.fill_and_sum(0, &mut out);
        let mut want = vec![0u8; 24];
        want[..10].copy_from_slice(&a);
        want[16..19].copy_from_slice(&b);
        assert_eq!(out, want);
        assert_eq!(s, sum_bytes(0, &want));
        assert_eq!(span.sum(), sum_bytes(0, &want));
        // A window in the middle.
        let mut mid = vec![0xAAu8; 8];
        let s = span.fill_and_sum(8, &mut mid);
        assert_eq!(mid, want[8..16]);
        assert_eq!(s, sum_bytes(2, &want[8..16]));
    }

    #[test]
    fn large_fill_matches_the_serial_sum() {
        let src: Vec<u8> = (0..3 * PIECE + 77).map(|i| (i * 31 % 251) as u8).collect();
        let span = Span::new(vec![(0, &src[..])], src.len()).unwrap();
        let mut out = vec![0u8; src.len()];
        assert_eq!(span.fill_and_sum(0, &mut out), sum_bytes(0, &src));
        assert_eq!(out, src);
        let mut d = vec![0u8; src.len()];
        par_copy(&mut d, &src);
        assert_eq!(d, src);
    }

    #[test]
    fn overlapping_or_outside_parts_are_refused() {
        let a = [1u8; 8];
        assert!(Span::new(vec![(0, &a[..]), (4, &a[..])], 16).is_err());
        assert!(Span::new(vec![(12, &a[..])], 16).is_err());
        assert!(Span::new(vec![(usize::MAX - 2, &a[..])], 16).is_err());
    }
}
