"""The `opguard` command line for people, against a real opguardd with runs
recorded through the real shim by opguard-loadgen: the Perfetto export
(validated against the trace-event format, and loaded in Perfetto's
trace_processor where one is installed), exit codes, --help on every command,
shared options on either side of the command name, colour and the progress
line only on a terminal, errors that say what to do.

Paths come from ctest's environment: OPGUARDD, OPGUARD_CLI, OPGUARD_LOADGEN.
"""
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "e2e"))
import harness  # noqa: E402  (Daemon: opguardd --local in a temp dir)
import check_trace_events  # noqa: E402

TRACE = ["--ranks", "2", "--ops", "1500", "--collective-every", "100", "--seed", "7"]


def cli():
    return os.environ["OPGUARD_CLI"]


def run(args, env=None, timeout=120):
    return subprocess.run([cli(), *args], capture_output=True, text=True, timeout=timeout, env=env)


def in_terminal(args, env=None):
    """Runs the CLI under a pseudo-terminal (util-linux script): stdout and
    stderr are both the terminal, and both come back in the output."""
    command = " ".join("'" + a.replace("'", "'\\''") + "'" for a in [cli(), *args])
    result = subprocess.run(["script", "-qefc", command, "/dev/null"], capture_output=True,
                            text=True, timeout=120, env=env)
    return result.returncode, result.stdout


def unused_tcp_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class CliTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for name in ("OPGUARDD", "OPGUARD_CLI", "OPGUARD_LOADGEN"):
            if not os.environ.get(name):
                raise unittest.SkipTest(f"{name} is not set (run through ctest)")
        cls.tmp = tempfile.mkdtemp(prefix="opguard-cli-it-")
        cls.daemon = harness.Daemon(cls.tmp)
        cls.loadgen = {}
        for run_name, extra in (("ref", []), ("ref2", []), ("sus", ["--diverge-at", "1:700"]),
                                ("holes", ["--diverge-at", "0:1490", "--drop-batches", "3",
                                           "--drop-size", "50"])):
            out = subprocess.run([os.environ["OPGUARD_LOADGEN"], "--run", run_name, *TRACE, *extra,
                                  "--endpoint", cls.daemon.ingest, "--json"],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            cls.loadgen[run_name] = json.loads(out.stdout[out.stdout.index("{"):])

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def q(self, *args):
        return run([*args, "--daemon", self.daemon.query])

    def ops_of(self, run_name):
        runs = json.loads(self.q("runs", "--json").stdout)["runs"]
        return sum(r["ops"] for x in runs if x["name"] == run_name for r in x["ranks"])

    # ---- Perfetto export -----------------------------------------------------

    def export(self, *args):
        path = os.path.join(self.tmp, "trace-" + "-".join(a.strip("-") for a in args) + ".json")
        result = self.q("export", *args, "--perfetto", path)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "")
        with open(path) as f:
            doc = json.load(f)
        problems, summary = check_trace_events.check(doc)
        self.assertEqual(problems, [], path)
        return path, doc, summary

    def test_export_against_a_reference_links_aligned_ops_and_marks_the_pivot(self):
        path, doc, summary = self.export("sus", "--vs", "ref")
        self.assertEqual(summary["processes"], {1: "ref · reference", 2: "sus · suspect"})
        self.assertEqual(summary["slices"][1], self.ops_of("ref"))
        self.assertEqual(summary["slices"][2], self.ops_of("sus"))
        # One flow per aligned pair; loadgen's divergence changes values, not
        # structure, so every op is aligned.
        self.assertEqual(summary["flows"], self.ops_of("sus"))
        diff = json.loads(self.q("diff", "ref", "sus", "--json").stdout)
        pivot = diff["first_divergence"]
        self.assertEqual(pivot["rank"], 1)
        instants = summary["instants"]
        self.assertEqual(len(instants), 2, instants)
        slices = {(e["pid"], e["tid"], e["args"]["op_index"]): e for e in doc["traceEvents"] if e["ph"] == "X"}
        for instant in instants:
            role = "reference" if instant["pid"] == 1 else "suspect"
            op_index = pivot["op_index"][role]
            self.assertEqual(instant["s"], "p")
            self.assertEqual(instant["args"]["op_index"], op_index)
            self.assertEqual(instant["args"]["rank"], 1)
            op = slices[(instant["pid"], instant["tid"], op_index)]
            self.assertEqual(op["ts"], instant["ts"])
            self.assertEqual(op["name"], pivot["op"])
            self.assertEqual(op["args"]["site"], f"{pivot['site'][role]['file']}:{pivot['site'][role]['line']}")
            self.assertEqual(op["args"]["step"], pivot["step"])
            self.assertRegex(op["args"]["outputs"][0]["fingerprint"], "^[0-9a-f]{32}$")
        self.assertEqual(doc["otherData"]["status"], "diverged")
        # loadgen's ops carry no measured durations: laid out by op index.
        self.assertEqual(doc["otherData"]["time"], "op_index")
        self.load_in_trace_processor(path, slices=self.ops_of("ref") + self.ops_of("sus"),
                                     flows=summary["flows"])

    def test_export_of_identical_runs_has_a_flow_per_aligned_op_and_no_pivot(self):
        _, doc, summary = self.export("ref2", "--vs", "ref", "--time", "wall")
        diff = json.loads(self.q("diff", "ref", "ref2", "--json").stdout)
        self.assertEqual(summary["flows"], diff["aligned"])
        self.assertEqual(summary["instants"], [])
        self.assertEqual(doc["otherData"]["time"], "wall")

    def test_export_of_one_run_and_one_rank(self):
        _, doc, summary = self.export("ref", "--rank", "0")
        self.assertEqual(summary["processes"], {1: "ref"})
        self.assertEqual(summary["slices"][1], self.loadgen["ref"]["per_rank"][0]["ops"])
        self.assertEqual(summary["flows"], 0)
        threads = [e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"]
        self.assertEqual(threads, ["rank 0 · lane 0"])

    def test_export_errors(self):
        result = self.q("export", "nope", "--perfetto", os.path.join(self.tmp, "x.json"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("no run named 'nope'", result.stderr)
        self.assertIn("opguard runs", result.stderr)
        result = self.q("export", "ref", "--perfetto", os.path.join(self.tmp, "no-such-dir", "x.json"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("cannot write", result.stderr)
        self.assertEqual(self.q("export", "ref").returncode, 2)  # --perfetto is required
        result = self.q("export", "ref", "--rank", "7", "--perfetto", os.path.join(self.tmp, "x.json"))
        self.assertEqual(result.returncode, 2)
        self.assertIn("has no rank 7", result.stderr)

    def load_in_trace_processor(self, path, slices, flows):
        """Perfetto's own importer, where installed (the perfetto Python
        package needs a trace_processor_shell binary it cannot download here:
        TRACE_PROCESSOR_SHELL names one)."""
        try:
            from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
        except ImportError:
            print("trace_processor: perfetto package not installed, skipped", file=sys.stderr)
            return
        shell = os.environ.get("TRACE_PROCESSOR_SHELL") or shutil.which("trace_processor_shell")
        if not shell:
            print("trace_processor: no trace_processor_shell, skipped", file=sys.stderr)
            return
        tp = TraceProcessor(trace=path, config=TraceProcessorConfig(bin_path=shell))
        try:
            self.assertEqual(next(tp.query("select count(*) as n from slice")).n, slices)
            self.assertEqual(next(tp.query("select count(*) as n from flow")).n, flows)
        finally:
            tp.close()

    # ---- exit codes ----------------------------------------------------------

    def test_exit_codes(self):
        self.assertEqual(self.q("diff", "ref", "ref2").returncode, 0)
        self.assertEqual(self.q("diff", "ref", "sus").returncode, 1)
        holes = self.q("diff", "ref", "holes", "--json")
        self.assertEqual(json.loads(holes.stdout)["status"], "incomplete")
        self.assertEqual(holes.returncode, 3)
        self.assertEqual(self.q("diff", "ref").returncode, 2)  # usage
        unknown = self.q("diff", "ref", "nope")
        self.assertEqual(unknown.returncode, 2, unknown.stderr)
        self.assertEqual(self.q("collectives", "ref").returncode, 0)
        self.assertEqual(self.q("ranks", "ref").returncode, 0)
        self.assertEqual(run(["runs", "--frobnicate"]).returncode, 2)
        self.assertEqual(run(["fingerprint", "--dtype", "float32", "--shape", "4", "/nonexistent"]).returncode, 2)
        help_text = run(["diff", "--help"]).stdout
        for text in ("0 identical", "1 diverged", "2 error", "3 incomplete"):
            self.assertIn(text, help_text)

    def test_unreachable_daemon_says_where_it_looked_and_what_to_do(self):
        endpoint = unused_tcp_endpoint()
        result = run(["runs", "--daemon", endpoint, "--timeout", "1"])
        self.assertEqual(result.returncode, 2)
        self.assertEqual(result.stdout, "")
        self.assertEqual(result.stderr.count("\n"), 1, result.stderr)
        self.assertIn(endpoint, result.stderr)
        self.assertIn("opguardd --local", result.stderr)
        self.assertIn("--daemon", result.stderr)

    # ---- runs ----------------------------------------------------------------

    def test_runs_show_their_owner(self):
        # loadgen sent over the unix ingest socket as this user: the daemon
        # read the uid from the kernel (SO_PEERCRED) and made it the owner.
        me = pwd.getpwuid(os.getuid()).pw_name
        runs = {r["name"]: r for r in json.loads(self.q("runs", "--json").stdout)["runs"]}
        self.assertEqual(runs["ref"]["owner_uid"], os.getuid())
        self.assertEqual(runs["ref"]["owner"], me)
        with urllib.request.urlopen(f"http://{self.daemon.status['http']}/api/runs", timeout=30) as r:
            self.assertEqual({x["owner_uid"] for x in json.load(r)["runs"]}, {os.getuid()})
        text = self.q("runs").stdout.splitlines()
        self.assertEqual(text[0].split()[:3], ["RUN", "OWNER", "RANKS"])
        row = next(line for line in text if line.startswith("ref "))
        self.assertEqual(row.split()[1], me)

    # ---- options and help ----------------------------------------------------

    def test_shared_options_before_and_after_the_command_name(self):
        d = self.daemon.query
        for args in (["--daemon", d, "runs"], ["runs", "--daemon", d], [f"--daemon={d}", "runs"]):
            result = run(args)
            self.assertEqual(result.returncode, 0, (args, result.stderr))
            self.assertIn("ref2", result.stdout)
            self.assertFalse(result.stdout.lstrip().startswith("{"), args)
        for args in (["--json", "runs", "--daemon", d], ["runs", "--json", "--daemon", d],
                     ["--json", "--daemon", d, "runs"]):
            result = run(args)
            self.assertEqual(result.returncode, 0, (args, result.stderr))
            self.assertIn("ref2", [r["name"] for r in json.loads(result.stdout)["runs"]], args)
        before = run(["--json", "--daemon", d, "diff", "ref", "sus"])
        self.assertEqual(before.returncode, 1)
        self.assertEqual(json.loads(before.stdout)["status"], "diverged")
        # $OPGUARD_DAEMON is the default; a --daemon on either side wins.
        env = dict(os.environ, OPGUARD_DAEMON=d)
        self.assertEqual(run(["runs"], env=env).returncode, 0)
        env["OPGUARD_DAEMON"] = unused_tcp_endpoint()
        self.assertEqual(run(["--daemon", d, "runs"], env=env).returncode, 0)

    def test_every_command_has_help_for_itself_and_each_option(self):
        top = run(["--help"])
        self.assertEqual(top.returncode, 0)
        commands = re.findall(r"^  ([a-z]+) +\S", top.stdout.split("Subcommands:")[1], re.M)
        self.assertIn("export", commands)
        self.assertIn("fingerprint", commands)
        for command in commands:
            result = run([command, "--help"])
            self.assertEqual(result.returncode, 0, command)
            text = result.stdout
            self.assertTrue(text.splitlines()[0].strip(), command)  # its description
            self.assertIn("Exit codes", text, command)
            options = text.split("Options:")[1].split("\n\n")[0] if "Options:" in text else ""
            for line in options.splitlines():
                if line.startswith("  -"):
                    # "  --name TYPE   help": the help column is not empty
                    self.assertRegex(line, r"^  \S.*\S {2,}\S", f"{command}: {line!r}")

    # ---- terminal ------------------------------------------------------------

    def test_colour_only_on_a_terminal_and_never_with_no_color(self):
        d = self.daemon.query
        piped = self.q("diff", "ref", "sus")
        self.assertNotIn("\x1b[", piped.stdout)
        env = dict(os.environ)
        env.pop("NO_COLOR", None)
        env["TERM"] = "xterm"
        rc, out = in_terminal(["diff", "ref", "sus", "--daemon", d], env=env)
        self.assertEqual(rc, 1, out)
        self.assertIn("\x1b[1;31mdiverged\x1b[0m", out)
        env["NO_COLOR"] = "1"
        rc, out = in_terminal(["diff", "ref", "sus", "--daemon", d], env=env)
        self.assertEqual(rc, 1, out)
        self.assertNotIn("\x1b[", out)
        self.assertIn("diverged", out)

    def test_progress_line_on_a_terminal_for_a_slow_query_only(self):
        endpoint = unused_tcp_endpoint()  # nobody answers: the query waits its 2 s
        rc, out = in_terminal(["diff", "a", "b", "--daemon", endpoint, "--timeout", "2"])
        self.assertEqual(rc, 2, out)
        self.assertIn("opguard diff: aligning on " + endpoint, out)
        piped = run(["diff", "a", "b", "--daemon", endpoint, "--timeout", "2"])
        self.assertNotIn("aligning", piped.stderr)
        self.assertEqual(piped.stderr.count("\n"), 1, piped.stderr)
        # A fast answer shows no progress line even on a terminal.
        rc, out = in_terminal(["diff", "ref", "ref2", "--daemon", self.daemon.query])
        self.assertEqual(rc, 0, out)
        self.assertNotIn("aligning", out)

    def test_communicators_are_named_by_their_members(self):
        out = subprocess.run([os.environ["OPGUARD_LOADGEN"], "--run", "desync", *TRACE, "--desync", "1:5",
                              "--endpoint", self.daemon.ingest], capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        text = self.q("collectives", "desync")
        self.assertEqual(text.returncode, 1)
        self.assertIn("desync · communicator world seq 5", text.stdout)
        self.assertNotRegex(text.stdout, r"#[0-9a-f]{16}")
        j = json.loads(self.q("collectives", "desync", "--json").stdout)
        self.assertRegex(j["desyncs"][0]["communicator"], "^[0-9a-f]{16}$")  # the id stays in JSON
        # Divergence explained through a collective names it too.
        diff = self.q("diff", "ref", "sus")
        self.assertRegex(diff.stdout, r"rank 0 ← rank 1 via communicator world seq \d+")


if __name__ == "__main__":
    unittest.main()
