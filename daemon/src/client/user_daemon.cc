#include "opguard/daemon/user_daemon.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

namespace opguard::daemon {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v == '/' ? std::string(v) : std::string();  // XDG: relative values are ignored
}

// mkdir -p, the last folder private to this user.
Status MakePrivateDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Unavailable("cannot create " + dir + ": " + ec.message());
  struct stat st {};
  if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() &&
      (st.st_mode & 077) != 0) {
    (void)::chmod(dir.c_str(), 0700);
  }
  return Status::Ok();
}

// Whether a process holds `path`'s lock (the daemon's daemon.lock): a shared
// lock taken and dropped at once, which the daemon waits out at its start.
bool LockHeld(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  const bool held = ::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  ::close(fd);
  return held;
}

std::string LastLine(const std::string& file) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last.empty() ? "no output" : last;
}

}  // namespace

std::chrono::seconds UserDaemonIdleExit() {
  const char* text = std::getenv("OPGUARD_DAEMON_IDLE");
  char* end = nullptr;
  const long seconds = text ? std::strtol(text, &end, 10) : 0;
  if (text && *text && end && *end == '\0' && seconds >= 1) return std::chrono::seconds(seconds);
  return std::chrono::minutes(10);
}

Result<UserDaemon> UserDaemonDirs() {
  UserDaemon dirs;
  if (std::string state = Env("XDG_STATE_HOME"); !state.empty()) {
    dirs.state_dir = state + "/opguard";
  } else if (std::string home = Env("HOME"); !home.empty()) {
    dirs.state_dir = home + "/.local/state/opguard";
  } else {
    return NotFound("neither XDG_STATE_HOME nor HOME is an absolute path: no folder for this user's daemon");
  }
  const std::string runtime = Env("XDG_RUNTIME_DIR");
  dirs.socket_dir = runtime.empty() ? dirs.state_dir : runtime + "/opguard";
  return dirs;
}

bool SocketAnswers(const std::string& path) {
  sockaddr_un addr{};
  if (path.size() >= sizeof addr.sun_path) return false;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const bool ok = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

Result<int> EnsureUserDaemon(const UserDaemon& dirs, const std::string& opguardd,
                             std::chrono::seconds idle_exit, std::chrono::seconds timeout) {
  const std::string ingest = dirs.ingest().substr(6);
  if (SocketAnswers(ingest)) return 0;
  OPGUARD_RETURN_IF_ERROR(MakePrivateDir(dirs.state_dir));
  OPGUARD_RETURN_IF_ERROR(MakePrivateDir(dirs.socket_dir));
  const auto deadline = Clock::now() + timeout;
  const auto expired = [&] { return Clock::now() >= deadline; };
  const auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(50)); };

  // One starter at a time; the others find the daemon answering.
  const std::string start_lock = dirs.state_dir + "/start.lock";
  const int lock = ::open(start_lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock < 0) return Unavailable("cannot open " + start_lock + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }  // drops the lock
  } closer{lock};
  while (::flock(lock, LOCK_EX | LOCK_NB) != 0) {
    if (expired()) return Unavailable("another process has been starting this user's daemon for too long (" + start_lock + ")");
    pause();
  }
  // A daemon that holds its lock is running or starting (by hand, say): wait for it.
  while (!SocketAnswers(ingest) && LockHeld(dirs.lock_file()) && !expired()) pause();
  if (SocketAnswers(ingest)) return 0;

  const std::string idle = std::to_string(idle_exit.count()) + "s";
  std::vector<std::string> argv = {opguardd, "--local", dirs.state_dir, "--socket-dir", dirs.socket_dir,
                                   "--http", "off", "--idle-exit", idle};
  const pid_t pid = ::fork();
  if (pid < 0) return Unavailable(std::string("cannot start opguardd: ") + std::strerror(errno));
  if (pid == 0) {
    // Its own session: the launcher's (torchrun's) signals to its process
    // group do not reach it; its lines go to the log.
    ::setsid();
    const int null = ::open("/dev/null", O_RDONLY);
    const int log = ::open(dirs.log_file().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (null >= 0) ::dup2(null, STDIN_FILENO);
    if (log >= 0) {
      ::dup2(log, STDOUT_FILENO);
      ::dup2(log, STDERR_FILENO);
    }
    ::close_range(3, ~0u, 0);  // nothing of the starter's stays open in the daemon
    std::vector<char*> args;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    ::execv(opguardd.c_str(), args.data());
    std::fprintf(stderr, "cannot run %s: %s\n", opguardd.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  while (!SocketAnswers(ingest)) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) {
      return Unavailable("opguardd --local " + dirs.state_dir + " exited: " + LastLine(dirs.log_file()));
    }
    if (expired()) {
      return Unavailable("opguardd --local " + dirs.state_dir + " (pid " + std::to_string(pid) +
                         ") did not answer in " + std::to_string(timeout.count()) + " s; see " +
                         dirs.log_file());
    }
    pause();
  }
  return static_cast<int>(pid);
}

}  // namespace opguard::daemon
