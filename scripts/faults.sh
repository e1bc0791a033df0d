#!/usr/bin/env bash
# Fault injection: SIGKILL or SIGSTOP one random rank of
# a `tensorpar generate --tp 2|4` job at a random moment, N runs per case;
# every run must end within 5 s, non-zero, naming the rank, leaving nothing.
#   bash scripts/faults.sh [N] [more tests/faults/faults.py options]
# Builds build/tensorpar first if it is missing.  N defaults to 100.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-100}
shift || true
if [ ! -x build/tensorpar ]; then
    cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build build -j"$(nproc)" --target tensorpar_cli
fi
exec /usr/bin/python3 tests/faults/faults.py --bin build/tensorpar --runs "$runs" "$@"
