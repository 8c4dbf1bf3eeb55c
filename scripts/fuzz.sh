#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz, clang with ASan + UBSan) and
# runs each for a bounded number of inputs from its committed corpus.
#   scripts/fuzz.sh                      # every harness, the CI-sized run
#   scripts/fuzz.sh -R ingest            # extra arguments go to ctest
#   scripts/fuzz.sh --long ingest_batch [libFuzzer flags...]
#                                        # one harness until stopped (or -max_total_time=S)
#   scripts/fuzz.sh --build [TARGET...]  # only configure and build (default:
#                                        # the harnesses; scripts/sanitize.sh fuzz
#                                        # builds the unit tests here so)
# The build lives in $OPGUARD_FUZZ_BUILD_DIR (default <repo>/build-fuzz), is
# RelWithDebInfo, without CUDA, Torch and benchmarks, and builds only the
# fuzz targets. OPGUARD_JOBS sets the build parallelism (default nproc).
# A failing input is written as crash-* / timeout-* / oom-* into
# $OPGUARD_FUZZ_ARTIFACTS (default <build>/artifacts): add it to
# tests/fuzz/corpus/<harness>/ with the fix, where fuzz_replay_<harness>
# keeps it as a regression test of every build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${OPGUARD_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
JOBS="${OPGUARD_JOBS:-$(nproc)}"
HARNESSES=(ingest_batch query_request peer_answer http_request api_target)

LONG=""
BUILD_ONLY=0
if [[ "${1:-}" == --build ]]; then
  BUILD_ONLY=1
  shift
  [[ $# -gt 0 ]] || set -- "${HARNESSES[@]/#/fuzz_}"
elif [[ "${1:-}" == --long ]]; then
  [[ $# -ge 2 ]] || { echo "usage: $0 --long HARNESS [libFuzzer flags...]" >&2; exit 2; }
  LONG="$2"
  shift 2
fi

# -O1 with line tables, as fuzzing builds usually are: sanitizer reports keep
# their files and lines, and the build (which scripts/test.sh also runs the
# unit tests in) takes about a fifth less time than at -O2 -g.
cmake -S "$ROOT" -B "$BUILD" -DOPGUARD_FUZZ=ON \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DOPGUARD_WITH_CUDA=OFF -DOPGUARD_WITH_TORCH=OFF -DOPGUARD_BUILD_BENCH=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  ${OPGUARD_CMAKE_ARGS:-} >/dev/null
if ((BUILD_ONLY)); then
  exec cmake --build "$BUILD" -j "$JOBS" --target "$@"
elif [[ -n "$LONG" ]]; then
  cmake --build "$BUILD" -j "$JOBS" --target "fuzz_$LONG"
else
  cmake --build "$BUILD" -j "$JOBS" --target "${HARNESSES[@]/#/fuzz_}"
fi

export OPGUARD_FUZZ_ARTIFACTS="${OPGUARD_FUZZ_ARTIFACTS:-$BUILD/artifacts}"
# Leaks are reported at exit (the harnesses' daemon is torn down then);
# UBSan stops at its first report like ASan.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:${UBSAN_OPTIONS:-}"
if [[ -n "$LONG" ]]; then
  exec "$ROOT/tests/fuzz/run_fuzzer.sh" "$BUILD/tests/fuzz/fuzz_$LONG" "$ROOT/tests/fuzz/corpus/$LONG" -1 \
    -seed=0 "$@"
fi
cd "$BUILD"
exec ctest --output-on-failure -j "$JOBS" -L '^fuzz$' --no-tests=error "$@"
