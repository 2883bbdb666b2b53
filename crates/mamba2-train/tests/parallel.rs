//! Data-parallel training equals one worker: W = 2, 3 and 6 workers in one process with the
//! same global batch end with the same parameters as one worker after 20 optimizer steps (two
//! epochs, clipping, warm-up and cosine schedule included), and with the same loss curve.

use burn::backend::{Autodiff, Flex, NdArray};
use burn::module::Module;
use burn::tensor::backend::AutodiffBackend;
use mamba2_forecast::data::calendar::Calendar;
use mamba2_forecast::data::{ColumnChoice, Scaler, Split, Table};
use mamba2_forecast::{Forecaster, ForecasterConfig};
use mamba2_train::{train_workers, Prepared, RunDir, TrainConfig, TrainSummary};

use crate::common::{worst, Values};

fn setup() -> (ForecasterConfig, TrainConfig, Prepared) {
    let table = Table::from_csv_str(&crate::forecast::synthetic(700), "synthetic", &ColumnChoice::default()).unwrap();
    let calendar = table.times.as_deref().and_then(Calendar::detect);
    let (l, h) = (24, 6);
    let ranges = Split::Fractions { train: 0.7, val: 0.1 }.ranges(table.rows.len(), l).unwrap();
    let scaler = Scaler::fit(&table.rows[ranges[0].0..ranges[0].1], &table.columns).unwrap();
    let rows = scaler.transform(&table.rows, &table.columns).unwrap();
    let clock: Vec<i64> = table.times.as_ref().unwrap().iter().map(|&t| calendar.as_ref().unwrap().clock(t)).collect();
    let config = ForecasterConfig::defaults(l, h, table.columns.clone(), table.columns.clone(), calendar);
    // 10 steps per epoch of 8 windows (the last one shorter); a clip that bites and a warm-up
    // inside the run, so that both are part of what must agree.
    let tc = TrainConfig { epochs: 2, batch_size: 8, stride: 6, warmup_steps: 5, max_grad_norm: Some(0.05), ..TrainConfig::default() };
    (config, tc, Prepared { rows, scaler, ranges, targets: vec![0, 1], clock })
}

pub(crate) fn run<B: AutodiffBackend>(workers: usize, tag: &str) -> (TrainSummary, Vec<Vec<f64>>)
where
    B::Device: Sync,
{
    let (config, tc, data) = setup();
    let dir = std::env::temp_dir().join(format!("mamba2-parallel-{tag}-{workers}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let device = Default::default();
    let summary = train_workers::<B>(&config, &tc, &data, &RunDir(dir.clone()), false, &device, workers, |_| {}).unwrap();
    let last =
        mamba2_model::load_checkpoint::<B::InnerBackend, Forecaster<_>, ForecasterConfig>(&RunDir(dir.clone()).last(), &device, |c, d| {
            c.init(d)
        })
        .unwrap()
        .module;
    let mut values = Values(Vec::new());
    last.visit(&mut values);
    let _ = std::fs::remove_dir_all(&dir);
    (summary, values.0)
}

fn equivalent<B: AutodiffBackend>(tag: &str, tolerance: f64)
where
    B::Device: Sync,
{
    let (one, p1) = run::<B>(1, tag);
    let steps = one.history.last().unwrap().step;
    assert_eq!(steps, 20, "the run is 20 optimizer steps");
    // With 6 workers the short last batch of each epoch (4 or 5 windows) leaves a worker with no
    // share at all.
    for workers in [2, 3, 6] {
        let (many, pw) = run::<B>(workers, tag);
        let w = worst(&pw, &p1);
        println!("{tag}: {workers} workers vs 1 after {steps} steps: worst relative parameter difference {w:.2e}");
        assert!(w <= tolerance, "{workers} workers: parameters differ by {w:e}");
        for (a, b) in many.history.iter().zip(&one.history) {
            for (x, y, what) in
                [(a.train_loss, b.train_loss, "train loss"), (a.val_mse, b.val_mse, "val MSE"), (a.grad_norm, b.grad_norm, "grad norm")]
            {
                assert!((x - y).abs() <= tolerance * y.abs(), "{workers} workers, epoch {}: {what} {x} vs {y}", a.epoch);
            }
        }
        assert_eq!(many.best_epoch, one.best_epoch);
    }
}

// One test for both precisions: the collective's in-process server is one per backend type and
// process, and these runs must not register with it at the same time.
//
// The worst parameter is the learned cycle (48 values), in f32 at about 6e-6 against 1e-7 for
// every other: with the MAE loss a cycle entry's gradient is a sum of +-1/n terms that can cancel
// to rounding, and Adam divides such a gradient by a root of the same size, plus its 1e-8
// epsilon, so the sum's rounding order becomes a visible part of the step.
#[test]
fn workers_equal_one_worker() {
    equivalent::<Autodiff<NdArray<f64>>>("f64", 1e-12);
    equivalent::<Autodiff<Flex>>("f32", 1e-5);
}
