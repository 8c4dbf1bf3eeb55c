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
# The JSON's "context" says what the figures were measured on: the CPU model,
# its core count, the build type and compiler flags of the binaries, and the
# machine's load average before and after each row (a figure taken while
# other work ran is not the daemon's capacity; compare the CPU seconds per
# million records, which load disturbs less). The same lines go to stderr.
# Environment: OPGUARD_BUILD_DIR (default build-release), INGEST_SECONDS (12),
# LOADGEN_OPS (ops per rank, 300000), LOADGEN_RATE (125000), PACED_SECONDS (8).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${OPGUARD_BUILD_DIR:-$ROOT/build-release}"
BIN="$BUILD/bench/daemon/daemon_ingest"
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" 2>/dev/null | head -1; }
build_type="$(cache_value CMAKE_BUILD_TYPE)"
build_flags="$(cache_value CMAKE_CXX_FLAGS) $(cache_value "CMAKE_CXX_FLAGS_$(echo "${build_type:-none}" | tr a-z A-Z)")"
cpu_model="$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)"
# The instruction sets the libraries' fast paths look for (RocksDB's CRC32C
# needs sse4_2 and a build that uses it; LZ4 and ZeroMQ copy with AVX).
cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'sse4_2|pclmulqdq|avx2|avx512f|hypervisor' | tr '\n' ' ')"
echo "ingest.bench.sh: ${cpu_model:-unknown CPU} (${cpu_flags% }), $(nproc) cores, kernel $(uname -r), build ${build_type:-<none>} (${build_flags# }), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
[[ "$build_type" == Release ]] || echo "ingest.bench.sh: warning: $BUILD is not a Release build: the figures are not the daemon's" >&2
load() { cut -d' ' -f1 /proc/loadavg; }
loads=("$(load)")
only="$("$BIN" --cheap-senders --seconds "${INGEST_SECONDS:-12}" --json)"
loads+=("$(load)")
shim="$("$BIN" --loadgen "$BUILD/tools/loadgen/opguard-loadgen" \
          --loadgen-ops "${LOADGEN_OPS:-300000}" --json)"
loads+=("$(load)")
rate="${LOADGEN_RATE:-125000}"
paced="$("$BIN" --loadgen "$BUILD/tools/loadgen/opguard-loadgen" --loadgen-rate "$rate" \
          --loadgen-ops "$((rate * ${PACED_SECONDS:-8}))" --json)"
loads+=("$(load)")
/usr/bin/python3 - "$only" "$shim" "$paced" "$cpu_model" "$cpu_flags" "$build_type" "$build_flags" "${loads[@]}" <<'PY'
import json, os, sys
results, (cpu_model, cpu_flags, build_type, build_flags), loads = sys.argv[1:4], sys.argv[4:8], sys.argv[8:]
rows = []
for i, (name, text) in enumerate(zip(("ingest/daemon_only", "ingest/real_shim", "ingest/real_shim_paced"),
                                     results)):
    r = json.loads(text)
    records = max(1, r["records"])
    rows.append({"name": name, "run_type": "iteration", "iterations": 1,
                 "load_avg_before": float(loads[i]), "load_avg_after": float(loads[i + 1]),
                 "real_time": r["seconds"] * 1e3, "cpu_time": r["seconds"] * 1e3,
                 "time_unit": "ms", "items_per_second": r["records_per_s"],
                 "bytes_per_record": r["bytes_per_record"],
                 "peak_rss_mib": r["peak_rss_bytes"] / 1048576.0,
                 "daemon_cpu_s_per_M": r["daemon_cpu_s"] * 1e6 / records})
    if "loadgen_cpu_s" in r:
        rows[-1]["loadgen_cpu_s_per_M"] = r["loadgen_cpu_s"] * 1e6 / records
        rows[-1]["records_dropped"] = r.get("records_dropped", 0)
context = {"cpu_model": cpu_model, "cpu_flags": cpu_flags.split(), "num_cpus": os.cpu_count(),
           "kernel": os.uname().release, "build_type": build_type,
           "cxx_flags": build_flags.strip(), "load_avg_1min": [float(x) for x in loads]}
for row in rows:
    print("ingest.bench.sh: %-24s %9.0f records/s, daemon %.2f s CPU per M records, load %.1f -> %.1f"
          % (row["name"], row["items_per_second"], row["daemon_cpu_s_per_M"], row["load_avg_before"],
             row["load_avg_after"]), file=sys.stderr)
print(json.dumps({"context": context, "benchmarks": rows}, indent=1))
PY
