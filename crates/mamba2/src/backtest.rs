//! `mamba2 backtest`: walk-forward (rolling-origin) evaluation. The last rows of the data are cut
//! into folds; each fold's model is trained on rows before the fold only (every one, or a
//! sliding `--window`), with the same settings and checks as `train`, and forecasts from every
//! row of its fold. Nothing a forecast reads or was fitted on lies after its origin.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use burn::tensor::backend::AutodiffBackend;
use clap::Args;
use mamba2::plot::{draw, Chart};
use mamba2_data::folds::walk_forward;
use mamba2_data::trade::TradeTable;
use mamba2_data::{ErrorTable, Scaler, Windows};
use mamba2_forecast::Forecaster;
use mamba2_train::{each_forecast, train_parallel, Prepared, QuantileTables, RunDir, Workers};

use crate::report::Reporter;
use crate::{check_cost_bps, configure, default_out, line, load_model, load_table, workers, TrainArgs};

#[derive(Args, Clone)]
pub struct BacktestArgs {
    #[command(flatten)]
    pub train: TrainArgs,
    /// Folds at the end of the data, each forecast by a model fitted before it.
    #[arg(long, default_value_t = 5)]
    pub folds: usize,
    /// Rows per fold [default: the last fifth of the data split evenly between the folds].
    #[arg(long)]
    pub fold_rows: Option<usize>,
    /// Fit each fold's model on only this many rows before it (a sliding window) [default: every
    /// row before the fold].
    #[arg(long)]
    pub window: Option<usize>,
    /// Do not train: forecast every fold with this checkpoint (written by `mamba2 train`), which
    /// fixes the model, its inputs and its quantiles; flags that would shape or train a model
    /// are refused beside it.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
}

/// The flags `backtest --checkpoint` reads (clap's ids); every other one would shape or train a
/// model, which the checkpoint fixes, and is refused rather than silently ignored.
const WITH_CHECKPOINT: [&str; 10] =
    ["checkpoint", "data", "date_column", "out", "folds", "fold_rows", "cost_bps", "batch_size", "device", "dtype"];

/// What one fold's forecasts add up to, in the reporting units.
struct Tally {
    model: ErrorTable,
    repeat: ErrorTable,
    trades: TradeTable,
}

impl Tally {
    fn new(targets: usize, h: usize, units: &[(f64, f64)], cost_bps: f64) -> Self {
        Tally {
            model: ErrorTable::new(targets, h),
            repeat: ErrorTable::new(targets, h),
            trades: TradeTable::new(h, units.to_vec(), cost_bps),
        }
    }

    fn add(&mut self, t: usize, last: f64, pred: &[f64], truth: &[f64]) {
        self.model.add(t, pred, truth);
        self.repeat.add(t, &vec![last; pred.len()], truth);
        self.trades.add(t, last, pred, truth);
    }
}

/// A forecast in the data's units, for the CSV.
struct Record {
    fold: usize,
    origin: usize,
    target: usize,
    last: f64,
    pred: Vec<f64>,
    truth: Vec<f64>,
}

/// Checks the flags that need no data (`given`: those on the command line, by clap's ids), and
/// returns the output directory.
pub fn check(b: &BacktestArgs, given: &[String]) -> Result<PathBuf> {
    let a = &b.train;
    if let Some(p) = &b.checkpoint {
        if let Some(flag) = given.iter().find(|id| !WITH_CHECKPOINT.contains(&id.as_str())) {
            bail!(
                "backtest --checkpoint {} does not take --{}: the checkpoint fixes the model, its inputs and its quantiles; \
                 drop the flag, or leave out --checkpoint to train a model per fold",
                p.display(),
                flag.replace('_', "-")
            );
        }
    }
    if let Some(id) = &a.id_column {
        bail!("backtest --id-column {id}: backtest reads one wide table for now; train and eval read long-format panels");
    }
    for (given, flag) in [
        (a.split.is_some(), "--split"),
        (a.borders.is_some(), "--borders"),
        (a.seeds.is_some(), "--seeds"),
        (a.resume, "--resume"),
        (a.no_test, "--no-test"),
        (a.world_size > 1, "--world-size"),
    ] {
        if given {
            bail!("backtest does not take {flag}: the folds decide what each model trains, validates and forecasts on");
        }
    }
    check_cost_bps(a.cost_bps)?;
    if b.window == Some(0) {
        bail!("--window 0: a fold's model needs rows to fit on");
    }
    let out = a.out.clone().unwrap_or_else(|| default_out(&a.data, "-backtest"));
    if out.join("backtest.json").exists() || out.join("fold-1").exists() {
        bail!("{} already holds a backtest; choose another --out", out.display());
    }
    Ok(out)
}

/// The backtest on backend `B` (see the module documentation).
pub fn run<B: AutodiffBackend>(b: &BacktestArgs, out: &Path) -> Result<()> {
    let a = &b.train;
    let device: B::Device = Default::default();
    type I<B> = <B as AutodiffBackend>::InnerBackend;
    let fixed = match &b.checkpoint {
        Some(p) => Some(load_model::<I<B>>(p, &device)?),
        None => None,
    };
    let (table, _) = load_table(&a.data, fixed.as_ref().map(|(_, _, spec, _)| spec.features.clone()))?;
    let source = a.data.data.as_ref().map_or(crate::ETTH1_NAME.to_string(), |p| p.display().to_string());
    let (config, tc, clock) = match &fixed {
        Some((_, _, spec, _)) => {
            let (mut c, tc, _) = configure(a, &table, None)?;
            c.spec = spec.clone();
            let clock = crate::clock_of(&table, spec.calendar.as_ref());
            if spec.calendar.is_some() && table.times.is_none() {
                bail!("the model reads calendar cycles from a date column; this data has none that reads as dates");
            }
            (c, tc, clock)
        }
        None => configure(a, &table, None)?,
    };
    let (l, h) = (config.spec.lookback, config.spec.horizon);
    let targets = table.indices(&config.spec.targets)?;
    let n = table.rows.len();
    let fold_rows = b.fold_rows.unwrap_or(n / 5 / b.folds.max(1));
    let folds =
        walk_forward(n, l, h, b.folds, fold_rows, b.window).with_context(|| format!("--folds {} --fold-rows {fold_rows}", b.folds))?;
    // One scale for the figures of every fold: the checkpoint's, or that of the first fold's
    // training rows (which precede every forecast).
    let report_scaler = match &fixed {
        Some((_, s, _, _)) => s.clone(),
        None => Scaler::fit(&table.rows[folds[0].train.0..folds[0].train.1], &table.columns).with_context(|| source.clone())?,
    };
    // A fixed model reads every fold with its own scaler: the rows are scaled once.
    let fixed_rows = match &fixed {
        Some((_, s, _, _)) => Some(s.transform(&table.rows, &table.columns).with_context(|| source.clone())?),
        None => None,
    };
    let units: Vec<(f64, f64)> = targets.iter().map(|&j| (report_scaler.mean[j], report_scaler.std[j])).collect();
    let workers: Workers = workers(a)?;
    println!(
        "backtest of {source}: {} folds of {fold_rows} rows (rows {}..{n}), L {l}, H {h}; {}",
        folds.len(),
        folds[0].test.0,
        match (&b.checkpoint, b.window) {
            (Some(p), _) => format!("every fold forecast by {} (no refit)", p.display()),
            (None, None) => "each fold's model trained on every row before it".into(),
            (None, Some(w)) => format!("each fold's model trained on the {w} rows before it"),
        }
    );
    std::fs::create_dir_all(out).with_context(|| out.display().to_string())?;
    let mut overall = Tally::new(targets.len(), h, &units, a.cost_bps);
    let mut records = Vec::new();
    let mut fold_json = Vec::new();
    let mut overall_q: Option<QuantileTables> = None;
    for fold in &folds {
        let k = fold.index + 1;
        let started = std::time::Instant::now();
        // The fold's model, the scaler it reads with, the rows scaled by it (a fixed model's are
        // scaled once, before the folds), and how it trained.
        let (model, scaler, own_rows, trained, calibration) = match &fixed {
            Some((m, s, _, c)) => (m.clone(), s.clone(), None, serde_json::Value::Null, c.clone()),
            None => {
                let scaler = Scaler::fit(&table.rows[fold.train.0..fold.train.1], &table.columns).with_context(|| source.clone())?;
                let rows = scaler.transform(&table.rows, &table.columns).with_context(|| source.clone())?;
                let data = Prepared {
                    rows,
                    scaler: scaler.clone(),
                    ranges: [fold.train, fold.validation, fold.windows],
                    targets: targets.clone(),
                    clock: clock.clone(),
                };
                let dir = RunDir(out.join(format!("fold-{k}")));
                println!(
                    "fold {k}/{}: training on rows {}..{} (validation from row {})",
                    folds.len(),
                    fold.fit.0,
                    fold.fit.1,
                    fold.train.1
                );
                let mut reporter = Reporter::new(a.json, tc.epochs, l * targets.len());
                let summary = train_parallel::<B>(&config, &tc, &data, &dir, false, &device, &workers, |p| reporter.show(p))?;
                let loaded = mamba2_model::load_checkpoint::<I<B>, Forecaster<_>, mamba2_forecast::ForecasterConfig>(
                    &dir.best(),
                    &device,
                    |c, d| c.init(d),
                )?;
                let blend = summary.blend.clone();
                (
                    loaded.module,
                    scaler,
                    Some(data.rows),
                    serde_json::json!({"epochs": summary.history.len(), "best_epoch": summary.best_epoch, "blend": blend}),
                    summary.calibration,
                )
            }
        };
        let rows = own_rows.as_deref().or(fixed_rows.as_deref()).expect("a fixed model's rows are scaled before the folds");
        let w = Windows::new(rows, fold.windows, l, h, 1)?;
        let mut tally = Tally::new(targets.len(), h, &units, a.cost_bps);
        // Quantile figures of the fold, in the report's scale like the rest.
        let mut fold_q = calibration.as_ref().map(|c| QuantileTables::new(c, h));
        let to_report = |t: usize, v: f64| {
            let j = targets[t];
            (v * scaler.std[j] + scaler.mean[j] - report_scaler.mean[j]) / report_scaler.std[j]
        };
        each_forecast(&model, &w, &clock, w.len(), 32, &device, |i, t, last, p, y| {
            let (last_r, p_r, y_r) = (
                to_report(t, last),
                p.iter().map(|&v| to_report(t, v)).collect::<Vec<_>>(),
                y.iter().map(|&v| to_report(t, v)).collect::<Vec<_>>(),
            );
            tally.add(t, last_r, &p_r, &y_r);
            overall.add(t, last_r, &p_r, &y_r);
            if let (Some(c), Some(fq)) = (calibration.as_ref(), fold_q.as_mut()) {
                fq.add(c, &w, i, (t, targets[t]), (last, p), &y_r, |v| to_report(t, v));
            }
            let j = targets[t];
            let data_units = |v: f64| scaler.inverse(j, v);
            records.push(Record {
                fold: k,
                origin: w.starts[i] + l - 1,
                target: t,
                last: data_units(last),
                pred: p.iter().map(|&v| data_units(v)).collect(),
                truth: y.iter().map(|&v| data_units(v)).collect(),
            });
        })?;
        let (figures, _) = crate::figures::json(&tally.model, &tally.repeat, &tally.trades);
        let pct = |v: &serde_json::Value| v.as_f64().map_or("-".to_string(), |x| format!("{:+.1} %", 100.0 * x));
        let hit = figures["hit_rate"].as_f64().map_or("-".to_string(), |x| format!("{:.1} %", 100.0 * x));
        let ic = figures["ic"].as_f64().map_or("-".to_string(), |x| format!("{x:.3}"));
        println!(
            "fold {k}/{}: rows {}..{}, {} forecasts: MSE {:.4} (Repeat {:.4}, skill {}), IC {ic}, hit rate {hit}, strategy {:+.4}{}  [{:.0} s]",
            folds.len(),
            fold.test.0,
            fold.test.1,
            w.len(),
            figures["mse"].as_f64().unwrap_or(f64::NAN),
            figures["repeat_mse"].as_f64().unwrap_or(f64::NAN),
            pct(&figures["skill"]),
            figures["strategy_return"].as_f64().unwrap_or(0.0),
            match trained["blend"]["alpha"].as_f64() {
                Some(0.0) => ", kept Repeat (no skill on validation)".to_string(),
                Some(a) if a < 1.0 => format!(", kept {a:.2} of the model"),
                _ => String::new(),
            },
            started.elapsed().as_secs_f64()
        );
        if let Some(q) = &fold_q {
            match overall_q.as_mut() {
                Some(o) => o.merge(q),
                None => overall_q = Some(q.clone()),
            }
        }
        let quantile_figures = fold_q.as_ref().map(|q| {
            let (m, r) = (q.model.total(), q.repeat.total());
            if let (Some(a), Some(b)) = (m.intervals.first(), r.intervals.first()) {
                println!(
                    "fold {k}/{}: {:.0} % interval covers {:.1} % (conformal Repeat {:.1} %), pinball loss {:.4} (conformal Repeat {:.4})",
                    folds.len(),
                    100.0 * a.0,
                    100.0 * a.1,
                    100.0 * b.1,
                    m.pinball,
                    r.pinball
                );
            }
            crate::figures::quantile_json(q).0
        });
        fold_json.push(serde_json::json!({
            "fold": k,
            "quantiles": quantile_figures,
            "fit_rows": [fold.fit.0, fold.fit.1],
            "train_rows": [fold.train.0, fold.train.1],
            "rows": [fold.test.0, fold.test.1],
            "forecasts": w.len(),
            "trained": trained,
            "figures": figures,
        }));
    }
    println!(
        "every fold together ({} forecasts), scaled by {}:",
        records.len() / targets.len().max(1),
        if fixed.is_some() { "the checkpoint's scaler" } else { "the first fold's training rows" }
    );
    crate::figures::print(&overall.model, &overall.repeat, &overall.trades, "in the data's units, summed over the targets");
    if let Some(q) = &overall_q {
        println!("quantiles of every fold together beside conformal Repeat:");
        crate::figures::print_quantiles(q);
    }
    write_csv(&out.join("backtest.csv"), &records, &config.spec.targets)?;
    let (o, per_step) = crate::figures::json(&overall.model, &overall.repeat, &overall.trades);
    let json = serde_json::json!({
        "data": source,
        "rows": n,
        "lookback": l,
        "horizon": h,
        "folds": fold_json,
        "fold_rows": fold_rows,
        "window": b.window,
        "refit": fixed.is_none(),
        "cost_bps": a.cost_bps,
        "overall": o,
        "overall_per_step": per_step,
        "overall_quantiles": overall_q.as_ref().map(|q| crate::figures::quantile_json(q).0),
        "overall_quantiles_per_step": overall_q.as_ref().map(|q| crate::figures::quantile_json(q).1),
    });
    mamba2_model::write_atomically(&out.join("backtest.json"), serde_json::to_string_pretty(&json)?.as_bytes())?;
    charts(out, &records, &folds.iter().map(|f| f.test.0).collect::<Vec<_>>(), &units, a.cost_bps)?;
    println!(
        "wrote {}: backtest.csv (every forecast), backtest.json, backtest_skill.png, backtest_return.png{}",
        out.display(),
        if fixed.is_none() { ", fold-N/ (each fold's run)" } else { "" }
    );
    Ok(())
}

/// `backtest.csv`: one line per forecast value, in the data's units.
fn write_csv(path: &Path, records: &[Record], names: &[String]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["fold", "origin_row", "target", "step", "last", "forecast", "actual"])?;
    for r in records {
        for (k, (p, y)) in r.pred.iter().zip(&r.truth).enumerate() {
            w.write_record([
                r.fold.to_string(),
                r.origin.to_string(),
                names[r.target].clone(),
                (k + 1).to_string(),
                r.last.to_string(),
                p.to_string(),
                y.to_string(),
            ])?;
        }
    }
    let bytes = w.into_inner().map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    mamba2_model::write_atomically(path, &bytes)?;
    Ok(())
}

/// `backtest_skill.png` (cumulative skill over Repeat as the origins advance) and
/// `backtest_return.png` (the cumulative return of trading the sign of each one-step forecast),
/// fold starts marked.
fn charts(out: &Path, records: &[Record], starts: &[usize], units: &[(f64, f64)], cost_bps: f64) -> Result<()> {
    // Per origin, in time order: squared errors (scaled by the reporting std) of the model and of
    // Repeat over targets and steps, and the one-step strategy's return in data units.
    let mut by_origin: std::collections::BTreeMap<usize, (f64, f64, f64)> = Default::default();
    for r in records {
        let sd = units[r.target].1;
        let e = by_origin.entry(r.origin).or_default();
        for (p, y) in r.pred.iter().zip(&r.truth) {
            e.0 += ((p - y) / sd).powi(2);
            e.1 += ((r.last - y) / sd).powi(2);
        }
        let f = r.pred[0] - r.last;
        if f != 0.0 {
            e.2 += f.signum() * (r.truth[0] - r.last) - cost_bps * 1e-4 * r.last.abs();
        }
    }
    let (mut sm, mut sr, mut ret) = (0.0, 0.0, 0.0);
    let (mut skill, mut money) = (Vec::new(), Vec::new());
    for (&origin, &(m, r, s)) in &by_origin {
        sm += m;
        sr += r;
        ret += s;
        if sr > 0.0 {
            skill.push((origin as f64, 100.0 * (1.0 - sm / sr)));
        }
        money.push((origin as f64, ret));
    }
    let marks: Vec<(f64, String)> = starts.iter().enumerate().map(|(k, &s)| (s as f64, format!("fold {}", k + 1))).collect();
    draw(
        &out.join("backtest_skill.png"),
        &Chart {
            title: "Cumulative skill over Repeat, out of sample",
            x_label: "forecast origin (data row)",
            y_label: "skill, % of Repeat's squared error removed",
            lines: vec![
                line("mamba2 against Repeat", skill, [214, 39, 40], false),
                line(
                    "Repeat",
                    vec![(starts[0] as f64 - 1.0, 0.0), (by_origin.keys().last().copied().unwrap_or(0) as f64, 0.0)],
                    [127, 127, 127],
                    true,
                ),
            ],
            marks: marks.clone(),
            integer_x: true,
            bands: Vec::new(),
        },
        720,
        420,
    )?;
    draw(
        &out.join("backtest_return.png"),
        &Chart {
            title: "Trading the sign of each one-step forecast, out of sample",
            x_label: "forecast origin (data row)",
            y_label: "cumulative return (data units, all targets)",
            lines: vec![line("sign of the one-step forecast", money, [31, 119, 180], false)],
            marks,
            integer_x: true,
            bands: Vec::new(),
        },
        720,
        420,
    )?;
    Ok(())
}
