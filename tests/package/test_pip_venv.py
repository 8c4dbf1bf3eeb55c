"""The pip route as a user takes it: a fresh venv that has torch from PyPI,
`pip install` of the repaired wheel (wheel_build: scripts/build-wheel.sh), then `OPGUARD=1 torchrun ...` records with no code
change, `opguard doctor` passes, and a torch the package was not built for
gets one warning line and an untouched training.

torch comes from the shared venv of scripts/torch-venv.sh 2.11.0: the fresh
venv names its site-packages in a .pth instead of installing the 4.7 GB again.
Everything opguard is installed by pip into the fresh venv itself. The wheel
is the one test_wheel installs (built once, in OPGUARD_PACKAGE_WORK/wheel)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "e2e"))
import harness  # noqa: E402
import wheel_build  # noqa: E402

TORCH = wheel_build.TORCH
WORK = os.path.join(os.environ.get("OPGUARD_PACKAGE_WORK", tempfile.gettempdir()), "pip-venv")


def run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{cmd[:3]} failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def site_packages(python):
    return run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()


class PipVenv(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        wheel, shared = wheel_build.repaired_wheel()
        cls.venv = os.path.join(WORK, "venv")
        shutil.rmtree(cls.venv, ignore_errors=True)
        run(["/usr/bin/python3", "-m", "venv", cls.venv])
        cls.python = os.path.join(cls.venv, "bin", "python")
        cls.site = site_packages(cls.python)
        with open(os.path.join(cls.site, "_shared_torch.pth"), "w") as f:
            f.write(site_packages(os.path.join(shared, "bin", "python")) + "\n")
        run([cls.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", wheel], timeout=600)
        cls.tmp = tempfile.mkdtemp(prefix="opguard-pip-")
        cls.daemon = harness.Daemon(cls.tmp)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def env(self, **extra):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OPGUARD", "PYTHON")) and k not in ("RANK", "WORLD_SIZE")}
        env.update(OMP_NUM_THREADS="1", OPGUARD_ENDPOINT=self.daemon.ingest)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def test_installed_into_the_venv(self):
        for path in ("opguard/__init__.py", "opguard/lib/libopguard_torch.so",
                     "opguard/lib/libopguard_shim.so", "opguard-autoload.pth"):
            self.assertTrue(os.path.exists(os.path.join(self.site, path)), path)
        versions = run([self.python, "-c", "import torch, opguard._build_info as b; "
                        "print(torch.__version__, b.TORCH_VERSION)"]).stdout.split()
        self.assertTrue(versions[0].startswith(TORCH), versions)
        self.assertEqual(versions[0], versions[1])  # built against this venv's torch

    def test_torchrun_records_with_no_code_change(self):
        result = run([self.python, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                      "--master_port", str(21000 + os.getpid() % 20000),
                      os.path.join(HERE, "tiny_train.py")],
                     env=self.env(OPGUARD=1, OPGUARD_RUN="pip-venv"), timeout=300)
        self.assertIn("rank 0 step 1", result.stdout)
        self.assertNotIn("opguard-torch warning", result.stderr)
        run_info = next(r for r in self.daemon.cli_json("runs")["runs"] if r["name"] == "pip-venv")
        ranks = run_info["ranks"]
        self.assertEqual(sorted(r["rank"] for r in ranks), [0, 1], run_info)
        for rank in ranks:
            self.assertGreater(rank["ops"], 20, rank)
            self.assertEqual(rank["steps"], 2, rank)
        self.assertIn(TORCH, json.dumps(run_info))  # the torch version is recorded

    def test_doctor_passes_in_the_venv(self):
        result = subprocess.run([os.environ["OPGUARD_CLI"], "doctor", "--python", self.python,
                                 "--daemon", self.daemon.query], env=self.env(),
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn(f"the adapter loads against torch {TORCH}", result.stdout)

    def test_another_torch_gets_one_line_and_trains(self):
        # The package as installed, beside Debian's python3 and its torch 1.13.
        userbase = os.path.join(self.tmp, "userbase")
        user_site = os.path.join(userbase, "lib", "python3.11", "site-packages")
        os.makedirs(user_site, exist_ok=True)
        shutil.copytree(os.path.join(self.site, "opguard"), os.path.join(user_site, "opguard"),
                        dirs_exist_ok=True)
        shutil.copy(os.path.join(self.site, "opguard-autoload.pth"), user_site)
        env = self.env(PYTHONUSERBASE=userbase)
        result = run(["/usr/bin/python3", "-c", "import torch; print('trained', torch.ones(2).add(1).sum().item(), "
                      "torch.__version__)"], env=dict(env, OPGUARD="1", RANK="0", WORLD_SIZE="1"))
        other = result.stdout.split()[-1]
        self.assertTrue(result.stdout.startswith("trained 4.0"), result.stdout)
        self.assertEqual(result.stderr.splitlines(), [
            f"opguard-torch warning: this opguard was built for torch {TORCH}"
            f"{self.built_local()}, but this Python runs torch {other}; rebuild it against this "
            "torch: pip install --force-reinstall ./python (from an OpGuard checkout); "
            "training continues without recording"])
        doctor = subprocess.run([os.environ["OPGUARD_CLI"], "doctor", "--python", "/usr/bin/python3",
                                 "--daemon", self.daemon.query], env=env,
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(doctor.returncode, 1, doctor.stdout + doctor.stderr)
        self.assertEqual(len(doctor.stderr.splitlines()), 1, doctor.stderr)
        self.assertIn(f"[2/4] the adapter does not load against torch {other}: this opguard was "
                      f"built for torch {TORCH}", doctor.stderr)

    def built_local(self):
        """The local part of the venv torch's version (+cu130, +cpu), if any."""
        version = run([self.python, "-c", "import opguard._build_info as b; print(b.TORCH_VERSION)"])
        return version.stdout.strip()[len(TORCH):]


if __name__ == "__main__":
    unittest.main()
