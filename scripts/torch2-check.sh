#!/usr/bin/env bash
# Runs the PyTorch end-to-end tests (tests/e2e: real multi-rank gloo training
# under OPGUARD=1) against Debian unstable's newest torch 2.x and Python, in a
# chroot, with this build's daemon and CLI outside it. The adapter is built
# for that torch by scripts/torch-build-check.sh; the rest of the opguard
# package and libopguard_shim.so are this build's.
#
#   scripts/torch2-check.sh [BUILD_DIR]                 (default: build/)
#   scripts/torch2-check.sh BUILD_DIR -- COMMAND [ARGS]  (runs COMMAND instead)
#
# COMMAND runs with OPGUARD_TEST_PYTHON (that Python, in the chroot) and
# OPGUARD_PYTHON_STAGE (the package with that adapter) set, as the tests are:
# bench/torch/step_overhead.bench.sh measures that torch's overhead so.
#
# Needs root (debootstrap, chroot, bind mounts) and the Debian archive. The
# chroot (about 1.7 GB) is made once, in $OPGUARD_TORCH2_CHROOT (default
# /var/cache/opguard/torch2-chroot), and brought up to unstable's torch when
# that moved on. Not part of scripts/test.sh: unstable changes from day to day.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="$(cd "${1:-$ROOT/build}" && pwd)"
COMMAND=()
if [[ "${2:-}" == "--" ]]; then COMMAND=("${@:3}"); fi
CHROOT="${OPGUARD_TORCH2_CHROOT:-/var/cache/opguard/torch2-chroot}"
if [[ $(id -u) -ne 0 ]]; then
  echo "torch2-check: needs root (chroot, bind mounts)" >&2
  exit 2
fi
for file in daemon/opguardd cli/opguard python/opguard/lib/libopguard_shim.so; do
  if [[ ! -e "$BUILD/$file" ]]; then
    echo "torch2-check: $BUILD/$file missing: build the project first" >&2
    exit 2
  fi
done
exec 9>/tmp/opguard-torch2-check.lock
flock -w 1800 9

WORK="$(mktemp -d /tmp/opguard-torch2.XXXXXX)"
MOUNTS=()
cleanup() {
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do umount -R "${MOUNTS[i]}" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
in_chroot() { chroot "$CHROOT" /usr/bin/env DEBIAN_FRONTEND=noninteractive "$@"; }

# 1. The chroot: unstable with its python3-torch.
if [[ ! -x "$CHROOT/usr/bin/python3" ]]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap
  echo "torch2-check: making the chroot in $CHROOT (a few minutes)"
  rm -rf "$CHROOT"
  mkdir -p "$CHROOT"
  debootstrap --variant=minbase --include=python3,python3-torch,python3-numpy,libzmq5 \
    sid "$CHROOT" "$("$ROOT/scripts/debian-torch.sh" --archive)" > "$WORK/debootstrap.log" ||
    { tail -20 "$WORK/debootstrap.log" >&2; exit 2; }
fi

# 2. The paths the tests use, at the same places inside the chroot: /tmp
# (their temporary directories, the daemon's sockets), the sources, the build;
# /proc and /dev for apt and torch.
mount_inside() {  # mount_inside SOURCE [mount options...]
  local target="$CHROOT$1"
  mkdir -p "$target"
  if ! mountpoint -q "$target"; then
    mount "${@:2}" "$1" "$target"
    MOUNTS+=("$target")
  fi
}
mount_inside /proc --bind
mount_inside /dev --rbind
mount_inside /tmp --bind
mount_inside "$ROOT" --bind
[[ "$BUILD" == "$ROOT"/* ]] || mount_inside "$BUILD" --bind

# 3. That torch's headers, unpacked apart (the chroot's own /usr/include would
# shadow this machine's C library headers), and the adapter built against them.
"$ROOT/scripts/debian-torch.sh" sid "$BUILD/torch2-headers"
headers_version="$(cat "$BUILD/torch2-headers/.libtorch-dev-version")"
chroot_version() { in_chroot dpkg-query -W -f '${Version}' python3-torch; }
if [[ "$(chroot_version)" != "$headers_version" ]]; then
  echo "torch2-check: bringing the chroot's torch $(chroot_version) to $headers_version"
  in_chroot apt-get update -qq
  in_chroot apt-get install -y -qq python3-torch
  if [[ "$(chroot_version)" != "$headers_version" ]]; then
    echo "torch2-check: the chroot has torch $(chroot_version), the headers $headers_version" >&2
    exit 2
  fi
fi
TORCH_ROOT="$BUILD/torch2-headers" "$ROOT/scripts/torch-build-check.sh" "$WORK/adapter"

# 4. The opguard package as this build stages it, with that adapter.
cp -r "$BUILD/python" "$WORK/stage"
cp "$WORK/adapter/libopguard_torch.so" "$WORK/stage/opguard/lib/libopguard_torch.so"

# Debian's torch 2.x is built without libuv, the default of torch's TCP store
# from 2.4 on; USE_LIBUV=0 is torch's own switch for init_process_group's.
cat > "$WORK/python" <<EOF
#!/bin/sh
exec chroot "$CHROOT" /usr/bin/env -C "\$PWD" USE_LIBUV=0 /usr/bin/python3 "\$@"
EOF
chmod +x "$WORK/python"
versions="$("$WORK/python" -c 'import platform, torch
print(f"python {platform.python_version()}, torch {torch.__version__}")' 2>/dev/null)"
echo "   $versions"

export OPGUARD_TEST_PYTHON="$WORK/python" OPGUARD_PYTHON_STAGE="$WORK/stage"
if ((${#COMMAND[@]} > 0)); then
  "${COMMAND[@]}"  # set -e: its failure is this script's exit status
  exit 0
fi

# 5. The end-to-end suites, as ctest runs them.
cd "$ROOT/tests/e2e"
status=0
for suite in autoload faults patterns; do
  rc=0
  OPGUARDD="$BUILD/daemon/opguardd" OPGUARD_CLI="$BUILD/cli/opguard" PYTHONDONTWRITEBYTECODE=1 \
    timeout 1200 /usr/bin/python3 -m unittest -v "test_$suite" > "$WORK/$suite.log" 2>&1 || rc=$?
  cat "$WORK/$suite.log"
  ((rc == 0)) || status=1
done
exit "$status"
