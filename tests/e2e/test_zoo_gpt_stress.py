"""Clean reruns under load (issue 37's class 4): the Megatron-style model of
the torch 2.x zoo (zoo_gpt.py --mode megatron: custom autograd Functions with
collectives in forward and backward, sequence parallelism, an MoE layer with
all_to_all_single) trained with no fault OPGUARD_ZOO_RERUNS times (default
20) beside OPGUARD_ZOO_BUSY_LOOPS busy loops (default 2), each rerun compared with the first run. Nothing
differs between them (the training's own digests say so), so every report
must say identical: a divergence is a fingerprint taken from bits that were
not the op's.

Not a ctest entry (minutes of CPU by design). Run it with the torch the zoo
runs on, in ctest's environment for torch-2.11.0_e2e_zoo_gpt:
  python3 -m unittest -v test_zoo_gpt_stress
"""
import json
import os
import subprocess
import sys

import test_zoo_gpt as zoo

RERUNS = int(os.environ.get("OPGUARD_ZOO_RERUNS", "20"))
BUSY_LOOPS = int(os.environ.get("OPGUARD_ZOO_BUSY_LOOPS", "2"))
# Each busy loop ends by itself after this long, whatever happens to the test.
BUSY_SECONDS = 3600


class CleanRerunsUnderLoad(zoo.ZooCase):
    MODE = "megatron"

    def test_clean_reruns_are_identical_with_the_cpu_loaded(self):
        busy = [subprocess.Popen([sys.executable, "-c",
                                  "import time\nend = time.time() + %d\n"
                                  "while time.time() < end: pass" % BUSY_SECONDS])
                for _ in range(BUSY_LOOPS)]
        diverged = []
        try:
            for i in range(RERUNS):
                run = f"rerun-{i}"
                self.train_run(run)
                self.assertIsNone(zoo.first_difference(self.digest_dir("reference"),
                                                       self.digest_dir(run)),
                                  f"{run}: the training itself differs")
                report = self.daemon.cli_json("diff", "reference", run)
                if report["status"] != "identical":
                    diverged.append((run, {k: report.get(k) for k in
                                           ("status", "first_divergence", "notes")}))
        finally:
            for p in busy:
                p.kill()
                p.wait()
        self.assertEqual(diverged, [], json.dumps(diverged, indent=1)[:8000])


if __name__ == "__main__":
    import unittest
    unittest.main()
