//! Streaming: the fingerprint of a buffer that arrives in pieces.

use super::spec::term;
use super::{finish, par_sum_bytes, Fingerprint};

/// The fingerprint of a buffer that arrives in order, in pieces of any
/// length.
///
/// ```
/// use rocm_safe::convert::fingerprint::{fingerprint_bytes, Fingerprinter};
/// let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
/// let mut f = Fingerprinter::new();
/// for piece in data.chunks(333) {
///     f.update(piece);
/// }
/// assert_eq!(f.finish(), fingerprint_bytes(&data));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Fingerprinter {
    sum: u64,
    len: u64,
    pending: [u8; 4],
}

impl Fingerprinter {
    /// An empty buffer so far.
    pub const fn new() -> Self {
        Self {
            sum: 0,
            len: 0,
            pending: [0; 4],
        }
    }

    /// Bytes seen so far.
    pub const fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte was seen yet.
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes` to the buffer (parallel for large pieces).
    pub fn update(&mut self, mut bytes: &[u8]) {
        // Complete a word left partial by the previous piece.
        let mut fill = (self.len % 4) as usize;
        while fill != 0 {
            let Some((&b, rest)) = bytes.split_first() else {
                return;
            };
            if let Some(p) = self.pending.get_mut(fill) {
                *p = b;
            }
            bytes = rest;
            self.len += 1;
            fill = (self.len % 4) as usize;
            if fill == 0 {
                let w = u32::from_le_bytes(self.pending);
                self.sum = self.sum.wrapping_add(term(self.len / 4 - 1, w));
                self.pending = [0; 4];
            }
        }
        let (words, rest) = bytes.as_chunks::<4>();
        let whole = words.as_flattened();
        self.sum = self.sum.wrapping_add(par_sum_bytes(self.len / 4, whole));
        self.len += whole.len() as u64;
        for (p, &b) in self.pending.iter_mut().zip(rest) {
            *p = b;
        }
        self.len += rest.len() as u64;
    }

    /// The fingerprint of everything appended so far.
    pub fn finish(&self) -> Fingerprint {
        let mut sum = self.sum;
        if !self.len.is_multiple_of(4) {
            // The pending bytes past `len` are still zero: padding.
            sum = sum.wrapping_add(term(self.len / 4, u32::from_le_bytes(self.pending)));
        }
        finish(sum, self.len)
    }
}
