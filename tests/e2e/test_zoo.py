"""The bug zoo: training code written the way LLM teams write it
(zoo_train.py: custom autograd Functions with hand-written backward,
hand-written recompute, a hand-written optimizer, gradient accumulation,
identical source lines in two branches), each bug from the paper's classes
planted in it. OpGuard must name the exact rank, step, op and source line of
every bug, and call every benign change identical."""
import json
import os
import unittest

import harness

SCRIPT = os.path.join(harness.HERE, "zoo_train.py")
RANKS = 2
STEPS = 3


def line(needle):
    return harness.line_of(SCRIPT, needle)


class BugZoo(harness.DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.train_run("reference")

    @classmethod
    def train_run(cls, run, fault="", variant=""):
        args = (["--fault", fault] if fault else []) + (["--variant", variant] if variant else [])
        env = cls.site.env(OPGUARD=1, OPGUARD_RUN=run, OPGUARD_ENDPOINT=cls.daemon.ingest,
                           OPGUARD_FLUSH_TIMEOUT_MS=20000)
        result = harness.run_ranks([cls.site.python, SCRIPT, "--spawn", str(RANKS), "--steps",
                                    str(STEPS), *args], RANKS, env, timeout=300)
        if result.returncode != 0 or "opguard-torch warning" in result.stderr:
            raise AssertionError(f"training {run} failed ({result.returncode}):\n"
                                 f"{(result.failure or result.stderr)[-4000:]}")
        return result

    def diff(self, suspect):
        report = self.daemon.cli_json("diff", "reference", suspect)
        self.assertEqual(report["kind"], "diff")
        return report

    def assert_pivot(self, suspect, rank, step, op, needle, inputs_equal, diverging=None,
                     forward_needle=None):
        report = self.diff(suspect)
        text = json.dumps(report, indent=1)[:4000]
        self.assertEqual(report["status"], "diverged", text)
        first = report["first_divergence"]
        self.assertEqual((first["rank"], first["step"], first["op"]), (rank, step, op), text)
        self.assertEqual(os.path.basename(first["site"]["suspect"]["file"]), "zoo_train.py", text)
        self.assertEqual(first["site"]["suspect"]["line"], line(needle), text)
        self.assertEqual(first["inputs_equal"], inputs_equal, text)
        self.assertEqual(report["diverging_ranks"], diverging or [rank], text)
        # A backward op with its own line names the forward call it belongs to.
        forward = first["forward_site"]
        if forward_needle is None:
            self.assertIsNone(forward, text)
        else:
            self.assertEqual(forward["suspect"]["line"], line(forward_needle), text)
            self.assertEqual(forward["reference"]["line"], line(forward_needle), text)
        return report

    def assert_identical(self, suspect):
        report = self.diff(suspect)
        self.assertEqual(report["status"], "identical", json.dumps(report, indent=1)[:4000])

    # ---- steps without torch.optim ----------------------------------------

    def test_steps_are_the_training_loops_iterations(self):
        runs = {r["name"]: r for r in self.daemon.cli_json("runs")["runs"]}
        reference = runs["reference"]
        self.assertEqual(reference["determinism"].get("steps"), "backward", reference)
        for rank in reference["ranks"]:
            self.assertEqual(rank["steps"], STEPS, rank)

    # ---- bugs -------------------------------------------------------------

    def test_bug_in_a_custom_functions_backward(self):
        self.train_run("attention-backward", fault="attention_backward:1:1")
        self.assert_pivot("attention-backward", rank=1, step=1,
                          op="aten::matmul [AttentionBackward]",
                          needle="grad_v = torch.matmul(probs_t, grad_out)", inputs_equal=False,
                          forward_needle="att = Attention.apply(qh, kh, vh)")

    def test_bug_in_a_custom_functions_forward(self):
        self.train_run("attention-forward", fault="attention_forward:0:2")
        self.assert_pivot("attention-forward", rank=0, step=2, op="aten::triu",
                          needle="masked = torch.ones(t, t).triu(", inputs_equal=False)

    def test_bug_in_hand_written_recompute(self):
        self.train_run("recompute", fault="recompute:1:0")
        # The first recomputed op on the wrong input: the detach that starts
        # the recompute (the roll that picked the input has no counterpart).
        self.assert_pivot("recompute", rank=1, step=0, op="aten::detach [recompute]",
                          needle="x = x.detach().requires_grad_(True)", inputs_equal=False,
                          forward_needle="RecomputedGelu.apply(self.up(self.ln2(x)))")

    def test_bug_in_a_hand_written_optimizer(self):
        self.train_run("optimizer", fault="optimizer:-1:2")
        self.assert_pivot("optimizer", rank=0, step=2, op="aten::add_",
                          needle="buf.mul_(self.beta).add_(grad)", inputs_equal=False,
                          diverging=[0, 1])

    def test_bit_flip_in_one_ranks_reduced_gradient(self):
        self.train_run("bitflip", fault="bitflip:1:1")
        report = self.assert_pivot("bitflip", rank=1, step=1, op="aten::add_",
                                   needle="buf.mul_(self.beta).add_(grad)", inputs_equal=False)
        self.assertEqual({e["rank"]: e["from_rank"] for e in report["explained"]}, {0: 1})

    def test_bug_on_one_of_two_identical_lines(self):
        self.train_run("branch", fault="branch:-1:0")
        self.assert_pivot("branch", rank=0, step=0, op="aten::linear",
                          needle="k = self.wk(h) if not", inputs_equal=False, diverging=[0, 1])

    # ---- benign changes ---------------------------------------------------

    def test_independent_computations_in_another_order_are_identical(self):
        self.train_run("reordered", variant="reordered")
        self.assert_identical("reordered")

    def test_extra_logging_ops_are_identical(self):
        self.train_run("logging", variant="logging")
        self.assert_identical("logging")

    def test_the_other_of_two_identical_branches_is_identical(self):
        self.train_run("other-branch", variant="other_branch")
        self.assert_identical("other-branch")

    def test_the_same_update_in_another_function_is_identical(self):
        self.train_run("optimizer-function", variant="optimizer_function")
        self.assert_identical("optimizer-function")


if __name__ == "__main__":
    unittest.main()
