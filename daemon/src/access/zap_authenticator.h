// The ZAP handler (ZeroMQ RFC 27) that admits CURVE clients on the daemon's
// TCP query endpoints: those whose public key is in curve.authorized_keys,
// and the daemon's own key (peer daemons of a cluster share one keypair,
// docs/operations.md). libzmq asks it, over inproc://zeromq.zap.01 of the
// daemon's context, once per connection during the handshake; a refused
// client never gets a message through. One thread ("og-zap").
//
// Included by daemon.cc only.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "metrics.h"
#include "opguard/common/status.h"

namespace opguard::daemon {

// The ZAP domain the daemon's CURVE sockets name.
inline constexpr char kZapDomain[] = "opguard";

class ZapAuthenticator {
 public:
  // `allowed`: Z85 public keys.
  ZapAuthenticator(zmq::context_t* context, const std::vector<std::string>& allowed, Metrics* metrics);
  ~ZapAuthenticator();
  // Binds the handler; before any CURVE socket binds. Main thread.
  Status Start();
  void Stop();  // main thread; after the CURVE sockets closed; idempotent

 private:
  void Loop();
  zmq::context_t* context_;
  std::set<std::string> allowed_;  // 32-byte binary keys, as ZAP hands them over
  Metrics* metrics_;
  std::unique_ptr<zmq::socket_t> socket_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace opguard::daemon
