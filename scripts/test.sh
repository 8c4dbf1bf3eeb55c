#!/usr/bin/env bash
# The one test command: installs dependencies, configures, builds (warnings
# are errors), runs every test with ctest. Exits non-zero on any failure.
#   scripts/test.sh                 # everything
#   scripts/test.sh -L unit         # extra arguments go to ctest
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build}"
JOBS="${OPGUARD_JOBS:-$(nproc)}"

"$ROOT/scripts/setup-deps.sh"

cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPGUARD_WERROR=ON \
  ${OPGUARD_CMAKE_ARGS:-}
cmake --build "$BUILD" -j "$JOBS"
cd "$BUILD"
ctest --output-on-failure -j "$JOBS" --timeout 600 "$@"
