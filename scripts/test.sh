#!/usr/bin/env bash
# The one test command: installs dependencies, configures, builds (warnings
# are errors), runs every test with ctest, then a short AddressSanitizer pass
# over the unit tests. Exits non-zero on any failure, and also when the run
# lost coverage: an expected label (unit, integration, e2e, package, browser) with no test, or
# a test skipped that tests/expected-skips.txt does not allow
# (scripts/check_test_run.py).
#   scripts/test.sh                 # everything
#   scripts/test.sh -L unit         # extra arguments go to the main ctest run
# OPGUARD_TEST_ASAN=0 leaves out the AddressSanitizer + UBSan pass over the unit
# tests; OPGUARD_TEST_TSAN=0 the ThreadSanitizer pass over the threaded tests
# (label tsan, build in $OPGUARD_TSAN_BUILD_DIR, default <repo>/build-tsan);
# OPGUARD_TEST_FUZZ=0 the bounded libFuzzer run (scripts/fuzz.sh). The first
# and the last share one build, $OPGUARD_FUZZ_BUILD_DIR (default <repo>/build-fuzz).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build}"
JOBS="${OPGUARD_JOBS:-$(nproc)}"
# ctest keeps only 1 KiB of a passing test's output unless told otherwise;
# the skip check reads all of it.
JUNIT_ARGS=(--test-output-size-passed 4000000 --test-output-size-failed 4000000)
CHECK=(python3 "$ROOT/scripts/check_test_run.py" --allow "$ROOT/tests/expected-skips.txt")

# The torch venvs come below, beside the build.
OPGUARD_SETUP_TORCH_VENV=0 "$ROOT/scripts/setup-deps.sh"

# The adapter's tests and the e2e suites run against torch 2.x from pip, each
# version in a venv (scripts/torch-suite.sh, label e2e-torch2): by default
# 2.11.0, the GPU machines', in full, and the newest release, 2.15.0, and
# Debian's torch 1.13 a quick subset each (tests/e2e/CMakeLists.txt), so that
# the whole run stays within CI's 30 minutes on 2 cores.
# OPGUARD_TEST_TORCH="VERSION[:quick];..." names other versions (:quick: the
# quick subset); OPGUARD_TEST_TORCH= runs Debian's torch alone, in full
# (OPGUARD_TEST_SYSTEM_TORCH=full|quick overrides).
TORCH_VERSIONS="${OPGUARD_TEST_TORCH-2.11.0;2.15.0:quick}"
SYSTEM_TORCH="${OPGUARD_TEST_SYSTEM_TORCH:-$([[ -n "$TORCH_VERSIONS" ]] && echo quick || echo full)}"
# Line tables instead of full debug info (-g1): backtraces and sanitizer
# reports keep their files and lines, and the builds below compile about a
# quarter faster (the Asio/Beast files' debug info is most of their time).
# The CUDA kernels for one architecture, the oldest supported (sm_80): this
# machine runs none of them, and compiling for each architecture is most of
# the kernels' build time (a release build targets sm_80 and sm_90).
CI_FLAGS=(-DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
          -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG"
          -DCMAKE_CUDA_ARCHITECTURES=80)
# How long each part took, for keeping the whole run within CI's budget.
START=$SECONDS
took() { echo "test.sh: $1 done after $((SECONDS - START)) s" >&2; }

# The sanitizer passes after the main tests use two more builds of the
# daemon and the shim: the fuzz harnesses' clang build (ASan + UBSan; the unit
# tests and the harnesses) and a ThreadSanitizer build of the threaded tests.
FUZZ_BUILD="${OPGUARD_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
TSAN_BUILD="${OPGUARD_TSAN_BUILD_DIR:-$ROOT/build-tsan}"
TSAN_CMAKE_ARGS="-DCMAKE_C_FLAGS_DEBUG=-g1 -DCMAKE_CXX_FLAGS_DEBUG=-g1 ${OPGUARD_CMAKE_ARGS:-}"
build_sanitizer_targets() {
  if [[ "${OPGUARD_TEST_ASAN:-1}" != 0 ]]; then
    OPGUARD_FUZZ_BUILD_DIR="$FUZZ_BUILD" "$ROOT/scripts/fuzz.sh" --build opguard_unit_tests
    took "the ASan + UBSan unit tests' build" 2>&1
  fi
  if [[ "${OPGUARD_TEST_FUZZ:-1}" != 0 ]]; then
    OPGUARD_FUZZ_BUILD_DIR="$FUZZ_BUILD" "$ROOT/scripts/fuzz.sh" --build
    took "the fuzz harnesses' build" 2>&1
  fi
  if [[ "${OPGUARD_TEST_TSAN:-1}" != 0 ]]; then
    OPGUARD_CMAKE_ARGS="$TSAN_CMAKE_ARGS" OPGUARD_BUILD_DIR="$TSAN_BUILD" \
      OPGUARD_SANITIZE_TARGET=opguard_tsan_tests OPGUARD_SANITIZE_BUILD_ONLY=1 \
      "$ROOT/scripts/sanitize.sh" thread
    took "the TSan build" 2>&1
  fi
}
# They compile from the start, beside the main build and tests, at idle
# priority (SCHED_IDLE, inherited by the compilers): they take only CPU the
# rest leaves unused (a link, gloo ranks waiting, a daemon restarting), so the
# main tests keep their timing. A failure there shows again, in the
# foreground, when its pass builds the same targets. In a process group of
# their own, so that an early exit stops them.
SANITIZER_LOG="$BUILD/sanitizer-builds.log"
mkdir -p "$BUILD"
set -m
(
  chrt --idle --pid 0 "$BASHPID" || true
  build_sanitizer_targets
) >"$SANITIZER_LOG" 2>&1 &
SANITIZER_BUILDS=$!
set +m
trap 'kill -- "-$SANITIZER_BUILDS" 2>/dev/null || true' EXIT

# The torch venvs download and install (several GB each, mostly network and
# disk) beside the build, which needs none of them; their suites' fixtures
# wait for them (scripts/torch-venv.sh holds a lock per version).
VENV_LOG="$BUILD/torch-venvs.log"
set -m
(
  IFS=';' read -ra entries <<<"$TORCH_VERSIONS"
  for entry in "${entries[@]}"; do
    nice -n 10 "$ROOT/scripts/torch-venv.sh" "${entry%%:*}" || true
  done
) >"$VENV_LOG" 2>&1 &
TORCH_VENVS=$!
set +m
trap 'kill -- "-$SANITIZER_BUILDS" "-$TORCH_VENVS" 2>/dev/null || true' EXIT

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPGUARD_WERROR=ON \
  "${CI_FLAGS[@]}" \
  -DOPGUARD_TEST_TORCH="$TORCH_VERSIONS" -DOPGUARD_TEST_SYSTEM_TORCH="$SYSTEM_TORCH" \
  ${OPGUARD_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$JOBS"
took "the build"
cd "$BUILD"
rc=0
: >"$BUILD/ctest-timeline.txt"
# Each line of ctest's output also goes, with the seconds since the start of
# this script, to ctest-timeline.txt: when each entry started and ended, to
# see what the run waits on.
ctest --output-on-failure -j "$JOBS" --timeout 600 --no-tests=error \
  --output-junit "$BUILD/ctest-main.xml" "${JUNIT_ARGS[@]}" "$@" 2>&1 |
  while IFS= read -r line; do
    printf '%s\n' "$line"
    printf '%5d %s\n' "$((SECONDS - START))" "$line" >>"$BUILD/ctest-timeline.txt"
  done || rc=1
"${CHECK[@]}" --build "$BUILD" --junit "$BUILD/ctest-main.xml" \
  --labels "unit,integration,e2e,package,browser${TORCH_VERSIONS:+,e2e-torch2}" || rc=1
took "the main tests"
[[ $rc == 0 ]] || exit "$rc"
wait "$SANITIZER_BUILDS" || true
took "the sanitizer builds beside them"

# One sanitizer pass: builds only TARGET in BUILD and runs the tests of LABEL.
sanitizer_pass() {
  local san="$1" build="$2" target="$3" label="$4" xml="$2/ctest-$1.xml"
  OPGUARD_BUILD_DIR="$build" OPGUARD_SANITIZE_TARGET="$target" \
    "$ROOT/scripts/sanitize.sh" "$san" -L "^$label\$" --no-tests=error \
    --output-junit "$xml" "${JUNIT_ARGS[@]}" || rc=1
  "${CHECK[@]}" --build "$build" --junit "$xml" --labels "$label" || rc=1
}

# The unit tests only (no PyTorch adapter, no CUDA) under AddressSanitizer and
# UndefinedBehaviorSanitizer, in the fuzz harnesses' clang build (sanitize.sh
# fuzz), which the bounded fuzz runs below then reuse: one sanitizer build of
# the daemon instead of two. The integration suites run under all three
# sanitizers in scripts/sanitize.sh.
if [[ "${OPGUARD_TEST_ASAN:-1}" != 0 ]]; then
  sanitizer_pass fuzz "$FUZZ_BUILD" opguard_unit_tests unit
  took "the ASan + UBSan unit pass"
fi
# The threaded parts (the shim's sender and pending-fingerprint worker; the
# daemon's ingest, commit, query, aligner and HTTP threads in process,
# through the fuzz corpora's replays): only their targets are built.
if [[ "${OPGUARD_TEST_TSAN:-1}" != 0 ]]; then
  OPGUARD_CMAKE_ARGS="$TSAN_CMAKE_ARGS" sanitizer_pass thread "$TSAN_BUILD" opguard_tsan_tests tsan
  took "the TSan pass"
fi

if [[ "${OPGUARD_TEST_FUZZ:-1}" != 0 ]]; then
  # Each harness for a bounded number of inputs from its committed corpus
  # (clang, ASan + UBSan; docs/testing.md).
  OPGUARD_FUZZ_BUILD_DIR="$FUZZ_BUILD" "$ROOT/scripts/fuzz.sh" || rc=1
  took "the fuzz runs"
fi
exit "$rc"
