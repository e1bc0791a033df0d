#!/usr/bin/env bash
# tensorpar side by side with llama.cpp (bench/README.md, "Side by side with
# llama.cpp"), one command: builds llama.cpp from the source npm's
# node-llama-cpp@3.22.1 ships (build.sh, cached), makes the model with
# tensorpar make-model (cached), converts it to GGUF with our converter
# (convert.py; one file per dtype, cached), then runs llama-bench pp/tg and
# `tensorpar bench model` prefill/decode in interleaved rounds (compare.py),
# writes the table into bench/README.md and draws the chart.
#
# usage: bash bench/llamacpp/run.sh [options]
#   --rounds N        rounds (default 3; --quick 1)
#   --threads LIST    thread counts (default 1,2): 1 pairs TP=1x1 with
#                     llama.cpp -t 1; T > 1 pairs TP=1xT and TP=Tx1 with -t T
#   --dtypes LIST     of bf16, f32, q8_0, q4_0, bf16-dot (default bf16,f32,q8_0);
#                     bf16-dot: tensorpar's bf16 with --matmul bf16
#                     (activations rounded to bf16, as llama.cpp's bf16 does)
#                     against the bf16 GGUF — the like-for-like bf16 figure
#   --preset NAME     make-model preset (default llama-3.2-1b; --quick tiny)
#   --arch ARCH       llama, qwen3, or an MoE type: qwen3_moe, mixtral,
#                     deepseek_v2, deepseek_v3 (default llama); the tokenizer
#                     is the repository's Llama 3 one (llama, mixtral) or
#                     Qwen3 one.  An MoE model's q8_0 GGUF keeps the experts
#                     as stored (convert.py --experts stored), as tensorpar's
#                     --dtype q8_0 does, so that both run the same weights
#   --layers N        num_hidden_layers of the made model (a real-size MoE
#                     preset with a few layers: --arch qwen3_moe --preset
#                     qwen3-30b-a3b --layers 2)
#   --pp N, --tg N    prefill and decode tokens (default 512, 128)
#   --quick           tiny model, 1 round: proves the plumbing, measures
#                     nothing; the README is left alone
#   --bin FILE        tensorpar binary (default build/tensorpar)
#   --cache DIR       llama.cpp, models, GGUF files (default build-llamacpp)
#   --no-readme       leave bench/README.md alone (the default for any
#                     --arch but llama: the README's table is the llama one;
#                     --readme writes it anyway)
set -euo pipefail

main() {
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
rounds="" threads=1,2 dtypes=bf16,f32,q8_0 preset="" arch=llama pp=512 tg=128 quick=0 layers=""
bin=$root/build/tensorpar cache=$root/build-llamacpp readme=""
args="$*"
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) rounds=${2:?}; shift ;;
        --threads) threads=${2:?}; shift ;;
        --dtypes) dtypes=${2:?}; shift ;;
        --preset) preset=${2:?}; shift ;;
        --arch) arch=${2:?}; shift ;;
        --layers) layers=${2:?}; shift ;;
        --pp) pp=${2:?}; shift ;;
        --tg) tg=${2:?}; shift ;;
        --quick) quick=1 ;;
        --bin) bin=${2:?}; shift ;;
        --cache) cache=${2:?}; shift ;;
        --no-readme) readme=0 ;;
        --readme) readme=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; return 0 ;;
        *) echo "run.sh: unknown option $1 (see --help)" >&2; return 2 ;;
    esac
    shift
done
[ $quick = 1 ] && { rounds=${rounds:-1}; preset=${preset:-tiny}; readme=0; }
rounds=${rounds:-3} preset=${preset:-llama-3.2-1b}
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --rounds must be a positive integer" >&2; return 2; }
for d in ${dtypes//,/ }; do
    case "$d" in bf16|f32|q8_0|q4_0|bf16-dot) ;; *) echo "run.sh: unknown dtype $d (bf16, f32, q8_0, q4_0, bf16-dot)" >&2; return 2 ;; esac
done
moe=0
case "$arch" in llama) tok=llama3 ;; qwen3) tok=qwen3 ;; mixtral) tok=llama3 moe=1 ;;
    qwen3_moe|deepseek_v2|deepseek_v3) tok=qwen3 moe=1 ;;
    *) echo "run.sh: --arch llama, qwen3, qwen3_moe, mixtral, deepseek_v2 or deepseek_v3" >&2; return 2 ;; esac
[ -z "$layers" ] || [[ "$layers" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --layers must be a positive integer" >&2; return 2; }
[ -n "$readme" ] || { [ "$arch" = llama ] && readme=1 || readme=0; }
[ -x "$bin" ] || { echo "run.sh: no tensorpar binary at $bin (build it, or --bin)" >&2; return 2; }
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)

llama_bin=$(bash "$here/build.sh" "$cache")

# The checkpoint: bf16 as the presets store it; tensorpar converts to each
# dtype at load, the converter to each GGUF file.
name=$arch-$preset${layers:+-${layers}l}
model=$cache/models/$name
if [ ! -f "$model/config.json" ]; then
    echo "== make-model $arch $preset -> $model" >&2
    rm -rf "$model.tmp" && mkdir -p "$(dirname "$model")"
    # tiny's MLP (160) would split into rows of 80 at TP=2, not whole Q8_0
    # blocks of 32: 256 lets --quick run every configuration
    sets=(); [ "$preset" = tiny ] && sets=(--set intermediate_size=256)
    [ -n "$layers" ] && sets+=(--set "num_hidden_layers=$layers")
    "$bin" make-model --arch "$arch" --preset "$preset" --dtype bf16 --tokenizer "$root/tests/data/tokenizers/$tok" \
        "${sets[@]}" --out "$model.tmp" >&2
    mv "$model.tmp" "$model"
fi
ggufs=()
for d in ${dtypes//,/ }; do
    d=${d%-dot}   # bf16-dot runs llama.cpp on the bf16 file
    g=$cache/models/$name.$d.gguf
    newer=0
    for src in convert.py gguf.py checkpoint.py tensormap.py; do [ "$g" -ot "$here/$src" ] && newer=1; done
    if [ ! -f "$g" ] || [ $newer = 1 ]; then
        echo "== convert -> $g" >&2
        xs=(); [ $moe = 1 ] && [ "$d" = q8_0 ] && xs=(--experts stored)
        # convert.py writes a temporary file and renames it: no half-written GGUF
        /usr/bin/python3 "$here/convert.py" "$model" "$g" --dtype "$d" --name "$name" "${xs[@]}"
    fi
    ggufs+=(--gguf "$d=$g")
done
[[ ",$dtypes," == *,bf16-dot,* ]] && ggufs+=(--gguf "bf16-dot=$cache/models/$name.bf16.gguf")

out=$cache/runs/$(date -u +%Y%m%d-%H%M%S)
opts=()
if [ $readme = 1 ]; then
    opts+=(--readme "$root/bench/README.md" --png "$root/bench/llamacpp/vs-llamacpp-$name.png")
else
    opts+=(--png "$out/vs-llamacpp.png")
fi
[ $quick = 1 ] && opts+=(--quick)
echo "== rounds: $out" >&2
/usr/bin/python3 "$here/compare.py" --tensorpar "$bin" --llama-bin "$llama_bin" --model "$model" "${ggufs[@]}" \
    --rounds "$rounds" --threads "$threads" --dtypes "$dtypes" --pp "$pp" --tg "$tg" --out "$out" \
    --args="$args" "${opts[@]}"
}

main "$@"
