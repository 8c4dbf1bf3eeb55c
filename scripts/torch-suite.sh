#!/usr/bin/env bash
# The PyTorch adapter's tests and the e2e suites against a torch from pip.
#
#   scripts/torch-suite.sh VERSION [CTEST ARGS]   runs that torch's ctest entries
#   scripts/torch-suite.sh --build VERSION        only prepares them (their fixture)
#
# --build: the venv (scripts/torch-venv.sh VERSION), the adapter built for
# that torch by scripts/torch-build-check.sh (the CMake build's sources and
# flags, and a check that torch resolves every symbol) and the opguard package
# as the main build stages it with that adapter, in BUILD/torch-VERSION/python.
# The daemon, CLI, shim and test programs are the main build's: only the
# adapter depends on torch. BUILD/torch-VERSION/bin/python runs the venv's.
#
# The entries (tests/e2e/CMakeLists.txt, label e2e-torch2, named
# torch-VERSION_*) exist for the versions the build was configured with:
# -DOPGUARD_TEST_TORCH="2.15.0;2.11.0:quick" (scripts/test.sh does).
# BUILD: $OPGUARD_BUILD_DIR, default <repo>/build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build}"

if [[ "${1:-}" == "--build" ]]; then
  VERSION="${2:?usage: torch-suite.sh --build VERSION}"
  STAGE="$BUILD/python"
  if [[ ! -f "$STAGE/opguard/lib/libopguard_shim.so" ]]; then
    echo "torch-suite: $STAGE has no staged opguard package: build the project first" >&2
    exit 2
  fi
  VENV="$("$ROOT/scripts/torch-venv.sh" "$VERSION")"
  OUT="$BUILD/torch-$VERSION"
  PYTHON="$VENV/bin/python" "$ROOT/scripts/torch-build-check.sh" "$OUT/adapter"
  # bin/python: that venv's interpreter, by a path the ctest entries know.
  mkdir -p "$OUT/bin"
  printf '#!/bin/sh\nexec %q "$@"\n' "$VENV/bin/python" > "$OUT/bin/python"
  chmod +x "$OUT/bin/python"
  rm -rf "$OUT/python"
  cp -r "$STAGE" "$OUT/python"
  cp "$OUT/adapter/libopguard_torch.so" "$OUT/python/opguard/lib/libopguard_torch.so"
  # The torch this adapter was built for, which the package checks at import
  # (the main build's stage names Debian's).
  "$VENV/bin/python" - "$OUT/python/opguard/_build_info.py" <<'PY'
import re, sys, torch
path = sys.argv[1]
with open(path) as f:
    text = f.read()
with open(path, "w") as f:
    f.write(re.sub(r'TORCH_VERSION = ".*"', f'TORCH_VERSION = "{torch.__version__}"', text))
PY
  echo "   torch $VERSION: $OUT/bin/python ($VENV), package in $OUT/python"
  exit 0
fi

VERSION="${1:?usage: torch-suite.sh VERSION [CTEST ARGS] | --build VERSION}"
if ! ctest --test-dir "$BUILD" -N -R "^torch-$VERSION[_]" | grep -q 'Total Tests: [1-9]'; then
  echo "torch-suite: $BUILD has no entries for torch $VERSION: configure it with" \
       "-DOPGUARD_TEST_TORCH=$VERSION" >&2
  exit 2
fi
exec ctest --test-dir "$BUILD" --output-on-failure -R "^torch-$VERSION[_]" "${@:2}"
