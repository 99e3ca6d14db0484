//! The one seeded generator of the tests (and benches): splitmix64.
//!
//! Every draw is the splitmix64 output of a state advanced by the golden
//! gamma, so `Rng::new(seed)` gives the sequence the tests' earlier
//! per-file generators gave for the same seed (`u64`, the low bits of each
//! draw for `u32s` / `u16s`, the little-endian bytes of successive draws
//! for `bytes`).

/// A seeded splitmix64 generator.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    /// The next 64 random bits.
    pub fn u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.u64() % n.max(1)
    }

    /// `n` draws, the low 32 bits of each.
    pub fn u32s(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.u64() as u32).collect()
    }

    /// `n` draws, the low 16 bits of each.
    pub fn u16s(&mut self, n: usize) -> Vec<u16> {
        (0..n).map(|_| self.u64() as u16).collect()
    }

    /// `n` bytes: the little-endian bytes of successive draws.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n + 8);
        while out.len() < n {
            out.extend_from_slice(&self.u64().to_le_bytes());
        }
        out.truncate(n);
        out
    }

    /// `n` f32 bit patterns (every pattern equally likely: NaNs,
    /// infinities and subnormals included).
    pub fn f32_patterns(&mut self, n: usize) -> Vec<f32> {
        self.u32s(n).into_iter().map(f32::from_bits).collect()
    }

    /// `n` values uniform in `lo..hi`, each `lo + (hi - lo) * k / 2^24`
    /// for a random `k` in `0..2^24` (exact in f32 where `hi - lo` is a
    /// power of two).
    pub fn f32s(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
        (0..n)
            .map(|_| lo + (hi - lo) * ((self.u64() >> 40) as f32 * SCALE))
            .collect()
    }
}
