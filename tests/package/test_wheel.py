"""The wheel route as a user without root or a build gets it (README's first
block, docs/install.md): scripts/build-wheel.sh builds the wheel against the
shared torch 2.11.0 venv and repairs it (auditwheel); a fresh venv that sees
that torch and nothing else of the project installs it with pip alone; then,
as another local user whose PATH and LD_LIBRARY_PATH hold no build folder:

- the venv's `opguard` and `opguardd` run, their libraries inside the wheel;
- two 2-rank torchrun recordings under OPGUARD=1 with no daemon started by
  hand, and `opguard diff` naming the divergence planted in the second; the
  daemon was started by a rank, is the user's, and is gone after its idle time;
- eight ranks starting at once start one daemon;
- a daemon killed mid-run is started again by the rank that needs it, and the
  records it missed are a gap of the run.

Without root the commands run as this user, with the same clean environment
(the skip of the second user is listed in tests/expected-skips.txt)."""
import glob
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

import users
import wheel_build

HERE = os.path.dirname(os.path.abspath(__file__))
NO_USER = users.can_create()
# Libraries the wheel must carry: none may come from the machine.
VENDORED = ("zmq", "rocksdb", "spdlog", "fmt", "sodium", "systemd", "lz4", "zstd", "snappy",
            "xxhash", "pgm", "norm", "gssapi", "krb5", "bz2", "gflags", "uring", "tbb", "jemalloc")
RESTART_PROGRAM = r"""
import os, signal, socket, time, torch, opguard
lock = os.environ["OPGUARD_USER_DAEMON"]
ingest = os.environ["OPGUARD_ENDPOINT"][len("ipc://"):]
def daemon_pid():
    with open(lock) as f:
        text = f.read().strip()
    return int(text) if text else 0
def answers():
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(ingest)
            return True
        except OSError:
            return False
x = torch.ones(64)
for _ in range(200):
    x = x.add(1)
old = daemon_pid()
os.kill(old, signal.SIGSTOP)  # alive but deaf: the shim's 1 MB fill up, records drop
for _ in range(2_000_000):
    x = x.add(1)
    if opguard.counters()["records_dropped"]:
        break
dropped = opguard.counters()["records_dropped"]
os.kill(old, signal.SIGKILL)
new = old
for _ in range(1200):  # bounded: 120 s for the watcher to start another and say so
    x = x.add(1)
    time.sleep(0.1)
    new = daemon_pid()
    if new not in (0, old) and answers() and opguard.counters()["daemon_restarts"] == 1:
        break
for _ in range(200):
    x = x.add(1)
print("old", old, "new", new, "dropped", dropped, flush=True)
"""


def run(cmd, **kwargs):
    result = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{cmd[:4]} failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def site_packages(python):
    return run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]).stdout.strip()


class Wheel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.wheel, shared = wheel_build.repaired_wheel()
        cls.root = tempfile.mkdtemp(prefix="opguard-wheel-")
        os.chmod(cls.root, 0o755)  # the other user reads the venv
        cls.venv = os.path.join(cls.root, "venv")
        run(["/usr/bin/python3", "-m", "venv", cls.venv])
        cls.python = os.path.join(cls.venv, "bin", "python")
        cls.site = site_packages(cls.python)
        with open(os.path.join(cls.site, "_shared_torch.pth"), "w") as f:
            f.write(site_packages(os.path.join(shared, "bin", "python")) + "\n")
        run([cls.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", cls.wheel], timeout=600)
        cls.user = None if NO_USER else users.LocalUser("ogt-wheel")
        cls.homes = 0

    @classmethod
    def tearDownClass(cls):
        if cls.user:
            cls.user.remove()  # its daemons go with it
        shutil.rmtree(cls.root, ignore_errors=True)

    def new_home(self):
        """A home of the user's own, with an XDG runtime dir: a machine where
        it has never recorded."""
        type(self).homes += 1
        home = os.path.join(self.root, f"home{self.homes}")
        os.makedirs(os.path.join(home, "run"), mode=0o700)
        os.chmod(home, 0o700)
        if self.user:
            self.user.own(home)
            self.user.own(os.path.join(home, "run"))
        return home

    def as_user(self, cmd, home, timeout=600, check=True, **extra):
        """`cmd` as the other user, with only this environment: the venv first
        on PATH, no LD_LIBRARY_PATH, no build folder anywhere."""
        env = {"HOME": home, "PATH": f"{self.venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "XDG_RUNTIME_DIR": os.path.join(home, "run"), "OMP_NUM_THREADS": "1"}
        env.update({k: str(v) for k, v in extra.items()})
        prefix = ["runuser", "-u", self.user.name, "--"] if self.user else []
        full = prefix + ["env", "-i"] + [f"{k}={v}" for k, v in env.items()] + list(cmd)
        if not check:
            return subprocess.run(full, capture_output=True, text=True, timeout=timeout, cwd=home)
        return run(full, timeout=timeout, cwd=home)

    def popen_as_user(self, cmd, home, **extra):
        env = {"HOME": home, "PATH": f"{self.venv}/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
               "XDG_RUNTIME_DIR": os.path.join(home, "run"), "OMP_NUM_THREADS": "1"}
        env.update({k: str(v) for k, v in extra.items()})
        prefix = ["runuser", "-u", self.user.name, "--"] if self.user else []
        return subprocess.Popen(prefix + ["env", "-i"] + [f"{k}={v}" for k, v in env.items()] + list(cmd),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=home)

    def state(self, home, name):
        return os.path.join(home, ".local", "state", "opguard", name)

    def daemon_log(self, home):
        with open(self.state(home, "opguardd.log")) as f:
            return f.read()

    def daemon_pid(self, home):
        with open(self.state(home, "daemon.lock")) as f:
            return int(f.read().strip())

    def runs(self, home):
        return json.loads(self.as_user(["opguard", "runs", "--json"], home).stdout)["runs"]

    def torchrun(self, home, run_name, **extra):
        return self.as_user(["python", "-m", "torch.distributed.run", "--nproc_per_node", "2",
                             "--master_port", str(22000 + (os.getpid() + self.homes * 7 + len(run_name)) % 20000),
                             os.path.join(HERE, "tiny_train.py")], home, timeout=600,
                            OPGUARD="1", OPGUARD_RUN=run_name, **extra)

    def wait_gone(self, pid, seconds):
        for _ in range(seconds * 10):  # bounded
            if not os.path.exists(f"/proc/{pid}"):
                return True
            time.sleep(0.1)
        return False

    # ---- tests ------------------------------------------------------------------

    def test_commands_run_from_the_wheel_alone(self):
        self.assertIn("manylinux", os.path.basename(self.wheel))
        home = self.new_home()
        self.assertIn("opguard", self.as_user(["opguard", "--help"], home).stdout)
        self.assertIn("--local", self.as_user(["opguardd", "--help"], home).stdout)
        elves = glob.glob(os.path.join(self.site, "opguard", "bin", "*")) + \
            glob.glob(os.path.join(self.site, "opguard", "lib", "libopguard_shim.so"))
        self.assertEqual(len(elves), 3, elves)
        for elf in elves:
            ldd = run(["env", "-i", "PATH=/usr/bin:/bin", "ldd", elf]).stdout
            self.assertNotIn("not found", ldd, elf)
            for line in ldd.splitlines():
                name, _, where = line.strip().partition(" => ")
                if any(v in name for v in VENDORED):
                    self.assertTrue(where.startswith(self.site), f"{elf}: {line}")

    def stop_at_cleanup(self, home):
        """The daemon the test started stops with the test (its idle time
        is long, so that one daemon serves every step however slow they are)."""
        def stop():
            try:
                os.kill(self.daemon_pid(home), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        self.addCleanup(stop)

    def test_readme_two_recordings_and_a_diff_with_no_daemon_started_by_hand(self):
        home = self.new_home()
        self.stop_at_cleanup(home)
        self.assertFalse(os.path.exists(self.state(home, "daemon.lock")))
        first = self.torchrun(home, "before", OPGUARD_DAEMON_IDLE=600)
        self.assertIn("rank 1 step 1", first.stdout)
        self.assertNotIn("opguard-torch warning", first.stderr)
        self.torchrun(home, "after", OPGUARD_DAEMON_IDLE=600, PLANT_DIVERGENCE="1:1")
        pid = self.daemon_pid(home)
        with open(f"/proc/{pid}/status") as f:
            uid = next(line.split()[1] for line in f if line.startswith("Uid:"))
        self.assertEqual(int(uid), self.user.uid if self.user else os.geteuid())

        diff = self.as_user(["opguard", "diff", "before", "after", "--json"], home, check=False)
        self.assertEqual(diff.returncode, 1, diff.stdout + diff.stderr)
        report = json.loads(diff.stdout)
        first_divergence = report["first_divergence"]
        self.assertEqual((first_divergence["rank"], first_divergence["step"]), (1, 1), report)
        with open(os.path.join(HERE, "tiny_train.py")) as f:
            line = next(n for n, text in enumerate(f, 1) if "PLANTED_LINE" in text)
        self.assertEqual(first_divergence["site"]["suspect"]["line"], line, first_divergence)
        text = self.as_user(["opguard", "diff", "before", "after"], home, check=False).stdout
        self.assertIn("tiny_train.py", text)

        doctor = self.as_user(["opguard", "doctor"], home, check=False)
        self.assertEqual(doctor.returncode, 0, doctor.stdout + doctor.stderr)
        self.assertIn("your own daemon", doctor.stdout)
        log = self.daemon_log(home)
        self.assertEqual(log.count(" ready: "), 1, log)  # the first rank's daemon served it all

    def test_the_daemon_is_gone_after_its_idle_time_and_opguard_starts_it_again(self):
        home = self.new_home()
        self.stop_at_cleanup(home)
        self.as_user(["python", "-c", "import torch; torch.ones(4).add(1)"], home, OPGUARD=1,
                     OPGUARD_RUN="idle", RANK=0, WORLD_SIZE=1, OPGUARD_DAEMON_IDLE=2)
        pid = self.daemon_pid(home)
        self.assertTrue(self.wait_gone(pid, 120), "the daemon outlived its idle time")
        self.assertIn("no batch or query for 2 s (idle_exit): exiting", self.daemon_log(home))
        started = self.daemon_log(home).count(" ready: ")
        self.assertIn("idle", {r["name"] for r in self.runs(home)})  # the same store
        self.assertEqual(self.daemon_log(home).count(" ready: "), started + 1)
        self.assertNotEqual(self.daemon_pid(home), pid)

    def test_an_explicit_endpoint_is_never_second_guessed(self):
        home = self.new_home()
        nowhere = f"ipc://{home}/nowhere.sock"
        result = self.as_user(["python", "-c", "import torch, opguard; torch.ones(4).add(1); "
                               "print(opguard.enabled(), opguard.counters()['records_enqueued'] > 0)"],
                              home, OPGUARD=1, OPGUARD_ENDPOINT=nowhere, RANK=0, WORLD_SIZE=1,
                              OPGUARD_FLUSH_TIMEOUT_MS=300)
        self.assertEqual(result.stdout.split(), ["True", "True"])  # recording, to that endpoint alone
        self.assertFalse(os.path.exists(self.state(home, "")), "a daemon of its own was started")

    def test_eight_ranks_racing_start_one_daemon(self):
        home = self.new_home()
        self.stop_at_cleanup(home)
        program = "import torch; torch.ones(8).add(1).sum()"
        procs = [self.popen_as_user(["python", "-c", program], home, OPGUARD=1, OPGUARD_RUN="race",
                                    RANK=rank, WORLD_SIZE=8, OPGUARD_DAEMON_IDLE=600)
                 for rank in range(8)]
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            self.assertEqual(proc.returncode, 0, err)
            self.assertNotIn("opguard-torch warning", err)
        log = self.daemon_log(home)
        self.assertEqual(log.count(" ready: "), 1, log)
        self.assertNotIn("another opguardd", log)
        race = next(r for r in self.runs(home) if r["name"] == "race")
        self.assertEqual(sorted(r["rank"] for r in race["ranks"]), list(range(8)), race)

    def test_a_killed_daemon_is_started_again_and_the_gap_reported(self):
        home = self.new_home()
        self.stop_at_cleanup(home)
        result = self.as_user(["python", "-c", RESTART_PROGRAM], home, timeout=600, OPGUARD=1,
                              OPGUARD_RUN="restart", RANK=0, WORLD_SIZE=1, OPGUARD_BUFFER_MB=1,
                              OPGUARD_DAEMON_IDLE=600)
        words = result.stdout.split()
        old, new, dropped = int(words[1]), int(words[3]), int(words[5])
        self.assertGreater(dropped, 0)
        self.assertNotIn(new, (0, old), result.stdout)
        self.assertIn(f"started it again (pid {new}); records it missed are reported as gaps",
                      result.stderr)
        self.assertEqual(self.daemon_log(home).count(" ready: "), 2)
        rank = next(r for r in self.runs(home) if r["name"] == "restart")["ranks"][0]
        self.assertGreater(rank["gaps"], 0, rank)
        self.assertGreater(rank["ops"], 400, rank)  # before and after the gap


if __name__ == "__main__":
    unittest.main()
