// A client for a daemon's ZeroMQ query endpoint: the CLI, tests and (later)
// peer daemons use it. One request at a time, each bounded by `timeout`; an
// unreachable daemon is a one-line Unavailable error, never a hang.
// Not thread-safe: one DaemonClient per thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "opguard/common/status.h"
#include "opguard/daemon/curve_keys.h"
#include "opguard/idl/envelope.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace opguard::daemon {

inline constexpr char kDefaultQueryEndpoint[] = "tcp://127.0.0.1:7455";
// The daemon's unix query socket: the only one that takes `opguard rm`.
inline constexpr char kDefaultQuerySocket[] = "ipc:///run/opguard/query.sock";
// Where the shim sends records unless OPGUARD_ENDPOINT says otherwise.
inline constexpr char kDefaultIngestEndpoint[] = "ipc:///run/opguard/ingest.sock";

// An answer envelope, owned (the bytes stay alive as long as this does).
class Answer {
 public:
  explicit Answer(std::string bytes) : bytes_(std::move(bytes)) {}
  const wire::Envelope* envelope() const { return wire::GetEnvelope(bytes_.data()); }
  const std::string& bytes() const { return bytes_; }

 private:
  std::string bytes_;
};

class DaemonClient {
 public:
  // `curve`: keys for tcp:// endpoints (a daemon with curve.key_file set
  // answers nothing else there); a bad key file is the first call's error.
  explicit DaemonClient(std::string endpoint,
                        std::chrono::milliseconds timeout = std::chrono::seconds(5),
                        CurveClientConfig curve = {});
  ~DaemonClient();

  // Sends a finished envelope, waits for the answer. An ErrorAnswer becomes
  // an error Status carrying the daemon's message.
  Result<Answer> Call(const flatbuffers::FlatBufferBuilder& request);

  Result<Answer> Status();
  Result<Answer> ListRuns();
  Result<Answer> ReadTrace(const std::string& run, uint32_t rank, uint32_t lane, uint64_t from_op,
                           uint32_t max_ops);
  opguard::Status DeleteRun(const std::string& run);

  const std::string& endpoint() const { return endpoint_; }

 private:
  opguard::Status Connect();
  std::string CurveHint() const;
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  CurveClientConfig curve_;
  std::unique_ptr<zmq::context_t> context_;
  std::unique_ptr<zmq::socket_t> socket_;
};

}  // namespace opguard::daemon
