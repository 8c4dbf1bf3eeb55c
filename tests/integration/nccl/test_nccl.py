"""libopguard_nccl.so in a multi-process NCCL program without PyTorch, against
a real opguardd: ranks are processes of opguard-nccl-rank over the stand-in
libnccl.so.2 (host memory, real reductions), started with `opguard exec`
exactly as a user would start a job. What every rank recorded is checked
through `opguard collectives RUN --json`: one identity per communicator on all
of its members, sequence numbers, splits, point-to-point channels, and a
silent corruption of one rank's result named at that rank and collective.

Paths come from ctest's environment: OPGUARDD, OPGUARD_CLI,
OPGUARD_NCCL_RANK, OPGUARD_NCCL_LIBRARY.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "e2e"))
import harness  # noqa: E402  (Daemon: opguardd --local in a temp dir)


def rank_program():
    return os.environ["OPGUARD_NCCL_RANK"]


def preload_allowed(env):
    """In a sanitizer build (scripts/sanitize.sh exports ASAN_OPTIONS) the
    preloaded library needs the ASan runtime, which then is not first in the
    process's library list; ASan accepts that only when told so."""
    if "ASAN_OPTIONS" in env:
        env["ASAN_OPTIONS"] += ":verify_asan_link_order=0"
    return env


class NcclTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for name in ("OPGUARDD", "OPGUARD_CLI", "OPGUARD_NCCL_RANK", "OPGUARD_NCCL_LIBRARY"):
            if not os.environ.get(name):
                raise unittest.SkipTest(f"{name} is not set (run through ctest)")
        cls.tmp = tempfile.mkdtemp(prefix="opguard-nccl-it-")
        cls.daemon = harness.Daemon(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("OPGUARD") and k not in ("RANK", "WORLD_SIZE", "LD_PRELOAD")}
        env["OPGUARD_ENDPOINT"] = self.daemon.ingest
        env.update({k: str(v) for k, v in extra.items()})
        return preload_allowed(env)

    def launch(self, run, ranks, scenario, through_exec=True, iterations=10, **extra):
        """Runs `ranks` processes of the rank program; returns their outputs."""
        rendezvous = tempfile.mkdtemp(dir=self.tmp)
        procs = []
        for rank in range(ranks):
            argv = [rank_program(), "--rank", str(rank), "--nranks", str(ranks),
                    "--rendezvous", rendezvous, "--scenario", scenario,
                    "--iterations", str(iterations)]
            if through_exec:
                argv = [os.environ["OPGUARD_CLI"], "exec", "--run", run, "--", *argv]
            env = self.env(RANK=rank, WORLD_SIZE=ranks, **extra)
            procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outputs = []
        for rank, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            self.assertEqual(p.returncode, 0, f"rank {rank}: {out}{err}")
            self.assertIn(f"rank {rank} ok", out)
            outputs.append(err)
        return outputs

    def collectives(self, run):
        return self.daemon.cli_json("collectives", run)

    def test_every_member_computes_the_same_communicators_and_numbers(self):
        self.launch("all-calls", 4, "all")
        report = self.collectives("all-calls")
        self.assertEqual(report["status"], "identical", report)
        self.assertEqual(report["missing_ranks"], [])
        self.assertEqual(report["desyncs"], [])
        self.assertEqual(report["mismatches"], [])
        live = {tuple(sorted(r["rank"] for r in c["ranks"])): [] for c in report["live"]}
        for c in report["live"]:
            live[tuple(sorted(r["rank"] for r in c["ranks"]))].append(c)

        def last(comm):
            entered = {r["last_entered"] for r in comm["ranks"]}
            completed = {r["last_completed"] for r in comm["ranks"]}
            self.assertEqual(entered, completed, comm)
            self.assertEqual(len(entered), 1, comm)  # every member numbered alike
            return entered.pop()

        # The world: 9 single calls and 2 grouped ones, numbered 0..10 on
        # every rank, under one identity (the communicator is one entry).
        (world,) = live[(0, 1, 2, 3)]
        self.assertEqual(last(world), 10)
        self.assertEqual(world["name"], "nccl-" + world["communicator"])
        # Splits: by parity, then all but rank 0; one all-reduce each.
        for members in ((0, 2), (1, 3)):
            splits = [c for c in live[members] if "/split0." in c["name"]]
            self.assertEqual(len(splits), 1, live[members])
            self.assertEqual(last(splits[0]), 0)
            self.assertEqual(splits[0]["name"], f"{world['name']}/split0.{members[0] % 2}")
        (rest,) = live[(1, 2, 3)]
        self.assertEqual(rest["name"], world["name"] + "/split1.0")
        self.assertEqual(last(rest), 0)
        # A shrink without the last rank: the remaining ranks agree on it.
        (shrunk,) = live[(0, 1, 2)]
        self.assertEqual(shrunk["name"], world["name"] + "/shrink0")
        self.assertEqual(last(shrunk), 0)
        # The ring of sends and receives: one channel per directed pair, on
        # which the send and the receive it matched share number 0.
        channels = [c for c in report["live"] if " p2p " in c["name"]]
        self.assertEqual(sorted(c["name"].split(" p2p ")[1] for c in channels),
                         ["0->1", "1->2", "2->3", "3->0"])
        for c in channels:
            src, dst = map(int, c["name"].split(" p2p ")[1].split("->"))
            self.assertEqual(sorted(r["rank"] for r in c["ranks"]), sorted((src, dst)))
            self.assertEqual(last(c), 0)
        self.assertEqual(report["collectives"], 11 + 2 + 1 + 1 + 4)

    def test_a_corrupted_result_on_one_rank_is_named_with_its_collective(self):
        # The stand-in flips the lowest bit of element 17 of rank 2's copy of
        # the result of its all-reduce number 3, as a silent data corruption
        # on that rank's device would.
        self.launch("sdc", 3, "steps", iterations=6, STAND_IN_NCCL_CORRUPT="2:3:17")
        result = self.daemon.cli("collectives", "sdc", "--json", check=False)
        self.assertEqual(result.returncode, 1, result.stderr)
        report = json.loads(result.stdout)
        self.assertEqual(report["status"], "diverged")
        self.assertEqual(len(report["mismatches"]), 1, report["mismatches"])
        mismatch = report["mismatches"][0]
        self.assertEqual(mismatch["kind"], "all_reduce")
        self.assertEqual(mismatch["seq"], 3)
        self.assertEqual(mismatch["minority_ranks"], [2])
        self.assertEqual(sorted(map(sorted, mismatch["groups"])), [[0, 1], [2]])
        text = self.daemon.cli("collectives", "sdc", check=False).stdout
        self.assertIn("all_reduce", text)
        self.assertIn("seq 3 · rank(s) 2 disagree", text)
        # Each member's call site: the program and where in it NCCL was called.
        self.assertIn(os.path.realpath(rank_program()) + " in ", text)
        self.assertNotIn("unknown site", text)

    def test_a_clean_run_of_the_same_program_is_consistent(self):
        self.launch("clean", 3, "steps", iterations=6)
        report = self.collectives("clean")
        self.assertEqual(report["status"], "identical", report)
        self.assertEqual(report["collectives"], 6)

    def test_without_opguard_the_preloaded_library_only_forwards(self):
        library = os.environ["OPGUARD_NCCL_LIBRARY"]
        errors = self.launch("unused", 2, "all", through_exec=False, LD_PRELOAD=library,
                             OPGUARD_RUN="preloaded-off")
        self.assertEqual(errors, ["", ""])  # not even a log line
        runs = self.daemon.cli_json("runs")["runs"]
        self.assertNotIn("preloaded-off", [r["name"] for r in runs])


class ExecTest(unittest.TestCase):
    def setUp(self):
        if not os.environ.get("OPGUARD_CLI"):
            raise unittest.SkipTest("OPGUARD_CLI is not set (run through ctest)")

    def opguard(self, *args, env=None):
        return subprocess.run([os.environ["OPGUARD_CLI"], *args], capture_output=True, text=True,
                              timeout=60, env=preload_allowed(dict(env or os.environ)))

    def test_sets_the_environment_and_keeps_an_existing_preload(self):
        env = {k: v for k, v in os.environ.items() if not k.startswith("OPGUARD")}
        env["LD_PRELOAD"] = "libc.so.6"
        out = self.opguard("exec", "--run", "job-7", "--", "sh", "-c",
                           'echo "$OPGUARD|$OPGUARD_RUN|$LD_PRELOAD"', env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        opguard, run, preload = out.stdout.strip().split("|")
        self.assertEqual((opguard, run), ("1", "job-7"))
        first, rest = preload.split(":", 1)
        self.assertEqual(os.path.realpath(first), os.path.realpath(os.environ["OPGUARD_NCCL_LIBRARY"]))
        self.assertEqual(rest, "libc.so.6")

    def test_everything_from_the_command_on_is_the_commands(self):
        # Without "--" too: options after the command's first word are its own.
        out = self.opguard("exec", "sh", "-c", 'echo "$OPGUARD_RUN|$0|$1"', "--run", "--help")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "|--run|--help")

    def test_exit_codes(self):
        self.assertEqual(self.opguard("exec", "--", "sh", "-c", "exit 5").returncode, 5)
        missing = self.opguard("exec", "--", "/nonexistent/program")
        self.assertEqual(missing.returncode, 127)
        self.assertIn("/nonexistent/program", missing.stderr)
        bad = self.opguard("exec", "--run", "no spaces", "--", "true")
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--run", bad.stderr)
        self.assertEqual(self.opguard("exec").returncode, 2)
        help_text = self.opguard("exec", "--help")
        self.assertEqual(help_text.returncode, 0)
        self.assertIn("LD_PRELOAD", help_text.stdout)
        self.assertIn("Exit codes", help_text.stdout)
