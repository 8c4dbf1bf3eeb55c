"""scripts/check_test_run.py on made-up ctest runs: each kind of lost coverage
fails, an allowed skip passes. Python stdlib and ctest only."""
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_test_run.py")


def case(name, out="", status="run", skipped=None):
    skip = f'<skipped message="{skipped}"/>' if skipped else ""
    return (f'<testcase name="{name}" classname="{name}" status="{status}">{skip}'
            f"<system-out>{out}</system-out></testcase>")


class CheckTestRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        root = self.dir.name
        # A build folder ctest can list: one unit and one e2e test.
        with open(os.path.join(root, "CTestTestfile.cmake"), "w") as f:
            f.write(textwrap.dedent("""\
                add_test(u true)
                set_tests_properties(u PROPERTIES LABELS "unit")
                add_test(e true)
                set_tests_properties(e PROPERTIES LABELS "e2e")
                """))
        self.allow = os.path.join(root, "allow.txt")
        with open(self.allow, "w") as f:
            f.write("# comment\nCudaFingerprint.* | no usable CUDA device | no GPU here\n")

    def tearDown(self):
        self.dir.cleanup()

    def check(self, *cases, labels="unit,e2e"):
        junit = os.path.join(self.dir.name, "junit.xml")
        with open(junit, "w") as f:
            f.write(f'<testsuite tests="{len(cases)}">{"".join(cases)}</testsuite>')
        return subprocess.run([sys.executable, CHECK, "--build", self.dir.name, "--junit", junit,
                               "--allow", self.allow, "--labels", labels],
                              capture_output=True, text=True)

    def assert_fails(self, result, text):
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        self.assertIn(text, result.stderr)

    def test_clean_run_passes(self):
        result = self.check(case("u", "[  PASSED  ] 1 test."), case("e", "OK"))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)

    def test_an_expected_label_without_tests_fails(self):
        self.assert_fails(self.check(case("u"), labels="unit,integration"),
                          "no test carries the ctest label 'integration'")

    def test_a_gtest_skip_fails(self):
        self.assert_fails(self.check(case("Shim.X", "Skipped\nno AVX2\n[  SKIPPED ] Shim.X",
                                          "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED")),
                          "unexpected skip: Shim.X")

    def test_a_test_that_did_not_run_fails(self):
        self.assert_fails(self.check(case("d", "", "notrun", "Unable to find executable")),
                          "unexpected skip: d")

    def test_a_unittest_skip_inside_a_passing_suite_fails(self):
        out = "test_a (m.T.test_a) (pattern='x') ... skipped 'fails without OpGuard'\nOK (skipped=1)"
        self.assert_fails(self.check(case("e2e_patterns", out)),
                          "unexpected skip: e2e_patterns: unittest: fails without OpGuard")

    def test_a_skip_named_only_in_the_summary_fails(self):
        self.assert_fails(self.check(case("e2e_faults", "Ran 3 tests\nOK (skipped=2)")),
                          "unexpected skip: e2e_faults")
        self.assert_fails(self.check(case("py", "===== 3 passed, 1 skipped in 0.5s =====")),
                          "unexpected skip: py")

    def test_the_allowed_skip_passes_only_with_its_reason(self):
        gpu = "Skipped\nno usable CUDA device: no driver\n[  SKIPPED ] CudaFingerprint.Batch"
        result = self.check(case("CudaFingerprint.Batch", gpu, "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED"))
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("expected skip: CudaFingerprint.Batch (no GPU here)", result.stdout)
        other = gpu.replace("no usable CUDA device", "out of memory")
        self.assert_fails(self.check(case("CudaFingerprint.Batch", other, "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED")),
                          "unexpected skip: CudaFingerprint.Batch")

    def test_an_empty_run_fails(self):
        self.assert_fails(self.check(), "lists no test")


if __name__ == "__main__":
    unittest.main()
