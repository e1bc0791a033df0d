#!/usr/bin/env bash
# Compares the speed of two builds of tensorpar in one run (bench/README.md,
# "Comparing two builds").  Builds BASE_REV and NEW_REV (default: the working
# tree as it is, uncommitted changes included) each from its own copy of the
# sources into its own build folder (Release, as scripts/demo.sh builds), warms
# both up, then runs the benchmarks with the two binaries alternating round
# by round (old new, new old, old new, ...), and prints for every metric the
# median speed ratio new/old with its range over the rounds and a verdict.
#
# usage: bench/compare-builds.sh [options] BASE_REV [NEW_REV|worktree]
#        bench/compare-builds.sh [options] --bins OLD_BIN NEW_BIN
#   --quick         the parts forward,decode,comm with short prompts (~5 min idle)
#   --rounds N      rounds (default 3); each runs every part once per build
#   --parts LIST    comma-separated, of all,forward,decode,comm,kernels
#                   (default all,comm; --quick: forward,decode,comm)
#   --tol F         tolerance of the verdict (default 0.05 = 5 %)
#   --seq N, --new-tokens N   prefill tokens, decode steps (512, 128; --quick 128, 32)
#   --model DIR     model to run (default: the qwen3-0.6b preset, bf16,
#                   made once by the old build in the work folder)
#   --work DIR      sources, builds and results (default /tmp/tp-compare-builds)
#   --targets LIST  CMake targets to build (default tensorpar_cli)
#   --bins          the two arguments are tensorpar binaries already built:
#                   no build (the tests use it)
# exit status: 0 no slowdown, 3 slowdown, 1 failure (build, run), 2 usage.
set -euo pipefail

# The whole script is one function, read by bash before it runs: the run
# takes tens of minutes, and the working tree (NEW_REV "worktree") may be
# edited or checked out meanwhile.
main() {

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

bins=0 quick=0 rounds=3 seq_opt="" ntok_opt="" parts="" tol=0.05 model="" work=/tmp/tp-compare-builds targets=tensorpar_cli
pos=()
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) quick=1 ;;
        --bins) bins=1 ;;
        --seq) seq_opt=${2:?}; shift ;;
        --new-tokens) ntok_opt=${2:?}; shift ;;
        --rounds) rounds=${2:?}; shift ;;
        --parts) parts=${2:?}; shift ;;
        --tol) tol=${2:?}; shift ;;
        --model) model=${2:?}; shift ;;
        --work) work=${2:?}; shift ;;
        --targets) targets=${2:?}; shift ;;
        -h|--help) usage ;;
        -*) echo "compare-builds: unknown option $1" >&2; usage ;;
        *) pos+=("$1") ;;
    esac
    shift
done
if [ ${#pos[@]} -lt 1 ] || [ ${#pos[@]} -gt 2 ]; then usage; fi
[ $bins = 0 ] || [ ${#pos[@]} = 2 ] || usage
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "compare-builds: --rounds must be a positive integer" >&2; exit 2; }
base=${pos[0]} newrev=${pos[1]:-worktree}
[ -n "$parts" ] || { [ $quick = 1 ] && parts=forward,decode,comm || parts=all,comm; }
for p in ${parts//,/ }; do
    case "$p" in all|forward|decode|comm|kernels) ;;
        *) echo "compare-builds: unknown part '$p' (all, forward, decode, comm, kernels)" >&2; exit 2 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
work=$(cd "$work" && pwd)

# build REV: prints the tensorpar binary of REV.  A commit is exported with
# `git archive` into its own folder (no worktree left registered) and built
# once: the folders are kept under the commit id, so a second compare of the
# same commit does not rebuild.  "worktree" builds the checkout as it is.
build() {
    local rev=$1 src bdir
    if [ "$rev" = worktree ]; then
        # one folder per checkout: CMake refuses a build folder made from
        # another source folder
        src=$root bdir=$work/build-worktree-$(printf %s "$root" | md5sum | cut -c1-8)
    else
        local sha
        sha=$(git -C "$root" rev-parse --verify --quiet "$rev^{commit}") ||
            { echo "compare-builds: no commit '$rev'" >&2; return 1; }
        src=$work/src-${sha:0:12} bdir=$work/build-${sha:0:12}
        if [ ! -f "$src/CMakeLists.txt" ]; then
            rm -rf "$src" && mkdir -p "$src"
            git -C "$root" archive "$sha" | tar -x -C "$src"
        fi
    fi
    echo "== build $rev ($src -> $bdir)" >&2
    nice cmake -S "$src" -B "$bdir" -DCMAKE_BUILD_TYPE=Release >"$work/cmake.log" 2>&1 ||
        { cat "$work/cmake.log" >&2; return 1; }
    # shellcheck disable=SC2086
    nice cmake --build "$bdir" -j"$(nproc)" --target ${targets//,/ } >"$work/cmake.log" 2>&1 ||
        { tail -40 "$work/cmake.log" >&2; return 1; }
    echo "$bdir/tensorpar"
}

describe() {
    if [ $bins = 1 ]; then
        echo "$1"
    elif [ "$1" = worktree ]; then
        echo "worktree at $(git -C "$root" describe --always --dirty)"
    else
        echo "$1 = $(git -C "$root" rev-parse --short "$1^{commit}")"
    fi
}

t0=$(date +%s)
if [ $bins = 1 ]; then
    old=$(realpath "$base") new=$(realpath "$newrev")
    for b in "$old" "$new"; do
        [ -x "$b" ] || { echo "compare-builds: $b is not an executable" >&2; exit 2; }
    done
else
    old=$(build "$base")
    new=$(build "$newrev")
fi

if [ -z "$model" ]; then
    model=$work/qwen3-0.6b
    [ -f "$model/config.json" ] ||
        "$old" make-model --arch qwen3 --preset qwen3-0.6b --dtype bf16 --out "$model" >/dev/null
fi

if [ $quick = 1 ]; then seq=128 ntok=32 batches=11 maxb=4194304
else seq=512 ntok=128 batches=25 maxb=16777216; fi
seq=${seq_opt:-$seq} ntok=${ntok_opt:-$ntok}

# part_cmd PART: the arguments of `tensorpar` for one measurement of PART.
part_cmd() {
    case "$1" in
        all) echo "bench all --model $model --seq $seq --new-tokens $ntok --reps 1 --max-tp 2 --json" ;;
        forward) echo "bench forward --model $model --seq $seq --tp 2 --dtype f32 --reps 3 --json" ;;
        decode) echo "bench decode --model $model --new-tokens $ntok --tp 2 --dtype bf16 --reps 1 --json" ;;
        comm) echo "bench comm --backend shm -n 2 --max-bytes $maxb --batches $batches --json" ;;
        kernels) echo "bench kernels --quick" ;;
    esac
}

raw=$work/run-$(date -u +%Y%m%d-%H%M%S)
mkdir -p "$raw"
{
    echo "old: $(describe "$base")"
    echo "new: $(describe "$newrev")"
    echo "parts: $parts, rounds: $rounds, quick: $quick, tolerance: $tol, model: $model"
    echo "isa: $("$new" --isa-list 2>/dev/null | grep chosen || echo '?')"
    echo "started $(date -u '+%F %T') UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$raw/info.txt"

# Warm-up, untimed: the model's pages into the page cache and, since this
# machine backs memory lazily, first touches of as much memory as a run
# uses (f32 weights for a prefill, bf16 for decode), for both builds.
echo "== warm-up"
for b in "$old" "$new"; do
    if ! { "$b" bench forward --model "$model" --seq 64 --tp 2 --dtype f32 --reps 1 >/dev/null 2>"$raw/warmup.err" &&
           "$b" bench decode --model "$model" --new-tokens 8 --tp 2 --dtype bf16 --reps 1 >/dev/null 2>"$raw/warmup.err"; }; then
        echo "compare-builds: the warm-up of $b failed:" >&2; tail -5 "$raw/warmup.err" >&2; exit 1
    fi
done

for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for p in ${parts//,/ }; do
        for side in $order; do
            bin=$old; [ "$side" = new ] && bin=$new
            f=$raw/r$r-$p-$side
            cut -d' ' -f1-3 /proc/loadavg >"$f.load"
            echo "r$r $p $side" >>"$raw/order.txt"
            echo "== round $r/$rounds: $p, $side build (load average $(cat "$f.load"))"
            # shellcheck disable=SC2046
            "$bin" $(part_cmd "$p") >"$f.out" 2>"$f.err" ||
                { echo "compare-builds: $side build failed on '$p' (round $r): see $f.err" >&2
                  tail -5 "$f.err" >&2; exit 1; }
        done
    done
done

echo "== done in $(( $(date +%s) - t0 )) s (builds included); raw outputs in $raw"
echo
rc=0
/usr/bin/python3 "$root/bench/compare_builds.py" "$raw" "$tol" "$raw/summary.json" | tee "$raw/summary.txt" ||
    rc=${PIPESTATUS[0]}
exit "$rc"
}
main "$@"
