#!/usr/bin/env bash
# The one script to run on a machine with an NVIDIA GPU: the CUDA tests (the backend-generic
# test bodies instantiated for burn's Cuda backend), the train-step bench on CUDA at the small,
# medium and wide (130m checkpoint) sizes, and HF transformers' CUDA path beside it when torch
# sees the GPU. On a machine without a GPU it type-checks the CUDA tests, says "no CUDA device",
# runs the CPU parts and exits 0, so that the script is known to work before a GPU is lent.
#
# Output: a "== part" line before each part; the benches print one JSON object per line
# ({"side": "rust"|"torch", "what": "train", "config": ..., "device": ..., "tokens_per_s": ...}),
# the form docs/benchmarks.md quotes. MAMBA2_MIN_TIME (seconds per bench round, default 3).
set -euo pipefail
cd "$(dirname "$0")/../.."
export MAMBA2_MIN_TIME="${MAMBA2_MIN_TIME:-3}"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    gpu=yes
    nvidia-smi -L
else
    gpu=no
    echo "no CUDA device (nvidia-smi lists no GPU): the CUDA tests and the CUDA bench are skipped"
fi

if [ "$gpu" = yes ]; then
    echo "== the CUDA tests: cargo test --workspace --features cuda -- cuda"
    cargo test --workspace --features cuda --quiet -- cuda
    echo "== train step on CUDA, f32"
    for size in small medium wide; do
        MAMBA2_TRAIN_ROUND=$size MAMBA2_BENCH_DEVICE=cuda cargo bench -p mamba2-train --features cuda --bench speed --quiet
    done
else
    # Without a GPU the CUDA test binaries cannot run, so they are only type-checked (as CI does).
    echo "== cargo check --workspace --features cuda --tests"
    cargo check --workspace --features cuda --tests --quiet
fi

echo "== train step on the CPU (Flex f32), for comparison"
for size in small medium; do
    MAMBA2_TRAIN_ROUND=$size cargo bench -p mamba2-train --bench speed --quiet
done

if python3 -c 'import sys, torch, transformers; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
    echo "== HF transformers on CUDA, f32"
    python3 tools/reference/bench_torch.py --device cuda --configs small,medium,wide --dtypes f32 --train-only --min-time "$MAMBA2_MIN_TIME"
else
    echo "no torch that sees a GPU: HF's CUDA path is skipped (python3 -m pip install torch transformers adds it)"
fi
echo "== done (GPU: $gpu)"
