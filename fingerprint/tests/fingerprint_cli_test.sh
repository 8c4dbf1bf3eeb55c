#!/usr/bin/env bash
# Integration test of the real `opguard fingerprint` binary: results match the
# committed vectors (fingerprint/testdata/vectors.txt) for mapped files of
# sizes that are not a multiple of any block (and 0 bytes), a pipe gives the
# same digest and statistics as the mapped file, --json carries the stats, and
# every bad input gives exactly one line on stderr, nothing on stdout and exit
# code 2.   usage: fingerprint_cli_test.sh PATH/TO/opguard
set -euo pipefail
OPGUARD="$1"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VECTORS="$HERE/../testdata/vectors.txt"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
failures=0
fail() { echo "FAIL: $*" >&2; failures=$((failures + 1)); }

# SplitMix64 (docs/fingerprint.md, "Test vectors") in 64-bit bash arithmetic;
# writes the first N bytes of seed S's stream to FILE.
srl() { echo $(( ($1 >> $2) & ((1 << (64 - $2)) - 1) )); }
vector_bytes() {
  local seed=$1 n=$2 file=$3 state z out="" i k
  state=$seed
  : > "$file"
  for ((i = 0; i < n; i += 8)); do
    state=$(( state + 0x9E3779B97F4A7C15 ))
    z=$state
    z=$(( (z ^ $(srl $z 30)) * 0xBF58476D1CE4E5B9 ))
    z=$(( (z ^ $(srl $z 27)) * 0x94D049BB133111EB ))
    z=$(( z ^ $(srl $z 31) ))
    for ((k = 0; k < 8 && i + k < n; ++k)); do
      out+=$(printf '\\x%02x' $(( (z >> (8 * k)) & 255 )))
    done
  done
  printf "$out" > "$file"
}

expect_vector() {  # seed dtype shape bytes
  local want got
  want=$(awk -v s="$1" -v d="$2" -v sh="$3" '$1==s && $2==d && $3==sh {print $4}' "$VECTORS")
  [[ -n "$want" ]] || { fail "no vector $1 $2 $3"; return; }
  vector_bytes "$1" "$4" "$TMP/v.bin"
  got=$("$OPGUARD" fingerprint --dtype "$2" --shape "$3" "$TMP/v.bin") || { fail "exit $? for $*"; return; }
  [[ "$got" == "$want" ]] || fail "vector $1 $2 [$3]: got $got want $want"
}

expect_vector 251 uint8 0 0
expect_vector 252 uint8 1 1
expect_vector 256 uint8 8 8
expect_vector 2 float64 1 8
expect_vector 26 float32 0 0
expect_vector 260 uint8 17 17
expect_vector 43 float32 1025 4100

# A mapped file and the same bytes through a pipe (read, not mapped): equal
# digests and statistics, at sizes around the page and chunk boundaries.
for bytes in 0 1 4095 4097 65537 1048579; do
  head -c "$bytes" /dev/urandom > "$TMP/r.bin"
  for json in "" --json; do
    mapped=$("$OPGUARD" fingerprint --dtype uint8 --shape "$bytes" "$TMP/r.bin" $json) || fail "exit $? for $bytes bytes"
    piped=$(cat "$TMP/r.bin" | "$OPGUARD" fingerprint --dtype uint8 --shape "$bytes" /dev/stdin $json) ||
      fail "exit $? for $bytes bytes through a pipe"
    [[ -n "$mapped" && "$mapped" == "$piped" ]] || fail "$bytes bytes $json: mapped '$mapped' piped '$piped'"
  done
done

# Output format, determinism, thread independence, dtype/shape sensitivity.
vector_bytes 7 4096 "$TMP/t.bin"
a=$("$OPGUARD" fingerprint --dtype float32 --shape 32,32 "$TMP/t.bin")
[[ "$a" =~ ^[0-9a-f]{32}$ ]] || fail "not 32 hex digits: '$a'"
b=$("$OPGUARD" fingerprint --shape 32,32 --dtype fp32 --threads 4 "$TMP/t.bin")
[[ "$a" == "$b" ]] || fail "threads/alias changed the digest"
c=$("$OPGUARD" fingerprint --dtype int32 --shape 32,32 "$TMP/t.bin")
[[ "$a" != "$c" ]] || fail "dtype not mixed in"
d=$("$OPGUARD" fingerprint --dtype float32 --shape 1024 "$TMP/t.bin")
[[ "$a" != "$d" ]] || fail "shape not mixed in"

# --json: 1.0, NaN, +Inf, -2.5 as float32.
printf '\x00\x00\x80\x3f\x00\x00\xc0\x7f\x00\x00\x80\x7f\x00\x00\x20\xc0' > "$TMP/s.bin"
j=$("$OPGUARD" fingerprint --dtype float32 --shape 4 "$TMP/s.bin" --json)
for want in '"nan_count":1' '"inf_count":1' '"min":-2.5' '"max":1' '"sum":-1.5' \
            '"dtype":"float32"' '"shape":[4]' '"bytes":16'; do
  [[ "$j" == *"$want"* ]] || fail "--json lacks $want: $j"
done
h=$("$OPGUARD" fingerprint --dtype float32 --shape 4 "$TMP/s.bin")
[[ "$j" == *"\"fingerprint\":\"$h\""* ]] || fail "--json fingerprint differs from plain output"

# Bad input: one stderr line, empty stdout, exit 2.
expect_error() {
  local rc=0
  "$OPGUARD" fingerprint "$@" > "$TMP/out" 2> "$TMP/err" || rc=$?
  [[ $rc -eq 2 ]] || fail "exit $rc, want 2, for: $*"
  [[ ! -s "$TMP/out" ]] || fail "stdout not empty for: $*"
  [[ $(wc -l < "$TMP/err") -eq 1 ]] || fail "want one stderr line for: $* (got: $(cat "$TMP/err"))"
}
expect_error --dtype float32 --shape 4,4 "$TMP/s.bin"        # too few bytes
expect_error --dtype float32 --shape 2 "$TMP/s.bin"          # too many bytes
expect_error --dtype float33 --shape 4 "$TMP/s.bin"          # unknown dtype
expect_error --dtype float32 --shape 4,x "$TMP/s.bin"        # bad shape
expect_error --dtype float32 --shape -4 "$TMP/s.bin"         # negative dimension
expect_error --dtype float32 --shape 4,,1 "$TMP/s.bin"       # empty dimension
expect_error --dtype float32 --shape 4 "$TMP/does-not-exist" # unreadable file
expect_error --dtype float32 --shape 4 "$TMP"                # a directory
expect_error --dtype float32 "$TMP/s.bin"                    # no shape
expect_error --dtype float32 --shape 4                       # no file
expect_error --dtype float32 --shape 4 --bogus "$TMP/s.bin"  # unknown option
expect_error --dtype float32 --shape 9223372036854775807,4 "$TMP/s.bin"  # overflow
expect_error --dtype float32 --shape 2 /dev/null                         # empty stream
printf '\x00\x00\x80\x3f\x00' | expect_error --dtype float32 --shape 1 /dev/stdin   # stream too long

if ((failures)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "fingerprint CLI: all checks passed"
