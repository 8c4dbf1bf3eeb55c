#!/usr/bin/env bash
# Prints the path of a virtual environment holding torch VERSION (and numpy)
# from PyPI, creating it first if needed:
#   scripts/torch-venv.sh 2.11.0   ->  /var/cache/opguard/venv-torch-2.11.0
# One shared venv per pinned version (scripts/setup-deps.sh makes 2.11.0; others
# on first use), on Debian's python3, so that every suite tests the same torch.
# Idempotent: a venv whose python imports that torch is left as it is;
# otherwise the venv is (re)made in place and pip installs what is missing.
# Concurrent callers wait on a lock. OPGUARD_VENV_ROOT moves the folder.
set -euo pipefail
VERSION="${1:?usage: torch-venv.sh TORCH_VERSION}"
ROOT="${OPGUARD_VENV_ROOT:-/var/cache/opguard}"
VENV="$ROOT/venv-torch-$VERSION"

has_torch() {
  [[ -x "$VENV/bin/python" ]] && "$VENV/bin/python" - "$VERSION" <<'PY' 2>/dev/null
import sys, torch, numpy
sys.exit(torch.__version__.split("+")[0] != sys.argv[1])
PY
}

if ! has_torch; then
  mkdir -p "$ROOT"
  (
    flock -w 1800 9
    if ! has_torch; then
      echo "torch-venv: installing torch==$VERSION from PyPI into $VENV" >&2
      /usr/bin/python3 -m venv "$VENV"
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check "torch==$VERSION" numpy >&2
      has_torch || { echo "torch-venv: $VENV cannot import torch $VERSION" >&2; exit 1; }
    fi
  ) 9>"$ROOT/.venv-torch-$VERSION.lock"
fi
echo "$VENV"
