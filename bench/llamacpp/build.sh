#!/usr/bin/env bash
# Builds llama.cpp's llama-bench and llama-simple from the source that npm's
# node-llama-cpp@3.22.1 ships (llama/gitRelease.bundle, a git bundle), CPU
# backend only, native instructions, Release.  Everything goes under one
# cache folder; a finished build is kept and not redone.  Builds in the same
# cache folder take turns (flock on CACHE/.build.lock).
#   bash bench/llamacpp/build.sh [CACHE]   (default: <repo>/build-llamacpp)
# Prints the folder that holds the two binaries.
set -euo pipefail

# One function, read whole before it runs: the build takes many minutes and
# the checkout may change meanwhile.
main() {
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${1:-$root/build-llamacpp}
pkg=node-llama-cpp@3.22.1
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
# One build at a time per cache folder: two harness runs building at once
# in the same folder broke a link.  The second waits here, then finds the
# first one's finished build below.  The lock goes with this process.
exec 9>"$cache/.build.lock"
if ! flock -n 9; then
    echo "== waiting for another build in $cache" >&2
    flock 9
fi
bin=$cache/build/bin
if [ -x "$bin/llama-bench" ] && [ -x "$bin/llama-simple" ]; then echo "$bin"; return 0; fi

# The package only, no install scripts (they would download prebuilt
# binaries) and no optional dependencies (the prebuilt binaries themselves).
bundle=$cache/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
if [ ! -f "$bundle" ]; then
    echo "== npm install $pkg (into $cache/npm)" >&2
    mkdir -p "$cache/npm"
    npm install --prefix "$cache/npm" --ignore-scripts --omit=optional --no-audit --no-fund \
        --no-package-lock "$pkg" >&2
fi
src=$cache/llama.cpp
if [ ! -f "$src/CMakeLists.txt" ]; then
    echo "== llama.cpp source from $bundle" >&2
    rm -rf "$src"
    git -c advice.detachedHead=false clone --quiet "$bundle" "$src" >&2
fi
echo "== llama.cpp $(git -C "$src" rev-parse --short HEAD) ($(cat "$cache/npm/node_modules/node-llama-cpp/llama/llama.cpp.info.json" | tr -d ' \n'))" >&2
# The tools and examples are configured but only the two targets are built;
# no server, no tests, no HTTPS.
nice cmake -S "$src" -B "$cache/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_BLAS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >"$cache/cmake.log" 2>&1 ||
    { tail -30 "$cache/cmake.log" >&2; exit 1; }
echo "== building llama-bench and llama-simple (log: $cache/build.log)" >&2
nice cmake --build "$cache/build" -j"$(nproc)" --target llama-bench llama-simple >"$cache/build.log" 2>&1 ||
    { tail -40 "$cache/build.log" >&2; exit 1; }
echo "$bin"
}

main "$@"
