#include "local/local_dir.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

namespace opguard::daemon {
namespace {

namespace fs = std::filesystem;

std::string Octal(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

std::string UserName(uid_t uid) {
  const passwd* pw = ::getpwuid(uid);
  return "uid " + std::to_string(uid) + (pw ? " (" + std::string(pw->pw_name) + ")" : "");
}

// `dir` as an absolute path without "." or ".." or a trailing '/'.
std::string Normal(const std::string& dir) {
  std::string path = fs::absolute(fs::path(dir)).lexically_normal().string();
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// Every folder above `path`: root or this user's, and writable by no one
// else unless sticky (a sticky folder's entries are renamed only by their
// owners). None may be a symlink: its target is not what the path says.
Status CheckAncestors(const std::string& path, const std::string& what) {
  const uid_t self = ::geteuid();
  std::string above;
  for (const auto& part : fs::path(path).parent_path()) {
    above = part == "/" ? std::string("/") : (above == "/" ? "/" : above + "/") + part.string();
    struct stat st {};
    if (::lstat(above.c_str(), &st) != 0) {
      return Unavailable(what + " " + path + ": cannot read " + above + ": " + std::strerror(errno));
    }
    if (S_ISLNK(st.st_mode)) {
      std::error_code ec;
      const auto real = fs::canonical(path, ec);
      return InvalidArgument(what + " " + path + " is reached through the symlink " + above +
                             (ec ? std::string() : "; give its real path " + real.string()));
    }
    if (st.st_uid != 0 && st.st_uid != self) {
      return InvalidArgument(what + " " + path + " lies in " + above + ", owned by " +
                             UserName(st.st_uid) + ", who could replace it");
    }
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (st.st_mode & S_ISVTX) == 0) {
      return InvalidArgument(what + " " + path + " lies in " + above + " (mode " + Octal(st.st_mode) +
                             "), which others can write: they could replace it");
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckPrivateDir(const std::string& dir, const std::string& what, bool create) {
  const std::string path = Normal(dir);
  OPGUARD_RETURN_IF_ERROR(CheckAncestors(path, what));
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno != ENOENT || !create) {
      return Unavailable(what + " " + path + ": " + std::strerror(errno));
    }
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) {
      return Unavailable("cannot create " + what + " " + path + ": " + std::strerror(errno));
    }
    if (::lstat(path.c_str(), &st) != 0) {
      return Unavailable(what + " " + path + ": " + std::strerror(errno));
    }
  }
  if (S_ISLNK(st.st_mode)) {
    return InvalidArgument(what + " " + path + " is a symlink; give a directory of this user's");
  }
  if (!S_ISDIR(st.st_mode)) return InvalidArgument(what + " " + path + " is not a directory");
  if (st.st_uid != ::geteuid()) {
    return InvalidArgument(what + " " + path + " is owned by " + UserName(st.st_uid) +
                           ", not by this daemon's user, " + UserName(::geteuid()));
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return InvalidArgument(what + " " + path + " can be written by its group or others (mode " +
                           Octal(st.st_mode) + "): chmod go-w " + path);
  }
  return Status::Ok();
}

Status PrepareLocalDirs(const std::string& local_dir, const std::string& data_dir,
                        const std::vector<std::string>& ipc_endpoints) {
  OPGUARD_RETURN_IF_ERROR(CheckPrivateDir(local_dir, "--local dir", true));
  OPGUARD_RETURN_IF_ERROR(CheckPrivateDir(data_dir, "data dir", true));
  for (const auto& endpoint : ipc_endpoints) {
    if (endpoint.rfind("ipc://", 0) != 0) continue;
    const std::string folder = fs::path(endpoint.substr(6)).parent_path().string();
    // A socket dir the daemon is about to create is made with the socket
    // group's mode (0750, group-owned: the jobs of socket_group connect);
    // only where it lies is checked here. One that exists is checked whole.
    struct stat st {};
    if (!folder.empty() && ::lstat(Normal(folder).c_str(), &st) != 0 && errno == ENOENT) {
      OPGUARD_RETURN_IF_ERROR(CheckAncestors(Normal(folder), "socket dir"));
      continue;
    }
    OPGUARD_RETURN_IF_ERROR(CheckPrivateDir(folder.empty() ? "." : folder, "socket dir", true));
  }
  return Status::Ok();
}

Status LockLocalDir(const std::string& local_dir) {
  const std::string path = Normal(local_dir) + "/daemon.lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return Unavailable("cannot open " + path + ": " + std::strerror(errno));
  // Whoever checks whether a daemon is alive takes a shared lock for a
  // moment (python/opguard/_local_daemon.py): wait those out, briefly.
  bool locked = false;
  for (int attempt = 0; attempt < 40 && !locked; ++attempt) {
    if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    locked = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  }
  if (!locked) {
    char pid[32] = {};
    const ssize_t n = ::pread(fd, pid, sizeof pid - 1, 0);
    ::close(fd);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : "?";
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
    return Unavailable("another opguardd (pid " + holder + ") serves " + Normal(local_dir));
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    return Unavailable("cannot write " + path + ": " + std::strerror(errno));
  }
  return Status::Ok();  // fd stays open: the lock lasts as long as the process
}

}  // namespace opguard::daemon
