"""The repaired wheel both pip suites install (test_wheel, test_pip_venv):
scripts/build-wheel.sh against the shared torch venv of scripts/torch-venv.sh,
built in OPGUARD_PACKAGE_WORK/wheel (kept: a second call is incremental)."""
import os
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TORCH = "2.11.0"
SOURCE = os.environ.get("OPGUARD_SOURCE_DIR", os.path.join(HERE, "..", ".."))
WORK = os.path.join(os.environ.get("OPGUARD_PACKAGE_WORK", tempfile.gettempdir()), "wheel")


def _run(cmd, timeout):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise AssertionError(f"{cmd[:3]} failed ({result.returncode}):\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result.stdout


def shared_torch_venv():
    return _run([os.path.join(SOURCE, "scripts", "torch-venv.sh"), TORCH], 1800).strip()


def repaired_wheel():
    """(the wheel's path, the shared torch venv it was built against)."""
    shared = shared_torch_venv()
    out = _run([os.path.join(SOURCE, "scripts", "build-wheel.sh"), os.path.join(shared, "bin", "python"),
                os.path.join(WORK, "out"), os.path.join(WORK, "build")], 3000)
    return out.strip().splitlines()[-1], shared
