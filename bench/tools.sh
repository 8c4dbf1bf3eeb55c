# Sourced by the bench scripts that drive real processes: the build's
# binaries, checked. Sets ROOT, BUILD (OPGUARD_BUILD_DIR, default
# build-release), OPGUARDD, CLI and LOADGEN; exits 2 naming one not built.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build-release}"
OPGUARDD="$BUILD/daemon/opguardd"
CLI="$BUILD/cli/opguard"
LOADGEN="$BUILD/tools/loadgen/opguard-loadgen"
for f in "$OPGUARDD" "$CLI" "$LOADGEN"; do
  [[ -x "$f" ]] || { echo "$(basename "$0"): $f not built" >&2; exit 2; }
done

# start_daemon DIR [ARGS...]: starts `opguardd --local DIR --http off` with
# ARGS (log in DIR/log), appends its pid to PIDS and waits until its query
# socket answers.
start_daemon() {
  local dir="$1"; shift
  mkdir -p "$dir"
  "$OPGUARDD" --local "$dir" --http off --log-level warn "$@" >>"$dir/log" 2>&1 &
  PIDS+=("$!")
  for _ in $(seq 1 300); do
    "$CLI" status --daemon "ipc://$dir/query.sock" --timeout 0.3 >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): the daemon in $dir did not start" >&2
  exit 1
}
