#!/usr/bin/env bash
# Cluster queries through real daemons; prints Google-Benchmark-shaped JSON
# (scripts/bench.sh collects it).
#
#   cluster_diff/16_daemons        `opguard diff` over 16 local daemons acting as
#                                  16 nodes (2 ranks each, 32-rank run), the
#                                  receiver fanning out to 15 peers
#   cluster_collectives/16_daemons `opguard collectives` over the same
#   daemon_diff/1M_ops             `opguard diff` of two 1,000,000-op traces (one
#                                  rank, 1% inserted + 1% reordered ops, divergence
#                                  at 90%) through one daemon: RocksDB scan,
#                                  alignment, pivot lookup, answer
# Counters: records per node, ranks, the report's status, and whether a
# loadgen ingesting into the same daemon during the 1M diff got every batch
# acknowledged (ingest keeps acking while the aligner runs).
#
# Environment: OPGUARD_BUILD_DIR (default build-release), CLUSTER_OPS (ops per
# rank of the 16-daemon run, default 20000), DIFF_OPS (default 1000000),
# REPS (timed repetitions, default 3), DIFF_RATE (ops/s of the 1M-op
# recordings, default 100000).
set -euo pipefail
source "$(dirname "$0")/../tools.sh"
CLUSTER_OPS="${CLUSTER_OPS:-20000}"
DIFF_OPS="${DIFF_OPS:-1000000}"
REPS="${REPS:-3}"
DIFF_RATE="${DIFF_RATE:-100000}"  # ops/s the 1M-op traces are recorded at
NODES=16

WORK="$(mktemp -d /tmp/og-cluster-bench.XXXXXX)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

now() { date +%s.%N; }
# Median seconds of REPS runs of a command; the last run's stdout in $WORK/last.json.
time_median() {
  local times=()
  for _ in $(seq 1 "$REPS"); do
    local t0 t1
    t0=$(now)
    "$@" >"$WORK/last.json" 2>"$WORK/last.err" || true
    t1=$(now)
    times+=("$(echo "$t1 - $t0" | bc -l)")
  done
  printf '%s\n' "${times[@]}" | sort -g | sed -n "$(( (REPS + 1) / 2 ))p"
}
status_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["status"])' "$WORK/last.json" 2>/dev/null || echo error; }

# ---- 16 daemons, 2 ranks each ------------------------------------------------
peers=""
for n in $(seq 0 $((NODES - 1))); do peers+="${peers:+,}ipc://$WORK/n$n/query.sock"; done
for n in $(seq 0 $((NODES - 1))); do start_daemon "$WORK/n$n" --peers "$peers"; done
record() {  # RUN EXTRA...: every node records its two ranks, four nodes at a time
  local run="$1"; shift
  local batch=()
  for n in $(seq 0 $((NODES - 1))); do
    "$LOADGEN" --run "$run" --ranks 2 --first-rank $((2 * n)) --world-size $((2 * NODES)) --ops "$CLUSTER_OPS" \
      --collective-every 100 --seed 5 --rate 20000 --endpoint "ipc://$WORK/n$n/ingest.sock" "$@" >/dev/null 2>&1 &
    batch+=("$!")
    if (( n % 4 == 3 )); then
      # (a bare `wait` would wait for the daemons too)
      wait "${batch[@]}" || echo "cluster_query.bench.sh: a loadgen of run $run failed" >&2
      batch=()
    fi
  done
}
record ref
record sus --diverge-at 9:$((CLUSTER_OPS / 2))
Q="ipc://$WORK/n0/query.sock"
t_cluster_diff=$(time_median "$CLI" diff ref sus --json --daemon "$Q" --timeout 300)
s_cluster_diff=$(status_of)
t_cluster_coll=$(time_median "$CLI" collectives sus --json --daemon "$Q" --timeout 300)
s_cluster_coll=$(status_of)
for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
PIDS=()

# ---- two 1M-op traces through one daemon -------------------------------------
start_daemon "$WORK/big"
pct=$((DIFF_OPS / 100))
# Paced below the daemon's ingest rate: a faster sender makes the shim drop
# records (it never blocks training) and the diff would be `incomplete`.
"$LOADGEN" --run big-ref --ranks 1 --ops "$DIFF_OPS" --seed 11 --collective-every 1000 --rate "$DIFF_RATE" \
  --endpoint "ipc://$WORK/big/ingest.sock" >/dev/null 2>&1 || echo "cluster_query.bench.sh: big-ref lost records" >&2
"$LOADGEN" --run big-sus --ranks 1 --ops "$DIFF_OPS" --seed 11 --collective-every 1000 --insert "$pct" \
  --reorder "$pct" --diverge-at 0:$((DIFF_OPS * 9 / 10)) --rate "$DIFF_RATE" \
  --endpoint "ipc://$WORK/big/ingest.sock" >/dev/null 2>&1 || echo "cluster_query.bench.sh: big-sus lost records" >&2
BQ="ipc://$WORK/big/query.sock"
# A sender keeps ingesting while the first diff runs.
"$LOADGEN" --run side --ranks 1 --ops 200000 --rate 20000 --seed 2 --endpoint "ipc://$WORK/big/ingest.sock" \
  --json >"$WORK/side.json" 2>/dev/null &
side=$!
t_big=$(time_median "$CLI" diff big-ref big-sus --json --daemon "$BQ" --timeout 600)
s_big=$(status_of)
wait "$side" || true
side_acked=$(python3 -c 'import json,sys; print(1 if json.load(open(sys.argv[1]))["all_acknowledged"] else 0)' "$WORK/side.json" 2>/dev/null || echo 0)
rss_kb=$(awk '/VmHWM/ {print $2}' "/proc/${PIDS[0]}/status" 2>/dev/null || echo 0)

python3 - "$t_cluster_diff" "$s_cluster_diff" "$t_cluster_coll" "$s_cluster_coll" "$t_big" "$s_big" \
  "$side_acked" "$rss_kb" "$CLUSTER_OPS" "$DIFF_OPS" "$REPS" "$NODES" <<'PY'
import json, os, sys, datetime
(t_cd, s_cd, t_cc, s_cc, t_big, s_big, side_acked, rss_kb, cluster_ops, diff_ops, reps, nodes) = sys.argv[1:]
def bench(name, seconds, **counters):
    ms = float(seconds) * 1000
    b = {"name": name, "run_name": name, "run_type": "iteration", "repetitions": int(reps),
         "iterations": 1, "real_time": ms, "cpu_time": ms, "time_unit": "ms"}
    b.update(counters)
    return b
status_code = {"identical": 0, "diverged": 1, "incomplete": 2, "partial": 3}
out = {
  "context": {"date": datetime.datetime.now().isoformat(), "host_name": os.uname().nodename,
              "executable": "cluster_query.bench.sh", "num_cpus": os.cpu_count(),
              "note": "median of repetitions; status_code 0 identical 1 diverged 2 incomplete 3 partial"},
  "benchmarks": [
    bench("cluster_diff/16_daemons", t_cd, nodes=int(nodes), ranks=2 * int(nodes),
          ops_per_rank=int(cluster_ops), status_code=status_code.get(s_cd, -1)),
    bench("cluster_collectives/16_daemons", t_cc, nodes=int(nodes), ranks=2 * int(nodes),
          status_code=status_code.get(s_cc, -1)),
    bench("daemon_diff/%s_ops" % ("1M" if int(diff_ops) == 1000000 else diff_ops), t_big, ops_per_trace=int(diff_ops), status_code=status_code.get(s_big, -1),
          ingest_acked_during_diff=int(side_acked), daemon_peak_rss_mib=int(rss_kb) / 1024),
  ]}
print(json.dumps(out, indent=2))
PY
