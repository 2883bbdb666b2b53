//! What `mamba2 train` shows while it runs: a progress bar per epoch on a terminal (indicatif),
//! one plain line per epoch otherwise, and JSON lines instead with `--json`.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use mamba2_train::Progress;

/// How progress is shown.
pub struct Reporter {
    json: bool,
    bar: Option<ProgressBar>,
    terminal: bool,
    epochs: usize,
    windows: usize,
    rows_per_window: usize,
    loss_sum: f64,
}

impl Reporter {
    /// Bars when stdout is a terminal (and `json` is off), plain lines otherwise. `epochs` is
    /// the most the run may take; `rows_per_window` counts the rows one window feeds (series x
    /// lookback), for the rows-per-second figure.
    pub fn new(json: bool, epochs: usize, rows_per_window: usize) -> Self {
        let terminal = !json && std::io::stdout().is_terminal() && std::env::var_os("MAMBA2_PLAIN").is_none();
        Self { json, bar: None, terminal, epochs, windows: 0, rows_per_window, loss_sum: 0.0 }
    }

    /// Shows one event of the training loop.
    pub fn show(&mut self, p: Progress) {
        match p {
            Progress::Resumed { epochs_done, step } => {
                println!(
                    "resuming from last.ckpt: {epochs_done} of at most {} epochs done ({step} steps); epoch {} starts over",
                    self.epochs,
                    epochs_done + 1
                )
            }
            Progress::Baselines { repeat, seasonal } => {
                if !self.json {
                    let seasonal =
                        seasonal.map_or(String::new(), |(p, m, a)| format!("; seasonal naive ({p} rows back) MSE {m:.4} MAE {a:.4}"));
                    println!("validation baselines: Repeat (the last value) MSE {:.4} MAE {:.4}{seasonal}", repeat.0, repeat.1);
                }
            }
            Progress::EpochStart { epoch, steps, windows } => {
                self.windows = windows;
                self.loss_sum = 0.0;
                if self.terminal {
                    let bar = ProgressBar::with_draw_target(Some(steps as u64), ProgressDrawTarget::stdout());
                    // Rows per second, the figure the epoch line prints too: a step feeds its
                    // share of the epoch's windows, each `rows_per_window` rows.
                    let rows_per_step = (windows * self.rows_per_window) as f64 / steps.max(1) as f64;
                    bar.set_style(
                        ProgressStyle::with_template(&format!(
                            "epoch {epoch:>2}/{} [{{wide_bar}}] {{pos}}/{{len}} steps  loss {{msg}}  {{rows}}  ETA {{eta}}",
                            self.epochs
                        ))
                        .expect("a valid template")
                        .with_key("rows", move |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                            let _ = write!(w, "{:.0}k rows/s", state.per_sec() * rows_per_step / 1e3);
                        })
                        .progress_chars("=> "),
                    );
                    bar.enable_steady_tick(Duration::from_millis(200));
                    self.bar = Some(bar);
                }
            }
            Progress::Step { done, loss } => {
                self.loss_sum += loss;
                if let Some(bar) = &self.bar {
                    bar.set_position(done as u64);
                    bar.set_message(format!("{:.4}", self.loss_sum / done as f64));
                }
            }
            Progress::Validating => {
                if let Some(bar) = &self.bar {
                    bar.set_message(format!("{:.4} (validating)", bar.message().split(' ').next().unwrap_or("")));
                }
            }
            Progress::EpochEnd { record, best } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                if self.json {
                    println!("{}", serde_json::to_string(record).expect("serialisable"));
                    return;
                }
                let rows_per_s = (self.windows * self.rows_per_window) as f64 / record.seconds.max(1e-9);
                println!(
                    "epoch {:>2}/{}  train loss {:.4}  val MSE {:.4}  MAE {:.4}  skill {:+.1} %  lr {:.1e}  {:.1} s, {:.0}k rows/s{}",
                    record.epoch,
                    self.epochs,
                    record.train_loss,
                    record.val_mse,
                    record.val_mae,
                    100.0 * record.val_skill,
                    record.lr,
                    record.seconds,
                    rows_per_s / 1e3,
                    if best { "  best so far" } else { "" }
                );
            }
            Progress::Calibrating => {}
            Progress::EarlyStop { best_epoch } => {
                if !self.json {
                    println!("early stop: no better validation MSE in the epochs after epoch {best_epoch}");
                }
            }
        }
    }
}
