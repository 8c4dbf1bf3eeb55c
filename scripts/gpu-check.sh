#!/usr/bin/env bash
# GPU checks, for a developer with a lent GPU: run as is from anywhere.
# Needs only nvcc (CUDA 12+) and g++ (C++20): no CMake, no other dependency,
# no network. Builds into a temporary directory, prints each check's result
# and a bandwidth table, exits non-zero on any mismatch. Well under 8 minutes.
#
# Sections (later issues append theirs below):
#   fingerprint — GPU == CPU bits on the committed vectors and on random
#                 tensors of every dtype from 0 B to 1 GiB; bandwidth table.
#   torch       — the PyTorch adapter built against the machine's torch (2.x
#                 there), every symbol resolved (scripts/torch-build-check.sh;
#                 needs $PYTHON, default python3, with torch, else skipped).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
CXX="${CXX:-g++}"
BUILD="$(mktemp -d /tmp/opguard-gpu-check.XXXXXX)"
trap 'rm -rf "$BUILD"' EXIT

[[ -x "$NVCC" ]] || { echo "gpu-check: nvcc not found (set NVCC=)" >&2; exit 2; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

# The two architectures the normal build targets (A100: sm_80; H100/H200:
# sm_90), plus PTX for newer devices to JIT from.
ARCH="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]"

INC=(-I"$ROOT/fingerprint/include" -I"$ROOT/fingerprint/src" -I"$ROOT/cuda/include"
     -I"$ROOT/common/include")
CXXFLAGS=(-std=c++20 -O2 -g -Wall -Wextra -ffp-contract=off -pthread)
CUDA_INC="$(dirname "$(dirname "$(readlink -f "$NVCC")")")/include"

echo "== fingerprint: building in $BUILD"
start=$SECONDS
pids=()
"$CXX" "${CXXFLAGS[@]}" "${INC[@]}" -c "$ROOT/fingerprint/src/fingerprint.cc" -o "$BUILD/fingerprint.o" &
pids+=($!)
"$CXX" "${CXXFLAGS[@]}" "${INC[@]}" -c "$ROOT/common/src/hex.cc" -o "$BUILD/hex.o" &
pids+=($!)
"$CXX" "${CXXFLAGS[@]}" "${INC[@]}" -I"$CUDA_INC" -c "$ROOT/cuda/tools/gpu_check.cc" \
  -o "$BUILD/gpu_check.o" &
pids+=($!)
# shellcheck disable=SC2086
"$NVCC" -std=c++20 -O2 $ARCH --Werror all-warnings -Xcompiler -Wall,-Wextra "${INC[@]}" \
  -c "$ROOT/cuda/src/fingerprint_kernels.cu" -o "$BUILD/fingerprint_kernels.o" &
pids+=($!)
built=0
for pid in "${pids[@]}"; do wait "$pid" || built=1; done
((built == 0)) || { echo "gpu-check: build failed" >&2; exit 2; }
# shellcheck disable=SC2086
"$NVCC" $ARCH -o "$BUILD/gpu_check" "$BUILD"/*.o -lcudart -lpthread
echo "   built in $((SECONDS - start)) s"

echo "== fingerprint: GPU == CPU, then bandwidth"
status=0
timeout 420 "$BUILD/gpu_check" "$ROOT/fingerprint/testdata/vectors.txt" || status=$?
echo "== fingerprint: exit $status"

echo "== torch: the adapter against ${PYTHON:-python3}'s" \
  "$("${PYTHON:-python3}" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo "(no torch: skipped)")"
torch_status=0
timeout 240 "$ROOT/scripts/torch-build-check.sh" "$BUILD/torch" || torch_status=$?
echo "== torch: exit $torch_status"
exit $((status > torch_status ? status : torch_status))
