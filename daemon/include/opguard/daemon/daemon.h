// opguardd as a library: main.cc parses the command line and calls Run();
// tests and benchmarks start the real binary instead (they need kill -9).
//
// Threads (all named): the caller's thread runs the control loop (Boost.Asio:
// signals, HTTP, sd_notify watchdog, health checks); "og-ingest" and
// "og-commit" run the ingest pipeline; "og-query" the ZeroMQ query endpoint;
// "og-maint" retention and post-delete compaction; plus RocksDB's own
// background threads and ZeroMQ's I/O thread.
#pragma once

#include <memory>

#include "opguard/daemon/config.h"

namespace opguard::daemon {

class Daemon {
 public:
  explicit Daemon(Config config);
  ~Daemon();
  Daemon(const Daemon&) = delete;
  Daemon& operator=(const Daemon&) = delete;

  // Opens the store, binds every endpoint, tells systemd READY=1, serves
  // until SIGTERM/SIGINT (or a fatal store error), then tells STOPPING=1,
  // commits and acknowledges the batches already received, and closes the
  // store. Returns the process exit code (0 on a clean stop). Call once.
  int Run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace opguard::daemon
