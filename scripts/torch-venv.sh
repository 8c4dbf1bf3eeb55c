#!/usr/bin/env bash
# Creates, or reuses, a virtual environment of Debian's Python holding torch
# VERSION from pip (and numpy), as ML engineers install torch; prints its
# path. The e2e suites run against these (scripts/torch-suite.sh).
#   scripts/torch-venv.sh VERSION    -> /var/cache/opguard/venv-torch-VERSION
# (OPGUARD_VENV_ROOT= another parent folder). About 4.7 GB each (CUDA wheels).
set -euo pipefail
VERSION="${1:?usage: torch-venv.sh VERSION}"
VENV="${OPGUARD_VENV_ROOT:-/var/cache/opguard}/venv-torch-$VERSION"
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock -w 1800 9
if ! "$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$VERSION')" \
     2>/dev/null; then
  rm -rf "$VENV"
  /usr/bin/python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install -q --disable-pip-version-check "torch==$VERSION" numpy >&2
fi
echo "$VENV"
