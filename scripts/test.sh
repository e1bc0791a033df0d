#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine:
#   1. install the Debian packages,
#   2. build with gcc (-Wall -Wextra -Werror) and run every test, on the
#      kernel path this CPU (or TENSORPAR_ISA) chooses,
#   3. run the tests of the kernels, the reference logits, TP inference and
#      the benchmarks once more on each other path the CPU supports
#      (`tensorpar --isa-list`: scalar, avx2, avx512, amx), and the q8_0/q4_0
#      ones on avx512 as a CPU without AVX512_VNNI (TENSORPAR_NO_VNNI=1),
#   4. build with clang under AddressSanitizer + UBSan and run every test again.
# Each step ends with a line "== STEP: W s (CPU U s user, S s sys)": wall
# seconds and the CPU time of everything the step ran.
set -euo pipefail
cd "$(dirname "$0")/.."

# step NAME COMMAND...: runs COMMAND under the heading NAME, then its times.
step() {
  local name=$1 TIMEFORMAT
  shift
  echo "== $name"
  TIMEFORMAT="== $name: %0R s (CPU %0U s user, %0S s sys)"
  time "$@"
}
suite_start=$SECONDS

step "install-deps" bash scripts/install-deps.sh

jobs=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# OpenMPI keeps some allocations until exit; they are not ours.
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

gcc_build() {
  CC=gcc cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON >/dev/null
  cmake --build build -j"$jobs"
}
step "gcc build, -Werror" gcc_build
step "gcc tests" bash -c "cd build && ctest --output-on-failure -j$jobs"

# The suite above ran the chosen path; the others this CPU has get the tests
# that tell paths apart (about 1 minute per path on 2 cores).
per_path='^(unit\.test_(kernels|kernels_amx|kernel_grad|gemm|attention|isa|comm_reduce|q8|q4)|e2e\.test_(reference_logits|tp_inference|bench|isa|q8|q4|matmul_bf16))$'
for isa in $(build/tensorpar --isa-list | grep -v ' (chosen)$'); do
  step "gcc tests on the $isa path" \
    bash -c "cd build && TENSORPAR_ISA=$isa ctest --output-on-failure -j$jobs -R '$per_path'"
done
# An AVX-512 CPU without AVX512_VNNI (Skylake-X) runs the AVX2 q8_0/q4_0
# kernels on its avx512 path; TENSORPAR_NO_VNNI=1 takes that branch here.
if build/tensorpar --isa-list | grep -q '^avx512'; then
  step "gcc tests on the avx512 path without VNNI (TENSORPAR_NO_VNNI=1)" \
    bash -c "cd build && TENSORPAR_ISA=avx512 TENSORPAR_NO_VNNI=1 ctest --output-on-failure -j$jobs \
      -R '^(unit\.test_(q8|q4|isa)|e2e\.test_(q8|q4))$'"
fi

asan_build() {
  CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTP_SANITIZE=ON -DTP_WERROR=ON >/dev/null
  cmake --build build-asan -j"$jobs"
}
step "clang build, AddressSanitizer + UBSan, -Werror" asan_build
step "sanitized tests" bash -c "cd build-asan && ctest --output-on-failure -j$jobs"

# Two harnesses at a time: each is one process.
step "fuzz smoke: each libFuzzer harness for 3000 executions (clang, ASan + UBSan)" \
  env FUZZ_JOBS="$jobs" bash scripts/fuzz.sh 3000
echo "== all steps: $((SECONDS - suite_start)) s"
