#!/usr/bin/env bash
# The OpGuard story on this machine, end to end and for real:
#  1. build OpGuard (installing its Debian dependencies first);
#  2. start opguardd with a temporary data directory (unprivileged, --local);
#  3. install the opguard Python package into a temporary user site
#     (the .pth hook turns on recording for OPGUARD=1 processes);
#  4. train a small GPT on 4 ranks (PyTorch, gloo, CPU) twice with OPGUARD=1:
#     a reference run, and a suspect run in which rank 1 suffers a bit flip in
#     one gradient element at step 1 (injected by the training script itself);
#  5. print what a user asks OpGuard: `opguard runs` and `opguard diff`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build}"
PY=/usr/bin/python3

"$ROOT/scripts/setup-deps.sh" >&2
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DOPGUARD_WITH_TORCH=ON >&2
cmake --build "$BUILD" -j "$(nproc)" --target opguardd opguard opguard_torch >&2

WORK="$(mktemp -d /tmp/opguard-demo.XXXXXX)"
DAEMON_PID=""
cleanup() {
  if [[ -n "$DAEMON_PID" ]] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

"$BUILD/daemon/opguardd" --local "$WORK/daemon" --http 127.0.0.1:0 >"$WORK/opguardd.log" 2>&1 &
DAEMON_PID=$!
OPGUARD=("$BUILD/cli/opguard")
QUERY="ipc://$WORK/daemon/query.sock"
for _ in $(seq 100); do
  "${OPGUARD[@]}" status --daemon "$QUERY" >/dev/null 2>&1 && break
  sleep 0.1
done
"${OPGUARD[@]}" status --daemon "$QUERY" >/dev/null

SITE="$WORK/userbase/lib/$($PY -c 'import sys; print(f"python{sys.version_info.major}.{sys.version_info.minor}")')/site-packages"
mkdir -p "$SITE"
cp -r "$BUILD/python/opguard" "$SITE/"
cp "$BUILD/python/opguard-autoload.pth" "$SITE/"

train() {  # NAME [FAULT]
  echo "== training run '$1' on 4 ranks${2:+ with fault $2}" >&2
  env PYTHONUSERBASE="$WORK/userbase" OPGUARD=1 OPGUARD_RUN="$1" \
      OPGUARD_ENDPOINT="ipc://$WORK/daemon/ingest.sock" OMP_NUM_THREADS=1 \
      "$PY" "$ROOT/tests/e2e/train_gpt.py" --spawn 4 --steps 3 ${2:+--fault "$2"} >&2
}
train reference
train suspect bitflip:1:1

echo
echo "\$ opguard runs"
"${OPGUARD[@]}" runs --daemon "$QUERY"
echo
echo "\$ opguard diff reference suspect"
"${OPGUARD[@]}" diff reference suspect --daemon "$QUERY" || true
