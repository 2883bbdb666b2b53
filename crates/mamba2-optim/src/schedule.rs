use serde::{Deserialize, Serialize};

/// A learning rate as a pure function of the step, so that a resumed run needs nothing but the
/// step number to continue on the same curve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum LrSchedule {
    /// The same rate at every step.
    Constant {
        /// The rate.
        lr: f64,
    },
    /// Linear warmup from 0 to `peak` over `warmup` steps, then cosine decay to `floor` at
    /// `total` steps, and `floor` after that.
    WarmupCosine {
        /// The rate reached at the end of warmup.
        peak: f64,
        /// The rate at and after `total`.
        floor: f64,
        /// Warmup steps.
        warmup: usize,
        /// Steps until the floor.
        total: usize,
    },
}

impl LrSchedule {
    /// The rate for step `step` (0-based: the first optimizer step is step 0).
    pub fn lr_at(&self, step: usize) -> f64 {
        match *self {
            LrSchedule::Constant { lr } => lr,
            LrSchedule::WarmupCosine { peak, floor, warmup, total } => {
                if step < warmup {
                    peak * (step + 1) as f64 / warmup as f64
                } else if step >= total || total <= warmup {
                    floor
                } else {
                    let progress = (step - warmup) as f64 / (total - warmup) as f64;
                    floor + 0.5 * (peak - floor) * (1.0 + (std::f64::consts::PI * progress).cos())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine_to_the_floor() {
        let s = LrSchedule::WarmupCosine { peak: 1e-3, floor: 1e-5, warmup: 10, total: 110 };
        assert!((s.lr_at(0) - 1e-4).abs() < 1e-18);
        assert!((s.lr_at(9) - 1e-3).abs() < 1e-18);
        assert!((s.lr_at(10) - 1e-3).abs() < 1e-18, "cosine starts at the peak");
        assert!((s.lr_at(60) - (1e-5 + 0.5 * (1e-3 - 1e-5))).abs() < 1e-15, "half way is the mid point");
        assert_eq!(s.lr_at(110), 1e-5);
        assert_eq!(s.lr_at(10_000), 1e-5);
        let mut prev = f64::INFINITY;
        for step in 10..110 {
            let lr = s.lr_at(step);
            assert!(lr <= prev, "monotone decay after warmup");
            prev = lr;
        }
        assert_eq!(LrSchedule::Constant { lr: 0.5 }.lr_at(77), 0.5);
    }
}
