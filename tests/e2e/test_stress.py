"""Clean reruns under load compare identical: a multi-rank job rerun many
times on a CPU kept busy beside it must never show a divergence. A
fingerprint taken from bits that are not the op's (a hash finished after its
storage was freed and reused, a collective's output read before it landed, a
cached fingerprint not invalidated) shows as a false pivot only when threads
interleave unusually, which load makes likely.

The job: train_megatron.py (tensor-parallel layers whose custom autograd
Functions all-reduce in forward and backward, an MoE layer dispatching with
all_to_all_single, foreach AdamW) on 2 gloo ranks, with two busy loops of the
test's own beside it. Every rerun is compared with the first by `opguard
diff`. Large tensors are hashed on the shim's fingerprint thread (a low
OPGUARD_ASYNC_FP_MIN_BYTES), so that hashes race with the training too.

Long (OPGUARD_STRESS_RERUNS reruns, default 20; about 20-40 s each on 2
busy cores): a ctest entry of label `stress` only when the build is
configured with -DOPGUARD_TEST_STRESS=ON (tests/e2e/CMakeLists.txt).
"""
import json
import os
import subprocess
import sys
import time

import harness

TRAIN = os.path.join(harness.HERE, "train_megatron.py")
RERUNS = int(os.environ.get("OPGUARD_STRESS_RERUNS", "20"))
# Bounds the whole test: reruns not started by then are not run, and the
# test fails saying how many ran (never a claim about this machine's speed).
DEADLINE_S = float(os.environ.get("OPGUARD_STRESS_DEADLINE_S", "3000"))
BUSY_LOOPS = 2


class CleanRerunsUnderLoad(harness.DaemonTestCase):
    def train(self, run):
        return harness.train(self.site, self.daemon, run, ranks=2, steps=4, script=TRAIN,
                             args=["--optimizer", "foreach"], timeout=600,
                             extra_env={"OPGUARD_ASYNC_FP_MIN_BYTES": "2048"})

    def test_clean_reruns_under_load_are_identical(self):
        start = time.monotonic()
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(BUSY_LOOPS)]
        diverged, ran = [], 0
        try:
            self.train("first")
            for i in range(RERUNS):
                if time.monotonic() - start > DEADLINE_S:
                    break
                run = f"rerun-{i}"
                self.train(run)
                ran += 1
                report = self.daemon.cli_json("diff", "first", run)
                if report["status"] != "identical":
                    diverged.append((run, report["status"], report.get("first_divergence")))
        finally:
            for p in busy:
                p.kill()
                p.wait()
        self.assertEqual(diverged, [], json.dumps(diverged, indent=1)[:6000])
        self.assertEqual(ran, RERUNS, f"only {ran} reruns within {DEADLINE_S:.0f} s")


if __name__ == "__main__":
    import unittest
    unittest.main()
