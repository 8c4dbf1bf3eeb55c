"""The second, independent check of the torch 2.x zoo's expectations: each
planted bug of test_zoo_gpt.py trained without OpGuard under the positional
op log (zoo_oplog.py), compared op by op with its reference. On the bug's
rank the first op that differs must be at the step and line test_zoo_gpt.py
expects of OpGuard (Bug.baseline: the op as torch's dispatcher names it,
below autograd), and no rank may differ at an earlier step.

Not a ctest entry (each training under the log takes ~20 s of CPU; the
expectations change only with the zoo). Run it with the torch the zoo runs on:
  OPGUARD_TEST_PYTHON=BUILD/torch-2.11.0/bin/python python3 -m unittest -v test_zoo_gpt_baseline
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

import harness
import test_zoo_gpt as zoo


def first_difference(reference, suspect):
    """(reference row, suspect row) at the first position where two ranks'
    logs differ (a row: [step, op, line, digest]); None when equal."""
    for i in range(max(len(reference), len(suspect))):
        ref = reference[i] if i < len(reference) else None
        sus = suspect[i] if i < len(suspect) else None
        if ref != sus:
            return ref, sus
    return None


class BaselineCase(unittest.TestCase):
    ZOO = None  # the test_zoo_gpt class whose bugs this checks

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="opguard-zoo-baseline-")
        cls.logs = {}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def oplog(cls, run, args):
        if run not in cls.logs:
            folder = os.path.join(cls.tmp, run)
            os.makedirs(folder)
            env = {k: v for k, v in os.environ.items() if not k.startswith("OPGUARD")}
            env["OMP_NUM_THREADS"] = "1"
            result = harness.run_ranks(
                [harness.PYTHON, zoo.SCRIPT, "--mode", cls.ZOO.MODE, "--steps", str(zoo.STEPS),
                 "--oplog", folder, *args], zoo.RANKS, env, timeout=600)
            if result.returncode != 0:
                raise AssertionError(f"training {run} failed:\n{result.failure[-4000:]}")
            cls.logs[run] = []
            for rank in range(zoo.RANKS):
                with open(os.path.join(folder, f"rank{rank}.oplog.json")) as f:
                    cls.logs[run].append(json.load(f))
        return cls.logs[run]

    def check(self, name, bug):
        reference = self.oplog(bug.reference, ["--variant", bug.reference]
                               if bug.reference != "reference" else [])
        suspect = self.oplog(name, ["--fault", bug.fault])
        firsts = [first_difference(reference[r], suspect[r]) for r in range(zoo.RANKS)]
        found = firsts[bug.rank]
        self.assertIsNotNone(found, f"rank {bug.rank}'s logs are equal")
        op, where = bug.baseline
        self.assertEqual((found[1][0], found[1][1], found[1][2]),
                         (bug.step, op, zoo.line_in(*where)), found)
        for rank, first in enumerate(firsts):
            if first is not None:
                self.assertGreaterEqual(first[1][0], bug.step, (rank, first))


def baseline_cases(zoo_class):
    attrs = {"ZOO": zoo_class}
    for attr in dir(zoo_class):
        if attr.startswith("test_"):
            name, case = getattr(zoo_class, attr).__defaults__
            if isinstance(case, zoo.Bug):
                attrs[attr] = lambda self, n=name, c=case: self.check(n, c)
    return type(f"{zoo_class.__name__}Baseline", (BaselineCase,), attrs)


DdpBaseline = baseline_cases(zoo.Ddp)
FsdpBaseline = baseline_cases(zoo.Fsdp)
TpBaseline = baseline_cases(zoo.Tp)
MegatronBaseline = baseline_cases(zoo.Megatron)

if __name__ == "__main__":
    unittest.main()
