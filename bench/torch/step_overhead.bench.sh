#!/usr/bin/env bash
# Training-step overhead of OPGUARD=1 on the end-to-end model (see
# step_overhead.py). Run by scripts/bench.sh with OPGUARD_BUILD_DIR set.
set -euo pipefail
exec /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/step_overhead.py" \
  "${OPGUARD_BUILD_DIR:?set OPGUARD_BUILD_DIR to a build tree with the PyTorch adapter}" "$@"
