// This user's own daemon, for machines without the node's (docs/install.md,
// "The per-user daemon"): `opguardd --local` with its data under
// $XDG_STATE_HOME/opguard (default ~/.local/state/opguard) and its sockets in
// $XDG_RUNTIME_DIR/opguard (the state folder without XDG_RUNTIME_DIR),
// started on demand, once, by whoever needs it first: a recording rank
// (through `opguardd --user`) or the opguard CLI, and gone after its idle
// time. Starters serialize on a lock file (start.lock); the daemon itself
// holds daemon.lock while it lives (daemon/src/local/local_dir.h), so that
// eight ranks racing start one daemon and any of them can tell it died.
#pragma once

#include <chrono>
#include <string>

#include "opguard/common/status.h"

namespace opguard::daemon {

struct UserDaemon {
  std::string state_dir;   // --local DIR: data, daemon.lock, start.lock, opguardd.log
  std::string socket_dir;  // --socket-dir
  std::string ingest() const { return "ipc://" + socket_dir + "/ingest.sock"; }
  std::string query() const { return "ipc://" + socket_dir + "/query.sock"; }
  std::string lock_file() const { return state_dir + "/daemon.lock"; }
  std::string log_file() const { return state_dir + "/opguardd.log"; }
};

// How long it waits without a batch or a query before it exits:
// $OPGUARD_DAEMON_IDLE seconds (a whole number >= 1), else 10 minutes.
std::chrono::seconds UserDaemonIdleExit();

// The folders, from the environment; an error when neither XDG_STATE_HOME
// nor HOME names an absolute path.
Result<UserDaemon> UserDaemonDirs();

// True when a process accepts connections on the unix socket at `path`.
bool SocketAnswers(const std::string& path);

// Starts the daemon with `opguardd` (its path) unless one answers already,
// and returns once it answers on its ingest socket: the pid it started, or
// 0 when one was running. idle_exit is passed as --idle-exit. Bounded by
// `timeout`; a daemon that exits first fails with its log's last line.
Result<int> EnsureUserDaemon(const UserDaemon& dirs, const std::string& opguardd,
                             std::chrono::seconds idle_exit, std::chrono::seconds timeout);

}  // namespace opguard::daemon
