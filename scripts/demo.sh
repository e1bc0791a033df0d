#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install, build, make a small
# Llama-architecture model on the spot (random weights, the real Llama 3
# tokenizer shipped in tests/data/tokenizers) and generate from it split over
# 2 ranks (tensor parallelism over shared memory), checking that the split
# model gives the unsplit one's tokens.  Reads nothing outside the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
# The CLI is all the demo runs (scripts/test.sh builds the tests too).
cmake --build build -j"$(nproc)" --target tensorpar_cli

model=${TP_DEMO_MODEL:-$(mktemp -d /tmp/tensorpar-demo-XXXXXX)}
tokenizer=tests/data/tokenizers/llama3   # shipped with the repository (see its NOTICE)
rm -rf "$model"
build/tensorpar make-model --arch llama --preset small --dtype bf16 --seed 1 --tokenizer "$tokenizer" --out "$model"
echo "model: $model"
build/tensorpar plan --model "$model" --tp 2 | sed -n '1,/^parameters/p' | head -n -1
echo "== generate, 2 ranks, text prompt (random weights: expect gibberish)"
build/tensorpar generate --model "$model" --prompt "The capital of France is" --max-new-tokens 24 --greedy --tp 2
echo "== greedy ids, 1 rank and 2 ranks"
# The prompt's ids come from the model's own tokenizer, so they always fit its vocabulary.
ids=$(build/tensorpar tokenize --tokenizer "$model" --text "Hello world" --special | tr -d '[] ')
echo "prompt ids: $ids"
one=$(build/tensorpar generate --model "$model" --tokens "$ids" --max-new-tokens 16 --greedy)
two=$(build/tensorpar generate --model "$model" --tokens "$ids" --max-new-tokens 16 --greedy --tp 2)
echo "TP=1: $one"
echo "TP=2: $two"
[ "$one" = "$two" ] && echo "same tokens" || { echo "TP=2 differs from TP=1" >&2; exit 1; }
