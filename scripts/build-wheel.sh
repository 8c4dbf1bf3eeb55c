#!/usr/bin/env bash
# Builds the opguard wheel for the torch of PYTHON's venv and repairs it:
#   scripts/build-wheel.sh PYTHON OUT_DIR [BUILD_DIR]
# 1. `PYTHON -m pip wheel ./python`: the package, the shim, the adapter (built
#    against PYTHON's torch), opguardd and the opguard CLI (python/pyproject.toml);
# 2. `auditwheel repair`: the shared libraries they need that a bare machine
#    lacks (ZeroMQ, RocksDB, spdlog, fmt, compression, ...) copied into the
#    wheel (opguard.libs/) with their paths fixed, tagged manylinux for this
#    machine's glibc. torch's own libraries (and the libgomp torch loads) stay
#    out: the adapter uses the ones of the torch it runs in.
# Prints the repaired wheel's path. BUILD_DIR (default OUT_DIR/build) is kept,
# so a rebuild is incremental; ccache is used when present.
set -euo pipefail
PYTHON="${1:?usage: build-wheel.sh PYTHON OUT_DIR [BUILD_DIR]}"
OUT="${2:?usage: build-wheel.sh PYTHON OUT_DIR [BUILD_DIR]}"
BUILD="${3:-$OUT/build}"
SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$("$SOURCE/scripts/wheel-tools.sh")"

mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
rm -rf "$OUT/raw" "$OUT/repaired"
settings=("--config-settings=build-dir=$BUILD")
if command -v ccache >/dev/null; then
  settings+=("--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache"
             "--config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache")
fi
"$PYTHON" -m pip wheel -q --no-deps --disable-pip-version-check "${settings[@]}" \
  -w "$OUT/raw" "$SOURCE/python" >&2

# The glibc this machine has: the oldest one the wheel can claim.
glibc="$(getconf GNU_LIBC_VERSION)"  # "glibc 2.36"
glibc="${glibc#glibc }"
plat="manylinux_${glibc/./_}_$(uname -m)"
# torch's libraries, as the adapter names them: the running torch's own. And
# the shim by its soname: the package loads lib/libopguard_shim.so first
# (opguard/_native.py), which is what the adapter's libopguard_shim.so.1 names.
excludes=()
for lib in libtorch.so libtorch_cpu.so libtorch_python.so libc10.so libc10_cuda.so \
           libtorch_cuda.so libgomp.so.1 libopguard_shim.so.1; do
  excludes+=(--exclude "$lib")
done
PATH="$TOOLS/bin:$PATH" "$TOOLS/bin/auditwheel" repair -w "$OUT/repaired" --plat "$plat" \
  "${excludes[@]}" "$OUT"/raw/opguard-*.whl >&2
ls "$OUT"/repaired/opguard-*.whl
