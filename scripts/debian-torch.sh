#!/usr/bin/env bash
# Unpacks another Debian release's libtorch (headers and libraries) and the
# Python headers and library it goes with into DEST, without installing
# anything, so that scripts/torch-build-check.sh can build the adapter against
# a torch 2.x on this Debian 12 machine (TORCH_ROOT=DEST).
#
#   scripts/debian-torch.sh SUITE DEST    # SUITE: trixie (torch 2.6), sid (the newest)
#   scripts/debian-torch.sh --archive     # prints the Debian archive used
#
# The packages come from the Debian archive this machine's apt already uses,
# through a private apt state in a temporary directory: the machine's own
# package lists and sources are not touched. Fetches again only when the
# suite's libtorch-dev version differs from the one unpacked in DEST.
set -euo pipefail

# The archive this machine installs Debian's packages from.
ARCHIVE="$(apt-get indextargets --format '$(REPO_URI)' 'Identifier: Packages' 'Component: main' |
           grep -v -- '-security' | head -1)"
if [[ -z "$ARCHIVE" ]]; then
  echo "debian-torch: no Debian archive in this machine's apt sources" >&2
  exit 2
fi
if [[ $# -eq 1 && "$1" == "--archive" ]]; then
  echo "$ARCHIVE"
  exit 0
fi
if [[ $# -ne 2 ]]; then
  echo "usage: $0 SUITE DEST | --archive" >&2
  exit 2
fi
SUITE="$1"
DEST="$2"

STATE="$(mktemp -d /tmp/opguard-debian-torch.XXXXXX)"
trap 'rm -rf "$STATE"' EXIT
mkdir -p "$STATE/lists/partial" "$STATE/cache/archives/partial" "$STATE/debs"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $ARCHIVE $SUITE main" \
  > "$STATE/sources.list"
APT=(-o Dir::Etc::sourcelist="$STATE/sources.list" -o Dir::Etc::sourceparts=-
     -o Dir::State::Lists="$STATE/lists" -o Dir::Cache="$STATE/cache"
     -o Dir::State::status=/dev/null -o APT::Sandbox::User=root)
apt-get "${APT[@]}" update -qq

# Version and name of the packages: libtorch-dev names its runtime library
# package (libtorch2.N), libpython3-dev the Python it goes with.
# The first FIELD of a package's record (awk reads to the end: an early exit
# would break apt-cache's pipe, which pipefail reports).
field() {
  apt-cache "${APT[@]}" show "$1" |
    awk -v f="$2:" '$1 == f && !done { sub(/^[^ ]+ /, ""); print; done = 1 }'
}
version="$(field libtorch-dev Version)"
stamp="$DEST/.libtorch-dev-version"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
  echo "debian-torch: $SUITE's libtorch-dev $version already in $DEST"
  exit 0
fi
runtime="$(field libtorch-dev Depends | grep -o 'libtorch[0-9][0-9.]*' | head -1)"
python_dev="$(field libpython3-dev Depends | grep -o 'libpython3\.[0-9]*-dev' | head -1)"
python_lib="${python_dev%-dev}"
if [[ -z "$runtime" || -z "$python_dev" ]]; then
  echo "debian-torch: $SUITE has no libtorch-dev or libpython3-dev" >&2
  exit 2
fi
(cd "$STATE/debs" &&
 apt-get "${APT[@]}" download -qq "libtorch-dev=$version" "$runtime=$version" \
   "$python_dev" "$python_lib")

rm -rf "$DEST.new"
mkdir -p "$DEST.new"
for deb in "$STATE"/debs/*.deb; do dpkg-deb -x "$deb" "$DEST.new"; done
echo "$version" > "$DEST.new/.libtorch-dev-version"
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
echo "debian-torch: unpacked $SUITE's libtorch-dev $version ($runtime, $python_dev) into $DEST"
