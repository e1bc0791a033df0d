#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, make a small
# Llama-architecture model on the spot (random weights, the real Llama 3
# tokenizer) and generate from it split over 2 ranks (tensor parallelism over
# shared memory), checking that the split model gives the unsplit one's tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"

model=${TP_DEMO_MODEL:-/tmp/tensorpar-demo-llama}
tokenizer=../shared/data/tokenizers/llama3
args=()
[ -d "$tokenizer" ] && args+=(--tokenizer "$tokenizer")
rm -rf "$model"
build/tensorpar make-model --arch llama --preset small --dtype bf16 --seed 1 "${args[@]}" --out "$model"
echo "model: $model"
build/tensorpar plan --model "$model" --tp 2 | sed -n '1,/^parameters/p' | head -n -1
if [ -d "$tokenizer" ]; then
  echo "== generate, 2 ranks, text prompt (random weights: expect gibberish)"
  build/tensorpar generate --model "$model" --prompt "The capital of France is" --max-new-tokens 24 --greedy --tp 2
fi
echo "== greedy ids, 1 rank and 2 ranks"
one=$(build/tensorpar generate --model "$model" --tokens 128000,9906,1917 --max-new-tokens 16 --greedy)
two=$(build/tensorpar generate --model "$model" --tokens 128000,9906,1917 --max-new-tokens 16 --greedy --tp 2)
echo "TP=1: $one"
echo "TP=2: $two"
[ "$one" = "$two" ] && echo "same tokens" || { echo "TP=2 differs from TP=1" >&2; exit 1; }
