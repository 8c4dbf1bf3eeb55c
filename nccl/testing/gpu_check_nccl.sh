#!/usr/bin/env bash
# libopguard_nccl.so on a GPU with the real libnccl (scripts/gpu-check.sh's
# "nccl" section): opguard-nccl-gpu (one rank, device buffers, every wrapped
# call, each result checked) runs alone, preloaded with OPGUARD unset, and
# under `opguard exec` into a fresh opguardd; then `opguard collectives`
# must show every call Entered and Completed. Prints one result line.
#   nccl/testing/gpu_check_nccl.sh BUILD_DIR
# BUILD_DIR: a CMake build tree with opguardd, opguard, libopguard_nccl.so
# and opguard-nccl-gpu. Exit 0 pass, 1 fail, 77 skipped (no CUDA device).
set -uo pipefail
B="$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)"
PROGRAM="$B/nccl/opguard-nccl-gpu"
[[ -x "$PROGRAM" ]] || { echo "nccl: FAIL: $PROGRAM not built (CUDA toolkit or libnccl missing)"; exit 1; }
TMP="$(mktemp -d /tmp/opguard-nccl-gpu.XXXXXX)"
DAEMON_PID=
cleanup() { [[ -n "$DAEMON_PID" ]] && kill "$DAEMON_PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT

"$PROGRAM" >"$TMP/alone.txt" 2>&1
rc=$?
[[ $rc == 77 ]] && { echo "nccl: skipped: no CUDA device"; exit 77; }
[[ $rc == 0 ]] || { echo "nccl: FAIL: the program alone: $(tail -3 "$TMP/alone.txt")"; exit 1; }
env -u OPGUARD LD_PRELOAD="$B/nccl/libopguard_nccl.so" "$PROGRAM" >"$TMP/off.txt" 2>&1 ||
  { echo "nccl: FAIL: preloaded, OPGUARD unset: $(tail -3 "$TMP/off.txt")"; exit 1; }

"$B/daemon/opguardd" --local "$TMP/d" --http 127.0.0.1:0 >"$TMP/opguardd.log" 2>&1 &
DAEMON_PID=$!
Q="ipc://$TMP/d/query.sock"
for _ in $(seq 100); do "$B/cli/opguard" status --daemon "$Q" >/dev/null 2>&1 && break; sleep 0.1; done
OPGUARD_ENDPOINT="ipc://$TMP/d/ingest.sock" RANK=0 WORLD_SIZE=1 \
  "$B/cli/opguard" exec --run gpu-nccl -- "$PROGRAM" >"$TMP/on.txt" 2>&1 ||
  { echo "nccl: FAIL: under opguard exec: $(tail -3 "$TMP/on.txt")"; exit 1; }
"$B/cli/opguard" collectives gpu-nccl --json --daemon "$Q" >"$TMP/collectives.json"
python3 - "$TMP/collectives.json" "$TMP/on.txt" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
live = {c["name"]: c["ranks"][0] for c in report["live"]}
world = [n for n in live if "/" not in n and " p2p " not in n]
split = [n for n in live if "/split0.0" in n]
channel = [n for n in live if n.endswith(" p2p 0->0")]
ok = (report["status"] == "identical" and len(world) == 1 and len(split) == 1 and len(channel) == 1
      and live[world[0]]["last_completed"] == 10 and live[split[0]]["last_completed"] == 0
      and live[channel[0]]["last_completed"] == 0)
# Device buffers are not fingerprinted until the shim resolves stream-ordered
# fingerprints; the interposer says so once.
device_note = "device memory are recorded without fingerprints" in open(sys.argv[2]).read()
print(f"nccl: {'PASS' if ok else 'FAIL'}: 14 calls on real NCCL recorded (world seq 0..10 "
      f"completed, split, send/recv channel), results unchanged with and without the interposer"
      f"{'; device buffers not fingerprinted by this build' if device_note else ''}")
if not ok:
    print(json.dumps(report["live"], indent=1))
sys.exit(0 if ok else 1)
PY
