"""Training-step wall time of the end-to-end model (tests/e2e/train_gpt.py,
gloo ranks on the CPU: 4 as the e2e tests train it, or --ranks) three ways,
measured in one run and interleaved so that machine noise hits all three alike:
  plain      no OpGuard
  opguard    OPGUARD=1, recording into a real opguardd (--local, temp dir)
  trusted    the same in trusted mode (OPGUARD_TRUSTED=default: GEMMs,
             elementwise ops and views recorded without fingerprints)
  sdc        the same in online SDC mode (OPGUARD_SDC=1: no op observed,
             each parameter fingerprinted after the optimizer's step; a torch
             older than 2.0 records in full mode instead)
  dispatch   a Python TorchDispatchMode hashing every op output (the approach
             of PyTorch's DebugMode), no OpGuard
  baseline   (with --baseline-stage DIR) OPGUARD=1 with the opguard package
             staged in DIR: another build of OpGuard, interleaved with this
             one, so that a change is measured under the same noise
  in_process OPGUARD=1 with every other step (in a seeded order) inside
             opguard.paused(): recorded against unrecorded steps of the same
             process, which the machine's drift between processes cannot skew
             (the daemon and the shim's sender may still be busy with the
             previous step's records during a paused one)
  baseline_in_process  (with --baseline-stage) the same with the baseline's
             package: the two in-process ratios compare two builds without
             the drift between processes, which moves the plain step by more
             than a small change does (docs/torch.md, the A/A run)
Prints Google-Benchmark-shaped JSON (scripts/bench.sh renders the table):
median step time per mode and the ratios to plain (of the medians over all
rounds, and per round to the plain run just before it); beside them the median
CPU time per step of rank 0's process (all its threads: the shim's sender,
gloo's workers), of its training thread alone, and, for opguard, the
daemon's CPU time per training step. On a shared machine wall time is noisy;
the CPU figures show the work added, and where: a wall ratio above the
training thread's CPU ratio is time the thread spent waiting for a core.

usage: step_overhead.py BUILD_DIR [--steps N] [--rounds R] [--ranks K] [--d-model D]
                        [--baseline-stage DIR]
(--d-model: the model's width, 32 by default as in the tests; wider models
have larger ops, over which OpGuard's per-op cost is spread.)
OPGUARD_TEST_PYTHON and OPGUARD_PYTHON_STAGE choose another interpreter and
package, as for the e2e tests (scripts/torch2-check.sh BUILD -- this bench:
a torch 2.x).
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(ROOT, "tests", "e2e", "train_gpt.py")
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
import harness  # noqa: E402  (the package installed as the e2e tests install it)


def process_cpu_s(pid):
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=32)
    parser.add_argument("--baseline-stage", help="a staged opguard package to record with too")
    args = parser.parse_args()

    tmp = tempfile.mkdtemp(prefix="opguard-overhead-")
    daemon = None
    try:
        # A user site for Debian's Python, a venv over a pip torch's venv
        # (which reads no user site) otherwise.
        os.environ.setdefault("OPGUARD_PYTHON_STAGE", os.path.join(args.build, "python"))
        site = harness.UserSite(tmp)
        baseline_site = None
        if args.baseline_stage:
            stage = os.environ["OPGUARD_PYTHON_STAGE"]
            os.environ["OPGUARD_PYTHON_STAGE"] = args.baseline_stage
            baseline_site = harness.UserSite(os.path.join(tmp, "baseline"))
            os.environ["OPGUARD_PYTHON_STAGE"] = stage
        daemon = subprocess.Popen([os.path.join(args.build, "daemon", "opguardd"), "--local",
                                   os.path.join(tmp, "d"), "--http", "off"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        query = f"ipc://{tmp}/d/query.sock"
        cli = os.path.join(args.build, "cli", "opguard")
        for _ in range(300):
            if subprocess.run([cli, "status", "--daemon", query],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.1)

        base_env = site.env()
        modes = {
            "plain": ({}, []),
            "opguard": ({"OPGUARD": "1", "OPGUARD_ENDPOINT": f"ipc://{tmp}/d/ingest.sock"}, []),
            "trusted": ({"OPGUARD": "1", "OPGUARD_ENDPOINT": f"ipc://{tmp}/d/ingest.sock",
                         "OPGUARD_TRUSTED": "default"}, []),
            "sdc": ({"OPGUARD": "1", "OPGUARD_ENDPOINT": f"ipc://{tmp}/d/ingest.sock",
                     "OPGUARD_SDC": "1"}, []),
            "dispatch": ({}, ["--hash-every-output"]),
            **({"baseline": ({"OPGUARD": "1", "OPGUARD_ENDPOINT": f"ipc://{tmp}/d/ingest.sock"}, [])}
               if baseline_site else {}),
            # One process, every other step inside opguard.paused(): recorded
            # and unrecorded steps under the same conditions.
            "in_process": ({"OPGUARD": "1", "OPGUARD_ENDPOINT": f"ipc://{tmp}/d/ingest.sock"},
                           ["--alternate-paused"]),
            **({"baseline_in_process": ({"OPGUARD": "1",
                                         "OPGUARD_ENDPOINT": f"ipc://{tmp}/d/ingest.sock"},
                                        ["--alternate-paused"])}
               if baseline_site else {}),
        }
        in_process = ("in_process", "baseline_in_process")
        recorded_steps = {mode: [] for mode in in_process}
        paused_steps = {mode: [] for mode in in_process}
        samples = {mode: [] for mode in modes}
        round_medians = {mode: [] for mode in modes}  # per round: paired ratios
        cpu = {mode: [] for mode in modes}
        thread_cpu = {mode: [] for mode in modes}
        daemon_cpu_s, opguard_steps = 0.0, 0
        for round_ in range(args.rounds):
            for mode, (extra_env, extra_args) in modes.items():
                times = os.path.join(tmp, f"{mode}-{round_}.json")
                env = dict(base_env, **extra_env)
                if mode in ("opguard", "trusted", "sdc", "in_process", "baseline"):
                    env["OPGUARD_RUN"] = f"{mode}-{round_}"
                python = site.python
                if mode in ("baseline", "baseline_in_process"):
                    env = dict(baseline_site.env(), **extra_env, OPGUARD_RUN=f"{mode}-{round_}")
                    python = baseline_site.python
                before = process_cpu_s(daemon.pid)
                command = [python, TRAIN, "--spawn", str(args.ranks), "--steps", str(args.steps),
                           "--times", times, "--d-model", str(args.d_model), *extra_args]
                subprocess.run(command, env=env, check=True, capture_output=True, timeout=900)
                if mode == "opguard":
                    daemon_cpu_s += process_cpu_s(daemon.pid) - before
                    opguard_steps += args.steps
                with open(times) as f:
                    recorded = json.load(f)
                if mode in in_process:
                    for wall, paused in list(zip(recorded["wall"], recorded["paused"]))[4:]:
                        (paused_steps if paused else recorded_steps)[mode].append(wall)
                    continue
                samples[mode].extend(recorded["wall"][2:])  # first steps warm up
                round_medians[mode].append(statistics.median(recorded["wall"][2:]))
                cpu[mode].extend(recorded["cpu"][2:])
                thread_cpu[mode].extend(recorded["thread_cpu"][2:])
        # A package the Python does not load records nothing and would time
        # plain steps as recorded ones.
        runs = json.loads(subprocess.run([cli, "runs", "--json", "--daemon", query],
                                         capture_output=True, text=True, check=True).stdout)
        if not any(r["name"] == "opguard-0" and r["ops"] > 0 for r in runs["runs"]):
            sys.exit("step_overhead: the OPGUARD=1 runs recorded nothing (is the opguard "
                     "package active in this Python?)")
        if not any(r["name"] == "sdc-0" and r["ops"] > 0 for r in runs["runs"]):
            sys.exit("step_overhead: the OPGUARD_SDC=1 runs recorded nothing")
        separate = ("plain", "opguard", "trusted", "sdc", "dispatch",
                    *(("baseline",) if baseline_site else ()))
        medians = {mode: statistics.median(samples[mode]) for mode in separate}
        cpu_medians = {mode: statistics.median(cpu[mode]) for mode in separate}
        thread_medians = {mode: statistics.median(thread_cpu[mode]) for mode in separate}
        benchmarks = []
        for mode, median in medians.items():
            entry = {"name": f"train_step/{mode}", "run_type": "iteration",
                     "iterations": len(samples[mode]), "real_time": median * 1e3,
                     "cpu_time": median * 1e3, "time_unit": "ms"}
            entry["cpu_ms_per_step"] = cpu_medians[mode] * 1e3
            entry["thread_cpu_ms_per_step"] = thread_medians[mode] * 1e3
            if mode != "plain":
                entry["ratio_to_plain"] = median / medians["plain"]
                entry["cpu_ratio_to_plain"] = cpu_medians[mode] / cpu_medians["plain"]
                entry["thread_cpu_ratio_to_plain"] = thread_medians[mode] / thread_medians["plain"]
                # Each round's ratio to the plain run just before it: their
                # spread shows how much the machine moved between processes.
                entry["round_ratios"] = [round(m / p, 3) for m, p in
                                         zip(round_medians[mode], round_medians["plain"])]
            if mode == "opguard":
                entry["daemon_cpu_ms_per_step"] = daemon_cpu_s * 1e3 / max(1, opguard_steps)
            benchmarks.append(entry)
        for mode in (m for m in in_process if recorded_steps[m]):
            recorded_median = statistics.median(recorded_steps[mode])
            paused_median = statistics.median(paused_steps[mode])
            benchmarks.append({"name": f"train_step/{mode}_recorded_vs_paused",
                               "run_type": "iteration", "iterations": len(recorded_steps[mode]),
                               "real_time": recorded_median * 1e3,
                               "cpu_time": recorded_median * 1e3, "time_unit": "ms",
                               "paused_ms": paused_median * 1e3,
                               "ratio_to_paused": recorded_median / paused_median})
        print(json.dumps({"context": {"steps": args.steps, "rounds": args.rounds,
                                      "ranks": args.ranks, "d_model": args.d_model},
                          "benchmarks": benchmarks}, indent=1))
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
