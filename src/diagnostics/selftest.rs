//! CPU self-tests: the checks `doctor` runs before it trusts anything else.
//! Each compares a fast path of this crate with an independent reference.

use std::time::Instant;

use crate::convert::{self, fingerprint, scalar};
use crate::dtype::DType;

/// Outcome of one self-test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The result matched the reference exactly.
    Pass,
    /// The result differed from the reference; `detail` says where.
    Fail,
}

/// One self-test's result.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[non_exhaustive]
pub struct SelfTest {
    /// Stable identifier (`cpu.bf16_to_f32.exhaustive`, ...).
    pub name: String,
    /// Pass or fail.
    pub verdict: Verdict,
    /// What was checked, or the first mismatch.
    pub detail: String,
    /// Wall time in milliseconds.
    pub millis: f64,
}

fn run(name: &str, f: impl FnOnce() -> Result<String, String>) -> SelfTest {
    let t = Instant::now();
    let r = f();
    let millis = t.elapsed().as_secs_f64() * 1e3;
    let (verdict, detail) = match r {
        Ok(d) => (Verdict::Pass, d),
        Err(d) => (Verdict::Fail, d),
    };
    SelfTest {
        name: name.to_owned(),
        verdict,
        detail,
        millis,
    }
}

/// All 65 536 16-bit patterns as little-endian bytes.
fn all_u16_bytes() -> Vec<u8> {
    (0..=u16::MAX).flat_map(u16::to_le_bytes).collect()
}

fn words(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

fn halves(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
    bytes
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
}

/// Converts all 16-bit patterns of `from` to f32 with the bulk path and
/// checks each against `reference(pattern)`.
fn widen_all(from: DType, reference: impl Fn(u16) -> Option<u32>) -> Result<String, String> {
    let src = all_u16_bytes();
    let mut dst = vec![0u8; src.len() * 2];
    convert::convert_bytes(from, &src, DType::F32, &mut dst).map_err(|e| e.to_string())?;
    let mut nans = 0;
    for (p, got) in (0..=u16::MAX).zip(words(&dst)) {
        match reference(p) {
            Some(want) if want == got => {}
            Some(want) => {
                return Err(format!(
                    "pattern {p:#06x}: got {got:#010x}, expected {want:#010x}"
                ))
            }
            // NaN: the reference gives no bits; the result must be a NaN of the same sign.
            None if (got & 0x7fff_ffff) > 0x7f80_0000 && (got >> 31) == u32::from(p >> 15) => {
                nans += 1
            }
            None => return Err(format!("pattern {p:#06x}: NaN became {got:#010x}")),
        }
    }
    if nans == 0 {
        Ok("65536 patterns bit-exact".to_owned())
    } else {
        Ok(format!(
            "65536 patterns bit-exact or NaN kept NaN ({nans} NaNs)"
        ))
    }
}

/// Narrows the f32 image of every non-NaN 16-bit pattern back with the bulk
/// path; an exactly representable value must come back unchanged.
fn narrow_round_trip(to: DType, widen: impl Fn(u16) -> u32) -> Result<String, String> {
    let pats: Vec<u16> = (0..=u16::MAX)
        .filter(|&p| (widen(p) & 0x7fff_ffff) <= 0x7f80_0000)
        .collect();
    let src: Vec<u8> = pats.iter().flat_map(|&p| widen(p).to_le_bytes()).collect();
    let mut dst = vec![0u8; pats.len() * 2];
    convert::convert_bytes(DType::F32, &src, to, &mut dst).map_err(|e| e.to_string())?;
    for (&p, got) in pats.iter().zip(halves(&dst)) {
        if got != p {
            return Err(format!("pattern {p:#06x} came back as {got:#06x}"));
        }
    }
    // Ties to even, overflow, subnormal rounding: a few values whose answer is known.
    let cases: &[(u32, u16)] = match to {
        DType::BF16 => &[
            (0x3f80_8000, 0x3f80), // tie, even below
            (0x3f81_8000, 0x3f82), // tie, odd below: up
            (0x3f80_8001, 0x3f81), // above the tie
            (0x7f7f_ffff, 0x7f80), // largest f32 overflows to inf
            (0x0000_8001, 0x0001), // subnormal rounds up, not flushed
        ],
        _ => &[
            (0x3f80_1000, 0x3c00), // tie, even below
            (0x3f80_3000, 0x3c02), // tie, odd below: up
            (0x477f_f000, 0x7c00), // 65520 rounds to inf
            (0x3300_0000, 0x0000), // 2^-25, half the smallest subnormal: tie to even zero
            (0x3300_0001, 0x0001), // just above: smallest subnormal (2^-24)
        ],
    };
    for &(x, want) in cases {
        let mut out = [0u8; 2];
        convert::convert_bytes(DType::F32, &x.to_le_bytes(), to, &mut out)
            .map_err(|e| e.to_string())?;
        let got = u16::from_le_bytes(out);
        if got != want {
            return Err(format!("{x:#010x} gave {got:#06x}, expected {want:#06x}"));
        }
    }
    Ok(format!(
        "{} exact values round-trip, {} rounding cases",
        pats.len(),
        cases.len()
    ))
}

/// A deterministic pseudo-random byte buffer.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut s = seed;
    (0..len)
        .map(|_| {
            s = fingerprint::mix64(s.wrapping_add(0x9E37_79B9_7F4A_7C15));
            (s >> 56) as u8
        })
        .collect()
}

fn fingerprint_checks() -> Result<String, String> {
    let data = noise((1 << 20) + 6, 7);
    let fast = convert::fingerprint_bytes(&data);
    let mut sum = 0u64;
    for (i, c) in data.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..c.len()].copy_from_slice(c);
        sum = sum.wrapping_add(fingerprint::term(i as u64, u32::from_le_bytes(w)));
    }
    let reference = fingerprint::finish(sum, data.len() as u64);
    if fast != reference {
        return Err(format!(
            "fast path {fast} differs from the formula {reference}"
        ));
    }
    let mut flipped = data.clone();
    flipped[12345] ^= 0x10;
    let mut swapped = data.clone();
    swapped.copy_within(0..4096, 8192);
    swapped[..4096].copy_from_slice(&data[8192..8192 + 4096]);
    let zeros = vec![0u8; data.len()];
    for (what, buf) in [
        ("a flipped bit", &flipped),
        ("swapped chunks", &swapped),
        ("zeros", &zeros),
    ] {
        if convert::fingerprint_bytes(buf) == fast {
            return Err(format!("{what} left the fingerprint unchanged"));
        }
    }
    Ok("matches its formula; detects a flipped bit, swapped chunks, zeros".to_owned())
}

fn parallel_bulk() -> Result<String, String> {
    let n = 4 << 20;
    let src = noise(2 * n, 11);
    let mut dst = vec![0u8; 4 * n];
    convert::convert_bytes(DType::BF16, &src, DType::F32, &mut dst).map_err(|e| e.to_string())?;
    for (i, (h, w)) in halves(&src).zip(words(&dst)).enumerate() {
        if w != scalar::bf16_to_f32(h) {
            return Err(format!("element {i}: {h:#06x} became {w:#010x}"));
        }
    }
    Ok(format!(
        "{n} random bf16 values on all threads match the scalar reference"
    ))
}

/// How many CPU self-tests [`cpu_self_tests`] runs.
pub const CPU_SELF_TESTS: usize = 6;

/// Runs the CPU self-tests. Each is independent; a failure in one does not
/// stop the others.
pub fn cpu_self_tests() -> Vec<SelfTest> {
    cpu_self_tests_with(&mut |_| {})
}

/// [`cpu_self_tests`], calling `before` with each test's name before it
/// runs (for progress).
pub fn cpu_self_tests_with(before: &mut dyn FnMut(&str)) -> Vec<SelfTest> {
    type Check = fn() -> Result<String, String>;
    let tests: [(&str, Check); CPU_SELF_TESTS] = [
        ("cpu.bf16_to_f32.exhaustive", || {
            widen_all(DType::BF16, |p| Some(u32::from(p) << 16))
        }),
        ("cpu.f16_to_f32.exhaustive", || {
            widen_all(DType::F16, |p| {
                let v = half::f16::from_bits(p).to_f32();
                (!v.is_nan()).then_some(v.to_bits())
            })
        }),
        ("cpu.f32_to_bf16.rounding", || {
            narrow_round_trip(DType::BF16, scalar::bf16_to_f32)
        }),
        ("cpu.f32_to_f16.rounding", || {
            narrow_round_trip(DType::F16, scalar::f16_to_f32)
        }),
        ("cpu.fingerprint", fingerprint_checks),
        ("cpu.bf16_to_f32.parallel", parallel_bulk),
    ];
    tests
        .into_iter()
        .map(|(name, check)| {
            before(name);
            run(name, check)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_cpu_self_tests_pass() {
        let mut names = Vec::new();
        let tests = cpu_self_tests_with(&mut |n| names.push(n.to_owned()));
        assert_eq!(tests.len(), CPU_SELF_TESTS);
        let ran: Vec<&str> = tests.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ran);
        for t in &tests {
            assert_eq!(t.verdict, Verdict::Pass, "{}: {}", t.name, t.detail);
        }
    }

    #[test]
    fn a_wrong_reference_is_reported_as_failure() {
        // The harness itself must be able to fail: feed it a reference that is off by one bit.
        let r = widen_all(DType::BF16, |p| {
            Some((u32::from(p) << 16) ^ u32::from(p == 0x1234))
        });
        let e = r.expect_err("mismatch must be reported");
        assert!(e.contains("0x1234"), "{e}");
        let t = run("x", || Err("boom".into()));
        assert_eq!(t.verdict, Verdict::Fail);
    }
}
