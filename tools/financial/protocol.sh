#!/usr/bin/env bash
# The financial development series (tools/financial/fetch.sh writes them) with the default
# forecaster, three seeds per horizon: test MSE against Repeat's, and the trader's figures; then
# the quantiles' line: the 80 % interval's coverage (mean over the seeds; the quantile issue's
# band is 76-84 %), its lowest and highest coverage at one step, its width, and the mean pinball
# loss beside conformal Repeat's. Exits 1 if a mean test MSE is above Repeat's, a coverage is
# outside 76-84 % or a pinball loss is not below conformal Repeat's.
#
# Besides the prices, stand-ins for the kinds of series the quantile issue names: Victoria's
# half-hourly electricity demand (its temperature and working-day flag read as past covariates),
# the dollar's daily exchange rates, and daily gold and silver prices.
#
#   bash tools/financial/protocol.sh [out_dir]
#   SEEDS=0,1,2 BIN=path/to/mamba2 EXTRA="--no-repeat-check" bash tools/financial/protocol.sh
#   ONLY="elecdemand exchange" bash tools/financial/protocol.sh      (those data sets alone)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/financial}
seeds=${SEEDS:-0,1,2}
[ -f data/financial/elecdemand.csv ] || bash tools/financial/fetch.sh
if [ -z "${BIN:-}" ]; then
  cargo build --release -p mamba2 --bin mamba2 >&2
fi
bin=${BIN:-target/release/mamba2}
mkdir -p "$out"
fail=0
# data  horizon  flags
while read -r name h flags; do
  case " ${ONLY:-$name} " in *" $name "*) ;; *) continue ;; esac
  dir="$out/$name-h$h"
  rm -rf "$dir"
  start=$(date +%s)
  "$bin" train --data "data/financial/$name.csv" --horizon "$h" --seeds "$seeds" --out "$dir" $flags ${EXTRA:-} > "$dir.log"
  secs=$(( $(date +%s) - start ))
  line=$(python3 - "$dir" "$seeds" <<'PY'
import json, sys, statistics as st
d, seeds = sys.argv[1], sys.argv[2].split(",")
runs = [json.load(open(f"{d}/seed-{s}/summary.json")) for s in seeds]
def mean(f):
    v = [f(r) for r in runs]
    v = [x for x in v if x is not None]
    return st.mean(v) if v else float("nan")
m, r = mean(lambda r: r["test"]["mse"]), mean(lambda r: r["test"]["repeat_mse"])
alphas = " ".join(f'{r["blend"]["alpha"]:.2f}' for r in runs)
print(f'MSE {m:.5f} Repeat {r:.5f} skill {100 * (1 - m / r):+.2f} %  val skill {100 * mean(lambda r: r["val_skill"]):+.2f} %  '
      f'IC {mean(lambda r: r["test"]["ic"]):.3f} rank IC {mean(lambda r: r["test"]["rank_ic"]):.3f} '
      f'hit {100 * mean(lambda r: r["test"]["hit_rate"]):.1f} %  kept alpha {alphas}  {"met" if m <= r else "NOT MET"}')
q = lambda r, who: r["test_quantiles"][who]
cov, rcov = mean(lambda r: q(r, "model")["intervals"][0]["coverage"]), mean(lambda r: q(r, "conformal_repeat")["intervals"][0]["coverage"])
wid, rwid = mean(lambda r: q(r, "model")["intervals"][0]["width"]), mean(lambda r: q(r, "conformal_repeat")["intervals"][0]["width"])
pin, rpin = mean(lambda r: q(r, "model")["pinball"]), mean(lambda r: q(r, "conformal_repeat")["pinball"])
steps = [st.mean(r["test_quantiles_per_step"][k]["model"]["intervals"][0]["coverage"] for r in runs)
         for k in range(len(runs[0]["test_quantiles_per_step"]))]
scale = runs[0]["calibration"]
ok = 0.76 <= cov <= 0.84 and pin < rpin
print(f'    80 % interval covers {100 * cov:.1f} % ({100 * min(steps):.1f}-{100 * max(steps):.1f} % by step), width {wid:.4f}, '
      f'pinball {pin:.5f}; conformal Repeat {100 * rcov:.1f} %, {rwid:.4f}, {rpin:.5f}  '
      f'(seed 0: {scale["scale"]} {scale["window"]}{" per target" if scale["per_target"] else ""})  '
      f'{"met" if ok else "NOT MET"}')
PY
)
  printf '%-8s H %-3s %s  [%d s]\n' "$name" "$h" "${line%%$'\n'*}" "$secs"
  printf '%s\n' "${line#*$'\n'}"
  case "$line" in *"NOT MET"*) fail=1 ;; esac
done <<'SETS'
eustock 1
eustock 48
sp500 1
sp500 96
msft 1
msft 96
elecdemand 1 --targets Demand
elecdemand 96 --targets Demand
exchange 1
exchange 96
goldsilver 1
goldsilver 96
SETS
exit $fail
