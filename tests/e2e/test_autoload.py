"""OPGUARD=1 records PyTorch programs with no code change, and only them."""
import json
import subprocess
import tempfile
import unittest

import harness

PROBE = """
import json, sys
{body}
maps = open('/proc/self/maps').read()
print(json.dumps({{
    'modules': sorted(m for m in sys.modules if m == 'opguard' or m.startswith('opguard.')),
    'libs': sorted({{l.split('/')[-1] for l in maps.splitlines() if 'libopguard' in l}}),
    'torch': 'torch' in sys.modules,
}}))
"""


class AutoloadWithoutDaemon(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="opguard-autoload-")
        cls.site = harness.UserSite(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def probe(self, body, **env):
        result = subprocess.run([self.site.python, "-c", PROBE.format(body=body)],
                                env=self.site.env(**env), capture_output=True, text=True,
                                timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr

    def test_unset_loads_nothing_even_with_torch(self):
        state, stderr = self.probe("import torch; torch.ones(2).add(1)")
        self.assertEqual(state["modules"], [])
        self.assertEqual(state["libs"], [])
        self.assertEqual(stderr, "")

    def test_zero_loads_nothing(self):
        state, _ = self.probe("import torch", OPGUARD=0)
        self.assertEqual(state["modules"], [])
        self.assertEqual(state["libs"], [])

    def test_enabled_process_without_torch_loads_no_library(self):
        state, stderr = self.probe("pass", OPGUARD=1)
        self.assertFalse(state["torch"])
        self.assertEqual(state["libs"], [])  # only the pure-Python hook
        self.assertEqual(stderr, "")

    def test_enabled_with_rank_loads_adapter_on_torch_import(self):
        state, _ = self.probe("import torch; torch.ones(2).add(1)", OPGUARD=1, RANK=0,
                              WORLD_SIZE=1, OPGUARD_ENDPOINT="ipc:///nonexistent/og.sock",
                              OPGUARD_FLUSH_TIMEOUT_MS=0)
        self.assertIn("libopguard_torch.so", state["libs"])
        self.assertIn("libopguard_shim.so", state["libs"])

    def test_bad_depth_turns_recording_off_with_one_line(self):
        result = subprocess.run(
            [self.site.python, "-c", "import torch, opguard; torch.ones(1).add(1); "
             "print(opguard.enabled())"],
            env=self.site.env(OPGUARD=1, RANK=0, WORLD_SIZE=1, OPGUARD_DEPTH="deep",
                              OPGUARD_ENDPOINT="ipc:///nonexistent/og.sock",
                              OPGUARD_FLUSH_TIMEOUT_MS=0),
            capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "False")
        warnings = [l for l in result.stderr.splitlines() if "OPGUARD_DEPTH" in l]
        self.assertEqual(len(warnings), 1, result.stderr)


class AutoloadLaunchers(harness.DaemonTestCase):
    """torchrun and torch.multiprocessing.spawn ranks are recorded with their
    own rank identity; the launcher processes are not."""

    def ranks_of(self, run):
        runs = {r["name"]: r for r in self.daemon.cli_json("runs")["runs"]}
        self.assertIn(run, runs)
        return runs[run]

    def check_run(self, run, ranks):
        info = self.ranks_of(run)
        self.assertEqual(info["world_size"], ranks)
        self.assertEqual(sorted(r["rank"] for r in info["ranks"]), list(range(ranks)))
        # Rank 0 also prints the loss (aten::item), so op counts differ by rank;
        # the collectives every rank takes part in must be the same.
        self.assertEqual(len({r["collectives"] for r in info["ranks"]}), 1, info)
        for r in info["ranks"]:
            self.assertGreater(r["ops"], 100, r)
            self.assertEqual(r["steps"], 2, r)
            self.assertEqual(r["gaps"], 0, r)
            self.assertTrue(r["ended"], r)

    DETERMINISM_PROBE = (
        "import json, os, sys, torch\n"
        "torch.ones(2).add(1)\n"
        "print(json.dumps({'deterministic': torch.are_deterministic_algorithms_enabled(),\n"
        "                  'warn_only': torch.is_deterministic_algorithms_warn_only_enabled(),\n"
        "                  'inductor_imported': 'torch._inductor.config' in sys.modules,\n"
        "                  'env': {k: os.environ.get(k) for k in ('CUBLAS_WORKSPACE_CONFIG',\n"
        "                          'NCCL_ALGO', 'TORCHINDUCTOR_DETERMINISTIC')}}))\n")

    def probe_determinism(self, run, **env):
        probe_env = self.site.env(OPGUARD=1, OPGUARD_RUN=run, OPGUARD_ENDPOINT=self.daemon.ingest,
                                  RANK=0, WORLD_SIZE=1, **env)
        # The trainings' environment sets inductor's switch as OpGuard would
        # (harness.UserSite.env); the probe shows what OpGuard itself sets.
        probe_env.pop("TORCHINDUCTOR_DETERMINISTIC", None)
        result = subprocess.run([self.site.python, "-c", self.DETERMINISM_PROBE], env=probe_env,
                                capture_output=True, text=True, timeout=120)
        self.assertEqual(result.returncode, 0, result.stderr)
        return json.loads(result.stdout.strip().splitlines()[-1]), self.ranks_of(run)

    def test_determinism_is_applied_and_recorded(self):
        state, info = self.probe_determinism("det-on")
        self.assertTrue(state["deterministic"], state)
        self.assertTrue(state["warn_only"], state)
        self.assertEqual(state["env"], {"CUBLAS_WORKSPACE_CONFIG": ":16:8", "NCCL_ALGO": "Ring",
                                        "TORCHINDUCTOR_DETERMINISTIC": "1"})
        # Enabling inside `import torch` does not import torch.compile's
        # inductor (slow, and on torch 2.14 it kept process groups alive).
        self.assertFalse(state["inductor_imported"])
        det = info["determinism"]
        self.assertEqual(det["mode"], "on", det)
        self.assertEqual(det["torch.use_deterministic_algorithms"], "True (warn_only)", det)
        self.assertEqual(det["TORCHINDUCTOR_DETERMINISTIC"], "1", det)
        # A value the user set wins, and is what the metadata records.
        state, info = self.probe_determinism("det-user", NCCL_ALGO="Tree")
        self.assertEqual(state["env"]["NCCL_ALGO"], "Tree")
        self.assertEqual(info["determinism"]["NCCL_ALGO"], "Tree")

    def test_determinism_off_leaves_the_job_alone(self):
        state, info = self.probe_determinism("det-off", OPGUARD_DETERMINISM="off")
        self.assertFalse(state["deterministic"], state)
        self.assertEqual(state["env"], {"CUBLAS_WORKSPACE_CONFIG": None, "NCCL_ALGO": None,
                                        "TORCHINDUCTOR_DETERMINISTIC": None})
        self.assertEqual(info["determinism"], {"mode": "off"})

    def test_spawn(self):
        harness.train(self.site, self.daemon, "spawn-run", ranks=2, steps=2, launcher="spawn")
        self.check_run("spawn-run", 2)

    def test_torchrun(self):
        # torchrun's static rendezvous opens its TCPStore with torch's default
        # backend, libuv from torch 2.4 on, and no switch reaches it; a torch
        # built without libuv (Debian's 2.x) cannot start torchrun at all.
        probe = subprocess.run(
            [self.site.python, "-c", "import datetime, torch.distributed as d\n"
             "try: d.TCPStore('127.0.0.1', 0, 1, True, datetime.timedelta(seconds=10))\n"
             "except Exception as e: print(type(e).__name__, e)"],
            env=self.site.env(), capture_output=True, text=True, timeout=120)
        if "libuv" in probe.stdout:
            self.skipTest("this torch's torchrun cannot start: " + probe.stdout.strip())
        harness.train(self.site, self.daemon, "torchrun-run", ranks=2, steps=2,
                      launcher="torchrun")
        self.check_run("torchrun-run", 2)


if __name__ == "__main__":
    unittest.main()
