#include "access/access.h"

#include <grp.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zmq.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "opguard/common/log.h"

namespace opguard::daemon {
namespace {

std::optional<gid_t> GroupId(const std::string& name) {
  if (name.empty()) return std::nullopt;
  std::vector<char> buf(16384);
  group g{};
  group* found = nullptr;
  if (::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return std::nullopt;
  }
  return found->gr_gid;
}

// The file's group, or -1. Under systemd the socket usually has the group
// already (the service's Group=), and the unit's system call filter leaves
// chown out: only call it when it changes something.
gid_t Group(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_gid : static_cast<gid_t>(-1);
}

bool ParseUint32(std::string_view s, uint32_t* out) {
  if (s.empty() || s.size() > 10) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + static_cast<uint64_t>(c - '0');
  }
  if (v > UINT32_MAX) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

}  // namespace

std::optional<uint32_t> UnixPeerUid(const zmq::message_t& message) {
  // libzmq appends ":uid:gid:pid" to the peer's address on unix sockets.
  const char* address = zmq_msg_gets(const_cast<zmq_msg_t*>(message.handle()), "Peer-Address");
  if (address == nullptr) return std::nullopt;
  std::string_view a(address);
  size_t end = a.size();
  for (int field = 0; field < 2; ++field) {  // skip pid, then gid
    end = a.rfind(':', end - 1);
    if (end == std::string_view::npos || end == 0) return std::nullopt;
  }
  const size_t start = a.rfind(':', end - 1);
  if (start == std::string_view::npos) return std::nullopt;
  uint32_t uid = 0;
  if (!ParseUint32(a.substr(start + 1, end - start - 1), &uid)) return std::nullopt;
  return uid;
}

bool IsUnixEndpoint(const std::string& endpoint) { return endpoint.rfind("ipc://", 0) == 0; }

bool IsLoopbackEndpoint(const std::string& endpoint) {
  std::string host = endpoint;
  if (host.rfind("tcp://", 0) == 0) host = host.substr(6);
  const auto colon = host.rfind(':');
  if (colon == std::string::npos) return false;
  host = host.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8, written as a dotted quad.
  if (host.rfind("127.", 0) != 0) return false;
  return std::count(host.begin(), host.end(), '.') == 3 &&
         host.find_first_not_of("0123456789.") == std::string::npos;
}

void ApplySocketAccess(const std::string& path, const std::string& group, uint32_t mode,
                       const char* what) {
  if (!group.empty()) {
    const auto gid = GroupId(group);
    if (!gid) {
      OPGUARD_LOG(LogLevel::kWarn, std::string(what) + " " + path + ": group '" + group +
                                       "' does not exist, the socket keeps the daemon's group; create it "
                                       "(systemd-sysusers) or set socket_group");
    } else if (Group(path) != *gid && ::chown(path.c_str(), static_cast<uid_t>(-1), *gid) != 0) {
      OPGUARD_LOG(LogLevel::kWarn, std::string(what) + " " + path + ": cannot give it group '" + group +
                                       "' (" + std::strerror(errno) +
                                       "); the daemon's user must be a member of that group");
    }
  }
  if (::chmod(path.c_str(), mode) != 0) {
    OPGUARD_LOG(LogLevel::kWarn, std::string("cannot chmod ") + what + " " + path + ": " + std::strerror(errno));
  }
}

void MakeRuntimeDir(const std::string& ipc_path, const std::string& group) {
  const auto dir = std::filesystem::path(ipc_path).parent_path();
  std::error_code ec;
  if (dir.empty() || std::filesystem::exists(dir, ec)) return;
  std::filesystem::create_directories(dir, ec);
  if (ec) return;  // the bind that follows reports it
  const auto gid = GroupId(group);
  if (gid && Group(dir.string()) != *gid && ::chown(dir.c_str(), static_cast<uid_t>(-1), *gid) != 0) {
    OPGUARD_LOG(LogLevel::kWarn, "cannot give " + dir.string() + " group '" + group + "': " + std::strerror(errno));
  }
  (void)::chmod(dir.c_str(), gid ? 0750 : 0700);
}

AdminPolicy::AdminPolicy(const std::string& admin_group)
    : group_(admin_group), gid_(GroupId(admin_group)), self_(::geteuid()) {}

bool AdminPolicy::IsAdmin(uint32_t uid) const {
  if (uid == 0 || uid == self_) return true;
  if (!gid_) return false;
  // Membership as the login database says (primary or supplementary group).
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  if (::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found) != 0 || found == nullptr) return false;
  if (found->pw_gid == *gid_) return true;
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n));
    if (::getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) < 0) return false;
  }
  groups.resize(static_cast<size_t>(n));
  return std::find(groups.begin(), groups.end(), *gid_) != groups.end();
}

}  // namespace opguard::daemon
