#include "access/zap_authenticator.h"

#include <pthread.h>
#include <zmq_addon.hpp>

#include "opguard/common/log.h"

namespace opguard::daemon {

ZapAuthenticator::ZapAuthenticator(zmq::context_t* context, const std::vector<std::string>& allowed,
                                   Metrics* metrics)
    : context_(context), metrics_(metrics) {
  for (const auto& key : allowed) {
    uint8_t binary[32];
    if (zmq_z85_decode(binary, key.c_str()) != nullptr) allowed_.emplace(reinterpret_cast<char*>(binary), 32);
  }
}

ZapAuthenticator::~ZapAuthenticator() { Stop(); }

Status ZapAuthenticator::Start() {
  try {
    socket_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::rep);
    socket_->set(zmq::sockopt::linger, 0);
    socket_->bind("inproc://zeromq.zap.01");
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("cannot start the CURVE authenticator: ") + e.what());
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void ZapAuthenticator::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  socket_.reset();
}

void ZapAuthenticator::Loop() {
  pthread_setname_np(pthread_self(), "og-zap");
  std::vector<zmq::message_t> request;
  while (!stop_) {
    zmq::pollitem_t item{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      request.clear();
      if (!zmq::recv_multipart(*socket_, std::back_inserter(request), zmq::recv_flags::dontwait)) continue;
      // version, request id, domain, address, routing id, mechanism, credentials...
      auto frame = [&request](size_t i) { return i < request.size() ? request[i].to_string() : std::string(); };
      const std::string mechanism = frame(5);
      const std::string key = frame(6);
      const bool admitted = mechanism == "CURVE" && allowed_.count(key) > 0;
      std::string user;
      if (admitted) {
        char z85[41];
        zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(key.data()), 32);
        user = z85;
      } else {
        metrics_->curve_denied.fetch_add(1, std::memory_order_relaxed);
        OPGUARD_LOG(LogLevel::kDebug, "CURVE client from " + frame(3) + " refused (" + mechanism +
                                          ", key not in curve.authorized_keys)");
      }
      std::array<zmq::const_buffer, 6> reply = {
          zmq::buffer(std::string_view("1.0")), zmq::buffer(request.size() > 1 ? request[1].to_string_view() : ""),
          zmq::buffer(std::string_view(admitted ? "200" : "400")),
          zmq::buffer(std::string_view(admitted ? "OK" : "key not authorized")), zmq::buffer(user),
          zmq::const_buffer()};
      zmq::send_multipart(*socket_, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR && !stop_) OPGUARD_LOG(LogLevel::kWarn, std::string("CURVE authenticator: ") + e.what());
    }
  }
}

}  // namespace opguard::daemon
