#!/usr/bin/env bash
# Prepares, on a development machine (Debian 12, network), what a lent GPU
# machine lacks to build and run OpGuard's daemon, CLI, shim and adapter:
# the headers, CMake/pkg-config files and libraries of ZeroMQ/cppzmq, RocksDB
# (and its compression libraries), FlatBuffers (flatc too), the Boost headers
# the daemon includes, spdlog/fmt, CLI11, nlohmann-json, xxhash, GoogleTest,
# and pkg-config itself. They come from the Debian packages' files (apt-get
# download + dpkg-deb -x, the versions installed here by setup-deps.sh), laid
# out as one relocatable prefix in an ignored folder that travels with the
# checkout (default gpu-bundle/, at most 60 MiB). The GPU machine brings its
# own compiler, CMake, CUDA, Python and torch; scripts/gpu-check.sh uses the
# bundle through its env.sh.
#
#   scripts/gpu-bundle.sh [DIR]           build the bundle (replaces DIR)
#   scripts/gpu-bundle.sh --check [DIR]   configure and build the project in a
#       clean temporary folder with CMake pointed at the bundle alone (system
#       packages hidden from CMake and pkg-config; afterwards no header or
#       library of a bundled dependency may have come from /usr), then start
#       opguardd, ask it `opguard status`, stop it, and run a unit test binary,
#       with LD_LIBRARY_PATH at the bundle.
#
# Shared libraries that every Ubuntu/Debian base system has (glibc, the GCC
# runtime, zlib, zstd, lz4, bzip2) are not shipped: the GPU machine's own,
# newer ones are used. Everything else a bundled library needs is.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CHECK=0
if [[ "${1:-}" == "--check" ]]; then
  CHECK=1
  shift
fi
OUT="$(realpath -m "${1:-$ROOT/gpu-bundle}")"
MAX_MIB=60
ARCH="$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)"

# ---- --check ----------------------------------------------------------------
if ((CHECK)); then
  [[ -f "$OUT/env.sh" ]] || { echo "gpu-bundle: no bundle in $OUT (run without --check first)" >&2; exit 2; }
  # shellcheck disable=SC1091
  source "$OUT/env.sh"
  # Under /work when possible, so ccache (base_dir /work) reuses a previous check.
  BUILD="$(mktemp -d "${OPGUARD_BUNDLE_CHECK_DIR:-$ROOT}/build-bundle-check.XXXXXX")"
  # OPGUARD_BUNDLE_KEEP=1 keeps it for a look after a failure.
  [[ "${OPGUARD_BUNDLE_KEEP:-0}" == 1 ]] || trap 'rm -rf "$BUILD"' EXIT
  echo "gpu-bundle: configuring in $BUILD against $OUT only"
  # No CUDA, torch or benchmarks: this proves the bundled dependencies; the
  # GPU machine adds its own CUDA and torch. CMake may not search the system
  # (so tools are named by path); pkg-config sees the bundle's files alone.
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPGUARD_WERROR=ON \
    -DOPGUARD_WITH_CUDA=OFF -DOPGUARD_WITH_TORCH=OFF -DOPGUARD_BUILD_BENCH=OFF \
    ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER="$CMAKE_CXX_COMPILER_LAUNCHER"} \
    "${OPGUARD_BUNDLE_CMAKE_ARGS[@]}" -DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF \
    -DCMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH=OFF -DCMAKE_MAKE_PROGRAM="$(command -v ninja)" \
    -DCMAKE_C_COMPILER="$(command -v "${CC:-gcc}")" -DCMAKE_CXX_COMPILER="$(command -v "${CXX:-g++}")" \
    -DPython3_EXECUTABLE="$(command -v python3)" >"$BUILD/configure.log" 2>&1 ||
    { tail -30 "$BUILD/configure.log"; echo "gpu-bundle: configure failed" >&2; exit 1; }
  targets=(opguardd opguard opguard_shim opguard-loadgen shim_core_test)
  cmake --build "$BUILD" -j "${OPGUARD_JOBS:-$(nproc)}" --target "${targets[@]}" >"$BUILD/build.log" 2>&1 ||
    { grep -m20 -E "error|Error" "$BUILD/build.log"; echo "gpu-bundle: build failed" >&2; exit 1; }
  # The compiler still searches /usr/include after the bundle: prove that no
  # header of a bundled dependency and no bundled library came from there.
  bundled='(boost|zmq|zmq\.hpp|zmq_addon\.hpp|rocksdb|flatbuffers|spdlog|fmt|CLI|nlohmann|xxhash\.h|gtest|gmock|lz4[a-z]*\.h|zstd[a-z_]*\.h)'
  leaks="$(ninja -C "$BUILD" -t deps | grep -E "^ +/usr/include/$bundled" | sort -u || true)"
  leaks+="$(grep -oE "/usr/lib/$ARCH/lib(zmq|rocksdb|spdlog|fmt|flatbuffers|gtest|gmock|lz4|zstd|xxhash|snappy|gflags)[^ ]*" \
              "$BUILD/build.ninja" | sort -u || true)"
  if [[ -n "$leaks" ]]; then
    echo "$leaks" | head -20
    echo "gpu-bundle: the build used the system's copies above, not the bundle's" >&2
    exit 1
  fi
  export LD_LIBRARY_PATH="$OPGUARD_BUNDLE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The daemon on the bundle's RocksDB and ZeroMQ, asked by the CLI.
  mkdir -p "$BUILD/local"
  "$BUILD/daemon/opguardd" --local "$BUILD/local" --http off >"$BUILD/opguardd.log" 2>&1 &
  daemon_pid=$!
  answered=0
  for _ in $(seq 100); do
    if "$BUILD/cli/opguard" status --daemon "ipc://$BUILD/local/query.sock" >"$BUILD/status.txt" 2>&1; then
      answered=1
      break
    fi
    sleep 0.1
  done
  kill -TERM "$daemon_pid" 2>/dev/null
  wait "$daemon_pid"
  daemon_rc=$?
  if ((!answered || daemon_rc != 0)); then
    cat "$BUILD/opguardd.log" "$BUILD/status.txt"
    echo "gpu-bundle: opguardd did not answer opguard status, or did not stop cleanly (exit $daemon_rc)" >&2
    exit 1
  fi
  echo "gpu-bundle: opguardd answered opguard status and stopped cleanly:"
  sed 's/^/   /' "$BUILD/status.txt" | head -5
  for bin in "$BUILD/daemon/opguardd" "$BUILD/shim/libopguard_shim.so"; do
    # Every library a bundled dependency brought resolves inside the bundle.
    if ldd "$bin" | grep -E "not found"; then echo "gpu-bundle: $bin has unresolved libraries" >&2; exit 1; fi
    ldd "$bin" | grep -E "lib(zmq|rocksdb|spdlog|fmt|sodium|pgm|norm|gflags|snappy)" |
      grep -v "$OUT" && { echo "gpu-bundle: $bin loads a library from outside the bundle" >&2; exit 1; }
  done
  "$BUILD/shim/shim_core_test" --gtest_brief=1 >"$BUILD/test.log" 2>&1 ||
    { tail -20 "$BUILD/test.log"; echo "gpu-bundle: shim_core_test failed" >&2; exit 1; }
  tail -1 "$BUILD/test.log"
  echo "gpu-bundle: check passed (built ${targets[*]} with the bundle alone)"
  exit 0
fi

# ---- build the bundle --------------------------------------------------------
# Development files (headers, CMake and pkg-config files, static archives) and
# the runtime libraries they link to. Boost is reduced to the headers the
# project includes, with everything they include in turn.
DEV_PACKAGES=(
  libzmq3-dev cppzmq-dev libflatbuffers-dev flatbuffers-compiler flatbuffers-compiler-dev librocksdb-dev
  libgflags-dev libsnappy-dev zlib1g-dev libbz2-dev liblz4-dev libzstd-dev
  libboost1.74-dev libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libxxhash-dev
  libgtest-dev libgmock-dev pkgconf pkgconf-bin
)
# On every base system (not shipped; the .so links of their -dev packages are).
# OpenSSL too: the GPU machine's Python needs it (Debian 12's is 3.0, same soname).
BASE_LIBS='^(ld-linux.*|linux-vdso.*|lib(c|m|dl|rt|pthread|resolv|util|gcc_s|stdc\+\+|z|zstd|lz4|bz2|ssl|crypto)\.so.*)$'

WORK="$(mktemp -d /tmp/opguard-gpu-bundle.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/debs" "$WORK/root"

# The installed version of each package, so that the bundle matches what this
# machine builds and tests with.
fetch() {
  local pkg version
  for pkg in "$@"; do
    version="$(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)" ||
      { echo "gpu-bundle: $pkg is not installed here (scripts/setup-deps.sh)" >&2; exit 2; }
    # An installed version the mirror no longer has: its successor.
    (cd "$WORK/debs" && { apt-get download -qq "$pkg=$version" 2>/dev/null || apt-get download -qq "$pkg"; }) ||
      { echo "gpu-bundle: apt-get download $pkg failed" >&2; exit 2; }
  done
}

# Runtime packages: the packages owning the shared libraries that the bundled
# libraries and programs load, and those that the -dev packages' lib*.so links
# name, transitively, minus the base system's.
runtime_packages() {
  local objs=() link target
  mapfile -t objs < <(find "$WORK/root" -type f \( -name '*.so*' -o -path '*/bin/*' \))
  while read -r link; do
    target="$(readlink "$link")"
    [[ -e "$(dirname "$link")/$(basename "$target")" ]] && continue
    [[ "$target" == /* ]] || target="/usr/lib/$ARCH/$target"
    [[ -e "$target" ]] && objs+=("$(readlink -f "$target")")
  done < <(find "$WORK/root" -type l -name 'lib*.so')
  for obj in "${objs[@]}"; do
    [[ "$(head -c4 "$obj")" == $'\x7fELF' ]] || continue
    [[ "$obj" == "$WORK"/* ]] || echo "$(basename "$obj") $obj"
    ldd "$obj" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
  done | sort -u | while read -r lib path; do
    [[ "$lib" =~ $BASE_LIBS ]] && continue
    pkg="$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -1 | cut -d: -f1)" ||
      pkg="$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1)" || true
    [[ -n "$pkg" ]] && echo "$pkg"
  done | sort -u
}

echo "gpu-bundle: downloading ${#DEV_PACKAGES[@]} development packages"
fetch "${DEV_PACKAGES[@]}"
for deb in "$WORK"/debs/*.deb; do dpkg-deb -x "$deb" "$WORK/root"; done
# Two rounds reach the closure (the runtime libraries' own dependencies).
for _ in 1 2; do
  mapfile -t more < <(runtime_packages)
  new=()
  for pkg in "${more[@]}"; do
    compgen -G "$WORK/debs/${pkg}_*.deb" >/dev/null || new+=("$pkg")
  done
  ((${#new[@]} == 0)) && break
  echo "gpu-bundle: runtime libraries from ${new[*]}"
  fetch "${new[@]}"
  for pkg in "${new[@]}"; do dpkg-deb -x "$WORK"/debs/"${pkg}"_*.deb "$WORK/root"; done
done

# One prefix: usr/ and the merged-/usr lib/ into OUT.
rm -rf "$OUT"
mkdir -p "$OUT/lib/$ARCH"
cp -a "$WORK/root/usr/." "$OUT/"
if [[ -d "$WORK/root/lib/$ARCH" ]]; then cp -a "$WORK/root/lib/$ARCH/." "$OUT/lib/$ARCH/"; fi
rm -rf "$OUT/share/doc" "$OUT/share/man" "$OUT/share/lintian" "$OUT/share/aclocal" "$OUT/src"
# Shared libraries of the base system that the -dev packages' .so links name:
# dropped, so that the linker takes the static archive beside them (or the
# GPU machine's own library at run time).
for link in "$OUT/lib/$ARCH"/lib{z,zstd,lz4,bz2}.so; do
  [[ -L "$link" || -f "$link" ]] && rm -f "$link"
done
find "$OUT/lib/$ARCH" -maxdepth 1 -regextype posix-extended \
  -regex ".*/lib(z|zstd|lz4|bz2)\.so\..*" -delete

# Boost: only the headers the project includes and what they include.
boost_tu="$WORK/boost.cc"
grep -rhoE '#include <boost/[^>]+>' "$ROOT"/{daemon,cli,common,aligner,shim,tools,tests} \
  --include='*.cc' --include='*.h' 2>/dev/null | sort -u >"$boost_tu"
mkdir -p "$WORK/boost"
mv "$OUT/include/boost" "$WORK/boost/"
g++ -std=c++20 -M -MG -I"$WORK/boost" "$boost_tu" -o "$WORK/boost.d"
tr -s ' \\' '\n' <"$WORK/boost.d" | grep "^$WORK/boost/boost/" | sort -u | while read -r header; do
  rel="${header#"$WORK/boost/"}"
  mkdir -p "$OUT/include/$(dirname "$rel")"
  cp "$header" "$OUT/include/$rel"
done
echo "gpu-bundle: Boost reduced to $(find "$OUT/include/boost" -type f | wc -l) headers"

# Relocatable: absolute symlinks become relative; CMake and pkg-config files
# stop naming /usr.
find "$OUT" -type l | while read -r link; do
  target="$(readlink "$link")"
  [[ "$target" == /* ]] || continue
  base="$(basename "$target")"
  if [[ -e "$(dirname "$link")/$base" ]]; then ln -sfn "$base" "$link"; else rm -f "$link"; fi
done
find "$OUT" -name '*.pc' -exec sed -i -E \
  "s|^prefix=.*|prefix=\${pcfiledir}/../../..|; s#^(libdir|includedir)=\"?/usr/([^\"]*)\"?#\\1=\${prefix}/\\2#" {} +
# RocksDB's targets name libbz2.so by absolute path (the static archive is
# bundled), Snappy's its library; the lines that only apply when installed in
# /usr itself (set(_IMPORT_PREFIX ...)) stay.
find "$OUT" -name '*.cmake' -exec sed -i -E \
  -e "s|/usr/lib/$ARCH/libbz2\.so|\${_IMPORT_PREFIX}/lib/$ARCH/libbz2.a|g" \
  -e "/set\(_IMPORT_PREFIX|_realOrig/!s#\"/usr/(lib|include)/#\"\${_IMPORT_PREFIX}/\\1/#g" {} +
# The daemon links RocksDB's shared library; its 32 MiB static archive stays
# out (and out of the import check of the unused static target).
rm -f "$OUT/lib/$ARCH/librocksdb.a"
sed -i '/_cmake_import_check_files_for_RocksDB::rocksdb "/d' "$OUT/lib/$ARCH/cmake/rocksdb/RocksDBTargets-none.cmake"
remaining="$(grep -rnE "[\"; ]/usr/(lib|include)" "$OUT" --include='*.cmake' --include='*.pc' |
             grep -vE "set\(_IMPORT_PREFIX|_realOrig|^[^:]*:[0-9]+:#" || true)"
[[ -z "$remaining" ]] || echo "gpu-bundle: note: still naming /usr: $remaining"

# How consumers use it: `source env.sh`, then CMake with
# "${OPGUARD_BUNDLE_CMAKE_ARGS[@]}".
cat >"$OUT/env.sh" <<EOF
# Generated by scripts/gpu-bundle.sh from Debian $(cat /etc/debian_version 2>/dev/null) packages on $(date -u +%F).
OPGUARD_BUNDLE="\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)"
OPGUARD_BUNDLE_LIB="\$OPGUARD_BUNDLE/lib/$ARCH"
export PKG_CONFIG_LIBDIR="\$OPGUARD_BUNDLE_LIB/pkgconfig:\$OPGUARD_BUNDLE/share/pkgconfig"
export PATH="\$OPGUARD_BUNDLE/bin:\$PATH"
# pkgconf and flatc run from the bundle; libraries they need are there.
OPGUARD_BUNDLE_CMAKE_ARGS=(
  -DCMAKE_PREFIX_PATH="\$OPGUARD_BUNDLE"
  -DCMAKE_LIBRARY_ARCHITECTURE=$ARCH
  -DPKG_CONFIG_EXECUTABLE="\$OPGUARD_BUNDLE/bin/pkg-config-bundle"
  -DBoost_NO_SYSTEM_PATHS=ON
)
EOF
# pkg-config with the bundle's library path (pkgconf needs libpkgconf).
cat >"$OUT/bin/pkg-config-bundle" <<'EOF'
#!/bin/sh
here="$(cd "$(dirname "$0")/.." && pwd)"
arch="$(ls "$here/lib" | grep -- -linux-gnu | head -1)"
LD_LIBRARY_PATH="$here/lib/$arch${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/pkgconf" "$@"
EOF
chmod +x "$OUT/bin/pkg-config-bundle"

size_kib="$(du -sk "$OUT" | cut -f1)"
echo "gpu-bundle: $OUT: $((size_kib / 1024)) MiB, $(find "$OUT" -type f | wc -l) files"
if ((size_kib > MAX_MIB * 1024)); then
  echo "gpu-bundle: larger than $MAX_MIB MiB" >&2
  exit 1
fi
