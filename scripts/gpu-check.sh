#!/usr/bin/env bash
# GPU checks, for a lent GPU machine: run as is from the checkout, no network.
# Builds into a temporary directory, prints each section's result, writes one
# results table into docs/gpu-results.md (date, machine, commit) and exits
# non-zero when a check fails. Whole script under 8 minutes on 16 cores; each
# section has its own timeout, and a section that would not fit in what is
# left of the budget (GPU_CHECK_BUDGET_S, default 460 s) is skipped, saying so.
#
# Sections (each skipped with one line when its prerequisite is missing):
#   fingerprint — GPU == CPU bits on the committed vectors and on random
#                 tensors of every dtype; bandwidth table. Needs only nvcc and
#                 g++; runs on the GPU while `build` compiles on the CPUs.
#   build       — the project (daemon, CLI, shim with CUDA, the PyTorch adapter
#                 against $PYTHON's torch, kernel attribution and its test,
#                 libopguard_nccl.so when its sources are in the checkout),
#                 with CMake pointed at gpu-bundle/ (scripts/gpu-bundle.sh,
#                 prepared on a development machine and brought along) for
#                 ZeroMQ, RocksDB, FlatBuffers, Boost, spdlog, CLI11, JSON,
#                 xxhash and GoogleTest.
#   torch       — the adapter against $PYTHON's torch, every symbol resolved
#                 (scripts/torch-build-check.sh); only when `build` could not
#                 build the adapter.
#   cupti       — kernel attribution against the real CUPTI with a driver
#                 (shim_cupti_test).
#   e2e         — opguardd in a temporary directory; tests/e2e/gpu_e2e.py: the
#                 e2e GPT on CUDA under OPGUARD=1 on two ranks sharing the GPU
#                 over gloo; a clean rerun is identical, a planted bit flip is
#                 named at its rank, step, op and line, a planted stream race
#                 (a write on a side stream without synchronisation) is found;
#                 one rank with a real NCCL communicator (torch's NCCL backend,
#                 also under DDP): rerun identical, every collective recorded
#                 and completed; kernel names with OPGUARD_KERNELS=1;
#                 step-time ratios with and without OPGUARD=1 and with OPGUARD
#                 unset but the libraries loaded, for the e2e model and a wider
#                 one (skipped when the budget has no room left for them).
#   nccl        — libopguard_nccl.so under a small NCCL program, when both are
#                 in this checkout; "not built" otherwise.
#
# Environment: PYTHON (default python3), NVCC, CXX, GPU_CHECK_BUNDLE (default
# <checkout>/gpu-bundle), GPU_CHECK_BUDGET_S, GPU_CHECK_OUT=DIR (also copy the
# results table and the full log there), GPU_CHECK_NO_DOCS=1 (do not edit
# docs/gpu-results.md).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"   # the Python with torch
HELPER_PY="$(command -v python3)"  # runs the result helpers, whatever $PY is
NVCC="${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
CXX="${CXX:-g++}"
BUNDLE="${GPU_CHECK_BUNDLE:-$ROOT/gpu-bundle}"
BUDGET="${GPU_CHECK_BUDGET_S:-460}"
JOBS="$(nproc)"
BUILD="$(mktemp -d /tmp/opguard-gpu-check.XXXXXX)"
RESULTS="$BUILD/results.jsonl"   # one JSON row per check
LOG="$BUILD/gpu-check.log"
: >"$RESULTS"
# shellcheck disable=SC2317  # (run by the trap)
cleanup() {
  # Children of timed-out sections (ranks, daemons) must not outlive the script.
  jobs -p | xargs -r kill 2>/dev/null
  rm -rf "$BUILD"
}
trap cleanup EXIT
# Everything printed also goes to the log that GPU_CHECK_OUT receives.
exec > >(tee -a "$LOG") 2>&1

left() { echo $((BUDGET - SECONDS)); }
# fits NEEDED: true when NEEDED seconds are left in the budget.
fits() { (($(left) >= $1)); }
# result SECTION CHECK TARGET MEASURED VERDICT  (VERDICT: ok|fail|miss|skip)
result() {
  "$HELPER_PY" -c 'import json, sys; print(json.dumps(dict(zip(("section", "check", "target", "measured", "verdict"), sys.argv[1:]))))' \
    "$@" >>"$RESULTS" 2>/dev/null ||
    printf '{"section": "%s", "check": "%s", "target": "", "measured": "%s", "verdict": "%s"}\n' "$1" "$2" "$4" "$5" >>"$RESULTS"
}
skip() { echo "== $1: skipped: $2"; result "$1" "$1" "" "skipped: $2" skip; }
status=0
fail() { status=1; }

echo "== gpu-check $(date -u '+%F %T') UTC · budget ${BUDGET} s · $JOBS cores"
MACHINE="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
echo "   GPU: ${MACHINE:-none found (nvidia-smi)} · $(uname -srm)"
COMMIT="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"
if ! git -C "$ROOT" diff --quiet HEAD 2>/dev/null; then COMMIT+=" (with local changes)"; fi

# ---- fingerprint: build (CPU) now, run on the GPU in the background -----------
# The two architectures the normal build targets (A100: sm_80; H100/H200:
# sm_90), plus PTX for newer devices to JIT from.
ARCH="-gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=[sm_90,compute_90]"
fingerprint_section() {
  local fp="$BUILD/fingerprint" pids=() built=0 start=$SECONDS
  mkdir -p "$fp"
  local inc=(-I"$ROOT/fingerprint/include" -I"$ROOT/fingerprint/src" -I"$ROOT/cuda/include"
             -I"$ROOT/common/include")
  local flags=(-std=c++20 -O2 -g -Wall -Wextra -ffp-contract=off -pthread)
  local cuda_inc
  cuda_inc="$(dirname "$(dirname "$(readlink -f "$NVCC")")")/include"
  "$CXX" "${flags[@]}" "${inc[@]}" -c "$ROOT/fingerprint/src/fingerprint.cc" -o "$fp/fingerprint.o" & pids+=($!)
  "$CXX" "${flags[@]}" "${inc[@]}" -c "$ROOT/common/src/hex.cc" -o "$fp/hex.o" & pids+=($!)
  "$CXX" "${flags[@]}" "${inc[@]}" -I"$cuda_inc" -c "$ROOT/cuda/tools/gpu_check.cc" -o "$fp/gpu_check.o" & pids+=($!)
  # shellcheck disable=SC2086
  "$NVCC" -std=c++20 -O2 $ARCH --Werror all-warnings -Xcompiler -Wall,-Wextra "${inc[@]}" \
    -c "$ROOT/cuda/src/fingerprint_kernels.cu" -o "$fp/fingerprint_kernels.o" & pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || built=1; done
  # shellcheck disable=SC2086
  ((built == 0)) && "$NVCC" $ARCH -o "$fp/gpu_check" "$fp"/*.o -lcudart -lpthread || built=1
  if ((built != 0)); then
    echo "== fingerprint: build failed"
    result fingerprint "GPU == CPU, bandwidth" "all match" "build failed" fail
    return 1
  fi
  echo "== fingerprint: built in $((SECONDS - start)) s; GPU == CPU, then bandwidth"
  local rc=0
  timeout "${1:-200}" "$fp/gpu_check" "$ROOT/fingerprint/testdata/vectors.txt" >"$fp/out.txt" 2>&1 || rc=$?
  sed 's/^/   /' "$fp/out.txt"
  case $rc in
    0) result fingerprint "GPU == CPU (vectors, every dtype), bandwidth" "all match" "all match" ok ;;
    124) result fingerprint "GPU == CPU (vectors, every dtype), bandwidth" "all match" "timed out" fail ;;
    *) result fingerprint "GPU == CPU (vectors, every dtype), bandwidth" "all match" "exit $rc (see log)" fail ;;
  esac
  echo "== fingerprint: exit $rc"
  return "$rc"
}
fp_pid=""
if [[ ! -x "$NVCC" ]]; then
  skip fingerprint "no nvcc (set NVCC=)"
elif [[ -z "$MACHINE" ]]; then
  skip fingerprint "no GPU (nvidia-smi found none)"
else
  fingerprint_section 200 >"$BUILD/fingerprint.log" 2>&1 &
  fp_pid=$!
fi

# ---- build ------------------------------------------------------------------------
TORCH_OK=0
if "$PY" -c 'import torch' 2>/dev/null; then
  TORCH_OK=1
  TORCH_DESC="$("$PY" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "available" if torch.cuda.is_available() else "unavailable")')"
  echo "   $PY: $TORCH_DESC"
fi
PY_HEADERS="$("$PY" -c 'import os, sysconfig; print(int(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))))' 2>/dev/null || echo 0)"
P="$BUILD/project"
built_project=0
if [[ ! -f "$BUNDLE/env.sh" ]]; then
  skip build "no bundle at $BUNDLE (scripts/gpu-bundle.sh makes it on a development machine)"
elif ! command -v cmake >/dev/null || ! command -v ninja >/dev/null; then
  skip build "cmake or ninja missing"
elif ! fits 120; then
  skip build "$(left) s left"
else
  # shellcheck disable=SC1091
  source "$BUNDLE/env.sh"
  export LD_LIBRARY_PATH="$OPGUARD_BUNDLE_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPGUARD_BUILD_BENCH=OFF
              "${OPGUARD_BUNDLE_CMAKE_ARGS[@]}")
  targets=(opguardd opguard opguard_shim)
  if [[ -x "$NVCC" ]]; then
    # This GPU's architecture only (sm_90 without one): the build must fit the budget.
    cmake_args+=(-DOPGUARD_WITH_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC"
                 -DCMAKE_CUDA_ARCHITECTURES="$([[ -n "$MACHINE" ]] && echo native || echo 90)")
  else
    cmake_args+=(-DOPGUARD_WITH_CUDA=OFF)
  fi
  if ((TORCH_OK && PY_HEADERS)); then
    cmake_args+=(-DOPGUARD_TORCH_PYTHON="$(command -v "$PY")")
    targets+=(opguard_torch)
  else
    cmake_args+=(-DOPGUARD_WITH_TORCH=OFF)
    echo "   adapter not built: $PY has $( ((TORCH_OK)) && echo "no Python.h (python3-dev)" || echo "no torch")"
  fi
  start=$SECONDS
  echo "== build: configuring in $P"
  if ! timeout 90 cmake -S "$ROOT" -B "$P" "${cmake_args[@]}" >"$BUILD/configure.log" 2>&1; then
    tail -20 "$BUILD/configure.log"
    result build "configure with the bundle" "configures" "failed (see log)" fail
    fail
  else
    # Optional targets: present when their sources are in this checkout.
    available="$(ninja -C "$P" -t targets all 2>/dev/null | cut -d: -f1)"
    for t in shim_cupti_test opguard_nccl; do
      grep -qx "$t" <<<"$available" && targets+=("$t")
    done
    echo "== build: ${targets[*]} ($JOBS jobs)"
    if timeout "$(( $(left) > 300 ? 300 : $(left) ))" cmake --build "$P" -j "$JOBS" --target "${targets[@]}" \
         >"$BUILD/build.log" 2>&1; then
      built_project=1
      result build "project with the bundle (${targets[*]})" "builds" "built in $((SECONDS - start)) s" ok
      echo "== build: done in $((SECONDS - start)) s"
    else
      grep -m 20 -E "error|FAILED" "$BUILD/build.log"
      result build "project with the bundle" "builds" "failed after $((SECONDS - start)) s (see log)" fail
      fail
    fi
  fi
fi

# ---- torch: only when the build could not build the adapter ----------------------
if ((built_project)) && [[ -f "$P/python/opguard/lib/libopguard_torch.so" ]]; then
  echo "== torch: the adapter was built against $PY's torch above"
elif ((!TORCH_OK)); then
  skip torch "$PY cannot import torch"
elif ! fits 60; then
  skip torch "$(left) s left"
else
  echo "== torch: the adapter against $PY's torch (scripts/torch-build-check.sh)"
  rc=0
  PYTHON="$PY" timeout 200 "$ROOT/scripts/torch-build-check.sh" "$BUILD/torch" || rc=$?
  if ((rc == 0)); then result torch "adapter against $TORCH_DESC" "builds, 0 unresolved" "ok" ok
  else result torch "adapter against $TORCH_DESC" "builds, 0 unresolved" "exit $rc" fail; fail; fi
fi

# Wait for the fingerprint section before the GPU is shared with training.
if [[ -n "$fp_pid" ]]; then
  wait "$fp_pid" || fail
  cat "$BUILD/fingerprint.log"
fi

# ---- cupti --------------------------------------------------------------------------
if [[ ! -x "$P/shim/cupti/shim_cupti_test" ]]; then
  skip cupti "shim_cupti_test not built"
elif [[ -z "$MACHINE" ]]; then
  skip cupti "no GPU"
else
  echo "== cupti: kernel attribution against the real CUPTI"
  rc=0
  timeout 60 "$P/shim/cupti/shim_cupti_test" --gtest_brief=1 || rc=$?
  if ((rc == 0)); then result cupti "CUPTI with a driver (shim_cupti_test)" "passes" "passes" ok
  else result cupti "CUPTI with a driver (shim_cupti_test)" "passes" "exit $rc" fail; fail; fi
fi

# ---- e2e ------------------------------------------------------------------------------
if ((!built_project)) || [[ ! -f "$P/python/opguard/lib/libopguard_torch.so" ]]; then
  skip e2e "no daemon, CLI and adapter built"
elif ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  skip e2e "torch sees no CUDA device"
elif ! fits 90; then
  skip e2e "$(left) s left"
else
  echo "== e2e: train_gpt.py on CUDA, 2 ranks over gloo and 1 on NCCL, under OPGUARD=1"
  # gpu_e2e.py runs the correctness checks first and the step-time ratios
  # only if the budget still has room for them (it says so otherwise).
  timing=(--budget-s "$(( $(left) - 20 ))")
  rc=0
  (cd "$ROOT/tests/e2e" &&
     OPGUARDD="$P/daemon/opguardd" OPGUARD_CLI="$P/cli/opguard" OPGUARD_PYTHON_STAGE="$P/python" \
     OPGUARD_TEST_PYTHON="$(command -v "$PY")" PYTHONDONTWRITEBYTECODE=1 \
     timeout "$(( $(left) - 10 ))" "$PY" gpu_e2e.py --device cuda "${timing[@]}" --out "$BUILD/e2e.json") || rc=$?
  if [[ -f "$BUILD/e2e.json" ]]; then
    "$HELPER_PY" - "$BUILD/e2e.json" >>"$RESULTS" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    verdict = {True: "ok", None: "skip"}.get(r["ok"], "fail" if r["kind"] == "correctness" else "miss")
    print(json.dumps({"section": "e2e", "check": r["check"], "target": r["target"],
                      "measured": r["measured"], "verdict": verdict}))
EOF
  else
    result e2e "e2e GPT on CUDA" "runs" "exit $rc (see log)" fail
  fi
  ((rc == 0)) || fail
  echo "== e2e: exit $rc"
fi

# ---- nccl -------------------------------------------------------------------------------
NCCL_LIB="$(find "$P" -name 'libopguard_nccl.so*' -type f 2>/dev/null | head -1)"
if [[ -z "$NCCL_LIB" ]]; then
  skip nccl "not built (no libopguard_nccl.so in this checkout's build)"
elif [[ ! -x "$ROOT/nccl/gpu_check.sh" ]]; then
  skip nccl "libopguard_nccl.so built; no nccl/gpu_check.sh program in this checkout"
elif ! fits 60; then
  skip nccl "$(left) s left"
else
  echo "== nccl: libopguard_nccl.so under a small NCCL program"
  rc=0
  OPGUARD_NCCL_LIBRARY="$NCCL_LIB" OPGUARDD="$P/daemon/opguardd" OPGUARD_CLI="$P/cli/opguard" \
    timeout 60 "$ROOT/nccl/gpu_check.sh" || rc=$?
  if ((rc == 0)); then result nccl "every call recorded, results unchanged" "all" "ok" ok
  else result nccl "every call recorded, results unchanged" "all" "exit $rc" fail; fail; fi
fi

# ---- results ------------------------------------------------------------------------------
echo "== results ($SECONDS s)"
TABLE="$BUILD/gpu-results-table.md"
"$HELPER_PY" "$ROOT/scripts/gpu_results.py" --results "$RESULTS" --machine "${MACHINE:-no GPU found}" \
  --commit "$COMMIT" --seconds "$SECONDS" --table "$TABLE" \
  ${GPU_CHECK_NO_DOCS:+--no-docs} --docs "$ROOT/docs/gpu-results.md" || fail
cat "$TABLE" 2>/dev/null
if [[ -n "${GPU_CHECK_OUT:-}" && -d "${GPU_CHECK_OUT}" ]]; then
  cp "$TABLE" "$GPU_CHECK_OUT/" 2>/dev/null
  cp "$ROOT/docs/gpu-results.md" "$GPU_CHECK_OUT/" 2>/dev/null
  cp "$LOG" "$GPU_CHECK_OUT/" 2>/dev/null
  for f in configure.log build.log; do [[ -f "$BUILD/$f" ]] && cp "$BUILD/$f" "$GPU_CHECK_OUT/"; done
fi
echo "== gpu-check: exit $status"
exit "$status"
