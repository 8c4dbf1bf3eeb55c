"""The e2e GPT on a device, for scripts/gpu-check.sh: real opguardd, real CLI,
train_gpt.py on two ranks over gloo (CUDA tensors on one GPU), checked the
way tests/e2e/test_faults.py checks the CPU runs, then step times with and
without OpGuard.

    OPGUARDD=... OPGUARD_CLI=... OPGUARD_PYTHON_STAGE=... OPGUARD_TEST_PYTHON=python3 \\
        python3 gpu_e2e.py --device cuda --out results.json

Checks (each a row of the results; exit 1 if one fails):
  clean rerun        `opguard diff` of two identical runs: identical
  planted bit flip   flipped gradient bit on rank 1 at step 1: pivot named at
                     rank 1, step 1, c10d::all_reduce [enter], its line
  step time ratios   median step time under OPGUARD=1 and with OPGUARD unset
                     but the libraries loaded (opguard.enable() refuses), each
                     over plain training, for the e2e model and a wider one
                     (targets: a miss is reported, it does not fail the run)
When the adapter records ops on device tensors as gaps (a build without
device fingerprints), the diffs say `incomplete`: the checks then report
"not built" instead of failing. Runs here with --device cpu as well (the
same logic, CPU tensors).
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile

import harness

TRAIN = harness.TRAIN
ALL_REDUCE_LINE = "dist.all_reduce(p.grad)"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--timing-steps", type=int, default=20)
    parser.add_argument("--wide", type=int, default=512, help="d_model of the wider model")
    parser.add_argument("--skip-timing", action="store_true")
    parser.add_argument("--out", required=True, help="results as JSON rows")
    args = parser.parse_args()
    rows = []
    tmp = tempfile.mkdtemp(prefix="opguard-gpu-e2e-")
    daemon = None
    try:
        site = harness.UserSite(os.path.join(tmp, "site"))
        daemon = harness.Daemon(tmp)
        dev = ["--device", args.device]
        common = dict(ranks=args.ranks, steps=args.steps, args=dev, timeout=240)
        harness.train(site, daemon, "ref", **common)
        harness.train(site, daemon, "ref-again", **common)
        rerun = daemon.cli_json("diff", "ref", "ref-again")
        device_gaps = rerun["status"] == "incomplete"
        rows.append(check_rerun(rerun, device_gaps))
        if not device_gaps:
            harness.train(site, daemon, "bitflip", fault="bitflip:1:1", **common)
            rows.append(check_bitflip(daemon.cli_json("diff", "ref", "bitflip")))
        else:
            rows.append(row("planted bit flip named", "rank 1 · step 1 · all_reduce · its line",
                            "not built (ops on device tensors are gaps)", None))
        if not args.skip_timing:
            loaded = loaded_site(os.path.join(tmp, "loaded"))
            for width in (32, args.wide):
                rows.extend(step_time_ratios(site, loaded, daemon, args, width, tmp))
    finally:
        if daemon is not None:
            daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(rows, f, indent=1)
    for r in rows:
        verdict = {True: "ok  ", None: "n/a "}.get(r["ok"], "FAIL" if r["kind"] == "correctness" else "miss")
        print(f"{verdict} {r['check']}: {r['measured']} (target {r['target']})")
    return 1 if any(r["ok"] is False and r["kind"] == "correctness" for r in rows) else 0


def row(check, target, measured, ok, kind="correctness"):
    """ok: True, False, or None (could not be checked: not built, skipped).
    kind "target": a speed target; missing it is a finding, not a failure."""
    return {"check": check, "target": target, "measured": measured, "ok": ok, "kind": kind}


def check_rerun(report, device_gaps):
    target = "identical"
    if device_gaps:
        missing = sum(len(r["missing"]) for r in report["ranks"])
        return row("clean rerun", target,
                   f"not built: incomplete, {missing} missing range(s) (ops on device tensors are gaps)",
                   None)
    return row("clean rerun", target, report["status"], report["status"] == "identical")


def check_bitflip(report):
    target = "rank 1 · step 1 · c10d::all_reduce [enter] · train_gpt.py:" + str(
        harness.line_of(TRAIN, ALL_REDUCE_LINE))
    first = report.get("first_divergence")
    if report["status"] != "diverged" or first is None:
        return row("planted bit flip named", target, report["status"], False)
    site = first["site"]["suspect"]
    measured = (f"rank {first['rank']} · step {first['step']} · {first['op']} · "
                f"{os.path.basename(site['file'])}:{site['line']}")
    return row("planted bit flip named", target, measured, measured == target)


def loaded_site(root):
    """A user site whose interpreters load OpGuard's libraries at start-up and
    call opguard.enable(), which refuses without OPGUARD=1: the cost of the
    libraries being there, not recording."""
    site = harness.UserSite(root)
    with open(os.path.join(site.site, "opguard-loaded.pth"), "w") as f:
        f.write("import opguard; opguard.enable()\n")
    return site


def median_step(path):
    with open(path) as f:
        wall = json.load(f)["wall"]
    return statistics.median(wall[2:] if len(wall) > 4 else wall)  # the first steps warm up


def step_time_ratios(site, loaded, daemon, args, width, tmp):
    def timed(name, which_site, opguard):
        times = os.path.join(tmp, f"times-{name}-{width}.json")
        extra = {} if opguard else {"OPGUARD": 0}
        harness.train(which_site, daemon, f"time-{name}-{width}", ranks=args.ranks,
                      steps=args.timing_steps, extra_env=extra, timeout=300,
                      args=["--device", args.device, "--d-model", str(width), "--times", times])
        return median_step(times)

    plain = timed("plain", site, False)
    full = timed("full", site, True)
    libs = timed("loaded", loaded, False)
    model = f"d_model {width}"
    return [
        row(f"step time, OPGUARD=1 / off ({model})", "≤ 1.3×",
            f"{full / plain:.2f}× ({full * 1e3:.1f} ms / {plain * 1e3:.1f} ms)", full / plain <= 1.3,
            "target"),
        row(f"step time, libraries loaded, OPGUARD unset / off ({model})", "≤ 1.01×",
            f"{libs / plain:.3f}× ({libs * 1e3:.1f} ms / {plain * 1e3:.1f} ms)", libs / plain <= 1.01,
            "target"),
    ]


if __name__ == "__main__":
    sys.exit(main())
