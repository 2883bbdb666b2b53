"""Repeat's conformal intervals on the financial development series, fitted on validation alone
or on training and validation, chosen by the blocked cross-validation of `mamba2_train::calibrate`
(4 consecutive blocks of validation windows, mean pinball loss over the levels 0.1, 0.5, 0.9).

A simulation outside the command, for docs/forecasting.md ("Calibrating on the training split's
errors as well"): Repeat's forecasts on the raw prices, one series at a time, splits 70/10/20,
lookback 96, three scales (none, std of the last 336 values, mean absolute change over the last
336 rows). Prints, per series and horizon, the test coverage of the 80 % interval and the pinball
loss over conformal Repeat's of the candidate chosen among the validation-only fits and among all.

    bash tools/financial/fetch.sh
    ~/.cache/mamba2-fin-venv/bin/python tools/financial/calibration_cv.py
"""
import csv
import sys

import numpy as np

LEVELS = [0.1, 0.5, 0.9]
SCALES = ["none", "std336", "mac336"]


def load(path, column):
    with open(path) as f:
        return np.array([float(row[column]) for row in csv.DictReader(f)])


def pinball(y, q, level):
    d = y - q
    return np.mean(np.maximum(level * d, (level - 1) * d))


def scale(x, t, kind):
    if kind == "none":
        return 1.0
    w = x[max(0, t - 335) : t + 1]
    if kind == "std336":
        return max(np.std(w), 1e-9)
    return max(np.mean(np.abs(np.diff(w))), 1e-9)


def score(fit, y, s):
    """Coverage of the 80 % interval and mean pinball loss of quantiles fitted on `fit`."""
    z = {lv: np.quantile(fit, lv, axis=0) for lv in LEVELS}
    covers = np.mean((y >= s * z[0.1]) & (y <= s * z[0.9]))
    return covers, np.mean([pinball(y, s * z[lv], lv) for lv in LEVELS])


def run(x, horizon, lookback=96):
    n = len(x)
    n_train, n_val = int(n * 0.7), int(n * 0.1)
    val = list(range(max(lookback - 1, n_train), n_train + n_val - horizon))
    test = range(n_train + n_val, n - horizon)
    train = range(lookback - 1, n_train - horizon)
    results = {}
    for kind in SCALES:

        def changes(origins):
            y = np.array([[x[t + h] - x[t] for h in range(1, horizon + 1)] for t in origins])
            return y, np.array([scale(x, t, kind) for t in origins])[:, None]

        (yv, sv), (yt, st), (ytr, str_) = changes(val), changes(test), changes(train)
        ev, etr = yv / sv, ytr / str_
        blocks = np.array_split(np.arange(len(val)), 4)
        for fitted_on in ["validation", "training and validation"]:
            loss = 0.0
            for b in blocks:
                rest = np.setdiff1d(np.arange(len(val)), b)
                fit = ev[rest] if fitted_on == "validation" else np.vstack([etr, ev[rest]])
                loss += score(fit, yv[b], sv[b])[1] * len(b)
            fit = ev if fitted_on == "validation" else np.vstack([etr, ev])
            results[(kind, fitted_on)] = (loss / len(val),) + score(fit, yt, st)
    base = results[("none", "validation")][2]
    among_val = min((k for k in results if k[1] == "validation"), key=lambda k: results[k][0])
    among_all = min(results, key=lambda k: results[k][0])
    for name, k in [("among validation-only fits", among_val), ("among all six", among_all)]:
        _, covers, loss = results[k]
        print(f"  chosen {name:27s} {k[0]:7s} fitted on {k[1]:24s} test covers {100 * covers:5.1f} %, "
              f"pinball / conformal Repeat's {loss / base:.3f}")


def main(root="data/financial"):
    cases = [("sp500.csv", "close", 96), ("msft.csv", "close", 96), ("sp500.csv", "close", 1), ("msft.csv", "close", 1)]
    cases += [("eustock.csv", c, h) for c in ["DAX", "SMI", "CAC", "FTSE"] for h in (48, 1)]
    for name, column, horizon in cases:
        print(f"{name} {column} H {horizon}")
        run(load(f"{root}/{name}", column), horizon)


if __name__ == "__main__":
    main(*sys.argv[1:])
