// Queries: one service, two faces. QueryService computes answers from the
// durable registry and the store; QueryServer answers FlatBuffers envelopes
// on the ZeroMQ query endpoint (CLI, peer daemons); the HTTP server renders
// the same answers as JSON. Every method is safe from any thread.
#pragma once

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "ingest.h"
#include "metrics.h"
#include "opguard/daemon/config.h"
#include "store.h"

namespace opguard::daemon {

struct SiteInfo {
  uint64_t file = 0;
  uint32_t line = 0;
  uint64_t function = 0;
};

struct TracePage {
  std::vector<std::string> ops;  // stored OpRecord buffers, in op order
  std::map<uint64_t, std::string> strings;
  std::map<uint64_t, SiteInfo> sites;
  uint64_t next_op = 0;
  bool done = true;
};

class QueryService {
 public:
  QueryService(const Config& config, Store* store, Ingest* ingest, Metrics* metrics);

  // The bound HTTP address, once known (main thread, before serving).
  void SetHttpAddress(std::string address);

  std::vector<RunState> ListRuns() const;
  Result<RunState> GetRun(const std::string& name) const;
  Result<TracePage> ReadTrace(const std::string& run, uint32_t rank, uint32_t lane, uint64_t from_op,
                              uint32_t max_ops) const;
  Status DeleteRun(const std::string& name);

  // A verified request envelope in, an answer envelope out (ErrorAnswer on
  // any failure, never throws).
  std::string Answer(const void* data, size_t size);

  // JSON faces (docs/daemon.md documents the fields).
  nlohmann::json RunJson(const RunState& run) const;
  nlohmann::json RunsJson() const;
  nlohmann::json StatusJson() const;
  nlohmann::json TraceJson(const std::string& run, uint32_t rank, uint32_t lane,
                           const TracePage& page) const;

 private:
  const Config config_;
  Store* store_;
  Ingest* ingest_;
  Metrics* metrics_;
  const std::chrono::steady_clock::time_point started_;
  mutable std::mutex mu_;
  std::string http_address_;
};

// The ZeroMQ query endpoint: a ROUTER on config.listen served by one thread
// ("og-query"). Requests are answered in order; each is small and bounded.
class QueryServer {
 public:
  QueryServer(const Config& config, QueryService* service, Metrics* metrics, zmq::context_t* context);
  ~QueryServer();
  Status Start();  // binds; main thread
  void Stop();     // main thread; idempotent

 private:
  void Loop();
  const Config config_;
  QueryService* service_;
  Metrics* metrics_;
  zmq::context_t* context_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Hex of a fingerprint as 32 digits: bytes 0..15 of the digest in order.
std::string FingerprintHex(const void* fp128);

}  // namespace opguard::daemon
