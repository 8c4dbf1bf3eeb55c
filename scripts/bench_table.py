"""Prints one table from Google Benchmark JSON files (see scripts/bench.sh).

Each row: benchmark, real time per iteration, throughput (GB/s from
bytes_per_second, M/s from items_per_second) and any user counters.
"""
import json
import sys

SKIP = {"name", "run_name", "run_type", "repetitions", "repetition_index", "threads",
        "iterations", "real_time", "cpu_time", "time_unit", "family_index",
        "per_family_instance_index", "aggregate_name", "aggregate_unit",
        "bytes_per_second", "items_per_second", "label", "error_occurred", "error_message"}


def fmt_time(value, unit):
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]
    seconds = value * scale
    for name, factor in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if seconds >= factor:
            return f"{seconds / factor:.3g} {name}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_number(value):
    if isinstance(value, float) and (abs(value) >= 1e6 or (abs(value) < 1e-2 and value)):
        return f"{value:.3e}"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def main(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for b in data.get("benchmarks", []):
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            if b.get("error_occurred"):
                rows.append((b["name"], "error", b.get("error_message", ""), ""))
                continue
            throughput = []
            if "bytes_per_second" in b:
                throughput.append(f"{b['bytes_per_second'] / 1e9:.2f} GB/s")
            if "items_per_second" in b:
                throughput.append(f"{b['items_per_second'] / 1e6:.2f} M/s")
            counters = [f"{k}={fmt_number(v)}" for k, v in b.items() if k not in SKIP]
            time = fmt_time(b["real_time"], b.get("time_unit", "ns")) if "real_time" in b else ""
            rows.append((b["name"], time, " ".join(throughput), " ".join(counters)))
    header = ("benchmark", "time/iter", "throughput", "counters")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(3)]
    line = f"{{:<{widths[0]}}}  {{:>{widths[1]}}}  {{:>{widths[2]}}}  {{}}"
    print(line.format(*header))
    print(line.format(*("-" * w for w in widths), "-" * 8))
    for row in rows:
        print(line.format(*row))


if __name__ == "__main__":
    main(sys.argv[1:])
