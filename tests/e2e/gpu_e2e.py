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
  planted stream race
                     (cuda) rank 1 writes a weight on a side stream without
                     synchronisation before step 1's forward: the run
                     diverges from the clean one at rank 1, step 1 or 2
  one rank on NCCL   (cuda: torch's NCCL backend, a real communicator; cpu:
                     gloo, the same checks) a clean rerun is identical, and
                     every collective is recorded and completed: steps × (one
                     broadcast + one all_reduce per parameter), each rank's
                     last Entered = last Completed, no mismatch; the same
                     under DDP (its reducer's buckets)
  kernel names       the rerun above with OPGUARD_KERNELS=1: ops carry the
                     names of the kernels they launched (cuda; n/a without a
                     CUDA driver)
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
import subprocess
import sys
import tempfile
import time
import urllib.request

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
    parser.add_argument("--budget-s", type=float, default=0,
                        help="seconds this may take (0: no limit); the step-time ratios are "
                             "skipped when less than --timing-need-s is left for them")
    parser.add_argument("--timing-need-s", type=float, default=150)
    parser.add_argument("--out", required=True, help="results as JSON rows")
    args = parser.parse_args()
    started = time.monotonic()
    rows = Rows(args.out)
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
        if args.device == "cuda" and not device_gaps:
            harness.train(site, daemon, "race", fault="race:1:1", **common)
            rows.append(check_race(daemon.cli_json("diff", "ref", "race")))
        rows.extend(one_rank_collectives(site, daemon, args))
        rows.append(check_sdc_mode(site, daemon, args))
        left = args.budget_s - (time.monotonic() - started) if args.budget_s else float("inf")
        if not args.skip_timing and left < args.timing_need_s:
            rows.append(row("step time ratios", "≤ 1.3× and ≤ 1.01×",
                            f"skipped: {left:.0f} s of the budget left", None, "target"))
        elif not args.skip_timing:
            loaded = loaded_site(os.path.join(tmp, "loaded"))
            for width in (32, args.wide):
                rows.extend(step_time_ratios(site, loaded, daemon, args, width, tmp))
    finally:
        if daemon is not None:
            daemon.close()
        shutil.rmtree(tmp, ignore_errors=True)
    for r in rows:
        verdict = {True: "ok  ", None: "n/a "}.get(r["ok"], "FAIL" if r["kind"] == "correctness" else "miss")
        print(f"{verdict} {r['check']}: {r['measured']} (target {r['target']})")
    return 1 if any(r["ok"] is False and r["kind"] == "correctness" for r in rows) else 0


class Rows(list):
    """The results, written to `path` after each one, so that a run cut
    short by its timeout still reports what it checked."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def append(self, r):
        super().append(r)
        with open(self.path, "w") as f:
            json.dump(self, f, indent=1)

    def extend(self, rs):
        for r in rs:
            self.append(r)


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


def check_race(report):
    target = "diverged at rank 1, step 1 or 2"
    first = report.get("first_divergence")
    if first is None:
        return row("planted stream race found", target, report["status"], False)
    measured = f"{report['status']} at rank {first['rank']}, step {first['step']}, {first['op']}"
    return row("planted stream race found", target, measured,
               report["status"] == "diverged" and first["rank"] == 1 and first["step"] in (1, 2))


def check_sdc_mode(site, daemon, args):
    """Online SDC mode (OPGUARD_SDC=1) on 3 ranks: rank 2's copy of a reduced
    gradient corrupted after the all-reduce at step 1 is named by the replica
    check at step 1, on the output layer's weight (the last parameter)."""
    target = "rank 2 · step 1 · replica_state of the last parameter"
    harness.train(site, daemon, "sdc-mode", ranks=3, steps=args.steps, fault="sdc:2:1",
                  args=["--device", args.device], extra_env={"OPGUARD_SDC": "1"}, timeout=240)
    report = daemon.cli_json("ranks", "sdc-mode", "--replicas", "0,1,2")
    groups = report.get("replicas") or [{}]
    first = groups[0].get("first_divergence") or {}
    measured = (f"{groups[0].get('status')} · odd {groups[0].get('odd_ranks')} · rank "
                f"{first.get('rank')} · step {first.get('step')} · {first.get('op')}")
    ok = (groups[0].get("odd_ranks") == [2] and (first.get("rank"), first.get("step")) == (2, 1)
          and first.get("op") == f"opguard::replica_state[SGD:0.{parameters_of_the_model(site) - 1}]")
    return row("online SDC mode names the corrupted replica", target, measured, ok)


def parameters_of_the_model(site):
    """The trained model's parameter count, from the interpreter that trains
    (this one may have no torch)."""
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(TRAIN)!r}); import train_gpt; "
            "print(len(list(train_gpt.TinyGPT().parameters())))")
    out = subprocess.run([site.python, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    return int(out.stdout.split()[-1])


def one_rank_collectives(site, daemon, args):
    """One rank on NCCL (cuda) or gloo (cpu): rerun identical, every
    collective recorded and completed, also under DDP; kernel names."""
    backend = "nccl" if args.device == "cuda" else "gloo"
    train_args = ["--device", args.device, "--backend", backend]
    common = dict(ranks=1, steps=args.steps, timeout=240)
    harness.train(site, daemon, f"{backend}-1", args=train_args, **common)
    harness.train(site, daemon, f"{backend}-1-kernels", args=train_args,
                  extra_env={"OPGUARD_KERNELS": 1}, **common)
    harness.train(site, daemon, f"{backend}-1-ddp", args=train_args + ["--ddp"], **common)
    rows = []
    rerun = daemon.cli_json("diff", f"{backend}-1", f"{backend}-1-kernels")
    rows.append(row(f"one rank on {backend}: clean rerun", "identical", rerun["status"],
                    rerun["status"] == "identical"))
    expected = args.steps * (1 + parameters_of_the_model(site))
    rows.append(all_completed(daemon, f"{backend}-1", f"one rank on {backend}: every collective "
                              "recorded and completed", expected))
    rows.append(all_completed(daemon, f"{backend}-1-ddp", f"one rank on {backend} under DDP: "
                              "every collective recorded and completed", None))
    rows.append(kernel_names(daemon, f"{backend}-1-kernels", args.device))
    return rows


def all_completed(daemon, run, check, expected):
    """`expected` collectives (None: at least one per step) on the one
    communicator, each Entered and Completed, no desync or mismatch."""
    report = daemon.cli_json("collectives", run)
    live = [(c["name"], r["rank"], r["last_entered"], r["last_completed"])
            for c in report["live"] for r in c["ranks"]]
    count = sum(r[2] + 1 for r in live)
    target = f"{expected if expected is not None else '≥ steps'} entered = completed, consistent"
    measured = (f"{report['status']}, {len(report['desyncs'])} desync(s), "
                f"{len(report['mismatches'])} mismatch(es), (communicator, rank, last entered, "
                f"last completed): {live}")
    ok = (report["status"] == "identical" and not report["desyncs"] and not report["mismatches"]
          and len(live) > 0 and all(r[2] == r[3] for r in live)
          and (count == expected if expected is not None else count >= 1))
    return row(check, target, measured, ok)


def kernel_names(daemon, run, device):
    """Ops of rank 0's lane 0 that carry kernel names."""
    url = (f"http://{daemon.status['http']}/api/runs/{run}/ranks/0/trace"
           f"?lane=0&from=0&max=10000")
    with urllib.request.urlopen(url, timeout=30) as answer:
        ops = json.load(answer)["ops"]
    named = [op for op in ops if op.get("kernels")]
    measured = f"{len(named)} of {len(ops)} ops carry kernel names"
    if named:
        example = named[0]
        measured += f" (e.g. {example['name']}: {', '.join(example['kernels'][:2])[:160]})"
    if device != "cuda":
        return row("kernel names recorded (OPGUARD_KERNELS=1)", "ops on the GPU carry kernels",
                   measured + "; n/a on the CPU", None)
    return row("kernel names recorded (OPGUARD_KERNELS=1)", "ops on the GPU carry kernels",
               measured, len(named) > 0)


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
        extra = opguard if isinstance(opguard, dict) else {} if opguard else {"OPGUARD": 0}
        harness.train(which_site, daemon, f"time-{name}-{width}", ranks=args.ranks,
                      steps=args.timing_steps, extra_env=extra, timeout=300,
                      args=["--device", args.device, "--d-model", str(width), "--times", times])
        return median_step(times)

    plain = timed("plain", site, False)
    full = timed("full", site, True)
    sdc = timed("sdc", site, {"OPGUARD_SDC": "1"})
    libs = timed("loaded", loaded, False)
    model = f"d_model {width}"
    return [
        row(f"step time, OPGUARD=1 / off ({model})", "≤ 1.3×",
            f"{full / plain:.2f}× ({full * 1e3:.1f} ms / {plain * 1e3:.1f} ms)", full / plain <= 1.3,
            "target"),
        row(f"step time, OPGUARD_SDC=1 / off ({model})", "≤ 1.02×",
            f"{sdc / plain:.3f}× ({sdc * 1e3:.1f} ms / {plain * 1e3:.1f} ms)", sdc / plain <= 1.02,
            "target"),
        row(f"step time, libraries loaded, OPGUARD unset / off ({model})", "≤ 1.01×",
            f"{libs / plain:.3f}× ({libs * 1e3:.1f} ms / {plain * 1e3:.1f} ms)", libs / plain <= 1.01,
            "target"),
    ]


if __name__ == "__main__":
    sys.exit(main())
