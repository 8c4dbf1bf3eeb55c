#!/usr/bin/env bash
# Sustained ingest into a real opguardd with durable acks, two ways, printed
# as Google-Benchmark-shaped JSON for scripts/bench.sh:
#   ingest/daemon_only  8 template-patching senders (--cheap-senders): the
#                       daemon's own capacity
#   ingest/real_shim    8 opguard-loadgen ranks through the real shim, each
#                       recording its whole trace at once
#   ingest/real_shim_paced  the same ranks paced at LOADGEN_RATE ops/s each
#                       (1 M records/s offered for PACED_SECONDS): sustained
#                       if records_dropped is 0 and real_time ~ PACED_SECONDS
# Counters: records/s, bytes on disk per record, daemon peak RSS (MiB),
# daemon CPU seconds per million records (and, for real_shim, the loadgen
# ranks' CPU seconds per million records: they share the daemon's cores).
# Environment: OPGUARD_BUILD_DIR (default build-release), INGEST_SECONDS (12),
# LOADGEN_OPS (ops per rank, 300000), LOADGEN_RATE (125000), PACED_SECONDS (8).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build-release}"
BIN="$BUILD/bench/daemon/daemon_ingest"
only="$("$BIN" --cheap-senders --seconds "${INGEST_SECONDS:-12}" --json)"
shim="$("$BIN" --loadgen "$BUILD/tools/loadgen/opguard-loadgen" \
          --loadgen-ops "${LOADGEN_OPS:-300000}" --json)"
rate="${LOADGEN_RATE:-125000}"
paced="$("$BIN" --loadgen "$BUILD/tools/loadgen/opguard-loadgen" --loadgen-rate "$rate" \
          --loadgen-ops "$((rate * ${PACED_SECONDS:-8}))" --json)"
/usr/bin/python3 - "$only" "$shim" "$paced" <<'PY'
import json, sys
rows = []
for name, text in zip(("ingest/daemon_only", "ingest/real_shim", "ingest/real_shim_paced"),
                      sys.argv[1:]):
    r = json.loads(text)
    records = max(1, r["records"])
    rows.append({"name": name, "run_type": "iteration", "iterations": 1,
                 "real_time": r["seconds"] * 1e3, "cpu_time": r["seconds"] * 1e3,
                 "time_unit": "ms", "items_per_second": r["records_per_s"],
                 "bytes_per_record": r["bytes_per_record"],
                 "peak_rss_mib": r["peak_rss_bytes"] / 1048576.0,
                 "daemon_cpu_s_per_M": r["daemon_cpu_s"] * 1e6 / records})
    if "loadgen_cpu_s" in r:
        rows[-1]["loadgen_cpu_s_per_M"] = r["loadgen_cpu_s"] * 1e6 / records
        rows[-1]["records_dropped"] = r.get("records_dropped", 0)
print(json.dumps({"benchmarks": rows}, indent=1))
PY
