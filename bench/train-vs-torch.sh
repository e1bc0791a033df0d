#!/bin/bash
# Training tokens/s and peak RSS per rank: tensorpar train (TP=1x1, 1x2, 2x1)
# against a PyTorch eager AdamW loop (1 and 2 threads) on the same model,
# seq-len 512, interleaved rounds.  See bench/README.md, "Training".
#
#   bench/train-vs-torch.sh [--quick] [--bin build/tensorpar] [--rounds N] [--steps N] [--work DIR]
#
# --quick: the `small` preset (seconds) instead of qwen3-0.6b (f32, ~11 GB
# per run at TP=1: never run beside another big job).  Other options go to
# bench/train_vs_torch.py.  OPENBLAS_CORETYPE is left as the environment has
# it, for both sides (only torch calls OpenBLAS).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
args=()
for a in "$@"; do
    if [ "$a" = --quick ]; then args+=(--preset small --work /tmp/tp-train-bench-small --rounds 3 --steps 5)
    else args+=("$a"); fi
done
exec /usr/bin/python3 "$here/train_vs_torch.py" "${args[@]}"
