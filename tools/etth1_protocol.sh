#!/usr/bin/env bash
# The ETTh1 protocol with the default forecaster, three seeds per horizon, checked against the
# forecasting issue's acceptance lines. Exits 1 if any line is missed.
#
#   bash tools/etth1_protocol.sh [out_dir]      (9-12 minutes on the project's 2-core VM)
#   SEEDS=0,1,2,3,4 BIN=path/to/mamba2 bash tools/etth1_protocol.sh
#
# Prints one line per horizon: mean +- sample std of test MSE and MAE over seeds 0, 1, 2, and
# the line it is held to. Each run also leaves its own directory under out_dir.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/protocol}
seeds=${SEEDS:-0,1,2}
if [ -z "${BIN:-}" ]; then
  cargo build --release -p mamba2 --bin mamba2 >&2
fi
bin=${BIN:-target/release/mamba2}
mkdir -p "$out"
field() { sed -n "s/.*\"$1\": \([-0-9.e]*\).*/\1/p" "$2" | head -1; }
fail=0
# horizon  max MSE  max MAE  (what the line is)
while read -r h mse_max mae_max why; do
  dir="$out/h$h"
  rm -rf "$dir"
  start=$(date +%s)
  "$bin" train --horizon "$h" --seeds "$seeds" --out "$dir" > "$dir.log"
  secs=$(( $(date +%s) - start ))
  m=$(field mse_mean "$dir/seeds.json"); ms=$(field mse_std "$dir/seeds.json")
  a=$(field mae_mean "$dir/seeds.json"); as=$(field mae_std "$dir/seeds.json")
  ok=$(awk -v m="$m" -v a="$a" -v ms="$ms" -v mm="$mse_max" -v am="$mae_max" \
    'BEGIN { print (m <= mm && a <= am && ms <= 0.004) ? "met" : "NOT MET" }')
  printf 'H %-4s MSE %.4f +- %.4f  MAE %.4f +- %.4f  (line: MSE <= %s, MAE <= %s, std <= 0.004; %s)  %s  [%d s]\n' \
    "$h" "$m" "$ms" "$a" "$as" "$mse_max" "$mae_max" "$why" "$ok" "$secs"
  [ "$ok" = met ] || fail=1
done <<'LINES'
96 0.375 0.395 CycleNet
192 0.443 9 below S-Mamba
336 0.489 9 below S-Mamba
720 0.502 9 below S-Mamba
1 0.1748 0.2555 below persistence
LINES
exit $fail
