//! Time stamps and the calendar cycles a forecaster can read from them.
//!
//! A date column is parsed into seconds since 1970-01-01 00:00 (read as UTC; no time zone is
//! applied). The sampling interval is the most common gap between consecutive rows, and the
//! cycles are the day and the week measured in intervals: 24 and 168 for hourly data, 96 and
//! 672 for 15-minute data, the week alone (7) for daily data. A row's phase in a cycle of
//! `period` intervals is `floor(seconds / interval) mod period`, anchored at the epoch rather
//! than at the first row, so that any later file of the same series (`predict`, `stream`) puts
//! the same hour of the day at the same phase.

use serde::{Deserialize, Serialize};

const DAY: i64 = 86_400;
const FORMATS: [&str; 6] =
    ["%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y/%m/%d %H:%M:%S", "%Y/%m/%d %H:%M"];

/// Seconds since 1970-01-01 00:00 of a date cell: `2016-07-01 00:00:00`, `2016-07-01T00:00`,
/// `2016-07-01`, `2016/07/01 13:00`, with optional fractional seconds, or `None`.
pub fn parse_time(cell: &str) -> Option<i64> {
    let cell = cell.trim().trim_end_matches('Z');
    let cell = cell.split_once('.').map_or(cell, |(whole, frac)| if frac.chars().all(|c| c.is_ascii_digit()) { whole } else { cell });
    for f in FORMATS {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(cell, f) {
            return Some(t.and_utc().timestamp());
        }
    }
    for f in ["%Y-%m-%d", "%Y/%m/%d"] {
        if let Ok(d) = chrono::NaiveDate::parse_from_str(cell, f) {
            return Some(d.and_hms_opt(0, 0, 0)?.and_utc().timestamp());
        }
    }
    None
}

/// The cycles of a series sampled every `interval` seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Calendar {
    /// Seconds between rows.
    pub interval: i64,
    /// Cycle lengths in rows (day, week), each at least 2.
    pub periods: Vec<usize>,
}

impl Calendar {
    /// The calendar of time stamps in row order, or `None` when they have no regular interval
    /// that divides a day or is a whole number of days (then no cycle is known).
    pub fn detect(times: &[i64]) -> Option<Self> {
        let mut gaps: Vec<i64> = times.windows(2).map(|w| w[1] - w[0]).filter(|&g| g > 0).collect();
        if gaps.is_empty() {
            return None;
        }
        gaps.sort_unstable();
        // The most common gap: missing rows (weekends, holidays, outages) make some gaps longer.
        let mut best = (0usize, gaps[0]);
        let mut run = (0usize, gaps[0]);
        for &g in &gaps {
            run = if g == run.1 { (run.0 + 1, g) } else { (1, g) };
            if run.0 > best.0 {
                best = run;
            }
        }
        Self::for_interval(best.1)
    }

    /// The day and week cycles of an interval, where they are whole numbers of rows.
    pub fn for_interval(interval: i64) -> Option<Self> {
        let periods: Vec<usize> = if interval < DAY && DAY % interval == 0 {
            let day = (DAY / interval) as usize;
            vec![day, 7 * day]
        } else if interval == DAY {
            vec![7]
        } else {
            Vec::new()
        };
        let periods: Vec<usize> = periods.into_iter().filter(|&p| p >= 2).collect();
        (!periods.is_empty()).then_some(Self { interval, periods })
    }

    /// Rows per day, where a day is a whole number of rows (more than one).
    pub fn day(&self) -> Option<usize> {
        (self.interval < DAY).then(|| self.periods[0])
    }

    /// The row clock of a time stamp: whole intervals since the epoch.
    pub fn clock(&self, time: i64) -> i64 {
        time.div_euclid(self.interval)
    }

    /// The phase of clock value `clock` in cycle `k`.
    pub fn phase(&self, clock: i64, k: usize) -> usize {
        clock.rem_euclid(self.periods[k] as i64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_phases() {
        let t = parse_time("2016-07-01 01:00:00").unwrap();
        assert_eq!(t, parse_time("2016-07-01T01:00").unwrap());
        assert_eq!(t - 3600, parse_time("2016-07-01").unwrap());
        assert_eq!(parse_time("2016-07-01 01:00:00.000"), Some(t));
        assert_eq!(parse_time("yesterday"), None);
        let hourly: Vec<i64> = (0..100).map(|i| t + 3600 * i).collect();
        let cal = Calendar::detect(&hourly).unwrap();
        assert_eq!(cal.periods, [24, 168]);
        // 01:00 is phase 1 of the day whatever the first row is.
        assert_eq!(cal.phase(cal.clock(t), 0), 1);
        // Daily data with weekends missing: the most common gap is a day, the cycle a week.
        let days: Vec<i64> = (0..30).filter(|d| d % 7 < 5).map(|d| d * DAY).collect();
        assert_eq!(Calendar::detect(&days).unwrap().periods, [7]);
        assert_eq!(Calendar::detect(&[0, 7 * DAY, 14 * DAY]), None, "weekly data: no cycle known");
    }
}
