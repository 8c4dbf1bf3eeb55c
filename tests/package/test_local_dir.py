"""`opguardd --local DIR` refuses folders another user could swap under it
(docs/daemon.md, "Local mode"): DIR, its data dir and its socket dir must be
real directories of the daemon's user that no one else can write, reached
through no symlink and lying in folders no one else can write. Each refusal
is one line naming the path and what is wrong, and nothing is written there.
The cases with another user's folders need a second local user (root
creates one); elsewhere they are skipped with the reason in
tests/expected-skips.txt."""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest

import users

OPGUARDD = os.environ.get("OPGUARDD") or os.path.join(
    os.environ.get("OPGUARD_BUILD_DIR", ""), "daemon", "opguardd")
NO_USER = users.can_create()


class LocalDirChecks(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.other = None if NO_USER else users.LocalUser("ogt-local")

    @classmethod
    def tearDownClass(cls):
        if cls.other:
            cls.other.remove()

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="opguard-localdir-")
        self.procs = []

    def tearDown(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def refused(self, *args, why):
        """opguardd --local ... exits at once, with one line containing `why`."""
        result = subprocess.run([OPGUARDD, "--local", *args, "--http", "off"], capture_output=True,
                                text=True, timeout=60)
        self.assertNotEqual(result.returncode, 0, result.stderr)
        self.assertEqual(len(result.stderr.splitlines()), 1, result.stderr)
        self.assertIn(why, result.stderr)
        return result.stderr

    def start(self, *args):
        proc = subprocess.Popen([OPGUARDD, "--local", *args, "--http", "off"],
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def wait_answering(self, socket_path, proc):
        for _ in range(600):  # bounded: 60 s
            self.assertIsNone(proc.poll(), proc.stderr.read() if proc.poll() is not None else "")
            with socket.socket(socket.AF_UNIX) as s:
                try:
                    s.connect(socket_path)
                    return
                except OSError:
                    time.sleep(0.1)
        self.fail(f"no daemon answered on {socket_path}")

    # ---- the daemon's own user -------------------------------------------------

    def test_a_private_dir_is_served_once(self):
        local = self.path("mine")
        first = self.start(local)
        self.wait_answering(os.path.join(local, "ingest.sock"), first)
        self.assertEqual(os.stat(local).st_mode & 0o777, 0o700)
        line = self.refused(local, why=f"another opguardd (pid {first.pid}) serves {local}")
        self.assertIn("opguardd", line)
        self.assertIsNone(first.poll())  # the first one serves on

    def test_a_dir_others_can_write(self):
        local = self.path("open")
        os.mkdir(local)
        os.chmod(local, 0o777)
        self.refused(local, why=f"--local dir {local} can be written by its group or others (mode 0777)")
        self.assertEqual(os.listdir(local), [])

    def test_a_data_dir_that_is_a_symlink(self):
        local, elsewhere = self.path("mine"), self.path("elsewhere")
        os.mkdir(local, 0o700)
        os.mkdir(elsewhere, 0o755)
        os.symlink(elsewhere, os.path.join(local, "data"))
        self.refused(local, why=f"data dir {local}/data is a symlink")
        self.assertEqual(os.stat(elsewhere).st_mode & 0o777, 0o755)  # not chmodded
        self.assertEqual(os.listdir(elsewhere), [])

    def test_a_dir_reached_through_a_symlink(self):
        real = self.path("real")
        os.mkdir(real, 0o700)
        os.symlink(real, self.path("link"))
        self.refused(self.path("link", "sub"), why=f"is reached through the symlink {self.path('link')}")
        self.assertEqual(os.listdir(real), [])

    def test_a_socket_dir_others_can_write(self):
        sockets = self.path("sockets")
        os.mkdir(sockets)
        os.chmod(sockets, 0o1777)  # sticky like /tmp, but the sockets' own folder
        self.refused(self.path("mine"), "--socket-dir", sockets,
                     why=f"socket dir {sockets} can be written by its group or others")
        self.assertEqual(os.listdir(sockets), [])

    # ---- another user's folders -------------------------------------------------

    @unittest.skipIf(NO_USER, NO_USER)
    def test_another_users_dir_with_data_linked_to_a_root_dir(self):
        # The case: DIR belongs to (and is writable by) another user,
        # DIR/data points at a directory of the daemon's user.
        local, target = self.path("theirs"), self.path("target")
        os.mkdir(local)
        os.mkdir(target, 0o755)
        os.symlink(target, os.path.join(local, "data"))
        self.other.own(local, 0o755)
        self.refused(local, why=f"--local dir {local} is owned by uid {self.other.uid} "
                                f"({self.other.name}), not by this daemon's user")
        self.assertEqual(os.stat(target).st_mode & 0o777, 0o755)
        self.assertEqual(os.listdir(target), [])
        self.assertEqual(os.listdir(local), ["data"])

    @unittest.skipIf(NO_USER, NO_USER)
    def test_a_private_dir_inside_another_users_folder(self):
        parent = self.path("theirs")
        os.mkdir(parent, 0o755)
        self.other.own(parent)
        local = os.path.join(parent, "mine")
        os.mkdir(local, 0o700)  # the daemon's user's, but the other one can rename it
        self.refused(local, why=f"lies in {parent}, owned by uid {self.other.uid}")
        self.assertEqual(os.listdir(local), [])

    @unittest.skipIf(NO_USER, NO_USER)
    def test_another_users_socket_dir(self):
        sockets = self.path("their-sockets")
        os.mkdir(sockets, 0o700)
        self.other.own(sockets)
        self.refused(self.path("mine"), "--socket-dir", sockets,
                     why=f"socket dir {sockets} is owned by uid {self.other.uid}")


if __name__ == "__main__":
    unittest.main()
