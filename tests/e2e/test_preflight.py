"""Preflight on real training: `opguard preflight -- COMMAND` runs a 2-rank
gloo job twice, stops each after a few steps, and must name the op planted in
the job's own code as bitwise nondeterministic, with its line; a diff with
the stored plan must then walk past that op to a bug planted later, which a
diff without the plan never reaches. A plan is refused for a run of another
configuration, in one line."""
import json
import os
import subprocess
import unittest

import harness

TRAIN = os.path.join(harness.HERE, "train_preflight.py")
STEPS = 2


class Preflight(harness.DaemonTestCase):
    def job_env(self, **extra):
        # No OPGUARD_ENDPOINT: `opguard preflight` asks the daemon for it.
        return self.site.env(OPGUARD_FLUSH_TIMEOUT_MS=20000, **extra)

    def train(self, run, *args):
        env = self.job_env(OPGUARD=1, OPGUARD_RUN=run, OPGUARD_ENDPOINT=self.daemon.ingest)
        result = subprocess.run([self.site.python, TRAIN, *args], env=env, capture_output=True, text=True,
                                timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-4000:])

    def cli(self, command, *args, env=None, timeout=600):
        # --daemon before the words a command's "--" leaves to the job.
        return subprocess.run([os.environ["OPGUARD_CLI"], command, "--daemon", self.daemon.query, *args],
                              capture_output=True, text=True, timeout=timeout, env=env)

    def test_planted_nondeterministic_op_then_a_planned_diff_finds_the_bug(self):
        noisy_line = harness.line_of(TRAIN, "the planted nondeterministic op")
        bug_line = harness.line_of(TRAIN, "the --bug line")
        # The job would train for many minutes: preflight stops it once
        # STEPS are recorded (a few more may run while it looks).
        result = self.cli("preflight", "--name", "pf", "--steps", str(STEPS), "--json", "--job-timeout", "300",
                          "--", self.site.python, TRAIN, "--spawn", "2", "--steps", "100000", env=self.job_env())
        self.assertEqual(result.returncode, 0, result.stderr + result.stdout)
        plan = json.loads(result.stdout)
        self.assertEqual(plan["kind"], "plan")
        self.assertEqual([r["name"] for r in plan["runs"]], ["pf-a", "pf-b"])
        self.assertEqual(plan["max_steps"], STEPS)
        self.assertEqual(plan["config"]["world_size"], 2)
        self.assertEqual(plan["config"]["determinism"].get("mode"), "on")
        self.assertTrue(plan["config"]["torch"])
        # Only the planted op computes other bits from the same inputs; what
        # reads its result (the logged .item()) is downstream, not marked.
        self.assertEqual([b["op"] for b in plan["boundaries"]], ["planted::shuffled_sum_"], plan["boundaries"])
        self.assertEqual(plan["boundaries"][0]["site"]["line"], noisy_line)
        self.assertEqual(plan["boundaries"][0]["pairs"], 2 * STEPS)  # each rank, each step
        self.assertEqual(plan["nondeterministic"], 2 * STEPS)
        self.assertGreater(plan["stable"], plan["nondeterministic"])
        first = plan["first_nondeterministic"]
        self.assertEqual(first["op"], "planted::shuffled_sum_")
        self.assertEqual(first["step"], 0)
        self.assertTrue(first["inputs_equal"])
        self.assertEqual(first["differing_outputs"], [0])
        for run in ("reference", "suspect"):
            self.assertEqual(os.path.basename(first["site"][run]["file"]), "train_preflight.py")
            self.assertEqual(first["site"][run]["line"], noisy_line)
        # Each run was stopped, far from its end.
        runs = {r["name"]: r for r in self.daemon.cli_json("runs")["runs"]}
        for name in ("pf-a", "pf-b"):
            steps = [rank["steps"] for rank in runs[name]["ranks"]]
            self.assertGreaterEqual(min(steps), STEPS + 1, runs[name])
            self.assertLess(max(steps), 2000, runs[name])

        # Listed and shown like other objects; the text names the line.
        listed = json.loads(self.cli("plans", "--json").stdout)
        self.assertEqual([p["name"] for p in listed], ["pf"])
        text = self.cli("plans", "pf").stdout
        self.assertIn(f"first nondeterministic op · rank", text)
        self.assertIn(f"train_preflight.py:{noisy_line}", text)

        self.train("bug", "--spawn", "2", "--steps", str(STEPS + 1), "--bug", "1")
        # Without the plan the diff stops at the nondeterministic op...
        plain = self.daemon.cli_json("diff", "pf-a", "bug")
        self.assertEqual(plain["status"], "diverged")
        self.assertEqual(plain["first_divergence"]["op"], "planted::shuffled_sum_")
        self.assertEqual(plain["first_divergence"]["site"]["suspect"]["line"], noisy_line)
        self.assertEqual(plain["first_divergence"]["step"], 0)
        # ...with it, the bug: rank 1, step 1, the scaling line.
        planned = self.daemon.cli_json("diff", "--plan", "pf", "pf-a", "bug")
        self.assertEqual(planned["status"], "diverged", json.dumps(planned)[:3000])
        self.assertEqual(planned["plan"], "pf")
        pivot = planned["first_divergence"]
        self.assertEqual((pivot["rank"], pivot["step"], pivot["op"]), (1, 1, "aten::mul"))
        self.assertEqual(pivot["site"]["suspect"]["line"], bug_line)
        self.assertFalse(pivot["inputs_equal"])  # the scale, a scalar input
        self.assertEqual(planned["diverging_ranks"], [1])
        self.assertGreater(planned["skipped_nondeterministic"], 0)
        self.assertTrue(any("plan 'pf'" in n for n in planned["notes"]), planned["notes"])

        # A run of another configuration (world size 1): refused, one line.
        self.train("solo", "--spawn", "1", "--steps", "1")
        refused = self.cli("diff", "--plan", "pf", "pf-a", "solo")
        self.assertEqual(refused.returncode, 2, refused.stdout + refused.stderr)
        self.assertEqual(len(refused.stderr.strip().splitlines()), 1, refused.stderr)
        self.assertIn("plan 'pf' was made for world size 2, run 'solo' has 1", refused.stderr)

        # The plan outlives its runs; removed, it is gone.
        self.assertEqual(self.cli("rm", "pf-b").returncode, 0)
        self.assertEqual(self.daemon.cli_json("diff", "--plan", "pf", "pf-a", "bug")["first_divergence"]["op"],
                         "aten::mul")
        removed = self.cli("rm", "--plan", "pf")
        self.assertEqual(removed.returncode, 0, removed.stderr)
        self.assertEqual(json.loads(self.cli("plans", "--json").stdout), [])
        missing = self.cli("diff", "--plan", "pf", "pf-a", "bug")
        self.assertEqual(missing.returncode, 2)
        self.assertIn("no plan named 'pf'", missing.stderr)

    def test_preflight_of_two_recorded_runs_and_its_refusals(self):
        self.train("rec-a", "--spawn", "2", "--steps", "2")
        self.train("rec-b", "--spawn", "2", "--steps", "2")
        made = self.cli("preflight", "rec-a", "rec-b", "--name", "rec", "--json")
        self.assertEqual(made.returncode, 0, made.stderr)
        plan = json.loads(made.stdout)
        self.assertEqual(plan["max_steps"], 0)  # every step recorded
        self.assertEqual([b["op"] for b in plan["boundaries"]], ["planted::shuffled_sum_"])
        again = self.cli("preflight", "rec-a", "rec-b", "--name", "rec")
        self.assertEqual(again.returncode, 2)
        self.assertIn("a plan named 'rec' exists", again.stderr)
        self.assertEqual(self.cli("preflight", "rec-a", "rec-b", "--name", "rec", "--replace").returncode, 0)
        unknown = self.cli("preflight", "rec-a", "nope", "--name", "x")
        self.assertEqual(unknown.returncode, 2)
        self.assertIn("no run named 'nope'", unknown.stderr)


if __name__ == "__main__":
    unittest.main()
