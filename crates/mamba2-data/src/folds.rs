//! Walk-forward (rolling-origin) folds: the last rows of a table cut into folds of equal length;
//! each fold's model is fitted on rows before the fold only (all of them, or a sliding window),
//! and forecasts from origins inside the fold.

use crate::DataError;

/// Share of a fold's fitting rows that train; the rest validate (as 0.7 to 0.1 in `train`).
pub const TRAIN_SHARE: f64 = 0.875;

/// One fold: where its model is fitted and where it forecasts. Row ranges are half-open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fold {
    /// From 0.
    pub index: usize,
    /// Rows the model is fitted on: training then validation, all before `test.0`.
    pub fit: (usize, usize),
    /// The training rows (the scaler is fitted on these).
    pub train: (usize, usize),
    /// The validation rows, with the `L` rows before them that its first window reads.
    pub validation: (usize, usize),
    /// The fold's rows: forecasts are made after each row from `test.0 - 1` to `test.1 - 2`
    /// (so that the first forecast value of each lies in the fold), while all `H` values that
    /// follow are known.
    pub test: (usize, usize),
    /// The rows of the fold's forecast windows (`L` rows before the first origin, up to the
    /// last known value): a window set over these gives exactly the fold's forecasts.
    pub windows: (usize, usize),
}

/// The folds of a walk-forward evaluation of `n` rows: `folds` folds of `fold_rows` rows at the
/// end, each fitted on every row before it (`window` None) or on the `window` rows before it,
/// for a model of lookback `l` and horizon `h`.
pub fn walk_forward(n: usize, l: usize, h: usize, folds: usize, fold_rows: usize, window: Option<usize>) -> Result<Vec<Fold>, DataError> {
    let bad = |why: String| Err(DataError::Config { why });
    if folds == 0 {
        return bad("0 folds: a backtest needs at least one".into());
    }
    if fold_rows < h.max(1) {
        return bad(format!(
            "folds of {fold_rows} rows are shorter than the horizon {h}: the last fold would hold no forecast with all its values known"
        ));
    }
    let first = match n.checked_sub(folds * fold_rows) {
        Some(s) => s,
        None => return bad(format!("{folds} folds of {fold_rows} rows need {} rows; the data has {n}", folds * fold_rows)),
    };
    let mut out = Vec::with_capacity(folds);
    for index in 0..folds {
        let start = first + index * fold_rows;
        let from = window.map_or(0, |w| start.saturating_sub(w));
        let train_end = from + ((start - from) as f64 * TRAIN_SHARE).round() as usize;
        // Training needs one window of L + H rows, validation one window after its L rows of
        // context, so that early stopping and the check against Repeat have something to read.
        if train_end < from + l + h || start < train_end + h {
            let need = ((l + h) as f64 / TRAIN_SHARE).ceil().max((h as f64 / (1.0 - TRAIN_SHARE)).ceil()) as usize;
            return bad(format!(
                "fold {} starts at row {start} with {} rows before it to fit on; lookback {l} and horizon {h} need about {need}: \
                 use fewer or shorter folds{}",
                index + 1,
                start - from,
                if window.is_some() { ", or a longer window" } else { "" }
            ));
        }
        let end = start + fold_rows;
        out.push(Fold {
            index,
            fit: (from, start),
            train: (from, train_end),
            validation: (train_end - l, start),
            test: (start, end),
            windows: (start - l, (end + h - 1).min(n)),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folds_tile_the_end_and_fit_only_on_the_past() {
        let f = walk_forward(1000, 24, 6, 4, 50, None).unwrap();
        assert_eq!(f.len(), 4);
        assert_eq!((f[0].test, f[3].test), ((800, 850), (950, 1000)));
        for (k, fold) in f.iter().enumerate() {
            assert_eq!(fold.fit, (0, fold.test.0));
            assert!(fold.train.1 <= fold.fit.1 && fold.validation.1 == fold.test.0, "fold {k}: {fold:?}");
            // The window set's first origin is the row before the fold; its last is the last
            // row whose H values are known or the fold's last but one.
            let first_origin = fold.windows.0 + 24 - 1;
            let last_origin = fold.windows.1 - 6 - 1;
            assert_eq!(first_origin, fold.test.0 - 1);
            assert_eq!(last_origin, (fold.test.1 - 2).min(1000 - 6 - 1));
        }
        let slide = walk_forward(1000, 24, 6, 4, 50, Some(300)).unwrap();
        assert_eq!(slide[2].fit, (600, 900));
    }

    #[test]
    fn folds_that_do_not_fit_are_errors_that_say_why() {
        let msg = |r: Result<Vec<Fold>, DataError>| r.unwrap_err().to_string();
        assert!(msg(walk_forward(1000, 24, 6, 0, 50, None)).contains("0 folds"));
        assert!(msg(walk_forward(1000, 24, 6, 3, 0, None)).contains("folds of 0 rows are shorter than the horizon 6"));
        assert!(msg(walk_forward(1000, 24, 6, 30, 50, None)).contains("30 folds of 50 rows need 1500 rows; the data has 1000"));
        assert!(msg(walk_forward(1000, 24, 6, 20, 50, None)).contains("fold 1 starts at row 0 with 0 rows before it"));
        // 50 rows are enough: 44 train (15 windows of 30), 6 validate (one window).
        assert!(walk_forward(1000, 24, 6, 19, 50, None).is_ok());
        assert!(msg(walk_forward(1000, 24, 6, 4, 50, Some(20))).contains("or a longer window"));
    }
}
