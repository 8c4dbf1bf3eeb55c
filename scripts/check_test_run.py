#!/usr/bin/env python3
"""Fails a test run that went green by losing coverage (scripts/test.sh runs it
after ctest):

- an expected ctest label with no test registered (the e2e suites and the
  adapter's tests register only where Torch was found, the CUDA comparison
  only where nvcc was);
- a skipped test: ctest's own skips (SKIP_RETURN_CODE, GoogleTest's
  "[  SKIPPED ]", a missing executable, a disabled test) and the skips that
  unittest and pytest report inside a passing ctest entry; unless
  tests/expected-skips.txt allows it.

    check_test_run.py --build DIR --junit FILE [--allow FILE] [--labels unit,integration,e2e]

FILE is ctest's --output-junit, written with --test-output-size-passed large
enough to keep every test's whole output. Prints every finding; exits 1 if
there is one.
"""
import argparse
import fnmatch
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

# Skips reported inside a ctest entry that passed: unittest -v
# ("test_x (mod.Class.test_x) ... skipped 'why'", "OK (skipped=2)") and
# pytest ("SKIPPED [1] file:12: why", "=== 3 passed, 1 skipped in 2s ===").
UNITTEST_SKIP = re.compile(r"\.\.\. skipped '(.*)'$", re.M)
UNITTEST_SUMMARY = re.compile(r"^(?:OK|FAILED) \(.*\bskipped=(\d+)", re.M)
PYTEST_SKIP = re.compile(r"^SKIPPED \[\d+\] (.*)$", re.M)
PYTEST_SUMMARY = re.compile(r"^=+ .*\b(\d+) skipped\b.* =+$", re.M)


def read_allow_list(path):
    """Lines `TEST_GLOB | TEXT THE SKIP'S OUTPUT CONTAINS | WHY`; # comments."""
    entries = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = [p.strip() for p in line.split("|")]
            if len(parts) != 3 or not all(parts):
                sys.exit(f"{path}:{n}: expected `TEST_GLOB | SKIP TEXT | WHY`")
            entries.append(tuple(parts))
    return entries


def registered_labels(build):
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                         capture_output=True, text=True).stdout
    counts = {}
    for test in json.loads(out)["tests"]:
        for prop in test.get("properties", []):
            if prop["name"] == "LABELS":
                for label in prop["value"]:
                    counts[label] = counts.get(label, 0) + 1
    return counts


def skips_of(case):
    """(reason, whole output) for each skip in one ctest entry."""
    out = (case.findtext("system-out") or "")
    skipped = case.find("skipped")
    if skipped is not None or case.get("status") in ("notrun", "disabled"):
        reason = skipped.get("message") if skipped is not None else case.get("status")
        return [(f"ctest: {reason}", out)]
    found = [(f"unittest: {r}", out) for r in UNITTEST_SKIP.findall(out)]
    found += [(f"pytest: {r}", out) for r in PYTEST_SKIP.findall(out)]
    # A skip counted in a summary but not named above (unittest without -v,
    # pytest without -rs) still counts.
    counted = sum(map(int, UNITTEST_SUMMARY.findall(out) + PYTEST_SUMMARY.findall(out)))
    found += [("skipped (named only in the summary line)", out)] * max(0, counted - len(found))
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--junit", required=True)
    ap.add_argument("--allow")
    ap.add_argument("--labels", default="")
    args = ap.parse_args()
    findings = []

    counts = registered_labels(args.build)
    for label in filter(None, args.labels.split(",")):
        if counts.get(label, 0) == 0:
            findings.append(f"no test carries the ctest label '{label}' (not configured or not built?)")

    allow = read_allow_list(args.allow) if args.allow else []
    cases = ET.parse(args.junit).getroot().iter("testcase")
    ran = allowed = 0
    for case in cases:
        ran += 1
        name = case.get("name")
        for reason, out in skips_of(case):
            why = next((w for glob, text, w in allow
                        if fnmatch.fnmatchcase(name, glob) and text in out), None)
            if why is None:
                findings.append(f"unexpected skip: {name}: {reason}")
            else:
                allowed += 1
                print(f"check_test_run: expected skip: {name} ({why})")
    if ran == 0:
        findings.append(f"{args.junit} lists no test")

    for f in findings:
        print(f"check_test_run: {f}", file=sys.stderr)
    print(f"check_test_run: {ran} ctest entries, {allowed} expected skip(s), "
          f"{len(findings)} problem(s); labels: "
          + ", ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
