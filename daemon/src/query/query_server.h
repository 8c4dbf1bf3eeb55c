// The ZeroMQ face of QueryService (query.h). Included by daemon.cc only.
#pragma once

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "metrics.h"
#include "opguard/common/status.h"
#include "opguard/daemon/config.h"
#include "query/query.h"

namespace opguard::daemon {

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
  void SendAnswer(std::vector<zmq::message_t>& frames, const std::string& answer);
  const Config config_;
  QueryService* service_;
  Metrics* metrics_;
  zmq::context_t* context_;
  std::unique_ptr<zmq::socket_t> socket_;
  // Aligner answers come back from the worker threads over inproc PUSH ->
  // this PULL socket (routing frames, then the answer), so only the og-query
  // thread touches the ROUTER.
  std::unique_ptr<zmq::socket_t> results_;
  std::string results_endpoint_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace opguard::daemon
