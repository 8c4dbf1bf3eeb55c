#!/usr/bin/env bash
# Builds in Release and runs every benchmark (targets named *_bench), then
# prints one table of headline figures: one row per benchmark case, with its
# time and its throughput/counters. Ratios are only meaningful within one run
# (these machines are shared and noisy), so every comparison a target needs
# (ours vs memcpy vs XXH3, with vs without OpGuard) is measured in the same run.
#   scripts/bench.sh                 # all benchmarks
#   scripts/bench.sh fingerprint     # only targets whose name contains "fingerprint"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${OPGUARD_BENCH_BUILD_DIR:-$ROOT/build-release}"
FILTER="${1:-}"
OUTDIR="${OPGUARD_BENCH_OUT:-$BUILD/bench-results}"

"$ROOT/scripts/setup-deps.sh" >/dev/null
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DOPGUARD_BUILD_TESTS=OFF >/dev/null
cmake --build "$BUILD" -j "$(nproc)" >/dev/null

mkdir -p "$OUTDIR"
mapfile -t BENCHES < <(find "$BUILD/bench" -type f -executable -name '*_bench' | sort)
ran=()
for bench in "${BENCHES[@]}"; do
  name="$(basename "$bench")"
  [[ -n "$FILTER" && "$name" != *"$FILTER"* ]] && continue
  echo "bench: running $name" >&2
  "$bench" --benchmark_format=json --benchmark_out="$OUTDIR/$name.json" \
    --benchmark_out_format=json >/dev/null
  ran+=("$OUTDIR/$name.json")
done
# Script benchmarks (bench/*/*.bench.sh) print their own JSON in the same shape.
while IFS= read -r script; do
  name="$(basename "$script" .bench.sh)"
  [[ -n "$FILTER" && "$name" != *"$FILTER"* ]] && continue
  echo "bench: running $name" >&2
  OPGUARD_BUILD_DIR="$BUILD" bash "$script" >"$OUTDIR/$name.json"
  ran+=("$OUTDIR/$name.json")
done < <(find "$ROOT/bench" -name '*.bench.sh' | sort)

[[ ${#ran[@]} -eq 0 ]] && { echo "bench: nothing matched '$FILTER'" >&2; exit 1; }
/usr/bin/python3 "$ROOT/scripts/bench_table.py" "${ran[@]}"
