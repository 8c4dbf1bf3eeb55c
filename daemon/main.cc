// opguardd: the OpGuard node daemon. See `opguardd --help` and docs/daemon.md.
#include <malloc.h>
#include <sys/stat.h>

#include <cstdio>
#include <filesystem>

#include "opguard/common/log.h"
#include "opguard/common/spdlog_sink.h"
#include "opguard/daemon/config.h"
#include "opguard/daemon/daemon.h"
#include "opguard/daemon/user_daemon.h"

namespace {

// `opguardd --user`: this user's daemon, started unless it runs; prints
// where it is, one `key value` per line, for the opguard package.
int StartUserDaemon(std::chrono::seconds idle_exit) {
  using namespace opguard::daemon;
  auto dirs = UserDaemonDirs();
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (dirs.ok() && ec) dirs = opguard::Unavailable("cannot find this opguardd: " + ec.message());
  if (!dirs.ok()) {
    OPGUARD_LOG(opguard::LogLevel::kError, dirs.status().message());
    return 1;
  }
  if (idle_exit.count() == 0) idle_exit = UserDaemonIdleExit();
  auto pid = EnsureUserDaemon(*dirs, self.string(), idle_exit, std::chrono::seconds(60));
  if (!pid.ok()) {
    OPGUARD_LOG(opguard::LogLevel::kError, pid.status().message());
    return 1;
  }
  std::printf("ingest %s\nquery %s\nlock %s\nlog %s\n%s\n", dirs->ingest().c_str(), dirs->query().c_str(),
              dirs->lock_file().c_str(), dirs->log_file().c_str(),
              *pid ? ("started " + std::to_string(*pid)).c_str() : "running");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Received batches (hundreds of KiB each) are allocated by ZeroMQ's I/O
  // thread and freed by og-ingest; with glibc's adaptive defaults the freed
  // top of that arena goes back to the kernel (madvise) and the next batches
  // page-fault it in again. Keep up to 64 MiB free per arena instead, and
  // serve blocks up to 32 MiB (batches, memtable arena blocks) from the heap:
  // half the daemon's page faults at full ingest. Set before any thread starts.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  // Everything the daemon writes (the store, its logs) is its own; sockets
  // get their modes explicitly (socket_group, *.socket_mode).
  ::umask(077);
  opguard::LogThroughSpdlog("opguardd");
  bool help = false;
  auto config = opguard::daemon::ParseCommandLine(argc, argv, &help);
  if (help) {
    std::fputs(opguard::daemon::HelpText().c_str(), stdout);
    return 0;
  }
  if (!config.ok()) {
    OPGUARD_LOG(opguard::LogLevel::kError, config.status().message());
    return 2;
  }
  opguard::SetLogLevel(config->log_level);
  if (config->user_daemon) return StartUserDaemon(config->idle_exit);
  opguard::daemon::Daemon daemon(std::move(config).value());
  return daemon.Run();
}
