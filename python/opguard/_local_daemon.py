"""Which daemon a recording process sends to, and this user's own daemon
when the machine has none (docs/install.md, "The per-user daemon"):

- OPGUARD_ENDPOINT set: that endpoint, as given; it is never second-guessed
  (the systemd deployment: unreachable stays the shim's error there);
- else the node's daemon when it accepts connections on its default socket;
- else this user's daemon: `opguardd --user` starts it unless it runs
  (one starter at a time, under a lock file: eight ranks racing start one)
  and prints where it listens. While this process records, a watcher thread
  restarts it when it is gone and records are waiting for it.

Nothing here raises into training: enable() turns failures into one line."""
import fcntl
import os
import shutil
import socket
import subprocess
import threading

NODE_INGEST = "/run/opguard/ingest.sock"  # the shim's default endpoint, the .deb's daemon
# Set here for the shim (and inherited by this process's children, which then
# look after the same daemon): the lock file of the user's daemon in use.
USER_DAEMON_VARIABLE = "OPGUARD_USER_DAEMON"


class Unavailable(Exception):
    """No daemon to send to, and none could be started."""


def _accepts(path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(2)
        try:
            s.connect(path)
            return True
        except OSError:
            return False


def opguardd():
    """The opguardd beside this package (the wheel's opguard/bin), else on PATH."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "opguardd")
    return here if os.access(here, os.X_OK) else shutil.which("opguardd")


class UserDaemon:
    def __init__(self, fields):
        self.ingest = fields["ingest"]
        self.lock = fields["lock"]
        self.log = fields["log"]
        self.started = int(fields.get("started", 0))
        self.restarts = 0  # by watch(), once each was announced

    def alive(self):
        """Whether its process holds daemon.lock (a shared lock for a moment,
        which the daemon waits out at start-up)."""
        try:
            fd = os.open(self.lock, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        finally:
            os.close(fd)


def start_user_daemon(binary):
    """`opguardd --user`: started unless it runs; returns once it answers."""
    try:
        done = subprocess.run([binary, "--user"], stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=90)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"cannot run {binary} --user ({e})") from None
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["no output"]
        raise Unavailable(f"{binary} --user failed: {lines[-1]}")
    fields = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition(" ")
        fields[key] = value
    return UserDaemon(fields)


def choose(environ):
    """(endpoint, UserDaemon or None, why) for this process; sets nothing."""
    explicit = environ.get("OPGUARD_ENDPOINT")
    if explicit and not environ.get(USER_DAEMON_VARIABLE):
        return explicit, None, "OPGUARD_ENDPOINT"
    if not explicit and _accepts(NODE_INGEST):
        return "ipc://" + NODE_INGEST, None, "the node's daemon"
    binary = opguardd()
    if binary is None:
        # A source tree or a package without its daemon: records wait for
        # one at the shim's default endpoint, as before there was this route.
        return None, None, "no opguardd to start"
    user = start_user_daemon(binary)
    return user.ingest, user, "your own daemon"


def watch(user, pending, warn, interval=1.0):
    """Restarts the user's daemon while this process records: once per
    `interval`, when it is gone and pending() says records wait for it. The
    records the shim had to drop meanwhile arrive as gaps."""
    binary = opguardd()

    def loop():
        told = False
        while True:
            threading.Event().wait(interval)
            try:
                if user.alive() or not pending():
                    continue
                restarted = start_user_daemon(binary)
                if restarted.started:
                    warn(f"your opguard daemon was gone; started it again (pid {restarted.started}); "
                         "records it missed are reported as gaps")
                    user.restarts += 1
                told = False
            except Unavailable as e:
                if not told:
                    warn(f"your opguard daemon is gone and could not be restarted: {e}")
                    told = True
            except Exception:  # never into the training process
                pass

    thread = threading.Thread(target=loop, name="opguard-daemon-watch", daemon=True)
    thread.start()
    return thread
