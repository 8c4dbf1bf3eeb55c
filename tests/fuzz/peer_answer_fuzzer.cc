// Peer answers: the bytes another daemon of the cluster sends back when this
// one fans a query out. A peer (a ROUTER on an ipc:// socket, in a thread of
// this process) answers every request with the input minus its first byte;
// the first byte picks the query this daemon fans out: a diff, ranks or
// collectives over ZeroMQ (QueryService::Answer) or over the JSON API
// (RouteHttp), or a JSON API target forwarded to the peers. Property: the
// merged answer is an envelope (ZeroMQ) or JSON (HTTP), nothing crashes.
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "fuzz_daemon.h"
#include "opguard/idl/envelope.h"

namespace {

using opguard::daemon::fuzz::Fail;
namespace wire = opguard::wire;

class FakePeer {
 public:
  FakePeer() : endpoint_("ipc:///tmp/opguard-fuzz-peer-" + std::to_string(::getpid()) + ".sock") {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.bind(endpoint_);
    thread_ = std::thread([this] { Loop(); });
  }
  ~FakePeer() {
    stop_ = true;
    thread_.join();
    socket_.close();
    ::unlink(endpoint_.substr(6).c_str());
  }
  const std::string& endpoint() const { return endpoint_; }
  void SetAnswer(std::string answer) {
    std::lock_guard<std::mutex> lock(mu_);
    answer_ = std::move(answer);
  }

 private:
  void Loop() {
    while (!stop_) {
      zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      if (!(item.revents & ZMQ_POLLIN)) continue;
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(socket_, std::back_inserter(frames), zmq::recv_flags::dontwait)) continue;
      std::string answer;
      {
        std::lock_guard<std::mutex> lock(mu_);
        answer = answer_;
      }
      frames.back().rebuild(answer.data(), answer.size());
      zmq::send_multipart(socket_, frames, zmq::send_flags::dontwait);
    }
  }
  std::string endpoint_;
  zmq::context_t context_{1};
  zmq::socket_t socket_{context_, zmq::socket_type::router};
  std::mutex mu_;
  std::string answer_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void CheckEnvelope(const std::string& answer) {
  if (!wire::OpenEnvelope(answer.data(), answer.size()).ok()) Fail("the merged answer is not an envelope");
}

void CheckJson(const opguard::daemon::HttpResponse& r) {
  if (!nlohmann::json::accept(r.body)) Fail("the JSON API answered something that is not JSON: " + r.body.substr(0, 200));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static FakePeer peer;
  static opguard::daemon::fuzz::FuzzDaemon daemon({peer.endpoint()});
  if (size == 0) return 0;
  peer.SetAnswer(std::string(reinterpret_cast<const char*>(data) + 1, size - 1));
  auto& service = daemon.service();
  constexpr uint32_t kPeerTimeoutMs = 5000;
  flatbuffers::FlatBufferBuilder b;
  auto http = [&](const std::string& target) {
    CheckJson(opguard::daemon::RouteHttp("GET", target, &service, &daemon.metrics(), &daemon.store()));
  };
  switch (data[0] % 7) {
    case 0:
      wire::FinishEnvelope(b, wire::CreateDiffRequest(b, b.CreateString("ref"), b.CreateString("sus"), -1, false,
                                                      kPeerTimeoutMs, 0));
      return CheckEnvelope(service.Answer(b.GetBufferPointer(), b.GetSize())), 0;
    case 1: {
      std::vector<uint32_t> replicas = {0, 1, 2};
      wire::FinishEnvelope(b, wire::CreateRanksRequest(b, b.CreateString("ref"), false, kPeerTimeoutMs,
                                                       b.CreateVector(replicas)));
      return CheckEnvelope(service.Answer(b.GetBufferPointer(), b.GetSize())), 0;
    }
    case 2:
      wire::FinishEnvelope(b, wire::CreateCollectivesRequest(b, b.CreateString("solo"), false, kPeerTimeoutMs));
      return CheckEnvelope(service.Answer(b.GetBufferPointer(), b.GetSize())), 0;
    case 3:
      return http("/api/diff?reference=ref&suspect=sus&timeout=5"), 0;
    case 4:
      return http("/api/runs/ref/ranks?replicas=0,1,3&timeout=5"), 0;
    case 5:
      return http("/api/runs/solo/collectives?timeout=5"), 0;
    default:
      // What a connection does for a run this node does not hold.
      if (auto forwarded = service.ForwardApi("/api/runs/elsewhere")) {
        (void)nlohmann::json::accept(forwarded->second);  // the peer's body is passed on as it is
      }
      return 0;
  }
}
