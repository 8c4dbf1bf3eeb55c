"""A second local user for the tests that need one (created with useradd when
running as root, removed again at the end), and running commands as it."""
import os
import pwd
import shutil
import subprocess

NOT_ROOT = "not root: no second local user can be created (useradd)"


def can_create():
    """None when a user can be created here, else why not."""
    if os.geteuid() != 0:
        return NOT_ROOT
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        return "no useradd/userdel on this machine"
    return None


class LocalUser:
    """A system user with no login and no home of its own (`home` names a
    folder the test makes for it)."""

    def __init__(self, prefix):
        self.name = f"{prefix}{os.getpid() % 100000}"
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        self.name], check=True, capture_output=True)
        entry = pwd.getpwnam(self.name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid

    def own(self, path, mode=None):
        os.chown(path, self.uid, self.gid)
        if mode is not None:
            os.chmod(path, mode)

    def remove(self):
        subprocess.run(["pkill", "-KILL", "-u", self.name], capture_output=True)
        subprocess.run(["userdel", self.name], capture_output=True)
