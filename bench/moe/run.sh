#!/usr/bin/env bash
# The MoE speed targets of issue 16, side by side on one machine:
#   bash bench/moe/run.sh [TENSORPAR] [WORK]     (defaults: build/tensorpar, /tmp/tp-bench-moe)
# 1. bench kernels --moe: the grouped expert kernel against one dense GEMM
#    pair over the same 4096 rows, qwen3-30b-a3b shapes, prefill of 512
#    tokens, 2 threads (target: grouped / dense >= 0.5);
# 2. bench decode of the qwen3-30b-a3b preset with 2 layers, bf16 (made
#    once into WORK, 3.7 GB): TP=1 x 1 thread against EP=2 x 1 thread, with
#    the built-in EP plan (experts split, the rest replicated: spec §4.2),
#    then with bench/moe/ep_tp_plan.json (experts split, attention and
#    lm_head TP-sharded), then for reference TP=2 x 1 thread (the built-in
#    TP plan: every expert split, so no rank waits for one that got more of
#    a token's experts) and TP=1 x 2 threads (target: EP=2 >= 1.6x EP=1,
#    weight bytes/s within 10 % of the read probe).
# Needs ~5 GB of memory at the EP=2 step; on a shared machine run it under
# the shared lock (flock /work/wt/bigmem.lock bash bench/moe/run.sh).
set -euo pipefail
main() {
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-$here/../../build/tensorpar}
work=${2:-/tmp/tp-bench-moe}
model=$work/qwen3-30b-a3b-2l
mkdir -p "$work"
if [ ! -f "$model/config.json" ]; then
    "$bin" make-model --arch qwen3_moe --preset qwen3-30b-a3b --set num_hidden_layers=2 --out "$model" >/dev/null
fi
echo "== $(date -u +%FT%TZ) $(uptime)"
"$bin" bench kernels --moe --threads 2
echo "== $(uptime)"
"$bin" bench decode --model "$model" --tp 2 --ep --threads 1 --new-tokens 32 --reps 3 2>/dev/null
echo "== $(uptime)"
"$bin" bench decode --model "$model" --tp 2 --ep --tp-plan "$here/ep_tp_plan.json" --threads 1 --new-tokens 32 \
    --reps 3 2>/dev/null
echo "== $(uptime)"
"$bin" bench decode --model "$model" --tp 2 --threads 1 --new-tokens 32 --reps 3 2>/dev/null
echo "== $(uptime)"
"$bin" bench model --mode decode --model "$model" --tp 1 --threads 2 --new-tokens 32 --reps 3 2>/dev/null
echo "== $(uptime)"
}
main "$@"
