#!/usr/bin/env python3
"""Renders scripts/gpu-check.sh's results (one JSON row per check) as one
Markdown table with the date, machine and commit, and puts it into
docs/gpu-results.md between the `gpu-check:latest` markers (the previous run
moves into the history below them). Exit 1 when the results file is missing
or unreadable.

    gpu_results.py --results R.jsonl --machine "NVIDIA H200, 570.x, 141 GiB" \
        --commit abc123 --seconds 431 --table out.md [--docs docs/gpu-results.md] [--no-docs]
"""
import argparse
import datetime
import json
import sys

BEGIN = "<!-- gpu-check:latest:begin -->"
END = "<!-- gpu-check:latest:end -->"
HISTORY = "<!-- gpu-check:history -->"
VERDICTS = {"ok": "ok", "fail": "**FAIL**", "miss": "missed", "skip": "skipped"}


def cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def render(rows, machine, commit, seconds, now):
    lines = [f"### {now:%Y-%m-%d %H:%M} UTC · {cell(machine)} · commit {cell(commit)} · {seconds} s",
             "",
             "| section | check | target | measured | verdict |",
             "| --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append("| " + " | ".join(cell(r.get(k, "")) for k in ("section", "check", "target", "measured"))
                     + f" | {VERDICTS.get(r.get('verdict'), cell(r.get('verdict', '')))} |")
    return "\n".join(lines) + "\n"


def update_docs(path, table):
    """Replaces the latest block; the block it replaces goes on top of the
    history. Returns False when the markers are missing."""
    with open(path) as f:
        text = f.read()
    if BEGIN not in text or END not in text or HISTORY not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    previous, tail = rest.split(END, 1)
    previous = previous.strip()
    if previous.startswith("###"):  # a real earlier run, not the placeholder
        before, after = tail.split(HISTORY, 1)
        tail = before + HISTORY + "\n\n" + previous + "\n" + after
    with open(path, "w") as f:
        f.write(head + BEGIN + "\n" + table + END + tail)
    return True


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results", required=True)
    parser.add_argument("--machine", required=True)
    parser.add_argument("--commit", required=True)
    parser.add_argument("--seconds", type=int, required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--docs")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--now", help="UTC time as YYYY-MM-DDTHH:MM (tests); default now")
    args = parser.parse_args()
    try:
        with open(args.results) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"gpu_results: cannot read {args.results}: {e}", file=sys.stderr)
        return 1
    now = (datetime.datetime.strptime(args.now, "%Y-%m-%dT%H:%M") if args.now
           else datetime.datetime.now(datetime.timezone.utc))
    table = render(rows, args.machine, args.commit, args.seconds, now)
    with open(args.table, "w") as f:
        f.write(table)
    if args.docs and not args.no_docs:
        if not update_docs(args.docs, table):
            print(f"gpu_results: {args.docs} lacks the gpu-check markers; table not inserted",
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
