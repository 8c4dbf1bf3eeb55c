"""Real jobs train in many ways (DDP comm hooks, checkpointing, DataLoader
workers, autocast, gathered Python objects, ...). Each way, run twice as a
clean job, must give identical recordings and the job's own losses: any
difference would be a false divergence shown to a user."""
import json
import os
import subprocess
import unittest

import harness
from train_patterns import PATTERNS

SCRIPT = os.path.join(harness.HERE, "train_patterns.py")


class TrainingPatterns(harness.DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Asked of the interpreter that trains (harness.PYTHON), before any
        # training: a pattern this torch cannot express is skipped with what
        # it lacks; every other pattern must train, with and without OpGuard.
        found = subprocess.run([harness.PYTHON, SCRIPT, "--missing"], capture_output=True,
                               text=True, timeout=120, check=True)
        cls.missing = json.loads(found.stdout)

    def train(self, pattern, run=None):
        env = self.site.env(**({"OPGUARD": 1, "OPGUARD_RUN": run,
                                "OPGUARD_ENDPOINT": self.daemon.ingest,
                                "OPGUARD_FLUSH_TIMEOUT_MS": 20000} if run else {}))
        result = subprocess.run([harness.PYTHON, SCRIPT, pattern], env=env, capture_output=True,
                                text=True, timeout=120)
        what = f"{pattern} {'under OpGuard' if run else 'without OpGuard'}"
        self.assertEqual(result.returncode, 0, f"{what}:\n{result.stderr[-3000:]}")
        self.assertNotIn("opguard-torch warning", result.stderr)
        return result.stdout

    def test_clean_reruns_are_identical(self):
        for pattern in PATTERNS:
            with self.subTest(pattern=pattern):
                if pattern in self.missing:
                    self.skipTest(self.missing[pattern])
                plain = self.train(pattern)
                self.assertEqual(plain.count("loss"), 3, plain)
                for run in ("a", "b"):
                    self.assertEqual(self.train(pattern, f"{pattern}-{run}"), plain)
                report = self.daemon.cli_json("diff", f"{pattern}-a", f"{pattern}-b")
                self.assertEqual(report["status"], "identical", json.dumps(report)[:3000])
                runs = {r["name"]: r for r in self.daemon.cli_json("runs")["runs"]}
                for rank in runs[f"{pattern}-a"]["ranks"]:
                    self.assertGreater(rank["ops"], 1000, rank)
                    self.assertEqual(rank["steps"], 3, rank)
                    self.assertEqual(rank["gaps"], 0, rank)


if __name__ == "__main__":
    unittest.main()
