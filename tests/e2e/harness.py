"""Shared pieces of the end-to-end tests: a real opguardd in a temporary
directory, the real `opguard` CLI, and real multi-rank PyTorch training with
the `opguard` package activated the way users activate it (the .pth hook in a
site directory, OPGUARD=1 in the environment).

Paths come from ctest's environment (tests/e2e/CMakeLists.txt):
OPGUARDD, OPGUARD_CLI, OPGUARD_PYTHON_STAGE (and OPGUARD_TEST_PYTHON).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

# How a job fails when a collective's peers never come: the launcher reports
# the first rank to fail, by gloo's timeout or, when a peer already left on
# its own timeout, by the connection it closed; which comes first is timing,
# and so is the call it fails in (a rank whose side of the desynchronized
# broadcast completed goes on to the next collective and waits there).
TIMEOUT_EXIT = r"(Timed out|Connection closed by peer)"

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "train_gpt.py")
# Debian's interpreter, the one with torch; OPGUARD_TEST_PYTHON names another:
# a venv's with a torch from pip (scripts/torch-suite.sh), or a newer Debian's
# in a chroot (scripts/torch2-check.sh). Trainings run UserSite.python.
PYTHON = os.environ.get("OPGUARD_TEST_PYTHON") or "/usr/bin/python3"


def _required(name):
    value = os.environ.get(name)
    if not value:
        raise unittest.SkipTest(f"{name} is not set (run through ctest)")
    return value


class UserSite:
    """The installed layout of the opguard package and opguard-autoload.pth,
    in a site directory of its own, and the interpreter that trains with it
    (`python`). With Debian's Python: a user site directory (PYTHONUSERBASE
    points Python at it). With a virtual environment's Python (a torch from
    pip; venvs read no user site): a fresh venv whose site-packages holds the
    package, the hook and a .pth naming the torch venv's site-packages, as if
    the package were installed into that venv."""

    def __init__(self, root):
        stage = _required("OPGUARD_PYTHON_STAGE")
        self.base = os.path.join(root, "userbase")
        out = subprocess.run([PYTHON, "-c", "import json, sys, sysconfig; print(json.dumps("
                              "[sys.prefix != sys.base_prefix, f'python{sys.version_info.major}."
                              "{sys.version_info.minor}', sorted({sysconfig.get_path('purelib'), "
                              "sysconfig.get_path('platlib')})]))"],
                             capture_output=True, text=True, check=True)
        in_venv, ver, torch_sites = json.loads(out.stdout)
        self.python = PYTHON
        if in_venv:
            venv = os.path.join(root, "venv")
            subprocess.run([PYTHON, "-m", "venv", "--without-pip", venv], check=True)
            self.python = os.path.join(venv, "bin", "python")
            self.site = os.path.join(venv, "lib", ver, "site-packages")
            with open(os.path.join(self.site, "torch-venv.pth"), "w") as f:
                f.write("".join(path + "\n" for path in torch_sites))
        else:
            self.site = os.path.join(self.base, "lib", ver, "site-packages")
            os.makedirs(self.site)
        shutil.copytree(os.path.join(stage, "opguard"), os.path.join(self.site, "opguard"))
        shutil.copy(os.path.join(stage, "opguard-autoload.pth"), self.site)

    def env(self, **extra):
        """The environment a training runs in. torch.compile's inductor
        caches what it compiles in this site's folder (a fresh cache per
        test class: the first job compiles, the next ones load it), with one
        compile thread (no worker pool to start) and without probing the
        CPU's vector ISAs (each probe compiles and loads a test library in a
        new Python: seconds per process); TORCHINDUCTOR_DETERMINISTIC as
        OpGuard's determinism control sets it, so that jobs with and without
        OpGuard compile the same code and share the cache. Python's fault
        handler on: a rank killed by a signal (an abort from C++, a crash)
        leaves every Python thread's stack on its stderr, which a failing
        test shows; it prints nothing otherwise."""
        env = dict(os.environ)
        for key in ("OPGUARD", "OPGUARD_RUN", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                    "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PYTHONPATH"):
            env.pop(key, None)
        env.pop("PYTHONNOUSERSITE", None)
        env["PYTHONUSERBASE"] = self.base
        env["OMP_NUM_THREADS"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"
        env.update(TORCHINDUCTOR_CACHE_DIR=os.path.join(self.base, "inductor"),
                   TORCHINDUCTOR_COMPILE_THREADS="1", TORCHINDUCTOR_VEC_ISA_OK="0",
                   TORCHINDUCTOR_DETERMINISTIC="1")
        env.update({k: str(v) for k, v in extra.items()})
        return env


class Daemon:
    """opguardd --local DIR, stopped with SIGTERM (then SIGKILL) at close."""

    def __init__(self, root, extra_args=()):
        self.root = os.path.join(root, "daemon")
        os.makedirs(self.root)
        self.log = open(os.path.join(self.root, "opguardd.log"), "w")
        self.proc = subprocess.Popen(
            [_required("OPGUARDD"), "--local", self.root, "--http", "127.0.0.1:0", *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.ingest = f"ipc://{self.root}/ingest.sock"
        self.query = f"ipc://{self.root}/query.sock"
        deadline = time.time() + 30
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"opguardd exited with {self.proc.returncode}: {self.log_text()}")
            result = self.cli("status", "--json", check=False)
            if result.returncode == 0:
                self.status = json.loads(result.stdout)
                break
            if time.time() > deadline:
                raise RuntimeError("opguardd did not answer within 30 s: " + self.log_text())
            time.sleep(0.1)

    def log_text(self):
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-4000:]

    def cli(self, *args, check=True, timeout=120):
        result = subprocess.run([_required("OPGUARD_CLI"), *args, "--daemon", self.query],
                                capture_output=True, text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise AssertionError(f"opguard {' '.join(args)} failed ({result.returncode}): "
                                 f"{result.stderr}{result.stdout}")
        return result

    def cli_json(self, *args):
        """JSON answer of a query; exit 1 (diverged) and 3 (incomplete,
        partial) still carry a report, 2 (an error) is a failure."""
        result = self.cli(*args, "--json", check=False)
        if result.returncode not in (0, 1, 3) or not result.stdout.strip():
            raise AssertionError(f"opguard {' '.join(args)} failed ({result.returncode}): "
                                 f"{result.stderr}{result.stdout}")
        return json.loads(result.stdout)

    def trace(self, run, rank, lane=0, limit=10000):
        """The first `limit` ops of `run`'s `rank` in `lane`, from the HTTP API."""
        url = (f"http://{self.status['http']}/api/runs/{run}/ranks/{rank}/trace"
               f"?lane={lane}&from=0&max={limit}")
        with urllib.request.urlopen(url, timeout=30) as answer:
            return json.load(answer)["ops"]

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failure_text(result, head=8000, tail=4000):
    """The failing rank's stderr for an assertion message: whole when short,
    else its start and its end. A rank killed by a signal prints each
    thread's native stack first (train_gpt.py turns c10's fatal-signal
    handler on), the thread that took the signal at the top."""
    text = result.failure
    if len(text) <= head + tail:
        return text
    return f"{text[:head]}\n[... {len(text) - head - tail} characters ...]\n{text[-tail:]}"


def run_ranks(cmd, ranks, env, timeout):
    """Runs `cmd` once per rank, as torchrun would start it (RANK,
    LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in its environment;
    the scripts' spawn_ranks then trains in that process), and returns a
    CompletedProcess: the first failing rank's exit status (the others are
    then stopped, as torch.multiprocessing.spawn stops them) and every
    rank's stdout and stderr, in rank order; its `failure` is the first
    failing rank's stderr (empty if none failed). Starting the ranks here
    rather than through torch.multiprocessing.spawn saves a launcher
    process that imports torch (seconds of CPU per job, the most of a
    short job's)."""
    port = str(_free_port())
    procs, outs = [], []
    deadline = time.time() + timeout
    try:
        for rank in range(ranks):
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            outs.append((out, err))
            rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(ranks),
                            LOCAL_WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=port)
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=out, stderr=err, text=True))
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            if time.time() > deadline:
                raise subprocess.TimeoutExpired(cmd, timeout)
            failed = next((r for r, p in enumerate(procs) if p.poll()), None)
            time.sleep(0.05)
        if failed is None:
            failed = next((r for r, p in enumerate(procs) if p.returncode), None)
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    texts = []
    for out, err in outs:
        out.seek(0)
        err.seek(0)
        texts.append((out.read(), err.read()))
        out.close()
        err.close()
    result = subprocess.CompletedProcess(cmd, 0 if failed is None else procs[failed].returncode,
                                         "".join(t[0] for t in texts),
                                         "".join(t[1] for t in texts))
    result.failure = "" if failed is None else texts[failed][1]
    return result


def train(site, daemon, run, ranks=4, steps=3, fault="", launcher="ranks", extra_env=None,
          timeout=300, args=None, script=TRAIN):
    """Trains `script` (train_gpt.py or an edited copy) on `ranks` gloo ranks
    with OPGUARD=1, started by `launcher`: "ranks" (run_ranks), "spawn"
    (torch.multiprocessing.spawn) or "torchrun"; returns the
    CompletedProcess (stdout has the loss lines)."""
    env = site.env(**dict({"OPGUARD": 1, "OPGUARD_RUN": run, "OPGUARD_ENDPOINT": daemon.ingest,
                           "OPGUARD_FLUSH_TIMEOUT_MS": 20000}, **(extra_env or {})))
    args = ["--steps", str(steps)] + (["--fault", fault] if fault else []) + list(args or [])
    if launcher == "ranks":
        result = run_ranks([site.python, script, *args], ranks, env, timeout)
        if result.returncode != 0:
            raise AssertionError(f"training failed ({result.returncode}):\n{failure_text(result)}")
        return result
    if launcher == "spawn":
        cmd = [site.python, script, "--spawn", str(ranks), *args]
    else:
        port = 20000 + (os.getpid() * 7 + len(run) * 131) % 20000
        # Debian's torch 1.13 on Python 3.11 cannot parse torchrun's default
        # "--redirects 0 --tee 0" (Std.NONE is no longer iterated by enum), so
        # name the per-rank streams explicitly: stdout to log files, tee'd.
        streams = ",".join(f"{r}:1" for r in range(ranks))
        cmd = [site.python, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks),
               "--master_port", str(port), "--redirects", streams, "--tee", streams,
               "--log_dir", os.path.join(os.path.dirname(daemon.root), f"torchrun-{run}"),
               script, *args]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"training failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


class DaemonTestCase(unittest.TestCase):
    """One daemon and one user site per test class, in a temporary directory."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="opguard-e2e-")
        cls.site = UserSite(cls.tmp)
        cls.daemon = Daemon(cls.tmp, cls.daemon_args())

    @classmethod
    def daemon_args(cls):
        """More opguardd flags for this class's daemon."""
        return ()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)


def line_of(path, needle):
    """1-based line number of the only line of `path` containing `needle`."""
    with open(path) as f:
        lines = [i + 1 for i, text in enumerate(f) if needle in text]
    if len(lines) != 1:
        raise AssertionError(f"{needle!r} found on lines {lines} of {path}")
    return lines[0]
