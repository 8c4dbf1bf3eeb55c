#!/usr/bin/env python3
"""Checks a file against the Chrome/Perfetto trace-event format (the JSON
Object Format: {"traceEvents": [...], "displayTimeUnit": ...}) as the trace
viewers read it:

  * every event has "ph"; the fields each phase needs are there, with the
    right types (name/pid/tid/ts for X, B, E, i, s, f; dur >= 0 for X;
    args.name for process_name / thread_name metadata; scope g|p|t for i);
  * complete (X) and B/E slices nest on each thread (a slice that starts
    inside another ends inside it; every E closes the innermost open B);
  * flows pair up: each id has one "s" and one "f" with the same cat and
    name, and each lands inside a slice of its thread (its binding point);
  * every pid/tid with events is named by metadata.

Usage: check_trace_events.py FILE  (exit 0 and a summary line, or 1 and the
first problems). As a module: check(doc) -> (problems, summary).
"""
import collections
import json
import sys

NUMBER = (int, float)


def _slices_by_thread(events):
    by_thread = collections.defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            by_thread[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e))
    for spans in by_thread.values():
        spans.sort(key=lambda s: (s[0], -(s[1] - s[0])))
    return by_thread


def check(doc):
    problems = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["not a JSON object with a traceEvents array"], {}
    if doc.get("displayTimeUnit") not in (None, "ms", "ns"):
        problems.append(f"displayTimeUnit {doc.get('displayTimeUnit')!r} is not ms or ns")
    events = doc["traceEvents"]
    named_processes, named_threads = set(), set()
    used_threads = set()
    flows = collections.defaultdict(list)
    for n, e in enumerate(events):
        where = f"event {n}"
        if not isinstance(e, dict) or not isinstance(e.get("ph"), str):
            problems.append(f"{where}: no ph")
            continue
        ph = e["ph"]
        need = {"X": ("name", "pid", "tid", "ts", "dur"), "B": ("name", "pid", "tid", "ts"),
                "E": ("pid", "tid", "ts"), "i": ("name", "pid", "tid", "ts", "s"),
                "I": ("name", "pid", "tid", "ts"), "s": ("name", "cat", "id", "pid", "tid", "ts"),
                "f": ("name", "cat", "id", "pid", "tid", "ts"), "M": ("name", "pid", "args")}.get(ph)
        if need is None:
            problems.append(f"{where}: unexpected phase {ph!r}")
            continue
        for field in need:
            if field not in e:
                problems.append(f"{where} ({ph}): no {field}")
        if any(f not in e for f in need):
            continue
        for field in ("ts", "dur"):
            if field in e and (not isinstance(e[field], NUMBER) or e[field] < 0):
                problems.append(f"{where} ({ph}): {field} {e[field]!r} is not a number >= 0")
        for field in ("pid", "tid"):
            if field in e and not isinstance(e[field], int):
                problems.append(f"{where} ({ph}): {field} {e[field]!r} is not an integer")
        if ph == "M":
            if e["name"] in ("process_name", "thread_name") and not isinstance(e["args"].get("name"), str):
                problems.append(f"{where}: {e['name']} without args.name")
            if e["name"] == "process_name":
                named_processes.add(e["pid"])
            if e["name"] == "thread_name":
                if "tid" not in e:
                    problems.append(f"{where}: thread_name without tid")
                named_threads.add((e["pid"], e.get("tid")))
            continue
        used_threads.add((e["pid"], e["tid"]))
        if ph == "i" and e["s"] not in ("g", "p", "t"):
            problems.append(f"{where}: instant scope {e['s']!r}")
        if ph in ("s", "f"):
            flows[e["id"]].append(e)
        if ph == "f" and e.get("bp") not in (None, "e"):
            problems.append(f"{where}: flow end bp {e.get('bp')!r}")
    if problems:
        return problems, {}

    for pid, tid in sorted(used_threads):
        if pid not in named_processes:
            problems.append(f"pid {pid} has events but no process_name")
        if (pid, tid) not in named_threads:
            problems.append(f"pid {pid} tid {tid} has events but no thread_name")

    # Slices nest per thread: X by interval, B/E as a stack in ts order.
    by_thread = _slices_by_thread(events)
    for (pid, tid), spans in by_thread.items():
        stack = []
        for start, end, e in spans:
            while stack and stack[-1] <= start:
                stack.pop()
            if stack and end > stack[-1] + 1e-6:
                problems.append(f"pid {pid} tid {tid}: slice {e['name']} at {start} ends at {end}, "
                                f"after its enclosing slice ({stack[-1]})")
                break
            stack.append(end)
    open_b = collections.defaultdict(list)
    for e in sorted((e for e in events if e["ph"] in ("B", "E")), key=lambda e: e["ts"]):
        key = (e["pid"], e["tid"])
        if e["ph"] == "B":
            open_b[key].append(e)
        elif not open_b[key]:
            problems.append(f"pid {key[0]} tid {key[1]}: E at {e['ts']} without an open B")
        else:
            open_b[key].pop()
    for key, still in open_b.items():
        if still:
            problems.append(f"pid {key[0]} tid {key[1]}: {len(still)} B without E")

    # Flows: one start and one end per id, same cat and name, each inside a
    # slice of its own thread.
    def inside(e):
        spans = by_thread.get((e["pid"], e["tid"]), [])
        return any(start <= e["ts"] <= end for start, end, _ in spans)

    for fid, pair in flows.items():
        phases = sorted(x["ph"] for x in pair)
        if phases != ["f", "s"]:
            problems.append(f"flow {fid}: phases {phases}, want one s and one f")
            continue
        if len({(x["cat"], x["name"]) for x in pair}) != 1:
            problems.append(f"flow {fid}: s and f differ in cat or name")
        for x in pair:
            if not inside(x):
                problems.append(f"flow {fid}: {x['ph']} at {x['ts']} is inside no slice of "
                                f"pid {x['pid']} tid {x['tid']}")
        if len(problems) > 20:
            break

    summary = {
        "events": len(events),
        "slices": collections.Counter(e["pid"] for e in events if e["ph"] == "X"),
        "flows": len(flows),
        "instants": [e for e in events if e["ph"] in ("i", "I")],
        "processes": {e["pid"]: e["args"]["name"] for e in events
                      if e["ph"] == "M" and e["name"] == "process_name"},
    }
    return problems, summary


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        doc = json.load(f)
    problems, summary = check(doc)
    if problems:
        for p in problems[:20]:
            print("check_trace_events:", p, file=sys.stderr)
        return 1
    print(f"check_trace_events: {summary['events']} events, slices per pid "
          f"{dict(summary['slices'])}, {summary['flows']} flows, {len(summary['instants'])} instants: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
