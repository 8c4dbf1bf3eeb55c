#!/usr/bin/env bash
# Builds the committed components with one sanitizer and runs their tests.
#   scripts/sanitize.sh address|undefined|thread|fuzz [ctest args...]
#   scripts/sanitize.sh thread -R shim          # extra arguments go to ctest
# Default ctest selection: every test except the e2e and browser labels
# (integration tests run one at a time).
# The build lives in $OPGUARD_BUILD_DIR (default <repo>/build-<sanitizer>), is
# Debug (OPGUARD_SANITIZE_BUILD_TYPE to change it), without CUDA, Torch and
# benchmarks. `fuzz` is the libFuzzer harnesses' build (scripts/fuzz.sh: clang,
# ASan and UBSan together, RelWithDebInfo, default <repo>/build-fuzz), so that
# one build serves both the tests and the fuzz runs. OPGUARD_JOBS sets the build and ctest parallelism (default nproc).
# OPGUARD_SANITIZE_TARGET builds one target instead of all (opguard_unit_tests
# for the unit tests alone, as scripts/test.sh does); OPGUARD_SANITIZE_BUILD_ONLY=1
# builds and runs nothing.
# Any sanitizer report fails the test that triggered it (halt_on_error).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() { echo "usage: $0 address|undefined|thread|fuzz [ctest args...]" >&2; exit 2; }
[[ $# -ge 1 ]] || usage
SAN="$1"
shift
case "$SAN" in address | undefined | thread | fuzz) ;; *) usage ;; esac

BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build-$SAN}"
JOBS="${OPGUARD_JOBS:-$(nproc)}"
BUILD_TYPE="${OPGUARD_SANITIZE_BUILD_TYPE:-Debug}"
SUPP="$ROOT/scripts/sanitizers"

if [[ $SAN == fuzz ]]; then
  OPGUARD_FUZZ_BUILD_DIR="$BUILD" "$ROOT/scripts/fuzz.sh" --build \
    "${OPGUARD_SANITIZE_TARGET:-all}"
else
  cmake -S "$ROOT" -B "$BUILD" \
    -DOPGUARD_SANITIZE="$SAN" \
    -DOPGUARD_WITH_CUDA=OFF -DOPGUARD_WITH_TORCH=OFF -DOPGUARD_BUILD_BENCH=OFF \
    -DCMAKE_BUILD_TYPE="$BUILD_TYPE" \
    ${OPGUARD_CMAKE_ARGS:-}
  cmake --build "$BUILD" -j "$JOBS" ${OPGUARD_SANITIZE_TARGET:+--target "$OPGUARD_SANITIZE_TARGET"}
fi

[[ "${OPGUARD_SANITIZE_BUILD_ONLY:-0}" != 1 ]] || exit 0

# Options common to every sanitizer: stop at the first report and abort, so
# the test fails even when a child process (forked rank, API child) reports.
COMMON="halt_on_error=1:abort_on_error=1:print_stacktrace=1"
case "$SAN" in
  address | fuzz)
    # LeakSanitizer needs ptrace-free Linux on x86_64/aarch64; it refuses to
    # run under a tracer (strace, gdb, some sandboxes). Probe once.
    LEAKS=0
    if [[ "$(uname -s)" == Linux && "$(uname -m)" =~ ^(x86_64|aarch64)$ ]] &&
      ASAN_OPTIONS=detect_leaks=1 "$BUILD/common/common_test" --gtest_list_tests >/dev/null 2>&1; then
      LEAKS=1
    fi
    [[ $LEAKS == 1 ]] || echo "sanitize.sh: LeakSanitizer unavailable here; leaks are not checked" >&2
    export ASAN_OPTIONS="$COMMON:detect_leaks=$LEAKS:detect_stack_use_after_return=1:strict_string_checks=1:check_initialization_order=1:strict_init_order=1:detect_invalid_pointer_pairs=0:${ASAN_OPTIONS:-}"
    export LSAN_OPTIONS="suppressions=$SUPP/lsan.supp:print_suppressions=0:${LSAN_OPTIONS:-}"
    [[ $SAN == address ]] ||
      export UBSAN_OPTIONS="$COMMON:report_error_type=1:${UBSAN_OPTIONS:-}"
    ;;
  undefined)
    export UBSAN_OPTIONS="$COMMON:report_error_type=1:${UBSAN_OPTIONS:-}"
    ;;
  thread)
    export TSAN_OPTIONS="$COMMON:second_deadlock_stack=1:suppressions=$SUPP/tsan.supp:print_suppressions=0:${TSAN_OPTIONS:-}"
    ;;
esac

cd "$BUILD"
if [[ $# -gt 0 ]]; then
  exec ctest --output-on-failure -j "$JOBS" --timeout 900 "$@"
fi
# Unit tests in parallel; integration tests (several real processes each, with
# ack and flush deadlines) one at a time, so that the sanitizer's slowdown is
# not multiplied by a loaded machine.
rc=0
ctest --output-on-failure -j "$JOBS" --timeout 900 -LE '^(e2e|browser|integration|fuzz)$' || rc=1
ctest --output-on-failure -j 1 --timeout 900 -L '^integration$' -LE '^(e2e|browser)$' || rc=1
exit "$rc"
