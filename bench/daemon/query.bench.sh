#!/usr/bin/env bash
# Aligner queries at scale through one real opguardd, timed at the CLI end to
# end (request, RocksDB reads, alignment, answer); prints
# Google-Benchmark-shaped JSON for scripts/bench.sh:
#   daemon_query/diff_1M_ops/first   `opguard diff` of two 1,000,000-op one-rank
#                                    runs (1% inserted, 1% reordered ops,
#                                    divergence at 90%): the first diff after
#                                    the daemon started, every trace read
#                                    from the store
#   daemon_query/diff_1M_ops/again   the same diff asked again (the traces
#                                    come from the query trace cache)
#   daemon_query/diff_64x20k/first   two 64-rank runs, 20,000 ops per rank
#   daemon_query/diff_64x20k/again
# Each figure is the median of REPS; "first" restarts the daemon each time.
# Counters: the fastest and slowest of the REPS (ms), the report's status (0
# identical, 1 diverged, 2 incomplete, 3 partial), the daemon's CPU seconds
# for the query, records per run.
# Environment: OPGUARD_BUILD_DIR (default build-release), DIFF_OPS (1000000),
# WIDE_RANKS (64), WIDE_OPS (20000), REPS (3), KEEP_DIR (reuse recorded runs
# from an earlier invocation in that directory), DAEMON_ARGS (extra opguardd
# flags: "--query.trace-cache-bytes 0" makes every diff read the store).
set -euo pipefail
source "$(dirname "$0")/../tools.sh"
DIFF_OPS="${DIFF_OPS:-1000000}"
WIDE_RANKS="${WIDE_RANKS:-64}"
WIDE_OPS="${WIDE_OPS:-20000}"
REPS="${REPS:-3}"

WORK="${KEEP_DIR:-$(mktemp -d /tmp/og-query-bench.XXXXXX)}"
mkdir -p "$WORK"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  [[ -z "${KEEP_DIR:-}" ]] && rm -rf "$WORK"
  return 0
}
trap cleanup EXIT

restart() {  # one daemon at a time, on the same data
  for p in "${PIDS[@]}"; do kill -TERM "$p"; wait "$p" || true; done
  PIDS=()
  # shellcheck disable=SC2086  # DAEMON_ARGS is a list of words
  start_daemon "$WORK/d" ${DAEMON_ARGS:-}
}
cpu_s() { awk '{print ($14 + $15) / 100}' "/proc/${PIDS[0]}/stat"; }
now() { date +%s.%N; }

restart
ING="ipc://$WORK/d/ingest.sock"
if [[ ! -e "$WORK/recorded" ]]; then
  pct=$((DIFF_OPS / 100))
  # Paced below the daemon's ingest rate: a faster sender makes the shim drop
  # records (it never blocks training) and the diff would be `incomplete`.
  "$LOADGEN" --run big-ref --ranks 1 --ops "$DIFF_OPS" --seed 11 --collective-every 1000 --rate 150000 \
    --endpoint "$ING" >/dev/null
  "$LOADGEN" --run big-sus --ranks 1 --ops "$DIFF_OPS" --seed 11 --collective-every 1000 --insert "$pct" \
    --reorder "$pct" --diverge-at 0:$((DIFF_OPS * 9 / 10)) --rate 150000 --endpoint "$ING" >/dev/null
  "$LOADGEN" --run wide-ref --ranks "$WIDE_RANKS" --ops "$WIDE_OPS" --seed 5 --collective-every 100 \
    --rate 3000 --endpoint "$ING" >/dev/null
  "$LOADGEN" --run wide-sus --ranks "$WIDE_RANKS" --ops "$WIDE_OPS" --seed 5 --collective-every 100 \
    --diverge-at 9:$((WIDE_OPS / 2)) --rate 3000 --endpoint "$ING" >/dev/null
  touch "$WORK/recorded"
fi

# One timed diff: "seconds daemon_cpu_seconds status".
diff_once() {
  local c0 t0 t1 c1 status
  c0=$(cpu_s); t0=$(now)
  "$CLI" diff "$1" "$2" --json --daemon "ipc://$WORK/d/query.sock" --timeout 600 >"$WORK/last.json" \
    2>"$WORK/last.err" || true
  t1=$(now); c1=$(cpu_s)
  status=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$WORK/last.json" \
    2>/dev/null || echo error)
  echo "$(echo "$t1 - $t0" | bc -l) $(echo "$c1 - $c0" | bc -l) $status"
}
# Median (by time) of REPS lines of diff_once, then the fastest and slowest time.
median() {
  local sorted
  sorted="$(sort -g)"
  echo "$(sed -n "$(( (REPS + 1) / 2 ))p" <<<"$sorted") $(head -1 <<<"$sorted" | cut -d' ' -f1)" \
    "$(tail -1 <<<"$sorted" | cut -d' ' -f1)"
}

declare -A RESULT
for pair in "big-ref big-sus diff_1M_ops" "wide-ref wide-sus diff_64x20k"; do
  read -r ref sus name <<<"$pair"
  first=()
  for _ in $(seq 1 "$REPS"); do
    restart
    first+=("$(diff_once "$ref" "$sus")")
  done
  again=()
  for _ in $(seq 1 "$REPS"); do again+=("$(diff_once "$ref" "$sus")"); done
  RESULT[$name/first]="$(printf '%s\n' "${first[@]}" | median)"
  RESULT[$name/again]="$(printf '%s\n' "${again[@]}" | median)"
done
python3 - "$DIFF_OPS" "$WIDE_RANKS" "$WIDE_OPS" "$REPS" \
  "diff_1M_ops/first=${RESULT[diff_1M_ops/first]}" "diff_1M_ops/again=${RESULT[diff_1M_ops/again]}" \
  "diff_64x20k/first=${RESULT[diff_64x20k/first]}" "diff_64x20k/again=${RESULT[diff_64x20k/again]}" <<'PY'
import json, os, sys, datetime
diff_ops, ranks, wide_ops, reps = map(int, sys.argv[1:5])
codes = {"identical": 0, "diverged": 1, "incomplete": 2, "partial": 3}
rows = []
for arg in sys.argv[5:]:
    name, values = arg.split("=", 1)
    seconds, cpu, status, fastest, slowest = values.split()
    big = name.startswith("diff_1M")
    rows.append({"name": "daemon_query/" + name, "run_type": "iteration", "repetitions": reps,
                 "iterations": 1, "real_time": float(seconds) * 1e3, "cpu_time": float(seconds) * 1e3,
                 "time_unit": "ms", "min_ms": float(fastest) * 1e3, "max_ms": float(slowest) * 1e3,
                 "daemon_cpu_s": float(cpu), "status_code": codes.get(status, -1),
                 "ranks": 1 if big else ranks, "records_per_run": diff_ops if big else ranks * wide_ops})
print(json.dumps({"context": {"date": datetime.datetime.now().isoformat(), "num_cpus": os.cpu_count(),
                              "load_avg": list(os.getloadavg()), "executable": "query.bench.sh",
                              "note": "median of repetitions, CLI end to end"},
                  "benchmarks": rows}, indent=1))
PY
