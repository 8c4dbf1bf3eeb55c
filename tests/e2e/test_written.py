"""Tensors an op writes through its arguments are compared: a wrong optimizer
update in torch.optim's foreach and fused AdamW (ops that return nothing and
write the parameters and their state in place) is named at the optimizer op
that wrote the wrong values, at the step it happened, on the line calling
opt.step(), not at the next step's first op reading a parameter.

The planted bug (train_megatron.py --fault nodecay:1:1): from step 1 on, rank
1's group of biases and LayerNorms, which must not decay, decays. What is
expected is checked without OpGuard too: the training prints a digest of
every parameter's bytes after each step, and the parameters of the two runs
first differ after step 1, on rank 1 (test_expectation_from_parameter_digests).
"""
import json
import os
import subprocess
import unittest

import harness

TRAIN = os.path.join(harness.HERE, "train_megatron.py")
STEPS = 3


def torch_version(site):
    out = subprocess.run([site.python, "-c", "import torch; print(torch.__version__)"],
                         env=site.env(), capture_output=True, text=True, check=True)
    return tuple(int(p) for p in out.stdout.strip().split("+")[0].split(".")[:2])


def digests(result):
    """{(rank, step): digest} of the `digest RANK STEP HEX` lines."""
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("digest "):
            _, rank, step, value = line.split()
            found[(int(rank), int(step))] = value
    return found


class WrittenTensors(harness.DaemonTestCase):
    def train(self, run, optimizer, fault=""):
        return harness.train(self.site, self.daemon, run, ranks=2, steps=STEPS, fault=fault,
                             script=TRAIN, args=["--optimizer", optimizer, "--digests"])

    def check_pivot(self, optimizer):
        ref = self.train(f"{optimizer}-ref", optimizer)
        bug = self.train(f"{optimizer}-nodecay", optimizer, fault="nodecay:1:1")
        # Independently of OpGuard: the parameters part after step 1's update, on rank 1.
        ref_digests, bug_digests = digests(ref), digests(bug)
        self.assertEqual(len(ref_digests), 2 * STEPS, ref.stdout)
        differing = sorted((step, rank) for (rank, step) in ref_digests
                           if ref_digests[(rank, step)] != bug_digests.get((rank, step)))
        self.assertEqual(differing[0], (1, 1), differing)  # (step, rank)

        report = self.daemon.cli_json("diff", f"{optimizer}-ref", f"{optimizer}-nodecay")
        text = json.dumps(report, indent=1)[:4000]
        self.assertEqual(report["status"], "diverged", text)
        first = report["first_divergence"]
        self.assertEqual((first["rank"], first["step"]), (1, 1), text)
        step_line = harness.line_of(TRAIN, "opt.step()")
        # The op that wrote the wrong values: the pivot itself, or, where the
        # buggy run has an op the reference has not (foreach AdamW decays a
        # group only when its weight decay is not 0), the unpaired producer
        # of the pivot's differing inputs, named with its line.
        writer = first if first["op"] != "aten::_foreach_addcdiv_" else (first.get("producer") or {}).get("op") or {}
        self.assertIn(writer.get("op"), ("aten::_foreach_mul_", "aten::_fused_adamw_"), text)
        site = writer["site"]["suspect"] if "suspect" in writer.get("site", {}) else writer["site"]
        self.assertEqual(os.path.basename(site["file"]), "train_megatron.py", text)
        self.assertEqual(site["line"], step_line, text)
        return first

    def test_foreach_adamw_wrong_update_is_named_at_its_op(self):
        self.check_pivot("foreach")

    def test_fused_adamw_wrong_update_is_named_at_its_op(self):
        if torch_version(self.site) < (2, 4):
            self.skipTest("torch.optim's fused AdamW runs on the CPU from torch 2.4 on")
        first = self.check_pivot("fused")
        self.assertEqual(first["op"], "aten::_fused_adamw_")


if __name__ == "__main__":
    unittest.main()
