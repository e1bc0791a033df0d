#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine:
#   1. install the Debian packages,
#   2. build with gcc (-Wall -Wextra -Werror) and run every test,
#   3. build with clang under AddressSanitizer + UBSan and run every test again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

jobs=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OpenMPI keeps some allocations until exit; they are not ours.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

echo "== gcc build, -Werror"
CC=gcc cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON >/dev/null
cmake --build build -j"$jobs"
echo "== gcc tests"
(cd build && ctest --output-on-failure -j"$jobs")

echo "== clang build, AddressSanitizer + UBSan, -Werror"
CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTP_SANITIZE=ON -DTP_WERROR=ON >/dev/null
cmake --build build-asan -j"$jobs"
echo "== sanitized tests"
(cd build-asan && ctest --output-on-failure -j"$jobs")

echo "== fuzz smoke: each libFuzzer harness for 3000 executions (clang, ASan + UBSan)"
bash scripts/fuzz.sh 3000
