#!/usr/bin/env bash
# `opguard fingerprint` on a 256 MiB float32 file against `xxhsum -H2` (XXH128,
# Debian's xxhash) on the same file, warm page cache, median of REPS runs each.
# The fingerprint does more per byte (position-sensitive lanes, dtype and
# shape mixed in), so the ratio is what mapping the file and skipping the
# statistics buy, not a like-for-like hash race. Prints Google Benchmark JSON.
#   OPGUARD_BUILD_DIR=build bash bench/fingerprint/fingerprint_cli.bench.sh
set -euo pipefail
BUILD="${OPGUARD_BUILD_DIR:-build-release}"
CLI="$BUILD/cli/opguard"
REPS="${REPS:-5}"
MIB="${MIB:-256}"
[[ -x "$CLI" ]] || { echo "fingerprint_cli.bench.sh: $CLI not built" >&2; exit 2; }
command -v xxhsum >/dev/null || { echo "fingerprint_cli.bench.sh: xxhsum missing (scripts/setup-deps.sh)" >&2; exit 2; }
WORK="$(mktemp -d /tmp/og-fp-bench.XXXXXX)"
trap 'rm -rf "$WORK"' EXIT
FILE="$WORK/t.bin"
head -c $((MIB << 20)) /dev/urandom >"$FILE"
ELEMS=$(((MIB << 20) / 4))

median() {  # COMMAND...: median wall seconds of REPS runs (one warm-up run first)
  "$@" >/dev/null
  local times=()
  for _ in $(seq 1 "$REPS"); do
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null
    t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc -l)")
  done
  printf '%s\n' "${times[@]}" | sort -g | sed -n "$(( (REPS + 1) / 2 ))p"
}
t_og=$(median "$CLI" fingerprint --dtype float32 --shape "$ELEMS" "$FILE")
t_og1=$(median "$CLI" fingerprint --dtype float32 --shape "$ELEMS" --threads 1 "$FILE")
t_xxh=$(median xxhsum -H2 "$FILE")

python3 - "$t_og" "$t_og1" "$t_xxh" "$MIB" "$REPS" <<'PY'
import datetime, json, os, sys
t_og, t_og1, t_xxh, mib, reps = (float(x) for x in sys.argv[1:])
def bench(name, seconds, **counters):
    ms = seconds * 1000
    b = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": int(reps),
         "iterations": 1, "real_time": ms, "cpu_time": ms, "time_unit": "ms",
         "bytes_per_second": mib * 2**20 / seconds}
    b.update(counters)
    return b
print(json.dumps({
  "context": {"date": datetime.datetime.now().isoformat(), "host_name": os.uname().nodename,
              "executable": "fingerprint_cli.bench.sh", "num_cpus": os.cpu_count(),
              "note": "median wall time of one command on a %d MiB file, warm cache" % mib},
  "benchmarks": [
    bench("fingerprint_cli/opguard_fingerprint", t_og, vs_xxhsum=t_og / t_xxh),
    bench("fingerprint_cli/opguard_fingerprint_1_thread", t_og1, vs_xxhsum=t_og1 / t_xxh),
    bench("fingerprint_cli/xxhsum_H2", t_xxh),
  ]}, indent=2))
PY
