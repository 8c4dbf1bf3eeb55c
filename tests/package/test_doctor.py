"""`opguard doctor` against a real daemon and Debian's python3 with the built
package in a user site (as installed): all four checks pass, and each way a
recording fails (no Python, no package, no hook, no daemon, records sent
elsewhere, recording refused) is one line naming the check and what to do."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import harness  # noqa: E402


class Doctor(harness.DaemonTestCase):
    def doctor(self, *args, env=None, daemon=None):
        env = env if env is not None else self.site.env(OPGUARD_ENDPOINT=self.daemon.ingest)
        return subprocess.run(
            [os.environ["OPGUARD_CLI"], "doctor", "--python", harness.PYTHON,
             "--daemon", daemon or self.daemon.query, "--timeout", "3", *args],
            env=env, capture_output=True, text=True, timeout=300)

    def assertFailsAt(self, result, check, *phrases):
        """Exit 1, one line on stderr for check `check`, the checks before it passed."""
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith(f"opguard doctor: [{check}/4] "), lines[0])
        for phrase in phrases:
            self.assertIn(phrase, lines[0])
        passed = [l for l in result.stdout.splitlines() if l.startswith("ok [")]
        self.assertEqual([l[4] for l in passed], [str(n) for n in range(1, check)], result.stdout)

    def runs(self):
        return [r["name"] for r in self.daemon.cli_json("runs")["runs"]]

    def test_all_checks_pass_and_the_run_is_removed(self):
        result = self.doctor()
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(result.stderr, "")
        lines = result.stdout.splitlines()
        self.assertEqual([l[:8] for l in lines[:4]], [f"ok [{n}/4]" for n in range(1, 5)], lines)
        self.assertIn(self.site.site, lines[0])        # where the package was imported from
        self.assertIn("torch 1.13", lines[1])          # Debian's torch
        run = lines[3].split(" as run ")[1].split(" ")[0]
        self.assertTrue(run.startswith("opguard-doctor-"), run)
        self.assertIn("(deleted)", lines[3])
        self.assertNotIn(run, self.runs())

    def test_python_that_cannot_run(self):
        result = subprocess.run(
            [os.environ["OPGUARD_CLI"], "doctor", "--python", "/nonexistent/python3",
             "--daemon", self.daemon.query], capture_output=True, text=True, timeout=60)
        self.assertFailsAt(result, 1, "/nonexistent/python3 cannot be run", "--python")

    def test_python_without_the_package(self):
        env = self.site.env(OPGUARD_ENDPOINT=self.daemon.ingest, PYTHONNOUSERSITE=1)
        self.assertFailsAt(self.doctor(env=env), 1, "cannot import opguard", "pip install ./python")

    def test_package_on_a_path_without_its_hook(self):
        # PYTHONPATH folders are importable but their .pth files never run.
        env = self.site.env(OPGUARD_ENDPOINT=self.daemon.ingest, PYTHONNOUSERSITE=1,
                            PYTHONPATH=self.site.site)
        self.assertFailsAt(self.doctor(env=env), 1, "does not run its opguard-autoload.pth hook",
                           "OPGUARD=1 records nothing")

    def test_daemon_not_running(self):
        missing = f"ipc://{self.tmp}/no-daemon.sock"
        self.assertFailsAt(self.doctor(daemon=missing), 3, f"no daemon answers on {missing}",
                           "opguardd --local DIR")

    def test_records_sent_where_the_daemon_does_not_listen(self):
        elsewhere = f"ipc://{self.tmp}/elsewhere.sock"
        env = self.site.env(OPGUARD_ENDPOINT=elsewhere, OPGUARD_FLUSH_TIMEOUT_MS=500)
        self.assertFailsAt(self.doctor(env=env), 4, f"sends records to {elsewhere}",
                           f"set OPGUARD_ENDPOINT={self.daemon.ingest}")

    def test_recording_refused(self):
        env = self.site.env(OPGUARD_ENDPOINT=self.daemon.ingest, OPGUARD_DEPTH="everything")
        self.assertFailsAt(self.doctor(env=env), 4, "did not record",
                           "OPGUARD_DEPTH='everything' is not 'top' or 'all'")


if __name__ == "__main__":
    unittest.main()
