#!/usr/bin/env bash
# Installs the Debian 12 packages that tensorpar's build, tests and benchmarks
# need.  Idempotent: packages already present are left alone.
set -euo pipefail

packages=(
  build-essential cmake git pkg-config clang libclang-rt-14-dev
  libcjson-dev libopenblas-dev libpcre2-dev libutf8proc-dev
  libopenmpi-dev openmpi-bin
  libedit-dev python3-numpy python3-torch gnuplot-nox
  qemu-user
)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
