//! The `mamba2` command end to end, on small synthetic data in f64: malformed inputs fail with
//! one line and no half-written file; a run killed with SIGKILL and resumed ends exactly like an
//! uninterrupted one; `stream` prints what `predict` prints on the same history.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mamba2"))
}

pub(crate) fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mamba2-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Uniform numbers in [-0.5, 0.5) from a 64-bit linear congruential generator started at
/// `state`: the same data on every machine, without a dependency.
fn uniform_from(mut state: u64) -> impl FnMut() -> f64 {
    move || {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    }
}

/// `rows` rows of three smooth, noisy series with an hourly date column (so that models read
/// its calendar).
pub(crate) fn synthetic_csv(rows: usize) -> String {
    let mut s = String::from("date,a,b,c\n");
    let mut state = 99u64;
    for t in 0..rows {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let noise = ((state >> 33) as f64 / (1u64 << 31) as f64 - 0.5) * 0.2;
        let tf = t as f64;
        s += &format!(
            "{},{},{},{}\n",
            crate::common::stamp(1_577_836_800 + 3600 * t as i64),
            (tf * 0.3).sin() + noise,
            (tf * 0.11).cos() * 2.0 + noise,
            0.5 * (tf * 0.3 - 1.0).sin() + 0.01 * tf
        );
    }
    s
}

pub(crate) const TINY: [&str; 16] = [
    "--lookback",
    "12",
    "--horizon",
    "3",
    "--d-model",
    "8",
    "--layers",
    "1",
    "--d-state",
    "4",
    "--headdim",
    "4",
    "--chunk-size",
    "8",
    "--dtype",
    "f64",
];

pub(crate) fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("the binary runs")
}

pub(crate) fn train_tiny(dir: &Path, csv: &Path, extra: &[&str]) -> Output {
    run(bin()
        .arg("train")
        .arg("--data")
        .arg(csv)
        .arg("--out")
        .arg(dir.join("run"))
        .args(TINY)
        .args(["--epochs", "1", "--batch-size", "16"])
        .args(extra))
}

fn no_temp_files(dir: &Path) -> bool {
    walk(dir).iter().all(|p| !p.file_name().unwrap().to_string_lossy().contains(".tmp-"))
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn malformed_inputs_fail_with_one_line_and_leave_nothing_half_written() {
    let dir = scratch("bad");
    let good = dir.join("good.csv");
    std::fs::write(&good, synthetic_csv(300)).unwrap();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let empty = write("empty.csv", "");
    let header_only = write("header.csv", "date,a,b\n");
    let non_numeric = write("text.csv", "date,a,b\nx,1,2\ny,3,oops\n");
    let nan = write("nan.csv", "date,a,b\nx,1,2\ny,NaN,4\n");
    let inf = write("inf.csv", "date,a,b\nx,1,inf\ny,3,4\n");
    let ragged = write("ragged.csv", "date,a,b\nx,1,2\ny,3\n");
    let short = write("short.csv", &synthetic_csv(40));
    let headerless = write("headerless.csv", &synthetic_csv(300).lines().skip(1).map(|l| l.to_string() + "\n").collect::<String>());
    let twice = write("twice.csv", &synthetic_csv(300).replacen("date,a,b,c", "date,a,b,a", 1));
    let empty_cell = {
        // Line 3, column `b`, left empty.
        let mut lines: Vec<String> = synthetic_csv(300).lines().map(String::from).collect();
        let mut cells: Vec<String> = lines[2].split(',').map(String::from).collect();
        cells[2].clear();
        lines[2] = cells.join(",");
        write("emptycell.csv", &(lines.join("\n") + "\n"))
    };
    let with_column = |f: &dyn Fn(usize) -> String| {
        let mut text = String::new();
        for (t, l) in synthetic_csv(300).lines().enumerate() {
            text += &format!("{l},{}\n", if t == 0 { "d".to_string() } else { f(t) });
        }
        text
    };
    let constant = write("constant.csv", &with_column(&|_| "5".into()));
    let huge = write("huge.csv", &with_column(&|t| format!("{:e}", 1e300 * (1.0 + (t as f64 * 0.1).cos()))));
    // Ordinary training rows, then one test value no scaled float can hold.
    let far = write("far.csv", &with_column(&|t| if t == 300 { "1e300".into() } else { (t % 2).to_string() }));

    // A real checkpoint, then damaged copies of it.
    let trained = train_tiny(&dir, &good, &[]);
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));
    // The closing line names every file the run left (the optimizer's state and the weight
    // average among them), so that none is a mystery in the output directory.
    let stdout = String::from_utf8_lossy(&trained.stdout);
    let closing = stdout.lines().rfind(|l| l.starts_with("wrote ")).expect("a closing `wrote` line");
    let left = walk(&dir.join("run"));
    assert!(left.len() >= 7, "{left:?}");
    for f in &left {
        let name = f.file_name().unwrap().to_string_lossy();
        assert!(closing.contains(&*name), "`{closing}` does not name {name}");
    }
    let ckpt = dir.join("run/best.ckpt");
    let bytes = std::fs::read(&ckpt).unwrap();
    let truncated = dir.join("truncated.ckpt");
    std::fs::write(&truncated, &bytes[..bytes.len() * 2 / 3]).unwrap();
    let corrupt = dir.join("corrupt.ckpt");
    let mut flipped = bytes.clone();
    let n = flipped.len() - 7;
    flipped[n] ^= 0x5a;
    std::fs::write(&corrupt, flipped).unwrap();
    let garbage = write("garbage.ckpt", "this is not a checkpoint at all");
    // Headers edited with the checksum kept true: an absurd horizon, and a width whose weights
    // could not fit in the file.
    let header_len = u64::from_le_bytes(bytes[8..16].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[16..16 + header_len]).unwrap();
    let edited = |name: &str, at: &str, v: serde_json::Value| {
        let mut h = header.clone();
        *h.pointer_mut(at).unwrap_or_else(|| panic!("no {at} in the header")) = v;
        let p = dir.join(name);
        std::fs::write(&p, crate::fuzz::reseal(&h, &bytes[16 + header_len..])).unwrap();
        p
    };
    let edited_horizon = edited("horizon.ckpt", "/config/spec/horizon", serde_json::json!(u64::MAX));
    let too_wide = edited("wide.ckpt", "/config/backbone/d_model", serde_json::json!(4096));
    // Quantiles that cross (the median above the upper quantile), and a calibration made for
    // another horizon.
    let crossing = edited("crossing.ckpt", "/meta/calibration/model/z/1", serde_json::json!(1e9));
    let other_horizon = edited("horizon_q.ckpt", "/meta/calibration/repeat/horizon", serde_json::json!(5));
    let a_file = write("a_file", "x");

    let g = good.to_str().unwrap();
    let out = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let cases: Vec<(&str, Vec<String>, &str)> = vec![
        ("missing file", vec!["train", "--data", "/nonexistent/data.csv"], "No such file"),
        ("empty file", vec!["train", "--data", empty.to_str().unwrap()], "empty file"),
        ("header only", vec!["train", "--data", header_only.to_str().unwrap()], "header only"),
        ("non-numeric cell", vec!["train", "--data", non_numeric.to_str().unwrap()], "`oops` is not a number"),
        ("NaN cell", vec!["train", "--data", nan.to_str().unwrap()], "not a finite number"),
        ("Inf cell", vec!["train", "--data", inf.to_str().unwrap()], "not a finite number"),
        ("ragged row", vec!["train", "--data", ragged.to_str().unwrap()], "2 cells, the header has 3"),
        ("unknown column", vec!["train", "--data", g, "--columns", "a,zzz"], "unknown column `zzz`"),
        ("unknown target", vec!["train", "--data", g, "--targets", "q"], "unknown column `q`"),
        (
            "L + H longer than the data",
            vec!["train", "--data", short.to_str().unwrap(), "--lookback", "96", "--horizon", "96"],
            "do not fit",
        ),
        (
            "batch size 0",
            vec!["train", "--data", g, "--batch-size", "0", "--lookback", "12", "--horizon", "3"],
            "batch size must be at least 1",
        ),
        ("zero epochs", vec!["train", "--data", g, "--epochs", "0", "--lookback", "12", "--horizon", "3"], "epochs must be at least 1"),
        (
            "headdim not dividing",
            vec!["train", "--data", g, "--d-model", "10", "--headdim", "3", "--lookback", "12", "--horizon", "3"],
            "headdim must divide",
        ),
        ("headerless CSV", vec!["train", "--data", headerless.to_str().unwrap()], "looks like data, not a header"),
        ("a column named twice", vec!["train", "--data", twice.to_str().unwrap()], "column `a` appears twice in the header"),
        ("an empty cell", vec!["train", "--data", empty_cell.to_str().unwrap()], "line 3, column `b`: empty cell"),
        (
            "a constant column",
            vec!["train", "--data", constant.to_str().unwrap(), "--lookback", "12", "--horizon", "3"],
            "column `d` is constant",
        ),
        (
            "values too large to scale",
            vec!["train", "--data", huge.to_str().unwrap(), "--lookback", "12", "--horizon", "3"],
            "values too large to scale",
        ),
        ("patch 0", vec!["train", "--data", g, "--patch", "0", "--lookback", "12", "--horizon", "3"], "patch must be at least 1"),
        ("lookback 0", vec!["train", "--data", g, "--lookback", "0", "--horizon", "3"], "lookback must be at least 1"),
        ("horizon 0", vec!["train", "--data", g, "--lookback", "12", "--horizon", "0"], "horizon must be at least 1"),
        (
            "workers 0",
            vec!["train", "--data", g, "--workers", "0", "--lookback", "12", "--horizon", "3"],
            "invalid value '0' for '--workers",
        ),
        (
            "more workers than windows per step",
            vec!["train", "--data", g, "--workers", "9", "--batch-size", "8", "--lookback", "12", "--horizon", "3"],
            "9 data-parallel workers are more than the batch size 8",
        ),
        (
            "workers with dropout",
            vec!["train", "--data", g, "--workers", "2", "--dropout", "0.1", "--lookback", "12", "--horizon", "3"],
            "2 data-parallel workers need dropout 0 (it is 0.1)",
        ),
        (
            "processes without a coordinator",
            vec!["train", "--data", g, "--world-size", "2", "--lookback", "12", "--horizon", "3"],
            "--world-size 2 needs --coordinator HOST:PORT",
        ),
        (
            "a rank without processes",
            vec!["train", "--data", g, "--rank", "1", "--lookback", "12", "--horizon", "3"],
            "--rank 1 needs --world-size above it",
        ),
        (
            "a rank outside the world",
            vec![
                "train",
                "--data",
                g,
                "--world-size",
                "2",
                "--rank",
                "2",
                "--coordinator",
                "127.0.0.1:29400",
                "--lookback",
                "12",
                "--horizon",
                "3",
            ],
            "--rank 2 is not below --world-size 2",
        ),
        (
            "a coordinator that is not host:port",
            vec!["train", "--data", g, "--world-size", "2", "--coordinator", "somewhere", "--lookback", "12", "--horizon", "3"],
            "--coordinator \"somewhere\": not a host:port that resolves",
        ),
        (
            "a rank on another machine without its address",
            vec![
                "train",
                "--data",
                g,
                "--world-size",
                "2",
                "--rank",
                "1",
                "--coordinator",
                "10.0.0.1:29400",
                "--lookback",
                "12",
                "--horizon",
                "3",
            ],
            "--rank 1 needs --listen HOST:PORT",
        ),
        (
            "a target named twice",
            vec!["train", "--data", g, "--targets", "a,a", "--lookback", "12", "--horizon", "3"],
            "each column may appear only once",
        ),
        ("bad split fractions", vec!["train", "--data", g, "--split", "0.9,0.5", "--lookback", "12", "--horizon", "3"], "split fractions"),
        (
            "truncated checkpoint",
            vec!["eval", "--checkpoint", truncated.to_str().unwrap(), "--data", g, "--dtype", "f64"],
            "truncated checkpoint",
        ),
        ("corrupt checkpoint", vec!["eval", "--checkpoint", corrupt.to_str().unwrap(), "--data", g, "--dtype", "f64"], "checksum mismatch"),
        ("not a checkpoint", vec!["predict", "--checkpoint", garbage.to_str().unwrap(), "--data", g], "not a mamba2 checkpoint"),
        (
            "edited header: horizon 2^64 - 1",
            vec!["predict", "--checkpoint", edited_horizon.to_str().unwrap(), "--data", g],
            "horizon = 18446744073709551615 is larger than",
        ),
        (
            "edited header: weights beyond the file",
            vec!["predict", "--checkpoint", too_wide.to_str().unwrap(), "--data", g],
            "can hold at most",
        ),
        (
            "a value too far to scale",
            vec!["train", "--data", far.to_str().unwrap(), "--lookback", "12", "--horizon", "3", "--out", &out("far")],
            "data row 300, column `d`: 1e300 lies",
        ),
        ("missing checkpoint", vec!["predict", "--checkpoint", "/nonexistent.ckpt", "--data", g], "No such file"),
        (
            "checkpoint of another config",
            {
                let mut v: Vec<&str> = vec!["train", "--data", g, "--resume", "--epochs", "2"];
                v.extend(["--out"]);
                v
            },
            "another model config",
        ),
        (
            "CSV lacking the model's columns",
            vec!["eval", "--checkpoint", ckpt.to_str().unwrap(), "--data", header_only.to_str().unwrap(), "--dtype", "f64"],
            "unknown column",
        ),
        (
            "unwritable output directory",
            vec!["train", "--data", g, "--lookback", "12", "--horizon", "3", "--out", &format!("{}/sub", a_file.to_str().unwrap())],
            "a_file/sub",
        ),
        ("existing run without --resume", vec!["train", "--data", g, "--lookback", "12", "--horizon", "3", "--out"], "already holds a run"),
        ("non-numeric flag", vec!["train", "--data", g, "--batch-size", "many"], "invalid value 'many'"),
        ("negative cost", vec!["train", "--data", g, "--cost-bps=-3"], "--cost-bps -3 is not a cost"),
        ("quantile level of 1.5", vec!["train", "--data", g, "--quantiles", "0.1,1.5"], "quantile level 1.5 is outside (0, 1)"),
        (
            "quantile levels out of order",
            vec!["train", "--data", g, "--quantiles", "0.9,0.1"],
            "quantile levels must increase: 0.9 then 0.1",
        ),
        ("non-numeric quantile level", vec!["train", "--data", g, "--quantiles", "0.1,median"], "invalid value 'median'"),
        (
            "checkpoint whose quantiles cross",
            vec!["predict", "--checkpoint", crossing.to_str().unwrap(), "--data", g],
            "its intervals' quantiles are not finite and increasing",
        ),
        (
            "checkpoint whose calibration has another horizon",
            vec!["stream", "--checkpoint", other_horizon.to_str().unwrap()],
            "its intervals are for 3 targets and 5 steps, the model has 3 and 3",
        ),
        ("backtest: zero folds", vec!["backtest", "--data", g, "--folds", "0", "--lookback", "12", "--horizon", "3"], "0 folds"),
        (
            "backtest: folds of zero rows",
            vec!["backtest", "--data", g, "--fold-rows", "0", "--lookback", "12", "--horizon", "3"],
            "folds of 0 rows are shorter than the horizon 3",
        ),
        (
            "backtest: folds that do not fit",
            vec!["backtest", "--data", g, "--folds", "4", "--fold-rows", "100", "--lookback", "12", "--horizon", "3"],
            "4 folds of 100 rows need 400 rows; the data has 300",
        ),
        (
            "backtest: no rows before the first fold",
            vec!["backtest", "--data", g, "--folds", "3", "--fold-rows", "100", "--lookback", "12", "--horizon", "3"],
            "fold 1 starts at row 0 with 0 rows before it",
        ),
        ("backtest: a window of 0 rows", vec!["backtest", "--data", g, "--window", "0"], "--window 0"),
        ("backtest: --split", vec!["backtest", "--data", g, "--split", "0.7,0.1"], "backtest does not take --split"),
        (
            "backtest --checkpoint with a model flag",
            vec!["backtest", "--checkpoint", ckpt.to_str().unwrap(), "--data", g, "--lookback", "48", "--out", &out("btc")],
            "does not take --lookback: the checkpoint fixes the model",
        ),
        (
            "backtest --checkpoint with --window",
            vec!["backtest", "--checkpoint", ckpt.to_str().unwrap(), "--data", g, "--window", "200", "--out", &out("btw")],
            "does not take --window",
        ),
        (
            "NaN cost in eval",
            vec!["eval", "--checkpoint", ckpt.to_str().unwrap(), "--data", g, "--dtype", "f64", "--cost-bps", "NaN"],
            "--cost-bps NaN is not a cost",
        ),
        (
            "cuda in a CPU build",
            vec!["train", "--data", g, "--device", "cuda", "--lookback", "12", "--horizon", "3", "--out", &out("cuda")],
            "",
        ),
        // In a build with the feature this trains wherever Vulkan finds a device.
        #[cfg(not(feature = "wgpu"))]
        (
            "wgpu in a CPU build",
            vec!["train", "--data", g, "--device", "wgpu", "--lookback", "12", "--horizon", "3", "--out", &out("wgpu")],
            "rebuild with --features wgpu",
        ),
    ]
    .into_iter()
    .map(|(n, v, e)| (n, v.into_iter().map(String::from).collect::<Vec<_>>(), e))
    .collect();

    let before: Vec<PathBuf> = walk(&dir);
    let mut table = Vec::new();
    for (name, mut args, expected) in cases {
        if args.last().map(String::as_str) == Some("--out") {
            args.push(dir.join("run").to_str().unwrap().to_string());
            if name == "checkpoint of another config" {
                args.extend(
                    ["--d-model", "16", "--headdim", "4", "--lookback", "12", "--horizon", "3", "--dtype", "f64"].map(String::from),
                );
            }
        }
        let o = run(bin().args(&args).stdin(Stdio::null()));
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        table.push(format!("{name}: {}", stderr.trim()));
        assert!(!o.status.success(), "{name}: exited 0");
        assert!(matches!(o.status.code(), Some(1 | 2)), "{name}: exit code {:?} (a panic exits 101): {stderr}", o.status.code());
        assert!(!stderr.contains("panicked"), "{name}: panicked: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{name}: not one line: {stderr}");
        assert!(stderr.starts_with("error: "), "{name}: {stderr}");
        assert!(stderr.contains(expected), "{name}: expected `{expected}` in: {stderr}");
    }
    println!("{}", table.join("\n"));
    assert!(no_temp_files(&dir), "a temporary file was left behind");
    let after: Vec<PathBuf> = walk(&dir);
    let created: Vec<&PathBuf> = after.iter().filter(|p| !before.contains(p)).collect();
    assert!(created.is_empty(), "failed commands wrote files: {created:?}");
    assert_eq!(std::fs::read(&ckpt).unwrap(), bytes, "the run's checkpoint is untouched");
}

fn summary(dir: &Path) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap();
    v.as_object_mut().unwrap().remove("wall_seconds");
    v
}

#[test]
fn a_killed_run_resumes_to_the_same_result() {
    killed_and_resumed("resume", &[]);
}

/// With the state that only some runs have: dropout (drawn per step) and the weight average
/// (its own file beside the optimizer's).
#[test]
fn a_killed_run_with_dropout_and_a_weight_average_resumes_to_the_same_result() {
    killed_and_resumed("resume-ema", &["--dropout", "0.2", "--ema", "0.9"]);
}

fn killed_and_resumed(name: &str, extra: &[&str]) {
    let dir = scratch(name);
    let csv = dir.join("data.csv");
    std::fs::write(&csv, synthetic_csv(1500)).unwrap();
    let args = |out: &Path| -> Vec<String> {
        let mut v: Vec<String> =
            ["train", "--data", csv.to_str().unwrap(), "--out", out.to_str().unwrap(), "--epochs", "6", "--batch-size", "8", "--seed", "5"]
                .map(String::from)
                .to_vec();
        v.extend(TINY.map(String::from));
        v.extend(extra.iter().map(|a| a.to_string()));
        v
    };
    let straight = dir.join("straight");
    let o = run(bin().args(args(&straight)));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    let killed = dir.join("killed");
    let mut child = bin().args(args(&killed)).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let start = Instant::now();
    while !killed.join("last.ckpt").exists() {
        assert!(start.elapsed() < Duration::from_secs(120), "no epoch finished");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(150));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(!killed.join("summary.json").exists(), "the run finished before it was killed: make epochs longer");

    // What a kill during a save leaves: a temporary file beside the real one. The next start
    // removes it.
    std::fs::write(killed.join(".last.ckpt.tmp-4242"), b"half a checkpoint").unwrap();
    let mut resume = args(&killed);
    resume.push("--resume".into());
    let o = run(bin().args(&resume));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("resuming from last.ckpt: ") && stdout.contains(" epochs done ("), "{stdout}");
    assert!(no_temp_files(&killed), "the leftover temporary file is still there");
    assert_eq!(summary(&killed), summary(&straight), "resumed and uninterrupted runs differ");
    assert_eq!(epoch_figures(&killed), epoch_figures(&straight), "per-epoch metrics differ");
}

/// `metrics.jsonl` of the run in `dir`, each epoch's figures but its wall time.
fn epoch_figures(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("seconds");
            v
        })
        .collect()
}

/// The same command run three times gives the same run, bit for bit: every epoch's figures and the
/// summary. Two settings: the small model as the other tests train it, and one whose training
/// loss is a tensor mean of 4.4 M values (dropout takes the loss off the fused kernel; 384
/// sequences, 48 scored rows, H 240; 7 steps an epoch), the size at which Burn's Flex sums on several threads in
/// an order that changes from run to run (before `mamba2_tensor::ordered_sum`, half of such runs
/// ended an epoch with a training loss that differed from the others' in its last digits, and
/// this test failed 3 times in 4).
#[test]
fn the_same_command_gives_the_same_run() {
    let dir = scratch("twice");
    let csv = dir.join("data.csv");
    std::fs::write(&csv, synthetic_csv(2000)).unwrap();
    let tiny: Vec<&str> = ["--epochs", "2", "--batch-size", "8", "--seed", "3"].into_iter().chain(TINY).collect();
    let large = "--epochs 2 --batch-size 128 --lookback 96 --horizon 240 --split 0.6,0.2 --d-model 8 --dropout 0.1 --stride 1 --no-test";
    let large: Vec<&str> = large.split(' ').collect();
    for (name, settings) in [("tiny", &tiny[..]), ("large-loss", &large[..])] {
        let out = |k: usize| dir.join(format!("{name}-{k}"));
        for k in 0..3 {
            let o = run(bin().args(["train", "--data", csv.to_str().unwrap(), "--out", out(k).to_str().unwrap()]).args(settings));
            assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        }
        let first = epoch_figures(&out(0));
        assert_eq!(first.len(), 2, "{name}: two epochs");
        for k in 1..3 {
            assert_eq!(epoch_figures(&out(k)), first, "{name}: run {k}'s epochs differ from run 0's");
            assert_eq!(summary(&out(k)), summary(&out(0)), "{name}: run {k}'s summary differs from run 0's");
        }
    }
}

fn parse_rows(text: &str, skip_cols: usize) -> Vec<Vec<f64>> {
    text.lines().skip(1).map(|l| l.split(',').skip(skip_cols).map(|v| v.parse().unwrap()).collect()).collect()
}

/// What `stream --dtype f64` prints when fed `header` and then `rows`.
fn stream_text(ckpt: &Path, header: &str, rows: &[impl AsRef<str>]) -> String {
    let mut child = bin()
        .args(["stream", "--checkpoint", ckpt.to_str().unwrap(), "--dtype", "f64"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{header}").unwrap();
        for r in rows {
            writeln!(stdin, "{}", r.as_ref()).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The lines of a CSV text's data rows from row `from` (0 is the first after the header).
fn walk_text_rows(text: &str, from: usize) -> Vec<String> {
    text.lines().skip(1 + from).map(String::from).collect()
}

#[test]
fn stream_prints_what_predict_prints_on_the_same_history() {
    let dir = scratch("stream");
    let csv_text = synthetic_csv(400);
    let csv = dir.join("data.csv");
    std::fs::write(&csv, &csv_text).unwrap();
    // The model as trained: the check could keep Repeat, whose stream equals predict trivially.
    let o = train_tiny(&dir, &csv, &["--no-repeat-check"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ckpt = dir.join("run/best.ckpt");

    // The test split: the last 20 % of rows (default fractions 0.7, 0.1).
    let lines: Vec<&str> = csv_text.lines().collect();
    let header = lines[0];
    let test_rows = &lines[1 + 320..];
    let streamed_text = stream_text(&ckpt, header, test_rows);
    let streamed = parse_rows(&streamed_text, 0);
    assert_eq!(streamed.len(), test_rows.len() * 3, "one forecast of 3 steps per row");
    // The point forecast of each target, then its quantiles at the default levels; they never
    // cross.
    let columns: Vec<&str> = streamed_text.lines().next().unwrap().split(',').collect();
    let targets = columns.iter().skip(2).take_while(|c| !c.contains("_q")).count();
    assert!(targets >= 1);
    for (t, name) in columns[2..2 + targets].iter().enumerate() {
        let at = 2 + targets + 3 * t;
        assert_eq!(columns[at..at + 3], [format!("{name}_q10"), format!("{name}_q50"), format!("{name}_q90")], "{columns:?}");
    }
    assert_eq!(columns.len(), 2 + 4 * targets, "{columns:?}");
    let mut widths = vec![0.0; test_rows.len()];
    for r in &streamed {
        for t in 0..targets {
            let q = &r[2 + targets + 3 * t..2 + targets + 3 * t + 3];
            assert!(q[0] <= q[1] && q[1] <= q[2], "quantiles cross: {r:?}");
            widths[r[0] as usize - 1] += q[2] - q[0];
        }
    }
    // After one row the local scale is unknown: the interval takes the typical width, not the
    // floor's (a thousandth of it).
    let mut sorted = widths.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    assert!(median > 0.0, "every interval is a point");
    assert!(widths[0] > 0.1 * median, "the first row's intervals are {} wide, the median row's {median}", widths[0]);

    let mut worst = 0.0f64;
    for k in [1usize, 2, 5, 17, 40, test_rows.len()] {
        let prefix = dir.join(format!("prefix{k}.csv"));
        std::fs::write(&prefix, format!("{header}\n{}\n", test_rows[..k].join("\n"))).unwrap();
        let o = run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--data", prefix.to_str().unwrap(), "--dtype", "f64"]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let predicted = parse_rows(&String::from_utf8_lossy(&o.stdout), 1);
        for (step, p) in predicted.iter().enumerate() {
            assert_eq!(p.len(), 4 * targets, "predict prints the quantile columns too");
            let s = &streamed[(k - 1) * 3 + step];
            assert_eq!(s[0] as usize, k);
            assert_eq!(s[1] as usize, step + 1);
            for (a, b) in p.iter().zip(&s[2..]) {
                let d = (a - b).abs() / b.abs().max(1.0);
                worst = worst.max(d);
                assert!(d <= 1e-9, "row {k}, step {}: predict {a} vs stream {b}", step + 1);
            }
        }
    }
    println!("worst relative difference between predict and stream: {worst:e}");

    // A bad row is named by its line in the input (the header is line 1), and ends the stream.
    let mut bad: Vec<String> = vec![header.to_string()];
    bad.extend(test_rows[..3].iter().map(|r| r.to_string()));
    let cells: Vec<&str> = test_rows[3].split(',').collect();
    bad.push(format!("{},{},oops,{}", cells[0], cells[1], cells[3]));
    let mut child = bin()
        .args(["stream", "--checkpoint", ckpt.to_str().unwrap(), "--dtype", "f64"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child.stdin.take().unwrap().write_all((bad.join("\n") + "\n").as_bytes()).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!((o.status.code(), stderr.trim_end().lines().count()), (Some(1), 1), "{stderr}");
    assert!(stderr.contains("stdin: line 5, column `b`: `oops` is not a number"), "{stderr}");
    assert_eq!(parse_rows(&String::from_utf8_lossy(&o.stdout), 0).len(), 3 * 3, "the three good rows' forecasts came first");
}

#[test]
fn a_diverging_run_stops_naming_the_step() {
    let dir = scratch("nan");
    let csv = dir.join("data.csv");
    std::fs::write(&csv, synthetic_csv(300)).unwrap();
    let o = train_tiny(&dir, &csv, &["--lr", "1e30"]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.starts_with("error: non-finite value at optimizer step "), "{stderr}");
    assert!(stderr.contains("gradient of ") || stderr.contains("loss is "), "{stderr}");
    assert!(!stderr.contains("panicked"));
}

/// Pixels of exactly this colour: lines are drawn in their own colour, so a chart whose line
/// is missing has none.
fn pixels_of(rgb: &[u8], c: [u8; 3]) -> usize {
    rgb.chunks(3).filter(|p| *p == c).count()
}

/// The three charts a run writes decode as PNGs with both axes and every line's colour drawn,
/// for a multi-step horizon, for H 1 (one-step forecasts over the test split) and after a single
/// epoch (the loss as markers).
#[test]
fn the_charts_have_axes_and_every_line_for_h96_h1_and_one_epoch() {
    use mamba2::plot::{has_axes_and, read_png, BAND_RGB};
    let dir = scratch("png");
    let csv = dir.join("data.csv");
    std::fs::write(&csv, synthetic_csv(1200)).unwrap();
    let (blue, orange, green, red, grey) = ([31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [127, 127, 127]);
    for (name, horizon, epochs) in [("h96", "96", "2"), ("h1", "1", "2"), ("one-epoch", "3", "1")] {
        let out = dir.join(name);
        let mut tiny = TINY;
        tiny[3] = horizon;
        let o = run(bin().arg("train").arg("--data").arg(&csv).arg("--out").arg(&out).args(tiny).args([
            "--epochs",
            epochs,
            "--batch-size",
            "16",
        ]));
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        for (file, colours) in
            [("loss.png", vec![blue, orange, green]), ("forecast.png", vec![[0, 0, 0], red]), ("error_by_step.png", vec![red, grey])]
        {
            let (w, h, rgb) = read_png(&out.join(file)).unwrap_or_else(|e| panic!("{name}/{file}: {e}"));
            assert_eq!((w, h), (720, 420), "{name}/{file}");
            assert!(has_axes_and(&rgb, w, h, &colours), "{name}/{file}: axes or a line missing");
            // A line or its markers, not a stray pixel: at least a marker's worth of each colour.
            for c in colours {
                assert!(pixels_of(&rgb, c) >= 20, "{name}/{file}: only {} pixels of {c:?}", pixels_of(&rgb, c));
            }
            // The forecast's 80 % interval is a band, not a line: an area of its colour.
            if file == "forecast.png" {
                let band = pixels_of(&rgb, BAND_RGB);
                assert!(band >= 1000, "{name}/forecast.png: the interval band has only {band} pixels");
            }
        }
        let (w, h, rgb) = read_png(&out.join("reliability.png")).unwrap_or_else(|e| panic!("{name}/reliability.png: {e}"));
        assert!(has_axes_and(&rgb, w, h, &[red, grey]), "{name}/reliability.png: axes or a line missing");
    }
}

/// How the Parquet copy of a CSV stores its date column.
#[derive(Clone, Copy)]
pub(crate) enum ParquetDates {
    /// INT64 TIMESTAMP(unit) with this many ticks per second.
    Timestamp(i64, &'static str),
    /// The CSV's own date strings.
    Text,
}

/// Writes the rows of `csv` (a `date` column, then numbers) as a Parquet file of two row
/// groups, Snappy-compressed, the numbers as nullable doubles (`None` for an empty CSV cell); a
/// column whose first cell is not a number (an id) as UTF-8 strings.
pub(crate) fn write_parquet(path: &Path, csv: &str, dates: ParquetDates) {
    use parquet::data_type::{ByteArray, ByteArrayType, DoubleType, Int64Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    let date_type = match dates {
        ParquetDates::Timestamp(_, unit) => format!("REQUIRED INT64 {} (TIMESTAMP({unit},true));", header[0]),
        ParquetDates::Text => format!("REQUIRED BYTE_ARRAY {} (UTF8);", header[0]),
    };
    let text = |j: usize| !rows[0][j].is_empty() && rows[0][j].parse::<f64>().is_err();
    let numbers: String = header
        .iter()
        .enumerate()
        .skip(1)
        .map(|(j, h)| if text(j) { format!("REQUIRED BYTE_ARRAY {h} (UTF8);") } else { format!("OPTIONAL DOUBLE {h};") })
        .collect();
    let schema = Arc::new(parquet::schema::parser::parse_message_type(&format!("message m {{ {date_type} {numbers} }}")).unwrap());
    let props = Arc::new(WriterProperties::builder().set_compression(parquet::basic::Compression::SNAPPY).build());
    let mut w = SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, props).unwrap();
    let half = rows.len() / 2;
    for group in [&rows[..half], &rows[half..]] {
        let mut rg = w.next_row_group().unwrap();
        let mut j = 0;
        while let Some(mut col) = rg.next_column().unwrap() {
            if j == 0 {
                match dates {
                    ParquetDates::Timestamp(per_second, _) => {
                        let ts: Vec<i64> = group.iter().map(|r| csv_seconds(r[0]) * per_second).collect();
                        col.typed::<Int64Type>().write_batch(&ts, None, None).unwrap();
                    }
                    ParquetDates::Text => {
                        let s: Vec<ByteArray> = group.iter().map(|r| ByteArray::from(r[0])).collect();
                        col.typed::<ByteArrayType>().write_batch(&s, None, None).unwrap();
                    }
                }
            } else if text(j) {
                let s: Vec<ByteArray> = group.iter().map(|r| ByteArray::from(r[j])).collect();
                col.typed::<ByteArrayType>().write_batch(&s, None, None).unwrap();
            } else {
                let defs: Vec<i16> = group.iter().map(|r| i16::from(!r[j].is_empty())).collect();
                let vals: Vec<f64> = group.iter().filter(|r| !r[j].is_empty()).map(|r| r[j].parse().unwrap()).collect();
                col.typed::<DoubleType>().write_batch(&vals, Some(&defs), None).unwrap();
            }
            col.close().unwrap();
            j += 1;
        }
        rg.close().unwrap();
    }
    w.close().unwrap();
}

/// Seconds since 1970 of a `YYYY-MM-DD HH:MM:SS` stamp, as the reader parses it.
fn csv_seconds(s: &str) -> i64 {
    mamba2_data::calendar::parse_time(s).unwrap()
}

/// A Parquet file with the CSV's rows (the dates as timestamps of any unit, or as strings)
/// reads as the same table, so the same windows; trained the same way it gives the same model
/// (every epoch's losses, and the forecasts, equal to the last digit).
#[test]
fn a_parquet_file_with_the_rows_of_a_csv_trains_the_same_model() {
    use mamba2_data::{ColumnChoice, Table};
    let dir = scratch("parquet");
    let text = synthetic_csv(400);
    let csv = dir.join("data.csv");
    std::fs::write(&csv, &text).unwrap();
    let from_csv = Table::from_path(&csv, &ColumnChoice::default()).unwrap();
    for (name, dates) in [
        ("millis", ParquetDates::Timestamp(1_000, "MILLIS")),
        ("micros", ParquetDates::Timestamp(1_000_000, "MICROS")),
        ("nanos", ParquetDates::Timestamp(1_000_000_000, "NANOS")),
        ("text", ParquetDates::Text),
    ] {
        let pq = dir.join(format!("{name}.parquet"));
        write_parquet(&pq, &text, dates);
        let t = Table::from_path(&pq, &ColumnChoice::default()).unwrap();
        assert_eq!(t, from_csv, "{name}: the Parquet table differs from the CSV's");
    }
    let pq = dir.join("millis.parquet");
    let runs: Vec<(Vec<serde_json::Value>, String)> = [&csv, &pq]
        .iter()
        .enumerate()
        .map(|(i, data)| {
            let out = dir.join(format!("run{i}"));
            let o = run(bin().arg("train").arg("--data").arg(data).arg("--out").arg(&out).args(TINY).args([
                "--epochs",
                "2",
                "--batch-size",
                "16",
            ]));
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let epochs = std::fs::read_to_string(out.join("metrics.jsonl"))
                .unwrap()
                .lines()
                .map(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    serde_json::json!([v["train_loss"], v["val_mse"], v["val_mae"]])
                })
                .collect();
            let ckpt = out.join("best.ckpt");
            let p =
                run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--data", data.to_str().unwrap(), "--dtype", "f64"]));
            assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
            (epochs, String::from_utf8_lossy(&p.stdout).into_owned())
        })
        .collect();
    assert_eq!(runs[0].0.len(), 2);
    assert_eq!(runs[0], runs[1], "CSV and Parquet runs differ");
}

/// Bad Parquet input fails like bad CSV: one line naming the file, the row and the column, exit
/// code 1, nothing written.
#[test]
fn bad_parquet_input_fails_with_one_line() {
    let dir = scratch("parquet-bad");
    let mut text = synthetic_csv(300);
    // An empty cell in column `b` of data row 7 becomes a null.
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    let cells: Vec<&str> = lines[7].split(',').collect();
    lines[7] = format!("{},{},,{}", cells[0], cells[1], cells[3]);
    text = lines.join("\n") + "\n";
    let pq = dir.join("null.parquet");
    write_parquet(&pq, &text, ParquetDates::Timestamp(1_000, "MILLIS"));
    let fake = dir.join("fake.parquet");
    std::fs::write(&fake, "date,a\n2020-01-01,1\n").unwrap();
    let cut = dir.join("cut.parquet");
    let whole = std::fs::read(&pq).unwrap();
    std::fs::write(&cut, &whole[..whole.len() / 2]).unwrap();
    for (file, wanted) in [(&pq, "row 7, column `b`: empty cell"), (&fake, "not a Parquet file"), (&cut, "not a readable Parquet file")] {
        let out = dir.join("run");
        let o = run(bin().arg("train").arg("--data").arg(file).arg("--out").arg(&out).args(TINY).args(["--epochs", "1"]));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{}: {stderr}", file.display());
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(stderr.contains(wanted) && stderr.contains(&*file.display().to_string()), "{stderr}");
        assert!(!out.exists(), "{}: wrote {}", file.display(), out.display());
    }
}

/// `train`'s output under a pseudo-terminal of 120 columns (what a user's shell gives it), read
/// until the program exits.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn under_a_terminal(cmd: &mut Command) -> (Option<i32>, String) {
    use std::io::Read;
    use std::os::fd::FromRawFd;
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize { ws_row: 40, ws_col: 120, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty writes the two descriptors it opens into the given integers.
    let opened = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
    assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened for us and are owned by these files alone.
    let (mut master, slave) = unsafe { (std::fs::File::from_raw_fd(master), std::fs::File::from_raw_fd(slave)) };
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap())
        .env_remove("MAMBA2_PLAIN")
        .spawn()
        .unwrap();
    // The command keeps its copies of the terminal's descriptor until they are replaced; the
    // reader below only sees the end once no copy is left open here.
    drop(slave);
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let reader = std::thread::spawn(move || {
        let mut out = Vec::new();
        // Reading fails (EIO) once the child has closed the terminal's last descriptor.
        let _ = master.read_to_end(&mut out);
        out
    });
    let code = child.wait().unwrap().code();
    (code, String::from_utf8_lossy(&reader.join().unwrap()).into_owned())
}

/// On a terminal `train` draws a progress bar (steps, loss, rows per second, ETA, redrawn in
/// place with escape codes); through a pipe the same run prints plain lines only, one per
/// epoch, and no escape code or carriage return.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[test]
fn progress_is_drawn_on_a_terminal_and_plain_lines_elsewhere() {
    let dir = scratch("pty");
    let csv = dir.join("data.csv");
    std::fs::write(&csv, synthetic_csv(6000)).unwrap();
    let args = |out: &str| {
        let mut c = bin();
        c.arg("train").arg("--data").arg(&csv).arg("--out").arg(dir.join(out)).args(TINY).args([
            "--epochs",
            "2",
            "--batch-size",
            "8",
            "--stride",
            "1",
        ]);
        c
    };
    let (code, tty) = under_a_terminal(&mut args("tty"));
    assert_eq!(code, Some(0), "{tty}");
    assert!(tty.contains('\x1b'), "no escape codes on a terminal: {tty}");
    for part in ["steps  loss ", "rows/s", "ETA", "[=", "epoch  1/2  train loss", "epoch  2/2  train loss"] {
        assert!(tty.contains(part), "`{part}` not drawn on a terminal: {tty}");
    }
    let piped = run(&mut args("pipe"));
    assert!(piped.status.success());
    let out = String::from_utf8_lossy(&piped.stdout);
    assert!(!out.contains('\x1b') && !out.contains('\r'), "escape codes or carriage returns in a pipe: {out:?}");
    assert!(!out.contains("ETA") && !out.contains("[="), "a progress bar in a pipe: {out}");
    let epochs: Vec<&str> = out.lines().filter(|l| l.starts_with("epoch ")).collect();
    assert_eq!(epochs.len(), 2, "{out}");
    assert!(epochs.iter().all(|l| l.contains("train loss") && l.contains("val MSE")), "{out}");
}

/// `generate` on the tiny HF fixture (`tools/reference/hf_generate.py`) prints the text and the
/// token ids of HF transformers' greedy `generate`, then tokens/s on stderr; a seed repeats a
/// sampled text and another seed changes it; mistakes are one-line errors.
#[test]
fn generate_prints_hf_greedy_tokens() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/hf_generate");
    let want: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("generate.json")).unwrap()).unwrap();
    let new_ids: Vec<String> = want["new_ids"].as_array().unwrap().iter().map(|x| x.to_string()).collect();
    let generate = |extra: &[&str]| {
        run(bin()
            .arg("generate")
            .arg("--model")
            .arg(&dir)
            .args(["--prompt", want["prompt"].as_str().unwrap(), "--max-new-tokens", &new_ids.len().to_string()])
            .args(extra))
    };
    let out = generate(&["--ids"]);
    let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, format!("{}\n{}\n", want["text"].as_str().unwrap(), new_ids.join(" ")));
    assert!(stderr.starts_with(&format!("{} new tokens in ", new_ids.len())) && stderr.contains(" tokens/s"), "{stderr}");

    let sampled = |seed: &str| {
        let out = generate(&["--temperature", "1.0", "--top-k", "50", "--top-p", "0.95", "--seed", seed, "--ids"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(sampled("1"), sampled("1"));
    assert_ne!(sampled("1"), sampled("2"));

    for (extra, message) in [
        (vec!["--top-k", "5"], "error: --top-k and --top-p shape sampling, which needs --temperature above 0 (0 is greedy)\n"),
        (vec!["--temperature", "1", "--top-p", "1.5"], "error: --top-p must be in (0, 1], got 1.5\n"),
        (vec!["--temperature=-2"], "error: --temperature must be 0 (greedy) or a positive number, got -2\n"),
    ] {
        let out = generate(&extra);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(String::from_utf8(out.stderr).unwrap(), message);
    }
    let out = run(bin().args(["generate", "--prompt", "hi", "--model"]).arg(dir.join("config.json")));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.starts_with("error: --model ")
            && stderr.ends_with("config.json: not a directory (an HF checkpoint's directory is wanted)\n"),
        "{stderr}"
    );
}

/// `rows` rows of a Gaussian random walk (a price with no predictable move) with a daily date
/// column.
fn random_walk_csv(rows: usize, seed: u64) -> (String, Vec<f64>) {
    let mut rng = mamba2_tensor::rng::SplitMix64::new(seed);
    let mut x = 100.0;
    let mut values = Vec::with_capacity(rows);
    let mut s = String::from("date,price\n");
    for t in 0..rows {
        x += rng.normal();
        values.push(x);
        s += &format!("{},{x}\n", crate::common::stamp(1_577_836_800 + 86_400 * t as i64));
    }
    (s, values)
}

/// Repeat's MSE over the windows of `range` (L `l`, H `h`), in units scaled by `std`, computed
/// here from the raw values.
fn repeat_mse(values: &[f64], range: (usize, usize), l: usize, h: usize, std: f64) -> f64 {
    let (mut se, mut n) = (0.0, 0usize);
    for s in range.0..=range.1 - l - h {
        let last = values[s + l - 1];
        for k in 1..=h {
            se += ((values[s + l - 1 + k] - last) / std).powi(2);
            n += 1;
        }
    }
    se / n as f64
}

/// A run reports Repeat's validation figures beside the model's (each epoch's skill, the
/// baselines line, `summary.json`), equal to a computation from the raw values. On a random walk
/// the model has no skill: the run says so in one line and keeps Repeat, so that its test
/// figures are Repeat's; on smooth cycles it keeps (most of) the model and beats Repeat.
#[test]
fn a_run_without_skill_says_so_and_keeps_repeat() {
    let dir = scratch("skill");
    let settings: Vec<&str> = ["--epochs", "3", "--batch-size", "16", "--seed", "1"].into_iter().chain(TINY).collect();
    let (csv, values) = random_walk_csv(1200, 7);
    let walk = dir.join("walk.csv");
    std::fs::write(&walk, csv).unwrap();
    let o = run(bin().args(["train", "--data", walk.to_str().unwrap(), "--out", dir.join("walk").to_str().unwrap()]).args(&settings));
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(stdout.lines().filter(|l| l.starts_with("no skill: ")).count(), 1, "{stdout}");
    assert!(stdout.contains("validation baselines: Repeat (the last value) MSE "), "{stdout}");
    assert!(stdout.contains(" skill ") && stdout.contains("hit rate"), "{stdout}");
    let s = summary(&dir.join("walk"));
    assert_eq!(s["blend"]["alpha"], 0.0, "{s}");
    let range = |k: &str| (s["ranges"][k][0].as_u64().unwrap() as usize, s["ranges"][k][1].as_u64().unwrap() as usize);
    let train = &values[range("train").0..range("train").1];
    let mean = train.iter().sum::<f64>() / train.len() as f64;
    let std = (train.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / train.len() as f64).sqrt();
    let val_repeat = repeat_mse(&values, range("validation"), 12, 3, std);
    let got = s["val_repeat_mse"].as_f64().unwrap();
    assert!((got - val_repeat).abs() < 1e-9 * val_repeat, "validation Repeat {got} vs {val_repeat} computed here");
    let skill = s["val_skill"].as_f64().unwrap();
    assert!((skill - (1.0 - s["val_mse"].as_f64().unwrap() / got)).abs() < 1e-12, "{s}");
    // The kept forecast is Repeat: the same test errors, no positions, no strategy return.
    let t = &s["test"];
    let (mse, rmse) = (t["mse"].as_f64().unwrap(), t["repeat_mse"].as_f64().unwrap());
    assert!((mse - rmse).abs() < 1e-12 * rmse, "test MSE {mse} vs Repeat's {rmse}");
    assert_eq!((t["trades"].as_u64(), t["strategy_return"].as_f64(), t["ic"].is_null()), (Some(0), Some(0.0), true), "{t}");

    // Repeat kept, its intervals are a random walk's: at step k, last + Phi^-1(q) sqrt(k) s, s the
    // std of the last 96 changes. Checked on what `stream` prints, against the raw values, and
    // `predict` prints the same after each prefix (before 97 rows, the typical scale).
    let c = &s["calibration"];
    assert_eq!((c["scale"].as_str(), c["window"].as_u64()), (Some("change_std"), Some(96)), "{c}");
    assert_eq!(stdout.lines().filter(|l| l.contains("Repeat is kept, so a random walk's")).count(), 1, "{stdout}");
    let ckpt = dir.join("walk/best.ckpt");
    let from = range("test").0;
    let fed: Vec<String> = walk_text_rows(&std::fs::read_to_string(&walk).unwrap(), from);
    let streamed = parse_rows(&stream_text(&ckpt, "date,price", &fed), 0);
    assert_eq!(streamed.len(), fed.len() * 3);
    let z90 = 1.2815515655446004;
    for (r, row) in fed.iter().enumerate().skip(96) {
        let recent = &values[from + r - 96..=from + r];
        let changes: Vec<f64> = recent.windows(2).map(|w| w[1] - w[0]).collect();
        let m = changes.iter().sum::<f64>() / 96.0;
        let sd = (changes.iter().map(|d| (d - m).powi(2)).sum::<f64>() / 96.0).sqrt();
        for k in 1..=3 {
            let q = &streamed[r * 3 + k - 1];
            let want = 2.0 * z90 * sd * (k as f64).sqrt();
            assert!(((q[5] - q[3]) - want).abs() < 1e-9 * want, "row {row}, step {k}: width {} vs {want}", q[5] - q[3]);
            assert!((q[4] - q[2]).abs() < 1e-9 * q[2].abs() && (q[2] - values[from + r]).abs() < 1e-9 * q[2].abs(), "{q:?}");
        }
    }
    for k in [1usize, 96, 97, 98, fed.len()] {
        let prefix = dir.join(format!("walk{k}.csv"));
        std::fs::write(&prefix, format!("date,price\n{}\n", fed[..k].join("\n"))).unwrap();
        let o = run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--data", prefix.to_str().unwrap(), "--dtype", "f64"]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        for (step, p) in parse_rows(&String::from_utf8_lossy(&o.stdout), 1).iter().enumerate() {
            for (a, b) in p.iter().zip(&streamed[(k - 1) * 3 + step][2..]) {
                assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "prefix {k}, step {}: predict {a} vs stream {b}", step + 1);
            }
        }
    }

    let cycles = dir.join("cycles.csv");
    std::fs::write(&cycles, synthetic_csv(1200)).unwrap();
    let o = run(bin().args(["train", "--data", cycles.to_str().unwrap(), "--out", dir.join("cycles").to_str().unwrap()]).args(&settings));
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(!stdout.contains("no skill") && stdout.contains("skill over Repeat on validation: MSE +"), "{stdout}");
    let s = summary(&dir.join("cycles"));
    assert!(s["blend"]["alpha"].as_f64().unwrap() >= 0.5, "{s}");
    assert!(s["test"]["skill"].as_f64().unwrap() > 0.2, "{s}");
    assert!(s["val_seasonal"]["period"] == 24, "{s}");
}

/// `backtest` forecasts strictly out of sample: changing every value from a row inside the second
/// fold on leaves every forecast made before that row as it was, bit for bit (the first fold's
/// and the second fold's earlier ones), while later ones change.
#[test]
fn backtest_never_looks_ahead() {
    let dir = scratch("backtest");
    let text = synthetic_csv(900);
    let (a, b) = (dir.join("a.csv"), dir.join("b.csv"));
    std::fs::write(&a, &text).unwrap();
    // Data row r is line r + 1 after the header; rows from 840 (fold 2 is 800..900) change.
    let changed: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 || i < 841 {
                return l.to_string();
            }
            let mut cells: Vec<String> = l.split(',').map(String::from).collect();
            for c in cells.iter_mut().skip(1) {
                *c = (c.parse::<f64>().unwrap() * 3.0 + 1.0).to_string();
            }
            cells.join(",")
        })
        .collect();
    std::fs::write(&b, changed.join("\n") + "\n").unwrap();
    let forecasts = |data: &Path, out: &str| -> Vec<(usize, usize, String)> {
        let o = run(bin()
            .args(["backtest", "--data", data.to_str().unwrap(), "--out", dir.join(out).to_str().unwrap()])
            .args(TINY)
            .args(["--folds", "2", "--fold-rows", "100", "--epochs", "2", "--batch-size", "16", "--no-repeat-check"]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let csv = std::fs::read_to_string(dir.join(out).join("backtest.csv")).unwrap();
        csv.lines()
            .skip(1)
            .map(|l| {
                let c: Vec<&str> = l.split(',').collect();
                (c[0].parse().unwrap(), c[1].parse().unwrap(), format!("{},{},{}", c[2], c[3], c[5]))
            })
            .collect()
    };
    let (fa, fb) = (forecasts(&a, "a"), forecasts(&b, "b"));
    assert_eq!(fa.len(), fb.len());
    // Origins 799..=898 in fold 2 (from the row before it), 699..=798 in fold 1; three targets,
    // three steps each, the last origins cut where the values run out.
    assert_eq!(fa.iter().filter(|r| r.0 == 1).count(), 100 * 9);
    let (mut same, mut differ) = (0, 0);
    for (x, y) in fa.iter().zip(&fb) {
        assert_eq!((x.0, x.1), (y.0, y.1));
        if x.1 < 840 {
            assert_eq!(x.2, y.2, "fold {}, origin {}: a forecast made before the change moved", x.0, x.1);
            same += 1;
        } else if x.2 != y.2 {
            differ += 1;
        }
    }
    assert!(same > 1000 && differ > 100, "{same} unchanged, {differ} changed: the change did not reach the later forecasts");
    for png in ["backtest_skill.png", "backtest_return.png"] {
        assert!(dir.join("a").join(png).exists(), "{png}");
    }
}

/// With one fold and a checkpoint (no refit), `backtest` gives what `eval` gives on the same
/// rows: the fold's rows and the lookback before them.
#[test]
fn backtest_of_one_fold_without_refit_equals_eval() {
    let dir = scratch("backtest-eval");
    let csv = dir.join("data.csv");
    let text = synthetic_csv(400);
    std::fs::write(&csv, &text).unwrap();
    let o = train_tiny(&dir, &csv, &["--no-repeat-check"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ckpt = dir.join("run").join("best.ckpt");
    let o = run(bin().args([
        "backtest",
        "--data",
        csv.to_str().unwrap(),
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--folds",
        "1",
        "--fold-rows",
        "100",
        "--dtype",
        "f64",
        "--out",
        dir.join("bt").to_str().unwrap(),
    ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bt: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("bt").join("backtest.json")).unwrap()).unwrap();
    // The fold is rows 300..400; its forecasts read from row 300 - L on.
    let lines: Vec<&str> = text.lines().collect();
    let sliced = dir.join("sliced.csv");
    std::fs::write(&sliced, format!("{}\n{}\n", lines[0], lines[1 + 300 - 12..].join("\n"))).unwrap();
    let o = run(bin().args(["eval", "--checkpoint", ckpt.to_str().unwrap(), "--data", sliced.to_str().unwrap(), "--dtype", "f64"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let eval_out = String::from_utf8_lossy(&o.stdout).to_string();
    let eval = eval_out.lines().next().unwrap().to_string();
    // Both report the quantiles beside conformal Repeat (their scales read different histories:
    // the sliced file starts L rows before the fold).
    assert!(eval_out.contains("quantiles beside conformal Repeat"), "{eval_out}");
    for q in [&bt["overall_quantiles"], &bt["folds"][0]["quantiles"]] {
        for who in ["model", "conformal_repeat"] {
            let c = q[who]["intervals"][0]["coverage"].as_f64().unwrap_or(f64::NAN);
            assert!((0.0..=1.0).contains(&c) && q[who]["pinball"].as_f64().unwrap() > 0.0, "{q}");
        }
    }
    let f = |k: &str| bt["overall"][k].as_f64().unwrap();
    let want = format!(
        "{} windows (normalised units): mamba2 MSE {:.6} MAE {:.6}; Repeat MSE {:.6} MAE {:.6}",
        bt["folds"][0]["forecasts"],
        f("mse"),
        f("mae"),
        f("repeat_mse"),
        f("repeat_mae")
    );
    assert_eq!(eval, want);
}

/// A long-format panel of `ids` series in column `a` (the tiny model's one column), hourly,
/// each series with its own start and length, the rows interleaved by date.
fn panel_csv(ids: usize) -> (String, Vec<(String, Vec<String>)>) {
    let mut series = Vec::new();
    for k in 0..ids {
        let (start, len) = (k % 7, 60 + k % 11);
        let rows: Vec<(usize, String)> = (start..start + len)
            .map(|t| {
                let v = (1.0 + 0.1 * k as f64) * ((t as f64 + k as f64) * 0.3).sin() + 0.02 * t as f64;
                (t, format!("{},{v}", crate::common::stamp(1_577_836_800 + 3600 * t as i64)))
            })
            .collect();
        series.push((format!("s{k}"), rows));
    }
    let mut text = String::from("date,id,a\n");
    let end = series.iter().map(|(_, r)| r.last().unwrap().0).max().unwrap();
    for t in 0..=end {
        // A rotating order within each hour: interleaved, not grouped.
        for j in 0..ids {
            let (id, rows) = &series[(j + 3 * t) % ids];
            if let Some((_, line)) = rows.iter().find(|(u, _)| *u == t) {
                let (date, v) = line.split_once(',').unwrap();
                text += &format!("{date},{id},{v}\n");
            }
        }
    }
    let alone = series.into_iter().map(|(id, rows)| (id, rows.into_iter().map(|(_, l)| l).collect())).collect();
    (text, alone)
}

/// `stream --id-column` over `input`, with `extra` flags; stops it after `lines` lines of
/// output with `signal` (9 or 15), or lets it finish. Returns the output lines read after the
/// header, the exit code and stderr.
fn stream_panel(ckpt: &Path, input: &Path, extra: &[&str], stop: Option<(usize, i32)>) -> (Vec<String>, Option<i32>, String) {
    use std::io::{BufRead, Read};
    let mut child = bin()
        .args(["stream", "--checkpoint", ckpt.to_str().unwrap(), "--dtype", "f64", "--id-column", "id"])
        .args(extra)
        .stdin(Stdio::from(std::fs::File::open(input).unwrap()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        lines.push(line.trim_end().to_string());
        line.clear();
        if let Some((n, sig)) = stop {
            if lines.len() == n + 1 {
                // SAFETY: `kill` on the child's pid, which has not been waited for yet.
                assert_eq!(unsafe { libc::kill(child.id() as i32, sig) }, 0);
                break;
            }
        }
    }
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    if !lines.is_empty() {
        assert!(lines[0].starts_with("id,row,step,"), "{}", lines[0]);
        lines.remove(0);
    }
    (lines, status.code(), stderr)
}

#[test]
fn interleaved_ids_stream_as_each_alone_predict_per_id_and_resume_from_a_state_file() {
    let dir = scratch("panel");
    let csv = dir.join("data.csv");
    std::fs::write(&csv, synthetic_csv(400)).unwrap();
    let o = train_tiny(&dir, &csv, &["--no-repeat-check", "--columns", "a"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ckpt = dir.join("run/best.ckpt");
    let (panel, alone) = panel_csv(60);
    let input = dir.join("panel.csv");
    std::fs::write(&input, &panel).unwrap();

    // Interleaved: each id's forecasts are those of streaming its rows alone, bit for bit (the
    // printed shortest digits of each f64).
    let (whole, code, stderr) = stream_panel(&ckpt, &input, &[], None);
    assert_eq!(code, Some(0), "{stderr}");
    let by_key: std::collections::HashMap<String, String> =
        whole.iter().map(|l| (l.splitn(4, ',').take(3).collect::<Vec<_>>().join(","), l.clone())).collect();
    assert_eq!(by_key.len(), whole.len());
    for (id, rows) in alone.iter().step_by(7) {
        let one = dir.join(format!("{id}.csv"));
        std::fs::write(&one, format!("date,a\n{}\n", rows.join("\n"))).unwrap();
        let o =
            run(bin().args(["stream", "--checkpoint", ckpt.to_str().unwrap(), "--dtype", "f64"]).stdin(std::fs::File::open(&one).unwrap()));
        assert!(o.status.success());
        let own: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().skip(1).map(|l| format!("{id},{l}")).collect();
        assert_eq!(own.len(), rows.len() * 3);
        let mine: Vec<&String> = whole.iter().filter(|l| l.starts_with(&format!("{id},"))).collect();
        assert_eq!(mine, own.iter().collect::<Vec<_>>(), "id {id}");
    }

    // `predict --id-column`: each id's forecast after its last row is what the stream printed
    // after that row (f64, 1e-9); `--id` picks one.
    let o = run(bin().args([
        "predict",
        "--checkpoint",
        ckpt.to_str().unwrap(),
        "--dtype",
        "f64",
        "--id-column",
        "id",
        "--data",
        input.to_str().unwrap(),
    ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let predicted: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().skip(1).map(str::to_string).collect();
    assert_eq!(predicted.len(), alone.len() * 3);
    let mut worst = 0.0f64;
    for line in &predicted {
        let (id, rest) = line.split_once(',').unwrap();
        let (step, values) = rest.split_once(',').unwrap();
        let last = alone.iter().find(|(a, _)| a == id).unwrap().1.len();
        let streamed = &by_key[&format!("{id},{last},{step}")];
        let streamed: Vec<f64> = streamed.split(',').skip(3).map(|v| v.parse().unwrap()).collect();
        for (a, b) in values.split(',').map(|v| v.parse::<f64>().unwrap()).zip(&streamed) {
            worst = worst.max((a - b).abs() / b.abs().max(1.0));
        }
    }
    assert!(worst <= 1e-9, "predict --id-column and stream --id-column differ by {worst:e}");
    // The same panel as Parquet (the ids as UTF-8 strings) gives the same forecasts.
    let pq = dir.join("panel.parquet");
    write_parquet(&pq, &panel, ParquetDates::Text);
    let o = run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--dtype", "f64", "--id-column", "id", "--data"]).arg(&pq));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().skip(1).collect::<Vec<_>>(), predicted);
    let o = run(bin()
        .args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--dtype", "f64", "--id-column", "id", "--id", "s17"])
        .arg("--data")
        .arg(&input));
    let one: Vec<String> = String::from_utf8_lossy(&o.stdout).lines().skip(1).map(str::to_string).collect();
    assert_eq!(one, predicted.iter().filter(|l| l.starts_with("s17,")).cloned().collect::<Vec<_>>());
    for (args, says) in [
        (vec!["--id-column", "id", "--id", "nobody"], "--id nobody: no row of "),
        (vec!["--id", "s17"], "--id s17 picks one series of a long-format file: name its id column with --id-column"),
        (vec!["--id-column", "name"], "no id column `name` (columns: date, id, a)"),
    ] {
        let o =
            run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--dtype", "f64"]).args(&args).arg("--data").arg(&input));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!((o.status.code(), stderr.trim_end().lines().count()), (Some(1), 1), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
    let empty_id = dir.join("empty_id.csv");
    std::fs::write(&empty_id, "date,id,a\n2020-01-01 00:00:00,x,1.5\n2020-01-01 01:00:00,,1.5\n").unwrap();
    for (cmd, says) in [
        ("predict", "empty_id.csv: line 3, column `id`: no id"),
        ("eval", "eval takes no --id-column: a model trained on a long-format panel reads it"),
    ] {
        let o = run(bin().args([cmd, "--checkpoint", ckpt.to_str().unwrap(), "--id-column", "id", "--data"]).arg(&empty_id));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert_eq!((o.status.code(), stderr.trim_end().lines().count()), (Some(1), 1), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }

    // Killed with SIGKILL at three points, each restart fed the whole input again: every line
    // printed after a restart is the uninterrupted run's.
    let state = dir.join("state.bin");
    let flags = ["--state", state.to_str().unwrap(), "--state-every", "97"];
    let mut printed = 0;
    for (n, sig) in [(600, 9), (1500, 9), (400, 15), (900, 9)] {
        let (lines, code, stderr) = stream_panel(&ckpt, &input, &flags, Some((n, sig)));
        assert_eq!(lines.len(), n, "{stderr}");
        if sig == 15 {
            // SIGTERM: the states as they stood after the last whole row, saved, and a clean exit.
            assert_eq!(code, Some(0), "{stderr}");
            assert!(stderr.contains("series saved on signal"), "{stderr}");
        }
        for l in &lines {
            let key = l.splitn(4, ',').take(3).collect::<Vec<_>>().join(",");
            assert_eq!(by_key.get(&key), Some(l), "after a restart");
        }
        if printed > 0 {
            // It continued from the saved rows: the feed's first rows (each id's first) are
            // skipped, not forecast again.
            assert!(stderr.contains(" series restored"), "{stderr}");
            let row: usize = lines[0].split(',').nth(1).unwrap().parse().unwrap();
            assert!(row > 1, "a restarted run began again at {}", lines[0]);
        }
        printed += lines.len();
    }
    let (lines, code, stderr) = stream_panel(&ckpt, &input, &flags, None);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("rows dated at or before their series' last row"), "{stderr}");
    for l in &lines {
        let key = l.splitn(4, ',').take(3).collect::<Vec<_>>().join(",");
        assert_eq!(by_key.get(&key), Some(l), "after the last restart");
    }
    assert!(printed > 0 && lines.last() == whole.last(), "the last run ends where the uninterrupted one does");
    // A save cut by SIGKILL leaves its temporary file; the next start removes it.
    assert!(walk(&dir).iter().all(|p| !p.to_string_lossy().contains("state.bin.tmp")), "a temporary state file left");

    // A damaged or foreign state file: one line, exit 1, and the file is left as it was.
    let good = std::fs::read(&state).unwrap();
    let mut damaged = good.clone();
    let at = damaged.len() - 5;
    damaged[at] ^= 0x10;
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let o = train_tiny(&other, &csv, &["--no-repeat-check", "--columns", "a", "--seed", "7"]);
    assert!(o.status.success());
    let foreign_state = other.join("state.bin");
    let (_, code, _) = stream_panel(&other.join("run/best.ckpt"), &input, &["--state", foreign_state.to_str().unwrap()], None);
    assert_eq!(code, Some(0));
    let foreign = std::fs::read(&foreign_state).unwrap();
    for (bytes, says) in [(damaged, "checksum does not match"), (foreign, "saved by another model"), (good[..20].to_vec(), "")] {
        std::fs::write(&state, &bytes).unwrap();
        let (_, code, stderr) = stream_panel(&ckpt, &input, &flags, None);
        assert_eq!((code, stderr.trim_end().lines().count()), (Some(1), 1), "{stderr}");
        assert!(stderr.starts_with("error: state file ") && stderr.contains(says), "{stderr}");
        assert_eq!(std::fs::read(&state).unwrap(), bytes, "the file was overwritten");
    }

    // An input without the id column, or a row without an id: one line naming it.
    std::fs::write(&input, panel.replacen("date,id,a", "date,name,a", 1)).unwrap();
    let (_, code, stderr) = stream_panel(&ckpt, &input, &[], None);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no column `id` (--id-column) in the header (date,name,a)"), "{stderr}");
    std::fs::write(&input, "date,id,a\n2020-01-01 00:00:00,,1.5\n").unwrap();
    let (_, code, stderr) = stream_panel(&ckpt, &input, &[], None);
    assert_eq!((code, stderr.trim_end().lines().count()), (Some(1), 1), "{stderr}");
    assert!(stderr.contains("stdin line 2: no id in column `id`"), "{stderr}");
    // A state file that cannot be written stops the stream before its first row.
    let (lines, code, stderr) = stream_panel(&ckpt, &input, &["--state", "/nonexistent/dir/s.bin"], None);
    assert_eq!((code, lines.len()), (Some(1), 0), "{stderr}");
    assert!(stderr.contains("cannot save the stream state: /nonexistent/dir/s.bin: No such file"), "{stderr}");
    let (_, code, stderr) = stream_panel(&ckpt, &input, &["--state-every", "0"], None);
    assert_eq!((code, stderr.trim_end().lines().count()), (Some(2), 1), "{stderr}");
    assert!(stderr.contains("a state is saved at least every row"), "{stderr}");
}

/// Every float parameter of the checkpoint at `path`, in visiting order.
fn parameters(path: &Path) -> Vec<f64> {
    use burn::backend::NdArray;
    use mamba2_forecast::{Forecaster, ForecasterConfig};
    struct Values(Vec<f64>);
    impl<B: burn::prelude::Backend> burn::module::ModuleVisitor<B> for Values {
        fn visit_float<const D: usize>(&mut self, p: &burn::module::Param<burn::prelude::Tensor<B, D>>) {
            self.0.extend(mamba2_tensor::compare::to_f64_vec(p.val()));
        }
    }
    let loaded =
        mamba2_model::load_checkpoint::<NdArray<f64>, Forecaster<NdArray<f64>>, ForecasterConfig>(path, &Default::default(), |c, d| {
            c.init(d)
        })
        .unwrap();
    let mut v = Values(Vec::new());
    burn::module::Module::visit(&loaded.module, &mut v);
    v.0
}

/// ETTh1 rewritten in long format (an id column naming each of its 7 columns, one value column,
/// dates newest first) trains the same model as the wide file: every parameter within 1e-12,
/// the same epochs and the same test figures, per series too; `eval` of each on its own file
/// prints the same figures.
#[test]
fn etth1_in_long_format_trains_the_same_model_as_the_wide_file() {
    let dir = scratch("long-etth1");
    let wide_text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/ett/ETTh1.csv")).unwrap();
    let mut lines = wide_text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let mut long = String::from("date,id,value\n");
    let rows: Vec<&str> = lines.collect();
    for line in rows.iter().rev() {
        let cells: Vec<&str> = line.split(',').collect();
        for (name, v) in header[1..].iter().zip(&cells[1..]) {
            long += &format!("{},{name},{v}\n", cells[0]);
        }
    }
    let (wide, longf) = (dir.join("wide.csv"), dir.join("long.csv"));
    std::fs::write(&wide, &wide_text).unwrap();
    std::fs::write(&longf, &long).unwrap();
    let small = [
        "--lookback",
        "24",
        "--horizon",
        "12",
        "--d-model",
        "8",
        "--d-state",
        "4",
        "--headdim",
        "4",
        "--chunk-size",
        "8",
        "--dtype",
        "f64",
        "--epochs",
        "2",
        "--stride",
        "64",
        "--borders",
        "8640,11520,14400",
    ];
    let train = |data: &Path, out: &str, extra: &[&str]| {
        let o = run(bin().arg("train").arg("--data").arg(data).arg("--out").arg(dir.join(out)).args(small).args(extra));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    train(&wide, "wide", &[]);
    let printed = train(&longf, "long", &["--id-column", "id"]);
    assert!(
        printed.contains("long format, 7 series (ids in column `id`: HUFL, HULL, MUFL, MULL, LUFL, LULL, OT), values `value`"),
        "{printed}"
    );
    for file in ["best.ckpt", "last.ckpt"] {
        let (a, b) = (parameters(&dir.join("wide").join(file)), parameters(&dir.join("long").join(file)));
        assert_eq!(a.len(), b.len());
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst <= 1e-12, "{file}: parameters differ by up to {worst:e}");
    }
    assert_eq!(epoch_figures(&dir.join("wide")), epoch_figures(&dir.join("long")));
    let (sw, sl) = (summary(&dir.join("wide")), summary(&dir.join("long")));
    for key in ["test_mse", "test_mae", "repeat_mse", "test", "test_per_step", "test_per_column", "test_quantiles", "val_mse", "blend"] {
        assert_eq!(sw[key], sl[key], "summary.json's `{key}`");
    }
    assert_eq!(sl["test_per_column"].as_array().unwrap().len(), 7);
    let eval = |ckpt: &str, data: &Path| {
        let o = run(bin().args(["eval", "--dtype", "f64", "--checkpoint"]).arg(dir.join(ckpt).join("best.ckpt")).arg("--data").arg(data));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert_eq!(eval("wide", &wide), eval("long", &longf));
}

/// A panel whose series start, stop and pause at their own dates: `train --id-column` fits
/// each series' scale on its own training values and uses a window for a series only where the
/// series has every value of it. `eval` of the model's Repeat baseline on the file equals the
/// same figure computed here from the CSV alone; a series with no test window says so.
#[test]
fn a_panel_of_series_with_their_own_spans_trains_and_scores_each_on_its_own_windows() {
    let dir = scratch("ragged");
    // id, first and last hour (inclusive), and a gap of hours without a row.
    type Span = (&'static str, usize, usize, Option<(usize, usize)>);
    let spans: [Span; 5] =
        [("a", 0, 599, None), ("b", 100, 699, None), ("c", 0, 699, Some((300, 340))), ("d", 200, 480, None), ("e", 0, 699, None)];
    let value = |k: usize, t: usize| (1.0 + 0.3 * k as f64) * ((t as f64 + 5.0 * k as f64) * 0.26).sin() + 0.01 * t as f64 + 3.0 * k as f64;
    let has = |k: usize, t: usize| {
        let (_, a, b, gap) = spans[k];
        a <= t && t <= b && !gap.is_some_and(|(g0, g1)| g0 <= t && t < g1)
    };
    let mut text = String::from("id,date,y\n");
    for t in 0..700 {
        for j in 0..5 {
            let k = (j + t) % 5;
            if has(k, t) {
                text += &format!("{},{},{}\n", spans[k].0, crate::common::stamp(1_577_836_800 + 3600 * t as i64), value(k, t));
            }
        }
    }
    let panel = dir.join("panel.csv");
    std::fs::write(&panel, &text).unwrap();
    let o = run(bin().arg("train").arg("--data").arg(&panel).args(["--id-column", "id", "--out"]).arg(dir.join("run")).args(TINY).args([
        "--epochs",
        "1",
        "--batch-size",
        "16",
    ]));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("long format, 5 series (ids in column `id`: a, c, e, b, d), values `y`, on 700 dates"), "{stdout}");
    // --targets picks ids; the others are left out.
    let two = run(bin()
        .arg("train")
        .arg("--data")
        .arg(&panel)
        .args(["--id-column", "id", "--targets", "e,a", "--out"])
        .arg(dir.join("two"))
        .args(TINY)
        .args(["--epochs", "1"]));
    assert!(two.status.success(), "{}", String::from_utf8_lossy(&two.stderr));
    assert!(String::from_utf8_lossy(&two.stdout).contains("long format, 2 series (ids in column `id`: e, a)"));
    // d ends at hour 480, before the validation split (the default 0.7: hour 490).
    assert!(stdout.contains("  d              no test window: it lacks values there"), "{stdout}");
    let s = summary(&dir.join("run"));
    let per: Vec<u64> = s["test_per_column"].as_array().unwrap().iter().map(|c| c["windows"].as_u64().unwrap()).collect();
    // The ids in order of first appearance (b and d start later). The test split is hours
    // 560 - L..700: windows of L 12 + H 3 rows start at 548..=685, and the first 128 of them
    // (whole batches of 32) are scored: a's until its last hour 599 (starts 548..=585), c's,
    // e's and b's all; d ends at 480.
    assert_eq!(per, [585 - 548 + 1, 128, 128, 128, 0]);

    // Repeat's error over every window of the file, each series scaled by the mean and
    // standard deviation of its own values in the first 490 hours.
    let (l, h) = (12, 3);
    let (mut se, mut n) = (0.0, 0usize);
    for k in 0..5 {
        let train: Vec<f64> = (0..490).filter(|&t| has(k, t)).map(|t| value(k, t)).collect();
        let mean = train.iter().sum::<f64>() / train.len() as f64;
        let sd = (train.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / train.len() as f64).sqrt();
        for s in 0..=700 - l - h {
            if (s..s + l + h).all(|t| has(k, t)) {
                let last = value(k, s + l - 1);
                for t in s + l..s + l + h {
                    se += ((value(k, t) - last) / sd).powi(2);
                    n += 1;
                }
            }
        }
    }
    let by_hand = se / n as f64;
    let e = run(bin().args(["eval", "--dtype", "f64", "--checkpoint"]).arg(dir.join("run/best.ckpt")).arg("--data").arg(&panel));
    assert!(e.status.success(), "{}", String::from_utf8_lossy(&e.stderr));
    let out = String::from_utf8_lossy(&e.stdout);
    let repeat: f64 = out.split("Repeat MSE ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!((repeat - by_hand).abs() <= 1e-5 * by_hand, "eval's Repeat MSE {repeat}, by hand {by_hand}: {out}");

    // predict: each id after its own last row. stream of the interleaved file: the same after
    // each id's last row (f64, 1e-9); killed (SIGKILL) mid-feed and restarted from its state
    // file, it prints what the uninterrupted run prints for every row after the last save.
    let ckpt = dir.join("run/best.ckpt");
    let p = run(bin().args(["predict", "--dtype", "f64", "--checkpoint"]).arg(&ckpt).arg("--data").arg(&panel));
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    let predicted = String::from_utf8_lossy(&p.stdout).into_owned();
    assert!(predicted.starts_with("id,step,y,y_q10,y_q50,y_q90\n"), "{predicted}");
    let (all, code, err) = stream_panel(&ckpt, &panel, &[], None);
    assert_eq!(code, Some(0), "{err}");
    let mut compared = 0;
    for line in predicted.lines().skip(1) {
        let (id, rest) = line.split_once(',').unwrap();
        let (step, values) = rest.split_once(',').unwrap();
        let last_row = all.iter().rfind(|l| l.starts_with(&format!("{id},"))).unwrap().split(',').nth(1).unwrap();
        let streamed = all.iter().find(|l| l.starts_with(&format!("{id},{last_row},{step},"))).unwrap();
        let streamed: Vec<f64> = streamed.split(',').skip(3).map(|v| v.parse().unwrap()).collect();
        let values: Vec<f64> = values.split(',').map(|v| v.parse().unwrap()).collect();
        assert_eq!(values.len(), 4);
        for (a, b) in values.iter().zip(&streamed) {
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{id} step {step}: predict {a}, stream {b}");
        }
        compared += 1;
    }
    assert_eq!(compared, 5 * 3);
    let state = dir.join("state.bin");
    let with_state = ["--state", state.to_str().unwrap(), "--state-every", "200"];
    let (first, code, _) = stream_panel(&ckpt, &panel, &with_state, Some((1500, 9)));
    assert_eq!((code, first.len()), (None, 1500));
    let (rest, code, err) = stream_panel(&ckpt, &panel, &with_state, None);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("series restored") && err.contains("dated at or before their series' last row"), "{err}");
    assert!(!rest.is_empty() && rest.len() < all.len());
    assert_eq!(rest[..], all[all.len() - rest.len()..], "the restarted stream differs from the uninterrupted one");
    let e = stream_panel(&ckpt, &write_unknown(&dir), &[], None);
    assert!(e.2.contains("stdin line 2: id `zz` is not one of the 5 series the model was trained on"), "{}", e.2);

    // Malformed panels and flags: one line each.
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let no_date = write("nodate.csv", "id,y\na,1\na,2\n");
    let two = write("two.csv", "id,date,y,z\na,2024-01-01 00:00,1,2\n");
    let twice = write("twice.csv", "id,date,y\na,2024-01-01 00:00,1\nb,2024-01-01 00:00,1\na,2024-01-01 00:00,3\n");
    let without_e: String = text.lines().filter(|l| !l.starts_with("e,")).map(|l| format!("{l}\n")).collect();
    let without_e = write("without_e.csv", &without_e);
    // Two ids taking turns, hour by hour: neither has two consecutive dates of the panel.
    let turns: String = std::iter::once("id,date,y\n".to_string())
        .chain((0..300).map(|t| format!("{},{},{}\n", ["a", "b"][t % 2], crate::common::stamp(1_577_836_800 + 3600 * t as i64), t % 7)))
        .collect();
    let turns = write("turns.csv", &turns);
    let p = panel.to_str().unwrap();
    let ckpt = ckpt.to_str().unwrap();
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["train", "--id-column", "id", "--data", no_date.to_str().unwrap()], "long format needs a date column".into()),
        (vec!["train", "--id-column", "id", "--data", two.to_str().unwrap()], "this file has 2 (y, z); pick it with --columns".into()),
        (
            vec!["train", "--id-column", "id", "--data", twice.to_str().unwrap()],
            "data row 3: id `a` has a second row at the same date".into(),
        ),
        (
            vec!["train", "--id-column", "id", "--data", turns.to_str().unwrap(), "--lookback", "12", "--horizon", "3"],
            "train split: no series has all 15 values (lookback 12 + horizon 3) of any window in this split".into(),
        ),
        (vec!["train", "--id-column", "id", "--data", p, "--mix"], "--mix with --id-column".into()),
        (vec!["train", "--id-column", "id"], "give a long-format file with --data".into()),
        (vec!["train", "--id-column", "name", "--data", p], "no id column `name`".into()),
        (
            vec!["train", "--id-column", "id", "--data", p, "--targets", "a,zz"],
            "--targets of a panel name its ids (column `id`): columns: unknown column `zz`".into(),
        ),
        (vec!["backtest", "--id-column", "id", "--data", p], "backtest reads one wide table for now".into()),
        (
            vec!["eval", "--checkpoint", ckpt, "--data", without_e.to_str().unwrap()],
            "the model's series `e` has no row in column `id` (1 of its 5 series missing)".into(),
        ),
        (vec!["eval", "--checkpoint", ckpt, "--data", p, "--continuous-from", "500"], "--continuous-from streams one table".into()),
        (
            vec!["predict", "--checkpoint", ckpt, "--data", p, "--id-column", "name"],
            "--id-column name: the model was trained on a panel with ids in column `id`".into(),
        ),
        (vec!["predict", "--checkpoint", ckpt, "--data", p, "--id", "zz"], "--id zz: no row of".into()),
    ];
    for (args, want) in cases {
        let o = run(bin().args(&args));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(&want) && err.trim().lines().count() == 1, "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?} printed before its refusal: {}", String::from_utf8_lossy(&o.stdout));
    }
}

/// A panel file whose one row is of an id no model here was trained on.
fn write_unknown(dir: &Path) -> PathBuf {
    let p = dir.join("unknown.csv");
    std::fs::write(&p, format!("id,date,y\nzz,{},3\n", crate::common::stamp(1_577_836_800))).unwrap();
    p
}

/// `rows` hourly rows of `date,x,y`: `x` a noisy AR(1) input that the past does not foretell,
/// `y` a daily cycle plus 1.5 `x` at the same hour, so that only the known `x` ahead tells `y`
/// ahead.
fn future_csv(rows: usize) -> Vec<String> {
    let mut uniform = uniform_from(7u64);
    let mut x = 0.0;
    let mut lines = vec!["date,x,y".to_string()];
    for t in 0..rows {
        x = 0.6 * x + uniform() * 2.0;
        let y = 1.5 * x + 0.5 * (std::f64::consts::TAU * t as f64 / 24.0).sin() + 0.05 * uniform();
        lines.push(format!("{},{x},{y}", crate::common::stamp(1_577_836_800 + 3600 * t as i64)));
    }
    lines
}

/// The line of a row ahead: its date and its `x`, the target `y` empty.
fn ahead_line(line: &str) -> String {
    let cells: Vec<&str> = line.split(',').collect();
    format!("{},{},", cells[0], cells[1])
}

/// Trains the tiny model on `csv` for 8 epochs (seed 1, as trained: no Repeat check) with
/// `common` and each call's flags into `dir/<name>`; returns what the run printed.
fn trainer<'a>(dir: &'a Path, csv: &'a Path, common: &'a [&'a str]) -> impl Fn(&str, &[&str]) -> String + 'a {
    move |name: &str, extra: &[&str]| {
        let o = run(bin()
            .args(["train", "--data", csv.to_str().unwrap(), "--out", dir.join(name).to_str().unwrap()])
            .args(["--epochs", "8", "--batch-size", "16", "--seed", "1", "--no-repeat-check"])
            .args(TINY)
            .args(common)
            .args(extra));
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).to_string()
    }
}

fn stream_lines(ckpt: &Path, lines: &[String], extra: &[&str]) -> Output {
    let mut child = bin()
        .args(["stream", "--checkpoint", ckpt.to_str().unwrap(), "--dtype", "f64"])
        .args(extra)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Fed from a thread: a long feed's forecasts fill the output pipe before the input ends.
    let mut stdin = child.stdin.take().unwrap();
    let text = lines.join("\n") + "\n";
    let feeder = std::thread::spawn(move || {
        use std::io::Write;
        // A stream that stops early (an error) closes its input: that is its answer, not ours.
        let _ = stdin.write_all(text.as_bytes());
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    out
}

/// A target that follows an input known ahead: read as a future covariate it halves the test
/// MSE (and more) of the same model reading it as a past covariate; `stream`, given the rows
/// ahead before the rows they follow, prints what `predict` prints for a file that ends with
/// them (f64, 1e-9), also across a restart from `--state`; malformed uses fail with one line.
#[test]
fn a_future_covariate_is_read_at_the_rows_forecast_and_streams_as_predict() {
    let dir = scratch("future");
    let lines = future_csv(1500);
    let csv = dir.join("data.csv");
    std::fs::write(&csv, lines.join("\n") + "\n").unwrap();
    let train = trainer(&dir, &csv, &[]);
    let out = train("future", &["--future-columns", "x"]);
    assert!(out.contains("1 predicted series") && out.contains("1 covariates (1 known ahead: x)"), "{out}");
    train("past", &["--targets", "y"]);
    let mse = |name: &str| summary(&dir.join(name))["test"]["mse"].as_f64().unwrap();
    let (with, without) = (mse("future"), mse("past"));
    println!("test MSE with x ahead {with:.4}, with x as a past covariate {without:.4}");
    assert!(with < 0.5 * without, "test MSE with x ahead {with}, without {without}");

    // Stream 120 test rows, each row's x announced 3 rows (H) before the row itself.
    let ckpt = dir.join("future/best.ckpt");
    let (h, first, n) = (3, 1200, 120);
    let rows = &lines[1 + first..];
    let mut feed = vec![lines[0].clone()];
    feed.extend(rows[1..=h].iter().map(|l| ahead_line(l)));
    for t in 0..n {
        feed.push(rows[t].clone());
        feed.push(ahead_line(&rows[t + 1 + h]));
    }
    let o = stream_lines(&ckpt, &feed, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(text.starts_with("row,step,y,y_q10,y_q50,y_q90\n"), "{text}");
    let streamed = parse_rows(&text, 0);
    assert_eq!(streamed.len(), n * h);
    for k in [1usize, 40, n] {
        let file = dir.join(format!("prefix{k}.csv"));
        let ahead: Vec<String> = rows[k..k + h].iter().map(|l| ahead_line(l)).collect();
        std::fs::write(&file, format!("{}\n{}\n{}\n", lines[0], rows[..k].join("\n"), ahead.join("\n"))).unwrap();
        let o = run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--data", file.to_str().unwrap(), "--dtype", "f64"]));
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let predicted = parse_rows(&String::from_utf8_lossy(&o.stdout), 1);
        assert_eq!(predicted.len(), h);
        for (step, p) in predicted.iter().enumerate() {
            let s = &streamed[(k - 1) * h + step];
            assert_eq!((s[0] as usize, s[1] as usize), (k, step + 1));
            for (a, b) in p.iter().zip(&s[2..]) {
                assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "row {k}, step {}: predict {a}, stream {b}", step + 1);
            }
        }
    }
    // Stopped after 100 lines of the feed and restarted from the state file with the rest, the
    // stream prints what it printed in one go: the rows announced ahead were kept.
    let state = dir.join("state.bin");
    let state_arg = ["--state", state.to_str().unwrap()];
    let one = stream_lines(&ckpt, &feed[..100], &state_arg);
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    let rest: Vec<String> = [lines[0].clone()].into_iter().chain(feed[100..].iter().cloned()).collect();
    let two = stream_lines(&ckpt, &rest, &state_arg);
    assert!(two.status.success(), "{}", String::from_utf8_lossy(&two.stderr));
    let joined = String::from_utf8_lossy(&one.stdout).to_string()
        + String::from_utf8_lossy(&two.stdout).lines().skip(1).map(|l| format!("{l}\n")).collect::<String>().as_str();
    assert_eq!(joined, text, "the restarted stream differs");

    // Malformed uses: one line each, nothing printed before.
    let (c, d) = (ckpt.to_str().unwrap(), csv.to_str().unwrap());
    let short = dir.join("short.csv");
    std::fs::write(&short, format!("{}\n{}\n{}\n", lines[0], rows[..10].join("\n"), ahead_line(&rows[10]))).unwrap();
    let late = dir.join("late.csv");
    std::fs::write(&late, format!("{}\n{}\n{}\n{}\n", lines[0], rows[..10].join("\n"), ahead_line(&rows[10]), rows[11])).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["train", "--data", d, "--future-columns", "zz"], "--future-columns zz: no such column (columns: x, y)"),
        (vec!["train", "--data", d, "--future-columns", "x", "--targets", "x,y"], "--future-columns x: the column is also a target"),
        (vec!["train", "--data", d, "--future-columns", "x,y"], "--future-columns x,y: every column is a future covariate"),
        (vec!["predict", "--checkpoint", c, "--data", short.to_str().unwrap()], "the file ends with 1 rows ahead"),
        (vec!["predict", "--checkpoint", c, "--data", late.to_str().unwrap()], "a row with values after the rows ahead"),
        (vec!["predict", "--checkpoint", c, "--data", d], "the file ends with 0 rows ahead"),
    ];
    for (args, want) in cases {
        let o = run(bin().args(&args).args(["--out", dir.join("bad").to_str().unwrap()].iter().filter(|_| args[0] == "train")));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want) && err.trim().lines().count() == 1, "{args:?}: {err}");
        assert!(o.stdout.is_empty(), "{args:?} printed before its refusal");
    }
    // A stream row whose rows ahead were not announced, and one without a date column.
    let o = stream_lines(&ckpt, &[lines[0].clone(), rows[0].clone()], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("stdin line 2: the model reads the future covariates (x) at the 3 rows after this one; 0 rows ahead"), "{err}");
    // Without a calendar a stream's clock can be row counts, but rows ahead need dates.
    train("nocal", &["--future-columns", "x", "--no-calendar"]);
    let undated: Vec<String> = ["x,y".to_string(), "0.5,1".into()].into();
    let o = stream_lines(&dir.join("nocal/best.ckpt"), &undated, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.code() == Some(1) && err.contains("give a date column"), "{err}");
}

/// `dates` hourly dates of a long-format panel `id,date,y,x`: three ids (`c` from date 200 on),
/// each with its own unforeseeable input `x` that its `y` follows at the same hour.
fn future_panel(dates: usize) -> Vec<(String, String, f64, f64)> {
    let mut uniform = uniform_from(11u64);
    let mut x = [0.0; 3];
    let mut rows = Vec::new();
    for t in 0..dates {
        for (k, id) in ["a", "b", "c"].into_iter().enumerate() {
            if id == "c" && t < 200 {
                continue;
            }
            x[k] = 0.6 * x[k] + uniform() * 2.0;
            let y = (1.0 + 0.5 * k as f64) * x[k]
                + 0.5 * (std::f64::consts::TAU * (t + 5 * k) as f64 / 24.0).sin()
                + 0.05 * uniform()
                + k as f64;
            rows.push((id.to_string(), crate::common::stamp(1_577_836_800 + 3600 * t as i64), y, x[k]));
        }
    }
    rows
}

/// A long-format panel whose ids each have their own input known ahead: with `--future-columns`
/// each series reads its own id's values ahead, and the test MSE is below half of the same
/// panel without them; `stream` with each id's rows announced ahead = `predict` of a file ending
/// in each id's rows ahead (f64, 1e-9); an id short of rows ahead is a one-line error.
#[test]
fn a_panel_whose_ids_have_their_own_inputs_known_ahead() {
    let dir = scratch("panel-future");
    let rows = future_panel(1200);
    let line = |r: &(String, String, f64, f64)| format!("{},{},{},{}", r.0, r.1, r.2, r.3);
    let ahead = |r: &(String, String, f64, f64)| format!("{},{},,{}", r.0, r.1, r.3);
    let csv = dir.join("panel.csv");
    std::fs::write(&csv, format!("id,date,y,x\n{}\n", rows.iter().map(line).collect::<Vec<_>>().join("\n"))).unwrap();
    let train = trainer(&dir, &csv, &["--id-column", "id"]);
    let out = train("future", &["--future-columns", "x"]);
    assert!(out.contains("3 series (ids in column `id`: a, b, c), values `y`, each id with its own `x` known ahead"), "{out}");
    train("past", &["--columns", "y"]);
    let mse = |name: &str| summary(&dir.join(name))["test"]["mse"].as_f64().unwrap();
    let (with, without) = (mse("future"), mse("past"));
    println!("panel test MSE with each id's x ahead {with:.4}, without x {without:.4}");
    // The seasonal naive forecast on the same test windows, recorded beside Repeat.
    let seasonal = &summary(&dir.join("future"))["test_seasonal"];
    assert_eq!(seasonal["period"], 24, "{seasonal}");
    assert!(seasonal["mse"].as_f64().unwrap() > 2.0 * with, "{seasonal}");
    assert!(with < 0.5 * without, "test MSE with x ahead {with}, without {without}");

    // Stream the first 300 dates, each id's row announced 3 rows (H) before the row itself.
    let ckpt = dir.join("future/best.ckpt");
    let h = 3;
    let by_id = |id: &str| rows.iter().filter(|r| r.0 == id).collect::<Vec<_>>();
    let ids = ["a", "b", "c"];
    let own: Vec<Vec<&(String, String, f64, f64)>> = ids.iter().map(|i| by_id(i)).collect();
    let pushed = [300, 300, 100];
    let mut feed = vec!["id,date,y,x".to_string()];
    for rows_of in &own {
        feed.extend(rows_of[1..=h].iter().map(|r| ahead(r)));
    }
    for n in 0..300 {
        for k in 0..3 {
            if n < pushed[k] {
                feed.push(line(own[k][n]));
                feed.push(ahead(own[k][n + 1 + h]));
            }
        }
    }
    let o = stream_lines(&ckpt, &feed, &["--id-column", "id"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(text.starts_with("id,row,step,y,y_q10,y_q50,y_q90\n"), "{text}");
    // Predict from a file of the same rows, each id's next 3 rows ahead after them.
    let mut file: Vec<String> = Vec::new();
    for k in 0..3 {
        file.extend(own[k][..pushed[k]].iter().map(|r| line(r)));
        file.extend(own[k][pushed[k]..pushed[k] + h].iter().map(|r| ahead(r)));
    }
    let pf = dir.join("predict.csv");
    std::fs::write(&pf, format!("id,date,y,x\n{}\n", file.join("\n"))).unwrap();
    let o = run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--data", pf.to_str().unwrap(), "--dtype", "f64"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let predicted = String::from_utf8_lossy(&o.stdout).to_string();
    let mut compared = 0;
    for p in predicted.lines().skip(1) {
        let cells: Vec<&str> = p.split(',').collect();
        let k = ids.iter().position(|i| *i == cells[0]).unwrap();
        let prefix = format!("{},{},{},", cells[0], pushed[k], cells[1]);
        let s = text.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no streamed line {prefix}"));
        for (a, b) in cells[2..].iter().zip(s.split(',').skip(3)) {
            let (a, b): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{p}: predict {a}, stream {b}");
        }
        compared += 1;
    }
    assert_eq!(compared, 3 * h);
    // An id with too few rows ahead.
    let short = dir.join("short.csv");
    std::fs::write(&short, format!("id,date,y,x\n{}\n", file[..file.len() - 1].join("\n"))).unwrap();
    let o = run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--data", short.to_str().unwrap()]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("id c: the model reads the id's covariates known ahead (x) at the 3 rows it forecasts; the id has 2 rows ahead"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A row ahead of id `a` (its value empty) dated before its last value.
    let mut early = file.clone();
    early[5] = ahead(own[0][5]);
    let bad = dir.join("early.csv");
    std::fs::write(&bad, format!("id,date,y,x\n{}\n", early.join("\n"))).unwrap();
    let o = run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--data", bad.to_str().unwrap()]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("id `a` has a row ahead (its value empty) dated before its last value"), "{err}");
    assert!(o.stdout.is_empty() && err.trim().lines().count() == 1, "{err}");
}

/// A long-format panel whose ids each have a covariate of their own that is not known ahead
/// (`--columns y,v`: the value, then the covariate): `y` follows its id's `v` an hour later,
/// so the covariate read at each row more than halves the first step's test MSE; `predict`
/// (no rows ahead needed) = `stream --id-column` after each id's last row (f64, 1e-9).
#[test]
fn a_panel_whose_ids_have_their_own_past_covariates() {
    let dir = scratch("panel-past");
    let mut uniform = uniform_from(5u64);
    let mut lines = vec!["id,date,y,v".to_string()];
    for (k, id) in ["a", "b", "c"].into_iter().enumerate() {
        let mut before = 0.0;
        for t in 0..1200 {
            let v = uniform() * 2.0;
            let y = 1.5 * before + 0.5 * (std::f64::consts::TAU * (t + 5 * k) as f64 / 24.0).sin() + 0.05 * uniform() + k as f64;
            before = v;
            lines.push(format!("{id},{},{y},{v}", crate::common::stamp(1_577_836_800 + 3600 * t as i64)));
        }
    }
    let csv = dir.join("lag.csv");
    std::fs::write(&csv, lines.join("\n") + "\n").unwrap();
    let train = trainer(&dir, &csv, &["--id-column", "id"]);
    let out = train("own", &["--columns", "y,v"]);
    assert!(out.contains("values `y`, each id with its own `v`, on 1200 dates"), "{out}");
    train("none", &["--columns", "y"]);
    let step1 = |name: &str| summary(&dir.join(name))["test_per_step"][0]["mse"].as_f64().unwrap();
    let (with, without) = (step1("own"), step1("none"));
    println!("first step's test MSE with each id's v {with:.4}, without {without:.4}");
    assert!(with < 0.5 * without, "first step's test MSE with v {with}, without {without}");

    let ckpt = dir.join("own/best.ckpt");
    assert_panel_predict_is_stream(&ckpt, &csv, &lines, 3, 1200);
}

/// `train --static-data`: each id's row of a static table (a category and a number) becomes
/// inputs of every row of that id, kept in the checkpoint: the run says so, `predict` and
/// `stream --id-column` need no table and agree per id (f64, 1e-9); a table without a row for
/// an id, with an empty cell, or missing is a one-line error before any work.
#[test]
fn a_panel_reads_each_ids_static_covariates() {
    let dir = scratch("panel-static");
    let mut uniform = uniform_from(9u64);
    let ids: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
    let mut lines = vec!["id,date,y,v".to_string()];
    for (k, id) in ids.iter().enumerate() {
        // The sector's sign decides how `y` follows the id's `v` an hour later.
        let gain = if k % 2 == 0 { 1.5 } else { -1.5 };
        let mut before = 0.0;
        for t in 0..600 {
            let v = uniform() * 2.0;
            let y = gain * before + 0.5 * (std::f64::consts::TAU * (t + 3 * k) as f64 / 24.0).sin() + 0.05 * uniform();
            before = v;
            lines.push(format!("{id},{},{y},{v}", crate::common::stamp(1_577_836_800 + 3600 * t as i64)));
        }
    }
    let csv = dir.join("panel.csv");
    std::fs::write(&csv, lines.join("\n") + "\n").unwrap();
    let statics = dir.join("statics.csv");
    let table: Vec<String> =
        ids.iter().enumerate().map(|(k, id)| format!("{id},{},{}", if k % 2 == 0 { "up" } else { "down" }, 10 + k)).collect();
    std::fs::write(&statics, format!("id,sector,size\n{}\n", table.join("\n"))).unwrap();
    let train = trainer(&dir, &csv, &["--id-column", "id", "--columns", "y,v"]);
    let out = train("static", &["--static-data", statics.to_str().unwrap()]);
    assert!(out.contains("; 3 static inputs of each series from sector, size"), "{out}");
    train("none", &[]);
    let step1 = |name: &str| summary(&dir.join(name))["test_per_step"][0]["mse"].as_f64().unwrap();
    println!("first step's test MSE with the static table {:.4}, without {:.4}", step1("static"), step1("none"));

    let ckpt = dir.join("static/best.ckpt");
    assert_panel_predict_is_stream(&ckpt, &csv, &lines, 8, 600);
    // A table short of an id, one with an empty cell, and one that is not there.
    let short = dir.join("short.csv");
    std::fs::write(&short, format!("id,sector,size\n{}\n", table[..7].join("\n"))).unwrap();
    let empty = dir.join("empty.csv");
    std::fs::write(&empty, "id,sector,size\ns0,up,1\ns1,,2\n").unwrap();
    let nowhere = dir.join("nowhere.csv");
    let (d, s) = (csv.to_str().unwrap(), short.to_str().unwrap());
    let cases: Vec<(Vec<&str>, String)> = vec![
        (vec!["--static-data", s], format!("{s}: no row for series `s7` in column `id` (it has: s0, s1, s2, s3, s4, s5, s6)")),
        (vec!["--static-data", empty.to_str().unwrap()], "line 3: `sector` is empty for series `s1`".into()),
        (vec!["--static-data", nowhere.to_str().unwrap()], "nowhere.csv: No such file".into()),
    ];
    for (extra, want) in cases {
        let o = run(bin()
            .args(["train", "--data", d, "--id-column", "id", "--columns", "y,v", "--out", dir.join("bad").to_str().unwrap()])
            .args(extra.iter()));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(&want) && err.trim().lines().count() == 1, "{extra:?}: {err}");
        assert!(o.stdout.is_empty() && !dir.join("bad").exists(), "{extra:?} printed or wrote before its refusal");
    }
}

/// `predict` of a long-format panel file (`lines`, H 3) = `stream --id-column` of its lines
/// after each id's last row (row `rows` of the stream's count), for each of the `ids` ids and
/// steps (f64, 1e-9).
fn assert_panel_predict_is_stream(ckpt: &Path, csv: &Path, lines: &[String], ids: usize, rows: usize) {
    let o = run(bin().args(["predict", "--checkpoint", ckpt.to_str().unwrap(), "--data", csv.to_str().unwrap(), "--dtype", "f64"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o2 = stream_lines(ckpt, lines, &["--id-column", "id"]);
    assert!(o2.status.success(), "{}", String::from_utf8_lossy(&o2.stderr));
    let streamed = String::from_utf8_lossy(&o2.stdout).to_string();
    let predicted = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(predicted.lines().count(), 1 + ids * 3);
    for p in predicted.lines().skip(1) {
        let cells: Vec<&str> = p.split(',').collect();
        let prefix = format!("{},{rows},{},", cells[0], cells[1]);
        let s = streamed.lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("no streamed line {prefix}"));
        for (a, b) in cells[2..].iter().zip(s.split(',').skip(3)) {
            let (a, b): (f64, f64) = (a.parse().unwrap(), b.parse().unwrap());
            assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{p}: predict {a}, stream {b}");
        }
    }
}
