//! Choosing the next token from a row of logits: greedy, or sampled with a temperature, top-k
//! and top-p (nucleus), from a seeded generator so that a seed repeats a run.
//!
//! The filters apply in HF transformers' order: the temperature divides the logits, top-k keeps
//! the `k` largest, top-p then keeps the smallest set of the most likely tokens whose
//! probabilities reach `p`; the next token is drawn from what remains, renormalised.
//!
//! ```
//! use mamba2_model::{Sampler, Sampling};
//!
//! let logits = [0.5f32, 3.0, -1.0, 2.5];
//! assert_eq!(Sampler::new(Sampling::greedy(), 0).unwrap().sample(&logits), 1);
//! let mut s = Sampler::new(Sampling { temperature: 1.0, top_k: 2, top_p: 1.0 }, 7).unwrap();
//! assert!((0..100).all(|_| matches!(s.sample(&logits), 1 | 3)));
//! ```

use mamba2_tensor::rng::SplitMix64;
use num_traits::Float;

/// How [`Sampler`] picks the next token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// `0` picks the most likely token (greedy); above it the logits are divided by it before
    /// sampling (below 1 sharper, above 1 flatter).
    pub temperature: f64,
    /// Keep only the `top_k` most likely tokens; `0` keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probabilities sum to at least `top_p`;
    /// `1` keeps all.
    pub top_p: f64,
}

impl Sampling {
    /// The most likely token at every step.
    pub fn greedy() -> Self {
        Self { temperature: 0.0, top_k: 0, top_p: 1.0 }
    }
}

/// A [`Sampling`] setting out of its range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    /// The temperature is negative or not finite.
    #[error("temperature must be 0 (greedy) or a positive number, got {0}")]
    Temperature(f64),
    /// `top_p` is outside `(0, 1]`.
    #[error("top-p must be in (0, 1], got {0}")]
    TopP(f64),
}

/// Picks tokens from logits as its [`Sampling`] says, drawing from its own seeded generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    sampling: Sampling,
    rng: SplitMix64,
    /// Token indices and probabilities, reused between calls.
    order: Vec<(usize, f64)>,
}

impl Sampler {
    /// A sampler whose draws depend only on `seed` and the logits it is given.
    ///
    /// # Errors
    /// [`SamplingError`] when the temperature or `top_p` is out of range.
    pub fn new(sampling: Sampling, seed: u64) -> Result<Self, SamplingError> {
        if !(sampling.temperature.is_finite() && sampling.temperature >= 0.0) {
            return Err(SamplingError::Temperature(sampling.temperature));
        }
        if !(sampling.top_p > 0.0 && sampling.top_p <= 1.0) {
            return Err(SamplingError::TopP(sampling.top_p));
        }
        Ok(Self { sampling, rng: SplitMix64::new(seed), order: Vec::new() })
    }

    /// The settings.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// The next token's index in `logits` (a NaN logit is never picked unless all are NaN).
    ///
    /// # Panics
    /// When `logits` is empty.
    pub fn sample<T: Float>(&mut self, logits: &[T]) -> usize {
        assert!(!logits.is_empty(), "sampling from no logits");
        let value = |i: usize| logits[i].to_f64().unwrap_or(f64::NAN);
        let s = self.sampling;
        if s.temperature == 0.0 || s.top_k == 1 {
            // The first of equal maxima, as torch's argmax.
            return (0..logits.len())
                .fold(0, |best, i| if value(i) > value(best) || value(best).is_nan() && !value(i).is_nan() { i } else { best });
        }
        self.order.clear();
        self.order.extend((0..logits.len()).filter(|&i| !value(i).is_nan()).map(|i| (i, value(i) / s.temperature)));
        if self.order.is_empty() {
            return 0;
        }
        // Most likely first; ties keep the lower index first, so that a seed repeats exactly.
        self.order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if s.top_k > 0 {
            self.order.truncate(s.top_k);
        }
        let top = self.order[0].1;
        let mut total = 0.0;
        for e in &mut self.order {
            e.1 = (e.1 - top).exp();
            total += e.1;
        }
        if s.top_p < 1.0 {
            // Keep tokens while the mass before them is below p: the most likely always stays.
            let mut before = 0.0;
            let keep = self
                .order
                .iter()
                .take_while(|e| {
                    let under = before < s.top_p * total;
                    before += e.1;
                    under
                })
                .count();
            self.order.truncate(keep.max(1));
            total = self.order.iter().map(|e| e.1).sum();
        }
        let mut u = self.rng.uniform(0.0, total);
        for &(i, p) in &self.order {
            if u < p {
                return i;
            }
            u -= p;
        }
        self.order.last().map_or(0, |e| e.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frequencies(sampling: Sampling, logits: &[f64], draws: usize) -> Vec<f64> {
        let mut s = Sampler::new(sampling, 42).unwrap();
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..draws {
            counts[s.sample(logits)] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    fn softmax(logits: &[f64], t: f64) -> Vec<f64> {
        let e: Vec<f64> = logits.iter().map(|&l| (l / t).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.iter().map(|v| v / sum).collect()
    }

    /// Draws follow softmax(logits / T): 40,000 draws put each token's share within 0.01 of its
    /// probability (about four standard errors).
    #[test]
    fn samples_follow_the_tempered_softmax() {
        let logits = [1.0, 0.2, -0.5, 2.0, 0.0];
        for t in [0.7, 1.0, 1.6] {
            let f = frequencies(Sampling { temperature: t, top_k: 0, top_p: 1.0 }, &logits, 40_000);
            for (got, want) in f.iter().zip(softmax(&logits, t)) {
                assert!((got - want).abs() < 0.01, "T {t}: share {got} for probability {want}");
            }
        }
    }

    /// Top-k and top-p keep exactly the tokens they should, renormalised.
    #[test]
    fn top_k_and_top_p_keep_the_most_likely_tokens() {
        let logits = [1.0, 0.2, -0.5, 2.0, 0.0];
        let p = softmax(&logits, 1.0);
        let f = frequencies(Sampling { temperature: 1.0, top_k: 2, top_p: 1.0 }, &logits, 40_000);
        let kept = p[0] + p[3];
        for (i, got) in f.iter().enumerate() {
            let want = if i == 0 || i == 3 { p[i] / kept } else { 0.0 };
            assert!((got - want).abs() < 0.01, "top-k 2: token {i} share {got}, want {want}");
        }
        // p[3] is about 0.55: top-p 0.5 keeps it alone, 0.6 adds the next most likely (p[0]).
        assert!(frequencies(Sampling { temperature: 1.0, top_k: 0, top_p: 0.5 }, &logits, 1000)[3] == 1.0);
        let f = frequencies(Sampling { temperature: 1.0, top_k: 0, top_p: 0.6 }, &logits, 40_000);
        for (i, got) in f.iter().enumerate() {
            let want = if i == 0 || i == 3 { p[i] / kept } else { 0.0 };
            assert!((got - want).abs() < 0.01, "top-p 0.6: token {i} share {got}, want {want}");
        }
    }

    /// Greedy picks the first maximum and skips NaN; a seed repeats its draws; bad settings are
    /// errors naming the value.
    #[test]
    fn greedy_seeds_and_settings() {
        let mut g = Sampler::new(Sampling::greedy(), 0).unwrap();
        assert_eq!(g.sample(&[f32::NAN, 1.0, 3.0, 3.0]), 2);
        let t = Sampling { temperature: 1.0, top_k: 0, top_p: 0.9 };
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let draws = |seed| {
            let mut s = Sampler::new(t, seed).unwrap();
            (0..64).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draws(3), draws(3));
        assert_ne!(draws(3), draws(4));
        assert_eq!(
            Sampler::new(Sampling { temperature: -1.0, ..t }, 0).unwrap_err().to_string(),
            "temperature must be 0 (greedy) or a positive number, got -1"
        );
        assert_eq!(Sampler::new(Sampling { top_p: 0.0, ..t }, 0).unwrap_err().to_string(), "top-p must be in (0, 1], got 0");
    }
}
