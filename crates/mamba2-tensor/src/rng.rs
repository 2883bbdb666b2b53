//! A small deterministic generator for values made on the host.
//!
//! Burn's backends each keep one process-wide generator: two tests running in parallel in one
//! binary draw from it in turn, so a test that seeds it and expects the same draws twice can see
//! another test's draw in between, and the same seed gives different numbers on different
//! backends. Values drawn here depend only on the seed, and the same `f64`s can then be handed to
//! every backend. The trainer's epoch shuffles use it too.
//!
//! ```
//! use mamba2_tensor::rng::SplitMix64;
//!
//! let (mut a, mut b) = (SplitMix64::new(7), SplitMix64::new(7));
//! assert_eq!(a.next_u64(), b.next_u64());
//! let u = a.uniform(-1.0, 1.0);
//! assert!((-1.0..1.0).contains(&u));
//! assert!(a.normal().is_finite());
//! ```

/// SplitMix64 (Steele, Lea and Flood): 64 bits of state, a fixed odd increment and a mixing
/// function; statistically fine for test inputs and shuffles, not for cryptography.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
/// 2^53: the number of evenly spaced `f64` values in `[0, 1)` that the top 53 bits give.
const UNIT: f64 = (1u64 << 53) as f64;

impl SplitMix64 {
    /// A generator whose first draw mixes `seed + GAMMA`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * ((self.next_u64() >> 11) as f64 / UNIT)
    }

    /// `len` values uniform in `[lo, hi)`.
    pub fn uniform_vec(&mut self, len: usize, lo: f64, hi: f64) -> Vec<f64> {
        (0..len).map(|_| self.uniform(lo, hi)).collect()
    }

    /// A standard normal value (Box-Muller, the cosine branch, from two draws).
    pub fn normal(&mut self) -> f64 {
        // In (0, 1], never 0, so that the logarithm is finite.
        let mut open = || ((self.next_u64() >> 11) as f64 + 1.0) / UNIT;
        let (a, b) = (open(), open());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }

    /// `len` standard normal values.
    pub fn normal_vec(&mut self, len: usize) -> Vec<f64> {
        (0..len).map(|_| self.normal()).collect()
    }

    /// A uniformly random permutation of `0..n` (Fisher-Yates).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            p.swap(i, (self.next_u64() % (i as u64 + 1)) as usize);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference sequence for seed 0 (the published SplitMix64 test vector), so that a
    /// change to the mixing constants cannot go unnoticed.
    #[test]
    fn matches_the_reference_sequence() {
        let mut r = SplitMix64::new(0);
        assert_eq!(r.next_u64(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(r.next_u64(), 0x6E78_9E6A_A1B9_65F4);
        assert_eq!(r.next_u64(), 0x06C4_5D18_8009_454F);
    }

    #[test]
    fn draws_have_the_stated_ranges_and_moments() {
        let mut r = SplitMix64::new(3);
        let u = r.uniform_vec(20_000, 2.0, 5.0);
        assert!(u.iter().all(|v| (2.0..5.0).contains(v)));
        let mean = u.iter().sum::<f64>() / u.len() as f64;
        // Mean 3.5, standard error 0.87 / sqrt(20000) = 0.006.
        assert!((mean - 3.5).abs() < 0.03, "uniform mean {mean}");
        let z = r.normal_vec(20_000);
        let m = z.iter().sum::<f64>() / z.len() as f64;
        let var = z.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / z.len() as f64;
        assert!(m.abs() < 0.03 && (var - 1.0).abs() < 0.05, "normal mean {m}, variance {var}");
        let mut p = r.permutation(100);
        assert_ne!(p, (0..100).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }
}
