// The ZeroMQ face of QueryService (query.h). Included by daemon.cc only.
#pragma once

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "metrics.h"
#include "opguard/common/status.h"
#include "opguard/daemon/config.h"
#include "opguard/daemon/curve_keys.h"
#include "query/query.h"

namespace opguard::daemon {

// The ZeroMQ query endpoints, one ROUTER each, served by one thread
// ("og-query"): the unix query socket (config.query_socket: callers known
// by uid, the only one taking admin requests) and config.listen (TCP:
// CURVE when `curve` is given, which daemon.cc requires off loopback).
// Requests are answered in order; each is small and bounded. Aligner
// requests run on QueryService's workers with a CancelToken each, cancelled
// when the connection they came on closes (a socket monitor's DISCONNECTED
// event for the descriptor the request was read from): a CLI that timed out
// or was interrupted, or a receiving daemon that gave up on this peer.
class QueryServer {
 public:
  QueryServer(const Config& config, QueryService* service, Metrics* metrics, zmq::context_t* context,
              std::optional<CurveKeyPair> curve);
  ~QueryServer();
  Status Start();  // binds; main thread
  void Stop();     // main thread; idempotent

 private:
  struct Endpoint {
    std::string address;
    std::unique_ptr<zmq::socket_t> socket;
    std::unique_ptr<zmq::socket_t> monitor;  // its DISCONNECTED events
    bool unix_socket = false;
  };
  // An aligner request in flight: the endpoint and the descriptor its
  // connection had, and its token (expired once the worker is done).
  struct InFlight {
    size_t endpoint = 0;
    int fd = -1;
    std::weak_ptr<CancelToken> token;
  };
  void OnMonitorEvent(size_t index);
  Status Bind(const std::string& address);
  void Loop();
  void Serve(size_t index, std::vector<zmq::message_t>& frames);
  void SendAnswer(zmq::socket_t& socket, std::vector<zmq::message_t>& frames, size_t first_route,
                  const std::string& answer);
  const Config config_;
  QueryService* service_;
  Metrics* metrics_;
  zmq::context_t* context_;
  const std::optional<CurveKeyPair> curve_;
  std::vector<Endpoint> endpoints_;
  // Aligner answers come back from the worker threads over inproc PUSH ->
  // this PULL socket (the endpoint's index, routing frames, then the
  // answer), so only the og-query thread touches the ROUTERs.
  std::unique_ptr<zmq::socket_t> results_;
  std::string results_endpoint_;
  std::vector<InFlight> in_flight_;  // og-query thread only
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace opguard::daemon
