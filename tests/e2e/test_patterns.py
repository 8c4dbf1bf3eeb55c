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
# OPGUARD_TEST_PATTERNS=a,b: only those patterns (a quick run against one
# more torch: tests/e2e/CMakeLists.txt).
SELECTED = [p for p in os.environ.get("OPGUARD_TEST_PATTERNS", "").split(",") if p] or list(PATTERNS)


class TrainingPatterns(harness.DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Asked of the interpreter that trains (UserSite.python), before any
        # training: a pattern this torch cannot express is skipped with what
        # it lacks; every other pattern must train, with and without OpGuard.
        found = subprocess.run([cls.site.python, SCRIPT, "--missing"], capture_output=True,
                               text=True, timeout=120, check=True)
        cls.missing = json.loads(found.stdout)

    def train(self, patterns, run=None, fault="", **extra_env):
        """Trains `patterns` (a list, in turn, in one job) without OpGuard or,
        given `run`, recorded as `run` (with `extra_env`); returns the loss
        lines."""
        env = self.site.env(**({"OPGUARD": 1, "OPGUARD_RUN": run,
                                "OPGUARD_ENDPOINT": self.daemon.ingest,
                                "OPGUARD_FLUSH_TIMEOUT_MS": 20000, **extra_env} if run else {}))
        result = harness.run_ranks([self.site.python, SCRIPT, ",".join(patterns)] +
                                   ([fault] if fault else []),
                                   2, env, timeout=120 + 60 * len(patterns))
        what = f"{','.join(patterns)} {'under OpGuard' if run else 'without OpGuard'}"
        self.assertEqual(result.returncode, 0, f"{what}:\n{harness.failure_text(result)}")
        self.assertNotIn("opguard-torch warning", result.stderr)
        return result.stdout

    def test_clean_reruns_are_identical(self):
        """Every pattern this torch can train, in one job (a job per pattern
        costs a torch import and a rendezvous per rank, most of a 3-step
        job's time), three times: without OpGuard, then recorded twice."""
        present = [p for p in SELECTED if p not in self.missing]
        for pattern in SELECTED:
            if pattern in self.missing:
                with self.subTest(pattern=pattern):
                    self.skipTest(self.missing[pattern])
        if not present:
            return
        plain = self.train(present)
        for pattern in present:
            self.assertEqual(plain.count(f"{pattern} step "), 3, plain)
        for run in ("a", "b"):
            self.assertEqual(self.train(present, f"patterns-{run}"), plain)
        report = self.daemon.cli_json("diff", "patterns-a", "patterns-b")
        if report["status"] != "identical":
            step = (report.get("first_divergence") or {}).get("step")
            where = f"in pattern {present[step // 3]}" if step is not None else ""
            self.fail(f"clean reruns differ {where}: {json.dumps(report)[:3000]}")
        runs = {r["name"]: r for r in self.daemon.cli_json("runs")["runs"]}
        for rank in runs["patterns-a"]["ranks"]:
            self.assertGreater(rank["ops"], 1000 * len(present), rank)
            self.assertEqual(rank["steps"], 3 * len(present), rank)
            self.assertEqual(rank["gaps"], 0, rank)

    def test_bit_flip_in_one_ranks_shard_before_a_functional_all_gather(self):
        """Functional collectives (the _c10d_functional ops of FSDP2, DTensor
        and compiled code) are recorded as collectives: a bit flipped in rank
        1's gradient shard at step 1 is named at the all-gather that first
        reads it, on rank 1 only; rank 0 diverges at its output, explained
        by rank 1."""
        if "functional" in self.missing:
            self.skipTest(self.missing["functional"])
        self.train(["functional"], "functional-ref")
        self.train(["functional"], "functional-shardflip", fault="shardflip:1:1")
        report = self.daemon.cli_json("diff", "functional-ref", "functional-shardflip")
        self.assertEqual(report["status"], "diverged", json.dumps(report, indent=1)[:3000])
        first = report["first_divergence"]
        self.assertEqual((first["rank"], first["step"]), (1, 1), first)
        # The c10d op all_gather_tensor runs: torch 2.11 gathers through the
        # coalesced one.
        self.assertIn(first["op"], ("c10d::all_gather_into_tensor [enter]",
                                    "c10d::all_gather_into_tensor_coalesced [enter]"))
        self.assertFalse(first["inputs_equal"])
        line = harness.line_of(SCRIPT, "full = funcol.all_gather_tensor(shard")
        for run in ("reference", "suspect"):
            self.assertEqual(os.path.basename(first["site"][run]["file"]), "train_patterns.py")
            self.assertEqual(first["site"][run]["line"], line, first["site"][run])
        self.assertEqual(report["diverging_ranks"], [1])
        self.assertEqual({e["rank"]: e["from_rank"] for e in report["explained"]}, {0: 1})

    def assert_fault_named(self, pattern, fault, script, needle):
        """A fault planted on rank 1 at step 1 (FAULT:1:1) is named on rank 1
        at step 1, on the line containing `needle` of `script`; rank 0
        diverges only through a collective and is explained by rank 1.
        Returns the first divergence."""
        if pattern in self.missing:
            self.skipTest(self.missing[pattern])
        if pattern not in SELECTED:
            self.skipTest(f"{pattern} is not among OPGUARD_TEST_PATTERNS (a quick run)")
        self.train([pattern], f"{pattern}-ref")
        self.train([pattern], f"{pattern}-{fault}", fault=f"{fault}:1:1")
        report = self.daemon.cli_json("diff", f"{pattern}-ref", f"{pattern}-{fault}")
        self.assertEqual(report["status"], "diverged", json.dumps(report, indent=1)[:3000])
        first = report["first_divergence"]
        self.assertEqual((first["rank"], first["step"]), (1, 1), json.dumps(first)[:3000])
        line = harness.line_of(script, needle)
        for run in ("reference", "suspect"):
            self.assertEqual(os.path.basename(first["site"][run]["file"]),
                             os.path.basename(script), first["site"][run])
            self.assertEqual(first["site"][run]["line"], line, first["site"][run])
        self.assertEqual(report["diverging_ranks"], [1])
        self.assertEqual({e["rank"]: e["from_rank"] for e in report["explained"]}, {0: 1})
        return first

    def assert_shard_flip_named(self, pattern, script, needle):
        """A bit flipped in rank 1's shard at step 1 (shardflip:1:1, no op
        does it) is named at the first op that reads the shard (inputs
        differ), as assert_fault_named says."""
        first = self.assert_fault_named(pattern, "shardflip", script, needle)
        self.assertFalse(first["inputs_equal"], json.dumps(first)[:3000])
        return first

    def test_bit_flip_in_one_ranks_tensor_parallel_weight_shard(self):
        """DTensor tensor parallelism: rank 1's local shard of the first
        block's column-parallel weight is read first by the MLP's call (the
        local ops DTensor runs are the ops, at the user's line); rank 0
        diverges at the row-parallel all-reduce of the partial sums."""
        first = self.assert_shard_flip_named("dtensor_tp", harness.TRAIN,
                                             "return x + self.mlp(self.ln2(x))")
        self.assertFalse(first["op"].startswith("c10d::"), first["op"])

    def test_bit_flip_in_a_checkpointed_blocks_weight(self):
        """Activation checkpointing: rank 1's copy of the first block's MLP
        weight, flipped before the forward of step 1, is named at the MLP's
        call in the first forward (not in the recomputation under backward);
        rank 0 diverges at the gradients' all-reduce."""
        first = self.assert_shard_flip_named("checkpoint", harness.TRAIN,
                                             "return x + self.mlp(self.ln2(x))")
        self.assertFalse(first["reference"]["backward"], json.dumps(first)[:3000])

    def test_bit_flip_in_a_weight_under_bf16_autocast(self):
        """bfloat16 autocast: rank 1's copy of the first block's MLP weight,
        flipped before the forward of step 1, is named at the MLP's call,
        where autocast first reads it (its cast to bfloat16 or the linear)."""
        first = self.assert_shard_flip_named("autocast", harness.TRAIN,
                                             "return x + self.mlp(self.ln2(x))")
        self.assertFalse(first["reference"]["backward"], json.dumps(first)[:3000])

    def test_bit_flip_in_the_second_pipeline_stages_weight(self):
        """Two pipeline stages over send/recv: stage 1's (rank 1's) MLP
        weight, flipped before step 1, is named on rank 1 at the block's MLP
        call; rank 0 diverges only through the gradient it receives."""
        self.assert_shard_flip_named("pipeline", harness.TRAIN,
                                     "return x + self.mlp(self.ln2(x))")

    def test_bit_flip_in_one_ranks_fsdp2_parameter_shard(self):
        """FSDP2: rank 1's shard of the embedding (a root parameter) is read
        first when FSDP2 copies it into the all-gather's input before the
        model's forward: named at the model's call; rank 0 diverges at the
        all-gather."""
        self.assert_shard_flip_named("fsdp2", SCRIPT, "logits = model(idx)")

    def test_changed_computation_inside_a_compiled_region(self):
        """torch.compile: rank 1's first block, compiled by inductor, scales
        its attention after the product instead of before from step 1 on (a
        changed computation inside the compiled region: dynamo compiles the
        block again). The fused kernels run outside torch's dispatcher; the
        region is one op, named for the compiled module, at the line that
        calls it, with the same inputs and other outputs: the op itself."""
        first = self.assert_fault_named("compiled", "compiledreorder", harness.TRAIN,
                                        "x = block(x)")
        self.assertEqual(first["op"], "compiled::Block", json.dumps(first)[:3000])
        self.assertTrue(first["inputs_equal"], json.dumps(first)[:3000])
        self.assertFalse(first["reference"]["backward"], json.dumps(first)[:3000])

    def test_ops_inside_a_compiled_region_with_depth_all(self):
        """OPGUARD_DEPTH=all: the ops torch's dispatcher sees inside a
        compiled region (the extern kernels inductor's generated code calls,
        aten::addmm for the Linears) are recorded before the region, at
        lines of that generated code in inductor's cache; the fused kernels
        are not ops. Each block's call is still one region, at its line."""
        if "compiled" in self.missing:
            self.skipTest(self.missing["compiled"])
        if "compiled" not in SELECTED:
            self.skipTest("compiled is not among OPGUARD_TEST_PATTERNS (a quick run)")
        self.train(["compiled"], "compiled-all", OPGUARD_DEPTH="all")
        cache = self.site.env()["TORCHINDUCTOR_CACHE_DIR"]
        ops = self.daemon.trace("compiled-all", 0)
        regions = [i for i, op in enumerate(ops) if op["name"] == "compiled::Block"]
        self.assertEqual(len(regions), 2 * 3, [op["name"] for op in ops][:200])
        line = harness.line_of(harness.TRAIN, "x = block(x)")
        start = 0
        for i in regions:
            self.assertEqual((ops[i]["site"]["line"], ops[i]["backward"]), (line, False), ops[i])
            inside = [op for op in ops[start:i] if op["site"]["file"].startswith(cache)]
            self.assertIn("aten::addmm", [op["name"] for op in inside], ops[start:i])
            start = i + 1


if __name__ == "__main__":
    unittest.main()
