// Who may do what (docs/daemon.md, "Access"; docs/operations.md).
//
// Local senders and clients are known by their uid: on an ipc:// endpoint
// ZeroMQ reads the connecting process's credentials (SO_PEERCRED) and hands
// them to every message as the "Peer-Address" property, "host:uid:gid:pid".
// A run belongs to the uid whose batch created it; only that uid writes into
// it; only that uid, root, the daemon's own user or a member of the admin
// group removes it, and only through a unix (ipc://) query socket. Network
// endpoints carry no uid: they answer queries, never admin requests, and
// off loopback only to CURVE-authenticated clients (zap_authenticator.h).
//
// May be included by every room of the daemon.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

#include "opguard/common/status.h"
#include "registry/run_state.h"

namespace zmq {
class message_t;
}

namespace opguard::daemon {

// The uid of the process that sent `message` on an ipc:// socket, from
// ZeroMQ's Peer-Address property; nullopt when it carries none (other
// transports, or a libzmq built without SO_PEERCRED).
std::optional<uint32_t> UnixPeerUid(const zmq::message_t& message);

// True for ipc:// endpoints (the transports that carry a uid).
bool IsUnixEndpoint(const std::string& endpoint);
// True when a tcp://HOST:PORT endpoint, or an HTTP "HOST:PORT" address,
// binds only the loopback interface (127.0.0.0/8, ::1, localhost).
bool IsLoopbackEndpoint(const std::string& endpoint);

// Gives a file the runtime group and mode: chown to `group` (when not empty)
// and chmod to `mode`. A group that does not exist, or that this user may not
// give, is a warning (the file keeps the daemon's group): single-user setups
// work unchanged, and the warning says how to share the socket.
void ApplySocketAccess(const std::string& path, const std::string& group, uint32_t mode,
                       const char* what);
// Creates the directory of an ipc:// socket when it is missing, group-owned
// and 0750 (0700 without a group); an existing directory is left as it is
// (systemd's RuntimeDirectory= or tmpfiles made it).
void MakeRuntimeDir(const std::string& ipc_path, const std::string& group);

// Who administers this daemon: root, the daemon's own user and the members
// of the admin group (resolved once, at construction).
class AdminPolicy {
 public:
  explicit AdminPolicy(const std::string& admin_group);
  bool IsAdmin(uint32_t uid) const;
  // Whether `uid` may remove (or otherwise change) a run owned by `owner`.
  bool MayChange(uint32_t uid, int64_t owner) const {
    return static_cast<int64_t>(uid) == owner || IsAdmin(uid);
  }
  const std::string& group() const { return group_; }

 private:
  std::string group_;
  std::optional<gid_t> gid_;
  uid_t self_;
};

}  // namespace opguard::daemon
