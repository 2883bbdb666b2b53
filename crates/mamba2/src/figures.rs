//! The trader's figures of a set of forecasts beside Repeat, and the quantile figures beside
//! conformal Repeat, printed and as JSON, for `train`'s report and `summary.json`, `eval` and
//! `backtest`.

use mamba2_data::quantile::IntervalFigures;
use mamba2_data::trade::{skill, TradeFigures, TradeTable};
use mamba2_data::ErrorTable;
use mamba2_train::QuantileTables;
use serde_json::{json, Value};

/// One row of figures: errors, skill over Repeat, and the trading figures.
fn row(errors: (f64, f64), repeat: (f64, f64), t: &TradeFigures) -> Value {
    json!({
        "mse": errors.0,
        "mae": errors.1,
        "repeat_mse": repeat.0,
        "repeat_mae": repeat.1,
        "skill": skill(errors.0, repeat.0),
        "ic": t.ic,
        "rank_ic": t.rank_ic,
        "hit_rate": t.hit_rate,
        "trades": t.trades,
        "strategy_return": t.strategy_return,
    })
}

/// `(overall, per step)` as JSON; NaN (a correlation of Repeat's constant forecast returns, a
/// hit rate without positions) is written as null.
pub fn json(errors: &ErrorTable, repeat: &ErrorTable, trades: &TradeTable) -> (Value, Value) {
    let overall = row(errors.total().mse_mae(), repeat.total().mse_mae(), &trades.overall());
    let steps: Vec<Value> = (0..errors.horizon)
        .map(|k| {
            let mut r = row(errors.step(k).mse_mae(), repeat.step(k).mse_mae(), &trades.step(k));
            r["step"] = (k + 1).into();
            r
        })
        .collect();
    (overall, Value::Array(steps))
}

fn cell(v: f64, digits: usize, scale: f64, suffix: &str) -> String {
    if v.is_finite() {
        format!("{:.*}{suffix}", digits, v * scale)
    } else {
        "-".into()
    }
}

/// The figures overall and at a few steps (the first, the last, and two between, at thirds so
/// that they do not all fall on the same phase of a daily cycle), as a table.
pub fn print(errors: &ErrorTable, repeat: &ErrorTable, trades: &TradeTable, data_units: &str) {
    let h = errors.horizon;
    let mut steps = vec![0, h / 3, 2 * h / 3, h - 1];
    steps.dedup();
    steps.retain(|&k| k < h);
    println!(
        "  {:<8} {:>9} {:>9} {:>8} {:>7} {:>8} {:>8} {:>14}",
        "step", "MSE", "Repeat", "skill", "IC", "rank IC", "hit rate", "strategy"
    );
    let line = |name: String, e: (f64, f64), r: (f64, f64), t: TradeFigures| {
        println!(
            "  {:<8} {:>9.4} {:>9.4} {:>8} {:>7} {:>8} {:>8} {:>14}",
            name,
            e.0,
            r.0,
            cell(skill(e.0, r.0), 1, 100.0, " %"),
            cell(t.ic, 3, 1.0, ""),
            cell(t.rank_ic, 3, 1.0, ""),
            cell(t.hit_rate, 1, 100.0, " %"),
            format!("{:+.4}", t.strategy_return)
        )
    };
    for &k in &steps {
        line(format!("{}", k + 1), errors.step(k).mse_mae(), repeat.step(k).mse_mae(), trades.step(k));
    }
    if h > 1 {
        line("all".into(), errors.total().mse_mae(), repeat.total().mse_mae(), trades.overall());
    }
    println!(
        "  (MSE in scaled units; skill = 1 - MSE / Repeat's; IC: correlation of forecast and realised returns from the last \
         value; hit rate: share of positions whose sign was right; strategy: sum of sign x realised return{}, {data_units}{})",
        if trades.cost_bps > 0.0 { format!(" - {} bp of the last value per position", trades.cost_bps) } else { String::new() },
        if h > 1 { "; `all` averages the steps' IC and strategy; every step is in the JSON file" } else { "" }
    );
}

/// One row of quantile figures as JSON: per central interval its nominal and observed coverage
/// and mean width, the share below each level, the mean pinball loss.
fn quantile_row(f: &IntervalFigures, levels: &[f64]) -> Value {
    let intervals: Vec<Value> =
        f.intervals.iter().map(|&(nominal, coverage, width)| json!({"nominal": nominal, "coverage": coverage, "width": width})).collect();
    let below: Vec<Value> = levels.iter().zip(&f.below).map(|(&q, &b)| json!({"level": q, "observed": b})).collect();
    json!({"pinball": f.pinball, "intervals": intervals, "below": below})
}

/// The quantile figures of the model and of conformal Repeat, `(overall, per step)`, as JSON.
pub fn quantile_json(q: &QuantileTables) -> (Value, Value) {
    let (m, r) = (&q.model, &q.repeat);
    let both = |a: IntervalFigures, b: IntervalFigures| json!({"model": quantile_row(&a, &m.levels), "conformal_repeat": quantile_row(&b, &r.levels)});
    let steps: Vec<Value> = (0..m.horizon)
        .map(|k| {
            let mut v = both(m.step(k), r.step(k));
            v["step"] = (k + 1).into();
            v
        })
        .collect();
    let mut overall = both(m.total(), r.total());
    overall["levels"] = json!(m.levels);
    (overall, Value::Array(steps))
}

/// The quantile figures at the same steps as [`print`]'s table: the widest central interval's
/// coverage and width, and the pinball loss, for the model and conformal Repeat.
pub fn print_quantiles(q: &QuantileTables) {
    let (m, r) = (&q.model, &q.repeat);
    let h = m.horizon;
    let mut steps = vec![0, h / 3, 2 * h / 3, h - 1];
    steps.dedup();
    steps.retain(|&k| k < h);
    let nominal = m.total().intervals.first().map(|i| i.0);
    let head = nominal.map_or("-".to_string(), |n| format!("{:.0} % interval", 100.0 * n));
    println!("  {:<8} {:>22} {:>22} {:>22}", "step", format!("{head}: covers"), "width", "pinball loss");
    println!("  {:<8} {:>11}{:>11} {:>11}{:>11} {:>11}{:>11}", "", "mamba2", "c. Repeat", "mamba2", "c. Repeat", "mamba2", "c. Repeat");
    let line = |name: String, a: IntervalFigures, b: IntervalFigures| {
        let cov = |f: &IntervalFigures| f.intervals.first().map_or("-".to_string(), |i| format!("{:.1} %", 100.0 * i.1));
        let wid = |f: &IntervalFigures| f.intervals.first().map_or("-".to_string(), |i| format!("{:.4}", i.2));
        println!("  {:<8} {:>11}{:>11} {:>11}{:>11} {:>11.4}{:>11.4}", name, cov(&a), cov(&b), wid(&a), wid(&b), a.pinball, b.pinball);
    };
    for &k in &steps {
        line(format!("{}", k + 1), m.step(k), r.step(k));
    }
    if h > 1 {
        line("all".into(), m.total(), r.total());
    }
    let levels: Vec<String> = m.levels.iter().map(|q| format!("{q}")).collect();
    println!(
        "  (quantiles at {}; covers: share of actual values inside the interval; width and pinball loss (mean over the \
         levels) in scaled units; c. Repeat: the last value with its validation errors' quantiles per step)",
        levels.join(", ")
    );
}

/// Mean and sample standard deviation (NaN for one value).
pub fn mean_std(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let sd = (v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() as f64 - 1.0)).sqrt();
    (m, sd)
}

/// The quantile figures of several seeds' runs: those of the widest central interval and the
/// pinball loss, for the model and conformal Repeat.
pub struct SeedsQuantiles {
    /// The interval's nominal coverage.
    nominal: f64,
    /// Its coverage pooled over targets and steps: mean and sample std over the seeds.
    coverage: (f64, f64),
    /// The lowest and highest coverage at one step, the seeds' coverage at each step averaged.
    coverage_per_step: (f64, f64),
    width: (f64, f64),
    pinball: (f64, f64),
    repeat_coverage: f64,
    repeat_width: f64,
    repeat_pinball: f64,
}

/// [`SeedsQuantiles`] of the seeds' test tables; `None` without a central interval or for
/// tables of other levels or horizons.
pub fn seeds_quantiles(tables: &[&QuantileTables]) -> Option<SeedsQuantiles> {
    let first = tables.first()?;
    let (levels, h) = (&first.model.levels, first.model.horizon);
    if tables.iter().any(|t| &t.model.levels != levels || t.model.horizon != h) {
        return None;
    }
    let nominal = first.model.total().intervals.first()?.0;
    let of = |f: &dyn Fn(&QuantileTables) -> f64| mean_std(&tables.iter().map(|t| f(t)).collect::<Vec<_>>());
    let cov = |f: IntervalFigures| f.intervals[0].1;
    let per_step: Vec<f64> = (0..h).map(|k| of(&|t| cov(t.model.step(k))).0).collect();
    Some(SeedsQuantiles {
        nominal,
        coverage: of(&|t| cov(t.model.total())),
        coverage_per_step: (
            per_step.iter().copied().fold(f64::INFINITY, f64::min),
            per_step.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        ),
        width: of(&|t| t.model.total().intervals[0].2),
        pinball: of(&|t| t.model.total().pinball),
        repeat_coverage: of(&|t| cov(t.repeat.total())).0,
        repeat_width: of(&|t| t.repeat.total().intervals[0].2).0,
        repeat_pinball: of(&|t| t.repeat.total().pinball).0,
    })
}

impl SeedsQuantiles {
    /// The figures in one line.
    pub fn line(&self) -> String {
        format!(
            "{:.0} % interval over the seeds: covers {:.1} +- {:.1} % ({:.1}-{:.1} % by step), width {:.4} +- {:.4}, pinball {:.4} +- {:.4}; \
             conformal Repeat covers {:.1} %, width {:.4}, pinball {:.4}",
            100.0 * self.nominal,
            100.0 * self.coverage.0,
            100.0 * self.coverage.1,
            100.0 * self.coverage_per_step.0,
            100.0 * self.coverage_per_step.1,
            self.width.0,
            self.width.1,
            self.pinball.0,
            self.pinball.1,
            100.0 * self.repeat_coverage,
            self.repeat_width,
            self.repeat_pinball
        )
    }

    /// As JSON, for `seeds.json`.
    pub fn json(&self) -> Value {
        json!({
            "nominal": self.nominal,
            "coverage_mean": self.coverage.0, "coverage_std": self.coverage.1,
            "coverage_step_min": self.coverage_per_step.0, "coverage_step_max": self.coverage_per_step.1,
            "width_mean": self.width.0, "width_std": self.width.1,
            "pinball_mean": self.pinball.0, "pinball_std": self.pinball.1,
            "repeat_coverage_mean": self.repeat_coverage, "repeat_width_mean": self.repeat_width, "repeat_pinball_mean": self.repeat_pinball,
        })
    }
}
