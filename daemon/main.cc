// opguardd: the OpGuard node daemon. See `opguardd --help` and docs/daemon.md.
#include <malloc.h>
#include <sys/stat.h>

#include <cstdio>

#include "opguard/common/log.h"
#include "opguard/common/spdlog_sink.h"
#include "opguard/daemon/config.h"
#include "opguard/daemon/daemon.h"

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
  opguard::daemon::Daemon daemon(std::move(config).value());
  return daemon.Run();
}
