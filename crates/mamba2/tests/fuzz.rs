//! Seeded mutation fuzzing of what a user hands the program: CSV text, Parquet files and
//! checkpoints. Each case is a seed file mutated a few times (bytes flipped, set, inserted from
//! a dictionary of troublesome tokens, deleted, repeated, cut; for checkpoints also a header
//! value replaced and the checksum fixed, so that the loader's later checks are reached) and
//! fed to the public API the command uses. A case passes when it is an error or a usable
//! result: no panic, no abort, no allocation above the test binary's 1 GiB cap (see main.rs),
//! and no table accepted into scaled values that are not finite `f32`s.
//!
//! CI runs each target for `MAMBA2_FUZZ_SECONDS` (default 3) seconds. By hand, ten minutes each:
//! `MAMBA2_FUZZ_SECONDS=600 cargo test --release -p mamba2 --test command fuzz:: -- --nocapture --test-threads 3`.
//! Cases are numbered from `MAMBA2_FUZZ_SEED` (default 0) and case `i` depends on `i` alone, so a
//! failure printed as case `i` reruns with `MAMBA2_FUZZ_SEED=i MAMBA2_FUZZ_SECONDS=0`. Every
//! 256 cases the number of the running case is written to `mamba2-fuzz-<target>.case` in the
//! temporary directory, so an abort can be traced too.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use burn::backend::Flex;
use mamba2_data::calendar::Calendar;
use mamba2_data::{ColumnChoice, Scaler, Split, Table};

use crate::cli::{bin, run, scratch, synthetic_csv, train_tiny, write_parquet, ParquetDates};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64: every case seed gives its own well-mixed stream.
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const TOKENS: &[&[u8]] = &[
    b",",
    b"\n",
    b"\r\n",
    b"\"",
    b"\"\"",
    b" ",
    b"\t",
    b"\xEF\xBB\xBF",
    b"\xFF",
    b"\0",
    b"1e308",
    b"-1e308",
    b"1.7976931348623157e308",
    b"1e-308",
    b"5e-324",
    b"NaN",
    b"inf",
    b"-inf",
    b"-",
    b".",
    b"0",
    b"-0",
    b"1e",
    b"99999999999999999999999",
    b"date",
    b"a",
    b"2020-01-01 00:00:00",
    b"2020-02-30 25:61:00",
    b"1970-01-01",
    b"9999-12-31 23:59:59",
    b"00:00",
    b"PAR1",
];

/// `seed` mutated one to four times.
fn mutate(seed: &[u8], rng: &mut Rng) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(b.len() + 1);
        match rng.below(7) {
            0 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = at.min(b.len() - 1);
                b[i] = rng.next() as u8;
            }
            2 => {
                let t = TOKENS[rng.below(TOKENS.len())];
                b.splice(at..at, t.iter().copied());
            }
            3 => {
                let end = (at + 1 + rng.below(64)).min(b.len());
                b.drain(at.min(end)..end);
            }
            4 => {
                let end = (at + 1 + rng.below(200)).min(b.len());
                let piece = b[at.min(end)..end].to_vec();
                let to = rng.below(b.len() + 1);
                b.splice(to..to, piece);
            }
            5 => b.truncate(at),
            _ => {
                // A number-looking run replaced by a token: the values themselves go wrong.
                let start = b[at.min(b.len())..].iter().position(u8::is_ascii_digit).map(|p| p + at);
                if let Some(s) = start {
                    let end = b[s..].iter().position(|c| !(c.is_ascii_digit() || *c == b'.')).map_or(b.len(), |p| p + s);
                    let t = TOKENS[rng.below(TOKENS.len())];
                    b.splice(s..end, t.iter().copied());
                }
            }
        }
    }
    b
}

/// Runs `case` on cases numbered from `MAMBA2_FUZZ_SEED` for `MAMBA2_FUZZ_SECONDS`; a panic
/// fails the test naming the case. Returns the number of cases run.
fn fuzz(target: &str, mut case: impl FnMut(&mut Rng) -> bool) -> u64 {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let (first, seconds) = (env("MAMBA2_FUZZ_SEED", 0), env("MAMBA2_FUZZ_SECONDS", 3));
    let marker = std::env::temp_dir().join(format!("mamba2-fuzz-{target}.case"));
    let started = Instant::now();
    let (mut i, mut accepted) = (first, 0u64);
    loop {
        if (i - first) % 256 == 0 {
            std::fs::write(&marker, i.to_string()).unwrap();
        }
        let mut rng = Rng(i.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ target.len() as u64);
        match catch_unwind(AssertUnwindSafe(|| case(&mut rng))) {
            Ok(ok) => accepted += u64::from(ok),
            Err(e) => {
                let why = e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                panic!("{target} fuzz case {i} panicked: {}", why.unwrap_or_default());
            }
        }
        i += 1;
        if started.elapsed() >= Duration::from_secs(seconds) {
            break;
        }
    }
    let n = i - first;
    println!(
        "{target}: {n} cases in {:.1} s ({accepted} accepted, the rest refused with an error), no panic",
        started.elapsed().as_secs_f64()
    );
    n
}

/// What `train` does with a table before any model sees it: the split, the scaler fitted on
/// the training rows, the scaled rows and the calendar. An accepted table must scale to finite
/// `f32` values.
fn check_table(t: &Table) {
    assert!(!t.rows.is_empty() && t.rows.iter().all(|r| r.len() == t.columns.len() && r.iter().all(|v| v.is_finite())));
    if let Some(times) = &t.times {
        assert_eq!(times.len(), t.rows.len());
        if let Some(c) = Calendar::detect(times) {
            for &x in times {
                c.clock(x);
            }
        }
    }
    for lookback in [1, 4] {
        let Ok([tr, ..]) = Split::Fractions { train: 0.7, val: 0.1 }.ranges(t.rows.len(), lookback) else { continue };
        let Ok(scaler) = Scaler::fit(&t.rows[tr.0..tr.1], &t.columns) else { continue };
        if let Ok(z) = scaler.transform(&t.rows, &t.columns) {
            assert!(z.iter().flatten().all(|v| v.is_finite() && (*v as f32).is_finite()), "accepted into non-finite scaled values");
        }
    }
}

#[test]
fn fuzz_the_csv_reader() {
    let seeds: Vec<Vec<u8>> = vec![
        synthetic_csv(40).into_bytes(),
        b"\xEF\xBB\xBFtime,x,\"y,z\",label\r\n1,2.5,3,a\r\n2,2.25,-3,b\r\n3,1e3,0.5,c\r\n4,7,8,d\r\n5,1,2,e\r\n6,0,1,f\r\n".to_vec(),
        include_str!("../../../data/ett/ETTh1.csv").lines().take(60).collect::<Vec<_>>().join("\n").into_bytes(),
    ];
    let n = fuzz("csv", |rng| {
        let bytes = mutate(&seeds[rng.below(seeds.len())], rng);
        let text = String::from_utf8_lossy(&bytes);
        Table::from_csv_str(&text, "fuzz", &ColumnChoice::default()).map(|t| check_table(&t)).is_ok()
    });
    assert!(n > 0);
}

#[test]
fn fuzz_the_parquet_reader() {
    let dir = scratch("fuzz-parquet");
    let seed_path = dir.join("seed.parquet");
    write_parquet(&seed_path, &synthetic_csv(60), ParquetDates::Timestamp(1_000, "MILLIS"));
    let seed = std::fs::read(&seed_path).unwrap();
    let path = dir.join("case.parquet");
    let n = fuzz("parquet", |rng| {
        std::fs::write(&path, mutate(&seed, rng)).unwrap();
        Table::from_path(&path, &ColumnChoice::default()).map(|t| check_table(&t)).is_ok()
    });
    assert!(n > 0);
}

fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

/// A checkpoint from its header (re-encoded) and payload, with a true length and checksum.
pub(crate) fn reseal(header: &serde_json::Value, payload: &[u8]) -> Vec<u8> {
    let mut h = header.clone();
    h["payload_len"] = payload.len().into();
    h["payload_fnv1a64"] = fnv1a64(payload).into();
    let h = serde_json::to_vec(&h).unwrap();
    let mut out = b"MAMBA2CK".to_vec();
    out.extend((h.len() as u64).to_le_bytes());
    out.extend(h);
    out.extend(payload);
    out
}

/// Every leaf of `v` (numbers, strings, booleans, nulls) by a pointer path.
fn leaves(v: &serde_json::Value, at: String, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => m.iter().for_each(|(k, x)| leaves(x, format!("{at}/{k}"), out)),
        serde_json::Value::Array(a) => {
            out.push(at.clone());
            a.iter().enumerate().for_each(|(i, x)| leaves(x, format!("{at}/{i}"), out));
        }
        _ => out.push(at),
    }
}

fn strange_value(rng: &mut Rng) -> serde_json::Value {
    use serde_json::json;
    let values = [
        json!(0),
        json!(1),
        json!(2),
        json!(-1),
        json!(3),
        json!(1u64 << 31),
        json!(1u64 << 32),
        json!(1u64 << 53),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(1e300),
        json!(-1e300),
        json!(0.5),
        json!(1e-300),
        json!(""),
        json!("x"),
        json!(null),
        json!(true),
        json!([]),
        json!([1, 2]),
        json!({}),
        json!(rng.next()),
        json!(rng.below(100_000)),
    ];
    values[rng.below(values.len())].clone()
}

#[test]
fn fuzz_the_checkpoint_loader() {
    let dir = scratch("fuzz-ckpt");
    let csv = dir.join("data.csv");
    std::fs::write(&csv, synthetic_csv(300)).unwrap();
    let o = train_tiny(&dir, &csv, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seed = std::fs::read(dir.join("run/best.ckpt")).unwrap();
    let header_len = u64::from_le_bytes(seed[8..16].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&seed[16..16 + header_len]).unwrap();
    let payload = seed[16 + header_len..].to_vec();
    let mut paths = Vec::new();
    leaves(&header, String::new(), &mut paths);
    paths.retain(|p| !p.starts_with("/payload"));
    let device = Default::default();
    let history: Vec<Vec<f64>> = (0..40).map(|t| (0..3).map(|j| ((t * (j + 1)) as f64 * 0.1).sin()).collect()).collect();
    let clock: Vec<i64> = (0..40).collect();
    let path = dir.join("case.ckpt");
    let n = fuzz("checkpoint", |rng| {
        let bytes = match rng.below(4) {
            // Raw damage: mostly caught by the checksum.
            0 => mutate(&seed, rng),
            // One header value replaced (the checksum still true): the config's bounds.
            1 | 2 => {
                let mut h = header.clone();
                for _ in 0..1 + rng.below(2) {
                    if let Some(slot) = h.pointer_mut(&paths[rng.below(paths.len())]) {
                        *slot = strange_value(rng);
                    }
                }
                reseal(&h, &payload)
            }
            // Damaged weights with a true checksum: the weight decoder and the shape checks.
            _ => reseal(&header, &mutate(&payload, rng)),
        };
        std::fs::write(&path, &bytes).unwrap();
        match mamba2_forecast::open_forecaster::<Flex>(&path, &device) {
            Ok(opened) if opened.model.spec().features.len() == 3 => opened.model.forecast_history(&history, &clock, &device).is_ok(),
            Ok(_) => true,
            Err(_) => false,
        }
    });
    assert!(n > 0);
    // The command on such a file says one line too (here: a horizon of 2^64 - 1).
    let mut h = header.clone();
    *h.pointer_mut("/config/spec/horizon").expect("the config has a horizon") = serde_json::json!(u64::MAX);
    std::fs::write(&path, reseal(&h, &payload)).unwrap();
    let o = run(bin().args(["predict", "--checkpoint", path.to_str().unwrap(), "--data"]).arg(&csv));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!((o.status.code(), stderr.trim_end().lines().count()), (Some(1), 1), "{stderr}");
    assert!(stderr.contains("horizon") && !stderr.contains("panicked"), "{stderr}");
}
