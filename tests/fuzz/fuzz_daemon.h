// The daemon's parts in one process, for the fuzz harnesses: the real Store
// (RocksDB in a temp dir), the ingest pipeline on an inproc:// endpoint, the
// run registry, the QueryService and the HTTP server on 127.0.0.1, wired as
// daemon.cc wires them. At start it ingests three runs through the real
// pipeline (SeedBatches), so that queries, diffs and trace pages have data.
// Not part of the product.
#pragma once

#include <utility>  // before Boost.Asio: GCC 12 + C++20 needs it first

#include <boost/asio/io_context.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <zmq.hpp>

#include "ingest/ingest.h"
#include "metrics.h"
#include "query/http_server.h"
#include "query/query.h"
#include "registry/run_registry.h"
#include "storage/store.h"

namespace opguard::daemon::fuzz {

// Runs SeedBatches() fills; the harnesses never delete them.
inline constexpr const char* kSeedRuns[] = {"ref", "sus", "solo"};
bool IsSeedRun(std::string_view name);

// Batch envelopes of the seed runs, as the shim sends them (announce,
// definitions, steps, collectives, a gap, a source file, end of run).
std::vector<std::string> SeedBatches();

class FuzzDaemon {
 public:
  // `peers`: query endpoints of other daemons (the cluster fan-out asks them).
  explicit FuzzDaemon(std::vector<std::string> peers = {});
  ~FuzzDaemon();
  FuzzDaemon(const FuzzDaemon&) = delete;
  FuzzDaemon& operator=(const FuzzDaemon&) = delete;

  // Sends one ingest message as a shim's DEALER does and waits for its ack
  // (the ack's bytes), or nullopt when none came within `timeout`.
  std::optional<std::string> SendBatch(std::string_view message,
                                       std::chrono::milliseconds timeout = std::chrono::seconds(20));
  // Removes a run through the ingest pipeline (as `opguard rm` does).
  Status DeleteRun(const std::string& name);

  QueryService& service() { return *service_; }
  Metrics& metrics() { return metrics_; }
  Store& store() { return *store_; }
  const Ingest& ingest() const { return *ingest_; }
  // The HTTP server's "127.0.0.1:PORT".
  const std::string& http_address() const { return http_address_; }

 private:
  std::string dir_;
  Config config_;
  Metrics metrics_;
  zmq::context_t context_{1};
  std::unique_ptr<Store> store_;
  RunRegistry registry_;
  std::unique_ptr<Ingest> ingest_;
  std::unique_ptr<QueryService> service_;
  std::unique_ptr<zmq::socket_t> sender_;
  boost::asio::io_context io_;
  std::unique_ptr<HttpServer> http_;
  std::string http_address_;
  std::thread io_thread_;
};

// Aborts the process with `what` on stderr: a harness's property failed
// (libFuzzer saves the input that did it).
[[noreturn]] void Fail(const std::string& what);

}  // namespace opguard::daemon::fuzz
