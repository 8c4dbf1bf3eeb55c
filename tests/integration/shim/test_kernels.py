"""Kernel names end to end: a process records ops through libopguard_shim.so
with OPGUARD_KERNELS=1 (CUPTI is the stand-in libcupti built from the real
headers, shim/cupti/testing/standin_cupti.cc: no CUDA driver here) into a
real opguardd; `opguard diff` then says whether the first divergent op ran
other kernels in the two runs."""
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

OPS = 40
PIVOT = 23
GEMM = "ampere_sgemm_128x64_nn"
SPLIT_K = "ampere_sgemm_64x64_nn_splitK"


class KernelNamesThroughTheDaemon(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        for name in ("OPGUARDD", "OPGUARD_CLI", "OPGUARD_KERNELS_CHILD", "OPGUARD_STANDIN_CUPTI"):
            if not os.environ.get(name):
                raise unittest.SkipTest(f"{name} is not set (run through ctest)")
        cls.tmp = tempfile.mkdtemp(prefix="opguard-kernels-it-")
        cls.daemon = harness.Daemon(cls.tmp)
        # reference and same: the same kernels and bits; other: the pivot
        # ran a split-K GEMM and wrote other bits; flip: same kernels, other bits.
        for run, kernel, output in (("reference", GEMM, PIVOT + 1), ("same", GEMM, PIVOT + 1),
                                    ("other", SPLIT_K, 0xBAD), ("flip", GEMM, 0xBAD)):
            cls.record(run, kernel, output)

    @classmethod
    def record(cls, run, pivot_kernel, pivot_output):
        env = {"PATH": "/usr/bin:/bin", "OPGUARD": "1", "OPGUARD_RUN": run, "RANK": "0",
               "WORLD_SIZE": "1", "OPGUARD_ENDPOINT": cls.daemon.ingest, "OPGUARD_KERNELS": "1",
               "OPGUARD_CUPTI_LIBRARY": os.environ["OPGUARD_STANDIN_CUPTI"]}
        out = subprocess.run([os.environ["OPGUARD_KERNELS_CHILD"], str(OPS), str(PIVOT), pivot_kernel,
                              str(pivot_output)], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"bad=0 kernel_names={2 * OPS}" in out.stdout, out.stdout + out.stderr

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_the_pivots_kernels_are_read_back_in_launch_order(self):
        result = self.daemon.cli("diff", "reference", "same", "--json", check=False)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(json.loads(result.stdout)["status"], "identical")
        diff = self.daemon.cli_json("diff", "reference", "other")
        pivot = diff["first_divergence"]
        self.assertEqual(pivot["reference"]["kernels"], [GEMM, "bias_add(float*, float const*, int)"])
        self.assertEqual(pivot["suspect"]["kernels"], [SPLIT_K, "bias_add(float*, float const*, int)"])

    def test_the_report_says_the_pivot_ran_other_kernels(self):
        diff = self.daemon.cli_json("diff", "reference", "other")
        self.assertEqual(diff["status"], "diverged")
        pivot = diff["first_divergence"]
        self.assertEqual(pivot["op_index"], {"reference": PIVOT, "suspect": PIVOT})
        self.assertTrue(pivot["inputs_equal"])
        self.assertIs(pivot["kernels_differ"], True)
        text = self.daemon.cli("diff", "reference", "other", check=False).stdout
        self.assertIn("which ran other kernels", text)
        self.assertIn("reference: " + GEMM, text)
        self.assertIn("suspect:   " + SPLIT_K, text)

    def test_same_kernels_with_other_bits_is_not_blamed_on_the_kernels(self):
        pivot = self.daemon.cli_json("diff", "reference", "flip")["first_divergence"]
        self.assertEqual(pivot["op_index"]["suspect"], PIVOT)
        self.assertIs(pivot["kernels_differ"], False)
        text = self.daemon.cli("diff", "reference", "flip", check=False).stdout
        self.assertIn("kernels: the same 2 in both runs", text)


if __name__ == "__main__":
    unittest.main()
