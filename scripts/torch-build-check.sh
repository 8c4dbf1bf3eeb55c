#!/usr/bin/env bash
# Builds the PyTorch adapter (shim/torch) against a torch, with the CMake
# build's sources and flags, and checks that every symbol the library needs is
# defined by that torch, the Python interpreter or the C/C++ runtime. The
# shim's C API (opguard_*) is left to libopguard_shim.so, which the opguard
# package loads first at run time.
#
# Which torch:
#   - by default the one $PYTHON imports: scripts/gpu-check.sh runs it so on
#     the GPU machines; here that is Debian 12's 1.13;
#   - TORCH_ROOT=DIR: another Debian release's libtorch and Python headers,
#     unpacked (not installed) into DIR by scripts/debian-torch.sh. The test
#     suite builds so against Debian 13's torch 2.6 and unstable's newest 2.x.
# Needs g++ (C++20), nm and readelf; no other project dependency.
#
#   [TORCH_ROOT=DIR] scripts/torch-build-check.sh [BUILD_DIR]   (PYTHON=, CXX=)
# Exit 0: built, every symbol resolved; 1: symbols unresolved; 2: no torch or
# the build failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
CXX="${CXX:-g++}"
BUILD="${1:-$(mktemp -d /tmp/opguard-torch-check.XXXXXX)}"
mkdir -p "$BUILD"

# Where the torch's headers and libraries are, and its C++ ABI.
PYTHON_LIBRARY=""  # with TORCH_ROOT: the libpython that provides Python's symbols
if [[ -n "${TORCH_ROOT:-}" ]]; then
  TORCH_LIBDIR="$TORCH_ROOT/usr/lib/$("$CXX" -print-multiarch)"
  python_dirs=("$TORCH_ROOT"/usr/include/python3.*)
  PYTHON_LIBRARY="$(find "$TORCH_LIBDIR" -maxdepth 1 -name 'libpython3.*.so.1.0' | head -1)"
  if [[ ! -f "$TORCH_LIBDIR/libtorch_cpu.so" || ! -d "${python_dirs[0]}" ||
        -z "$PYTHON_LIBRARY" ]]; then
    echo "torch-build-check: no unpacked libtorch and Python in $TORCH_ROOT" \
         "(scripts/debian-torch.sh makes one)" >&2
    exit 2
  fi
  PYTHON_INCLUDE="${python_dirs[0]}"
  # usr/include also holds the multiarch pyconfig.h that Python's includes.
  TORCH_INCLUDES=("$TORCH_ROOT/usr/include" "$TORCH_ROOT/usr/include/torch/csrc/api/include")
  TORCH_VERSION="$(printf '#include <torch/version.h>\nTORCH_VERSION\n' |
                   "$CXX" -E -P -x c++ "${TORCH_INCLUDES[@]/#/-I}" - | tail -1 | tr -d '" ')"
  # Under the C++11 ABI libc10's std::string arguments are std::__cxx11 ones.
  # (grep reads all of nm's output: -q would stop it early and fail the pipe.)
  TORCH_ABI=0
  cxx11_names="$(nm -D --defined-only "$TORCH_LIBDIR/libc10.so" | grep -c '__cxx11' || true)"
  if ((cxx11_names > 0)); then TORCH_ABI=1; fi
else
  if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "torch-build-check: $PY cannot import torch" >&2
    exit 2
  fi
  "$PY" - "$BUILD/torch.env" <<'EOF' 2>/dev/null
import sys, sysconfig
import torch
from torch.utils import cpp_extension
with open(sys.argv[1], "w") as out:
    out.write(f"TORCH_VERSION={torch.__version__}\n")
    out.write(f"TORCH_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}\n")
    out.write("TORCH_INCLUDES=(" + " ".join(repr(p) for p in cpp_extension.include_paths()) + ")\n")
    out.write(f"TORCH_LIBDIR={cpp_extension.library_paths()[0]!r}\n")
    out.write(f"PYTHON_INCLUDE={sysconfig.get_paths()['include']!r}\n")
EOF
  # shellcheck disable=SC1091
  source "$BUILD/torch.env"
fi
echo "   torch $TORCH_VERSION (C++11 ABI $TORCH_ABI), libraries in $TORCH_LIBDIR"

# NDEBUG as in the CMake build (shim/torch/CMakeLists.txt: torch's class layouts).
FLAGS=(-std=c++20 -O2 -DNDEBUG -fPIC -fopenmp -Wall -Wextra -Wno-missing-field-initializers
       -fvisibility=hidden -fvisibility-inlines-hidden -D_GLIBCXX_USE_CXX11_ABI="$TORCH_ABI"
       -I"$ROOT/shim/include" -I"$ROOT/shim/torch" -I"$ROOT/shim/torch/include"
       -isystem "$PYTHON_INCLUDE")
for dir in "${TORCH_INCLUDES[@]}"; do FLAGS+=(-isystem "$dir"); done

# The device path (device_fingerprint.cc, the NCCL collectives' device
# fingerprints) as CMake builds it: against a torch with CUDA (libc10_cuda)
# and the CUDA runtime's headers (CUDA_HOME, the toolkit, else the ones pip's
# CUDA wheels bring). Debian's torch has none: the adapter then has no device path.
LINK_CUDA=()
if [[ -f "$TORCH_LIBDIR/libc10_cuda.so" ]]; then
  cuda_include=""
  for dir in "${CUDA_HOME:-/nonexistent}/include" /usr/local/cuda/include \
             "$(dirname "$TORCH_LIBDIR")"/../nvidia/cu*/include; do
    if [[ -f "$dir/cuda_runtime_api.h" ]]; then cuda_include="$dir"; break; fi
  done
  if [[ -n "$cuda_include" ]]; then
    FLAGS+=(-DOPGUARD_TORCH_CUDA=1 -isystem "$cuda_include")
    LINK_CUDA=(-lc10_cuda)
    echo "   device path: on (CUDA headers in $cuda_include)"
  else
    echo "   device path: off (libc10_cuda.so, but no cuda_runtime_api.h: set CUDA_HOME)"
  fi
fi

# Every source of the library (shim/torch/*.cc but the tests), $(nproc) at a time,
# with ATen's headers parsed once into a precompiled header first, as the
# CMake build does (they are ~85% of each file's compile time).
start=$SECONDS
printf '#include <ATen/ATen.h>\n#include <ATen/record_function.h>\n' > "$BUILD/aten_pch.h"
if ! "$CXX" "${FLAGS[@]}" -x c++-header "$BUILD/aten_pch.h" -o "$BUILD/aten_pch.h.gch" \
     2> "$BUILD/aten_pch.log"; then
  cat "$BUILD/aten_pch.log"
  echo "torch-build-check: compiling torch $TORCH_VERSION's headers failed" >&2
  exit 2
fi
FLAGS+=(-include "$BUILD/aten_pch.h" -Winvalid-pch)
sources=()
for path in "$ROOT"/shim/torch/*.cc; do
  [[ $path == *_test.cc ]] || sources+=("$(basename "$path" .cc)")
done
built=0
pids=()
for src in "${sources[@]}"; do
  "$CXX" "${FLAGS[@]}" -c "$ROOT/shim/torch/$src.cc" -o "$BUILD/$src.o" 2> "$BUILD/$src.log" &
  pids+=($!)
  if ((${#pids[@]} >= $(nproc))); then
    wait "${pids[0]}" || built=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || built=1; done
for src in "${sources[@]}"; do cat "$BUILD/$src.log"; done
if ((built != 0)); then
  echo "torch-build-check: compiling against torch $TORCH_VERSION failed" >&2
  exit 2
fi
# As CMake links it: torch's libraries, no libpython (the interpreter that
# loads the adapter provides Python's symbols), no libopguard_shim here.
objects=()
for src in "${sources[@]}"; do objects+=("$BUILD/$src.o"); done
"$CXX" -shared -o "$BUILD/libopguard_torch.so" "${objects[@]}" \
  -L"$TORCH_LIBDIR" -Wl,-rpath,"$TORCH_LIBDIR" -ltorch -ltorch_cpu -lc10 "${LINK_CUDA[@]}" -fopenmp
echo "   built in $((SECONDS - start)) s, $(cat "$BUILD"/*.log | grep -c 'warning:' || true) warning(s)"

# Every undefined symbol but the shim's must be defined by a library the
# adapter names (DT_NEEDED) or by the Python interpreter (with TORCH_ROOT: by
# that release's libpython). ldd finds them through the adapter's run path; a
# newer release's libraries may need a newer C library than this machine's,
# which only matters for loading them, not for reading their symbols.
"$PY" - "$BUILD/libopguard_torch.so" "$PYTHON_LIBRARY" <<'EOF'
import os, re, subprocess, sys, sysconfig

lib, python_library = sys.argv[1:3]

def symbols(path, defined):
    flag = "--defined-only" if defined else "--undefined-only"
    out = subprocess.run(["nm", "-D", flag, path], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2 or (not defined and parts[-2] in ("w", "v")):
            continue  # weak references may stay unresolved
        found.add(parts[-1].split("@")[0])
    return found

needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]",
                    subprocess.run(["readelf", "-d", lib], capture_output=True, text=True).stdout)
ldd = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
paths = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, re.M))
for path in re.findall(r"^\s*(/\S+) \(", ldd, re.M):  # the dynamic loader itself
    paths[os.path.basename(path)] = path
providers = [paths[name] for name in needed if paths.get(name, "not") != "not"]
missing_libs = [name for name in needed if name not in paths or paths[name] == "not"]
if python_library:
    providers.append(python_library)
else:
    providers.append(sys.executable)
    libpython = os.path.join(sysconfig.get_config_var("LIBDIR") or "",
                             sysconfig.get_config_var("LDLIBRARY") or "")
    if os.path.isfile(libpython):
        providers.append(libpython)
defined = set()
for path in providers:
    defined |= symbols(path, True)
unresolved = sorted(s for s in symbols(lib, False) - defined if not s.startswith("opguard_"))
for name in missing_libs:
    print(f"   library not found: {name}")
for name in unresolved[:40]:
    print(f"   unresolved: {name}")
print(f"   {len(unresolved)} unresolved symbol(s) in {len(providers)} providers "
      f"({', '.join(os.path.basename(p) for p in providers)})")
sys.exit(1 if unresolved or missing_libs else 0)
EOF
