"""The venv's `opguard` and `opguardd` commands (python/pyproject.toml): the
binaries the wheel carries in opguard/bin, run in place of this process, as
the cmake and ninja wheels run theirs."""
import os
import sys

BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _run(name):
    path = os.path.join(BIN_DIR, name)
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"{name}: this opguard package has no {path} "
                         "(built from a source tree without it); use the build's or the .deb's\n")
        return 127
    # `opguard doctor` checks the Python that runs training: by default the
    # one this command was installed with.
    os.environ.setdefault("OPGUARD_PYTHON", sys.executable)
    os.execv(path, [name] + sys.argv[1:])
    return 127  # not reached


def opguard():
    return _run("opguard")


def opguardd():
    return _run("opguardd")
