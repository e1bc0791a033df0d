#!/bin/sh
# Reproduces the model figures of bench/README.md: makes the qwen3-0.6b
# preset (random weights, bf16, ~1.2 GB) once, then runs `bench all`, which
# measures the machine's limits and every configuration side by side and
# draws the speedup chart.  Usage: bench/model/run.sh [BUILD_DIR] [OUT_DIR]
set -eu
BUILD=${1:-build}
OUT=${2:-/tmp/tp-bench-model}
MODEL=$OUT/qwen3-0.6b
mkdir -p "$OUT"
[ -f "$MODEL/config.json" ] ||
    "$BUILD/tensorpar" make-model --arch qwen3 --preset qwen3-0.6b --dtype bf16 --out "$MODEL"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BUILD/tensorpar" bench all --model "$MODEL" --seq 512 --new-tokens 128 --reps "${REPS:-5}" --png "$OUT/speedup.png" | tee "$OUT/all.txt"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
