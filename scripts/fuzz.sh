#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz, clang, ASan + UBSan, in
# build-fuzz/) and runs each for N executions (default 1000000):
#   scripts/fuzz.sh [N] [harness...]
# Each harness starts from a copy of its seed corpus (tests/fuzz/corpus/<h>/,
# left untouched) in build-fuzz/corpus/<h>/, which keeps what the run found.
# Fails on any crash, leak, timeout, out-of-memory or sanitizer report; the
# input that caused it is saved as build-fuzz/artifacts/<h>-*.  Prints one
# summary line per harness: executions, exec/s, seconds, corpus size.
# FUZZ_JOBS=k runs k harnesses at a time (default 1).  FUZZ_SUMMARY_ONLY=1
# prints the summary of the last runs' logs without building or running.
# FUZZ_BUILD_DIR=dir builds and runs somewhere else than build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-1000000}
shift || true
jobs=${FUZZ_JOBS:-1}
build=${FUZZ_BUILD_DIR:-build-fuzz}

if [ -z "${FUZZ_SUMMARY_ONLY:-}" ]; then
    CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTP_FUZZ=ON -DTP_WERROR=ON >/dev/null
    cmake --build "$build" -j"$(nproc)" --target fuzz_all >/dev/null
fi

# Bigger inputs only slow the harnesses down: the largest seed of each
# (the Qwen3 chat template, a byte-level tokenizer.json) fits with room.
max_len() {
    case "$1" in
        fuzz_tokenizer_load) echo 8192 ;;
        fuzz_chat_template) echo 8192 ;;
        fuzz_tokenize) echo 256 ;;
        fuzz_st_index) echo 2048 ;;
        *) echo 4096 ;;
    esac
}

harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
    for f in tests/fuzz/fuzz_*.c; do
        h=$(basename "$f" .c)
        [ "$h" = fuzz_util ] || harnesses+=("$h")
    done
fi

# Harnesses whose entry points take paths write each input to a scratch
# file: on tmpfs that costs microseconds, on a disk it costs 5-10x the run.
scratch=$(mktemp -d /dev/shm/tp-fuzz.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TMPDIR=$scratch

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:allocator_may_return_null=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p "$build/artifacts" "$build/logs"
if [ -z "${FUZZ_SUMMARY_ONLY:-}" ]; then
    for h in "${harnesses[@]}"; do rm -f "$build/logs/$h".*; done
fi

run_one() {
    local h=$1 log="$build/logs/$1.log" work="$build/corpus/$1"
    rm -rf "$work" && mkdir -p "$work" && cp tests/fuzz/corpus/"$h"/* "$work"/
    local rc=0 t0
    t0=$(date +%s.%N)
    "$build/fuzz/$h" -runs="$runs" -max_len="$(max_len "$h")" -timeout=30 -rss_limit_mb=4096 \
        -print_final_stats=1 -artifact_prefix="$build/artifacts/$h-" "$work" >"$log" 2>&1 || rc=$?
    echo "$rc" >"$build/logs/$h.rc"
    echo "$t0 $(date +%s.%N)" >"$build/logs/$h.time"
}

running=0
for h in "${harnesses[@]}"; do
    [ -n "${FUZZ_SUMMARY_ONLY:-}" ] && break
    run_one "$h" &
    running=$((running + 1))
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
done
wait

fail=0
for h in "${harnesses[@]}"; do
    log="$build/logs/$h.log"
    rc=$(cat "$build/logs/$h.rc")
    # A run that stopped early lacks some of these lines: '?' then.
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1 || true)
    # Wall time of the whole run (loading included); libFuzzer's own figures
    # are whole seconds.
    secs=$(awk '{printf "%.1f", $2 - $1}' "$build/logs/$h.time")
    rate=$(awk -v n="${execs:-0}" -v t="$secs" 'BEGIN {printf("%.0f", (t > 0) ? n / t : 0)}')
    corp=$( (grep -o 'corp: [0-9]*/[0-9]*[a-zA-Z]*' "$log" || true) | tail -1 | sed 's/corp: //')
    reports=$(grep -cE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error:|SUMMARY: ' "$log" || true)
    status=ok
    if [ "$rc" != 0 ] || [ "$reports" != 0 ]; then status="FAILED (exit $rc; see $log)"; fail=1; fi
    printf '%-24s execs %-9s exec/s %-7s time %7ss  corpus %-12s %s\n' \
        "$h" "${execs:-?}" "${rate:-?}" "${secs:-?}" "${corp:-?}" "$status"
done
if [ "$fail" != 0 ]; then
    echo "fuzz: FAILED (crashing inputs are in $build/artifacts/)"
    for h in "${harnesses[@]}"; do
        [ "$(cat "$build/logs/$h.rc")" = 0 ] || { echo "== $h"; grep -A25 -m1 -E 'ERROR|runtime error|abort|Abort' "$build/logs/$h.log" || tail -30 "$build/logs/$h.log"; }
    done
    exit 1
fi
echo "fuzz: all ${#harnesses[@]} harnesses ran $runs executions: 0 crashes, 0 leaks, 0 sanitizer reports"
