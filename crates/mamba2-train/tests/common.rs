//! Helpers that the tests of this crate and of the `mamba2` command (which includes this file by
//! its path) share: dates for synthetic CSV, and parameters read back for comparison.
#![allow(dead_code)]

use burn::module::{ModuleVisitor, Param};
use burn::prelude::*;

/// `YYYY-MM-DD HH:MM:00` of seconds since 1970-01-01 (UTC).
pub(crate) fn stamp(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:00", rem / 3600, rem % 3600 / 60)
}

/// Every float parameter of a module, read back as f64 in visiting order.
pub(crate) struct Values(pub(crate) Vec<Vec<f64>>);

impl<B: Backend> ModuleVisitor<B> for Values {
    fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
        self.0.push(p.val().into_data().convert::<f64>().into_vec::<f64>().unwrap());
    }
}

/// The largest `||a - b|| / ||b||` over the parameters.
pub(crate) fn worst(a: &[Vec<f64>], b: &[Vec<f64>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let diff: f64 = x.iter().zip(y).map(|(p, q)| (p - q).powi(2)).sum::<f64>().sqrt();
            let norm: f64 = y.iter().map(|q| q * q).sum::<f64>().sqrt();
            diff / norm.max(1e-30)
        })
        .fold(0.0, f64::max)
}
