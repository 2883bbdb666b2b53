"""Random-walk intervals for a kept Repeat, against today's conformal calibration: a simulation
outside the command, for docs/forecasting.md ("Quantiles", "Where Repeat is kept").

Where the check against Repeat keeps Repeat, the command's intervals are conformal: per step,
the empirical quantiles of validation errors divided by a local scale that the blocked
cross-validation chooses (`mamba2_data::quantile::choose_intervals`; the 7 scales, one series at
a time, so per target and pooled are the same). The alternative has no fitted quantile: a random
walk's, `last + Phi^-1(q) * sqrt(k) * s`, with `s` the standard deviation of the last W
one-row changes (W 24, 96 or 336).

The choice is made before the test split: pseudo-splits over the first 80 % of each series
(training and validation), calibrate on a block of n/10 rows and score on the n/5 rows after it,
sliding by n/10. The test split (the command's last 20 %, calibrated on its validation split)
is printed after, for the record only.

    bash tools/financial/fetch.sh
    ~/.cache/mamba2-fin-venv/bin/python tools/financial/random_walk_intervals.py
"""
import csv
import sys
from statistics import NormalDist

import numpy as np

LEVELS = [0.1, 0.5, 0.9]
SCALES = [("none", 0)] + [(k, w) for k in ("std", "mac") for w in (24, 96, 336)]
WINDOWS = (24, 96, 336)
SERIES = [("sp500", "close"), ("msft", "close"), ("goldsilver", "gold"), ("goldsilver", "silver")]
SERIES += [("exchange", c) for c in ("dm", "bp", "cd", "dy", "sf")]
SERIES += [("eustock", c) for c in ("DAX", "SMI", "CAC", "FTSE")]


def pinball(e, q, level):
    d = e - q
    return np.mean(np.maximum(level * d, (level - 1) * d))


def judge(z, e, s):
    """Coverage of the 80 % interval and mean pinball loss of quantiles `s * z` of errors `e`."""
    covers = np.mean((e >= s * z[0.1]) & (e <= s * z[0.9]))
    return covers, np.mean([pinball(e, s * z[lv], lv) for lv in LEVELS])


def scale(x, kind, w, t):
    if kind == "none":
        return 1.0
    if kind == "std":
        return np.std(x[max(0, t - w + 1) : t + 1])
    d = np.diff(x[max(0, t - w) : t + 1])
    return np.mean(np.abs(d)) if kind == "mac" else np.std(d)


def compare(x, h, fit, score):
    """Today's choice and the random walk's per window: (coverage, pinball / conformal Repeat's)
    on origins `score`, calibrated on origins `fit`."""
    errors = lambda origins: np.array([[x[t + k] - x[t] for k in range(1, h + 1)] for t in origins])
    ef, es = errors(fit), errors(score)
    scales = lambda kind, w, origins: np.array([scale(x, kind, w, t) for t in origins])[:, None]
    conformal = lambda e, s: {lv: np.quantile(e / s, lv, axis=0) for lv in LEVELS}
    best, out = None, []
    for kind, w in SCALES:
        sf, ss = scales(kind, w, fit), scales(kind, w, score)
        floor = np.median(sf) / 1000
        sf, ss = np.maximum(sf, floor), np.maximum(ss, floor)
        cv = 0.0
        for block in np.array_split(np.arange(len(fit)), 4):
            rest = np.setdiff1d(np.arange(len(fit)), block)
            cv += judge(conformal(ef[rest], sf[rest]), ef[block], sf[block])[1] * len(block)
        result = judge(conformal(ef, sf), es, ss)
        if kind == "none":
            base = result[1]
        if best is None or cv < best[0]:
            best = (cv, result)
    out.append((best[1][0], best[1][1] / base))
    root_k = np.sqrt(np.arange(1, h + 1))
    z = {lv: NormalDist().inv_cdf(lv) * root_k for lv in LEVELS}
    for w in WINDOWS:
        covers, loss = judge(z, es, scales("cstd", w, score))
        out.append((covers, loss / base))
    return out


def main(root="data/financial"):
    names = ["today"] + [f"random walk, W {w}" for w in WINDOWS]
    for long in (True, False):
        pre, test = [], []
        for name, column in SERIES:
            with open(f"{root}/{name}.csv") as f:
                x = np.array([float(r[column]) for r in csv.DictReader(f)])
            h = (48 if name == "eustock" else 96) if long else 1
            n, nv = len(x), len(x) // 10
            splits = [compare(x, h, range(a, a + nv - h), range(a + nv, a + 3 * nv - h))
                      for a in range(96, int(n * 0.8) - 3 * nv + 1, nv)]
            pre.append(np.mean(splits, axis=0))
            n_train, n_val = int(n * 0.7), int(n * 0.1)
            test.append(compare(x, h, range(n_train - 1, n_train + n_val - h), range(n_train + n_val - 1, n - h)))
        for title, table in [("pseudo-splits before the test split (the choice)", pre), ("test split (the record)", test)]:
            t = np.array(table)
            print(f"{'H 96 (eustock 48)' if long else 'H 1'}, {title}:")
            for (name, column), row in zip(SERIES, t):
                cells = "  ".join(f"{100 * c:5.1f} % {p:.3f}" for c, p in row)
                print(f"  {name:10s} {column:6s} {cells}")
            for j, method in enumerate(names):
                better = np.sum(t[:, j, 1] < t[:, 0, 1]) if j else 0
                print(f"  {method:18s} mean |coverage - 80 %| {100 * np.mean(np.abs(t[:, j, 0] - 0.8)):5.1f}, "
                      f"mean pinball / conformal Repeat's {np.mean(t[:, j, 1]):.3f}"
                      + (f", better than today on {better} of {len(t)} series" if j else ""))


if __name__ == "__main__":
    main(*sys.argv[1:])
