#!/usr/bin/env bash
# The unit and end-to-end tests on 64-bit ARM, from an x86-64 Debian 12 host:
#   1. install the cross compiler, qemu-user and the arm64 -dev libraries
#      (idempotent, like scripts/install-deps.sh),
#   2. cross-build into build-arm64 with cmake/aarch64-linux-gnu.cmake
#      (gcc -Wall -Wextra -Werror, Release, no MPI),
#   3. run ctest there, every program under qemu-aarch64.
# Extra arguments go to ctest (e.g. -R unit. to run the unit tests only).
#
# The CLI starts its ranks by executing itself, and the e2e tests execute it
# directly, so the kernel must know to hand arm64 programs to qemu
# (binfmt_misc).  The script registers qemu-aarch64 in a binfmt_misc instance
# of its own, in a new user and mount namespace (Linux 6.7 or later), so the
# host's binfmt_misc is left alone; where the host already has qemu-aarch64
# registered (package qemu-user-binfmt), that is used instead.
set -euo pipefail
cd "$(dirname "$0")/.."

# Inside the namespace (see the end): register qemu and run the tests.
if [ "${1:-}" = "--in-namespace" ]; then
  shift
  if ! mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc; then
    echo "test-arm64: no binfmt_misc of our own here (it needs Linux 6.7 or later);" \
         "install qemu-user-binfmt to register qemu-aarch64 for the whole host" >&2
    exit 1
  fi
  # ELF64, little-endian, EM_AARCH64 (183); F: qemu is opened now, once.
  printf '%s' ':qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00:\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff:/usr/bin/qemu-aarch64:F' \
    > /proc/sys/fs/binfmt_misc/register
  cd build-arm64
  exec ctest --output-on-failure -j"$(nproc)" "$@"
fi

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
bash scripts/install-deps.sh   # host tools: cmake, pkg-config, python3-numpy
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "test-arm64: adding the arm64 architecture to dpkg"
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -qq
fi
packages=(
  gcc-aarch64-linux-gnu qemu-user
  libcjson-dev:arm64 libopenblas-dev:arm64 libpcre2-dev:arm64 libutf8proc-dev:arm64 libedit-dev:arm64
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-arm64: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

echo "== arm64 cross build (aarch64-linux-gnu-gcc, -Werror)"
cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
      -DCMAKE_BUILD_TYPE=Release -DTP_WERROR=ON >/dev/null
cmake --build build-arm64 -j"$(nproc)"

echo "== arm64 tests under qemu-aarch64"
if [ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ] &&
   grep -qx enabled /proc/sys/fs/binfmt_misc/qemu-aarch64; then
  cd build-arm64
  exec ctest --output-on-failure -j"$(nproc)" "$@"
fi
exec unshare --user --map-root-user --mount --propagation private \
     bash "$PWD/scripts/test-arm64.sh" --in-namespace "$@"
