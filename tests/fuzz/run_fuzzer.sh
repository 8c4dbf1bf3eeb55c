#!/usr/bin/env bash
# Runs one libFuzzer harness for a bounded number of inputs, starting from
# its committed corpus; new inputs go to a scratch dir (the committed corpus
# is read only). A failure leaves the input in $OPGUARD_FUZZ_ARTIFACTS (default:
# the working dir) as crash-*/timeout-*/oom-*: add it to the corpus with the fix.
#   run_fuzzer.sh FUZZER CORPUS_DIR RUNS [libFuzzer flags...]
set -euo pipefail
FUZZER="$1" CORPUS="$2" RUNS="$3"
shift 3
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
ARTIFACTS="${OPGUARD_FUZZ_ARTIFACTS:-$PWD}/"
mkdir -p "$ARTIFACTS"
# -seed: the same inputs each CI run; OPGUARD_FUZZ_SEED=0 for a random one.
exec "$FUZZER" "$SCRATCH" "$CORPUS" -runs="$RUNS" -seed="${OPGUARD_FUZZ_SEED:-1}" \
  -max_len=65536 -timeout=120 -rss_limit_mb=4096 -print_final_stats=1 \
  -artifact_prefix="$ARTIFACTS" "$@"
