#include "query/query_server.h"

#include <pthread.h>

#include <cstring>

#include "access/access.h"
#include "access/zap_authenticator.h"
#include "opguard/common/log.h"

namespace opguard::daemon {

QueryServer::QueryServer(const Config& config, QueryService* service, Metrics* metrics,
                         zmq::context_t* context, std::optional<CurveKeyPair> curve)
    : config_(config), service_(service), metrics_(metrics), context_(context), curve_(std::move(curve)) {}

QueryServer::~QueryServer() { Stop(); }

Status QueryServer::Bind(const std::string& address) {
  Endpoint e;
  e.address = address;
  e.unix_socket = IsUnixEndpoint(address);
  if (e.unix_socket) MakeRuntimeDir(address.substr(6), config_.socket_group);
  try {
    e.socket = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::router);
    e.socket->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(1 << 20));  // requests are small
    e.socket->set(zmq::sockopt::router_mandatory, 1);
    e.socket->set(zmq::sockopt::linger, 0);
    if (!e.unix_socket && curve_) {
      // Every client proves a key the ZAP handler admits (zap_authenticator.h).
      e.socket->set(zmq::sockopt::curve_server, 1);
      e.socket->set(zmq::sockopt::curve_secretkey, curve_->secret_key);
      e.socket->set(zmq::sockopt::zap_domain, kZapDomain);
    }
    const std::string monitor = "inproc://og-query-monitor-" +
                                std::to_string(reinterpret_cast<uintptr_t>(this)) + "-" +
                                std::to_string(endpoints_.size());
    if (zmq_socket_monitor(e.socket->handle(), monitor.c_str(), ZMQ_EVENT_DISCONNECTED) != 0) {
      throw zmq::error_t();
    }
    e.monitor = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::pair);
    e.monitor->set(zmq::sockopt::linger, 0);
    e.monitor->connect(monitor);
    e.socket->bind(address);
  } catch (const zmq::error_t& err) {
    return Unavailable("cannot bind query endpoint " + address + ": " + err.what());
  }
  if (e.unix_socket) {
    ApplySocketAccess(address.substr(6), config_.socket_group, config_.query_socket_mode, "query socket");
  }
  endpoints_.push_back(std::move(e));
  return Status::Ok();
}

Status QueryServer::Start() {
  if (!config_.query_socket.empty()) OPGUARD_RETURN_IF_ERROR(Bind(config_.query_socket));
  if (!config_.listen.empty() && config_.listen != config_.query_socket) {
    OPGUARD_RETURN_IF_ERROR(Bind(config_.listen));
  }
  try {
    results_endpoint_ = "inproc://og-query-results-" + std::to_string(reinterpret_cast<uintptr_t>(this));
    results_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::pull);
    results_->set(zmq::sockopt::linger, 0);
    results_->bind(results_endpoint_);
  } catch (const zmq::error_t& e) {
    return Unavailable(std::string("cannot bind the aligner results socket: ") + e.what());
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void QueryServer::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  results_.reset();
  for (auto& e : endpoints_) {
    if (e.socket && e.monitor) zmq_socket_monitor(e.socket->handle(), nullptr, 0);
    e.monitor.reset();
  }
  endpoints_.clear();
}

// A connection of endpoint `index` closed: the aligner requests read from
// its descriptor stop at their next check point. Requests it sent before
// closing may still be queued (libzmq delivers them after the event): they
// are served first, so that they are cancelled too. (libzmq emits the event
// before it closes the descriptor, so a new connection can reuse the number
// only after it; one whose request is already queued in that instant would
// be cancelled with the old one.)
void QueryServer::OnMonitorEvent(size_t index) {
  std::vector<zmq::message_t> frames;
  if (!zmq::recv_multipart(*endpoints_[index].monitor, std::back_inserter(frames),
                           zmq::recv_flags::dontwait) ||
      frames.empty() || frames[0].size() < 6) {
    return;
  }
  uint16_t event = 0;
  uint32_t fd = 0;
  std::memcpy(&event, frames[0].data(), sizeof event);
  std::memcpy(&fd, static_cast<const char*>(frames[0].data()) + 2, sizeof fd);
  if (event != ZMQ_EVENT_DISCONNECTED) return;
  for (;;) {
    frames.clear();
    if (!zmq::recv_multipart(*endpoints_[index].socket, std::back_inserter(frames),
                             zmq::recv_flags::dontwait)) {
      break;
    }
    Serve(index, frames);
  }
  std::erase_if(in_flight_, [&](const InFlight& q) {
    auto token = q.token.lock();
    if (token && q.endpoint == index && q.fd == static_cast<int>(fd)) {
      token->Cancel(CancelToken::Reason::kClientGone);
      return true;
    }
    return token == nullptr;
  });
}

// frames[first_route .. size-1) route the answer back.
void QueryServer::SendAnswer(zmq::socket_t& socket, std::vector<zmq::message_t>& frames, size_t first_route,
                             const std::string& answer) {
  try {
    for (size_t i = first_route; i + 1 < frames.size(); ++i) {
      socket.send(frames[i], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    }
    (void)socket.send(zmq::buffer(answer), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // The client gave up (timeout) and disconnected.
  }
}

void QueryServer::Serve(size_t index, std::vector<zmq::message_t>& frames) {
  if (frames.size() < 2) return;  // no routing id: nothing to answer to
  metrics_->queries.fetch_add(1, std::memory_order_relaxed);
  Caller caller;
  caller.unix_socket = endpoints_[index].unix_socket;
  if (caller.unix_socket) caller.uid = UnixPeerUid(frames.back());
  bool local_only = false;
  if (QueryService::IsAlignerRequest(frames.back().data(), frames.back().size(), &local_only)) {
    // Alignments take seconds: run them on a worker and keep serving
    // (status, trace pages, peers' requests) meanwhile.
    auto token = service_->NewQueryToken();
    // The descriptor the request was read from (ZMQ_SRCFD: marked deprecated
    // but kept throughout libzmq 4.x; the other way to learn that a ROUTER's
    // peer left, ZMQ_ROUTER_NOTIFY, is a draft option Debian's libzmq lacks).
    const int fd = zmq_msg_get(frames.back().handle(), ZMQ_SRCFD);  // -1: none
    std::erase_if(in_flight_, [](const InFlight& q) { return q.token.expired(); });
    if (fd >= 0) in_flight_.push_back({index, fd, token});
    auto request = std::make_shared<std::vector<zmq::message_t>>(std::move(frames));
    frames.clear();  // moved-from: make it empty again
    service_->RunAligner(local_only, token, [this, request, index, caller, token] {
      std::string answer =
          service_->Answer(request->back().data(), request->back().size(), caller, token.get());
      try {
        zmq::socket_t push(*context_, zmq::socket_type::push);
        push.set(zmq::sockopt::linger, 1000);
        push.connect(results_endpoint_);
        push.send(zmq::buffer(&index, sizeof index), zmq::send_flags::sndmore);
        for (size_t i = 0; i + 1 < request->size(); ++i) {
          push.send((*request)[i], zmq::send_flags::sndmore);
        }
        push.send(zmq::buffer(answer), zmq::send_flags::none);
      } catch (const zmq::error_t& e) {
        OPGUARD_LOG(LogLevel::kWarn, std::string("returning an aligner answer: ") + e.what());
      }
    });
    return;
  }
  std::string answer = service_->Answer(frames.back().data(), frames.back().size(), caller);
  SendAnswer(*endpoints_[index].socket, frames, 0, answer);
}

void QueryServer::Loop() {
  pthread_setname_np(pthread_self(), "og-query");
  std::vector<zmq::message_t> frames;
  std::vector<zmq::pollitem_t> items;
  while (!stop_) {
    items.clear();
    for (auto& e : endpoints_) items.push_back({static_cast<void*>(*e.socket), 0, ZMQ_POLLIN, 0});
    for (auto& e : endpoints_) items.push_back({static_cast<void*>(*e.monitor), 0, ZMQ_POLLIN, 0});
    items.push_back({static_cast<void*>(*results_), 0, ZMQ_POLLIN, 0});
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(100));
      if (items.back().revents & ZMQ_POLLIN) {
        // A finished aligner answer: endpoint index, routing frames, answer.
        frames.clear();
        if (zmq::recv_multipart(*results_, std::back_inserter(frames), zmq::recv_flags::dontwait) &&
            frames.size() >= 3 && frames[0].size() == sizeof(size_t)) {
          size_t index = 0;
          std::memcpy(&index, frames[0].data(), sizeof index);
          if (index < endpoints_.size()) {
            std::string answer(static_cast<const char*>(frames.back().data()), frames.back().size());
            SendAnswer(*endpoints_[index].socket, frames, 1, answer);
          }
        }
      }
      for (size_t i = 0; i < endpoints_.size(); ++i) {
        if (!(items[i].revents & ZMQ_POLLIN)) continue;
        frames.clear();
        if (zmq::recv_multipart(*endpoints_[i].socket, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
          Serve(i, frames);
        }
      }
      for (size_t i = 0; i < endpoints_.size(); ++i) {
        if (items[endpoints_.size() + i].revents & ZMQ_POLLIN) OnMonitorEvent(i);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) OPGUARD_LOG(LogLevel::kWarn, std::string("query socket: ") + e.what());
    }
  }
}

}  // namespace opguard::daemon
