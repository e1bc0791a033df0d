#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, make a small
# Llama-architecture model on the spot (random weights, the real Llama 3
# tokenizer) and generate from it.
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
echo "prompt ids: 128000,9906,1917 -> new ids:"
build/tensorpar generate --model "$model" --tokens 128000,9906,1917 --max-new-tokens 16
