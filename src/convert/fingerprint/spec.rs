//! The definition (version 1): keys, the one-word term, lane tables, finish.

/// Words per keyed block (the block key changes every 256 words = 1 KiB).
pub(crate) const BLOCK_WORDS: u64 = 256;
const LANE_SEED: u64 = 0x6A09_E667_F3BC_C908;
const BLOCK_SEED: u64 = 0xBB67_AE85_84CA_A73B;
const LEN_SEED: u64 = 0x3C6E_F372_FE94_F82B;

pub use super::value::Fingerprint;

/// The splitmix64 finaliser used throughout the fingerprint.
#[inline(always)]
pub(crate) const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The key of a lane (`i mod 256`).
#[inline(always)]
pub(crate) const fn lane_key(lane: u64) -> u64 {
    mix64(lane.wrapping_add(LANE_SEED))
}

/// The key of a block (`i / 256`).
#[inline(always)]
pub(crate) const fn block_key(block: u64) -> u64 {
    mix64(block.wrapping_add(BLOCK_SEED))
}

/// The term `t_i` of word `word` at word position `index`.
#[inline(always)]
pub(crate) const fn term(index: u64, word: u32) -> u64 {
    let l = lane_key(index % BLOCK_WORDS);
    let b = block_key(index / BLOCK_WORDS);
    let add = (l as u32) ^ (b as u32);
    let mul = ((l >> 32) as u32 ^ (b >> 32) as u32) | 1;
    (word.wrapping_add(add) as u64) * (mul as u64)
}

/// `lo32(L)` for every lane `j` (the lane's part of `add_i`).
pub(crate) const LANE_ADD: [u32; 256] = lane_table(false);

/// `hi32(L) | 1` for every lane `j` (the lane's part of `mul_i`; since bit 0
/// of `mul_i` is always set, `mul_i = LANE_MUL[j] ^ (hi32(B) & !1)`).
pub(crate) const LANE_MUL: [u32; 256] = lane_table(true);

const fn lane_table(mul: bool) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut j = 0;
    while j < 256 {
        let l = lane_key(j as u64);
        t[j] = if mul { (l >> 32) as u32 | 1 } else { l as u32 };
        j += 1;
    }
    t
}

/// The two per-block constants: `lo32(B)` and `hi32(B)` with bit 0 cleared.
#[inline(always)]
pub(crate) fn block_consts(block: u64) -> (u32, u32) {
    let b = block_key(block);
    (b as u32, (b >> 32) as u32 & !1)
}

/// The lane tables split by even and odd lanes, zero-extended to 64 bits:
/// `[add even, add odd, mul even, mul odd]`.
pub(crate) const PAIR_TABLES: [[u64; 128]; 4] = pair_tables();

const fn pair_tables() -> [[u64; 128]; 4] {
    let mut t = [[0u64; 128]; 4];
    let mut k = 0;
    while k < 128 {
        t[0][k] = LANE_ADD[2 * k] as u64;
        t[1][k] = LANE_ADD[2 * k + 1] as u64;
        t[2][k] = LANE_MUL[2 * k] as u64;
        t[3][k] = LANE_MUL[2 * k + 1] as u64;
        k += 1;
    }
    t
}

/// Finishes a total sum `S` of a buffer of `len_bytes` bytes.
#[inline]
pub const fn finish(sum: u64, len_bytes: u64) -> Fingerprint {
    Fingerprint(mix64(sum ^ mix64(len_bytes.wrapping_add(LEN_SEED))))
}
