#include "query/query_server.h"

#include <pthread.h>

#include <filesystem>

#include "opguard/common/log.h"

namespace opguard::daemon {

QueryServer::QueryServer(const Config& config, QueryService* service, Metrics* metrics,
                         zmq::context_t* context)
    : config_(config), service_(service), metrics_(metrics), context_(context) {}

QueryServer::~QueryServer() { Stop(); }

Status QueryServer::Start() {
  if (config_.listen.rfind("ipc://", 0) == 0) {
    std::error_code ec;
    auto parent = std::filesystem::path(config_.listen.substr(6)).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  }
  try {
    socket_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::router);
    socket_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(1 << 20));  // requests are small
    socket_->set(zmq::sockopt::router_mandatory, 1);
    socket_->set(zmq::sockopt::linger, 0);
    socket_->bind(config_.listen);
    results_endpoint_ = "inproc://og-query-results-" + std::to_string(reinterpret_cast<uintptr_t>(this));
    results_ = std::make_unique<zmq::socket_t>(*context_, zmq::socket_type::pull);
    results_->set(zmq::sockopt::linger, 0);
    results_->bind(results_endpoint_);
  } catch (const zmq::error_t& e) {
    return Unavailable("cannot bind query endpoint " + config_.listen + ": " + e.what());
  }
  thread_ = std::thread([this] { Loop(); });
  return Status::Ok();
}

void QueryServer::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  results_.reset();
  socket_.reset();
}

void QueryServer::SendAnswer(std::vector<zmq::message_t>& frames, const std::string& answer) {
  try {
    for (size_t i = 0; i + 1 < frames.size(); ++i) {
      socket_->send(frames[i], zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    }
    (void)socket_->send(zmq::buffer(answer), zmq::send_flags::dontwait);
  } catch (const zmq::error_t&) {
    // The client gave up (timeout) and disconnected.
  }
}

void QueryServer::Loop() {
  pthread_setname_np(pthread_self(), "og-query");
  std::vector<zmq::message_t> frames;
  while (!stop_) {
    zmq::pollitem_t items[2] = {{static_cast<void*>(*socket_), 0, ZMQ_POLLIN, 0},
                                {static_cast<void*>(*results_), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(100));
      if (items[1].revents & ZMQ_POLLIN) {
        // A finished aligner answer: routing frames, then the answer.
        frames.clear();
        if (zmq::recv_multipart(*results_, std::back_inserter(frames), zmq::recv_flags::dontwait) &&
            frames.size() >= 2) {
          std::string answer(static_cast<const char*>(frames.back().data()), frames.back().size());
          SendAnswer(frames, answer);
        }
      }
      if (!(items[0].revents & ZMQ_POLLIN)) continue;
      frames.clear();
      if (!zmq::recv_multipart(*socket_, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) OPGUARD_LOG(LogLevel::kWarn, std::string("query socket: ") + e.what());
      continue;
    }
    if (frames.size() < 2) continue;  // no routing id: nothing to answer to
    metrics_->queries.fetch_add(1, std::memory_order_relaxed);
    bool local_only = false;
    if (QueryService::IsAlignerRequest(frames.back().data(), frames.back().size(), &local_only)) {
      // Alignments take seconds: run them on a worker and keep serving
      // (status, trace pages, peers' requests) meanwhile.
      auto request = std::make_shared<std::vector<zmq::message_t>>(std::move(frames));
      frames.clear();  // moved-from: make it empty again
      service_->RunAligner(local_only, [this, request] {
        std::string answer = service_->Answer(request->back().data(), request->back().size());
        try {
          zmq::socket_t push(*context_, zmq::socket_type::push);
          push.set(zmq::sockopt::linger, 1000);
          push.connect(results_endpoint_);
          for (size_t i = 0; i + 1 < request->size(); ++i) {
            push.send((*request)[i], zmq::send_flags::sndmore);
          }
          push.send(zmq::buffer(answer), zmq::send_flags::none);
        } catch (const zmq::error_t& e) {
          OPGUARD_LOG(LogLevel::kWarn, std::string("returning an aligner answer: ") + e.what());
        }
      });
      continue;
    }
    std::string answer = service_->Answer(frames.back().data(), frames.back().size());
    SendAnswer(frames, answer);
  }
}

}  // namespace opguard::daemon
