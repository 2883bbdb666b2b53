//! The embedded ETTh1 as the forecast bench and the `step_phases` example read it: scaled on the
//! protocol's training rows, with the calendar's clock of every row.

use mamba2_forecast::data::calendar::Calendar;
use mamba2_forecast::data::{ColumnChoice, Scaler, Table};

const ETTH1: &str = include_str!("../../../../data/ett/ETTh1.csv");

/// The protocol's training rows, which the scaler is fitted on.
const TRAIN_ROWS: usize = 8640;

pub struct Data {
    pub rows: Vec<Vec<f64>>,
    pub clock: Vec<i64>,
    pub columns: Vec<String>,
    pub calendar: Option<Calendar>,
    /// Read by the bench's data-parallel epochs, not by the example.
    #[allow(dead_code)]
    pub scaler: Scaler,
}

pub fn etth1() -> Data {
    let table = Table::from_csv_str(ETTH1, "ETTh1", &ColumnChoice::default()).expect("the embedded ETTh1 parses");
    let calendar = table.times.as_deref().and_then(Calendar::detect);
    let cal = calendar.as_ref().expect("ETTh1 has an hourly calendar");
    let clock = table.times.as_ref().expect("ETTh1 has dates").iter().map(|&t| cal.clock(t)).collect();
    let scaler = Scaler::fit(&table.rows[..TRAIN_ROWS], &table.columns).expect("the training rows");
    let rows = scaler.transform(&table.rows, &table.columns).expect("the same columns");
    Data { rows, clock, columns: table.columns, calendar, scaler }
}
