#!/usr/bin/env python3
"""What of the GPU scripts runs without a GPU: their syntax (bash -n,
shellcheck where installed), gpu-check.sh on a machine that has none of its
prerequisites (every section skips with one line, the results table is still
written, exit 0), and gpu_results.py's table and docs update."""
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

SCRIPTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(SCRIPTS)
DOCS = os.path.join(ROOT, "docs", "gpu-results.md")


class Syntax(unittest.TestCase):
    def test_bash_parses_both_scripts(self):
        for name in ("gpu-check.sh", "gpu-bundle.sh"):
            subprocess.run(["bash", "-n", os.path.join(SCRIPTS, name)], check=True)

    def test_shellcheck_finds_no_warning(self):
        if shutil.which("shellcheck") is None:
            self.skipTest("shellcheck is not installed")
        result = subprocess.run(["shellcheck", "-S", "warning", "gpu-check.sh", "gpu-bundle.sh"],
                                cwd=SCRIPTS, capture_output=True, text=True)
        self.assertEqual(result.returncode, 0, result.stdout)


class GpuCheckWithoutPrerequisites(unittest.TestCase):
    def test_every_section_skips_in_one_line_and_the_table_is_written(self):
        with tempfile.TemporaryDirectory() as tmp:
            # A Python without torch (no site-packages) and no nvcc, no bundle.
            no_torch = os.path.join(tmp, "python-no-torch")
            with open(no_torch, "w") as f:
                f.write(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
            os.chmod(no_torch, 0o755)
            out = os.path.join(tmp, "out")
            os.mkdir(out)
            env = dict(os.environ, PYTHON=no_torch, NVCC="/nonexistent/nvcc",
                       GPU_CHECK_BUNDLE=os.path.join(tmp, "no-bundle"), GPU_CHECK_NO_DOCS="1",
                       GPU_CHECK_OUT=out, PATH="/usr/bin:/bin")
            result = subprocess.run(["bash", os.path.join(SCRIPTS, "gpu-check.sh")], env=env,
                                    capture_output=True, text=True, timeout=120)
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
            text = result.stdout
            for line in ("== fingerprint: skipped: no nvcc (set NVCC=)",
                         "== build: skipped: no bundle at",
                         "== torch: skipped: " + no_torch + " cannot import torch",
                         "== cupti: skipped: shim_cupti_test not built",
                         "== e2e: skipped: no daemon, CLI and adapter built",
                         "== nccl: skipped: not built",
                         "== gpu-check: exit 0"):
                self.assertIn(line, text)
            with open(os.path.join(out, "gpu-results-table.md")) as f:
                table = f.read()
            self.assertEqual(table.count("| skipped |"), 6, table)
            self.assertIn("no GPU found", table)
            self.assertTrue(os.path.exists(os.path.join(out, "gpu-check.log")))


class Results(unittest.TestCase):
    def run_results(self, tmp, rows, when, machine):
        results = os.path.join(tmp, "r.jsonl")
        with open(results, "w") as f:
            f.write("\n".join(rows) + "\n")
        subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu_results.py"), "--results", results,
                        "--machine", machine, "--commit", "abc1234", "--seconds", "431",
                        "--table", os.path.join(tmp, "t.md"), "--docs", os.path.join(tmp, "doc.md"),
                        "--now", when], check=True)
        with open(os.path.join(tmp, "doc.md")) as f:
            return f.read()

    def test_latest_run_replaces_the_placeholder_and_moves_to_history(self):
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(DOCS, os.path.join(tmp, "doc.md"))
            ok = '{"section": "e2e", "check": "clean rerun", "target": "identical", ' \
                 '"measured": "identical", "verdict": "ok"}'
            miss = '{"section": "e2e", "check": "step time a|b", "target": "≤ 1.3×", ' \
                   '"measured": "1.42×", "verdict": "miss"}'
            doc = self.run_results(tmp, [ok, miss], "2026-12-01T22:00", "GPU one")
            latest = doc.split("<!-- gpu-check:latest:begin -->")[1].split("<!-- gpu-check:latest:end -->")[0]
            self.assertIn("### 2026-12-01 22:00 UTC · GPU one · commit abc1234 · 431 s", latest)
            self.assertIn("| e2e | clean rerun | identical | identical | ok |", latest)
            self.assertIn("| e2e | step time a\\|b | ≤ 1.3× | 1.42× | missed |", latest)
            self.assertNotIn("not run yet", doc)
            doc = self.run_results(tmp, [ok], "2026-12-02T09:30", "GPU two")
            latest = doc.split("<!-- gpu-check:latest:begin -->")[1].split("<!-- gpu-check:latest:end -->")[0]
            history = doc.split("<!-- gpu-check:history -->")[1]
            self.assertIn("GPU two", latest)
            self.assertNotIn("GPU one", latest)
            self.assertIn("### 2026-12-01 22:00 UTC · GPU one", history)

    def test_docs_without_markers_are_an_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "doc.md"), "w") as f:
                f.write("# GPU results\n")
            with open(os.path.join(tmp, "r.jsonl"), "w") as f:
                f.write('{"section": "a", "check": "b", "target": "c", "measured": "d", "verdict": "ok"}\n')
            result = subprocess.run([sys.executable, os.path.join(SCRIPTS, "gpu_results.py"),
                                     "--results", os.path.join(tmp, "r.jsonl"), "--machine", "m",
                                     "--commit", "c", "--seconds", "1", "--table", os.path.join(tmp, "t.md"),
                                     "--docs", os.path.join(tmp, "doc.md")], capture_output=True, text=True)
            self.assertEqual(result.returncode, 1)
            self.assertIn("lacks the gpu-check markers", result.stderr)


if __name__ == "__main__":
    unittest.main()
