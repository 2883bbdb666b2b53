//! The figures a trader reads from forecasts: skill over Repeat, the information coefficient of
//! forecast returns against realised returns (Pearson and rank), the hit rate of their sign, and
//! what trading that sign would have made after costs; and a test of whether a forecast's edge
//! over Repeat is more than noise.
//!
//! A forecast return is the forecast minus the last value the forecaster saw; the realised
//! return is the actual value minus that same last value. Step `k` of a forecast made after row
//! `t` is the `k`-step return from `t` to `t + k`.

/// `1 - MSE / MSE_Repeat`: the share of Repeat's squared error that a forecast removes (0 for
/// Repeat itself, negative for a forecast worse than it). NaN when Repeat is exact.
pub fn skill(mse: f64, repeat_mse: f64) -> f64 {
    if repeat_mse > 0.0 {
        1.0 - mse / repeat_mse
    } else {
        f64::NAN
    }
}

/// Pearson correlation of two equally long samples; NaN when either is constant or empty.
pub fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len().min(y.len());
    if n < 2 {
        return f64::NAN;
    }
    let (mx, my) = (x[..n].iter().sum::<f64>() / n as f64, y[..n].iter().sum::<f64>() / n as f64);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    if sxx > 0.0 && syy > 0.0 {
        sxy / (sxx * syy).sqrt()
    } else {
        f64::NAN
    }
}

/// Ranks from 1, ties given the mean of the ranks they span (so that Spearman's correlation is
/// the Pearson correlation of these).
pub fn ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut r = vec![0.0; x.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && x[order[j + 1]] == x[order[i]] {
            j += 1;
        }
        let mean_rank = (i + j) as f64 / 2.0 + 1.0;
        for &o in &order[i..=j] {
            r[o] = mean_rank;
        }
        i = j + 1;
    }
    r
}

/// Spearman's rank correlation; NaN when either sample is constant.
pub fn rank_correlation(x: &[f64], y: &[f64]) -> f64 {
    pearson(&ranks(x), &ranks(y))
}

/// The trader's figures of one set of forecasts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TradeFigures {
    /// Pearson correlation of forecast returns with realised returns (NaN when the forecast
    /// returns are constant, as Repeat's are).
    pub ic: f64,
    /// Spearman's rank correlation of the same.
    pub rank_ic: f64,
    /// Of the forecasts that take a position (a non-zero forecast return), the share whose sign
    /// the realised return has (a zero realised return counts as a miss). NaN without positions.
    pub hit_rate: f64,
    /// Positions taken.
    pub trades: usize,
    /// Sum over forecasts of `sign(forecast return) * realised return`, minus the cost of every
    /// position (`cost_bps / 10,000` of the last value's magnitude), in the data's units.
    pub strategy_return: f64,
}

/// Forecast and realised returns per target and forecast step, gathered to compute
/// [`TradeFigures`] per step and overall.
#[derive(Debug, Clone)]
pub struct TradeTable {
    /// Targets.
    pub targets: usize,
    /// Forecast steps.
    pub horizon: usize,
    /// Cost of taking a position, in basis points of the last value.
    pub cost_bps: f64,
    /// `(mean, std)` per target: data units = scaled * std + mean.
    units: Vec<(f64, f64)>,
    /// Per step `k`: forecast returns and realised returns in scaled units (targets pooled).
    forecast: Vec<Vec<f64>>,
    realised: Vec<Vec<f64>>,
    /// Per step: the strategy's return and its positions.
    returns: Vec<f64>,
    positions: Vec<usize>,
    hits: Vec<usize>,
}

impl TradeTable {
    /// An empty table; `units` gives each target's `(mean, std)` for the strategy's return in the
    /// data's units (`(0.0, 1.0)` keeps scaled units).
    pub fn new(horizon: usize, units: Vec<(f64, f64)>, cost_bps: f64) -> Self {
        TradeTable {
            targets: units.len(),
            horizon,
            cost_bps,
            units,
            forecast: vec![Vec::new(); horizon],
            realised: vec![Vec::new(); horizon],
            returns: vec![0.0; horizon],
            positions: vec![0; horizon],
            hits: vec![0; horizon],
        }
    }

    /// Adds one forecast of target `t` made after a row whose value was `last` (scaled units):
    /// its `horizon` steps and the values that followed.
    pub fn add(&mut self, t: usize, last: f64, pred: &[f64], truth: &[f64]) {
        let (mean, std) = self.units[t];
        for (k, (p, y)) in pred.iter().zip(truth).enumerate() {
            let (f, r) = (p - last, y - last);
            self.forecast[k].push(f);
            self.realised[k].push(r);
            if f != 0.0 {
                self.positions[k] += 1;
                self.hits[k] += usize::from(f.signum() == r.signum() && r != 0.0);
                self.returns[k] += f.signum() * r * std - self.cost_bps * 1e-4 * (last * std + mean).abs();
            }
        }
    }

    /// The figures of forecast step `k + 1`.
    pub fn step(&self, k: usize) -> TradeFigures {
        TradeFigures {
            ic: pearson(&self.forecast[k], &self.realised[k]),
            rank_ic: rank_correlation(&self.forecast[k], &self.realised[k]),
            hit_rate: if self.positions[k] > 0 { self.hits[k] as f64 / self.positions[k] as f64 } else { f64::NAN },
            trades: self.positions[k],
            strategy_return: self.returns[k],
        }
    }

    /// Every step together: the correlations are the mean of the steps' (returns grow with the
    /// step, so pooling would let the last steps decide), the hit rate is pooled over every
    /// position, and the strategy's return is the mean of the steps' (a book that splits itself
    /// evenly between the H strategies).
    pub fn overall(&self) -> TradeFigures {
        let steps: Vec<TradeFigures> = (0..self.horizon).map(|k| self.step(k)).collect();
        let mean = |f: fn(&TradeFigures) -> f64| steps.iter().map(f).sum::<f64>() / steps.len().max(1) as f64;
        let (positions, hits) = (self.positions.iter().sum::<usize>(), self.hits.iter().sum::<usize>());
        TradeFigures {
            ic: mean(|s| s.ic),
            rank_ic: mean(|s| s.rank_ic),
            hit_rate: if positions > 0 { hits as f64 / positions as f64 } else { f64::NAN },
            trades: positions,
            strategy_return: mean(|s| s.strategy_return),
        }
    }
}

/// The Diebold-Mariano statistic of a loss differential series `d` (a forecast's loss minus
/// another's, one value per forecast origin, in time order): the mean of `d` over its
/// Newey-West standard error with `lag` autocovariances (Bartlett weights). Below -1.645 the
/// first forecast is better at the 5 % level (one-sided). Forecasts of `H` steps from origins
/// one row apart share `H - 1` values, so `lag` should be at least `H - 1`. NaN when `d` is
/// constant or shorter than 2.
pub fn diebold_mariano(d: &[f64], lag: usize) -> f64 {
    let n = d.len();
    if n < 2 {
        return f64::NAN;
    }
    let mean = d.iter().sum::<f64>() / n as f64;
    let autocov = |j: usize| (j..n).map(|i| (d[i] - mean) * (d[i - j] - mean)).sum::<f64>() / n as f64;
    let mut var = autocov(0);
    for j in 1..=lag.min(n - 1) {
        var += 2.0 * (1.0 - j as f64 / (lag as f64 + 1.0)) * autocov(j);
    }
    if var > 0.0 {
        mean / (var / n as f64).sqrt()
    } else {
        f64::NAN
    }
}

/// Harvey, Leybourne and Newbold's (1997) small-sample correction of a Diebold-Mariano
/// statistic of `n` forecasts of `h` steps: the factor `sqrt((n + 1 - 2h + h (h - 1) / n) / n)`,
/// after which the statistic is compared with Student's t of `n - 1` degrees of freedom. With few
/// origins per step of overlap the factor is small, since such origins hold little independent
/// evidence; NaN where it is not defined.
pub fn hln_corrected(dm: f64, n: usize, h: usize) -> f64 {
    let (n, h) = (n as f64, h as f64);
    let q = (n + 1.0 - 2.0 * h + h * (h - 1.0) / n) / n;
    if q > 0.0 && n >= 2.0 {
        dm * q.sqrt()
    } else {
        f64::NAN
    }
}

/// The lower one-sided critical value of Student's t with `df` degrees of freedom at the level
/// whose normal critical value is `-z` (1.645 for 5 %, 2.326 for 1 %): the Cornish-Fisher
/// expansion to `1 / df^2`, within 0.5 % of the exact value from 5 degrees on.
pub fn t_critical(z: f64, df: usize) -> f64 {
    let v = df.max(1) as f64;
    -(z + (z.powi(3) + z) / (4.0 * v) + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * v * v))
}

/// The Newey-West lag for loss differentials of `n` forecasts of `horizon` steps from origins one
/// row apart: the `horizon - 1` rows they overlap, plus the usual `4 (n / 100)^(2/9)` for the
/// persistence of the errors themselves.
pub fn newey_west_lag(n: usize, horizon: usize) -> usize {
    horizon.saturating_sub(1) + (4.0 * (n as f64 / 100.0).powf(2.0 / 9.0)).floor() as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures of a hand-made example, each worked out in the comments (the arithmetic is
    /// independent of the code above).
    #[test]
    fn trade_figures_equal_a_hand_computation() {
        // One target in its own units (mean 0, std 1), one step, last value 10 every time.
        // forecasts 11, 9, 12, 10, 8  -> forecast returns f =  1, -1,  2, 0, -2
        // actuals   12, 10, 11, 7, 9  -> realised returns r =  2,  0,  1, -3, -1
        let mut t = TradeTable::new(1, vec![(0.0, 1.0)], 5.0);
        for (p, y) in [(11.0, 12.0), (9.0, 10.0), (12.0, 11.0), (10.0, 7.0), (8.0, 9.0)] {
            t.add(0, 10.0, &[p], &[y]);
        }
        let s = t.step(0);
        // mean f = 0, mean r = -0.2; sum f (r + 0.2) = 2.2 - 0.2 + 2.4 + 0 + 1.6 = 6.0
        // sum f^2 = 10; sum (r + 0.2)^2 = 4.84 + 0.04 + 1.44 + 7.84 + 0.64 = 14.8
        let ic = 6.0 / (10.0f64 * 14.8).sqrt();
        assert!((s.ic - ic).abs() < 1e-12, "{} vs {ic}", s.ic);
        // ranks of f: -2 -> 1, -1 -> 2, 0 -> 3, 1 -> 4, 2 -> 5: (4, 2, 5, 3, 1)
        // ranks of r: -3 -> 1, -1 -> 2, 0 -> 3, 1 -> 4, 2 -> 5: (5, 3, 4, 1, 2)
        // d = (-1, -1, 1, 2, -1), sum d^2 = 8, rho = 1 - 6 * 8 / (5 * 24) = 0.6
        assert!((s.rank_ic - 0.6).abs() < 1e-12, "{}", s.rank_ic);
        // positions: f != 0 in 4 cases; hits: (1, 2) yes, (-1, 0) no, (2, 1) yes, (-2, -1) yes
        assert_eq!(s.trades, 4);
        assert!((s.hit_rate - 0.75).abs() < 1e-15);
        // strategy: +2 + 0 + 1 + 1 = 4, minus 4 positions * 5 bp * |10| = 4 * 0.005 = 0.02
        assert!((s.strategy_return - 3.98).abs() < 1e-12, "{}", s.strategy_return);
        assert!((skill(0.5, 2.0) - 0.75).abs() < 1e-15);
        assert!(skill(1.0, 0.0).is_nan());
    }

    #[test]
    fn ties_share_their_mean_rank_and_units_scale_the_return() {
        assert_eq!(ranks(&[3.0, 1.0, 3.0, 2.0]), vec![3.5, 1.0, 3.5, 2.0]);
        // Scaled units: last 0.5, forecast 1.0, actual 0.0 with mean 100, std 10: the position
        // is long, the realised move is -0.5 * 10 = -5 data units, and one trade at 10 bp of
        // |0.5 * 10 + 100| = 105 costs 0.105.
        let mut t = TradeTable::new(1, vec![(100.0, 10.0)], 10.0);
        t.add(0, 0.5, &[1.0], &[0.0]);
        assert!((t.step(0).strategy_return - (-5.0 - 0.105)).abs() < 1e-12);
        // Repeat takes no position: no hit rate, no return, no correlation.
        let mut r = TradeTable::new(2, vec![(0.0, 1.0)], 0.0);
        r.add(0, 1.0, &[1.0, 1.0], &[2.0, 0.0]);
        r.add(0, 1.0, &[1.0, 1.0], &[3.0, 1.5]);
        let o = r.overall();
        assert!(o.ic.is_nan() && o.hit_rate.is_nan() && o.trades == 0 && o.strategy_return == 0.0);
    }

    #[test]
    fn overall_figures_average_the_steps() {
        let mut t = TradeTable::new(2, vec![(0.0, 1.0)], 0.0);
        // Step 1 perfectly right, step 2 perfectly wrong.
        for (a, b) in [(1.0, 2.0), (-1.0, -3.0), (2.0, 1.0)] {
            t.add(0, 0.0, &[a, b], &[a, -b]);
        }
        assert!((t.step(0).ic - 1.0).abs() < 1e-12 && (t.step(1).ic + 1.0).abs() < 1e-12);
        let o = t.overall();
        assert!(o.ic.abs() < 1e-12);
        assert!((o.hit_rate - 0.5).abs() < 1e-15);
        // Step 1 makes |1| + |-1| + |2| = 4, step 2 loses 2 + 3 + 1 = 6: mean -1.
        assert!((o.strategy_return + 1.0).abs() < 1e-12);
    }

    #[test]
    fn diebold_mariano_sees_a_real_edge_and_not_noise() {
        // Without autocorrelation the statistic is the t statistic of the mean.
        let d = [-1.0, -2.0, -1.5, -0.5, -1.0, -2.0];
        let n = d.len() as f64;
        let mean = d.iter().sum::<f64>() / n;
        let var = d.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        assert!((diebold_mariano(&d, 0) - mean / (var / n).sqrt()).abs() < 1e-12);
        // An alternating series: its negative lag-1 autocovariance shrinks the variance.
        let alt: Vec<f64> = (0..100).map(|i| if i % 2 == 0 { 1.0 } else { -0.9 }).collect();
        assert!(diebold_mariano(&alt, 1).abs() > diebold_mariano(&alt, 0).abs());
        // A long positive run of the same sign is far past the threshold; zero mean is not.
        let edge: Vec<f64> = (0..500).map(|i| -0.1 + 0.05 * ((i * 7919) % 13) as f64 / 13.0).collect();
        assert!(diebold_mariano(&edge, newey_west_lag(500, 4)) < -1.645);
        let none: Vec<f64> = (0..500).map(|i| if (i * 7919) % 13 < 6 { 1.0 } else { -6.0 / 7.0 }).collect();
        assert!(diebold_mariano(&none, newey_west_lag(500, 4)).abs() < 1.645);
        assert_eq!(newey_west_lag(100, 1), 4);
        // Student's t: 1.812 (5 %) and 2.764 (1 %) at 10 degrees, 1.684 and 2.423 at 40 (tables).
        for (z, df, t) in [(1.645, 10, 1.812), (2.326, 10, 2.764), (1.645, 40, 1.684), (2.326, 40, 2.423)] {
            assert!((t_critical(z, df) + t).abs() < 0.01 * t, "z {z}, {df} degrees: {} vs {t}", t_critical(z, df));
        }
        // One step: the factor is sqrt((n - 1) / n); as many origins as steps: little is left.
        assert!((hln_corrected(-2.0, 100, 1) + 2.0 * (0.99f64).sqrt()).abs() < 1e-12);
        assert!(hln_corrected(-10.0, 60, 48) > -2.5 && hln_corrected(-10.0, 48, 48).is_nan());
        assert_eq!(newey_west_lag(100, 96), 99);
    }
}
