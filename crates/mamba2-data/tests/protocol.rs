//! The data pipeline reproduces the published ETTh1 baselines: Repeat at H 96 (MSE 1.295,
//! MAE 0.713) and one-step persistence (MSE 0.1748, MAE 0.2555).

use std::path::PathBuf;

use mamba2_data::{repeat_baseline, ColumnChoice, Scaler, Split, Table, Windows};

fn etth1() -> Table {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/ett/ETTh1.csv");
    Table::from_csv_path(&path, &ColumnChoice::default()).unwrap()
}

fn baseline(horizon: usize) -> (f64, f64) {
    let table = etth1();
    assert_eq!(table.columns, ["HUFL", "HULL", "MUFL", "MULL", "LUFL", "LULL", "OT"]);
    assert_eq!(table.rows.len(), 17_420);
    let [train, _, test] = Split::ETTH1.ranges(table.rows.len(), 96).unwrap();
    let scaler = Scaler::fit(&table.rows[train.0..train.1], &table.columns).unwrap();
    let rows = scaler.transform(&table.rows, &table.columns).unwrap();
    let w = Windows::new(&rows, test, 96, horizon, 1).unwrap();
    repeat_baseline(&w, &[0, 1, 2, 3, 4, 5, 6], 32)
}

#[test]
fn repeat_baseline_at_h96_matches_the_published_figures() {
    let (mse, mae) = baseline(96);
    println!("Repeat H 96: MSE {mse:.4}, MAE {mae:.4}");
    assert_eq!(format!("{mse:.3}"), "1.295");
    assert_eq!(format!("{mae:.3}"), "0.713");
}

#[test]
fn repeat_baseline_at_h192_and_h336_matches_too() {
    let (mse, mae) = baseline(192);
    assert_eq!((format!("{mse:.3}"), format!("{mae:.3}")), ("1.325".into(), "0.733".into()));
    let (mse, mae) = baseline(336);
    assert_eq!((format!("{mse:.3}"), format!("{mae:.3}")), ("1.323".into(), "0.744".into()));
}

#[test]
fn persistence_at_h1_matches_the_published_floor() {
    let (mse, mae) = baseline(1);
    println!("persistence H 1: MSE {mse:.4}, MAE {mae:.4}");
    assert_eq!(format!("{mse:.4}"), "0.1748");
    assert_eq!(format!("{mae:.4}"), "0.2555");
}

#[test]
fn the_shipped_copy_is_byte_identical() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/ett/ETTh1.csv");
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(bytes.len(), 2_589_657);
    // FNV-1a of the file as shipped (its sha256 is f18de3ad...ee066, see data/ett/README.md).
    let h = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3));
    assert_eq!(h, FNV_OF_ETTH1);
}

const FNV_OF_ETTH1: u64 = 0x3a8ea980acf5b0fb;
