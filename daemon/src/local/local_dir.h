// `opguardd --local DIR`: one user's daemon in folders that user owns.
//
// Before anything is written, DIR, its data dir and the sockets' folder are
// made (mode 0700) where missing and then checked the way OpenSSH's
// StrictModes and systemd-tmpfiles check what they trust: each must be a real
// directory (not a symlink, not reached through one), owned by the daemon's
// user, and writable by nobody else; each folder above DIR must belong to
// root or that user and be writable by no one else unless sticky (/tmp).
// Otherwise another user could swap the store or the sockets under the
// daemon. The first failure is one line naming the path and what is wrong.
//
// A lock file (DIR/daemon.lock, holding the daemon's pid) admits one daemon
// per DIR: a second one exits at once, naming the first's pid. The per-user
// daemon that the opguard package starts relies on it (docs/install.md).
#pragma once

#include <string>
#include <vector>

#include "opguard/common/status.h"

namespace opguard::daemon {

// Checks `dir` as described above; `what` names it in the error ("data dir").
// Creates it (0700) first when `create` and it is missing.
Status CheckPrivateDir(const std::string& dir, const std::string& what, bool create);

// Checks every folder the daemon uses in local mode: DIR, the data dir and
// the folders of the ipc:// sockets.
Status PrepareLocalDirs(const std::string& local_dir, const std::string& data_dir,
                        const std::vector<std::string>& ipc_endpoints);

// Takes DIR/daemon.lock for the life of the process (the descriptor is kept
// open on purpose) and writes this process's pid into it. Fails when another
// process holds it.
Status LockLocalDir(const std::string& local_dir);

}  // namespace opguard::daemon
