"""Real training, real daemon: faults injected by the training code itself
(train_gpt.py --fault), and OpGuard must name the exact rank, step, op and
source line — and the first diverging rank, not the ranks infected later."""
import json
import os
import subprocess
import sys
import unittest

import harness

sys.path.insert(0, os.path.join(harness.HERE, "..", "integration", "cli"))
import check_trace_events  # noqa: E402  (the trace-event format checker)

TRAIN = harness.TRAIN
# Three ranks: one faulty, two that must be explained by it (each rank is a
# process importing torch: most of a short job's time).
RANKS = 3
STEPS = 3
# train_gpt.TinyGPT() has 37 parameters; without DDP each is all-reduced once
# a step, after the step's broadcast.
TINYGPT_PARAMETERS = 37


class Faults(harness.DaemonTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.train(cls.site, cls.daemon, "ref", ranks=RANKS, steps=STEPS)

    def diff(self, suspect, reference="ref"):
        report = self.daemon.cli_json("diff", reference, suspect)
        self.assertEqual(report["kind"], "diff")
        return report

    def assert_pivot(self, report, rank, step, op, line):
        self.assertEqual(report["status"], "diverged", json.dumps(report, indent=1)[:3000])
        first = report["first_divergence"]
        self.assertEqual(first["rank"], rank)
        self.assertEqual(first["step"], step)
        self.assertEqual(first["op"], op)
        for run in ("reference", "suspect"):
            site = first["site"][run]
            self.assertEqual(os.path.basename(site["file"]), "train_gpt.py", site)
            self.assertEqual(site["line"], line, site)
        self.assertEqual(report["diverging_ranks"], [rank])
        return first

    def test_clean_rerun_is_identical(self):
        harness.train(self.site, self.daemon, "ref-again", ranks=RANKS, steps=STEPS)
        report = self.diff("ref-again")
        self.assertEqual(report["status"], "identical", json.dumps(report)[:2000])
        self.assertIsNone(report["first_divergence"])
        self.assertEqual(report["diverging_ranks"], [])
        text = self.daemon.cli("diff", "ref", "ref-again", check=False)
        self.assertEqual(text.returncode, 0, text.stdout + text.stderr)

    def test_bit_flip_in_one_ranks_gradient(self):
        harness.train(self.site, self.daemon, "bitflip", ranks=RANKS, steps=STEPS,
                      fault="bitflip:1:1")
        report = self.diff("bitflip")
        # The flipped gradient is first consumed by its all-reduce on rank 1:
        # the buffer handed to the collective already differs (no recorded op
        # produced the change: inputs differ). Every other rank diverges only
        # at that collective's output and is explained by rank 1.
        first = self.assert_pivot(report, rank=1, step=1, op="c10d::all_reduce [enter]",
                                  line=harness.line_of(TRAIN, "dist.all_reduce(p.grad)"))
        self.assertFalse(first["inputs_equal"])
        explained = {e["rank"]: e["from_rank"] for e in report["explained"]}
        self.assertEqual(explained, {r: 1 for r in range(RANKS) if r != 1})
        text = self.daemon.cli("diff", "ref", "bitflip", check=False)
        self.assertEqual(text.returncode, 1)
        self.assertIn("rank 1 · step 1 · c10d::all_reduce [enter]", text.stdout)
        # The Perfetto export of the two runs: real PyTorch ops carry measured
        # durations (wall time) and nest; the pivot instant sits on the same op.
        path = os.path.join(self.tmp, "bitflip.json")
        self.daemon.cli("export", "bitflip", "--vs", "ref", "--perfetto", path)
        with open(path) as f:
            trace = json.load(f)
        problems, summary = check_trace_events.check(trace)
        self.assertEqual(problems, [])
        self.assertEqual(trace["otherData"]["time"], "wall")
        self.assertGreater(summary["flows"], 0)
        self.assertEqual(len(summary["instants"]), 2)
        for instant in summary["instants"]:
            self.assertEqual(instant["args"]["op"], "c10d::all_reduce [enter]")
            self.assertEqual(instant["args"]["op_index"],
                             first["op_index"]["reference" if instant["pid"] == 1 else "suspect"])

    def test_changed_computation_in_one_function(self):
        harness.train(self.site, self.daemon, "reorder", ranks=RANKS, steps=STEPS,
                      fault="reorder:2")
        report = self.diff("reorder")
        first = self.assert_pivot(report, rank=2, step=0, op="aten::matmul",
                                  line=harness.line_of(TRAIN, "scores = torch.matmul(q, k"))
        self.assertFalse(first["inputs_equal"])  # q is scaled in one run only
        # The reference scales q before the product: that op has no partner in
        # the suspect (which scales the scores), and the report names it.
        producer = first["producer"]
        self.assertIsNotNone(producer, json.dumps(first)[:2000])
        self.assertEqual(producer["run"], "reference")
        self.assertEqual(producer["op"]["op"], "aten::mul")
        self.assertEqual(producer["op"]["site"]["line"], harness.line_of(TRAIN, "scores = torch.matmul(q, k"))
        self.assertEqual({e["rank"] for e in report["explained"]}, set(range(RANKS)) - {2})

    def test_extra_logging_ops_are_not_a_divergence(self):
        harness.train(self.site, self.daemon, "logging", ranks=RANKS, steps=STEPS,
                      fault="logging:2")
        report = self.diff("logging")
        self.assertEqual(report["status"], "identical", json.dumps(report)[:2000])
        rank2 = next(r for r in report["ranks"] if r["rank"] == 2)
        self.assertGreater(rank2["unaligned_total"]["suspect"], 0)
        self.assertEqual(rank2["unaligned_total"]["reference"], 0)

    def test_swapped_independent_computations_are_not_a_divergence(self):
        harness.train(self.site, self.daemon, "swap", ranks=RANKS, steps=STEPS, fault="swap:2")
        report = self.diff("swap")
        self.assertEqual(report["status"], "identical", json.dumps(report)[:2000])
        rank2 = next(r for r in report["ranks"] if r["rank"] == 2)
        self.assertGreater(rank2["reordered"], 0)

    def shifted_copy(self):
        """train_gpt.py as an engineer edits it between two runs: lines added
        near the top (so every later op's line number moves), run from another
        checkout directory."""
        checkout = os.path.join(self.tmp, "other-checkout")
        os.makedirs(checkout, exist_ok=True)
        path = os.path.join(checkout, "train_gpt.py")
        with open(TRAIN) as f:
            lines = f.readlines()
        at = next(i for i, text in enumerate(lines) if text.startswith("import torch\n"))
        added = ["import sys  # added between the runs\n", "\n",
                 "DEBUG_TAG = 'suspect'  # and this\n"]
        with open(path, "w") as f:
            f.writelines(lines[:at] + added + lines[at:])
        return path, len(added)

    def test_moved_source_lines_still_align(self):
        script, shift = self.shifted_copy()
        harness.train(self.site, self.daemon, "shifted", ranks=RANKS, steps=STEPS, script=script)
        report = self.diff("shifted")
        self.assertEqual(report["status"], "identical", json.dumps(report)[:2000])
        for rank in report["ranks"]:
            self.assertEqual(rank["unaligned_total"], {"reference": 0, "suspect": 0}, rank)
        # And a fault in the moved code is still named at its op, with each
        # run's own line.
        harness.train(self.site, self.daemon, "shifted-bitflip", ranks=RANKS, steps=STEPS,
                      fault="bitflip:1:1", script=script)
        report = self.diff("shifted-bitflip")
        self.assertEqual(report["status"], "diverged", json.dumps(report)[:2000])
        first = report["first_divergence"]
        self.assertEqual((first["rank"], first["step"], first["op"]),
                         (1, 1, "c10d::all_reduce [enter]"))
        line = harness.line_of(TRAIN, "dist.all_reduce(p.grad)")
        self.assertEqual(first["site"]["reference"]["line"], line)
        self.assertEqual(first["site"]["suspect"]["line"], line + shift)
        self.assertEqual(first["site"]["suspect"]["file"], script)
        self.assertEqual(report["diverging_ranks"], [1])

    def replicas(self, run):
        report = self.daemon.cli_json("ranks", run, "--replicas", ",".join(map(str, range(RANKS))))
        self.assertEqual(report["kind"], "ranks")
        self.assertEqual(len(report["replicas"]), 1, json.dumps(report)[:2000])
        return report, report["replicas"][0]

    def assert_replica_pivot(self, group, rank, step):
        """The odd replica's first differing op is SGD's update of the
        corrupted gradient's parameter (param.add_(grad, alpha=-lr), inside
        opt.step()), against the base rank's same update."""
        first = group["first_divergence"]
        self.assertEqual((first["rank"], first["step"], first["op"]), (rank, step, "aten::add_"),
                         json.dumps(group)[:3000])
        self.assertFalse(first["inputs_equal"])  # the gradient it read was already corrupted
        line = harness.line_of(TRAIN, "opt.step()")
        for run in ("reference", "suspect"):
            self.assertEqual(os.path.basename(first["site"][run]["file"]), "train_gpt.py")
            self.assertEqual(first["site"][run]["line"], line, first["site"])

    def test_clean_replicas_agree_on_their_optimizer_steps(self):
        # Every rank trains on its own data shard, so forward and backward ops
        # differ across ranks; the optimizer's steps (after the all-reduce)
        # must not.
        report, group = self.replicas("ref")
        self.assertEqual(group["status"], "identical", json.dumps(group)[:3000])
        self.assertEqual(group["compared"], "replicated_ops")
        self.assertGreater(group["compared_ops"], 0)
        self.assertEqual(report["status"], "identical", json.dumps(report)[:3000])

    def test_corrupted_reduced_gradient_on_one_replica(self):
        harness.train(self.site, self.daemon, "sdc", ranks=RANKS, steps=STEPS, fault="sdc:2:1")
        report, group = self.replicas("sdc")
        # Every collective agreed (the corruption came after the all-reduce),
        # so only the replica check can see it: rank 2's optimizer step.
        self.assertEqual(report["collectives"]["status"], "identical",
                         json.dumps(report["collectives"])[:2000])
        self.assertEqual(group["status"], "diverged", json.dumps(group)[:3000])
        self.assertEqual(group["odd_ranks"], [2])
        self.assertEqual(report["odd_ranks"], [2])
        self.assert_replica_pivot(group, rank=2, step=1)
        text = self.daemon.cli("ranks", "sdc", "--replicas", ",".join(map(str, range(RANKS))),
                               check=False)
        self.assertEqual(text.returncode, 1, text.stdout + text.stderr)
        self.assertIn("disagreeing with the majority: rank(s) 2", text.stdout)

    def ddp_reference(self):
        """The clean DDP run "ddp", trained by the first test that needs it."""
        if not getattr(type(self), "ddp_trained", False):
            harness.train(self.site, self.daemon, "ddp", ranks=RANKS, steps=STEPS,
                          args=["--ddp"])
            type(self).ddp_trained = True
        return "ddp"

    def test_ddp_replicas(self):
        # Plain DDP: its reducer averages gradients in C++ during backward,
        # outside the collectives OpGuard wraps; the ranks' optimizer steps
        # are still what replicas must agree on.
        self.ddp_reference()
        harness.train(self.site, self.daemon, "ddp-again", ranks=RANKS, steps=STEPS,
                      args=["--ddp"])
        report = self.diff("ddp-again", reference="ddp")
        self.assertEqual(report["status"], "identical", json.dumps(report)[:2000])
        _, group = self.replicas("ddp")
        self.assertEqual(group["status"], "identical", json.dumps(group)[:3000])
        self.assertEqual(group["compared"], "replicated_ops")
        self.assertGreater(group["compared_ops"], 0)
        harness.train(self.site, self.daemon, "ddp-sdc", ranks=RANKS, steps=STEPS,
                      fault="sdc:2:2", args=["--ddp"])
        _, group = self.replicas("ddp-sdc")
        self.assertEqual(group["status"], "diverged", json.dumps(group)[:3000])
        self.assertEqual(group["odd_ranks"], [2])
        self.assert_replica_pivot(group, rank=2, step=2)

    def test_ddp_allreduce_carries_a_corrupted_weight_to_other_ranks(self):
        # DDP's reducer all-reduces gradient buckets from C++ during
        # backward. Rank 1's corrupted weight changes its gradients; the other
        # ranks diverge only through that all-reduce, so they are explained
        # by rank 1 and rank 1 alone is named.
        base = self.ddp_reference()
        harness.train(self.site, self.daemon, "ddp-wflip", ranks=RANKS, steps=STEPS,
                      fault="wflip:1:1", args=["--ddp"])
        report = self.diff("ddp-wflip", reference=base)
        first = self.assert_pivot(report, rank=1, step=1, op="aten::linear",
                                  line=harness.line_of(TRAIN, "return self.head(self.ln(x))"))
        self.assertFalse(first["inputs_equal"])
        explained = {e["rank"]: e["from_rank"] for e in report["explained"]}
        self.assertEqual(explained, {r: 1 for r in range(RANKS) if r != 1})
        # The reducer's all-reduces are recorded on the world communicator,
        # every rank completing each one, all agreeing on its outputs.
        collectives = self.daemon.cli_json("collectives", "ddp-wflip")
        self.assertEqual(collectives["mismatches"], [], json.dumps(collectives)[:3000])
        [world] = collectives["live"]
        self.assertEqual(world["name"], "world")
        completed = {r["rank"]: r["last_completed"] for r in world["ranks"]}
        entered = {r["rank"]: r["last_entered"] for r in world["ranks"]}
        self.assertEqual(sorted(completed), list(range(RANKS)))
        self.assertEqual(completed, entered)
        # More than the training loop's own broadcast per step.
        self.assertGreater(completed[0], 2 * STEPS, json.dumps(world))

    def test_desynchronized_collective(self):
        env = {"OPGUARD_FLUSH_TIMEOUT_MS": 20000}
        # The job fails as a real desync would: gloo's 10 s timeout in that
        # broadcast, not any other error.
        with self.assertRaisesRegex(AssertionError, harness.TIMEOUT_EXIT):
            harness.train(self.site, self.daemon, "desync", ranks=RANKS, steps=STEPS,
                          fault="desync:1:1", extra_env=env, timeout=180,
                          args=["--timeout", "10"])
        report = self.daemon.cli_json("collectives", "desync")
        self.assertEqual(report["status"], "diverged")
        self.assertEqual(len(report["desyncs"]), 1, json.dumps(report)[:3000])
        desync = report["desyncs"][0]
        self.assertEqual(desync["fields"], ["root"])
        self.assertEqual(desync["communicator_name"], "world")
        # Step 0's broadcast and all-reduces came first, in the same order on
        # every rank; step 1's broadcast is the desync.
        self.assertEqual(desync["seq"], 1 + TINYGPT_PARAMETERS, json.dumps(desync)[:3000])
        line = harness.line_of(TRAIN, "dist.broadcast(lr_scale")
        by_rank = {m["rank"]: m for m in desync["members"]}
        self.assertEqual(sorted(by_rank), list(range(RANKS)))
        for rank, member in by_rank.items():
            self.assertEqual((member["kind"], member["root"], member["count"], member["step"]),
                             ("broadcast", 1 if rank == 1 else 0, 1, 1), member)
            self.assertEqual(os.path.basename(member["site"]["file"]), "train_gpt.py")
            self.assertEqual(member["site"]["line"], line)


class TrustedMode(harness.DaemonTestCase):
    """OPGUARD_TRUSTED=default: GEMMs, elementwise ops and views recorded
    without fingerprints (in both runs), everything else as in full mode."""
    TRUSTED = {"OPGUARD_TRUSTED": "default"}
    diff = Faults.diff
    replicas = Faults.replicas
    assert_replica_pivot = Faults.assert_replica_pivot

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        harness.train(cls.site, cls.daemon, "ref", ranks=RANKS, steps=STEPS, extra_env=cls.TRUSTED)

    def test_clean_rerun_is_identical_and_trusted_ops_carry_no_fingerprints(self):
        harness.train(self.site, self.daemon, "ref-again", ranks=RANKS, steps=STEPS,
                      extra_env=self.TRUSTED)
        report = self.diff("ref-again")
        self.assertEqual(report["status"], "identical", json.dumps(report)[:2000])
        self.assertGreater(report["skipped_trusted"], 0)
        ops = self.daemon.trace("ref", 0)
        by_trust = {True: set(), False: set()}
        for op in ops:
            by_trust[op["trusted"]].add(op["name"])
            if op["trusted"]:
                self.assertFalse(any(int(t["fingerprint"], 16) for t in op["outputs"]), op)
        self.assertIn("aten::linear", by_trust[True])
        self.assertIn("aten::layer_norm", by_trust[False])
        # The optimizer's updates are fingerprinted even though aten::add_ is
        # trusted: replicas are compared on them.
        updates = [op for op in ops if op["name"] == "aten::add_" and op["site"]
                   and op["site"]["line"] == harness.line_of(TRAIN, "opt.step()")]
        self.assertTrue(updates)
        self.assertFalse(any(op["trusted"] for op in updates))

    def test_changed_computation_names_the_trusted_op_that_made_the_input(self):
        harness.train(self.site, self.daemon, "reorder", ranks=RANKS, steps=STEPS,
                      fault="reorder:2", extra_env=self.TRUSTED)
        report = self.diff("reorder")
        # Both sides of the reordered line (mul, matmul) are trusted: the
        # difference shows at the first fingerprinted op that reads the
        # scores, and the report names the trusted op that made them.
        first = Faults.assert_pivot(self, report, rank=2, step=0, op="aten::masked_fill",
                                    line=harness.line_of(TRAIN, "scores = scores.masked_fill"))
        self.assertFalse(first["inputs_equal"])
        self.assertIsNone(first["producer"])
        self.assertGreater(first["trusted_before"], 0)
        candidate = first["trusted_candidate"]
        self.assertIsNotNone(candidate, json.dumps(first)[:3000])
        self.assertTrue(candidate["trusted"])
        self.assertIn(candidate["op"], ("aten::mul", "aten::matmul"))
        self.assertEqual(candidate["site"]["line"], harness.line_of(TRAIN, "scores = torch.matmul(q, k"))
        text = self.daemon.cli("diff", "ref", "reorder", check=False).stdout
        self.assertIn(f"probably by trusted op #{candidate['op_index']} {candidate['op']}", text)

    def test_corrupted_reduced_gradient_on_one_replica(self):
        harness.train(self.site, self.daemon, "sdc", ranks=RANKS, steps=STEPS, fault="sdc:2:1",
                      extra_env=self.TRUSTED)
        report, group = self.replicas("sdc")
        self.assertEqual(group["status"], "diverged", json.dumps(group)[:3000])
        self.assertEqual(report["odd_ranks"], [2])
        self.assert_replica_pivot(group, rank=2, step=1)


class SdcMode(harness.DaemonTestCase):
    """OPGUARD_SDC=1, online SDC mode: no op is observed; after each
    optimizer step every parameter is recorded as replica state, which the
    data-parallel replicas must agree on."""
    SDC = {"OPGUARD_SDC": "1"}
    replicas = Faults.replicas

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        probe = subprocess.run([cls.site.python, "-c", "import torch.optim.optimizer as o; "
                                "print(hasattr(o, 'register_optimizer_step_post_hook'))"],
                               capture_output=True, text=True, timeout=120)
        if probe.stdout.strip() != "True":
            raise unittest.SkipTest("this torch has no optimizer step hooks (torch 2.0 and "
                                    "newer): OPGUARD_SDC=1 records in full mode there")
        harness.train(cls.site, cls.daemon, "ref", ranks=RANKS, steps=STEPS, extra_env=cls.SDC)

    def assert_replica_state_pivot(self, run, rank, step):
        """The odd replica is `rank`, first at `step`, on the output layer's
        weight (the last parameter: SGD's group 0, index 36) as
        opt.step() left it."""
        report, group = self.replicas(run)
        self.assertEqual(group["status"], "diverged", json.dumps(group)[:3000])
        self.assertEqual(group["odd_ranks"], [rank])
        self.assertEqual(report["odd_ranks"], [rank])
        first = group["first_divergence"]
        head = f"opguard::replica_state[SGD:0.{TINYGPT_PARAMETERS - 1}]"
        self.assertEqual((first["rank"], first["step"], first["op"]), (rank, step, head),
                         json.dumps(first)[:3000])
        self.assertEqual(first["differing_outputs"], [0])
        line = harness.line_of(TRAIN, "opt.step()")
        for side in ("reference", "suspect"):
            self.assertEqual(os.path.basename(first["site"][side]["file"]), "train_gpt.py")
            self.assertEqual(first["site"][side]["line"], line, first["site"])
        text = self.daemon.cli("ranks", run, "--replicas", ",".join(map(str, range(RANKS))),
                               check=False)
        self.assertEqual(text.returncode, 1, text.stdout + text.stderr)
        self.assertIn(f"disagreeing with the majority: rank(s) {rank}", text.stdout)
        self.assertIn("replica state differs → this copy changed since the replicas last agreed",
                      text.stdout)

    def test_clean_runs_record_only_replica_state_and_agree(self):
        harness.train(self.site, self.daemon, "ref-again", ranks=RANKS, steps=STEPS,
                      extra_env=self.SDC)
        report = self.daemon.cli_json("diff", "ref", "ref-again")
        self.assertEqual(report["status"], "identical", json.dumps(report)[:2000])
        report, group = self.replicas("ref")
        self.assertEqual(group["status"], "identical", json.dumps(group)[:3000])
        self.assertEqual(group["compared"], "replicated_ops")
        self.assertEqual(group["compared_ops"], STEPS * TINYGPT_PARAMETERS)
        ops = self.daemon.trace("ref", 0)
        self.assertEqual(len(ops), STEPS * TINYGPT_PARAMETERS)
        for i, op in enumerate(ops):
            index = i % TINYGPT_PARAMETERS
            self.assertEqual((op["name"], op["step"]),
                             (f"opguard::replica_state[SGD:0.{index}]", i // TINYGPT_PARAMETERS))
            self.assertEqual(op["inputs"], [])
            self.assertEqual(len(op["outputs"]), 1)  # plain SGD keeps no state
            self.assertNotEqual(int(op["outputs"][0]["fingerprint"], 16), 0)

    def test_corrupted_reduced_gradient_on_one_replica(self):
        # Rank 2's copy of a reduced gradient, corrupted after the all-reduce,
        # moves its output-layer weight in that step's update.
        harness.train(self.site, self.daemon, "sdc", ranks=RANKS, steps=STEPS, fault="sdc:2:1",
                      extra_env=self.SDC)
        self.assert_replica_state_pivot("sdc", rank=2, step=1)

    def test_corrupted_weight_memory_on_one_replica(self):
        # A bit flipped in rank 1's output-layer weight before step 1's
        # forward: the gradients are averaged, so only rank 1's weight differs
        # after the update.
        harness.train(self.site, self.daemon, "wflip", ranks=RANKS, steps=STEPS,
                      fault="wflip:1:1", extra_env=self.SDC)
        self.assert_replica_state_pivot("wflip", rank=1, step=1)


class Collectives(harness.DaemonTestCase):
    def run_job(self, script, run):
        """Runs a two-rank job (tests/e2e/SCRIPT) under OPGUARD=1 as run `run`;
        returns the folder it wrote its files to."""
        out = os.path.join(self.tmp, run)
        os.makedirs(out)
        env = self.site.env(OPGUARD=1, OPGUARD_RUN=run, OPGUARD_ENDPOINT=self.daemon.ingest)
        result = harness.run_ranks([self.site.python, os.path.join(harness.HERE, script), out],
                                   2, env, timeout=300)
        self.assertEqual(result.returncode, 0, f"{script}:\n{harness.failure_text(result)}")
        return out

    def lane0(self, run, rank, lane=0):
        return self.daemon.trace(run, rank, lane)

    def assert_completed(self, run, expected):
        """No desync, no output mismatch, and per communicator name the
        (rank, last entered seq, last completed seq) of each member."""
        report = self.daemon.cli_json("collectives", run)
        self.assertEqual(report["desyncs"], [], json.dumps(report)[:3000])
        self.assertEqual(report["mismatches"], [], json.dumps(report)[:3000])
        self.assertEqual(report["status"], "identical", json.dumps(report)[:3000])
        live = {c["name"]: [(r["rank"], r["last_entered"], r["last_completed"]) for r in c["ranks"]]
                for c in report["live"]}
        self.assertEqual(live, expected, json.dumps(report["live"]))

    def test_async_all_reduce_is_fingerprinted_after_completion(self):
        out = self.run_job("collective_async.py", "async")
        for rank in (0, 1):
            ops = self.lane0("async", rank)
            entered = [op for op in ops if op["name"] == "c10d::all_reduce [enter]"]
            self.assertEqual(len(entered), 1, [op["name"] for op in ops])
            launched = self.fingerprint(os.path.join(out, f"input-{rank}.bin"))
            final = self.fingerprint(os.path.join(out, f"final-{rank}.bin"))
            self.assertNotEqual(final, launched)
            self.assertEqual(entered[0]["inputs"][0]["tensor"]["fingerprint"], launched)
        # The ranks launched different bytes and completed with the same sum:
        # outputs fingerprinted at launch would disagree (a mismatch), outputs
        # taken after completion agree.
        self.assert_completed("async", {"world": [(0, 0, 0), (1, 0, 0)]})

    def test_op_reading_a_collectives_output_sees_the_reduced_bytes(self):
        # The collective's launch hashed its input into rank 0's cache; the
        # work then wrote the tensor on gloo's thread, behind the version
        # counter, and took its Completed record there. The next op reading
        # it on the training thread must hash what the collective wrote.
        out = self.run_job("collective_late_read.py", "late-read")
        launched = self.fingerprint(os.path.join(out, "input-0.bin"))
        final = self.fingerprint(os.path.join(out, "final-0.bin"))
        self.assertNotEqual(final, launched)
        ops = self.lane0("late-read", 0)
        sums = [op for op in ops if op["name"] == "aten::sum"]
        self.assertEqual(len(sums), 1, [op["name"] for op in ops])
        self.assertEqual(sums[0]["inputs"][0]["tensor"]["fingerprint"], final)
        self.assert_completed("late-read", {"world": [(0, 0, 0), (1, 0, 0)]})

    def test_output_written_right_after_a_future_wait_is_fingerprinted_as_completed(self):
        # Rank 0 writes each all-reduce's output as soon as the future's
        # wait() returns; rank 1 does not. Both must record the reduced
        # bytes as the Completed outputs: no mismatch.
        self.run_job("collective_future_wait.py", "future-wait")
        self.assert_completed("future-wait", {"world": [(0, 5, 5), (1, 5, 5)]})

    def test_async_collectives_waited_through_their_futures_are_completed(self):
        # Whichever path records all_to_all_single (torch 1.13: the opguard
        # package's Python wrapper), waiting through the work's future, or a
        # callback chained to it, must leave a Completed record, taken
        # before the op that reads the output.
        out = self.run_job("collective_wrapped_future.py", "wrapped-future")
        self.assert_completed("wrapped-future", {"world": [(0, 0, 0), (1, 0, 0)],
                                                 "pg[0,1]": [(0, 0, 0), (1, 0, 0)]})
        for rank in (0, 1):
            final = self.fingerprint(os.path.join(out, f"final-{rank}.bin"))
            neg, = [op for op in self.lane0("wrapped-future", rank) if op["name"] == "aten::neg"]
            self.assertEqual(neg["inputs"][0]["tensor"]["fingerprint"], final)

    def test_destroyed_process_groups_are_destroyed(self):
        # OpGuard learns both groups from their collectives and must not keep
        # them alive: a group outliving destroy_process_group keeps its
        # backend's threads (and, on GPUs, its communicators) to the end of
        # the process, where a late callback can abort it.
        out = self.run_job("group_lifetime.py", "lifetime")
        self.assert_completed("lifetime", {"world": [(0, 1, 1), (1, 1, 1)],
                                           "pg[0,1]": [(0, 0, 0), (1, 0, 0)]})
        for rank in (0, 1):
            with open(os.path.join(out, f"threads-{rank}.json")) as f:
                counts = json.load(f)
            self.assertLess(counts["after_subgroup"], counts["both_groups"], counts)
            self.assertEqual(counts["after_all"], counts["before"], counts)

    def test_dataloader_workers_and_fetching_are_not_recorded(self):
        # Workers started with spawn inherit OPGUARD=1 and the rank (RANK is
        # exported once the process group exists); forked ones inherit the
        # recording process itself. Neither may record under the rank.
        out = self.run_job("dataloader_workers.py", "loader")
        for rank in (0, 1):
            with open(os.path.join(out, f"rank-{rank}.json")) as f:
                trainer = json.load(f)
            self.assertTrue(trainer["enabled"], trainer)
            for method in ("spawn", "fork"):
                seen = [name for name in os.listdir(out)
                        if name.startswith(f"worker-{method}-{rank}-")]
                self.assertEqual(len(seen), 1, os.listdir(out))
                with open(os.path.join(out, seen[0])) as f:
                    worker = json.load(f)
                self.assertFalse(worker["enabled"], (method, worker))
                self.assertEqual(worker["recorder"], f"{trainer['pid']}:{rank}", worker)
        self.assert_completed("loader", {"world": [(0, 0, 0), (1, 0, 0)]})
        # The DataLoader's own work is not in the rank's lane either: no
        # indexing and collation (the loader without workers runs them here),
        # no rebuilding of batches received from workers (in arrival order,
        # which differs from run to run). Only the training code's sums.
        names = [op["name"] for op in self.lane0("loader", 0)]
        for internal in ("aten::select", "aten::stack", "aten::set_"):
            self.assertNotIn(internal, names)
        self.assertEqual(names.count("aten::sum"), 6, names)

    def test_future_callback_ops_take_their_lane_from_registration(self):
        # Rank 0's first callback runs on gloo's thread, its second inline
        # on the training thread; per-thread lanes would split them (and
        # number gloo's thread by first use). The two Python futures complete
        # in opposite orders on the two ranks: one lane for all callbacks
        # would order their ops differently. The k-th callback the training
        # thread registers in the step records on lane 3072 + k.
        self.run_job("collective_callbacks.py", "callbacks")
        script = os.path.join(harness.HERE, "collective_callbacks.py")
        for rank in (0, 1):
            lanes = {lane: [op["name"] for op in self.lane0("callbacks", rank, lane=lane)]
                     for lane in range(3072, 3077)}
            self.assertEqual(lanes, {3072: ["aten::neg"], 3073: ["aten::sqrt"],
                                     3074: ["aten::exp"], 3075: ["aten::abs"], 3076: []})
            neg, = self.lane0("callbacks", rank, lane=3072)
            self.assertEqual(neg["site"]["line"], harness.line_of(script, ".neg()"))
            training = [op["name"] for op in self.lane0("callbacks", rank)]
            for name in ("aten::neg", "aten::sqrt", "aten::exp", "aten::abs"):
                self.assertNotIn(name, training)
            self.assertEqual(self.lane0("callbacks", rank, lane=2), [])

    def test_memory_filled_outside_ops_is_hashed_as_filled(self):
        # torch.LongTensor([n]) writes n into aten::empty's memory in C++, with
        # no op and no version bump: the next op must see n, not the garbage
        # hashed at allocation. Rank 1's broadcast buffer, fresh from
        # torch.empty, is garbage at launch: its [enter] boundary is flagged,
        # never evidence, and the op after it sees the broadcast bytes.
        out = self.run_job("collective_fresh_buffers.py", "fresh")
        broadcast_bytes = self.fingerprint(os.path.join(out, "buf-0.bin"), shape="64")
        for rank in (0, 1):
            ops = self.lane0("fresh", rank)
            by_name = {op["name"]: op for op in ops}
            count = self.fingerprint(os.path.join(out, f"count-{rank}.bin"), "int64", "1")
            self.assertEqual(by_name["aten::add"]["inputs"][0]["tensor"]["fingerprint"], count)
            enter = by_name["c10d::broadcast [enter]"]
            self.assertEqual(enter["nondeterministic"], rank == 1, enter)
            neg = by_name["aten::neg"]
            self.assertFalse(neg["nondeterministic"], neg)
            self.assertEqual(neg["inputs"][0]["tensor"]["fingerprint"], broadcast_bytes)

    def test_backend_worker_ops_are_not_recorded(self):
        # Gloo's two workers take collectives in turn and run aten ops of
        # their own (all_gather's unflatten copies): recorded, they filled
        # lanes 2 and 3 in an order that changed from run to run. Only the
        # training thread's lane holds ops; the all-gathers are collectives.
        self.run_job("collective_backend_ops.py", "backend-ops")
        for rank in (0, 1):
            names = [op["name"] for op in self.lane0("backend-ops", rank)]
            self.assertIn("aten::cat", names)
            for lane in (1, 2, 3):
                self.assertEqual(self.lane0("backend-ops", rank, lane=lane), [], lane)
        report = self.daemon.cli_json("collectives", "backend-ops")
        self.assertEqual(report["mismatches"], [], json.dumps(report)[:3000])
        self.assertEqual(report["status"], "identical", json.dumps(report)[:3000])

    def test_every_collective_kind_is_recorded_on_its_communicator(self):
        out = self.run_job("collective_kinds.py", "kinds")
        calls = {}
        for rank in (0, 1):
            with open(os.path.join(out, f"kinds-{rank}.json")) as f:
                calls[rank] = json.load(f)
            entered = [op["name"] for op in self.lane0("kinds", rank)
                       if op["name"].endswith(" [enter]")]
            self.assertEqual(entered, [f"c10d::{call} [enter]" for call in calls[rank]])
        self.assertIn("send", calls[0])
        self.assertIn("recv", calls[1])
        # The last two calls are on subgroups: both ranks, then one rank each.
        # The world's last collective is the point-to-point one, entered but
        # never completed (gloo's send/recv works have no future).
        last = len(calls[0]) - 3
        self.assert_completed("kinds", {"world": [(0, last, last - 1), (1, last, last - 1)],
                                        "pg[0,1]": [(0, 0, 0), (1, 0, 0)],
                                        "pg[0]": [(0, 0, 0)], "pg[1]": [(1, 0, 0)]})

    def fingerprint(self, path, dtype="float32", shape="4096"):
        result = subprocess.run([os.environ["OPGUARD_CLI"], "fingerprint", "--dtype", dtype,
                                 "--shape", shape, path], capture_output=True, text=True,
                                check=True)
        return result.stdout.strip()


if __name__ == "__main__":
    unittest.main()
